#!/usr/bin/env node
// Reads the worker ID snowlease publishes and mints one Snowflake ID with it.
//
// The ID file (WORKER_ID_FILE, default /var/run/snowlease/worker-id) first: a
// decimal ID and a newline; if the state file beside it (<file>.state.json)
// exists, it must name the same ID, this boot's boot_id, and valid_until_boot_ms
// (ms on CLOCK_BOOTTIME, which no wall-clock step moves) in the future. Else
// GET <WORKER_ID_URL>/id (default http://127.0.0.1:7391). With neither, it
// refuses to mint: message on stderr, exit 3, nothing on stdout.
//
// Prints: worker_id=<n> source=<file|http> snowflake=<id>
// No dependencies; Node.js 18+. Run: node worker_id.js
//
// An app that keeps running must stop minting as soon as the ID is gone, and
// before valid_until_boot_ms / lease_expires_in_ms passes (docs/app.md, "How the app
// reads the ID"); `snowlease exec` does that for you.
'use strict';
const fs = require('fs');
const http = require('http');

const EPOCH_MS = 1577836800000n; // 2020-01-01T00:00:00Z, the Snowflake epoch of this example

/** The worker ID from the ID file, or null when missing, malformed or stale. */
function fromFile(path) {
  let text;
  try {
    text = fs.readFileSync(path, 'utf8');
  } catch {
    return null;
  }
  if (!/^[0-9]+\n$/.test(text)) return null;
  const workerId = Number(text.trim());
  let state;
  try {
    state = JSON.parse(fs.readFileSync(path + '.state.json', 'utf8'));
  } catch (err) {
    return err.code === 'ENOENT' ? workerId : null;
  }
  if (state.worker_id !== workerId || !bootDeadlineAhead(state)) return null;
  return workerId;
}

/** True while the state file's deadline on the boot clock is ahead (same boot only). */
function bootDeadlineAhead(state) {
  let bootId, uptime;
  try {
    bootId = fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    uptime = fs.readFileSync('/proc/uptime', 'utf8').split(' ')[0];
  } catch {
    return false;
  }
  // /proc/uptime is CLOCK_BOOTTIME in 10 ms steps: round up, so the deadline errs early.
  const nowMs = Math.round(Number(uptime) * 1000) + 10;
  return state.boot_id === bootId && state.valid_until_boot_ms > nowMs;
}

/** The worker ID from GET <baseUrl>/id, or null when the sidecar has none or is down. */
function fromHttp(baseUrl) {
  return new Promise((resolve) => {
    const req = http.get(baseUrl.replace(/\/+$/, '') + '/id',
      { headers: { Accept: 'application/json' }, timeout: 2000 }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk) => { body += chunk; });
        res.on('end', () => {
          if (res.statusCode !== 200) return resolve(null);
          try {
            const reply = JSON.parse(body);
            const ok = Number.isInteger(reply.worker_id) && reply.lease_expires_in_ms > 0;
            resolve(ok ? reply.worker_id : null);
          } catch {
            resolve(null);
          }
        });
      });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(null));
  });
}

/** 41 bits of ms since EPOCH_MS, 10 bits worker ID, 12 bits sequence. */
function snowflake(workerId, sequence = 0) {
  return ((BigInt(Date.now()) - EPOCH_MS) << 22n) | (BigInt(workerId) << 12n) | BigInt(sequence);
}

async function main() {
  const path = process.env.WORKER_ID_FILE || '/var/run/snowlease/worker-id';
  const url = process.env.WORKER_ID_URL || 'http://127.0.0.1:7391';
  let workerId = fromFile(path);
  let source = 'file';
  if (workerId === null) {
    workerId = await fromHttp(url);
    source = 'http';
  }
  if (workerId === null) {
    console.error(`no worker ID published (${path}, ${url}/id): refusing to mint`);
    return 3;
  }
  console.log(`worker_id=${workerId} source=${source} snowflake=${snowflake(workerId)}`);
  return 0;
}

main().then((code) => { process.exitCode = code; });
