#!/usr/bin/env bash
# What the integration tests need beyond redis-server, from Debian's packages when missing
# (as root with apt-get): the examples' interpreters and compilers (tests/it/examples.rs),
# libfaketime (tests/it/clock_skew.rs), podman with runc and catatonit (tests/it/container.rs),
# promtool and the Prometheus server with python3-yaml (tests/it/alerts.rs; the package's own
# service is not wanted: Debian's container images deny service starts, and the tests start
# their own servers on free ports).
# Without root or apt nothing is installed: those tests then say SKIPPED, and scripts/test.sh
# counts them as skipped, by name, never as passed. Sourced by scripts/test.sh.
missing=()
command -v python3 >/dev/null || missing+=(python3)
command -v node >/dev/null || missing+=(nodejs)
command -v java >/dev/null || missing+=(openjdk-17-jdk-headless)
command -v go >/dev/null || missing+=(golang-go)
command -v faketime >/dev/null || missing+=(faketime)
# runc, not crun (which refuses hybrid cgroups); catatonit is the pods' pause process.
command -v podman >/dev/null || missing+=(podman runc catatonit)
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "installing what the tests need: ${missing[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "not installed (no root or apt-get): ${missing[*]}; the tests that need them are skipped" >&2
  fi
fi
