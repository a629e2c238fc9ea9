// npm run bench: measures the built executable on simulated nodes, writes one JSON report to
// dist/bench.json (and stdout) and ends with the table of the goals the project holds itself to
// (stderr). Medians (and p99 where asked) over repeated runs, each figure with its n; the machine is
// shared and noisy, so nothing here is a pass/fail test. Figures: the goals'
// (test/bench/goals.bench.ts: the Node floor, start → registered, idle RSS and fds, RSS after 10 000
// and 100 000 RPCs, Allocate and GetPreferredAllocation latency, kubelet restart → re-registered, XID
// → Unhealthy, hostile requests; the kubelet stand-in in a process of its own), XID on a MIG device
// and MIG re-layout, an XID storm, preferred-allocation latency per topology and size, the topology
// policy alone, the live node (GPU removed / driver back → new ListAndWatch list, NVML calls per idle
// minute with re-discovery), the labels and metrics files, the health signals (one probe round's
// main-thread time and NVML calls on 8 and 16 GPUs, Allocate with probes every second against probes
// off), DRA's NodePrepareResources and NodeUnprepareResources per kind of claim (plain, time-sliced, MPS,
// the durable checkpoint written), DRA's ResourceSlices back after a wipe with failed requests and after a
// deletion, sizes on disk.
import { readdirSync, statSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { BUILT_EXECUTABLE, ROOT, SimNode } from '../support/sim.ts';
import { goalTable, nodeTax } from './goals.bench.ts';
import type { Goal } from './goals.bench.ts';
import { migRelayoutLatency, migXidLatency } from './mig.bench.ts';
import { allocateWithProbes } from './signals-allocate.bench.ts';
import { draPrepareLatency } from './dra-prepare.bench.ts';
import { draSliceRecovery } from './dra-slices.bench.ts';
import { draDynamicMigLatency } from './dra-dynamic-mig.bench.ts';
import { log, r2, sleep, stats } from './stats.ts';

async function storm(seconds: number): Promise<Record<string, unknown>> {
  const node = await SimNode.start({
    topology: 'demo-8',
    args: ['--health-recovery', '--health-recovery-quiet-period=600'],
  });
  try {
    const k = node.kubelet!;
    const u = node.topology.gpus.map((g) => g.uuid);
    await node.plugin.waitForLine(/watching GPU health/);
    const before = node.plugin.rss();
    const updates0 = k.updates();
    const end = performance.now() + seconds * 1000;
    let sent = 0;
    const alloc: number[] = [];
    const feeder = (async () => {
      while (performance.now() < end) {
        node.nvml(Array.from({ length: 100 }, (_, i) => `xid ${(sent + i) % 8} 79`).join('\n'));
        sent += 100;
        await sleep(10);
      }
    })();
    while (performance.now() < end) {
      const t = performance.now();
      await k.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
      alloc.push(performance.now() - t);
      await sleep(5);
    }
    await feeder;
    await sleep(500);
    const after = node.plugin.rss();
    return {
      storm_seconds: seconds,
      storm_xids_sent: sent,
      storm_listandwatch_updates: k.updates() - updates0,
      storm_allocate_ms: stats(alloc),
      storm_rss_mib: { before: r2(before.totalKiB / 1024), after: r2(after.totalKiB / 1024) },
    };
  } finally {
    await node.stop();
  }
}

async function preferredPerTopology(): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const topology of ['dgx1-v100', 'nvswitch-16', 'pcie-2socket-8']) {
    const node = await SimNode.start({ topology });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      const bySize: Record<string, unknown> = {};
      for (let size = 1; size <= u.length; size++) {
        const lat: number[] = [];
        for (let i = 0; i < 200; i++) {
          const t = performance.now();
          await k.preferred({
            container_requests: [
              {
                available_deviceIDs: u,
                must_include_deviceIDs: i % 2 === 0 ? [] : [u[i % u.length]!],
                allocation_size: size,
              },
            ],
          });
          lat.push(performance.now() - t);
        }
        bySize[String(size)] = stats(lat);
      }
      out[topology] = bySize;
    } finally {
      await node.stop();
    }
  }
  return out;
}

/** From a FIFO command to the first ListAndWatch list that satisfies pred. */
async function untilList(
  node: SimNode,
  command: string,
  pred: (d: { ID: string; health: string }[]) => boolean,
): Promise<number> {
  const t0 = performance.now();
  node.nvml(command);
  await node.kubelet!.waitForDevices(pred, 'nvidia.com/gpu', 120000);
  return performance.now() - t0;
}

