#!/usr/bin/env bash
# Builds the snowlease image from ./Dockerfile (the one recipe, for users
# and CI) and prints its tag (last line of stdout). The image is FROM
# scratch, so nothing is pulled: this script stages into target/image/ what
# the Dockerfile copies besides image/passwd and image/group:
#   snowlease             the static binary (scripts/build-static.sh --release,
#                         or --binary PATH, e.g. the tests' dev build)
#   ca-certificates.crt   the CA bundle rustls reads for rediss:// (from
#                         SNOWLEASE_CA_BUNDLE, default the host's
#                         /etc/ssl/certs/ca-certificates.crt: Debian's
#                         ca-certificates package)
# then runs `ENGINE build` with the repository as context (.dockerignore
# lets only those four files through).
#
# Usage: scripts/build-image.sh [--binary PATH] [--tag TAG] [--stage-only]
#   --binary PATH  package this static binary instead of building a release
#   --tag TAG      image tag (default snowlease:<version in Cargo.toml>)
#   --stage-only   stage target/image/ and stop (no engine needed)
# ENGINE: $SNOWLEASE_IMAGE_ENGINE, else the first of podman, docker, buildah.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=
tag=
stage_only=false
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --stage-only) stage_only=true; shift ;;
    *) echo "build-image: unknown argument $1 (see the usage in $0)" >&2; exit 2 ;;
  esac
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
tag="${tag:-snowlease:$version}"
bundle="${SNOWLEASE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
if ! grep -q "BEGIN CERTIFICATE" "$bundle" 2>/dev/null; then
  echo "build-image: no CA bundle at $bundle (install ca-certificates or set SNOWLEASE_CA_BUNDLE)" >&2
  exit 1
fi
if [[ -z "$binary" ]]; then
  binary=$(scripts/build-static.sh --release | tail -1)
fi

mkdir -p target/image
# Copied aside, then renamed: a build running at the same time sees whole files.
install -m 0755 "$binary" "target/image/.snowlease.$$"
install -m 0644 "$bundle" "target/image/.ca-certificates.crt.$$"
mv -f "target/image/.snowlease.$$" target/image/snowlease
mv -f "target/image/.ca-certificates.crt.$$" target/image/ca-certificates.crt
if $stage_only; then
  echo "$PWD/target/image"
  exit 0
fi

engine="${SNOWLEASE_IMAGE_ENGINE:-}"
if [[ -z "$engine" ]]; then
  for candidate in podman docker buildah; do
    if command -v "$candidate" >/dev/null; then
      engine=$candidate
      break
    fi
  done
fi
if [[ -z "$engine" ]]; then
  echo "build-image: no podman, docker or buildah on PATH" >&2
  exit 1
fi
# The commit is baked into the binary by build.rs; the label repeats it.
commit=$("target/image/snowlease" --version | sed -n 's/.*(commit \(.*\))$/\1/p')
"$engine" build -f Dockerfile -t "$tag" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=${commit:-unknown}" . >&2
echo "$tag"
