// Health beyond XIDs: the states NVML keeps per physical GPU that mean "take this GPU out of service"
// (critical) or "watch it" (warn), each read on every probe round, each clearing when its state
// clears. This file evaluates one GPU's reading into a state per signal; the vocabulary (names,
// default classes, the policy's shape, the reading) is in health-signal-types.ts and the texts
// (values, reasons, taints, log lines) in health-signal-texts.ts, both re-exported here: import
// this file.
//
// Pure: no I/O, no timers, no clock; time comes in with each reading.
//
// Decisions:
// * A signal's class is its policy's (critical | warn), lowered to warn where the state itself is
//   only worth watching: recovery action 5 (RECOVER_IMEX_DOMAIN), 15 or more double-bit retired
//   pages below the retired-page limit.
// * A source the driver lacks (a missing call, NOT_SUPPORTED, a field whose own return is not
//   SUCCESS) makes the signal 'unavailable' on that GPU: never bad. A read that failed otherwise
//   (GPU_IS_LOST, a timeout) keeps the signal's previous state: the lost-GPU probe speaks for it.
// * NVLink: the expected links are those active in the first reading that could read them; a link
//   expected and not active is down. The expectation is kept across readings (and thread restarts)
//   in the GPU's memory, which the caller keeps by UUID.
// * PCIe replays: the counter's growth since the last reading at or before one minute ago (or the
//   first reading, while there is less than a minute of history), scaled to a minute when that
//   reading is older; a counter that went back (a reset) starts the history afresh.
import { signalText, signalTransitions } from './health-signal-texts.ts';
import type { SignalTransition } from './health-signal-texts.ts';
import type {
  GpuSignalMemory,
  GpuSignals,
  PcieWidth,
  RemappedRows,
  RetiredPages,
  SignalClass,
  SignalName,
  SignalPolicy,
  SignalReading,
  SignalSetting,
  SignalState,
  SignalStatus,
  Verdict,
} from './health-signal-types.ts';
import {
  DEFAULT_SIGNAL_SETTINGS,
  HW_CLOCKS_REASONS,
  RECOVERY_ACTIONS,
  RECOVERY_IMEX_DOMAIN,
  RECOVERY_NODE_REBOOT,
  RETIRED_PAGES_DOUBLE_BIT_WARN,
  RETIRED_PAGES_LIMIT,
  SIGNAL_NAMES,
} from './health-signal-types.ts';

export * from './health-signal-types.ts';
export * from './health-signal-texts.ts';

const MINUTE_MS = 60_000;

const OK: Verdict = { bad: false, mild: false, kind: 'ok', clearsItself: true, detail: '' };

function recoveryVerdict(action: number): Verdict {
  if (action === 0) return { ...OK, detail: 'NONE' };
  return { bad: true, mild: action === RECOVERY_IMEX_DOMAIN, kind: String(action), clearsItself: true, detail: '' };
}

function remapVerdict(r: RemappedRows): Verdict {
  const detail = `${r.corrected} corrected, ${r.uncorrected} uncorrected`;
  if (r.failure) return { bad: true, mild: false, kind: 'failed', clearsItself: false, detail };
  if (r.pending) return { bad: true, mild: false, kind: 'pending', clearsItself: true, detail };
  return { ...OK, detail };
}

function retiredVerdict(p: RetiredPages): Verdict {
  const detail = `${p.singleBit} single-bit, ${p.doubleBit} double-bit`;
  if (p.singleBit + p.doubleBit >= RETIRED_PAGES_LIMIT)
    return { bad: true, mild: false, kind: 'limit', clearsItself: false, detail };
  if (p.pending) return { bad: true, mild: false, kind: 'pending', clearsItself: true, detail };
  if (p.doubleBit >= RETIRED_PAGES_DOUBLE_BIT_WARN)
    return { bad: true, mild: true, kind: 'double-bit', clearsItself: false, detail };
  return { ...OK, detail };
}

function nvlinkVerdict(active: readonly number[], expected: readonly number[]): Verdict {
  const down = expected.filter((l) => !active.includes(l));
  if (down.length === 0) return { ...OK, detail: `${expected.length} of ${expected.length} up` };
  return { bad: true, mild: false, kind: 'down', clearsItself: true, detail: down.join(',') };
}