/** A spread of points in [0, 1) (golden-ratio steps): where in a timer's period round i lands. */
const phase = (i: number): number => (i * 0.6180339887) % 1;

async function liveNode(rounds: number): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  // GPU removed / back: found by the re-discovery timer (1 s here; the default is 60 s).
  let node = await SimNode.start({ topology: 'demo-8', args: ['--rediscover-interval=1'] });
  try {
    const u = node.topology.gpus.map((g) => g.uuid);
    await node.plugin.waitForLine(/watching GPU health/);
    const removed: number[] = [];
    const back: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const g = i % 8;
      // The change lands at a spread of points in the timer's period (each rescan restarts the
      // timer, so without this every round would land at the same point and measure only that).
      await sleep(phase(2 * i) * 1000);
      removed.push(await untilList(node, `remove ${g}`, (d) => d.length === 7));
      await sleep(phase(2 * i + 1) * 1000);
      back.push(await untilList(node, `add ${u[g]}`, (d) => d.length === 8));
    }
    out.gpu_removed_to_new_list_ms = { ...stats(removed), rediscover_interval_s: 1 };
    out.gpu_back_to_new_list_ms = { ...stats(back), rediscover_interval_s: 1 };
    // Driver unloaded (noticed by the health watcher at once) and loaded again (noticed at the next
    // re-open attempt: capped backoff from 1 s, so the figure depends on how long it was away).
    const gone: number[] = [];
    const again: number[] = [];
    for (let i = 0; i < Math.max(3, rounds >> 1); i++) {
      gone.push(await untilList(node, 'unload', (d) => d.every((x) => x.health === 'Unhealthy')));
      await sleep(500);
      const from = node.plugin.lines.length;
      again.push(
        await untilList(node, `load 560.${i}.0`, (d) => d.length === 8 && d.every((x) => x.health === 'Healthy')),
      );
      await node.plugin.waitForLine(/watching GPU health/, 20000, from);
    }
    out.driver_unloaded_to_unhealthy_list_ms = stats(gone);
    out.driver_back_to_healthy_list_ms = { ...stats(again), driver_away_ms: 500 };
  } finally {
    await node.stop();
  }
  // With the defaults (re-discovery every 60 s, probes every 5 s): a removal is seen by the probe of a
  // handle that stopped answering, which runs the cheap identity check.
  node = await SimNode.start({ topology: 'demo-8' });
  try {
    const u = node.topology.gpus.map((g) => g.uuid);
    await node.plugin.waitForLine(/watching GPU health/);
    const removed: number[] = [];
    for (let i = 0; i < Math.max(3, rounds >> 1); i++) {
      await sleep(phase(i) * 5000);
      removed.push(await untilList(node, `remove ${i % 8}`, (d) => d.length === 7));
      const from = node.plugin.lines.length;
      node.nvml(`add ${u[i % 8]}`);
      node.plugin.signal('SIGHUP');
      await node.kubelet!.waitForDevices((d) => d.length === 8, 'nvidia.com/gpu', 20000);
      await node.plugin.waitForLine(/looked at the node again/, 20000, from);
      await node.plugin.waitForLine(/watching GPU health/, 20000, from);
    }
    out.gpu_removed_to_new_list_defaults_ms = {
      ...stats(removed),
      rediscover_interval_s: 60,
      health_probe_interval_s: 5,
    };
  } finally {
    await node.stop();
  }
  // NVML calls per idle minute (8 GPUs, health watched): without re-discovery, and every second.
  const idle = async (
    interval: string,
    seconds: number,
  ): Promise<{ perMinute: number; calls: Record<string, number> }> => {
    const n = await SimNode.start({ topology: 'demo-8', args: [`--rediscover-interval=${interval}`] });
    try {
      await n.plugin.waitForLine(/watching GPU health/);
      await sleep(1000);
      const a = await n.nvmlStats();
      await sleep(seconds * 1000);
      const b = await n.nvmlStats();
      const calls: Record<string, number> = {};
      for (const [k, v] of Object.entries(b.calls)) {
        const d = v - (a.calls[k] ?? 0);
        if (d > 0) calls[k] = Math.round((d * 60) / seconds);
      }
      return { perMinute: Math.round(((b.total - a.total) * 60) / seconds), calls };
    } finally {
      await n.stop();
    }
  };
  const off = await idle('0', 20);
  const everySecond = await idle('1', 20);
  const perCheck = (everySecond.perMinute - off.perMinute) / 60;
  out.nvml_calls_per_idle_minute = {
    rediscovery_off: off.perMinute,
    rediscovery_every_1s: everySecond.perMinute,
    rediscovery_default_60s: Math.round(off.perMinute + perCheck),
    calls_per_identity_check: r2(perCheck),
    by_function_rediscovery_every_1s: everySecond.calls,
  };
  return out;
}

