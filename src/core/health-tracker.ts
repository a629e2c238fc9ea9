// A state machine that turns NVML events and probe answers into per-unit health transitions under
// the health policy (health-policy.ts), with opt-in recovery, and the per-GPU state it keeps.
//
// Pure: no I/O, no timers, no clock. Time comes in as milliseconds from the caller, and the caller
// asks nextDueMs() when to call tick() again.
//
// * Recovery is opt-in. Only a GPU made unhealthy by recoverable XIDs recovers. Never recoverable:
//   a lost GPU, a double-bit ECC event, and the XIDs in NON_RECOVERABLE_XIDS (uncorrectable memory
//   errors, a failed row remap, a GPU off the bus), because those need a GPU reset or a repair.
// * Quiet period, precisely: it starts at the most recent critical XID on the GPU (Q). The GPU
//   recovers at the first apply()/tick() with now >= Q + quietMs, provided an 'ok' probe was applied
//   with time >= Q and no 'lost' probe came after Q. A new critical XID moves Q to its own time and
//   forgets the ok probes before it. A 'lost' probe makes the GPU lost for good.
// * apply() first settles recoveries that fell due by `nowMs` (as a punctual tick() would have),
//   then applies the input; so a critical XID arriving after an overdue recovery reports both
//   transitions, in order. An ok probe arriving after the quiet period recovers the GPU at once.
// * Single-bit ECC errors are counted whatever the settings and never change health.

import type { Health } from './devices.ts';
import { isCritical, NON_RECOVERABLE_XIDS, watchesDoubleBitEcc, watchesLostGpus } from './health-policy.ts';
import type { HealthSettings } from './health-policy.ts';
import { xidMeaning } from './xid-meanings.ts';

/** K: what names a unit the tracker watches (a UUID for the live node; a position in the tests). */
export type HealthInput<K = number> =
  /** gpu null: the event named no device, so it concerns every unit. */
  | { kind: 'xid'; gpu: K | null; xid: number }
  | { kind: 'ecc-double'; gpu: K | null }
  | { kind: 'ecc-single'; gpu: K | null }
  /** A cheap NVML query per GPU on a timer; 'lost' means GPU_IS_LOST (fallen off the bus). */
  | { kind: 'probe'; gpu: K; result: 'ok' | 'lost' };

/** One health transition of one unit. */
export interface HealthChange<K = number> {
  gpu: K;
  health: Health;
  reason: string;
  /** The XID that made the GPU unhealthy (or, on recovery, the last one it recovered from). */
  xid?: number;
  meaning?: string;
}

export interface RecoverySettings {
  /** Off by default elsewhere: NVIDIA's plugin never lets a device recover. */
  enabled: boolean;
  /** How long a GPU must stay free of critical XIDs, answering probes ok, to recover. */
  quietMs: number;
}

/**
 * Everything the tracker knows about one GPU, as plain data: what a node snapshot carries per GPU so
 * that health survives re-discovery (core/snapshot.ts) and a tracker can be rebuilt from it.
 */
export interface GpuHealthState {
  health: Health;
  /** A probe answered GPU_IS_LOST: never recovers. */
  lost: boolean;
  /** Unhealthy for a reason recovery never undoes (double-bit ECC, a non-recoverable XID). */
  permanent: boolean;
  /** Start of the current quiet period: time of the last critical XID. */
  quietStartMs: number;
  /** An ok probe was applied at or after quietStartMs (and no lost probe since). */
  okSinceQuietStart: boolean;
  /** The last critical XID seen, null if none. */
  lastXid: number | null;
  singleBit: number;
}
type GpuState = GpuHealthState;

/** The state of a GPU nothing has happened to. */
export function freshHealthState(): GpuHealthState {
  return {
    health: 'Healthy',
    lost: false,
    permanent: false,
    quietStartMs: 0,
    okSinceQuietStart: false,
    lastXid: null,
    singleBit: 0,
  };
}

/**
 * Per-unit health as a pure state machine. Never throws on input; see the module notes for rules.
 * Units are named by K: `new HealthTracker(3, …)` watches units 0, 1, 2; `new HealthTracker(uuids, …)`
 * watches those UUIDs (what the live node does: a GPU by its UUID, a MIG device by its MIG UUID).
 */
export class HealthTracker<K = number> {
  readonly #settings: HealthSettings;
  readonly #recovery: RecoverySettings;
  readonly #watchDoubleBit: boolean;
  readonly #watchLost: boolean;
  readonly #keys: readonly K[];
  readonly #at: ReadonlyMap<K, number>;
  readonly #gpus: GpuState[];
  #published: readonly Health[];
  #nextDue: number | null = null;
  #held: (unit: K) => boolean = () => false;

