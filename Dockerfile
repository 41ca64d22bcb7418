# syntax=docker/dockerfile:1
# The `thaw` image: one binary, every role (`thaw activator`, `thaw autoscaler`, ...).
#   docker build -t thaw:dev .
# Build stage: the release profile (fat LTO, one codegen unit), so a first build takes a while.
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
# jemalloc builds from C: the image has cc and make. The registry and target caches only
# speed up rebuilds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin thaw \
 && cp target/release/thaw /thaw

# Runtime: glibc and libgcc only, no shell, runs as the unprivileged user 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /thaw /usr/local/bin/thaw
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/thaw"]
