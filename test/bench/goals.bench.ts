// The figures for npm run bench (also alone: node test/bench/goals.bench.ts, after npm run
// build), on the built executable and the demo-8 node, each beside its goal. The kubelet stand-in
// runs in a process of its own (test/bench/kubelet-driver.ts) and times what it sees there; this
// process only starts things, reads /proc and waits. Medians and p99 over many runs, every figure
// with its n; the machine is shared, so nothing here passes or fails a build.
//
//   Node floor            the executable's own runtime as plain Node (test/bench/node-floor.ts),
//                         `-e 0`: spawn → exit, and peak RSS (GNU time's %M, i.e. VmHWM)
//   --version             the executable, the same two figures
//   start → registered    plugin spawn (here) → Register received (stand-in), same monotonic clock
//   idle                  VmRSS / RssAnon / RssFile and /proc/PID/fd, settled: SETTLE_MS after "watching
//                         GPU health" (the plugin gives back what a busy spell took once it has been
//                         quiet for one 5 s check, src/system/memory.ts; that includes start-up):
//                         medians over 5 of the started nodes and the two below that idle first
//   after RPCs            the same RSS settled after 10 000 RPCs (the 5 000 + 5 000 timed calls) and
//                         after 90 000 more, beside that node's own idle RSS (Allocate and
//                         GetPreferredAllocation alternating, pre-encoded, 4 in flight); flat = within
//                         2 MiB of each other; also 1 s after
//                         (at_1s), before the plugin has given anything back
//   Allocate, preferred   one call at a time through the stand-in's connection, alternating
//   re-registration       stand-in serves kubelet.sock again → Register received, 200 restarts
//   XID → Unhealthy       FIFO write (in the stand-in's process) → ListAndWatch list with that GPU
//                         Unhealthy; recovery on (50 ms) so every round starts healthy
//   hostile               10 000 requests on a fresh node, 4 in flight, five kinds in turn: random
//                         bytes as an Allocate body and as a GetPreferredAllocation body, an Allocate
//                         with one 1 MiB ID, Allocate and GetPreferredAllocation with 10 000 IDs; RSS
//                         settled after (and 1 s after), the codes answered, and whether it still
//                         serves and is registered (its per-kind times include queueing behind the
//                         other 3 in flight)
//   plugin CPU per call   utime + stime from /proc/PID/stat over a phase, divided by its calls: a
//                         figure that depends less on how loaded the machine is than latency
import { readFileSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { executable, SimNode } from '../support/sim.ts';
import { floorRuntime, peakRssKiB, timeToExit } from './node-floor.ts';
import { RemoteKubelet } from './remote-kubelet.ts';
import { log, q, r2, sleep, stats } from './stats.ts';
import type { Stats } from './stats.ts';

const mib = (kib: number): number => r2(kib / 1024);

export interface Goal {
  figure: string;
  value: number | boolean;
  unit: string;
  n: number;
  /** The goal as text, e.g. "≤ 60"; empty for a figure shown for scale only. */
  goal: string;
  /** null: no goal, for scale. */
  met: boolean | null;
  nvidia?: string;
  note?: string;
}

interface Memory {
  rss_mib: number;
  anon_mib: number;
  file_mib: number;
}

export interface Figures {
  node_floor: {
    runtime: string;
    command: string;
    start_ms: Stats;
    peak_rss_mib: { p50: number; n: number };
    spawn_exit_bin_true_ms: Stats;
  };
  version: { command: string; ms: Stats; peak_rss_mib: { p50: number; n: number } };
  start_to_registered_ms: Stats & { worst: number; over_floor: number };
  idle: Memory & { fds: number; n: number; fds_by_kind_last: Record<string, number> };
  after_10000_rpcs: Memory & { idle_of_this_node: Memory; at_1s: Memory };
  after_100000_rpcs: Memory & {
    at_1s: Memory;
    load_90000_rpcs: { seconds: number; failed: number; in_flight: number; plugin_cpu_us_per_call: number };
  };
  after_200_restarts: Memory & { fds: number };
  allocate_ms: Stats;
  get_preferred_allocation_ms: Stats;
  /** The plugin's CPU time (user + system) over the 10 000 timed calls, per call: less load-dependent than latency. */
  timed_calls_plugin_cpu_us_per_call: number;
  kubelet_restart_to_reregistered_ms: Stats & { worst: number };
  xid_to_unhealthy_ms: Stats & { args: string };
  hostile: {
    n: number;
    in_flight: number;
    seconds: number;
    plugin_cpu_us_per_request: number;
    idle: Memory;
    after: (Memory & { at_1s: Memory | null }) | null;
    codes_by_kind: Record<string, Record<string, number>>;
    ms_by_kind: Record<string, Stats>;
    plugin_alive: boolean;
    plugin_exit: unknown;
    still_registered: boolean;
    registrations: number;
    stream_breaks: number;
    serving_after: { allocate_ms: Stats } | { error: string };
  };
}

function memory(pid: number): Memory {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? NaN);
  return { rss_mib: mib(kib('VmRSS')), anon_mib: mib(kib('RssAnon')), file_mib: mib(kib('RssFile')) };
}

