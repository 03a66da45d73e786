#!/usr/bin/env node
// Gets COUNT Snowflake IDs from a snowlease sidecar in mint mode and prints them.
//
// GET /next?count=N (N at most 4096 per request) over the unix socket the sidecar
// serves with --mint-socket (SNOWLEASE_MINT_SOCKET, default
// /var/run/snowlease/mint.sock), Accept: text/plain (one decimal ID a line; as
// text, never a Number, which loses IDs above 2^53). While the sidecar answers
// 503 (no valid lease yet: claiming, guard_closed, clock_behind, ...) or its
// socket is not there yet, it retries after the Retry-After seconds (1 s
// without an answer), for at most --wait seconds (default 30) in all: the last
// try comes at the end of --wait.
//
// Prints COUNT IDs, one a line, increasing, and exits 0. When none come within
// --wait: a message on stderr (the last answer), exit 3, nothing on stdout.
// Any other answer (e.g. 400): exit 1. Bad arguments: exit 2.
//
// No dependencies; Node.js 18+. Run: node mint.js [--wait SECONDS] COUNT
'use strict';
const http = require('http');
const { setTimeout: sleep } = require('timers/promises');

const MAX_BATCH = 4096; // most IDs one request may ask for

/** No IDs: the exit code (3: none within --wait, 1: another answer) and why. */
class NoIds extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

/** One GET /next?count=N: {status, retryAfter, body}; rejects when nothing answers. */
function nextIds(socketPath, count) {
  return new Promise((resolve, reject) => {
    const req = http.get({
      socketPath,
      path: `/next?count=${count}`,
      headers: { Accept: 'text/plain' },
      timeout: 5000,
    }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk) => { body += chunk; });
      res.on('end', () => resolve({
        status: res.statusCode, retryAfter: res.headers['retry-after'], body,
      }));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
  });
}

/** COUNT IDs as strings; throws NoIds once --wait is spent or on another answer. */
async function mint(socketPath, count, waitS) {
  const deadline = Date.now() + waitS * 1000;
  const ids = [];
  while (ids.length < count) {
    let reply;
    try {
      reply = await nextIds(socketPath, Math.min(count - ids.length, MAX_BATCH));
    } catch (err) { // no socket yet, refused, timeout
      reply = { status: null, body: err.message };
    }
    if (reply.status === 200) {
      ids.push(...reply.body.split('\n').filter(Boolean));
      continue;
    }
    if (reply.status !== null && reply.status !== 503) {
      throw new NoIds(1, `GET /next answered ${reply.status}: ${reply.body.trim()}`);
    }
    const left = deadline - Date.now();
    if (left <= 0) {
      const last = reply.status ? `${reply.status} ${reply.body.trim()}` : reply.body;
      throw new NoIds(3, `no IDs from ${socketPath} within ${waitS} s (last answer: ${last})`);
    }
    const delay = /^[0-9]+$/.test(reply.retryAfter || '') ? Number(reply.retryAfter) * 1000 : 1000;
    await sleep(Math.min(delay, left));
  }
  return ids;
}

/** [--wait SECONDS] COUNT, or null when they do not parse. */
function parseArgs(argv) {
  let waitS = 30;
  let count = null;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--wait') waitS = Number(argv[++i]);
    else if (argv[i].startsWith('--wait=')) waitS = Number(argv[i].slice(7));
    else if (count === null) count = Number(argv[i]);
    else return null;
  }
  const ok = Number.isInteger(count) && count >= 1 && Number.isFinite(waitS) && waitS >= 0;
  return ok ? { count, waitS } : null;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (!args) {
    console.error('usage: node mint.js [--wait SECONDS] COUNT   (COUNT at least 1)');
    return 2;
  }
  const socketPath = process.env.SNOWLEASE_MINT_SOCKET || '/var/run/snowlease/mint.sock';
  try {
    const ids = await mint(socketPath, args.count, args.waitS);
    process.stdout.write(ids.join('\n') + '\n');
    return 0;
  } catch (err) {
    if (!(err instanceof NoIds)) throw err;
    console.error(err.message);
    return err.code;
  }
}

main().then((code) => { process.exitCode = code; });
