#!/usr/bin/env bash
# The whole test suite: unit tests plus integration tests that start their
# own redis-server processes on free loopback ports (never 6379).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-redis.sh
# The statically linked binary for tests/it/static_binary.rs, built before
# the suite so no build runs beside the timing-sensitive tests (cached in
# target/static; a cold build costs about 130 s of CPU).
SNOWLEASE_STATIC_BIN="${SNOWLEASE_STATIC_BIN:-$(scripts/build-static.sh | tail -1)}"
export SNOWLEASE_STATIC_BIN
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Integration tests mostly wait on TTLs and processes, so run more of them
# at once than there are cores. --all-targets would add the benches; doc
# tests: there are none.
cargo test --locked --lib --bins --tests -- --test-threads="${TEST_THREADS:-8}" "$@" 2>&1 | tee "$log"
# One closing line over all test binaries.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
