// What the subcommands `info` and `check` see of the node: NVML, the GPUs, their links and pair
// scores, and their MIG modes and devices, read once through the same adapters the daemon uses.
import type { ClaimState, DaemonState } from '../core/daemon-state.ts';
import type { Gpu, Health } from '../core/devices.ts';
import type { StateRead } from '../observe/state-file.ts';
import type { NodeFacts } from '../core/snapshot.ts';
import { MigStrategyError, planMigResources } from '../core/mig.ts';
import type { MigDevice, MigLayout, MigStrategy } from '../core/mig.ts';
import { NO_SHARING } from '../core/sharing.ts';
import { imexChannelPath } from '../core/imex.ts';
import type { ImexChoice } from '../core/imex.ts';
import { deviceHolders, holderText } from '../core/holders.ts';
import type { PodDevices } from '../core/holders.ts';
import { buildScoreMatrix } from '../core/topology/index.ts';
import { discoverMig } from '../nvml/mig.ts';
import { getComputeMode } from '../nvml/compute-mode.ts';
import type { ComputeMode } from '../nvml/compute-mode.ts';
import { discoverGpus, readLinks } from '../nvml/discovery.ts';
import { readNodeFacts } from '../nvml/node-facts.ts';
import { NVML } from '../nvml/errors.ts';
import { Nvml } from '../nvml/nvml.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { loadKoffi } from '../system/native.ts';

export interface PairInfo {
  /** NVML PCIe topology level, -1 when unknown. */
  pcie: number;
  nvlinks: number;
  /** Both GPUs reach the same NVSwitch fabric. */
  nvswitch: boolean;
  score: number;
}

export interface NodeReport {
  library: string;
  driverVersion: string;
  gpus: (Gpu & { health: Health })[];
  /** pairs[i][j], by GPU position; the diagonal is null. */
  pairs: (PairInfo | null)[][];
  /** MIG as NVML reports it, or null when this driver has no MIG functions. */
  mig: MigLayout | null;
  /** Each GPU's compute mode (by position), or why NVML could not say; absent: not read (older callers). */
  computeModes?: (ComputeMode | { error: string })[];
  /** Compute capabilities and MIG capability, as the daemon reads them (the MPS client limit needs them); absent when not read. */
  facts?: NodeFacts;
}

/** A MIG device as `info` shows it: with the resource it is advertised under for a strategy. */
export interface MigDeviceView extends MigDevice {
  /** The resource under the strategy, or null when the strategy does not advertise it. */
  resource: string | null;
}

/**
 * Where each MIG device goes under a strategy (by UUID), or the reason the node is not valid for
 * it (single on a non-uniform node).
 */
/** Every MIG device's IDs (its MIG UUID, and `<gpu index>:<MIG index>` of the index strategy) with its GPU's position, for the pod view. */
function migIds(r: NodeReport): Map<string, number> {
  const ids = new Map<string, number>();
  for (const d of r.mig?.devices ?? []) {
    ids.set(d.uuid, d.parent);
    const g = r.gpus[d.parent];
    if (g !== undefined) ids.set(`${g.index}:${d.index}`, d.parent);
  }
  return ids;
}

export function migResources(
  r: NodeReport,
  strategy: MigStrategy,
): { devices: MigDeviceView[]; problem: string | null; notes: string[] } {
  const layout = r.mig;
  if (layout === null) return { devices: [], problem: null, notes: [] };
  const byUuid = new Map<string, string>();
  let problem: string | null = null;
  let notes: string[] = [];
  try {
    const plan = planMigResources(r.gpus, layout, strategy, 'uuid', NO_SHARING);
    notes = plan.notes;
    for (const res of plan.resources) for (const d of res.devices) if (d.mig !== undefined) byUuid.set(d.mig, res.name);
  } catch (err) {
    if (!(err instanceof MigStrategyError)) throw err;
    problem = err.message;
  }
  return { devices: layout.devices.map((d) => ({ ...d, resource: byUuid.get(d.uuid) ?? null })), problem, notes };
}

export type InspectResult = { ok: true; report: NodeReport } | { ok: false; error: string };

/** What the kubelet's PodResources API said, or why it could not be asked. */
export type PodView = { ok: true; socket: string; pods: PodDevices[] } | { ok: false; socket: string; error: string };

