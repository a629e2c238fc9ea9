// The GPU health policy, in one place: which XIDs count, what the environment variables mean, and
// a state machine that turns NVML events and probe answers into per-GPU health transitions.
//
// Pure: no I/O, no timers, no clock. Time comes in as milliseconds from the caller, and the caller
// asks nextDueMs() when to call tick() again.
//
// Decisions where NVIDIA's behaviour or the brief left room (see also FACTS.md §5):
//
// * DP_DISABLE_HEALTHCHECKS=all (or any item "xids") turns every health check off, as in NVIDIA's
//   plugin: no XID, no double-bit ECC event and no GPU_IS_LOST probe marks a GPU unhealthy.
//   DP_ENABLE_HEALTHCHECKS wins over it: with disable=all,enable=74 only XID 74 is watched.
//   Double-bit ECC events are the event form of XID 48 and a lost GPU is what XID 79 reports, so
//   with every check off they are watched again exactly when XID 48 (resp. 79) is enabled.
// * When checks are on, double-bit ECC events and lost probes always count; the XID lists
//   (default-ignored XIDs, the disable list) concern XID events only.
// * DP_ENABLE_HEALTHCHECKS=all (or "xids") makes every XID critical, the default-ignored ones and
//   any in the disable list included, and so also turns double-bit ECC and lost checks back on.
// * The health signals' names (health-signals.ts) are items too: disable turns that signal off,
//   enable turns it on at its class whatever else says. "all" names every signal as well as every
//   XID; "xids" only XIDs.
// * Item words are case-insensitive ("ALL" = "all"); XIDs are decimal digits only; empty items are
//   skipped; anything else is refused with an error naming the variable and the item.
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
import { isSignalName, SIGNAL_NAMES } from './health-signal-types.ts';
import type { SignalName } from './health-signal-types.ts';
import { xidMeaning } from './xid-meanings.ts';

/** XIDs caused by applications, not by the GPU, which NVIDIA's plugin ignores by default. */
export const DEFAULT_IGNORED_XIDS: readonly number[] = [13, 31, 43, 45, 68, 109];

/**
 * XIDs after which a GPU never recovers, even with recovery on: 48 double-bit ECC error, 64 row
 * remap / page retirement failure, 79 GPU fallen off the bus, 95 uncontained ECC error, 140
 * unrecovered ECC error.
 */
export const NON_RECOVERABLE_XIDS: ReadonlySet<number> = new Set([48, 64, 79, 95, 140]);

/** The XID NVML also reports a double-bit ECC error as, and the one for a GPU off the bus. */
const DOUBLE_BIT_ECC_XID = 48;
const FALLEN_OFF_THE_BUS_XID = 79;

export interface HealthSettings {
  /** DP_DISABLE_HEALTHCHECKS was "all" or listed "xids": only explicitly enabled XIDs are watched. */
  readonly allDisabled: boolean;
  /** XIDs ignored when checks are on: DEFAULT_IGNORED_XIDS plus the DP_DISABLE_HEALTHCHECKS list. */
  readonly ignoredXids: ReadonlySet<number>;
  /** XIDs listed in DP_ENABLE_HEALTHCHECKS: critical whatever else says. */
  readonly enabledXids: ReadonlySet<number>;
  /** DP_ENABLE_HEALTHCHECKS was "all" or "xids": every XID is critical. */
  readonly allEnabled: boolean;
  /** Health signals (health-signals.ts) DP_DISABLE_HEALTHCHECKS names; "all" names every one. */
  readonly disabledSignals: ReadonlySet<SignalName>;
  /** Health signals DP_ENABLE_HEALTHCHECKS names (watched whatever disables them); "all" names every one. */
  readonly enabledSignals: ReadonlySet<SignalName>;
}

interface ParsedList {
  all: boolean;
  xids: number[];
  /** The item "all": every check, the health signals too. */
  everything: boolean;
  signals: SignalName[];
}

function parseXidList(variable: string, value: string | undefined, expected: string): ParsedList {
  const parsed: ParsedList = { all: false, xids: [], everything: false, signals: [] };
  if (value === undefined) return parsed;
  for (const raw of value.split(',')) {
    const item = raw.trim();
    if (item === '') continue;
    const word = item.toLowerCase();
    if (word === 'all' || word === 'xids') {
      parsed.all = true;
      parsed.everything ||= word === 'all';
      continue;
    }
    if (isSignalName(word)) {
      parsed.signals.push(word);
      continue;
    }
    const xid = Number(item);
    if (!/^[0-9]+$/.test(item) || !Number.isSafeInteger(xid)) {
      throw new Error(`${variable}: ${JSON.stringify(item)} is not an XID; expected ${expected}`);
    }
    parsed.xids.push(xid);
  }
  return parsed;
}

/**
 * Reads DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS (pass the raw values, undefined when
 * unset). Throws an Error naming the variable and the bad item.
 */
