// Re-discovery: a slow timer that reads only the node's cheap identity (count, UUIDs, MIG modes,
// and with MIG the MIG devices' UUIDs, so a re-layout is seen) and asks for a full scan when it
// differs from the last scan's; and, for a node without GPUs (yet), a scan again with capped
// backoff rather than only at the slow timer.
import { sameIdentity } from '../core/snapshot.ts';
import type { NodeIdentity, NodeScan } from '../core/snapshot.ts';
import { errorText } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';
import type { NodeReader } from './node-reader.ts';
import { MAX_BACKOFF_MS } from './session.ts';

export const FIRST_EMPTY_RETRY_MS = 1000;

export interface RediscoveryOptions {
  intervalMs: number;
  /** The session to read the identity through, or null when there is none (driver down). */
  reader(): NodeReader | null;
  /** Whether a scan is under way or the driver is down: the timer then skips its turn. */
  busy(): boolean;
  /** Asks for a full scan; reopen: shut NVML down and open it again first. */
  rescan(reason: string, reopen: boolean): void;
}

export class Rediscovery {
  private readonly o: RediscoveryOptions;
  private readonly timers = new TimerOwner();
  private intervalMs: number;
  private last: NodeIdentity | null = null;
  private emptyDelayMs = FIRST_EMPTY_RETRY_MS;
  private checks = 0;

  constructor(o: RediscoveryOptions) {
    this.o = o;
    this.intervalMs = o.intervalMs;
  }

  get checkCount(): number {
    return this.checks;
  }

  /** Starts (or restarts) the slow timer; 0 stops it. */
  arm(): void {
    this.timers.clear('identity');
    if (this.intervalMs > 0) this.timers.every('identity', this.intervalMs, () => this.check());
  }

  /** A new interval (a config reload). */
  setInterval(ms: number): void {
    if (ms === this.intervalMs) return;
    this.intervalMs = ms;
    this.arm();
  }

  /** What a full scan saw: the identity to compare with (null: forget it, the driver went). */
  remember(identity: NodeIdentity | null): void {
    this.last = identity;
  }

  /** The identity now, and a scan when it differs (also run when a probe starts failing). */
  check(): void {
    const r = this.o.reader();
    if (this.o.busy() || r === null) return;
    this.checks++;
    let id: NodeIdentity;
    try {
      id = r.identity();
    } catch (err) {
      this.o.rescan(`re-discovery: ${errorText(err)}`, false);
      return;
    }
    if (this.last !== null && sameIdentity(id, this.last)) return;
    this.o.rescan('re-discovery: the GPUs changed', false);
  }

  /** After each scan: a node without GPUs is looked at again, with capped backoff. */
  scanned(scan: NodeScan): void {
    this.timers.clear('empty');
    if (scan.gpus.length > 0) {
      this.emptyDelayMs = FIRST_EMPTY_RETRY_MS;
      return;
    }
    this.timers.after('empty', this.emptyDelayMs, () => this.o.rescan('no GPUs yet', true));
    this.emptyDelayMs = Math.min(this.emptyDelayMs * 2, MAX_BACKOFF_MS);
  }

  stop(): void {
    this.timers.dispose();
  }
}
