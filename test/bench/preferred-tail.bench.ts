// Where GetPreferredAllocation's tail comes from, comparing builds of the executable (A/B):
//
//   node_modules/.bin/node test/bench/preferred-tail.bench.ts \
//     --exe A=/tmp/a/gpu-device-plugin --exe B=/tmp/b/gpu-device-plugin \
//     [--rounds 8] [--topology nvswitch-16] [--reps 200] [--settle-ms 0] [--memory]
//
// Each build runs from a fresh copy. Each round starts one node per build (the order rotates from
// round to round, so load on the shared machine falls on all builds alike), and asks, as npm run
// bench's per-topology figure does, every size 1..n `reps` times through the kubelet stand-in (a
// gRPC client in this process), alternately with no must-include GPU and with one; after each
// question one Allocate of one GPU is timed as the floor (a call that costs the plugin almost
// nothing but the same gRPC path). A question is "first" the first time that node hears it (the
// plugin caches answers; only those are solved) and "repeat" after. Per build: p50 / p99 of every
// question, of the first ones and of the repeats, of the floor, the ratio of each to the floor's
// p50 in the same round (median over rounds), the plugin's CPU time per question, and its CPU time
// from spawn to registered. Also the CPU time the plugin's main thread ran during each call
// (/proc/PID/task/PID/schedstat, nanoseconds): what the call cost the thread that answers it, which
// on a shared machine says more than wall-clock time (waiting for a core is not in it; an
// optimizing compile or a collection on that thread is). Milliseconds. `--settle-ms`: wait after
// the registration before asking (the plugin warms its topology policy up 100 ms after registering).
//
// With `--memory`, instead, the memory goal of test/bench/goals.bench.ts for each build: on a demo-8
// node, settled idle RSS, then 10 000 RPCs (5 000 Allocate + 5 000 GetPreferredAllocation, one at a
// time, alternating as goals.bench.ts asks them), then RSS each second for 20 s: `settled` is the
// one at SETTLE_MS, as goals.bench.ts reads it; the goal is settled ≤ idle + 8 MiB. The builds of a
// round run side by side (the same load on each).
import { chmodSync, copyFileSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { SimNode } from '../support/sim.ts';
import { log, q, r2, sleep, stats } from './stats.ts';
import type { Stats } from './stats.ts';

interface Round {
  all: number[];
  first: number[];
  repeat: number[];
  floor: number[];
  /** The plugin's main thread's CPU time over each question / each floor call (schedstat, ns precision), ms. */
  allCpu: number[];
  floorCpu: number[];
  cpuMsPerQuestion: number;
  /**
   * CPU time of all the plugin's threads, and of its main thread, from spawn to just after its registration was
   * seen, ms.
   */
  startCpu: number;
  startMainCpu: number;
}

/** CPU time the plugin's main thread (thread id = process id) has run, ms: schedstat's first field (ns). */
function mainThreadMs(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1e6;
}

/** CPU time all of the plugin's threads have run, ms (threads that have ended are not counted). */
function allThreadsMs(pid: number): number {
  let ns = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // The thread ended meanwhile.
    }
  }
  return ns / 1e6;
}

/** CPU time (user + system) of a process, in ms (clock ticks of 10 ms). */
function cpuMs(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
  return (Number(f[11]) + Number(f[12])) * 10;
}

async function oneNode(exe: string, topology: string, reps: number, settleMs: number): Promise<Round> {
  const node = await SimNode.start({ topology, executable: exe });
  try {
    const k = node.kubelet!;
    const u = node.topology.gpus.map((g) => g.uuid);
    await sleep(settleMs);
    const seen = new Set<string>();
    const pid = node.plugin.pid;
    const r: Round = {
      all: [],
      first: [],
      repeat: [],
      floor: [],
      allCpu: [],
      floorCpu: [],
      cpuMsPerQuestion: 0,
      startCpu: allThreadsMs(pid),
      startMainCpu: mainThreadMs(pid),
    };
    const c0 = cpuMs(node.plugin.pid);
    for (let size = 1; size <= u.length; size++) {
      for (let i = 0; i < reps; i++) {
        const must = i % 2 === 0 ? [] : [u[i % u.length]!];
        const key = `${size}|${must.join()}`;
        let c = mainThreadMs(pid);
        let t = performance.now();
        await k.preferred({
          container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: must, allocation_size: size }],
        });
        const ms = performance.now() - t;
        r.allCpu.push(mainThreadMs(pid) - c);
        r.all.push(ms);
        (seen.has(key) ? r.repeat : r.first).push(ms);
        seen.add(key);
        c = mainThreadMs(pid);
        t = performance.now();
        await k.allocate({ container_requests: [{ devices_ids: [u[i % u.length]!] }] });
        r.floor.push(performance.now() - t);
        r.floorCpu.push(mainThreadMs(pid) - c);
      }
    }
    r.cpuMsPerQuestion = (cpuMs(node.plugin.pid) - c0) / r.all.length;
    return r;
  } finally {
    await node.stop();
  }
}

