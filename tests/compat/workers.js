// tests/compat/node.txt: node with worker threads (worker_threads) and child processes
// (child_process: fork of this script, execFile, spawn with a pipe). The output is fixed.
// `node workers.js N` repeats it all N times (the attach records need a node that works a
// while); `node workers.js child` is the forked child.
'use strict';
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
const cp = require('child_process');

function primes(from, to) {
  let n = 0, sum = 0;
  for (let i = Math.max(from, 2); i < to; ++i) {
    let p = true;
    for (let d = 2; d * d <= i; ++d) if (i % d === 0) { p = false; break; }
    if (p) { ++n; sum += i; }
  }
  return { n, sum };
}

if (!isMainThread) {
  const r = primes(workerData.from, workerData.to);
  const chunks = [];
  for (let i = 0; i < 2000; ++i) chunks.push(Buffer.alloc(256, i % 251).toString('hex').length);
  parentPort.postMessage({ id: workerData.id, ...r, chunks: chunks.length });
} else if (process.argv[2] === 'child') {
  process.on('message', (m) => {
    const r = primes(0, m.upto);
    process.send({ child: process.pid > 0, ...r }, () => process.exit(7));
  });
} else {
  const rounds = Number(process.argv[2] || 1);
  const runWorker = (id) => new Promise((resolve, reject) => {
    const w = new Worker(__filename, { workerData: { id, from: id * 50000, to: (id + 1) * 50000 } });
    w.on('message', resolve);
    w.on('error', reject);
  });
  const forkChild = () => new Promise((resolve, reject) => {
    const c = cp.fork(__filename, ['child']);
    let msg;
    c.on('message', (m) => { msg = m; });
    c.on('exit', (code) => resolve({ msg, code }));
    c.on('error', reject);
    c.send({ upto: 30000 });
  });
  const execSh = () => new Promise((resolve, reject) => {
    cp.execFile('sh', ['-c', 'echo from sh; seq 1 1000 | wc -l; exit 2'], (err, out) => {
      resolve(`${out.replace(/\n/g, ' ')}code ${err ? err.code : 0}`);
    });
  });
  const spawnSort = () => new Promise((resolve) => {
    const s = cp.spawn('sort', ['-r']);
    let out = '';
    s.stdout.on('data', (d) => { out += d; });
    s.on('close', (code) => resolve(`${out.trim().split('\n').join(',')} code ${code}`));
    s.stdin.end('b\na\nc\n');
  });
  (async () => {
    let last;
    for (let r = 0; r < rounds; ++r) {
      const ws = await Promise.all([0, 1, 2, 3].map(runWorker));
      const [child, sh, sorted] = await Promise.all([forkChild(), execSh(), spawnSort()]);
      last = { ws, child, sh, sorted };
    }
    for (const w of last.ws) console.log(`worker ${w.id} primes ${w.n} sum ${w.sum} chunks ${w.chunks}`);
    console.log(`child primes ${last.child.msg.n} sum ${last.child.msg.sum} exit ${last.child.code}`);
    console.log(`execFile: ${last.sh}`);
    console.log(`spawn: ${last.sorted}`);
    console.log('done');
  })().catch((e) => { console.error(e); process.exit(1); });
}