/** Open file descriptors, and how many of each kind (socket, pipe, anon_inode:[eventfd], a path …). */
function fds(pid: number): { count: number; by_kind: Record<string, number> } {
  const by: Record<string, number> = {};
  const names = readdirSync(`/proc/${pid}/fd`);
  for (const fd of names) {
    let target: string;
    try {
      target = readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      continue;
    }
    const kind = target.startsWith('/')
      ? target.startsWith('/dev/')
        ? target
        : 'file'
      : target.replace(/:\[\d+\]$/, '').replace(/\[\d+\]$/, '');
    by[kind] = (by[kind] ?? 0) + 1;
  }
  return { count: names.length, by_kind: by };
}

/** A demo-8 node whose kubelet is the stand-in in `remote`'s process; resolves once registered. */
async function benchNode(
  remote: RemoteKubelet,
  args: readonly string[] = [],
): Promise<{ node: SimNode; registeredAt: number }> {
  const node = await SimNode.start({
    topology: 'demo-8',
    kubelet: false,
    args,
    beforePlugin: async (n) => {
      await remote.call('start', { dir: n.kubeletDir });
    },
  });
  try {
    const reg = await remote.call('waitRegistered', { n: 1, timeoutMs: 15000 });
    return { node, registeredAt: reg.at };
  } catch (err) {
    await node.stop();
    throw new Error(`${(err as Error).message}\nplugin log:\n${node.plugin.lines.join('\n')}`);
  }
}

/** How long the bench waits for memory to settle: two of the plugin's 5 s quiet checks, and some. */
const SETTLE_MS = 12000;

async function idleNode(remote: RemoteKubelet, args: readonly string[] = []): Promise<SimNode> {
  const { node } = await benchNode(remote, args);
  await untilIdle(remote, node, 0);
  return node;
}

/** Waits until the health watcher is up, the full healthy list is out, and then `quietMs`. */
async function untilIdle(remote: RemoteKubelet, node: SimNode, quietMs: number): Promise<void> {
  await node.plugin.waitForLine(/watching GPU health/);
  await remote.call('waitDevices', { want: { length: node.topology.gpus.length, allHealthy: true }, timeoutMs: 10000 });
  await sleep(quietMs);
}

/** CPU time (user + system) the process has used, in ms (clock ticks of 10 ms). */
function cpuMs(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
  return (Number(f[11]) + Number(f[12])) * 10;
}

interface IdleSample {
  mem: Memory;
  fds: { count: number; by_kind: Record<string, number> };
}
const idleSample = (pid: number): IdleSample => ({ mem: memory(pid), fds: fds(pid) });

