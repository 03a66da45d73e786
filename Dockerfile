# syntax=docker/dockerfile:1
# The snowlease image: built with Rust on Debian 12 as one statically linked
# binary (scripts/build-static.sh: glibc's static libc, no NSS modules or
# libgcc needed at run time), run on distroless/static (no libc, no shell, no
# package manager) as UID 65532.
# Not built in CI (the CI machine has no container engine); see
# docs/kubernetes.md, "Container image".
#
#   docker build --build-arg SNOWLEASE_COMMIT=$(git rev-parse --short=12 HEAD) \
#     -t registry.example.com/snowlease:0.1.0 .
#
# The same binary serves the sidecar (`worker`), the app's wrapper (`exec`,
# copied into a shared volume by `install`) and the operator tools.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# build.rs reads the commit from this (the context has no .git); "unknown" when unset.
ARG SNOWLEASE_COMMIT
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY scripts/build-static.sh ./scripts/
# Cache mounts keep the crate registry and build artefacts between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    install -m 0755 "$(scripts/build-static.sh --release | tail -1)" /snowlease

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /snowlease /usr/local/bin/snowlease
# Numeric, so the kubelet can check runAsNonRoot.
USER 65532:65532
EXPOSE 7391
ENTRYPOINT ["/usr/local/bin/snowlease"]
CMD ["worker"]
