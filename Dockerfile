# syntax=docker/dockerfile:1
# The `thaw` image: one binary, every role (`thaw activator`, `thaw autoscaler`, ...).
#   docker build --build-arg GIT_COMMIT="$(git rev-parse --short=12 HEAD)" -t thaw:dev .
# Build stage: the release profile (fat LTO, one codegen unit), so a first build takes a while.
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
# The commit `thaw --version` and thaw_build_info report (.git is not in the context):
#   docker build --build-arg GIT_COMMIT="$(git rev-parse --short=12 HEAD)" -t thaw:dev .
ARG GIT_COMMIT=unknown
# jemalloc builds from C: the image has cc and make. The registry and target caches only
# speed up rebuilds (BuildKit). The image gets the binary without symbols or debug info
# (README, "Run on Kubernetes": its size); target/release keeps the unstripped one.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    GIT_COMMIT="$GIT_COMMIT" cargo build --release --locked --bin thaw \
 && strip --strip-all -o /thaw target/release/thaw \
 && /thaw --version

# Runtime: glibc and libgcc only, no shell, runs as the unprivileged user 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /thaw /usr/local/bin/thaw
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/thaw"]