function sizes(): Record<string, number> {
  const mib = (p: string): number => r2(statSync(p).size / 1048576);
  const out: Record<string, number> = { executable_mib: mib(BUILT_EXECUTABLE) };
  const dist = join(ROOT, 'dist');
  for (const f of readdirSync(dist)) {
    if (f.endsWith('.deb')) out.deb_mib = mib(join(dist, f));
    if (f.endsWith('.rpm')) out.rpm_mib = mib(join(dist, f));
  }
  return out;
}

const report: Record<string, unknown> = {
  machine: `${process.arch}, ${(await import('node:os')).cpus().length} cores`,
  node: process.version,
  command: 'npm run bench',
};
const started = performance.now();
const failed: string[] = [];
/** One section of the report: a failure is recorded (and fails the run at the end), the others still run. */
async function section(what: string, run: () => Promise<Record<string, unknown>>): Promise<void> {
  log(what);
  try {
    Object.assign(report, await run());
  } catch (err) {
    failed.push(what);
    report[`failed: ${what}`] = (err as Error).stack ?? String(err);
    process.stderr.write(`bench: FAILED: ${what}: ${(err as Error).stack ?? String(err)}\n`);
  }
}
const childJson = (file: string): unknown =>
  JSON.parse(
    execFileSync(process.execPath, [join(ROOT, 'test', 'bench', file)], { encoding: 'utf8', maxBuffer: 64 << 20 }),
  ) as unknown;

let goals: Goal[] | undefined;
await section('figures against the goals', async () => {
  const tax = await nodeTax();
  goals = tax.goals;
  return { node_tax: tax.figures, goals: tax.goals };
});
await section('XID on a MIG device → Unhealthy', () => migXidLatency(200));
await section('MIG re-layout → new lists', () => migRelayoutLatency(20));
await section('XID storm', () => storm(10));
await section('GetPreferredAllocation per topology and size', async () => ({
  get_preferred_allocation_by_topology_ms: await preferredPerTopology(),
}));
await section('topology policy alone vs brute force', async () => ({ policy_alone: childJson('topology.bench.ts') }));
await section('live node: GPU removed/back, driver unloaded/back, NVML calls per idle minute', async () => ({
  live_node: await liveNode(10),
}));
await section('labels and metrics files: CPU per write, NVML calls, memory', async () => ({
  observe: childJson('observe.bench.ts'),
}));
await section('health signals: one probe round on 8 and 16 GPUs (main-thread time, NVML calls)', async () => ({
  signals_probe_round: childJson('signals-round.bench.ts'),
}));
await section('health signals: Allocate with probes every 1 s against probes off', async () => ({
  signals_allocate: await allocateWithProbes(),
}));
await section('DRA: NodePrepareResources per kind of claim (plain, time-sliced, MPS)', () => draPrepareLatency(100));
await section('DRA: NodePrepareResources of a dynamic MIG claim beside a plain one', () => draDynamicMigLatency(50));
await section('DRA: ResourceSlices back after the kubelet wipe (0, 1, 3 failed requests) and a deletion', () =>
  draSliceRecovery(7),
);
report.sizes = sizes();
report.bench_seconds = Math.round((performance.now() - started) / 1000);
const text = JSON.stringify(report, null, 2);
writeFileSync(join(ROOT, 'dist', 'bench.json'), `${text}\n`);
process.stdout.write(`${text}\n`);
if (goals !== undefined) {
  process.stderr.write(
    `\ngoals (npm run bench, ${report.machine}, ${report.node}; ` +
      `details in dist/bench.json):\n${goalTable(goals)}\n`,
  );
}
if (failed.length > 0) {
  process.stderr.write(`\nbench: ${failed.length} section(s) FAILED: ${failed.join('; ')}\n`);
  process.exitCode = 1;
}
