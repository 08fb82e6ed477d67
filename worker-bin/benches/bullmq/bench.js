// BullMQ's side of `bench e2e`'s `bullmq` cell: no-op jobs on the bench's Redis.
//
//   node bench.js add PORT N        enqueue N jobs (addBulk, 1000 at a time)
//   node bench.js work PORT N C     one Worker of concurrency C runs them; prints
//                                   {"jobs": N, "seconds": S} from its start to the
//                                   Nth completion
//
// Jobs are removed once done (`removeOnComplete`), BullMQ's cheapest setting: tranche
// keeps a record of every partition, so this favours BullMQ.
const { Queue, Worker } = require('bullmq');

const [mode, port, n, concurrency] = process.argv.slice(2);
const connection = { host: '127.0.0.1', port: Number(port) };
const total = Number(n);

async function add() {
  const queue = new Queue('bench', { connection });
  const opts = { removeOnComplete: true, removeOnFail: true };
  for (let i = 0; i < total; i += 1000) {
    const jobs = [];
    for (let j = i; j < Math.min(i + 1000, total); j++) {
      jobs.push({ name: 'noop', data: { id: j }, opts });
    }
    await queue.addBulk(jobs);
  }
  await queue.close();
}

async function work() {
  let done = 0;
  const started = process.hrtime.bigint();
  let worker;
  await new Promise((resolve, reject) => {
    worker = new Worker('bench', async () => {}, {
      connection,
      concurrency: Number(concurrency),
    });
    worker.on('completed', () => {
      done += 1;
      if (done === total) resolve();
    });
    worker.on('failed', (_, err) => reject(err));
    worker.on('error', reject);
  });
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await worker.close();
  console.log(JSON.stringify({ jobs: total, seconds }));
}

(mode === 'add' ? add() : work()).then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