export function inspectNode(driverRoot: string, sysfsRoot: string, log: Logger): InspectResult {
  let nvml: Nvml | undefined;
  try {
    nvml = Nvml.open({ koffi: loadKoffi(), driverRoot, log });
    const driverVersion = nvml.driverVersion();
    const found = discoverGpus(nvml, sysfsRoot, log);
    const links = readLinks(nvml, found, log);
    const scores = buildScoreMatrix(links.gpus, (i, j) => links.pcie[i]?.[j] ?? -1);
    const n = found.gpus.length;
    const switchLinks = links.gpus.map((g) => g.links.filter((l) => l.remote === 'switch').length);
    const pairs = Array.from({ length: n }, (_, i) =>
      Array.from({ length: n }, (_, j): PairInfo | null =>
        i === j
          ? null
          : {
              pcie: links.pcie[i]?.[j] ?? -1,
              nvlinks: scores.nvlinks(i, j),
              nvswitch: (switchLinks[i] ?? 0) > 0 && (switchLinks[j] ?? 0) > 0,
              score: scores.score(i, j),
            },
      ),
    );
    const gpus = found.gpus.map((g, i) => {
      const h = found.handles[i];
      const code = h === undefined ? NVML.ERROR_GPU_IS_LOST : nvml!.probe(h);
      return { ...g, health: (code === NVML.SUCCESS ? 'Healthy' : 'Unhealthy') as Health };
    });
    const mig = discoverMig(nvml, found.gpus, found.handles, log);
    // MPS needs EXCLUSIVE_PROCESS on its GPUs (`check`); one cheap call per GPU.
    const computeModes = found.gpus.map((g, i): ComputeMode | { error: string } => {
      const h = found.handles[i];
      if (h === undefined) return { error: 'no NVML handle' };
      try {
        return getComputeMode(nvml!, h, { index: g.index, uuid: g.uuid });
      } catch (err) {
        return { error: errorText(err) };
      }
    });
    const facts = readNodeFacts(nvml, found.gpus, found.handles, log);
    return { ok: true, report: { library: nvml.libraryPath, driverVersion, gpus, pairs, mig, facts, computeModes } };
  } catch (err) {
    return { ok: false, error: errorText(err) };
  } finally {
    nvml?.shutdown();
  }
}

/** nvidia-smi topo -m's words for a PCIe relation. */
export function pcieLabel(level: number): string {
  switch (level) {
    case 0:
      return 'PIX';
    case 10:
      return 'PIX';
    case 20:
      return 'PXB';
    case 30:
      return 'PHB';
    case 40:
      return 'NODE';
    case 50:
      return 'SYS';
    default:
      return '?';
  }
}

/** One cell of the topology matrix: NV<n> where NVLinks join the pair, else the PCIe relation. */
export function topoCell(p: PairInfo | null): string {
  if (p === null) return 'X';
  if (p.nvlinks > 0) return `NV${p.nvlinks}`;
  return pcieLabel(p.pcie);
}

