// The npm Redis peers on dlock's workloads (docs/performance.md):
//   node npm_redis.js PEER HOST:PORT WORKLOAD SECONDS LOGDIR [CLIENTS]
// PEER: redlock (npm `redlock` v5 on ioredis clients, one per master in
// ADDRESS=h:p[,h:p...]) or redis-semaphore
// (npm `redis-semaphore` Mutex). WORKLOAD: uncontended (1 client, own name)
// or contended (CLIENTS processes, default 8, one name: acquire, hold 1 ms,
// release, think 1 ms). Defaults as documented; only the retry budget is
// raised so that nothing gives up during the run. NODE_PATH must point at
// the node_modules bench/run-all installed. Writes logs for stats.py.
'use strict';
const { fork } = require('child_process');
const fs = require('fs');
const path = require('path');

const [peer, address, workload, seconds, logdir] = process.argv.slice(2, 7);
const contended = workload === 'contended';
const now = () => process.hrtime.bigint(); // CLOCK_MONOTONIC ns
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function cpuS() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

async function makeLock(name) {
  const Redis = require('ioredis');
  // ADDRESS may list several masters (h:p,h:p,...): redlock uses them all.
  const clients = address.split(',').map((hp) => {
    const [host, port] = hp.split(':');
    return new Redis({ host, port: Number(port) });
  });
  const client = clients[0];
  if (peer === 'redlock') {
    const Redlock = require('redlock').default;
    // ~15 s of retries at the default 200 ms delay: a stall past the window is
    // abandoned (and reported) rather than hanging the run.
    const rl = new Redlock(clients, { retryCount: 75 });
    let held = null;
    return {
      acquire: async () => { held = await rl.acquire([name], 30000); },
      release: async () => { await held.release(); },
      close: () => clients.forEach((c) => c.disconnect()),
    };
  }
  if (peer === 'redis-semaphore') {
    const { Mutex } = require('redis-semaphore');
    const m = new Mutex(client, name, { lockTimeout: 30000, acquireTimeout: 15000 });
    return { acquire: () => m.acquire(), release: () => m.release(), close: () => client.disconnect() };
  }
  throw new Error('unknown peer ' + peer);
}

async function child(i, name) {
  // Warm-up (connections, scripts, JIT) on a name of its own: contention
  // belongs to the measured window only.
  const warm = await makeLock(`${name}-warm-${i}`);
  for (let w = 0; w < 20; w++) { await warm.acquire(); await warm.release(); }
  warm.close();
  const lk = await makeLock(name);
  const win = await new Promise((resolve) => {
    process.on('message', (m) => resolve(m));
    process.send({ ready: i });
  });
  const start = BigInt(win.start), end = BigInt(win.end);
  while (now() < start) await sleep(1);
  const c0 = cpuS();
  const rows = [];
  for (;;) {
    const req = now();
    if (req >= end) break;
    try {
      await lk.acquire();
    } catch (e) {
      if (now() < end) throw e;
      // Stuck past the end of the window: stats.py reports the stall.
      fs.writeFileSync(path.join(logdir, `stalled-${i}`), '');
      break;
    }
    const got = now();
    if (contended) await sleep(1);
    const rel0 = now();
    await lk.release();
    rows.push(`${req} ${got} ${rel0} ${now()}\n`);
    if (contended) await sleep(1);
  }
  fs.writeFileSync(path.join(logdir, `cpu-${i}`), (cpuS() - c0).toFixed(6));
  fs.writeFileSync(path.join(logdir, `client-${i}.log`), rows.join(''));
  lk.close();
}

async function main() {
  if (process.env.PEER_CHILD !== undefined) {
    await child(Number(process.env.PEER_CHILD), process.env.PEER_NAME);
    process.exit(0);
  }
  const n = Number(process.argv[7] || (contended ? 8 : 1));
  fs.mkdirSync(logdir, { recursive: true });
  const base = `peer-${peer}-${process.pid}`;
  const kids = [];
  let ready = 0;
  const allReady = new Promise((resolve) => {
    for (let i = 0; i < n; i++) {
      const env = { ...process.env, PEER_CHILD: String(i), PEER_NAME: contended ? base : `${base}-${i}` };
      const k = fork(__filename, process.argv.slice(2), { env });
      k.on('message', () => { if (++ready === n) resolve(); });
      kids.push(k);
    }
  });
  const exits = kids.map((k) => new Promise((resolve) => k.on('exit', (code) => resolve(code))));
  // A client that dies before it is ready fails the run instead of hanging it.
  const early = Promise.race(exits).then((code) => { throw new Error(`${peer}: a client exited (${code}) before the start`); });
  await Promise.race([allReady, early]);
  early.catch(() => {});
  const start = now() + 20000000n, end = start + BigInt(Math.round(Number(seconds) * 1e9));
  for (const k of kids) k.send({ start: start.toString(), end: end.toString() });
  const codes = await Promise.all(exits);
  if (codes.some((c) => c !== 0)) { console.error(`${peer}: a client failed`); process.exit(1); }
  fs.writeFileSync(path.join(logdir, 'window'), `${start} ${end}\n`);
}

main().catch((e) => { console.error(e); process.exit(1); });
