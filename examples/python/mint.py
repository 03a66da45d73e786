#!/usr/bin/env python3
"""Gets COUNT Snowflake IDs from a snowlease sidecar in mint mode and prints them.

GET /next?count=N (N at most 4096 per request) over the unix socket the sidecar
serves with --mint-socket (SNOWLEASE_MINT_SOCKET, default
/var/run/snowlease/mint.sock), Accept: text/plain (one decimal ID a line).
While the sidecar answers 503 (no valid lease yet: claiming, guard_closed,
clock_behind, ...) or its socket is not there yet, it retries after the
Retry-After seconds (1 s without an answer), for at most --wait seconds
(default 30) in all: the last try comes at the end of --wait.

Prints COUNT IDs, one a line, increasing, and exits 0. When none come within
--wait: a message on stderr (the last answer), exit 3, nothing on stdout.
Any other answer (e.g. 400): exit 1. Bad arguments: exit 2.

Standard library only; Python 3.8+. Run: python3 mint.py [--wait SECONDS] COUNT
"""
import argparse
import http.client
import os
import socket
import sys
import time

MAX_BATCH = 4096  # most IDs one request may ask for


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket (the host name only fills the Host header)."""

    def __init__(self, path, timeout):
        super().__init__("snowlease", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def next_ids(path, count):
    """One GET /next?count=N: (status, Retry-After seconds or None, body text)."""
    conn = UnixHTTPConnection(path, timeout=5)
    try:
        conn.request("GET", f"/next?count={count}", headers={"Accept": "text/plain"})
        reply = conn.getresponse()
        return reply.status, reply.getheader("Retry-After"), reply.read().decode()
    finally:
        conn.close()


def mint(path, count, wait_s):
    """COUNT IDs, or an exit code and a message once --wait is spent."""
    deadline = time.monotonic() + wait_s
    ids = []
    while len(ids) < count:
        try:
            status, retry_after, body = next_ids(path, min(count - len(ids), MAX_BATCH))
        except OSError as err:  # no socket yet, refused, timeout
            status, retry_after, body = None, None, str(err)
        if status == 200:
            ids += body.split()
            continue
        if status is not None and status != 503:
            return 1, f"GET /next answered {status}: {body.strip()}"
        left = deadline - time.monotonic()
        if left <= 0:
            last = f"{status} {body.strip()}" if status else body
            return 3, f"no IDs from {path} within {wait_s:g} s (last answer: {last})"
        delay = int(retry_after) if retry_after and retry_after.isdigit() else 1
        time.sleep(min(delay, left))
    return 0, ids


def main():
    parser = argparse.ArgumentParser(description="Prints COUNT IDs minted by snowlease.")
    parser.add_argument("count", type=int, help="how many IDs (at least 1)")
    parser.add_argument("--wait", type=float, default=30.0,
                        help="retry 503s this long, in seconds (default 30)")
    args = parser.parse_args()
    if args.count < 1 or args.wait < 0:
        parser.error("COUNT must be at least 1 and --wait at least 0")
    path = os.environ.get("SNOWLEASE_MINT_SOCKET", "/var/run/snowlease/mint.sock")
    code, result = mint(path, args.count, args.wait)
    if code != 0:
        print(result, file=sys.stderr)
        return code
    print("\n".join(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