function table(rows: string[][]): string {
  const widths: number[] = [];
  for (const r of rows)
    r.forEach((c, i) => {
      widths[i] = Math.max(widths[i] ?? 0, c.length);
    });
  return rows
    .map((r) =>
      r
        .map((c, i) => c.padEnd(widths[i] ?? 0))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** The `info` text: GPUs, the topology matrix as nvidia-smi topo -m readers expect, and pair scores. */
/** A GPU's health as `info` shows it: the daemon's (what the kubelet was told) when one runs, else NVML's probe. */
function shownHealth(g: { uuid: string; health: Health }, daemon: DaemonState | undefined): string {
  if (daemon === undefined) return g.health;
  return daemon.devices.find((d) => d.uuid === g.uuid)?.health ?? 'not advertised';
}

export function formatInfo(
  r: NodeReport,
  pods?: PodView,
  strategy: MigStrategy = 'mixed',
  daemon?: DaemonState,
): string {
  const out: string[] = [];
  out.push(`NVML ${r.library}, driver ${r.driverVersion}, ${r.gpus.length} GPU${r.gpus.length === 1 ? '' : 's'}`, '');
  const held = pods?.ok === true ? deviceHolders(r.gpus, pods.pods, migIds(r)) : undefined;
  out.push(
    table([
      [
        'GPU',
        'UUID',
        'NAME',
        'MEMORY',
        'BUS ID',
        'NUMA',
        'HEALTH',
        ...(held === undefined ? [] : ['PODS (namespace/pod/container)']),
      ],
      ...r.gpus.map((g, i) => [
        String(g.index),
        g.uuid,
        g.name,
        `${Math.round(g.memoryBytes / 1048576)} MiB`,
        g.busId,
        g.numaNode === null ? '-' : String(g.numaNode),
        shownHealth(g, daemon),
        ...(held === undefined ? [] : [(held.perGpu[i] ?? []).map(holderText).join(', ') || '-']),
      ]),
    ]),
  );
  if (pods !== undefined && !pods.ok)
    out.push('', `Pods: not shown; the kubelet's PodResources API cannot be asked: ${pods.error}`);
  if (held !== undefined && held.others.length > 0) {
    out.push('', 'Devices held that name no GPU found here (MIG devices, or IDs from before a change):');
    out.push(
      table([['DEVICE', 'RESOURCE', 'POD'], ...held.others.map((h) => [h.deviceId, h.resource, holderText(h)])]),
    );
  }
  if (r.gpus.length > 1) {
    const head = ['', ...r.gpus.map((g) => `GPU${g.index}`), 'NUMA'];
    out.push(
      '',
      'Topology (NV# = NVLinks; PIX one PCIe switch, PXB several, PHB host bridge, NODE same CPU, SYS across CPUs):',
    );
    out.push(
      table([
        head,
        ...r.gpus.map((g, i) => [
          `GPU${g.index}`,
          ...(r.pairs[i] ?? []).map(topoCell),
          g.numaNode === null ? '-' : String(g.numaNode),
        ]),
      ]),
    );
    if (r.pairs.some((row) => row.some((p) => p?.nvswitch)))
      out.push('NVSwitch: GPUs joined through the switch fabric count the links each has to it.');
    out.push('', 'Pair scores used by GetPreferredAllocation (PCIe points + 100 per NVLink):');
    out.push(
      table([
        ['', ...r.gpus.map((g) => `GPU${g.index}`)],
        ...r.gpus.map((g, i) => [
          `GPU${g.index}`,
          ...(r.pairs[i] ?? []).map((p) => (p === null ? '-' : String(p.score))),
        ]),
      ]),
    );
  }
  out.push(...formatMig(r, strategy));
  return `${out.join('\n')}\n`;
}

function modeText(m: { current: boolean; pending: boolean } | null | undefined): string {
  if (m === null || m === undefined) return 'not MIG-capable';
  const now = m.current ? 'enabled' : 'disabled';
  return m.current === m.pending ? now : `${now} (${m.pending ? 'enabled' : 'disabled'} after the next GPU reset)`;
}

/** The MIG part of `info`: each GPU's mode, then every MIG device with the resource it goes to. */
function formatMig(r: NodeReport, strategy: MigStrategy): string[] {
  if (r.mig === null) return ['', 'MIG: this driver has no MIG functions; every GPU is advertised whole'];
  if (!r.mig.modes.some((m) => m !== null)) return [];
  const view = migResources(r, strategy);
  const out = ['', `MIG (resources as advertised with --mig-strategy=${strategy}):`];
  out.push(
    table([
      ['GPU', 'MIG MODE', 'MIG DEVICES'],
      ...r.gpus.map((g, i) => [
        String(g.index),
        modeText(r.mig?.modes[i]),
        String(view.devices.filter((d) => d.parent === i).length),
      ]),
    ]),
  );
  if (view.devices.length > 0) {
    out.push(
      '',
      table([
        ['GPU', 'MIG', 'PROFILE', 'UUID', 'GI', 'CI', 'MEMORY', 'RESOURCE'],
        ...view.devices.map((d) => [
          String(r.gpus[d.parent]?.index ?? d.parent),
          String(d.index),
          d.profile,
          d.uuid,
          String(d.gi),
          String(d.ci),
          `${Math.round(d.memoryBytes / 1048576)} MiB`,
          d.resource ?? '-',
        ]),
      ]),
    );
  }
  if (view.problem !== null) out.push(`not valid for --mig-strategy=${strategy}: ${view.problem}`);
  for (const n of view.notes) out.push(`note: ${n}`);
  return out;
}

/** What `info` says of the IMEX channels: configured, passed (present) and skipped (missing). */
export interface ImexReport {
  configured: readonly number[];
  required: boolean;
  choice: ImexChoice;
}

export function formatImex(r: ImexReport): string {
  if (r.configured.length === 0) return 'IMEX channels: none configured (--imex-channel-ids)\n';
  const out = [`IMEX channels: ${r.configured.join(',')} configured${r.required ? ' (required)' : ''}`];
  for (const id of r.choice.channels)
    out.push(`  channel ${id}  ${imexChannelPath(id)}  present: passed to every container`);
  for (const m of r.choice.missing) out.push(`  ${m}: ${r.required ? 'the plugin will not start' : 'skipped'}`);
  return `${out.join('\n')}\n`;
}

export function infoJson(
  r: NodeReport,
  pods?: PodView,
  imex?: ImexReport,
  strategy: MigStrategy = 'mixed',
  daemon?: DaemonView,
): string {
  const mig = migResources(r, strategy);
  const held = pods?.ok === true ? deviceHolders(r.gpus, pods.pods, migIds(r)) : undefined;
  const running = daemon?.read.kind === 'running' ? daemon.read.state : undefined;
  const gpus = r.gpus.map((g) => ({
    ...g,
    health: shownHealth(g, running),
    healthFrom: running === undefined ? 'nvml probe' : 'daemon',
  }));
  return `${JSON.stringify(
    {
      ...(daemon?.read.kind === 'unreadable' ? { error: `daemon state: ${daemon.read.error}` } : {}),
      ...(daemon === undefined ? {} : { daemon: daemonJson(daemon) }),
      library: r.library,
      driverVersion: r.driverVersion,
      gpus: held === undefined ? gpus : gpus.map((g, i) => ({ ...g, heldBy: held.perGpu[i] ?? [] })),
      ...(pods === undefined
        ? {}
        : {
            podResources: pods.ok
              ? { socket: pods.socket, available: true, otherDevices: held?.others ?? [] }
              : { socket: pods.socket, available: false, error: pods.error },
          }),
      topology: r.pairs.map((row) => row.map((p) => (p === null ? null : { ...p, label: topoCell(p) }))),
      mig:
        r.mig === null
          ? null
          : { strategy, modes: r.mig.modes, devices: mig.devices, problem: mig.problem, notes: mig.notes },
      ...(imex === undefined
        ? {}
        : {
            imex: {
              configured: imex.configured,
              required: imex.required,
              channels: imex.choice.channels,
              missing: imex.choice.missing,
            },
          }),
    },
    null,
    2,
  )}\n`;
}

/** DRA claims prepared on this node (from the daemon's state, or its checkpoint when it does not run). */
export function formatClaims(claims: readonly ClaimState[], source: string): string {
  if (claims.length === 0) return `DRA claims ${source}: none.\n`;
  const rows = claims.map((c) => [
    `${c.namespace}/${c.name}`,
    c.uid,
    c.devices.join(','),
    c.since ?? '-',
    c.state === 'PrepareCompleted' ? 'prepared' : 'prepare not finished',
  ]);
  return `DRA claims ${source}:\n${table([['CLAIM', 'UID', 'DEVICES', 'SINCE', 'STATE'], ...rows])}\n`;
}

/** What `info` found of the running daemon. */
export interface DaemonView {
  readonly read: StateRead;
  /** DRA mode with no daemon running: the claims its checkpoint holds (this boot's), or why it cannot be read. */
  readonly checkpoint?:
    | { readonly path: string; readonly claims: readonly ClaimState[] }
    | { readonly path: string; readonly error: string };
}

/** The daemon part of `info --json`: its state when it runs, else why its state is not used. */
export function daemonJson(d: DaemonView): Record<string, unknown> {
  const r = d.read;
  const cp = d.checkpoint === undefined ? {} : { checkpoint: d.checkpoint };
  switch (r.kind) {
    case 'running':
      return { running: true, stateFile: r.path, ...r.state };
    case 'stale':
      return {
        running: false,
        stateFile: r.path,
        note: `the state file is stale: process ${r.pid} that wrote it is not running`,
        ...cp,
      };
    case 'absent':
      return {
        running: false,
        stateFile: r.path,
        note: 'no state file: the daemon does not run (or cannot write it)',
        ...cp,
      };
    case 'unreadable':
      return { running: false, stateFile: r.path, error: r.error, ...cp };
  }
}

/** The daemon part of `info`: who runs, what the kubelet was told of each device and resource — or that health below is NVML's. */
export function formatDaemon(d: DaemonView, configured?: Readonly<Record<string, string>>): string {
  const r = d.read;
  if (r.kind !== 'running') {
    const why =
      r.kind === 'stale'
        ? `its state file ${r.path} is stale (process ${r.pid} is not running)`
        : r.kind === 'absent'
          ? `no state file at ${r.path}`
          : `its state file cannot be read: ${r.error}`;
    const cp = d.checkpoint;
    const claims =
      cp === undefined
        ? ''
        : 'error' in cp
          ? `DRA claims: the checkpoint ${cp.path} cannot be read: ${cp.error}\n`
          : formatClaims(cp.claims, `in the checkpoint ${cp.path} (prepared before the daemon stopped)`);
    return `Daemon: not running (${why}). HEALTH below is whether NVML answered a probe just now, not what the kubelet was told.\n${claims === '' ? '' : `\n${claims}`}`;
  }
  const s = r.state;
  const out = [
    `Daemon: pid ${s.pid}, version ${s.version}, running since ${s.startedAt}; state of ${s.publishedAt} (${r.path}); driver ${s.driverVersion ?? 'not answering'}.`,
    'HEALTH below is what the daemon tells the kubelet.',
    '',
  ];
  out.push(
    table([
      ['RESOURCE', 'REGISTERED', 'SINCE', 'DEVICES', 'HEALTHY'],
      ...s.resources.map((x) => [
        x.name,
        x.registered ? 'yes' : 'no',
        x.since ?? '-',
        String(x.devices),
        String(x.healthy),
      ]),
    ]),
  );
  if (s.devices.length > 0) {
    out.push(
      '',
      table([
        ['DEVICE', 'UUID', 'HEALTH', 'SINCE', 'REASON'],
        ...s.devices.map((x) => [
          x.kind === 'gpu' ? `GPU ${x.index}` : `MIG ${x.index}`,
          x.uuid,
          x.health,
          x.since ?? '-',
          x.reason ?? '-',
        ]),
      ]),
    );
  }
  if (s.mps !== undefined && s.mps.length > 0) {
    out.push(
      '',
      "MPS (each resource's control daemon as the plugin last heard it, and the default limits it sets per client):",
    );
    out.push(
      table([
        ['RESOURCE', 'DAEMON', 'SINCE', 'REPLICAS', 'ACTIVE THREADS', 'PINNED MEMORY PER GPU'],
        ...s.mps.map((m) => [
          m.resource,
          m.answering ? 'answering' : `not answering: ${m.reason ?? 'no answer'}`,
          m.since ?? '-',
          String(m.replicas),
          `${m.activeThreadPercentage}%`,
          m.gpus.map((g) => `GPU ${g.index}: ${g.pinnedMemLimitMiB} MiB`).join(', '),
        ]),
      ]),
    );
  }
  if (s.claims !== undefined) out.push('', formatClaims(s.claims, 'prepared by the daemon').trimEnd());
  if (s.planProblem !== null) out.push('', `config problem: ${s.planProblem}`);
  // Options the daemon runs with that the command line, environment files and config file now set otherwise.
  const differ =
    configured === undefined
      ? []
      : Object.entries(s.options).filter(([flag, v]) => configured[flag] !== undefined && configured[flag] !== v);
  if (differ.length > 0) {
    out.push(
      '',
      `Options in force that differ from what the environment files and config file say now (a reload or restart applies them): ${differ.map(([flag, v]) => `--${flag}=${v} (now ${configured?.[flag]})`).join(', ')}`,
    );
  }
  return `${out.join('\n')}\n`;
}
