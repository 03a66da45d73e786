# The snowlease image: the statically linked binary (scripts/build-static.sh:
# glibc's static libc, no NSS modules or libgcc needed at run time) on an
# empty base, as distroless/static is: no libc, no shell, no package
# manager; a CA bundle for rediss:// and a passwd entry for UID 65532.
# FROM scratch, so the build pulls nothing. scripts/build-image.sh stages
# target/image/ (the binary and the CA bundle) and builds this file; CI does
# the same and runs the image (tests/it/container.rs). By hand:
#
#   scripts/build-static.sh --release      # prints the binary's path
#   mkdir -p target/image && cp <that path> target/image/snowlease
#   cp /etc/ssl/certs/ca-certificates.crt target/image/
#   podman build -t registry.example.com/snowlease:0.1.0 .   # or docker build
#
# `--version` prints the commit build.rs read from .git (or from the env
# SNOWLEASE_COMMIT) when the binary was built.
#
# The same binary serves the sidecar (`worker`), the app's wrapper (`exec`,
# copied into a shared volume by `install`) and the operator tools.

FROM scratch
# nonroot (65532) as in distroless/static, so tools that resolve the user
# by name find it; the image needs no home folder.
COPY image/passwd image/group /etc/
# Where rustls-native-certs (openssl-probe) looks first on Linux; SSL_CERT_FILE overrides it.
COPY target/image/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY target/image/snowlease /usr/local/bin/snowlease
# Numeric, so the kubelet can check runAsNonRoot.
USER 65532:65532
EXPOSE 7391
ENTRYPOINT ["/usr/local/bin/snowlease"]
CMD ["worker"]
