// Allocate latency while the health thread probes every second, against the same node with probes
// off (--health-probe-interval=3600: no round after the first within the run), in the same run and
// alternated so that the machine's drift falls on both alike. The node probes with whatever the
// daemon reads on a round (the health signals included once the node model watches them); the NVML
// calls per second during the run say how much that is. The kubelet stand-in runs in a process of
// its own (remote-kubelet.ts), so the timings are the plugin's and one client's.
import { SimNode } from '../support/sim.ts';
import { RemoteKubelet } from './remote-kubelet.ts';
import { log, q, r2, stats } from './stats.ts';

const CALLS = 5000;
const REPEATS = 2;
const SETTINGS = { probes_every_1s: ['--health-probe-interval=1'], probes_off: ['--health-probe-interval=3600'] };
type Setting = keyof typeof SETTINGS;

async function one(
  remote: RemoteKubelet,
  topology: string,
  args: readonly string[],
): Promise<{ allocate: number[]; seconds: number; nvmlCallsPerSecond: number; probeRoundsPerSecond: number }> {
  const node = await SimNode.start({
    topology,
    kubelet: false,
    args,
    beforePlugin: async (n) => {
      await remote.call('start', { dir: n.kubeletDir });
    },
  });
  try {
    await remote.call('waitRegistered', { n: 1, timeoutMs: 15000 });
    await node.plugin.waitForLine(/watching GPU health/);
    const gpus = node.topology.gpus.length;
    await remote.call('waitDevices', { want: { length: gpus, allHealthy: true }, timeoutMs: 10000 });
    const uuids = node.topology.gpus.map((g) => g.uuid);
    const a = await node.nvmlStats();
    const t0 = performance.now();
    const { allocate } = await remote.call('latency', { n: CALLS, uuids });
    const seconds = (performance.now() - t0) / 1000;
    const b = await node.nvmlStats();
    const memoryInfo = (b.calls.nvmlDeviceGetMemoryInfo ?? 0) - (a.calls.nvmlDeviceGetMemoryInfo ?? 0);
    return {
      allocate,
      seconds,
      nvmlCallsPerSecond: (b.total - a.total) / seconds,
      // The probe reads each GPU's memory info once a round.
      probeRoundsPerSecond: memoryInfo / gpus / seconds,
    };
  } finally {
    await node.stop();
  }
}

/** Allocate p50/p99 with probes every second and with probes off, on `topology`, and their ratio. */
export async function allocateWithProbes(topology = 'demo-8'): Promise<Record<string, unknown>> {
  const remote = await RemoteKubelet.spawn();
  const runs: Record<Setting, Awaited<ReturnType<typeof one>>[]> = { probes_every_1s: [], probes_off: [] };
  try {
    for (let i = 0; i < REPEATS; i++) {
      for (const s of (i % 2 === 0
        ? ['probes_off', 'probes_every_1s']
        : ['probes_every_1s', 'probes_off']) as Setting[]) {
        log(`Allocate with ${s} (${topology}), run ${i + 1} of ${REPEATS}`);
        runs[s].push(await one(remote, topology, SETTINGS[s]));
      }
    }
  } finally {
    await remote.close();
  }
  const summary = (s: Setting): Record<string, unknown> => {
    const all = runs[s].flatMap((r) => r.allocate);
    const p99s = runs[s].map((r) => q(r.allocate, 0.99));
    return {
      allocate_ms: stats(all),
      p99_of_each_run_ms: p99s.map(r2),
      median_p99_ms: r2(q(p99s, 0.5)),
      run_seconds: runs[s].map((r) => r2(r.seconds)),
      probe_rounds_per_second: runs[s].map((r) => r2(r.probeRoundsPerSecond)),
      nvml_calls_per_second: runs[s].map((r) => r2(r.nvmlCallsPerSecond)),
    };
  };
  const on = summary('probes_every_1s');
  const off = summary('probes_off');
  const p = (x: Record<string, unknown>, k: 'p50' | 'p99'): number =>
    (x.allocate_ms as { p50: number; p99: number })[k];
  return {
    topology,
    calls_per_run: CALLS,
    repeats: REPEATS,
    probes_off_floor: off,
    probes_every_1s: on,
    ratio_p50: r2(p(on, 'p50') / p(off, 'p50')),
    ratio_p99: r2(p(on, 'p99') / p(off, 'p99')),
  };
}

if (import.meta.main) process.stdout.write(`${JSON.stringify(await allocateWithProbes(process.argv[2]), null, 2)}\n`);
