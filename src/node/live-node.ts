// The live node: one path for every change. A scan (start, SIGHUP, re-discovery, the driver going or
// coming back), a config reload and a health change each make a new snapshot (core/snapshot.ts);
// the snapshot and its diff go to every consumer (consumer.ts), in order, one change at a time.
// It owns the configuration in force (a reload is a transaction here: refused, nothing changes) and
// the node's health (node-health.ts: the pure tracker keyed by GPU and MIG UUID, and the recovery
// timer). A report it cannot place — an event naming a GPU or MIG device the snapshot does not hold,
// a GPU_IS_LOST answer — is answered with a rescan, and looked at again once that scan is applied.
import type { EventBatchEntry, ProbeRound } from '../core/health-events.ts';
import type { HealthSettings } from '../core/health-policy.ts';
import type { RecoverySettings } from '../core/health-tracker.ts';
import { DEFAULT_SIGNAL_POLICY } from '../core/health-signals.ts';
import type { SignalReading } from '../core/health-signals.ts';
import { buildSnapshot, withClaimedPartitions, withHealth, withSignals } from '../core/snapshot.ts';
import { diff } from '../core/snapshot-diff.ts';
import type { NodeScan, NodeSnapshot, UnitHealth } from '../core/snapshot.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';
import type { NodeConsumer, NodeSettings } from './consumer.ts';
import { describeChange } from './describe.ts';
import { mpsDaemonReport } from './mps-daemon-report.ts';
import { NodeHealth } from './node-health.ts';
import type { UnplacedEvent } from './node-health.ts';
import { logHealthSettings, NodeSignalKeeper, onlyPromptsARead } from './node-signals.ts';

export interface LiveNodeDeps<C extends NodeSettings> {
  readonly log: Logger;
  /** The configuration at start; reconfigure() replaces it. */
  readonly config: C;
  readonly health: HealthSettings;
  /** Recovery on: a GPU that comes back after leaving starts healthy (see core/snapshot.ts). */
  readonly recovery: RecoverySettings;
  /** Given every applied snapshot, in this order. */
  readonly consumers: readonly NodeConsumer<C>[];
  /** The dynamic MIG partitions claims hold at start (DRA mode's checkpoint): the first snapshot has them. */
  readonly claimedPartitions?: ReadonlySet<string>;
  /** Monotonic milliseconds for health quiet periods (default performance.now). */
  readonly now?: () => number;
  /** Wall-clock milliseconds for "since when" (default Date.now). */
  readonly wallNow?: () => number;
}

/** Events held for a rescan, at most (a storm naming unknown devices keeps the newest). */
const MAX_HELD_EVENTS = 256;

const eventKey = (e: UnplacedEvent): string => {
  const ev = e.entry.event;
  return `${ev.kind}|${String(ev.gpu)}|${ev.kind === 'xid' ? `${ev.gi ?? ''}/${ev.ci ?? ''}` : ''}`;
};

export class LiveNode<C extends NodeSettings = NodeSettings> {
  private readonly deps: LiveNodeDeps<C>;
  private readonly log: Logger;
  private readonly health: NodeHealth;
  private readonly signals: NodeSignalKeeper;
  private readonly timers = new TimerOwner();
  private config_: C;
  private current: NodeSnapshot | null = null;
  private queue: Promise<void> = Promise.resolve();
  private applied = 0;
  private stopped = false;
  private rescanFn: ((reason: string) => Promise<void>) | null = null;
  /** Events waiting for the rescan they asked for. */
  private held: UnplacedEvent[] = [];
  /** GPUs a probe says are lost, waiting for the rescan that confirms it. */
  private suspects = new Set<string>();
  private rescanning = false;
  /** Events a rescan could not place either: ignored (debug) until the GPUs or MIG layout change. */
  private unplaceable = new Set<string>();

