// The state the running daemon publishes for `gpu-device-plugin info`: what the kubelet was last told
// of each device (health, why, since when), which resources are registered, the driver, the options
// in force and who the daemon is. `info` shows this instead of probing NVML itself, so it says what
// the kubelet sees. Pure: the input is a small explicit type (not the daemon's snapshot), times come
// in as ISO strings; stateDocument gives the file's text and parseStateDocument reads it back.

export const STATE_FORMAT = 1;

export interface DeviceState {
  readonly kind: 'gpu' | 'mig';
  /** NVML index of a GPU; `<gpu index>:<MIG index>` of a MIG device. */
  readonly index: string;
  readonly uuid: string;
  /** The GPU a MIG device is on. */
  readonly parentUuid?: string;
  /** What the kubelet is told. */
  readonly health: 'Healthy' | 'Unhealthy';
  /** Why it is unhealthy (an XID, lost, the driver not answering). */
  readonly reason?: string;
  /** When it took this health (ISO 8601), as far as this daemon knows. */
  readonly since?: string;
}

export interface ResourceState {
  readonly name: string;
  /** Registered with the kubelet now. */
  readonly registered: boolean;
  /** When `registered` took its value (ISO 8601). */
  readonly since?: string;
  readonly devices: number;
  readonly healthy: number;
}

/** One MPS resource: its control daemon's state as the plugin last heard it, and the limits it sets. */
export interface MpsResourceState {
  readonly resource: string;
  /** The daemon answers (its replicas are served with their GPU's health); false: they are Unhealthy. */
  readonly answering: boolean;
  /** Not answering: why (the control client's reason, or that it was not asked yet). */
  readonly reason?: string;
  /** When it took this state (ISO 8601); absent: never asked yet. */
  readonly since?: string;
  /**
   * Replicas per GPU, the default active-thread percentage (100 / replicas) and pinned memory per GPU (core/mps.ts).
   */
  readonly replicas: number;
  readonly activeThreadPercentage: number;
  readonly gpus: readonly { readonly index: number; readonly uuid: string; readonly pinnedMemLimitMiB: number }[];
}

/** A claim prepared for a container (DRA mode): which, on which devices, since when. */
export interface ClaimState {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  /** PrepareCompleted, or PrepareStarted (a prepare that has not finished, or failed half-way). */
  readonly state: string;
  readonly devices: readonly string[];
  /** When it was prepared (ISO 8601), when known. */
  readonly since?: string;
}

/** One health signal of one GPU as the daemon last evaluated it (core/health-signals.ts's SignalState). */
export interface SignalStateView {
  /** The signal's config name (`recovery-action`, `row-remap`, …). */
  readonly signal: string;
  readonly status: 'ok' | 'bad' | 'unavailable' | 'unknown' | 'off';
  /** What it is when bad. */
  readonly class: 'critical' | 'warn';
  /** The value as an operator reads it. */
  readonly value: string;
  /** What the operator does while it is bad. */
  readonly action?: string;
  /** When it took this status (ISO 8601), as far as this daemon knows. */
  readonly since?: string;
}

/** The health signals beyond XIDs of one GPU. */
export interface GpuSignalsState {
  readonly index: number;
  readonly uuid: string;
  readonly signals: readonly SignalStateView[];
}

export interface DaemonState {
  readonly pid: number;
  readonly version: string;
  readonly startedAt: string;
  /** When this state was published. */
  readonly publishedAt: string;
  /** null: the driver does not answer. */
  readonly driverVersion: string | null;
  readonly devices: readonly DeviceState[];
  readonly resources: readonly ResourceState[];
  /** Why the config does not fit the GPUs now (the previous resources are kept), or null. */
  readonly planProblem: string | null;
  /** The options in force, by flag name, as shown by `check`. */
  readonly options: Readonly<Record<string, string>>;
  /** MPS resources (absent: none). */
  readonly mps?: readonly MpsResourceState[];
  /** The claims prepared on this node (DRA mode only). */
  readonly claims?: readonly ClaimState[];
  /** Each GPU's health signals beyond XIDs (absent: none watched). */
  readonly signals?: readonly GpuSignalsState[];
}