export async function nodeTax(opts: { starts?: number } = {}): Promise<{ figures: Figures; goals: Goal[] }> {
  const starts = Math.max(20, opts.starts ?? 20);
  const figures: Partial<Figures> = {};
  const remote = await RemoteKubelet.spawn();
  try {
    // Interleaved, so that load on the machine falls on all three alike.
    log(`Node floor, --version, start → registered (${starts} runs each, interleaved)`);
    const floor = floorRuntime();
    const exe = executable('x64');
    const f = {
      trueMs: [] as number[],
      floorMs: [] as number[],
      floorKiB: [] as number[],
      versionMs: [] as number[],
      versionKiB: [] as number[],
      startMs: [] as number[],
    };
    const idles: IdleSample[] = [];
    for (let i = 0; i < starts; i++) {
      f.trueMs.push(await timeToExit('/bin/true', []));
      f.floorMs.push(await timeToExit(floor.path, ['-e', '0']));
      f.floorKiB.push(peakRssKiB(floor.path, ['-e', '0']));
      f.versionMs.push(await timeToExit(exe, ['--version']));
      f.versionKiB.push(peakRssKiB(exe, ['--version']));
      const { node, registeredAt } = await benchNode(remote);
      f.startMs.push(registeredAt - node.plugin.spawnedAt);
      if (i % 4 === 0) {
        await untilIdle(remote, node, SETTLE_MS);
        idles.push(idleSample(node.plugin.pid));
      }
      await node.stop();
    }
    rmSync(dirname(floor.path), { recursive: true, force: true });
    figures.node_floor = {
      runtime: `the executable's own runtime as plain Node ${floor.version} (SEA fuse unset)`,
      command: 'node -e 0',
      start_ms: stats(f.floorMs),
      peak_rss_mib: { p50: mib(q(f.floorKiB, 0.5)), n: f.floorKiB.length },
      spawn_exit_bin_true_ms: stats(f.trueMs),
    };
    figures.version = {
      command: 'gpu-device-plugin --version',
      ms: stats(f.versionMs),
      peak_rss_mib: { p50: mib(q(f.versionKiB, 0.5)), n: f.versionKiB.length },
    };
    figures.start_to_registered_ms = {
      ...stats(f.startMs),
      worst: r2(Math.max(...f.startMs)),
      over_floor: r2(q(f.startMs, 0.5) / q(f.floorMs, 0.5)),
    };

    log('idle, 10 000 RPCs (5 000 Allocate + 5 000 GetPreferredAllocation timed), 90 000 more, 200 kubelet restarts');
    let node = await idleNode(remote);
    try {
      const uuids = node.topology.gpus.map((g) => g.uuid);
      await sleep(SETTLE_MS);
      const idle = idleSample(node.plugin.pid);
      idles.push(idle);
      const c0 = cpuMs(node.plugin.pid);
      const lat = await remote.call('latency', { n: 5000, uuids });
      const c1 = cpuMs(node.plugin.pid);
      await sleep(1000);
      const after10kAt1s = memory(node.plugin.pid);
      await sleep(SETTLE_MS - 1000);
      const after10k = { ...memory(node.plugin.pid), at_1s: after10kAt1s };
      const c2 = cpuMs(node.plugin.pid);
      const load = await remote.call('load', { n: 90000, uuids, concurrency: 4 });
      const c3 = cpuMs(node.plugin.pid);
      await sleep(1000);
      const after100kAt1s = memory(node.plugin.pid);
      await sleep(SETTLE_MS - 1000);
      const after100k = { ...memory(node.plugin.pid), at_1s: after100kAt1s };
      const restarts = await remote.call('restarts', { n: 200, devices: uuids.length });
      const afterRestarts = memory(node.plugin.pid);
      figures.after_10000_rpcs = { ...after10k, idle_of_this_node: idle.mem };
      figures.after_100000_rpcs = {
        ...after100k,
        load_90000_rpcs: {
          seconds: r2(load.ms / 1000),
          failed: load.failed,
          in_flight: 4,
          plugin_cpu_us_per_call: r2(((c3 - c2) * 1000) / 90000),
        },
      };
      figures.timed_calls_plugin_cpu_us_per_call = r2(((c1 - c0) * 1000) / 10000);
      figures.after_200_restarts = { ...afterRestarts, fds: fds(node.plugin.pid).count };
      figures.allocate_ms = stats(lat.allocate);
      figures.get_preferred_allocation_ms = stats(lat.preferred);
      figures.kubelet_restart_to_reregistered_ms = {
        ...stats(restarts.reregistered),
        worst: r2(Math.max(...restarts.reregistered)),
      };
    } finally {
      await node.stop();
    }

    log('XID → Unhealthy (200 rounds)');
    const xidArgs = ['--health-recovery', '--health-recovery-quiet-period=0.05', '--health-probe-interval=0.05'];
    node = await idleNode(remote, xidArgs);
    try {
      const xid = await remote.call('xid', { rounds: 200, control: node.control, gpus: node.topology.gpus.length });
      figures.xid_to_unhealthy_ms = { ...stats(xid.unhealthy), args: xidArgs.join(' ') };
    } finally {
      await node.stop();
    }

    log('10 000 hostile requests');
    node = await idleNode(remote);
    try {
      const uuids = node.topology.gpus.map((g) => g.uuid);
      await sleep(SETTLE_MS);
      const idleHere = idleSample(node.plugin.pid);
      idles.push(idleHere);
      const idle = idleHere.mem;
      const before = await remote.call('status', {});
      const c0 = cpuMs(node.plugin.pid);
      const h = await remote.call('hostile', { n: 10000, concurrency: 4, uuids });
      const cpu = node.plugin.exit === undefined ? r2(((cpuMs(node.plugin.pid) - c0) * 1000) / 10000) : NaN;
      await sleep(1000);
      const afterAt1s = node.plugin.exit === undefined ? memory(node.plugin.pid) : undefined;
      await sleep(SETTLE_MS - 1000);
      const alive = node.plugin.exit === undefined;
      const after = alive ? { ...memory(node.plugin.pid), at_1s: afterAt1s ?? null } : undefined;
      const st = await remote.call('status', {});
      let serving: { allocate_ms: Stats } | { error: string };
      try {
        serving = { allocate_ms: stats((await remote.call('latency', { n: 100, uuids })).allocate) };
      } catch (err) {
        serving = { error: (err as Error).message.split('\n')[0] ?? '' };
      }
      const registered =
        alive && st.registrations === before.registrations && st.streamBreaks === 0 && st.devices === uuids.length;
      figures.hostile = {
        n: 10000,
        in_flight: 4,
        seconds: r2(h.ms / 1000),
        plugin_cpu_us_per_request: cpu,
        idle,
        after: after ?? null,
        codes_by_kind: h.codes,
        ms_by_kind: Object.fromEntries(Object.entries(h.latency).map(([k, v]) => [k, stats(v)])),
        plugin_alive: alive,
        plugin_exit: node.plugin.exit ?? null,
        still_registered: registered,
        registrations: st.registrations - before.registrations + 1,
        stream_breaks: st.streamBreaks,
        serving_after: serving,
      };
      if (!alive || !registered || 'error' in serving) {
        const lines = node.plugin.lines.slice(-20).join('\n  ');
        process.stderr.write(
          `\n!!!!!!!!\nbench: THE HOSTILE REQUESTS BROKE THE PLUGIN: alive=${alive} ` +
            `(exit ${JSON.stringify(node.plugin.exit ?? null)}), still registered=${registered}, ` +
            `serving=${JSON.stringify(serving)}\n  ${lines}\n!!!!!!!!\n\n`,
        );
      }
    } finally {
      await node.stop();
    }
    const med = (pick: (s: IdleSample) => number): number => r2(q(idles.map(pick), 0.5));
    figures.idle = {
      rss_mib: med((s) => s.mem.rss_mib),
      anon_mib: med((s) => s.mem.anon_mib),
      file_mib: med((s) => s.mem.file_mib),
      fds: med((s) => s.fds.count),
      n: idles.length,
      fds_by_kind_last: idles.at(-1)?.fds.by_kind ?? {},
    };
  } finally {
    await remote.close();
  }
  const all = figures as Figures;
  return { figures: all, goals: goalsOf(all) };
}

