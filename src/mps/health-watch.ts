// The MPS daemon watch: for as long as the plugin runs, each MPS resource's control daemon is asked
// `get_default_active_thread_percentage` through the control client (NVIDIA asks once,
// before serving, and never again). It hears every device-plugin plan (src/plugin/planner.ts): each
// says which MPS resources exist and, through the configuration in force, where their daemons live,
// so a config reload (a resource added or removed, a new root) is followed the same way as the start.
// It reports transitions only — answering ⇄ not answering, with the client's reason, and a resource
// no longer watched (null) — and the live node turns each into a snapshot (no side channel to the
// served resources).
//
// Timing (the defaults): one question in flight per daemon; the next is asked ASK_INTERVAL_MS after
// the previous one settled, and a question not answered within ASK_TIMEOUT_MS counts as "not
// answering" (the client is killed). A daemon that is gone makes the client fail at once (no
// control socket), so it is seen within about ASK_INTERVAL_MS plus one client run; a hung daemon
// within ASK_INTERVAL_MS + ASK_TIMEOUT_MS (3 s). A hung daemon never piles up clients: a question is
// only asked once the last one has settled. One client run a second per resource is a fork and a
// short-lived process, cheap next to what a GPU node runs.
import { mpsPaths } from '../core/mps.ts';
import type { PlannedResource } from '../core/sharing.ts';
import type { NodeSettings } from '../node/consumer.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';
import { findMpsControl, MpsControlError, MPS_CONTROL_PROGRAM, mpsCommand } from './control-client.ts';
import type { MpsDaemonDirs } from './control-client.ts';

/** The question whose answer means "the daemon serves" (NVIDIA's readiness question). */
export const HEALTH_COMMAND = 'get_default_active_thread_percentage';
/** Pause between one question's answer and the next question to the same daemon. */
export const ASK_INTERVAL_MS = 1000;
/** A question not answered within this counts as "not answering". */
export const ASK_TIMEOUT_MS = 2000;

/** Asks one daemon one command; resolves with its answer, rejects with why not (MpsControlError's reason is used). */
export type MpsAsk = (dirs: MpsDaemonDirs, command: string, timeoutMs: number) => Promise<string>;

/** What the watch reports on a transition. */
export interface MpsDaemonReport {
  readonly answering: boolean;
  /** Not answering: why (the client's reason); answering: null. */
  readonly reason: string | null;
}

export interface MpsDaemonWatchOptions<C extends NodeSettings> {
  readonly log: Logger;
  /** The MPS root of a configuration (null: none configured; MPS resources then have no daemon to ask). */
  readonly rootOf: (settings: C) => string | null;
  /**
   * How a daemon is asked (default: the control client found under the driver root, then on PATH: see
   * controlClientAsk).
   */
  readonly ask: MpsAsk;
  /** A daemon started or stopped answering, or (null) is no longer watched (the live node's onMpsDaemon). */
  readonly report: (resource: string, report: MpsDaemonReport | null) => void;
  readonly intervalMs?: number;
  readonly timeoutMs?: number;
}

/**
 * The client as the watch uses it: the program looked for on each question (installed later, it is found), under
 * driverRoot then PATH.
 */
export function controlClientAsk(driverRoot: string, env: NodeJS.ProcessEnv = process.env): MpsAsk {
  return async (dirs, command, timeoutMs) => {
    const found = await findMpsControl(driverRoot, env.PATH);
    if ('looked' in found)
      throw new MpsControlError(
        command,
        dirs.pipeDir,
        `${MPS_CONTROL_PROGRAM} not found (looked at ${found.looked.join(', ')})`,
      );
    return mpsCommand(found.path, dirs, command, { timeoutMs, env });
  };
}

interface Watched {
  readonly resource: string;
  readonly dirs: MpsDaemonDirs;
  /** resource and pipe directory: a new root is a new daemon. */
  readonly key: string;
  /** What was last reported (null: nothing yet). */
  last: boolean | null;
}

/** What the watch hears of each plan: the resources planned and the configuration in force. */
export interface MpsPlan<C> {
  readonly plan: { readonly resources: readonly PlannedResource[] };
  readonly settings: C;
}

