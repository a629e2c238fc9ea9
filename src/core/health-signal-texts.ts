// What the health signals (health-signals.ts) say to people and to the API server: each bad state's
// value, its reason with what the operator does, its DRA taint (name and label value), and the
// transitions between two evaluations of a GPU, one log line each. Pure.
import type { GpuSignals, SignalClass, SignalName, SignalState, Verdict } from './health-signal-types.ts';
import {
  HW_POWER_BRAKE_SLOWDOWN,
  HW_SLOWDOWN,
  HW_THERMAL_SLOWDOWN,
  RECOVERY_ACTIONS,
  RETIRED_PAGES_DOUBLE_BIT_WARN,
  RETIRED_PAGES_LIMIT,
  SIGNAL_NAMES,
} from './health-signal-types.ts';

/**
 * The DRA taint's name of each signal, under the driver's domain (nvlink's says what is wrong). Taint
 * values name the state, not a counter, so that a growing count does not rewrite the taint.
 */
export const TAINT_NAMES: Readonly<Record<SignalName, string>> = {
  'recovery-action': 'recovery-action',
  'row-remap': 'row-remap',
  'retired-pages': 'retired-pages',
  'ecc-uncorrectable': 'ecc-uncorrectable',
  nvlink: 'nvlink-down',
  'pcie-width': 'pcie-width',
  'pcie-replay': 'pcie-replay',
  clocks: 'clocks',
};

const LABEL_VALUE = /^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$/;

/** Whether s is a valid label value (what a DRA taint's value must be). */
export function isLabelValue(s: string): boolean {
  return LABEL_VALUE.test(s);
}

/** s made a label value: other characters become '-', at most 63, alphanumeric at both ends. */
export function toLabelValue(s: string): string {
  return s
    .replace(/[^A-Za-z0-9_.-]/g, '-')
    .slice(0, 63)
    .replace(/^[^A-Za-z0-9]+|[^A-Za-z0-9]+$/g, '');
}

/** The name of a recovery action: NVML's, or ACTION_<n> for a value this version does not know. */
export function recoveryActionName(action: number): string {
  return RECOVERY_ACTIONS[action] ?? `ACTION_${action}`;
}

const CLOCK_BITS: readonly [number, string][] = [
  [HW_SLOWDOWN, 'hw-slowdown'],
  [HW_THERMAL_SLOWDOWN, 'hw-thermal-slowdown'],
  [HW_POWER_BRAKE_SLOWDOWN, 'hw-power-brake'],
];

function clockNames(bits: number): string[] {
  return CLOCK_BITS.filter(([bit]) => (bits & bit) !== 0).map(([, name]) => name);
}

const drainReset = (index: number): string =>
  `drain the GPU, then reset it (nvidia-smi -r -i ${index}) or reboot the node`;
const REPAIR = 'the GPU needs a repair (field diagnostics, RMA); drain it and keep it out of service';

interface Text {
  value: string;
  reason: string;
  taint: string;
}

function recoveryText(v: Verdict, index: number): Text {
  const action = Number(v.kind);
  const name = recoveryActionName(action);
  const what: Record<string, string> = {
    GPU_RESET: `the driver asks for a GPU reset: end the GPU's work, then nvidia-smi -r -i ${index}`,
    NODE_REBOOT: 'the driver asks for a node reboot: drain the node, then reboot it',
    DRAIN_P2P: 'the driver asks to stop peer-to-peer work on this GPU: drain it; the driver re-checks by itself',
    DRAIN_AND_RESET: `the driver asks for no new work and a reset: drain the GPU, then nvidia-smi -r -i ${index}`,
    RECOVER_IMEX_DOMAIN: "the driver asks to recover the GPU's IMEX domain: restart the domain's IMEX daemons",
  };
  const reason = what[name] ?? `the driver asks for recovery action ${action}, unknown here: ${drainReset(index)}`;
  return { value: name, reason, taint: name };
}

function remapText(v: Verdict, index: number): Text {
  if (v.kind === 'failed')
    return { value: `failed (${v.detail})`, reason: `a row remap failed: ${REPAIR}`, taint: 'failed' };
  return {
    value: `pending (${v.detail})`,
    reason: `a row remap waits for a GPU reset: ${drainReset(index)}`,
    taint: 'pending',
  };
}

function retiredText(v: Verdict, index: number): Text {
  if (v.kind === 'limit')
    return {
      value: `limit (${v.detail})`,
      reason: `retired pages reached the limit of ${RETIRED_PAGES_LIMIT}: ${REPAIR}`,
      taint: 'limit',
    };
  if (v.kind === 'pending')
    return {
      value: `pending (${v.detail})`,
      reason: `a page retirement waits for a GPU reset: ${drainReset(index)}`,
      taint: 'pending',
    };
  return {
    value: `double-bit (${v.detail})`,
    reason: `${RETIRED_PAGES_DOUBLE_BIT_WARN} or more double-bit retired pages: watch it; plan a repair`,
    taint: 'double-bit',
  };
}