/** The issue's table, figure by figure. */
function goalsOf(F: Figures): Goal[] {
  const {
    node_floor: floor,
    version,
    start_to_registered_ms: start,
    idle,
    after_10000_rpcs: a10,
    after_100000_rpcs: a100,
  } = F;
  const base = a10.idle_of_this_node.rss_mib;
  const {
    allocate_ms: alloc,
    get_preferred_allocation_ms: pref,
    kubelet_restart_to_reregistered_ms: rereg,
    xid_to_unhealthy_ms: xid,
    hostile: h,
  } = F;
  const serving = !('error' in h.serving_after);
  const le = (v: number, max: number): boolean => v <= max;
  const rpcN = 10000;
  const goals: Goal[] = [
    {
      figure: 'Node floor: node -e 0, start (median)',
      value: floor.start_ms.p50,
      unit: 'ms',
      n: floor.start_ms.n,
      goal: '',
      met: null,
      nvidia: 'Node 26: 25 ms',
      note: `spawn → exit of /bin/true: ${floor.spawn_exit_bin_true_ms.p50} ms`,
    },
    {
      figure: 'Node floor: node -e 0, peak RSS (median)',
      value: floor.peak_rss_mib.p50,
      unit: 'MiB',
      n: floor.peak_rss_mib.n,
      goal: '',
      met: null,
      nvidia: 'Node 26: 41 MiB',
    },
    {
      figure: 'gpu-device-plugin --version (median)',
      value: version.ms.p50,
      unit: 'ms',
      n: version.ms.n,
      goal: '',
      met: null,
      note: `peak RSS ${version.peak_rss_mib.p50} MiB`,
      nvidia: 'ours before: 79 ms',
    },
    {
      figure: 'start → Register received (median)',
      value: start.p50,
      unit: 'ms',
      n: start.n,
      goal: '≤ 60',
      met: le(start.p50, 60),
      nvidia: '44 ms',
      note: `${start.over_floor}× the floor; p99 ${start.p99}`,
    },
    {
      figure: 'idle RSS total (median)',
      value: idle.rss_mib,
      unit: 'MiB',
      n: idle.n,
      goal: '≤ 60',
      met: le(idle.rss_mib, 60),
      nvidia: '15 MiB',
      note: `file-backed ${idle.file_mib}`,
    },
    {
      figure: 'idle RSS anonymous (median)',
      value: idle.anon_mib,
      unit: 'MiB',
      n: idle.n,
      goal: '≤ 20',
      met: le(idle.anon_mib, 20),
    },
    {
      figure: 'RSS after 10 000 RPCs',
      value: a10.rss_mib,
      unit: 'MiB',
      n: rpcN,
      goal: `≤ idle + 8 = ${r2(base + 8)}`,
      met: le(a10.rss_mib, base + 8),
      nvidia: '19 MiB after 3 200',
      note: `settled; 1 s after: ${a10.at_1s.rss_mib}; that node idle: ${base}`,
    },
    {
      figure: 'RSS after 100 000 RPCs',
      value: a100.rss_mib,
      unit: 'MiB',
      n: 10 * rpcN,
      goal: `≤ idle + 8 = ${r2(base + 8)}`,
      met: le(a100.rss_mib, base + 8),
      note: `settled; 1 s after: ${a100.at_1s.rss_mib}`,
    },
    {
      figure: 'RSS flat 10 000 → 100 000 RPCs (Δ)',
      value: r2(a100.rss_mib - a10.rss_mib),
      unit: 'MiB',
      n: 2,
      goal: '|Δ| ≤ 2',
      met: Math.abs(a100.rss_mib - a10.rss_mib) <= 2,
    },
    {
      figure: 'Allocate p50',
      value: alloc.p50,
      unit: 'ms',
      n: alloc.n,
      goal: '≤ 0.3',
      met: le(alloc.p50, 0.3),
      nvidia: '0.31 ms',
      note: `plugin CPU per call ${F.timed_calls_plugin_cpu_us_per_call} µs (Allocate + preferred, n 10000)`,
    },
    {
      figure: 'Allocate p99',
      value: alloc.p99,
      unit: 'ms',
      n: alloc.n,
      goal: '≤ 0.6',
      met: le(alloc.p99, 0.6),
      nvidia: '0.59 ms',
    },
    {
      figure: 'GetPreferredAllocation p50',
      value: pref.p50,
      unit: 'ms',
      n: pref.n,
      goal: '',
      met: null,
      note: `p99 ${pref.p99}`,
      nvidia: '2.5 s on 16 GPUs',
    },
    {
      figure: 'kubelet socket back → Register received (median)',
      value: rereg.p50,
      unit: 'ms',
      n: rereg.n,
      goal: '≤ 4',
      met: le(rereg.p50, 4),
      nvidia: '4.0 ms',
      note: `p99 ${rereg.p99}`,
    },
    {
      figure: 'XID → Unhealthy in ListAndWatch (median)',
      value: xid.p50,
      unit: 'ms',
      n: xid.n,
      goal: '≤ 0.4',
      met: le(xid.p50, 0.4),
      nvidia: '0.41 ms',
      note: `p99 ${xid.p99}`,
    },
    {
      figure: 'open fds idle (median)',
      value: idle.fds,
      unit: '',
      n: idle.n,
      goal: '≤ 16',
      met: le(idle.fds, 16),
      nvidia: '14',
    },
  ];
  const hostileRss = h.after?.rss_mib ?? NaN;
  goals.push(
    {
      figure: 'RSS after 10 000 hostile requests',
      value: hostileRss,
      unit: 'MiB',
      n: h.n,
      goal: `≤ idle + 16 = ${r2(h.idle.rss_mib + 16)}`,
      met: h.plugin_alive && le(hostileRss, h.idle.rss_mib + 16),
      nvidia: '15 MiB (flat)',
      note: h.plugin_alive
        ? `settled; 1 s after: ${h.after?.at_1s?.rss_mib ?? NaN}; that node idle: ${h.idle.rss_mib}`
        : 'THE PLUGIN DIED',
    },
    {
      figure: 'after hostile requests: alive, registered, serving',
      value: h.plugin_alive && h.still_registered && serving,
      unit: '',
      n: 1,
      goal: 'yes',
      met: h.plugin_alive && h.still_registered && serving,
    },
  );
  return goals;
}