  /**
   * `initial`, when given, is each unit's state to start from (by position, or by unit for a map;
   * missing ones start fresh).
   */
  constructor(
    units: number | readonly K[],
    settings: HealthSettings,
    recovery: RecoverySettings,
    initial?: readonly (GpuHealthState | undefined)[] | ReadonlyMap<K, GpuHealthState>,
  ) {
    if (typeof units === 'number' && (!Number.isSafeInteger(units) || units < 0))
      throw new RangeError(`GPU count ${units} is not a non-negative integer`);
    this.#keys =
      typeof units === 'number' ? (Array.from({ length: units }, (_, i) => i) as unknown as K[]) : [...units];
    this.#at = new Map(this.#keys.map((k, i) => [k, i]));
    if (recovery.enabled && !(Number.isFinite(recovery.quietMs) && recovery.quietMs >= 0)) {
      throw new RangeError(`recovery quiet period ${recovery.quietMs} ms is not a non-negative number of milliseconds`);
    }
    this.#settings = settings;
    this.#recovery = { enabled: recovery.enabled, quietMs: recovery.quietMs };
    this.#watchDoubleBit = watchesDoubleBitEcc(settings);
    this.#watchLost = watchesLostGpus(settings);
    this.#gpus = this.#keys.map((k, i): GpuState => {
      const from = initial === undefined ? undefined : 'get' in initial ? initial.get(k) : initial[i];
      return from === undefined ? freshHealthState() : { ...from };
    });
    this.#published = Object.freeze(this.#gpus.map((g) => g.health));
    this.#recomputeNextDue();
  }

  /** A copy of every unit's state, by position (plain data, for a snapshot). */
  states(): GpuHealthState[] {
    return this.#gpus.map((g) => ({ ...g }));
  }

  /** The units watched, in order. */
  get units(): readonly K[] {
    return this.#keys;
  }

  /** A copy of one unit's state; undefined for a unit not watched. */
  stateOf(unit: K): GpuHealthState | undefined {
    const i = this.#at.get(unit);
    const g = i === undefined ? undefined : this.#gpus[i];
    return g === undefined ? undefined : { ...g };
  }

  /** Whether a unit is watched. */
  has(unit: K): boolean {
    return this.#at.has(unit);
  }

  /** Applies one event or probe answer at time nowMs; returns the transitions it caused, in order. */
  apply(input: HealthInput<K>, nowMs: number): HealthChange<K>[] {
    const changes: HealthChange<K>[] = [];
    this.#settle(nowMs, changes);
    switch (input.kind) {
      case 'xid':
        this.#forTargets(input.gpu, (i, g) => this.#xid(i, g, input.xid, input.gpu === null, nowMs, changes));
        break;
      case 'ecc-double':
        this.#forTargets(input.gpu, (i, g) => this.#doubleBit(i, g, input.gpu === null, changes));
        break;
      case 'ecc-single':
        this.#forTargets(input.gpu, (_i, g) => {
          g.singleBit++;
        });
        break;
      case 'probe':
        this.#forTargets(input.gpu, (i, g) => this.#probe(i, g, input.result, nowMs, changes));
        break;
      default:
        // An input of a kind this version does not know: ignored, like an unmanaged device.
        break;
    }
    this.#recomputeNextDue();
    this.#settle(nowMs, changes);
    this.#publish(changes);
    return changes;
  }

  /** Recoveries that fell due by nowMs. */
  tick(nowMs: number): HealthChange<K>[] {
    const changes: HealthChange<K>[] = [];
    this.#recomputeNextDue();
    this.#settle(nowMs, changes);
    this.#publish(changes);
    return changes;
  }

  /** Current health by GPU position; the same array until some GPU's health changes. */
  health(): readonly Health[] {
    return this.#published;
  }

  /** Single-bit ECC errors counted for a unit (0 for one not watched). */
  singleBitCount(gpu: K): number {
    const i = this.#at.get(gpu);
    return i === undefined ? 0 : (this.#gpus[i]?.singleBit ?? 0);
  }

  /** When tick() could next change something, or null when no recovery is pending. */
  nextDueMs(): number | null {
    return this.#nextDue;
  }

  /**
   * Holds recovery back for the units `held` names (their driver still asks for a recovery action,
   * or a critical health signal is bad); asked again at every settle. Call tick() when its answer
   * may have changed.
   */
  holdRecovery(held: (unit: K) => boolean): void {
    this.#held = held;
    this.#recomputeNextDue();
  }

  #forTargets(gpu: K | null, fn: (index: number, state: GpuState) => void): void {
    if (gpu === null) {
      for (const [index, state] of this.#gpus.entries()) fn(index, state);
      return;
    }
    const index = this.#at.get(gpu);
    const state = index === undefined ? undefined : this.#gpus[index];
    if (index !== undefined && state !== undefined) fn(index, state);
  }

  #key(index: number): K {
    return this.#keys[index] as K;
  }

  #xid(index: number, g: GpuState, xid: number, everyGpu: boolean, nowMs: number, changes: HealthChange<K>[]): void {
    if (!isCritical(this.#settings, xid)) return;
    const meaning = xidMeaning(xid);
    g.lastXid = xid;
    g.quietStartMs = nowMs;
    g.okSinceQuietStart = false;
    if (NON_RECOVERABLE_XIDS.has(xid)) g.permanent = true;
    if (g.health === 'Unhealthy') return;
    g.health = 'Unhealthy';
    const scope = everyGpu ? '; the event named no device, so it applies to every GPU' : '';
    changes.push({
      gpu: this.#key(index),
      health: 'Unhealthy',
      reason: `critical XID ${xid} (${meaning})${scope}`,
      xid,
      meaning,
    });
  }

  #doubleBit(index: number, g: GpuState, everyGpu: boolean, changes: HealthChange<K>[]): void {
    if (!this.#watchDoubleBit) return;
    g.permanent = true;
    if (g.health === 'Unhealthy') return;
    g.health = 'Unhealthy';
    const scope = everyGpu ? '; the event named no device, so it applies to every GPU' : '';
    changes.push({
      gpu: this.#key(index),
      health: 'Unhealthy',
      reason: `double-bit ECC error (uncorrectable memory error)${scope}`,
    });
  }

  #probe(index: number, g: GpuState, result: 'ok' | 'lost', nowMs: number, changes: HealthChange<K>[]): void {
    if (result === 'ok') {
      if (nowMs >= g.quietStartMs) g.okSinceQuietStart = true;
      return;
    }
    // Anything but ok: the GPU is lost for good, and any quiet period is broken.
    g.lost = true;
    g.okSinceQuietStart = false;
    if (!this.#watchLost || g.health === 'Unhealthy') return;
    g.health = 'Unhealthy';
    changes.push({
      gpu: this.#key(index),
      health: 'Unhealthy',
      reason: 'GPU is lost: NVML answered GPU_IS_LOST (fallen off the bus)',
    });
  }

  #recoverable(g: GpuState, index: number): boolean {
    return (
      this.#recovery.enabled &&
      g.health === 'Unhealthy' &&
      !g.lost &&
      !g.permanent &&
      g.okSinceQuietStart &&
      !this.#held(this.#key(index))
    );
  }

  #recomputeNextDue(): void {
    if (!this.#recovery.enabled) return;
    let next: number | null = null;
    for (const [index, g] of this.#gpus.entries()) {
      if (!this.#recoverable(g, index)) continue;
      const due = g.quietStartMs + this.#recovery.quietMs;
      if (next === null || due < next) next = due;
    }
    this.#nextDue = next;
  }

  #settle(nowMs: number, changes: HealthChange<K>[]): void {
    if (this.#nextDue === null || nowMs < this.#nextDue) return;
    const quietMs = this.#recovery.quietMs;
    this.#gpus.forEach((g, index) => {
      if (!this.#recoverable(g, index) || nowMs < g.quietStartMs + quietMs) return;
      g.health = 'Healthy';
      g.okSinceQuietStart = false;
      const why = `probes answered ok and no critical XID for ${quietMs} ms`;
      const change: HealthChange<K> = { gpu: this.#key(index), health: 'Healthy', reason: `recovered: ${why}` };
      if (g.lastXid !== null) {
        const meaning = xidMeaning(g.lastXid);
        change.reason = `recovered from XID ${g.lastXid} (${meaning}): ${why}`;
        change.xid = g.lastXid;
        change.meaning = meaning;
      }
      changes.push(change);
    });
    this.#recomputeNextDue();
  }

  #publish(changes: readonly HealthChange<K>[]): void {
    if (changes.length === 0) return;
    if (this.#gpus.every((g, i) => g.health === this.#published[i])) return;
    this.#published = Object.freeze(this.#gpus.map((g) => g.health));
  }
}
