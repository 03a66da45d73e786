#!/usr/bin/env bash
# Builds snowlease statically linked and prints the binary's path (last line
# of stdout). The binary needs no libc, libgcc or NSS from the image it runs
# in (Alpine, distroless/static, Debian 11, scratch): `install` copies it
# into app containers.
#
# How: glibc's static libc (`-C target-feature=+crt-static`) on the host's
# *-unknown-linux-gnu target (x86_64 here). The musl target would do too,
# but rustup cannot download it here. glibc 2.34+ has its files and dns
# lookups built in, so even the worker's getaddrinfo of a Redis host name
# works without NSS modules (with /etc/hosts, /etc/resolv.conf if present). `--target` is explicit so the flag reaches only the
# binary, not build scripts and proc macros (which must stay dynamic). Its
# own target dir keeps the normal build's cache intact (other RUSTFLAGS would
# rebuild everything there).
#
# Usage: scripts/build-static.sh            dev profile, no debuginfo (tests)
#        scripts/build-static.sh --release  release profile (image, install)
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=$(rustc -vV | sed -n 's/^host: //p')
case "$TARGET" in
  *-unknown-linux-gnu) ;;
  *) echo "build-static: host $TARGET is not a *-unknown-linux-gnu target" >&2; exit 1 ;;
esac
RUSTFLAGS_VAR="CARGO_TARGET_$(echo "$TARGET" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
DIR="${SNOWLEASE_STATIC_TARGET_DIR:-target/static}"
profile=debug
args=()
if [[ "${1:-}" == "--release" ]]; then
  profile=release
  args+=(--release)
fi
# Only the dev profile's debuginfo is dropped: it makes the test build slower
# and the binary 100 MB.
env CARGO_TARGET_DIR="$DIR" CARGO_PROFILE_DEV_DEBUG=false \
  "$RUSTFLAGS_VAR=-C target-feature=+crt-static" \
  cargo build --locked --bin snowlease --target "$TARGET" "${args[@]}" >&2
echo "$PWD/$DIR/$TARGET/$profile/snowlease"
