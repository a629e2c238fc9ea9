// Benchmark of the topology policy alone (no gRPC): node_modules/.bin/node test/bench/topology.bench.ts
// Prints one JSON object. Times are microseconds.
//   cold: the policy is built once per machine (as the plugin does at start-up); before each timed
//         call its answer cache and memo tables are forgotten, so the call solves from scratch.
//   cold_must: the same with one must-include GPU (the last one).
//   warm: the same question again (answer cache hit), as when the kubelet repeats a question.
//   For machines of at most 10 GPUs: the brute-force solver of test/support (every cut
//   enumerated) on the same question, and how many times slower it is than a cold call.
// Each figure is the median, over several rounds, of that round's percentile.
import { PreferredPolicy, buildScoreMatrix } from '../../src/core/topology/index.ts';
import type { ScoreMatrix } from '../../src/core/topology/index.ts';
import { bruteForceChoose } from '../support/brute-force-policy.ts';
import { dgx1, fixtureMatrix, gpuBusId, nvswitch16, nvswitch8, pcie16, pcie8 } from '../support/topology-fixtures.ts';

function nowUs(): number {
  return Number(process.hrtime.bigint()) / 1000;
}

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1);
  return sorted[Math.max(0, i)] as number;
}

function median(values: readonly number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

const round2 = (x: number): number => Math.round(x * 100) / 100;

interface Stats {
  p50: number;
  p99: number;
}

/** Runs `rounds` rounds of `samples` timed calls; returns the median p50 and p99 over rounds. */
function measure(rounds: number, samples: number, before: () => void, call: () => void): Stats {
  const p50: number[] = [];
  const p99: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const t: number[] = [];
    for (let s = 0; s < samples; s++) {
      before();
      const t0 = nowUs();
      call();
      t.push(nowUs() - t0);
    }
    t.sort((a, b) => a - b);
    p50.push(percentile(t, 50));
    p99.push(percentile(t, 99));
  }
  return { p50: round2(median(p50)), p99: round2(median(p99)) };
}

/** A 16-GPU machine with no symmetry at all (random NVLinks and PCIe levels): a stress case. */
function randomMachine(seed: number, n: number): ScoreMatrix {
  let a = seed >>> 0;
  const rand = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const levels = Array.from({ length: n * n }, () => [0, 10, 20, 30, 40, 50][Math.floor(rand() * 6)] as number);
  const gpus = Array.from({ length: n }, (_, i) => ({
    busId: gpuBusId(i),
    links: Array.from({ length: Math.floor(rand() * 6) }, () => ({
      remoteBusId: gpuBusId(Math.floor(rand() * n)),
      remote: 'gpu' as const,
    })),
  }));
  return buildScoreMatrix(gpus, (i, j) => levels[i * n + j] ?? -1);
}

const started = nowUs();

// The very first call in this process, before any code is optimised by the JIT.
const firstMatrix = fixtureMatrix(nvswitch16);
const firstPolicy = new PreferredPolicy(firstMatrix);
const all16 = Array.from({ length: 16 }, (_, i) => i);
let t0 = nowUs();
firstPolicy.choose(all16, [], 4);
const firstCallUs = round2(nowUs() - t0);
t0 = nowUs();
firstPolicy.choose(all16, [], 5);
const secondCallUs = round2(nowUs() - t0);

interface Machine {
  name: string;
  matrix: ScoreMatrix;
  rounds: number;
  samples: number;
  brute: boolean;
}
const machines: Machine[] = [
  { name: dgx1.name, matrix: fixtureMatrix(dgx1), rounds: 5, samples: 200, brute: true },
  { name: nvswitch8.name, matrix: fixtureMatrix(nvswitch8), rounds: 5, samples: 200, brute: true },
  { name: pcie8.name, matrix: fixtureMatrix(pcie8), rounds: 5, samples: 200, brute: true },
  { name: nvswitch16.name, matrix: fixtureMatrix(nvswitch16), rounds: 5, samples: 200, brute: false },
  { name: pcie16.name, matrix: fixtureMatrix(pcie16), rounds: 5, samples: 200, brute: false },
  {
    name: 'random-16-no-symmetry (stress, not a real machine)',
    matrix: randomMachine(42, 16),
    rounds: 3,
    samples: 12,
    brute: false,
  },
];

// Warm the JIT on a throw-away machine so that the first measured sizes are not penalised.
{
  const p = new PreferredPolicy(fixtureMatrix(pcie16));
  for (let rep = 0; rep < 20; rep++) {
    for (let k = 1; k <= 16; k++) {
      p.clearCaches();
      p.choose(all16, [], k);
      p.clearCaches();
      p.choose(all16, [15], k);
    }
  }
}

const topologies: Record<string, unknown> = {};
const summary: Record<string, unknown> = {};
for (const mc of machines) {
  const n = mc.matrix.size;
  const everyone = Array.from({ length: n }, (_, i) => i);
  const build: number[] = [];
  for (let r = 0; r < 7; r++) {
    const b0 = nowUs();
    void new PreferredPolicy(mc.matrix);
    build.push(nowUs() - b0);
  }
  const policy = new PreferredPolicy(mc.matrix);
  const sizes: Record<string, unknown> = {};
  let coldMax = 0;
  let coldMustMax = 0;
  let warmMax = 0;
  for (let k = 1; k <= n; k++) {
    const cold = measure(
      mc.rounds,
      mc.samples,
      () => policy.clearCaches(),
      () => policy.choose(everyone, [], k),
    );
    const coldMust = measure(
      mc.rounds,
      mc.samples,
      () => policy.clearCaches(),
      () => policy.choose(everyone, [n - 1], k),
    );
    policy.choose(everyone, [], k);
    const warm = measure(
      mc.rounds,
      2000,
      () => undefined,
      () => policy.choose(everyone, [], k),
    );
    const row: Record<string, number> = {
      cold_p50_us: cold.p50,
      cold_p99_us: cold.p99,
      cold_must_p50_us: coldMust.p50,
      cold_must_p99_us: coldMust.p99,
      warm_p50_us: warm.p50,
      warm_p99_us: warm.p99,
    };
    if (mc.brute) {
      const times: number[] = [];
      for (let r = 0; r < 5; r++) {
        const b0 = nowUs();
        bruteForceChoose(mc.matrix, everyone, [], k);
        times.push(nowUs() - b0);
      }
      row.brute_force_us = round2(median(times));
      row.brute_force_over_cold_p50 = round2(median(times) / Math.max(cold.p50, 0.01));
    }
    sizes[String(k)] = row;
    coldMax = Math.max(coldMax, cold.p99);
    coldMustMax = Math.max(coldMustMax, coldMust.p99);
    warmMax = Math.max(warmMax, warm.p99);
  }
  topologies[mc.name] = { gpus: n, build_policy_us: round2(median(build)), sizes };
  summary[mc.name] = { cold_p99_max_us: coldMax, cold_must_p99_max_us: coldMustMax, warm_p99_max_us: warmMax };
}

const report = {
  what: 'PreferredPolicy.choose alone, all GPUs available, every size; microseconds',
  node: process.version,
  method:
    'cold = answer cache and memo forgotten before each call (policy built once, as at plugin start); ' +
    'cold_must = same with must-include [last GPU]; warm = repeated question (cache hit); ' +
    'each figure = median over rounds of the round percentile',
  first_call_in_process_us: { nvswitch16_size4: firstCallUs, then_size5: secondCallUs },
  summary,
  topologies,
  total_seconds: round2((nowUs() - started) / 1e6),
};
process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
