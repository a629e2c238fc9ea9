// The running daemon as `info` shows it: its published state (what the kubelet was told of each device
// and resource, MPS, DRA claims), or why it is not believed, and in DRA mode the claims its checkpoint
// holds when it does not run.
import type { ClaimState, DaemonState } from '../core/daemon-state.ts';
import type { StateRead } from '../observe/state-file.ts';
import { table } from './table.ts';

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

/** The daemon part of `info` when no daemon runs: why its state is not used, and the checkpoint's claims. */
function formatNotRunning(d: DaemonView, r: Exclude<StateRead, { kind: 'running' }>): string {
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
  return (
    `Daemon: not running (${why}). HEALTH below is whether NVML answered a probe ` +
    `just now, not what the kubelet was told.\n${claims === '' ? '' : `\n${claims}`}`
  );
}

/** The running daemon's resources and devices as it told the kubelet. */
function formatResources(s: DaemonState): string[] {
  const out = [
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
  ];
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
  return out;
}

/** Each MPS resource's control daemon as the plugin last heard it; none without MPS. */
function formatMps(s: DaemonState): string[] {
  if (s.mps === undefined || s.mps.length === 0) return [];
  return [
    '',
    "MPS (each resource's control daemon as the plugin last heard it, and the default limits it sets per client):",
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
  ];
}

/**
 * The daemon part of `info`: who runs, what the kubelet was told of each device and resource — or that
 * health below is NVML's.
 */
export function formatDaemon(d: DaemonView, configured?: Readonly<Record<string, string>>): string {
  const r = d.read;
  if (r.kind !== 'running') return formatNotRunning(d, r);
  const s = r.state;
  const out = [
    `Daemon: pid ${s.pid}, version ${s.version}, running since ${s.startedAt}; state ` +
      `of ${s.publishedAt} (${r.path}); driver ${s.driverVersion ?? 'not answering'}.`,
    'HEALTH below is what the daemon tells the kubelet.',
    '',
    ...formatResources(s),
    ...formatMps(s),
  ];
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
      `Options in force that differ from what the environment files and ` +
        `config file say now (a reload or restart applies ` +
        `them): ${differ.map(([flag, v]) => `--${flag}=${v} (now ${configured?.[flag]})`).join(', ')}`,
    );
  }
  return `${out.join('\n')}\n`;
}
