// The node's health signals beyond XIDs, kept by GPU UUID for the live node (live-node.ts owns one):
// the health thread's readings (nvml/watcher.ts) evaluated against the policy in force
// (core/health-signals.ts SignalBook, which keeps each GPU's NVLink expectation and replay history
// across thread restarts), one log line per transition, and what a new snapshot carries. A reading
// for a GPU the snapshot does not hold is dropped: the thread's list is older than the snapshot.
import { describeHealthSettings, watchesAnything } from '../core/health-policy.ts';
import type { EventBatchEntry } from '../core/health-events.ts';
import type { HealthSettings } from '../core/health-policy.ts';
import type { RecoverySettings } from '../core/health-tracker.ts';
import { describeSignalTransition, SIGNAL_NAMES, SignalBook, watchesAnySignal } from '../core/health-signals.ts';
import type { GpuSignals, SignalPolicy, SignalReading } from '../core/health-signals.ts';
import type { NodeSignals, NodeSnapshot } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';

export class NodeSignalKeeper {
  private readonly log: Logger;
  private readonly book = new SignalBook();

  constructor(log: Logger) {
    this.log = log;
  }

  /**
   * Evaluates readings of GPUs of `s`: each read GPU's signals, by UUID, and whether an NVLink came
   * back up (a link down when the node was last scanned is only in its topology after a new scan).
   */
  read(
    s: NodeSnapshot,
    readings: ReadonlyMap<string, SignalReading>,
    policy: SignalPolicy,
  ): { updates: NodeSignals; linksBack: boolean } {
    const out = new Map<string, GpuSignals>();
    let linksBack = false;
    for (const [uuid, reading] of readings) {
      const gpu = s.gpus.find((g) => g.uuid === uuid);
      if (gpu === undefined) continue;
      for (const t of this.book.apply(gpu, reading, policy)) {
        const line = describeSignalTransition(t, gpu);
        this.log[line.level](line.message, line.fields);
        linksBack ||= t.signal === 'nvlink' && (t.kind === 'cleared' || t.kind === 'changed');
      }
      const g = this.book.get(uuid);
      if (g !== undefined) out.set(uuid, { ...g, reading });
    }
    return { updates: out, linksBack };
  }

  /**
   * A scan's snapshot: when the node's GPUs are others than before (one left or came), every GPU
   * learns its NVLink expectation again (a peer that left took its links with it, one that came
   * brings new ones); returns the signals that changed for it.
   */
  afterScan(prev: NodeSnapshot | null, next: NodeSnapshot): NodeSignals {
    const out = new Map<string, GpuSignals>();
    const ids = (s: NodeSnapshot) => s.gpus.map((g) => g.uuid).join(' ');
    if (prev === null || ids(prev) === ids(next)) return out;
    for (const g of next.gpus) {
      const after = this.book.relearnLinks(g.uuid);
      const reading = next.signals.get(g.uuid)?.reading;
      if (after !== undefined) out.set(g.uuid, reading === undefined ? after : { ...after, reading });
    }
    return out;
  }

  /** The GPUs of the snapshot in force: what is kept of GPUs gone from the node goes. */
  follow(s: NodeSnapshot): void {
    const present = new Set(s.gpus.map((g) => g.uuid));
    for (const uuid of this.book.uuids()) if (!present.has(uuid)) this.book.forget(uuid);
  }
}

/** The XID that says the driver's recovery action changed: a prompt to read it, not a fault of its own. */
const RECOVERY_ACTION_XID = 154;

/** Whether an event only prompts a read of the signals (XID 154 while the recovery action is watched). */
export function onlyPromptsARead(e: EventBatchEntry, policy: SignalPolicy): boolean {
  return e.event.kind === 'xid' && e.event.xid === RECOVERY_ACTION_XID && policy.signals['recovery-action'] !== 'off';
}

/** The start-up log line of what is watched: XIDs, ECC and lost GPUs, the signals, recovery. */
export function logHealthSettings(
  log: Logger,
  health: HealthSettings,
  recovery: RecoverySettings,
  policy: SignalPolicy,
): void {
  log.info('health checks', {
    settings: describeHealthSettings(health),
    signals: SIGNAL_NAMES.map((s) => `${s}=${policy.signals[s]}`).join(','),
    recovery: recovery.enabled ? `${recovery.quietMs / 1000}s` : 'off',
  });
  if (!watchesAnything(health) && !watchesAnySignal(policy))
    log.info('health checks are off (DP_DISABLE_HEALTHCHECKS); GPUs are not watched');
}