export function parseHealthSettings(disable: string | undefined, enable: string | undefined): HealthSettings {
  const off = parseXidList(
    'DP_DISABLE_HEALTHCHECKS',
    disable,
    '"all", "xids", or a comma list of XID numbers like 13,31',
  );
  const on = parseXidList('DP_ENABLE_HEALTHCHECKS', enable, '"all", "xids", or a comma list of XID numbers like 48,79');
  return {
    allDisabled: off.all,
    ignoredXids: new Set([...DEFAULT_IGNORED_XIDS, ...off.xids]),
    enabledXids: new Set(on.xids),
    allEnabled: on.all,
    disabledSignals: new Set(off.everything ? SIGNAL_NAMES : off.signals),
    enabledSignals: new Set(on.everything ? SIGNAL_NAMES : on.signals),
  };
}

/** Whether an XID marks a GPU unhealthy under these settings. */
export function isCritical(settings: HealthSettings, xid: number): boolean {
  if (settings.allEnabled || settings.enabledXids.has(xid)) return true;
  if (settings.allDisabled) return false;
  return !settings.ignoredXids.has(xid);
}

/** Whether a double-bit ECC event marks a GPU unhealthy. */
export function watchesDoubleBitEcc(settings: HealthSettings): boolean {
  return !settings.allDisabled || isCritical(settings, DOUBLE_BIT_ECC_XID);
}

/** Whether a probe answering GPU_IS_LOST marks a GPU unhealthy. */
export function watchesLostGpus(settings: HealthSettings): boolean {
  return !settings.allDisabled || isCritical(settings, FALLEN_OFF_THE_BUS_XID);
}

/** Whether anything at all is watched: false only when every check is off and nothing is enabled. */
export function watchesAnything(settings: HealthSettings): boolean {
  return !settings.allDisabled || settings.allEnabled || settings.enabledXids.size > 0;
}

function xidListText(xids: ReadonlySet<number>): string {
  return [...xids].sort((a, b) => a - b).join(',');
}

/** One line for the start-up log saying what the settings watch. */
export function describeHealthSettings(settings: HealthSettings): string {
  let xids: string;
  if (settings.allEnabled) xids = 'every XID is critical';
  else if (settings.allDisabled) {
    xids =
      settings.enabledXids.size === 0
        ? 'no XID is critical (health checks disabled)'
        : `only XIDs ${xidListText(settings.enabledXids)} are critical`;
  } else {
    const ignored = new Set([...settings.ignoredXids].filter((x) => !settings.enabledXids.has(x)));
    xids = ignored.size === 0 ? 'every XID is critical' : `every XID is critical except ${xidListText(ignored)}`;
  }
  const ecc = watchesDoubleBitEcc(settings) ? 'watched' : 'ignored';
  const lost = watchesLostGpus(settings) ? 'watched' : 'ignored';
  return `${xids}; double-bit ECC ${ecc}; lost GPUs ${lost}`;
}

export { UNKNOWN_XID_MEANING, xidMeaning } from './xid-meanings.ts';

/** K: what names a unit the tracker watches (a UUID for the live node; a position in the tests). */
export type HealthInput<K = number> =
  /** gpu null: the event named no device, so it concerns every unit. */
  | { kind: 'xid'; gpu: K | null; xid: number }
  | { kind: 'ecc-double'; gpu: K | null }
  | { kind: 'ecc-single'; gpu: K | null }
  /** A cheap NVML query per GPU on a timer; 'lost' means GPU_IS_LOST (fallen off the bus). */
  | { kind: 'probe'; gpu: K; result: 'ok' | 'lost' };

/** The `gpu` of an event that names a device this plugin does not manage (NVML's own, or another's). */
export const UNMANAGED_DEVICE = -1;

/**
 * What a GPU watcher reports (the NVML event worker, in practice), as plain data. gpu: the UUID of
 * the GPU the event names (the watcher translates the thread's positions in its own list); null:
 * the event named no device (all GPUs); UNMANAGED_DEVICE: a device not managed.
 */
export type WatchedEvent =
  /** gi/ci: the MIG device the XID names (0xFFFFFFFF: the whole GPU); absent from pre-MIG drivers. */
  | { kind: 'xid'; gpu: string | null | typeof UNMANAGED_DEVICE; xid: number; gi?: number; ci?: number }
  | { kind: 'ecc-double'; gpu: string | null | typeof UNMANAGED_DEVICE }
  | { kind: 'ecc-single'; gpu: string | null | typeof UNMANAGED_DEVICE };

/** Identical events of one batch travel once, with how many there were (a storm is mostly repeats). */
export interface EventBatchEntry {
  event: WatchedEvent;
  count: number;
}

/** A probe's answer for one GPU: 'lost' is GPU_IS_LOST; 'error' any other failure (no verdict). */
export type ProbeResult = 'ok' | 'lost' | 'error';

/** One round of probes: each watched GPU's answer, by its UUID. */
export type ProbeRound = ReadonlyMap<string, ProbeResult>;

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
      const change: HealthChange<K> = {
        gpu: this.#key(index),
        health: 'Healthy',
        reason: `recovered: probes answered ok and no critical XID for ${quietMs} ms`,
      };
      if (g.lastXid !== null) {
        const meaning = xidMeaning(g.lastXid);
        change.reason = `recovered from XID ${g.lastXid} (${meaning}): probes answered ok and no critical XID for ${quietMs} ms`;
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