export function stateDocument(s: DaemonState): string {
  return `${JSON.stringify({ format: STATE_FORMAT, ...s }, null, 2)}\n`;
}

const isString = (v: unknown): v is string => typeof v === 'string';

const SIGNAL_STATUSES: readonly string[] = ['ok', 'bad', 'unavailable', 'unknown', 'off'];
const SIGNAL_CLASSES: readonly string[] = ['critical', 'warn'];

/** What is wrong with one signal's view, or null. */
function signalViewProblem(v: unknown): string | null {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return 'not an object';
  const s = v as Record<string, unknown>;
  if (!isString(s.signal) || s.signal === '') return 'no signal name';
  if (!isString(s.status) || !SIGNAL_STATUSES.includes(s.status))
    return `${s.signal}: status ${JSON.stringify(s.status)}, expected ${SIGNAL_STATUSES.join('|')}`;
  if (!isString(s.class) || !SIGNAL_CLASSES.includes(s.class))
    return `${s.signal}: class ${JSON.stringify(s.class)}, expected ${SIGNAL_CLASSES.join('|')}`;
  if (!isString(s.value)) return `${s.signal}: value is not a string`;
  if (s.action !== undefined && !isString(s.action)) return `${s.signal}: action is not a string`;
  if (s.since !== undefined && !isString(s.since)) return `${s.signal}: since is not a string`;
  return null;
}

/** What is wrong with the `signals` field (absent is fine), or null. */
function signalsProblem(signals: unknown): string | null {
  if (signals === undefined) return null;
  const what = 'signals is not a list of GPUs with index, uuid and signals';
  if (!Array.isArray(signals)) return what;
  for (const [i, g] of (signals as unknown[]).entries()) {
    if (typeof g !== 'object' || g === null || Array.isArray(g)) return `${what} (entry ${i})`;
    const gpu = g as Record<string, unknown>;
    if (typeof gpu.index !== 'number' || !isString(gpu.uuid) || !Array.isArray(gpu.signals))
      return `${what} (entry ${i})`;
    for (const s of gpu.signals as unknown[]) {
      const p = signalViewProblem(s);
      if (p !== null) return `signals of GPU ${gpu.index}: ${p}`;
    }
  }
  return null;
}

/** The state in a file's text, or what is wrong with it. */
export function parseStateDocument(text: string): { state: DaemonState } | { problem: string } {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    return { problem: `not JSON: ${(err as Error).message}` };
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) return { problem: 'not a JSON object' };
  const d = doc as Record<string, unknown>;
  if (d.format !== STATE_FORMAT)
    return { problem: `format ${JSON.stringify(d.format)}; this version reads format ${STATE_FORMAT}` };
  if (typeof d.pid !== 'number' || !isString(d.version) || !isString(d.startedAt) || !isString(d.publishedAt))
    return { problem: 'pid, version, startedAt or publishedAt missing' };
  if (!Array.isArray(d.devices) || !Array.isArray(d.resources)) return { problem: 'devices or resources missing' };
  const devices = d.devices as unknown[];
  if (
    !devices.every(
      (x) =>
        typeof x === 'object' &&
        x !== null &&
        isString((x as DeviceState).uuid) &&
        ((x as DeviceState).health === 'Healthy' || (x as DeviceState).health === 'Unhealthy'),
    )
  ) {
    return { problem: 'a device without uuid or health' };
  }
  if (
    d.claims !== undefined &&
    (!Array.isArray(d.claims) ||
      !(d.claims as unknown[]).every(
        (c) =>
          typeof c === 'object' &&
          c !== null &&
          isString((c as ClaimState).uid) &&
          isString((c as ClaimState).name) &&
          Array.isArray((c as ClaimState).devices),
      ))
  ) {
    return { problem: 'claims is not a list of claims with uid, name and devices' };
  }
  const signals = signalsProblem(d.signals);
  if (signals !== null) return { problem: signals };
  const { format: _format, ...rest } = d;
  return { state: rest as unknown as DaemonState };
}
