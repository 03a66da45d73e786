#!/usr/bin/env python3
"""Reads the worker ID snowlease publishes and mints one Snowflake ID with it.

The ID file (WORKER_ID_FILE, default /var/run/snowlease/worker-id) first: a
decimal ID and a newline; if the state file beside it (<file>.state.json)
exists, it must name the same ID, this boot's boot_id, and valid_until_boot_ms
(ms on CLOCK_BOOTTIME, which no wall-clock step moves) in the future. Else
GET <WORKER_ID_URL>/id (default http://127.0.0.1:7391). With neither, it
refuses to mint: message on stderr, exit 3, nothing on stdout.

Prints: worker_id=<n> source=<file|http> snowflake=<id>
Standard library only; Python 3.8+. Run: python3 worker_id.py

An app that keeps running must stop minting as soon as the ID is gone, and
before valid_until_boot_ms / lease_expires_in_ms passes (docs/app.md, "How the app
reads the ID"); `snowlease exec` does that for you.
"""
import json
import os
import sys
import time
import urllib.request

EPOCH_MS = 1577836800000  # 2020-01-01T00:00:00Z, the Snowflake epoch of this example


def from_file(path):
    """The worker ID from the ID file, or None when missing, malformed or stale."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    if not text.endswith("\n") or not text[:-1].isdigit():
        return None
    worker_id = int(text)
    try:
        with open(path + ".state.json") as f:
            state = json.load(f)
    except FileNotFoundError:
        return worker_id
    except (OSError, ValueError):
        return None
    if state.get("worker_id") != worker_id or not boot_deadline_ahead(state):
        return None
    return worker_id


def boot_deadline_ahead(state):
    """True while the state file's deadline on the boot clock is ahead (same boot only)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        return False
    now_ms = time.clock_gettime(time.CLOCK_BOOTTIME) * 1000
    return state.get("boot_id") == boot_id and state.get("valid_until_boot_ms", 0) > now_ms


def from_http(base_url):
    """The worker ID from GET <base_url>/id, or None when the sidecar has none or is down."""
    request = urllib.request.Request(base_url.rstrip("/") + "/id",
                                     headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=2) as reply:
            body = json.load(reply)
    except (OSError, ValueError):  # 503 (HTTPError is an OSError), refused, timeout, bad JSON
        return None
    worker_id = body.get("worker_id")
    return worker_id if isinstance(worker_id, int) and body.get("lease_expires_in_ms", 0) > 0 else None


def snowflake(worker_id, sequence=0):
    """41 bits of ms since EPOCH_MS, 10 bits worker ID, 12 bits sequence."""
    return ((int(time.time() * 1000) - EPOCH_MS) << 22) | (worker_id << 12) | sequence


def main():
    path = os.environ.get("WORKER_ID_FILE", "/var/run/snowlease/worker-id")
    url = os.environ.get("WORKER_ID_URL", "http://127.0.0.1:7391")
    worker_id, source = from_file(path), "file"
    if worker_id is None:
        worker_id, source = from_http(url), "http"
    if worker_id is None:
        print(f"no worker ID published ({path}, {url}/id): refusing to mint", file=sys.stderr)
        return 3
    print(f"worker_id={worker_id} source={source} snowflake={snowflake(worker_id)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