  constructor(deps: LiveNodeDeps<C>) {
    this.deps = deps;
    this.log = deps.log;
    this.config_ = deps.config;
    this.health = new NodeHealth({
      settings: deps.health,
      recovery: deps.recovery,
      log: deps.log,
      ...(deps.now ? { now: deps.now } : {}),
      ...(deps.wallNow ? { wallNow: deps.wallNow } : {}),
    });
    this.signals = new NodeSignalKeeper(deps.log);
    logHealthSettings(deps.log, deps.health, deps.recovery, deps.config.signalPolicy ?? DEFAULT_SIGNAL_POLICY);
  }

  get snapshot(): NodeSnapshot | null {
    return this.current;
  }

  /** The configuration in force. */
  get config(): C {
    return this.config_;
  }

  /** Snapshots applied so far. */
  get appliedCount(): number {
    return this.applied;
  }

  /** Who looks at the node again when a report names something the snapshot does not hold (the scanner). */
  onRescanWanted(fn: (reason: string) => Promise<void>): void {
    this.rescanFn = fn;
  }

  private enqueue<T>(job: () => Promise<T>): Promise<T> {
    const run = this.queue.then(job);
    this.queue = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /** What a scan read (null: the driver does not answer). The first one throws if a consumer refuses it. */
  scanned(scan: NodeScan | null, reason: string): Promise<void> {
    return this.enqueue(async () => {
      const prev = this.withTrackedHealth();
      const first = prev === null ? this.deps.claimedPartitions : undefined;
      const built = withClaimedPartitions(buildSnapshot(scan, prev, this.deps.recovery.enabled), first);
      const next = withSignals(built, this.signals.afterScan(prev, built));
      await this.apply(prev, next, reason, null);
      // Reports held for a rescan nobody was asked for (no scanner wired): this scan answers them.
      if (this.rescanFn === null && (this.held.length > 0 || this.suspects.size > 0)) await this.afterRescan();
    });
  }

  /** NVML events, their GPUs by UUID (nvml/watcher.ts); XID 154 only prompts a read of the signals. */
  onEvents(batch: readonly EventBatchEntry[]): void {
    const policy = this.config_.signalPolicy ?? DEFAULT_SIGNAL_POLICY;
    this.healthJob(async () => {
      const out = this.health.onEvents(batch.filter((e) => !onlyPromptsARead(e, policy)));
      this.hold(out.unplaced);
      await this.applyHealth(out.updates);
    });
  }

  /**
   * Readings of the health signals (a probe round's, or those an event asked for), by GPU UUID: each
   * is a new snapshot; a GPU whose recovery waited for them may recover.
   */
  onSignals(readings: ReadonlyMap<string, SignalReading>): void {
    this.healthJob(async () => {
      const prev = this.current;
      if (prev === null) return;
      const read = this.signals.read(prev, readings, this.config_.signalPolicy ?? DEFAULT_SIGNAL_POLICY);
      const next = withSignals(prev, read.updates);
      if (next !== prev) await this.apply(prev, next, 'health signals read', null);
      if (read.linksBack) this.askRescan('an NVLink is up again');
      await this.applyHealth(this.health.tick());
    });
  }

  /** One probe round, by GPU UUID. */
  onProbe(round: ProbeRound): void {
    this.healthJob(async () => {
      const out = this.health.onProbe(round);
      const fresh = out.suspectLost.filter((u) => !this.suspects.has(u));
      for (const u of fresh) this.suspects.add(u);
      if (fresh.length > 0) this.askRescan(`GPU ${fresh.join(', ')} answers GPU_IS_LOST: is it still on the bus?`);
      await this.applyHealth(out.updates);
    });
  }

  /** A health report's job, queued; a failure is logged (the report's sender cannot act on it). */
  private healthJob(job: () => Promise<void>): void {
    void this.enqueue(job).catch((err: unknown) =>
      this.log.error('cannot apply a health change', { error: errorText(err) }),
    );
  }

  /**
   * What the MPS daemon watch (mps/health-watch.ts) heard from a resource's control daemon: it
   * answers, or it does not (and why). A change of answering makes a new snapshot (its devices go
   * Unhealthy, or back to their GPU's health) and one log line. null: the watch no longer watches
   * that daemon (the resource is no longer MPS); its state is dropped, so one watched again starts
   * not asked.
   */
  onMpsDaemon(
    resource: string,
    report: { readonly answering: boolean; readonly reason: string | null; readonly units?: readonly string[] } | null,
  ): Promise<void> {
    return this.enqueue(async () => {
      const prev = this.current;
      const r = mpsDaemonReport(prev, resource, report, (this.deps.wallNow ?? Date.now)(), this.log);
      if (r !== null) await this.apply(prev, r.next, r.reason, null);
    });
  }

  /** The MIG partitions claims hold (DRA's checkpoint), a new snapshot if changed; lookAgain: one made or gone. */
  onClaimedPartitions(names: ReadonlySet<string>, lookAgain = false): Promise<void> {
    return this.enqueue(async () => {
      const prev = this.current;
      const next = prev === null ? prev : withClaimedPartitions(prev, names);
      if (next !== prev) await this.apply(prev, next as NodeSnapshot, 'claimed MIG partitions changed', null);
      if (lookAgain) this.askRescan("a claim's MIG partition was made or destroyed");
    });
  }

  /**
   * A config reload, as a transaction: the new configuration is in force while the node's snapshot
   * is applied with it (consumers see it); one that a consumer refuses (the device-plugin mode: it
   * cannot be planned against the GPUs now present) is refused and the running one kept. Resources
   * whose device set changed register again.
   */
  reconfigure(config: C, reason: string): Promise<void> {
    return this.enqueue(async () => {
      const prev = this.withTrackedHealth();
      if (prev === null) {
        this.config_ = config;
        return;
      }
      await this.apply(prev, prev, reason, reason, config);
    });
  }

  /** The current snapshot with the health the tracker holds now (single-bit counts move without transitions). */
  private withTrackedHealth(): NodeSnapshot | null {
    const prev = this.current;
    if (prev === null) return null;
    const now = this.health.current();
    const changed = new Map<string, UnitHealth>();
    for (const [u, h] of now) {
      const was = prev.gpuHealth.get(u) ?? prev.migHealth.get(u);
      if (was !== undefined && JSON.stringify(was) !== JSON.stringify(h)) changed.set(u, h);
    }
    return withHealth(prev, changed);
  }

  private async applyHealth(updates: ReadonlyMap<string, UnitHealth>): Promise<void> {
    this.scheduleRecovery();
    const prev = this.current;
    if (prev === null || updates.size === 0) return;
    await this.apply(prev, withHealth(prev, updates), 'health changed', null);
  }

  private scheduleRecovery(): void {
    const due = this.health.nextDueMs();
    if (due === null || this.stopped) {
      this.timers.clear('recovery');
      return;
    }
    const now = this.deps.now ?? (() => performance.now());
    this.timers.after('recovery', Math.max(0, due - now()) + 1, () =>
      this.healthJob(() => this.applyHealth(this.health.tick())),
    );
  }

  /** Events the snapshot cannot place: held for one rescan, unless a rescan already could not place them. */
  private hold(unplaced: readonly UnplacedEvent[]): void {
    const fresh: UnplacedEvent[] = [];
    for (const u of unplaced) {
      if (this.unplaceable.has(eventKey(u))) {
        if (this.log.enabled('debug'))
          this.log.debug('event for a device the node does not have; ignored', {
            kind: u.entry.event.kind,
            gpu: String(u.entry.event.gpu),
            why: u.why,
          });
        continue;
      }
      fresh.push(u);
    }
    if (fresh.length === 0) return;
    this.held.push(...fresh);
    if (this.held.length > MAX_HELD_EVENTS) this.held.splice(0, this.held.length - MAX_HELD_EVENTS);
    const first = fresh[0] as UnplacedEvent;
    const ev = first.entry.event;
    this.log.info(
      'event names a device the node snapshot does not hold; nothing is marked, looking at the node again',
      {
        ...this.where(ev.gpu),
        kind: ev.kind,
        ...(ev.kind === 'xid' ? { xid: ev.xid, gi: ev.gi, ci: ev.ci } : {}),
        why: first.why,
        events: fresh.length,
      },
    );
    this.askRescan('an event names a device the node snapshot does not hold');
  }

  private where(gpu: unknown): { gpu?: number | string; uuid?: string } {
    if (typeof gpu !== 'string') return { gpu: 'all' };
    const g = this.current?.gpus.find((x) => x.uuid === gpu);
    return g === undefined ? { uuid: gpu } : { gpu: g.index, uuid: gpu };
  }

  /** One rescan at a time for held reports; when it has been applied, they are looked at again. */
  private askRescan(reason: string): void {
    if (this.rescanning || this.stopped) return;
    const fn = this.rescanFn;
    if (fn === null) return; // Nobody scans: the next scan looks at them (afterScan).
    this.rescanning = true;
    fn(reason)
      .catch((err: unknown) => this.log.warn('rescan failed', { reason, error: errorText(err) }))
      .finally(() => {
        this.rescanning = false;
        this.healthJob(() => this.afterRescan());
      });
  }

  /** The reports that waited for a rescan, against the snapshot it made. */
  private async afterRescan(): Promise<void> {
    const s = this.current;
    const suspects = [...this.suspects];
    this.suspects.clear();
    const held = this.held;
    this.held = [];
    if (s === null) return;
    if (s.driverVersion !== null) {
      const gone = suspects.filter((u) => !s.gpuHealth.has(u));
      for (const u of gone)
        this.log.info('GPU answered GPU_IS_LOST but has left the node: it is gone, not lost', { uuid: u });
      await this.applyHealth(this.health.confirmLost(suspects));
    }
    if (held.length === 0) return;
    const out = this.health.onEvents(held.map((h) => h.entry));
    for (const u of out.unplaced) {
      const key = eventKey(u);
      if (this.unplaceable.has(key)) continue;
      this.unplaceable.add(key);
      const ev = u.entry.event;
      this.log.info('event still names no device of this node after looking again; ignored', {
        ...this.where(ev.gpu),
        kind: ev.kind,
        ...(ev.kind === 'xid' ? { xid: ev.xid, gi: ev.gi, ci: ev.ci } : {}),
        why: u.why,
      });
    }
    await this.applyHealth(out.updates);
  }

  /**
   * One change, as a transaction: every consumer takes the new snapshot (with the configuration in
   * force, `config`), in order; only then is it the node's snapshot and does health tracking follow
   * it. A consumer that throws fails the change: the consumers that had taken it are given the
   * previous snapshot back, and the node, its health tracking and its configuration stay as they were.
   */
  private async apply(
    prev: NodeSnapshot | null,
    next: NodeSnapshot,
    reason: string,
    reregister: string | null,
    config: C = this.config_,
  ): Promise<void> {
    const change = diff(prev, next);
    describeChange(this.log, prev, next, change, reason);
    const took: NodeConsumer<C>[] = [];
    try {
      for (const c of this.deps.consumers) {
        took.push(c);
        await c.apply({ snapshot: next, change, reason, reregister, settings: config });
      }
    } catch (err) {
      if (this.current !== null) await this.giveBack(took, next, this.current, reason);
      throw err;
    }
    if (change.gpuSetChanged || change.migChanged) this.unplaceable.clear();
    this.current = next;
    this.config_ = config;
    this.health.follow(next);
    this.signals.follow(next);
    this.applied++;
    this.scheduleRecovery();
  }

  /** A change a consumer refused: the consumers that took it get the node's snapshot again. */
  private async giveBack(
    took: readonly NodeConsumer<C>[],
    next: NodeSnapshot,
    prev: NodeSnapshot,
    why: string,
  ): Promise<void> {
    const change = diff(next, prev);
    for (const c of took) {
      try {
        await c.apply({ snapshot: prev, change, reason: `${why} refused`, reregister: null, settings: this.config_ });
      } catch (err) {
        this.log.error('cannot give a consumer the snapshot before a refused change back', {
          consumer: c.name,
          error: errorText(err),
        });
      }
    }
  }

  /** Stops the recovery timer and every consumer. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.timers.dispose();
    await Promise.all(
      this.deps.consumers.map(async (c) => {
        try {
          await c.stop?.();
        } catch (err) {
          this.log.warn('stopping failed', { consumer: c.name, error: errorText(err) });
        }
      }),
    );
  }
}