/** The goals as a plain-text table. */
export function goalTable(goals: readonly Goal[]): string {
  const rows = goals.map((g) => [
    g.figure,
    typeof g.value === 'boolean' ? (g.value ? 'yes' : 'NO') : `${g.value}${g.unit ? ` ${g.unit}` : ''}`,
    String(g.n),
    g.goal,
    g.met === null ? '' : g.met ? 'met' : 'NOT MET',
    g.nvidia ?? '',
    g.note ?? '',
  ]);
  const head = ['figure', 'ours', 'n', 'goal', 'met?', 'NVIDIA (Go) / for scale', 'note'];
  const width = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (r: readonly string[]): string =>
    r
      .map((c, i) => c.padEnd(width[i]!))
      .join(' | ')
      .trimEnd();
  const met = goals.filter((g) => g.met === true).length;
  const withGoal = goals.filter((g) => g.met !== null).length;
  return [
    line(head),
    width.map((w) => '-'.repeat(w)).join('-|-'),
    ...rows.map(line),
    '',
    `${met} of ${withGoal} goals met`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { figures, goals } = await nodeTax();
  process.stdout.write(`${JSON.stringify({ ...figures, goals }, null, 2)}\n`);
  process.stderr.write(`\n${goalTable(goals)}\n`);
}
