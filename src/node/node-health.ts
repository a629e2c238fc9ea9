// The node's health, kept by identity for the live node (live-node.ts owns one): the pure tracker
// (core/health-tracker.ts) over every unit of the snapshot in force — each GPU by its UUID, each MIG device
// by its MIG UUID — started over from the snapshot's own health whenever the units change. It turns
// watcher reports (events and probes, their GPUs named by UUID) into health updates for the live
// node to write into a new snapshot, and logs every transition once. What it cannot place is handed
// back, never dropped silently: an event naming a GPU or a MIG device (GI/CI) the snapshot does not
// hold, and a GPU_IS_LOST probe, which is only believed once a scan still lists the GPU (a GPU that
// left the bus cleanly is gone, not lost; its stale handle answers GPU_IS_LOST too).
import { HealthTracker, freshHealthState } from '../core/health-tracker.ts';
import { UNMANAGED_DEVICE } from '../core/health-events.ts';
import { isCritical } from '../core/health-policy.ts';
import type { EventBatchEntry, ProbeRound, WatchedEvent } from '../core/health-events.ts';
import type { HealthChange, HealthInput, RecoverySettings } from '../core/health-tracker.ts';
import type { HealthSettings } from '../core/health-policy.ts';
import { eventUnits, unitsOfGpu } from '../core/mig-events.ts';
import type { NodeSnapshot, UnitHealth } from '../core/snapshot.ts';
import { gpuOfUnit, hasCriticalSignal } from '../core/snapshot-signals.ts';
import type { Logger } from '../system/log.ts';

/** An event the snapshot in force cannot place, and why. */
export interface UnplacedEvent {
  readonly entry: EventBatchEntry;
  readonly why: string;
}

/** What one report changed: new health by unit (GPU UUID or MIG UUID), and what waits for a scan. */
export interface HealthOutcome {
  readonly updates: ReadonlyMap<string, UnitHealth>;
  readonly unplaced: readonly UnplacedEvent[];
  /** GPUs (UUIDs) a probe says are lost: believed once a scan still lists them (confirmLost). */
  readonly suspectLost: readonly string[];
}

export interface NodeHealthOptions {
  readonly settings: HealthSettings;
  readonly recovery: RecoverySettings;
  readonly log: Logger;
  /** Monotonic milliseconds, for quiet periods (default performance.now). */
  readonly now?: () => number;
  /** Wall-clock milliseconds, for "since when" (default Date.now). */
  readonly wallNow?: () => number;
}

const unitKey = (s: NodeSnapshot): string => [...s.gpuHealth.keys(), '|', ...s.migHealth.keys()].join(' ');

export class NodeHealth {
  private readonly o: NodeHealthOptions;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly wallNow: () => number;
  private tracker: HealthTracker<string>;
  private snapshot: NodeSnapshot | null = null;
  private units = '';
  /** Reason and since of each unit, as the snapshot carries them, kept up to date on transitions. */
  private meta = new Map<string, { reason: string | null; since: number | null }>();
  private unmanagedLogged = false;

  constructor(o: NodeHealthOptions) {
    this.o = o;
    this.log = o.log;
    this.now = o.now ?? (() => performance.now());
    this.wallNow = o.wallNow ?? (() => Date.now());
    this.tracker = new HealthTracker<string>([], o.settings, o.recovery);
  }

  /**
   * Whether a unit's recovery waits for its GPU's health signals: its driver reports a recovery
   * action other than NONE, or a critical signal is bad.
   */
  private recoveryHeld(unit: string): boolean {
    const s = this.snapshot;
    if (s === null || s.signals.size === 0) return false;
    const gpu = gpuOfUnit(s.gpus, s.mig, unit);
    if (gpu === undefined) return false;
    return s.signals.get(gpu)?.states['recovery-action'].bad === true || hasCriticalSignal(s.signals, gpu);
  }

  /** When tick() could next change something (in `now`'s clock), or null. */
  nextDueMs(): number | null {
    return this.tracker.nextDueMs();
  }

  /**
   * The snapshot in force changed. When its units differ from those tracked, the tracker starts over
   * on them, each from the health the snapshot carries (carried over by UUID: core/snapshot.ts).
   */
  follow(s: NodeSnapshot): void {
    this.snapshot = s;
    const key = unitKey(s);
    if (key === this.units) return;
    this.units = key;
    const all = new Map<string, UnitHealth>([...s.gpuHealth, ...s.migHealth]);
    this.tracker = new HealthTracker<string>(
      [...all.keys()],
      this.o.settings,
      this.o.recovery,
      new Map([...all].map(([u, h]) => [u, h.state])),
    );
    this.tracker.holdRecovery((u) => this.recoveryHeld(u));
    this.meta = new Map([...all].map(([u, h]) => [u, { reason: h.reason, since: h.since }]));
  }

  /** Every unit's health as tracked now (single-bit counts included): what a new snapshot starts from. */
  current(): Map<string, UnitHealth> {
    const out = new Map<string, UnitHealth>();
    for (const u of this.tracker.units) out.set(u, this.unitHealth(u));
    return out;
  }