function replayRate(samples: GpuSignalMemory['replays']): number {
  const first = samples[0];
  const last = samples[samples.length - 1];
  if (first === undefined || last === undefined || first === last) return 0;
  const delta = last.count - first.count;
  const elapsed = last.atMs - first.atMs;
  return elapsed > MINUTE_MS ? (delta * MINUTE_MS) / elapsed : delta;
}

/** The samples kept after one more: the newest at or before a minute ago, and all since. */
function keepReplays(before: GpuSignalMemory['replays'], atMs: number, count: number): GpuSignalMemory['replays'] {
  const last = before[before.length - 1];
  const all = last !== undefined && count < last.count ? [] : [...before];
  all.push({ atMs, count });
  let from = 0;
  for (let i = 0; i < all.length; i++) if ((all[i]?.atMs ?? 0) <= atMs - MINUTE_MS) from = i;
  return all.slice(from);
}

/** The verdict on one signal's value, with the memory it leaves. */
function judge(
  signal: SignalName,
  values: SignalReading['values'],
  memory: GpuSignalMemory,
  policy: SignalPolicy,
): Verdict {
  const v = values;
  switch (signal) {
    case 'recovery-action':
      return recoveryVerdict(v['recovery-action'] as number);
    case 'row-remap':
      return remapVerdict(v['row-remap'] as RemappedRows);
    case 'retired-pages':
      return retiredVerdict(v['retired-pages'] as RetiredPages);
    case 'ecc-uncorrectable': {
      const n = v['ecc-uncorrectable'] as number;
      return n > 0
        ? { bad: true, mild: false, kind: 'errors', clearsItself: true, detail: String(n) }
        : { ...OK, detail: '0' };
    }
    case 'nvlink':
      return nvlinkVerdict(v.nvlink as readonly number[], memory.expectedLinks ?? []);
    case 'pcie-width': {
      const w = v['pcie-width'] as PcieWidth;
      const detail = `x${w.current} of x${w.max}`;
      return w.current > 0 && w.current < w.max
        ? { bad: true, mild: false, kind: 'narrow', clearsItself: true, detail }
        : { ...OK, detail };
    }
    case 'pcie-replay': {
      const rate = Math.round(replayRate(memory.replays) * 10) / 10;
      const detail = String(rate);
      return rate > policy.pcieReplaysPerMinute
        ? { bad: true, mild: false, kind: 'rate', clearsItself: true, detail }
        : { ...OK, detail };
    }
    case 'clocks': {
      const bits = (v.clocks as number) & HW_CLOCKS_REASONS;
      return bits !== 0
        ? { bad: true, mild: false, kind: 'slowdown', clearsItself: true, detail: String(bits) }
        : { ...OK, detail: '0' };
    }
  }
}

/** The memory after a reading: the first NVLink expectation, the replay samples. */
function remember(memory: GpuSignalMemory, reading: SignalReading): GpuSignalMemory {
  const links = reading.values.nvlink;
  const replays = reading.values['pcie-replay'];
  return {
    expectedLinks: memory.expectedLinks ?? (typeof links === 'string' ? null : [...links].sort((a, b) => a - b)),
    replays: typeof replays === 'number' ? keepReplays(memory.replays, reading.atMs, replays) : memory.replays,
  };
}

const FRESH_MEMORY: GpuSignalMemory = { expectedLinks: null, replays: [] };

function quiet(signal: SignalName, status: SignalStatus, cls: SignalClass, value = ''): SignalState {
  return { signal, status, bad: false, class: cls, value, reason: '', clearsItself: true };
}

/**
 * Evaluates one reading of one GPU (index: its NVML index, for the operator's commands) against the
 * policy, from its previous evaluation (undefined: first seen). Never throws.
 */
