#!/usr/bin/env bash
# The whole test suite: unit tests plus integration tests that start their
# own redis-server processes on free loopback ports (never 6379).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-redis.sh
source scripts/ensure-test-deps.sh
# The statically linked binary for tests/it/static_binary.rs, built before
# the suite so no build runs beside the timing-sensitive tests (cached in
# target/static; a cold build costs about 130 s of CPU).
SNOWLEASE_STATIC_BIN="${SNOWLEASE_STATIC_BIN:-$(scripts/build-static.sh | tail -1)}"
export SNOWLEASE_STATIC_BIN
log=$(mktemp)
# Tests that could not run write "<name>: <why>" here (tests/it/harness.rs, skip()).
SNOWLEASE_SKIPPED_FILE=$(mktemp)
export SNOWLEASE_SKIPPED_FILE
trap 'rm -f "$log" "$SNOWLEASE_SKIPPED_FILE"' EXIT
# Integration tests mostly wait on TTLs and processes, so run more of them
# at once than there are cores. --all-targets would add the benches; doc
# tests: there are none.
cargo test --locked --lib --bins --tests -- --test-threads="${TEST_THREADS:-8}" "$@" 2>&1 | tee "$log"
# One closing line over all test binaries. A test that said it did not run (whole or in
# part) counts as skipped, by name, not as passed.
sort -u "$SNOWLEASE_SKIPPED_FILE" | sed 's/^/skipped: /'
# "<test>[ (part)]: why": one test however many of its parts were skipped.
skipped_by_tests=$(awk -F': ' '{ sub(/ \(.*$/, "", $1); print $1 }' "$SNOWLEASE_SKIPPED_FILE" | sort -u | wc -l)
awk -v k="$skipped_by_tests" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p - k, f, s + k }' "$log"