/** Settling time as in goals.bench.ts: two of the plugin's 5 s quiet checks, and some. */
const SETTLE_MS = 12000;

/** VmRSS and its anonymous part, MiB. */
const rssMiB = (pid: number): { rss: number; anon: number } => {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? NaN);
  return { rss: r2(kib('VmRSS') / 1024), anon: r2(kib('RssAnon') / 1024) };
};

interface MemoryRound {
  idle: number;
  idleAnon: number;
  at1s: number;
  settled: number;
  settledAnon: number;
  growth: number;
  at20s: number;
  timeline: number[];
}

async function memoryNode(exe: string): Promise<MemoryRound> {
  const node = await SimNode.start({ topology: 'demo-8', executable: exe });
  try {
    const k = node.kubelet!;
    const u = node.topology.gpus.map((g) => g.uuid);
    await node.plugin.waitForLine(/watching GPU health/);
    await k.waitForDevices((d) => d.length === u.length && d.every((x) => x.health === 'Healthy'));
    await sleep(SETTLE_MS);
    const idle = rssMiB(node.plugin.pid);
    const g = u.length;
    for (let i = 0; i < 5000; i++) {
      await k.allocate({ container_requests: [{ devices_ids: [u[i % g]!, u[(i + 3) % g]!] }] });
      await k.preferred({
        container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [], allocation_size: 1 + (i % g) }],
      });
    }
    // RSS each second up to 20 s after: when the plugin gave memory back, not only whether by SETTLE_MS.
    const timeline: number[] = [];
    let settled = rssMiB(node.plugin.pid);
    for (let s = 1; s <= 20; s++) {
      await sleep(1000);
      const now = rssMiB(node.plugin.pid);
      timeline.push(now.rss);
      if (s * 1000 === SETTLE_MS) settled = now;
    }
    return {
      idle: idle.rss,
      idleAnon: idle.anon,
      at1s: timeline[0]!,
      settled: settled.rss,
      settledAnon: settled.anon,
      growth: r2(settled.rss - idle.rss),
      at20s: timeline.at(-1)!,
      timeline,
    };
  } finally {
    await node.stop();
  }
}

const median = (xs: readonly number[]): number => r2(q(xs, 0.5));

function summary(rounds: readonly Round[]): Record<string, unknown> {
  const pool = (pick: (r: Round) => number[]): number[] => rounds.flatMap(pick);
  // Wall-clock figures over the floor's wall-clock p50, CPU figures over the floor's CPU p50.
  const ratio = (pick: (r: Round) => number[], p: number): number =>
    median(
      rounds.map((r) => {
        const cpu = pick(r) === r.allCpu || pick(r) === r.floorCpu;
        return q(pick(r), p) / q(cpu ? r.floorCpu : r.floor, 0.5);
      }),
    );
  const s = (
    pick: (r: Round) => number[],
  ): Stats & { p50_over_floor: number; p99_over_floor: number; max: number } => ({
    ...stats(pool(pick)),
    max: r2(Math.max(...pool(pick))),
    p50_over_floor: ratio(pick, 0.5),
    p99_over_floor: ratio(pick, 0.99),
  });
  return {
    rounds: rounds.length,
    preferred: s((r) => r.all),
    preferred_first: s((r) => r.first),
    preferred_repeat: s((r) => r.repeat),
    floor_allocate: s((r) => r.floor),
    preferred_main_thread_cpu: s((r) => r.allCpu),
    floor_main_thread_cpu: s((r) => r.floorCpu),
    plugin_cpu_ms_per_question: { p50: median(rounds.map((r) => r.cpuMsPerQuestion)), n: rounds.length },
    start_to_registered_cpu_ms: {
      all_threads_p50: median(rounds.map((r) => r.startCpu)),
      main_thread_p50: median(rounds.map((r) => r.startMainCpu)),
      n: rounds.length,
    },
  };
}