export function evaluateGpuSignals(
  previous: GpuSignals | undefined,
  reading: SignalReading,
  policy: SignalPolicy,
  index: number,
): GpuSignals {
  const memory = remember(previous?.memory ?? FRESH_MEMORY, reading);
  const states = {} as Record<SignalName, SignalState>;
  for (const signal of SIGNAL_NAMES) {
    const setting = policy.signals[signal];
    const cls: SignalClass = setting === 'off' ? DEFAULT_SIGNAL_SETTINGS[signal] : setting;
    const raw = reading.values[signal];
    const before = previous?.states[signal];
    if (setting === 'off') states[signal] = quiet(signal, 'off', cls);
    else if (raw === 'unavailable') states[signal] = quiet(signal, 'unavailable', cls);
    else if (raw === 'failed')
      states[signal] = before !== undefined && before.status !== 'off' ? before : quiet(signal, 'unknown', cls);
    else {
      const verdict = judge(signal, reading.values, memory, policy);
      states[signal] = signalText(signal, verdict, verdict.mild ? 'warn' : cls, index);
    }
  }
  return { states, memory };
}

/** The bad signals of a GPU of one class. */
export function badSignals(g: GpuSignals | undefined, cls?: SignalClass): SignalState[] {
  if (g === undefined) return [];
  return SIGNAL_NAMES.map((s) => g.states[s]).filter((s) => s.bad && (cls === undefined || s.class === cls));
}

/** Whether the driver asks for a node reboot on this GPU (the node label's condition). */
export function needsNodeReboot(g: GpuSignals | undefined): boolean {
  const s = g?.states['recovery-action'];
  return s?.bad === true && s.value === RECOVERY_ACTIONS[RECOVERY_NODE_REBOOT];
}

/** The signals a reading says the driver lacks on that GPU (what `check` and `info` show). */
export function unavailableSignals(reading: SignalReading): SignalName[] {
  return SIGNAL_NAMES.filter((s) => reading.values[s] === 'unavailable');
}

/**
 * The policy after DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS (their signal items, as
 * parseHealthSettings in health-policy.ts reads them): a disabled signal is off; an enabled one is on
 * whatever disables it, at the policy's class (its default class where the policy turns it off).
 */
export function signalPolicyWithEnvironment(
  policy: SignalPolicy,
  env: { readonly disabledSignals: ReadonlySet<SignalName>; readonly enabledSignals: ReadonlySet<SignalName> },
): SignalPolicy {
  const signals = {} as Record<SignalName, SignalSetting>;
  for (const s of SIGNAL_NAMES) {
    const set = policy.signals[s];
    if (env.enabledSignals.has(s)) signals[s] = set === 'off' ? DEFAULT_SIGNAL_SETTINGS[s] : set;
    else signals[s] = env.disabledSignals.has(s) ? 'off' : set;
  }
  return { signals, pcieReplaysPerMinute: policy.pcieReplaysPerMinute };
}

/** Whether the policy watches any signal (the health thread reads none otherwise). */
export function watchesAnySignal(policy: SignalPolicy): boolean {
  return SIGNAL_NAMES.some((s) => policy.signals[s] !== 'off');
}

/**
 * Every GPU's signals by UUID (what the node model keeps, so that the NVLink expectation and the
 * replay history outlive a restart of the health thread). Pure: readings and the policy come in.
 */
export class SignalBook {
  readonly #gpus = new Map<string, GpuSignals>();

  /** Evaluates a GPU's reading; returns what changed (one log line each). */
  apply(gpu: { uuid: string; index: number }, reading: SignalReading, policy: SignalPolicy): SignalTransition[] {
    const before = this.#gpus.get(gpu.uuid);
    const after = evaluateGpuSignals(before, reading, policy, gpu.index);
    this.#gpus.set(gpu.uuid, after);
    return signalTransitions(before, after);
  }

  get(uuid: string): GpuSignals | undefined {
    return this.#gpus.get(uuid);
  }

  /**
   * The GPUs around this one changed (one left or came): its NVLink expectation is learned again from
   * its next reading (a peer that left took its links with it); returns its signals after that.
   */
  relearnLinks(uuid: string): GpuSignals | undefined {
    const g = this.#gpus.get(uuid);
    if (g === undefined) return undefined;
    const before = g.states.nvlink;
    const nvlink = before.status === 'off' ? before : quiet('nvlink', 'unknown', before.class);
    const after = { states: { ...g.states, nvlink }, memory: { ...g.memory, expectedLinks: null } };
    this.#gpus.set(uuid, after);
    return after;
  }

  /** A GPU gone from the node: what was known of it goes too. */
  forget(uuid: string): void {
    this.#gpus.delete(uuid);
  }

  uuids(): string[] {
    return [...this.#gpus.keys()];
  }
}
