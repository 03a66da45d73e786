#!/usr/bin/env bash
# Installs redis-server from Debian's packages when it is not on PATH.
# Sourced by the other scripts; tests start their own servers on free ports.
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found; installing it from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi
