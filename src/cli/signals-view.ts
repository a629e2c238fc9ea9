// The health signals beyond XIDs as `info` and `check` show them: each GPU's signals with status,
// class, value, since when and what to do. From the running daemon's state, or, when none runs, from
// one probe round read by the health thread itself (started with every signal, stopped after its
// first round; NVML's calls stay off the event loop) and evaluated by the daemon's own rules
// (core/health-signals.ts) under the policy the daemon would run with.
import type { GpuSignalsState, SignalStateView } from '../core/daemon-state.ts';
import { parseHealthSettings } from '../core/health-policy.ts';
import {
  DEFAULT_SIGNAL_POLICY,
  evaluateGpuSignals,
  SIGNAL_NAMES,
  signalPolicyWithEnvironment,
  unavailableSignals,
} from '../core/health-signals.ts';
import type { SignalName, SignalPolicy, SignalReading, SignalState } from '../core/health-signals.ts';
import { Nvml } from '../nvml/nvml.ts';
import { EventWatcher } from '../nvml/watcher.ts';
import { createLogger, errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { loadKoffi } from '../system/native.ts';
import { TimerOwner } from '../system/timers.ts';
import { table } from './table.ts';

/** How long one round may take before `info` and `check` give up on it. */
const ROUND_LIMIT_MS = 10_000;
/** How long the thread may stay inside an NVML call when it is asked to stop. */
const STOP_LIMIT_MS = 5_000;
/** The thread probes at once when started; the next round must not come before it is stopped. */
const NO_SECOND_ROUND_MS = 3_600_000;
/** A bound on one blocking event wait, so that the stop is noticed promptly. */
const WAIT_TIMEOUT_MS = 100;

/** One GPU's signals read in a probe round: as evaluated, and which ones its driver lacks. */
export interface ProbedGpuSignals extends GpuSignalsState {
  readonly unavailable: readonly SignalName[];
}

export type SignalRound = { ok: true; gpus: ProbedGpuSignals[] } | { ok: false; error: string };

/**
 * The signal policy the daemon would run with, as far as the environment says: DP_DISABLE_HEALTHCHECKS
 * and DP_ENABLE_HEALTHCHECKS over `base` (the config file's `health` section, or the defaults). An
 * invalid variable leaves `base` (the config line reports it).
 */
export function signalPolicyFor(
  env: Readonly<Record<string, string | undefined>>,
  base: SignalPolicy = DEFAULT_SIGNAL_POLICY,
): SignalPolicy {
  try {
    return signalPolicyWithEnvironment(
      base,
      parseHealthSettings(env.DP_DISABLE_HEALTHCHECKS, env.DP_ENABLE_HEALTHCHECKS),
    );
  } catch {
    return base;
  }
}

/** A signal's state as the daemon's state file and `info` show it. */
export function signalView(s: SignalState, since?: string): SignalStateView {
  return {
    signal: s.signal,
    status: s.status,
    class: s.class,
    value: s.value,
    ...(s.bad ? { action: s.reason } : {}),
    ...(since === undefined ? {} : { since }),
  };
}

/** One GPU's reading evaluated under the policy, as `info` and `check` show it. */
export function probedGpu(gpu: { index: number; uuid: string }, r: SignalReading, p: SignalPolicy): ProbedGpuSignals {
  const states = evaluateGpuSignals(undefined, r, p, gpu.index).states;
  return {
    index: gpu.index,
    uuid: gpu.uuid,
    signals: SIGNAL_NAMES.map((s) => signalView(states[s])),
    unavailable: unavailableSignals(r),
  };
}

/** The readings of one round from a started thread (events may bring some GPUs' first), or why there are none. */
type RoundResult = { readings: Map<string, SignalReading> } | { error: string };

/** Starts the health thread for one round; `done` settles with the round, `watcher` is to be stopped after. */
function startRound(
  nvml: Nvml,
  gpus: readonly { index: number; uuid: string }[],
  limitMs: number,
): { done: Promise<RoundResult>; watcher: EventWatcher } {
  const timers = new TimerOwner();
  const readings = new Map<string, SignalReading>();
  let settle!: (r: RoundResult) => void;
  const done = new Promise<RoundResult>((resolve) => {
    settle = (r) => {
      timers.dispose();
      resolve(r);
    };
  });
  // The thread's failure is logged as an error: it is this round's answer.
  const log: Logger = createLogger({
    level: 'error',
    journal: false,
    write: (line) => settle({ error: line.replace(/^\S+ ERROR /, '').trim() }),
  });
  timers.after('limit', limitMs, () => settle({ error: `no probe round within ${limitMs} ms` }), true);
  const watcher = EventWatcher.start({
    nvml,
    koffi: loadKoffi(),
    log,
    gpus: gpus.map((g) => ({ nvmlIndex: g.index, uuid: g.uuid })),
    probeIntervalMs: NO_SECOND_ROUND_MS,
    waitTimeoutMs: WAIT_TIMEOUT_MS,
    signals: SIGNAL_NAMES,
    onReady: () => {},
    onEvents: () => {},
    onProbe: () => {},
    onDriverGone: (message) => settle({ error: message }),
    onSignals: (r) => {
      for (const [uuid, reading] of r) readings.set(uuid, reading);
      if (gpus.every((g) => readings.has(g.uuid))) settle({ readings });
    },
  });
  return { done, watcher };
}

/**
 * Every signal of each GPU, read once by the health thread and evaluated under `policy`; NVML is opened
 * for the round and shut down after it.
 */
export async function readSignalRound(
  driverRoot: string,
  gpus: readonly { index: number; uuid: string }[],
  policy: SignalPolicy,
  log: Logger,
  limitMs = ROUND_LIMIT_MS,
): Promise<SignalRound> {
  if (gpus.length === 0) return { ok: true, gpus: [] };
  let nvml: Nvml;
  try {
    nvml = Nvml.open({ koffi: loadKoffi(), driverRoot, log });
  } catch (err) {
    return { ok: false, error: errorText(err) };
  }
  try {
    const { done, watcher } = startRound(nvml, gpus, limitMs);
    const round = await done;
    await watcher.stop(STOP_LIMIT_MS);
    if ('error' in round) return { ok: false, error: round.error };
    return {
      ok: true,
      gpus: gpus.flatMap((g) => {
        const r = round.readings.get(g.uuid);
        return r === undefined ? [] : [probedGpu(g, r, policy)];
      }),
    };
  } finally {
    nvml.shutdown();
  }
}

/** Where the signals `info` shows come from. */
export type SignalsShown =
  | { from: 'daemon'; publishedAt: string; gpus: readonly GpuSignalsState[] | undefined }
  | { from: 'probe'; round: SignalRound };

/** The signals of one GPU (by UUID) as `info --json` shows them: a list, or absent when not known. */
export function gpuSignalsJson(shown: SignalsShown | undefined, uuid: string): readonly SignalStateView[] | undefined {
  if (shown === undefined) return undefined;
  if (shown.from === 'daemon') return shown.gpus?.find((g) => g.uuid === uuid)?.signals;
  return shown.round.ok ? shown.round.gpus.find((g) => g.uuid === uuid)?.signals : undefined;
}

function signalRows(gpus: readonly GpuSignalsState[]): string[][] {
  return gpus.flatMap((g) =>
    g.signals.map((s) => [
      String(g.index),
      s.signal,
      s.status,
      s.class,
      s.value === '' ? '-' : s.value,
      s.since ?? '-',
      s.action ?? '-',
    ]),
  );
}

const HEAD = ['GPU', 'SIGNAL', 'STATUS', 'CLASS', 'VALUE', 'SINCE', 'ACTION'];
const DAEMON_HEAD = (publishedAt: string): string =>
  `Health signals beyond XIDs (the daemon's, state of ${publishedAt}; ` +
  'critical: the GPU is Unhealthy while bad, warn: reported only):';
const PROBE_HEAD =
  'Health signals beyond XIDs (one probe round just now, no daemon runs: NVLink is judged against the links ' +
  'up now, PCIe replays need a minute of probes; critical: the daemon would make the GPU Unhealthy while bad):';

/** The health signals part of `info`. */
export function formatSignals(shown: SignalsShown): string {
  if (shown.from === 'daemon') {
    if (shown.gpus === undefined || shown.gpus.length === 0)
      return 'Health signals: the daemon watches none (or this version of it publishes none).\n';
    return `${DAEMON_HEAD(shown.publishedAt)}\n${table([HEAD, ...signalRows(shown.gpus)])}\n`;
  }
  const r = shown.round;
  if (!r.ok) return `Health signals: not read: ${r.error}\n`;
  if (r.gpus.length === 0) return 'Health signals: no GPU to read.\n';
  return `${PROBE_HEAD}\n${table([HEAD, ...signalRows(r.gpus)])}\n`;
}
