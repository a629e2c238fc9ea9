// Turns what the NVML watcher reports into per-GPU health with the pure policy (core/health.ts),
// logs every transition once (UUID, XID, meaning), runs the recovery timer, and hands the new health
// to whoever advertises it. Storms stay cheap: the policy is O(1) per event and only transitions
// reach the device list. When the node's GPUs change, rebase() starts over on the new list from the
// states the snapshot carried over (core/snapshot.ts).
import type { Gpu, Health } from '../core/devices.ts';
import { HealthTracker } from '../core/health.ts';
import type { EventBatchEntry, GpuHealthState, HealthChange, HealthSettings, ProbeResult, RecoverySettings } from '../core/health.ts';
import type { Logger } from '../system/log.ts';

export class HealthMonitor {
  private tracker: HealthTracker;
  private gpus: readonly Gpu[];
  private readonly settings: HealthSettings;
  private readonly recovery: RecoverySettings;
  private readonly log: Logger;
  private readonly onChange: (health: readonly Health[]) => void;
  private readonly now: () => number;
  private timer: NodeJS.Timeout | undefined;
  private unmanagedLogged = false;
  private events = 0;

  constructor(gpus: readonly Gpu[], settings: HealthSettings, recovery: RecoverySettings, log: Logger,
    onChange: (health: readonly Health[]) => void, now: () => number = () => performance.now()) {
    this.gpus = gpus;
    this.settings = settings;
    this.recovery = recovery;
    this.tracker = new HealthTracker(gpus.length, settings, recovery);
    this.log = log;
    this.onChange = onChange;
    this.now = now;
  }

  health(): readonly Health[] {
    return this.tracker.health();
  }

  /** Every GPU's state, by position (plain data for the snapshot). */
  states(): GpuHealthState[] {
    return this.tracker.states();
  }

  /** Starts over on another GPU list, each GPU from the state given (by position). */
  rebase(gpus: readonly Gpu[], states: readonly GpuHealthState[]): void {
    this.gpus = gpus;
    this.tracker = new HealthTracker(gpus.length, this.settings, this.recovery, states);
    this.schedule();
  }

  get eventCount(): number {
    return this.events;
  }

  onEvents(batch: readonly EventBatchEntry[]): void {
    const now = this.now();
    const changes: HealthChange[] = [];
    for (const { event: ev, count } of batch) {
      this.events += count;
      if (ev.gpu === -1) {
        if (!this.unmanagedLogged) {
          this.log.warn('NVML event for a device this plugin does not manage; ignored (further ones are not logged)', { kind: ev.kind, xid: ev.kind === 'xid' ? ev.xid : undefined });
          this.unmanagedLogged = true;
        }
        continue;
      }
      if (ev.kind === 'ecc-single' && this.log.enabled('debug')) this.log.debug('single-bit ECC error', { gpu: ev.gpu === null ? 'all' : this.gpus[ev.gpu]?.uuid });
      changes.push(...this.tracker.apply(ev, now));
      // Repeats change nothing but the single-bit count; apply them only for that.
      if (ev.kind === 'ecc-single') for (let i = 1; i < count; i++) this.tracker.apply(ev, now);
    }
    this.publish(changes);
  }

  onProbe(results: readonly ProbeResult[]): void {
    const now = this.now();
    const changes: HealthChange[] = [];
    results.forEach((r, gpu) => {
      if (r !== 'error') changes.push(...this.tracker.apply({ kind: 'probe', gpu, result: r }, now));
    });
    this.publish(changes);
  }

  private publish(changes: readonly HealthChange[]): void {
    for (const c of changes) {
      const g = this.gpus[c.gpu];
      const ctx = { gpu: g?.index, uuid: g?.uuid, xid: c.xid, meaning: c.meaning, reason: c.reason };
      if (c.health === 'Unhealthy') this.log.warn('GPU unhealthy', ctx);
      else this.log.info('GPU healthy again', ctx);
    }
    if (changes.length > 0) this.onChange(this.tracker.health());
    this.schedule();
  }

  private schedule(): void {
    const due = this.tracker.nextDueMs();
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    if (due === null) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.publish(this.tracker.tick(this.now()));
    }, Math.max(0, due - this.now()) + 1);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
