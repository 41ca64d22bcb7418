#!/usr/bin/env bash
# Builds the real control plane the tests/real_plane.rs target runs: kube-apiserver,
# kube-controller-manager and kubectl from k8s.io/kubernetes (tests/cluster/kube) and etcd
# from go.etcd.io/etcd/server/v3 (tests/cluster/etcd), each module's versions fixed by its
# committed go.mod and verified by its go.sum (-mod=readonly: a sum that does not match fails).
#
#   tests/cluster/build.sh [OUT]     OUT defaults to $CARGO_TARGET_DIR/plane (target/plane)
#
# Writes OUT/bin/{kube-apiserver,kube-controller-manager,kubectl,etcd} and OUT/stamp, the hash
# of every input, and Knative's conformance suite into OUT/conformance (below); a second run
# with the same inputs does nothing. Needs Go >= 1.24 and the Go
# module proxy. On 2 cores a cold build (empty module and build caches) takes about 4 minutes
# and downloads 0.8 GB of modules (docs/benchmarks.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-${CARGO_TARGET_DIR:-$root/target}/plane}"
mkdir -p "$out/bin"

if ! command -v go >/dev/null 2>&1; then
  echo "tests/cluster/build.sh: go is not on PATH; the real control plane is built from Go modules (Go >= 1.24)" >&2
  exit 1
fi

# Knative Serving's conformance suite (tests/cluster/conformance, run by the
# tests/real_stack_conformance.rs target): each test package tools.go imports compiled with
# `go test -c -tags=e2e` into OUT/conformance/bin/<package>.test (v1, v1beta1, runtime),
# each test image it imports built into OUT/conformance/images/<name>, the
# program the kubelet stand-in runs for image thaw.test/conformance/<name>. A stamp of its
# own (OUT/conformance/stamp); about 100 s on 2 cores with an empty build cache, and 0.1 GB of
# modules.
conf="$here/conformance"
conf_out="$out/conformance"
conf_stamp="$( (cat "$conf/go.mod" "$conf/go.sum" "$conf/tools.go" "$0"; go version) | sha256sum | cut -d' ' -f1)"
if [ ! -f "$conf_out/stamp" ] || [ "$(cat "$conf_out/stamp")" != "$conf_stamp" ]; then
  start=$(date +%s)
  echo "tests/cluster/build.sh: building Knative's conformance suite and its test images into $conf_out" >&2
  rm -rf "$conf_out"
  mkdir -p "$conf_out/bin" "$conf_out/images"
  suites="$(grep -o '"knative.dev/serving/test/conformance/[^"]*"' "$conf/tools.go" | tr -d '"')"
  test_images="$(grep -o '"knative.dev/serving/test/test_images/[^"]*"' "$conf/tools.go" | tr -d '"')"
  # shellcheck disable=SC2086 # one word per package
  (cd "$conf" && go test -mod=readonly -c -tags=e2e -trimpath -ldflags "-s -w" -o "$conf_out/bin/" $suites)
  # shellcheck disable=SC2086
  (cd "$conf" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$conf_out/images/" $test_images)
  echo "$conf_stamp" > "$conf_out/stamp"
  echo "tests/cluster/build.sh: conformance suite built in $(( $(date +%s) - start )) s" >&2
fi

# Knative Serving's own components (tests/cluster/knative): controller, webhook, autoscaler,
# activator and queue-proxy from knative.dev/serving, and net-gateway-api's controller, each
# into OUT/knative/bin/<name>, the programs the kubelet stand-in runs for the images
# thaw.test/knative/<name> (the Knative install the migration tests move onto thaw and back),
# and Knative's release YAML (config/ of each module, and knative.dev/caching's Image CRD, which
# serving's release carries and its controller watches) into OUT/knative/config. A stamp of its
# own (OUT/knative/stamp); about 60 s on 2 cores once the conformance suite's modules are in
# the cache.
kn="$here/knative"
kn_out="$out/knative"
kn_stamp="$( (cat "$kn/go.mod" "$kn/go.sum" "$kn/tools.go" "$0"; go version) | sha256sum | cut -d' ' -f1)"
if [ ! -f "$kn_out/stamp" ] || [ "$(cat "$kn_out/stamp")" != "$kn_stamp" ]; then
  start=$(date +%s)
  echo "tests/cluster/build.sh: building Knative Serving's components into $kn_out" >&2
  rm -rf "$kn_out"
  mkdir -p "$kn_out/bin" "$kn_out/config"
  (cd "$kn" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$kn_out/bin/" \
    knative.dev/serving/cmd/activator knative.dev/serving/cmd/autoscaler \
    knative.dev/serving/cmd/controller knative.dev/serving/cmd/queue \
    knative.dev/serving/cmd/webhook)
  (cd "$kn" && go build -mod=readonly -trimpath -ldflags "-s -w" \
    -o "$kn_out/bin/net-gateway-api" knative.dev/net-gateway-api/cmd/controller)
  for m in knative.dev/serving knative.dev/networking knative.dev/net-gateway-api knative.dev/caching; do
    dir="$(cd "$kn" && go list -mod=readonly -m -f '{{.Dir}}' "$m")"
    mkdir -p "$kn_out/config/$(basename "$m")"
    cp -r "$dir/config/." "$kn_out/config/$(basename "$m")/"
  done
  chmod -R u+w "$kn_out/config"
  echo "$kn_stamp" > "$kn_out/stamp"
  echo "tests/cluster/build.sh: Knative's components built in $(( $(date +%s) - start )) s" >&2
fi

kube_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }
  $1 == "k8s.io/kubernetes" { print $2 }' "$here/kube/go.mod" | head -1)"
minor="$(echo "$kube_version" | cut -d. -f2)"
stamp="$( (cat "$here/kube/go.mod" "$here/kube/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" "$0"; go version) | sha256sum | cut -d' ' -f1)"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] \
  && [ -x "$out/bin/kube-apiserver" ] && [ -x "$out/bin/kube-controller-manager" ] \
  && [ -x "$out/bin/kubectl" ] && [ -x "$out/bin/etcd" ]; then
  exit 0
fi

start=$(date +%s)
echo "tests/cluster/build.sh: building Kubernetes $kube_version and etcd into $out/bin (about 4 minutes on 2 cores the first time)" >&2
# /version answers with the release's own version, as a released binary's does.
ldflags="-s -w"
for kv in "gitVersion=$kube_version" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
  "buildDate=1970-01-01T00:00:00Z"; do
  ldflags="$ldflags -X k8s.io/component-base/version.$kv"
done
(cd "$here/kube" && go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$out/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl)
(cd "$here/etcd" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out/bin/etcd" \
  go.etcd.io/etcd/server/v3)
echo "$stamp" > "$out/stamp"
echo "tests/cluster/build.sh: built in $(( $(date +%s) - start )) s" >&2
