// The `info` text and JSON: the GPUs (with the pods that hold them), the topology matrix as nvidia-smi
// topo -m shows it with the pair scores, the MIG devices with the resource each goes to, the IMEX channels.
import { dynamicMigView } from './dynamic-mig-view.ts';
import type { DaemonState } from '../core/daemon-state.ts';
import type { Health } from '../core/devices.ts';
import { deviceHolders, holderText } from '../core/holders.ts';
import type { PodDevices } from '../core/holders.ts';
import { imexChannelPath } from '../core/imex.ts';
import type { ImexChoice } from '../core/imex.ts';
import type { MigStrategy } from '../core/mig.ts';
import { daemonJson } from './daemon-view.ts';
import type { DaemonView } from './daemon-view.ts';
import { migResources } from './inspect.ts';
import { gpuSignalsJson } from './signals-view.ts';
import type { SignalsShown } from './signals-view.ts';
import type { NodeReport, PairInfo } from './inspect.ts';
import { table } from './table.ts';

/** What the kubelet's PodResources API said, or why it could not be asked. */
export type PodView = { ok: true; socket: string; pods: PodDevices[] } | { ok: false; socket: string; error: string };

/**
 * Every MIG device's IDs (its MIG UUID, and `<gpu index>:<MIG index>` of the index strategy) with its GPU's
 * position, for the pod view.
 */
function migIds(r: NodeReport): Map<string, number> {
  const ids = new Map<string, number>();
  for (const d of r.mig?.devices ?? []) {
    ids.set(d.uuid, d.parent);
    const g = r.gpus[d.parent];
    if (g !== undefined) ids.set(`${g.index}:${d.index}`, d.parent);
  }
  return ids;
}

/** nvidia-smi topo -m's words for a PCIe relation. */
function pcieLabel(level: number): string {
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
function topoCell(p: PairInfo | null): string {
  if (p === null) return 'X';
  if (p.nvlinks > 0) return `NV${p.nvlinks}`;
  return pcieLabel(p.pcie);
}

/**
 * A GPU's health as `info` shows it: the daemon's (what the kubelet was told) when one runs, else NVML's
 * probe.
 */
function shownHealth(g: { uuid: string; health: Health }, daemon: DaemonState | undefined): string {
  if (daemon === undefined) return g.health;
  return daemon.devices.find((d) => d.uuid === g.uuid)?.health ?? 'not advertised';
}

/** The topology matrix as nvidia-smi topo -m readers expect, and the pair scores. */
function formatTopology(r: NodeReport): string[] {
  const out: string[] = [];
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
  return out;
}

/** The `info` text: GPUs, the topology matrix and pair scores, MIG. */
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
  if (r.gpus.length > 1) out.push(...formatTopology(r));
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
  const dynamic = dynamicMigView(r);
  if (dynamic.length > 0)
    out.push(
      '',
      'Dynamic MIG (DRA with dra.dynamicMig): placements free beside the instances there',
      table([
        ['GPU', 'PROFILES', 'FREE PLACEMENTS', 'GPU INSTANCES'],
        ...dynamic.map((d) => [String(d.gpu), String(d.profiles), String(d.free), String(d.instances)]),
      ]),
    );
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
  signals?: SignalsShown,
): string {
  const mig = migResources(r, strategy);
  const held = pods?.ok === true ? deviceHolders(r.gpus, pods.pods, migIds(r)) : undefined;
  const running = daemon?.read.kind === 'running' ? daemon.read.state : undefined;
  const gpus = r.gpus.map((g) => {
    const s = gpuSignalsJson(signals, g.uuid);
    return {
      ...g,
      health: shownHealth(g, running),
      healthFrom: running === undefined ? 'nvml probe' : 'daemon',
      ...(s === undefined ? {} : { signals: s, signalsFrom: signals?.from === 'daemon' ? 'daemon' : 'probe round' }),
    };
  });
  return `${JSON.stringify(
    {
      ...(daemon?.read.kind === 'unreadable' ? { error: `daemon state: ${daemon.read.error}` } : {}),
      ...(daemon === undefined ? {} : { daemon: daemonJson(daemon) }),
      ...(signals?.from === 'probe' && !signals.round.ok ? { signalsError: signals.round.error } : {}),
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
          : {
              strategy,
              modes: r.mig.modes,
              devices: mig.devices,
              problem: mig.problem,
              notes: mig.notes,
              partitionable: dynamicMigView(r),
            },
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
