#!/usr/bin/env bash
# The whole test suite: unit tests plus integration tests that start their
# own redis-server processes on free loopback ports (never 6379).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-redis.sh
# Integration tests mostly wait on TTLs and processes, so run more of them
# at once than there are cores.
cargo test --locked -- --test-threads="${TEST_THREADS:-8}" "$@"