  onEvents(batch: readonly EventBatchEntry[]): HealthOutcome {
    const s = this.snapshot;
    const now = this.now();
    const changes: HealthChange<string>[] = [];
    const unplaced: UnplacedEvent[] = [];
    for (const entry of batch) {
      const { event: ev, count } = entry;
      if (ev.gpu === UNMANAGED_DEVICE) {
        if (!this.unmanagedLogged) {
          this.log.warn('NVML event for a device this plugin does not manage; ignored (further ones are not logged)', {
            kind: ev.kind,
            xid: ev.kind === 'xid' ? ev.xid : undefined,
          });
          this.unmanagedLogged = true;
        }
        continue;
      }
      const targets = this.targets(ev, s);
      if ('unknown' in targets) {
        unplaced.push({ entry, why: targets.unknown });
        continue;
      }
      if (ev.kind === 'ecc-single' && this.log.enabled('debug'))
        this.log.debug('single-bit ECC error', ev.gpu === null ? { gpu: 'all' } : this.where(ev.gpu));
      if (ev.kind === 'xid' && this.log.enabled('debug') && !isCritical(this.o.settings, ev.xid)) {
        this.log.debug('XID ignored by the health settings', {
          ...(ev.gpu === null ? { gpu: 'all' } : this.where(ev.gpu)),
          xid: ev.xid,
          count,
        });
      }
      for (const unit of targets.units) {
        const input = { ...ev, gpu: unit } as HealthInput<string>;
        changes.push(...this.tracker.apply(input, now));
        // Repeats change nothing but the single-bit count; apply them only for that.
        if (ev.kind === 'ecc-single') for (let i = 1; i < count; i++) this.tracker.apply(input, now);
      }
    }
    return { updates: this.publish(changes), unplaced, suspectLost: [] };
  }

  /**
   * One probe round. An ok answer speaks for the GPU and its MIG devices; a lost one is only
   * suspected here (see confirmLost); a GPU the snapshot does not hold is the watcher's older list.
   */
  onProbe(round: ProbeRound): HealthOutcome {
    const s = this.snapshot;
    const now = this.now();
    const changes: HealthChange<string>[] = [];
    const suspectLost: string[] = [];
    for (const [uuid, r] of round) {
      if (r === 'error' || s === null || !s.gpuHealth.has(uuid)) continue;
      if (r === 'lost' && this.tracker.stateOf(uuid)?.lost !== true) {
        suspectLost.push(uuid);
        continue;
      }
      for (const unit of unitsOfGpu(s.gpus, s.mig, uuid))
        changes.push(...this.tracker.apply({ kind: 'probe', gpu: unit, result: r }, now));
    }
    return { updates: this.publish(changes), unplaced: [], suspectLost };
  }

  /** A scan after a GPU_IS_LOST answer still lists these GPUs: they are lost (with their MIG devices). */
  confirmLost(uuids: readonly string[]): ReadonlyMap<string, UnitHealth> {
    const s = this.snapshot;
    const now = this.now();
    const changes: HealthChange<string>[] = [];
    for (const uuid of uuids) {
      if (s === null || !s.gpuHealth.has(uuid)) continue;
      for (const unit of unitsOfGpu(s.gpus, s.mig, uuid))
        changes.push(...this.tracker.apply({ kind: 'probe', gpu: unit, result: 'lost' }, now));
    }
    return this.publish(changes);
  }

  /** Recoveries that fell due. */
  tick(): ReadonlyMap<string, UnitHealth> {
    return this.publish(this.tracker.tick(this.now()));
  }

  /** The units an event concerns in the snapshot in force, or why it concerns none known. */
  private targets(
    ev: WatchedEvent,
    s: NodeSnapshot | null,
  ): { units: readonly (string | null)[] } | { unknown: string } {
    if (ev.gpu === null) return { units: [null] };
    if (s === null || !s.gpuHealth.has(ev.gpu as string))
      return { unknown: `GPU ${String(ev.gpu)} is not in the node's snapshot` };
    const uuid = ev.gpu as string;
    return eventUnits(
      s.gpus,
      s.mig,
      uuid,
      ev.kind === 'xid' ? ev.gi : undefined,
      ev.kind === 'xid' ? ev.ci : undefined,
    );
  }

  /** Log keys of a GPU: `gpu` its index, `uuid` its UUID. */
  private where(uuid: string): { gpu: number | undefined; uuid: string } {
    return { gpu: this.snapshot?.gpus.find((g) => g.uuid === uuid)?.index, uuid };
  }

  private unitHealth(unit: string): UnitHealth {
    const m = this.meta.get(unit);
    return {
      state: this.tracker.stateOf(unit) ?? freshHealthState(),
      reason: m?.reason ?? null,
      since: m?.since ?? null,
    };
  }

  /** Logs each transition once and returns the units' new health. */
  private publish(changes: readonly HealthChange<string>[]): ReadonlyMap<string, UnitHealth> {
    const out = new Map<string, UnitHealth>();
    if (changes.length === 0) return out;
    const s = this.snapshot;
    const since = this.wallNow();
    for (const c of changes) {
      this.meta.set(c.gpu, { reason: c.reason, since });
      out.set(c.gpu, this.unitHealth(c.gpu));
      const m = s?.mig.devices.find((d) => d.uuid === c.gpu);
      if (m !== undefined) {
        const parent = s?.gpus[m.parent];
        const ctx = {
          gpu: parent?.index,
          uuid: parent?.uuid,
          mig: m.uuid,
          profile: m.profile,
          gi: m.gi,
          ci: m.ci,
          xid: c.xid,
          meaning: c.meaning,
          reason: c.reason,
        };
        if (c.health === 'Unhealthy') this.log.warn('MIG device unhealthy', ctx);
        else this.log.info('MIG device healthy again', ctx);
        continue;
      }
      const ctx = { ...this.where(c.gpu), xid: c.xid, meaning: c.meaning, reason: c.reason };
      if (c.health === 'Unhealthy') this.log.warn('GPU unhealthy', ctx);
      else this.log.info('GPU healthy again', ctx);
    }
    return out;
  }
}
