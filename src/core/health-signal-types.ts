// The vocabulary of the health signals (health-signals.ts evaluates them, health-signal-texts.ts
// words them): their names and default classes, the policy's shape, the NVML values they read, one
// GPU's reading as the health thread reports it, and a signal's evaluated state. Pure.

export const SIGNAL_NAMES = [
  'recovery-action',
  'row-remap',
  'retired-pages',
  'ecc-uncorrectable',
  'nvlink',
  'pcie-width',
  'pcie-replay',
  'clocks',
] as const;
export type SignalName = (typeof SIGNAL_NAMES)[number];
export type SignalClass = 'critical' | 'warn';
export type SignalSetting = SignalClass | 'off';

export function isSignalName(s: string): s is SignalName {
  return (SIGNAL_NAMES as readonly string[]).includes(s);
}

export const DEFAULT_SIGNAL_SETTINGS: Readonly<Record<SignalName, SignalClass>> = {
  'recovery-action': 'critical',
  'row-remap': 'critical',
  'retired-pages': 'critical',
  'ecc-uncorrectable': 'critical',
  nvlink: 'critical',
  'pcie-width': 'warn',
  'pcie-replay': 'warn',
  clocks: 'warn',
};
/** DCGM's recommended limit (the most RM recommends). */
export const DEFAULT_PCIE_REPLAYS_PER_MINUTE = 8;
/** DCGM fails a GPU at this many single-bit + double-bit retired pages. */
export const RETIRED_PAGES_LIMIT = 63;
/** DCGM warns at this many double-bit retired pages. */
export const RETIRED_PAGES_DOUBLE_BIT_WARN = 15;

export interface SignalPolicy {
  readonly signals: Readonly<Record<SignalName, SignalSetting>>;
  /** pcie-replay is bad above this many replays a minute. */
  readonly pcieReplaysPerMinute: number;
}

export const DEFAULT_SIGNAL_POLICY: SignalPolicy = {
  signals: DEFAULT_SIGNAL_SETTINGS,
  pcieReplaysPerMinute: DEFAULT_PCIE_REPLAYS_PER_MINUTE,
};

/** nvmlDeviceGpuRecoveryAction_t. */
export const RECOVERY_ACTIONS: readonly string[] = [
  'NONE',
  'GPU_RESET',
  'NODE_REBOOT',
  'DRAIN_P2P',
  'DRAIN_AND_RESET',
  'RECOVER_IMEX_DOMAIN',
];
export const RECOVERY_NODE_REBOOT = 2;
export const RECOVERY_IMEX_DOMAIN = 5;

/** Clocks-event reason bits that mean the hardware slowed the GPU down. */
export const HW_SLOWDOWN = 0x8;
export const HW_THERMAL_SLOWDOWN = 0x40;
export const HW_POWER_BRAKE_SLOWDOWN = 0x80;
export const HW_CLOCKS_REASONS = HW_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN;

/** Why a source has no value in a reading: the driver lacks it, or this read failed. */
export type Unread = 'unavailable' | 'failed';

export interface RemappedRows {
  corrected: number;
  uncorrected: number;
  /** A remap waits for the next GPU reset. */
  pending: boolean;
  /** The remap table is exhausted. */
  failure: boolean;
}
export interface RetiredPages {
  singleBit: number;
  doubleBit: number;
  pending: boolean;
}
export interface PcieWidth {
  current: number;
  max: number;
}

/** What each signal is read from. */
export interface SignalValues {
  'recovery-action': number;
  'row-remap': RemappedRows;
  'retired-pages': RetiredPages;
  /** Volatile uncorrected ECC errors (since the last driver load or GPU reset). */
  'ecc-uncorrectable': number;
  /** The NVLink links that are active now. */
  nvlink: readonly number[];
  'pcie-width': PcieWidth;
  /** The PCIe replay counter. */
  'pcie-replay': number;
  /** Clocks-event reason bits. */
  clocks: number;
}

/** One reading of one GPU (one probe round, or the read an event asked for). */
export interface SignalReading {
  atMs: number;
  values: { readonly [K in SignalName]: SignalValues[K] | Unread };
}

export type SignalStatus = 'ok' | 'bad' | 'unavailable' | 'unknown' | 'off';

/** One signal of one GPU after an evaluation. */
export interface SignalState {
  readonly signal: SignalName;
  /** unknown: never read successfully yet; off: the policy turns it off. */
  readonly status: SignalStatus;
  readonly bad: boolean;
  /** What it is when bad: the policy's class, or warn for states only worth watching. */
  readonly class: SignalClass;
  /** The value as an operator reads it ("GPU_RESET", "pending", "x8 of x16", "0,3 down"). */
  readonly value: string;
  /** When bad: what the state means and what the operator does. */
  readonly reason: string;
  /** When bad: whether it clears by itself (after a reset, a link back up) or needs a repair. */
  readonly clearsItself: boolean;
  /** When bad: the DRA taint's name (under the driver's domain) and value (a label value). */
  readonly taint?: { readonly name: string; readonly value: string };
}

/** What evaluation keeps per GPU between readings (the caller keeps it by UUID). */
export interface GpuSignalMemory {
  /** The links active when NVLink was first read on this GPU; null until then. */
  readonly expectedLinks: readonly number[] | null;
  /** Replay counter samples: the last one at or before a minute ago, and every one since. */
  readonly replays: readonly { readonly atMs: number; readonly count: number }[];
}

export interface GpuSignals {
  readonly states: Readonly<Record<SignalName, SignalState>>;
  readonly memory: GpuSignalMemory;
  /** The reading last evaluated, with its raw values (what the metrics show); absent before the first. */
  readonly reading?: SignalReading;
}

/** What a signal evaluates to, before the policy and texts: bad or not, the inherent class, the details. */
export interface Verdict {
  bad: boolean;
  /** warn: the state is only worth watching whatever the policy says. */
  mild: boolean;
  /** Which state it is, for the texts (e.g. 'pending', 'failed', 'limit', 'double-bit'). */
  kind: string;
  clearsItself: boolean;
  /** The number or list the texts show. */
  detail: string;
}
