#!/usr/bin/env bash
# Runs the sidecar against a private redis-server it starts itself, shows the
# worker ID it got, and stops both cleanly on Ctrl-C (sidecar first, so its
# key is released, then Redis).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-redis.sh
echo "building the release binary (cargo build --release; 3-15 min on a cold cache, depending on cores)..."
cargo build --release --locked

free_port() {
  local p
  for p in $(seq "$1" $(($1 + 200))); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  echo "no free port near $1" >&2; exit 1
}
dir=$(mktemp -d)
redis_port=$(free_port 16379)
http_port=$(free_port 18080)

# setsid: Ctrl-C reaches only this script, which stops the sidecar (one
# SIGINT: a second one would abort it) and then Redis.
setsid redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" &
redis_pid=$!
cleanup() {
  # The terminal's Ctrl-C may have closed a pipe we print to (| tee): keep
  # going on write errors so Redis is always stopped.
  set +e
  trap '' PIPE
  trap - INT TERM EXIT
  if [ -n "${sidecar_pid:-}" ]; then kill -INT "$sidecar_pid" 2>/dev/null || true; wait "$sidecar_pid" || true; fi
  # A stopped sidecar leaves a tombstone ("released:<owner>") for its
  # --handover-delay (1 s): not a lease. Count the keys that still hold one.
  left=0
  for key in $(redis-cli -p "$redis_port" --raw keys 'snowflake:worker:demo:[0-9]*' 2>/dev/null); do
    case "$(redis-cli -p "$redis_port" --raw get "$key" 2>/dev/null)" in
      released:*) ;;
      *) left=$((left + 1)) ;;
    esac
  done
  echo "leases left in Redis: $left (a released ID keeps a tombstone for the 1 s handover delay)" 2>/dev/null || true
  kill "$redis_pid" 2>/dev/null || true
  wait "$redis_pid" 2>/dev/null || true
  rm -rf "$dir"
  echo "stopped sidecar and redis-server" 2>/dev/null || true
}
trap cleanup INT TERM EXIT
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done
# A fresh Redis: open the claim guard instead of waiting one TTL.
./target/release/snowlease guard open --app demo --redis-url "redis://127.0.0.1:$redis_port"

setsid ./target/release/snowlease worker --app demo --redis-url "redis://127.0.0.1:$redis_port" \
  --ttl 10s --renew-interval 5s \
  --output-file "$dir/worker-id" --listen "127.0.0.1:$http_port" &
sidecar_pid=$!
until [ -s "$dir/worker-id" ]; do
  kill -0 "$sidecar_pid" 2>/dev/null || { echo "sidecar exited" >&2; exit 1; }
  sleep 0.1
done
echo
echo "worker ID (file $dir/worker-id): $(cat "$dir/worker-id")"
if command -v curl >/dev/null; then
  echo "GET http://127.0.0.1:$http_port/id: $(curl -s "http://127.0.0.1:$http_port/id")"
fi
echo "lease key: $(redis-cli -p "$redis_port" --raw keys 'snowflake:worker:demo:[0-9]*')"
echo "Press Ctrl-C to release the ID and stop."
wait "$sidecar_pid"