const { values } = parseArgs({
  options: {
    exe: { type: 'string', multiple: true },
    rounds: { type: 'string', default: '8' },
    topology: { type: 'string', default: 'nvswitch-16' },
    reps: { type: 'string', default: '200' },
    'settle-ms': { type: 'string', default: '0' },
    memory: { type: 'boolean', default: false },
  },
});
// Each build runs from a fresh copy made the same way (file-backed RSS depends on how a file's pages
// came into the page cache, see test/bench/node-floor.ts), removed at exit.
const copies = mkdtempSync(join(tmpdir(), 'gdp-tail-'));
process.once('exit', () => rmSync(copies, { recursive: true, force: true }));
const builds = (values.exe ?? []).map((spec) => {
  const at = spec.indexOf('=');
  if (at <= 0) throw new Error(`--exe wants NAME=PATH, got ${JSON.stringify(spec)}`);
  const name = spec.slice(0, at);
  const copy = join(copies, name);
  copyFileSync(spec.slice(at + 1), copy);
  chmodSync(copy, 0o755);
  return { name, path: copy, from: spec.slice(at + 1) };
});
if (builds.length === 0) throw new Error('give at least one --exe NAME=PATH');
const rounds = Number(values.rounds);
const reps = Number(values.reps);
const settleMs = Number(values['settle-ms']);
if (values.memory) {
  const mem = new Map<string, MemoryRound[]>(builds.map((b) => [b.name, []]));
  for (let round = 0; round < rounds; round++) {
    const got = await Promise.all(builds.map((b) => memoryNode(b.path)));
    builds.forEach((b, j) => {
      mem.get(b.name)!.push(got[j]!);
      log(`memory round ${round + 1}/${rounds} ${b.name}: ${JSON.stringify(got[j])}`);
    });
  }
  process.stdout.write(
    `${JSON.stringify(
      {
        memory_after_10000_rpcs_mib: Object.fromEntries(
          builds.map((b) => {
            const rs = mem.get(b.name)!;
            const med = (pick: (r: MemoryRound) => number): number => median(rs.map(pick));
            return [
              b.name,
              {
                path: b.from,
                n: rs.length,
                idle: med((r) => r.idle),
                idle_anon: med((r) => r.idleAnon),
                settled_anon: med((r) => r.settledAnon),
                at_1s: med((r) => r.at1s),
                settled: med((r) => r.settled),
                at_20s: med((r) => r.at20s),
                growth: med((r) => r.growth),
                growth_max: Math.max(...rs.map((r) => r.growth)),
              },
            ];
          }),
        ),
      },
      null,
      2,
    )}\n`,
  );
  process.exit(0);
}
const results = new Map<string, Round[]>(builds.map((b) => [b.name, []]));
for (let round = 0; round < rounds; round++) {
  for (let j = 0; j < builds.length; j++) {
    const b = builds[(round + j) % builds.length]!;
    const r = await oneNode(b.path, values.topology, reps, settleMs);
    results.get(b.name)!.push(r);
    log(
      `round ${round + 1}/${rounds} ${b.name}: preferred p50 ${r2(q(r.all, 0.5))} p99 ${r2(q(r.all, 0.99))}, ` +
        `floor p50 ${r2(q(r.floor, 0.5))}; main-thread CPU preferred p50 ${r2(q(r.allCpu, 0.5))} ` +
        `p99 ${r2(q(r.allCpu, 0.99))}, floor p50 ${r2(q(r.floorCpu, 0.5))} p99 ${r2(q(r.floorCpu, 0.99))}`,
    );
  }
}
process.stdout.write(
  `${JSON.stringify(
    {
      topology: values.topology,
      reps_per_size: reps,
      settle_ms: settleMs,
      builds: Object.fromEntries(builds.map((b) => [b.name, { path: b.from, ...summary(results.get(b.name)!) }])),
    },
    null,
    2,
  )}\n`,
);
