//go:build tools

// Package tools pins Knative Serving's own components, for the tests that move a running
// Knative onto thaw and back (tests/real_stack_migrate.rs) and the load tests that measure
// them beside thaw's: `go build` of each command resolves through this module's go.mod and
// go.sum. knative.dev/serving v0.42.2 (Knative 1.15), the release the conformance suite
// (tests/cluster/conformance) pins, for the reason given there; net-gateway-api v0.42.0, its
// Gateway API ingress of the same release. net-istio is not served by the Go module proxy
// (every version answers 403), so its KIngress reconciler is played by the tests.
package tools

import (
	_ "knative.dev/net-gateway-api/cmd/controller"
	_ "knative.dev/serving/cmd/activator"
	_ "knative.dev/serving/cmd/autoscaler"
	_ "knative.dev/serving/cmd/controller"
	_ "knative.dev/serving/cmd/queue"
	_ "knative.dev/serving/cmd/webhook"
)