/** The daemons a plan's MPS resources have under a root. */
function daemonsOf(
  resources: readonly PlannedResource[],
  root: string | null,
): Map<string, { resource: string; dirs: MpsDaemonDirs }> {
  const out = new Map<string, { resource: string; dirs: MpsDaemonDirs }>();
  if (root === null) return out;
  for (const r of resources) {
    if (r.mps !== true) continue;
    const p = mpsPaths(root, r.name);
    out.set(`${r.name}|${p.pipeDir}`, { resource: r.name, dirs: { pipeDir: p.pipeDir, logDir: p.logDir } });
  }
  return out;
}

export class MpsDaemonWatch<C extends NodeSettings = NodeSettings> {
  readonly name = 'MPS daemon watch';
  private readonly opts: MpsDaemonWatchOptions<C>;
  private readonly timers = new TimerOwner();
  private readonly watched = new Map<string, Watched>();
  private readonly intervalMs: number;
  private readonly timeoutMs: number;
  private stopped = false;
  private asked = 0;

  constructor(opts: MpsDaemonWatchOptions<C>) {
    this.opts = opts;
    this.intervalMs = opts.intervalMs ?? ASK_INTERVAL_MS;
    this.timeoutMs = opts.timeoutMs ?? ASK_TIMEOUT_MS;
  }

  /** Questions asked so far (tests, diagnostics). */
  get askedCount(): number {
    return this.asked;
  }

  /** The daemons watched now: resource and pipe directory. */
  watching(): { resource: string; pipeDir: string }[] {
    return [...this.watched.values()].map((w) => ({ resource: w.resource, pipeDir: w.dirs.pipeDir }));
  }

  /** Every plan: watch the daemons of its MPS resources, stop watching the others. */
  apply(applied: MpsPlan<C>): void {
    this.watchDaemons(daemonsOf(applied.plan.resources, this.opts.rootOf(applied.settings)));
  }

  /**
   * Watch exactly these daemons (by a key that changes when a daemon moves): the device-plugin's per plan,
   * DRA's per prepared MPS claim.
   */
  watchDaemons(wanted: ReadonlyMap<string, { readonly resource: string; readonly dirs: MpsDaemonDirs }>): void {
    if (this.stopped) return;
    const stillMps = new Set([...wanted.values()].map((d) => d.resource));
    for (const [key, w] of [...this.watched]) {
      if (wanted.has(key)) continue;
      this.watched.delete(key);
      this.timers.clear(key);
      this.opts.log.info('MPS control daemon no longer watched', { resource: w.resource, pipe: w.dirs.pipeDir });
      // A resource no longer MPS forgets its daemon's state: MPS again, it starts not asked.
      if (!stillMps.has(w.resource)) this.tell(w.resource, null);
    }
    for (const [key, d] of wanted) {
      if (this.watched.has(key)) continue;
      const w: Watched = { ...d, key, last: null };
      this.watched.set(key, w);
      this.opts.log.info('watching the MPS control daemon', {
        resource: d.resource,
        pipe: d.dirs.pipeDir,
        every_ms: this.intervalMs,
        timeout_ms: this.timeoutMs,
      });
      this.timers.after(key, 0, () => this.ask(w));
    }
  }

  /** One question; the next is scheduled once it settles, so one is in flight per daemon at most. */
  private ask(w: Watched): void {
    if (this.stopped || this.watched.get(w.key) !== w) return;
    this.asked++;
    let settled: Promise<MpsDaemonReport>;
    try {
      settled = this.opts.ask(w.dirs, HEALTH_COMMAND, this.timeoutMs).then(
        (): MpsDaemonReport => ({ answering: true, reason: null }),
        (err: unknown): MpsDaemonReport => ({
          answering: false,
          reason: err instanceof MpsControlError ? err.reason : errorText(err),
        }),
      );
    } catch (err) {
      settled = Promise.resolve({ answering: false, reason: errorText(err) });
    }
    void settled.then((r) => {
      if (this.stopped || this.watched.get(w.key) !== w) return;
      if (w.last !== r.answering) {
        w.last = r.answering;
        this.tell(w.resource, r);
      }
      this.timers.after(w.key, this.intervalMs, () => this.ask(w));
    });
  }

  private tell(resource: string, report: MpsDaemonReport | null): void {
    try {
      this.opts.report(resource, report);
    } catch (err) {
      this.opts.log.error('cannot report an MPS daemon state', { resource, error: errorText(err) });
    }
  }

  stop(): void {
    this.stopped = true;
    this.timers.dispose();
    this.watched.clear();
  }
}