function text(signal: SignalName, v: Verdict, index: number): Text {
  switch (signal) {
    case 'recovery-action':
      return recoveryText(v, index);
    case 'row-remap':
      return remapText(v, index);
    case 'retired-pages':
      return retiredText(v, index);
    case 'ecc-uncorrectable':
      return {
        value: v.detail,
        reason: `${v.detail} uncorrectable ECC errors since the last reset: ${drainReset(index)}`,
        taint: 'volatile',
      };
    case 'nvlink':
      return {
        value: `${v.detail} down`,
        reason: `NVLink ${v.detail} down (active when first seen): ${drainReset(index)}; if it stays down, repair`,
        taint: v.detail.replaceAll(',', '.'),
      };
    case 'pcie-width':
      return {
        value: v.detail,
        reason: `the PCIe link runs at ${v.detail} lanes: check the GPU's slot and riser, reseat it when drained`,
        taint: v.detail.replaceAll(' ', '-'),
      };
    case 'pcie-replay':
      return {
        value: `${v.detail}/min`,
        reason: `${v.detail} PCIe replays a minute: check the slot, riser and cabling; reseat or repair if it persists`,
        taint: 'above-limit',
      };
    case 'clocks': {
      const names = clockNames(Number(v.detail));
      return {
        value: names.join(','),
        reason: `the hardware slows the GPU down (${names.join(', ')}): check its cooling and power supply`,
        taint: names.join('.'),
      };
    }
  }
}

/** The state of one evaluated signal, with its texts (called by evaluateGpuSignals). */
export function signalText(signal: SignalName, v: Verdict, cls: SignalClass, index: number): SignalState {
  if (!v.bad) return { signal, status: 'ok', bad: false, class: cls, value: v.detail, reason: '', clearsItself: true };
  const t = text(signal, v, index);
  const taintValue = toLabelValue(t.taint);
  return {
    signal,
    status: 'bad',
    bad: true,
    class: cls,
    value: t.value,
    reason: v.clearsItself ? t.reason : `${t.reason} (it does not clear by itself)`,
    clearsItself: v.clearsItself,
    taint: { name: TAINT_NAMES[signal], value: taintValue },
  };
}

/** A DRA device taint for a bad signal: NoSchedule for critical ones, None for warnings. */
export interface SignalTaint {
  key: string;
  value: string;
  effect: 'NoSchedule' | 'None';
}

/** The taints of a GPU's bad signals under the driver's domain (e.g. "gpu.nvidia.com"). */
export function signalTaints(g: GpuSignals | undefined, domain: string): SignalTaint[] {
  if (g === undefined) return [];
  const out: SignalTaint[] = [];
  for (const s of SIGNAL_NAMES.map((n) => g.states[n])) {
    if (!s.bad || s.taint === undefined) continue;
    out.push({
      key: `${domain}/${s.taint.name}`,
      value: s.taint.value,
      effect: s.class === 'critical' ? 'NoSchedule' : 'None',
    });
  }
  return out;
}

export type SignalTransitionKind = 'bad' | 'changed' | 'cleared' | 'unavailable';

/** One signal's change between two evaluations of a GPU: one log line. */
export interface SignalTransition {
  signal: SignalName;
  kind: SignalTransitionKind;
  /** The state after the change (for 'cleared': the healthy state). */
  state: SignalState;
  /** The state before ('changed', 'cleared'). */
  before?: SignalState;
}

/**
 * What changed between two evaluations of one GPU (before undefined: first seen): a signal that
 * became bad, changed while bad (its class or its taint: another action, other links; not a counter
 * that moved on), cleared, or was found unavailable (said once). 'off' and 'unknown' states say nothing.
 */
export function signalTransitions(before: GpuSignals | undefined, after: GpuSignals): SignalTransition[] {
  const out: SignalTransition[] = [];
  for (const signal of SIGNAL_NAMES) {
    const b = before?.states[signal];
    const a = after.states[signal];
    if (a.status === 'unavailable' && b?.status !== 'unavailable') out.push({ signal, kind: 'unavailable', state: a });
    else if (a.bad && !b?.bad) out.push({ signal, kind: 'bad', state: a });
    else if (a.bad && b?.bad && (a.taint?.value !== b.taint?.value || a.class !== b.class))
      out.push({ signal, kind: 'changed', state: a, before: b });
    else if (!a.bad && b?.bad) out.push({ signal, kind: 'cleared', state: a, before: b });
  }
  return out;
}

/** A log line for one transition: its level, message and fields (the GPU named by index and UUID). */
export function describeSignalTransition(
  t: SignalTransition,
  gpu: { index: number; uuid: string },
): { level: 'info' | 'warn' | 'error'; message: string; fields: Record<string, string | number | boolean> } {
  const base = { gpu: gpu.index, uuid: gpu.uuid, signal: t.signal };
  switch (t.kind) {
    case 'unavailable':
      return { level: 'info', message: 'GPU health signal not available on this GPU', fields: base };
    case 'cleared':
      return {
        level: 'info',
        message: 'GPU health signal cleared',
        fields: { ...base, value: t.state.value, was: t.before?.value ?? '' },
      };
    default: {
      const fields = {
        ...base,
        class: t.state.class,
        value: t.state.value,
        clears_itself: t.state.clearsItself,
        action: t.state.reason,
      };
      const message = t.kind === 'bad' ? 'GPU health signal bad' : 'GPU health signal changed';
      return { level: t.state.class === 'critical' ? 'error' : 'warn', message, fields };
    }
  }
}
