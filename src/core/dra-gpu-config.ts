// NVIDIA's opaque device configuration under DRA, pure: the `GpuConfig` and `MigDeviceConfig` kinds of
// `resource.nvidia.com/v1beta1` (sharing a device by time-slicing or MPS) as a ResourceClaim's allocation carries
// them in `status.allocation.devices.config`, decoded and validated the way NVIDIA's DRA driver does, and the
// sharing that applies to one allocated device's request. Claims written for NVIDIA's driver mean the same here.
import { isObject, isStringList } from './json.ts';
import { parseQuantity } from './quantity.ts';

export type TimeSliceInterval = 'Default' | 'Short' | 'Medium' | 'Long';
export interface TimeSlicingSharing {
  readonly strategy: 'TimeSlicing';
  readonly interval: TimeSliceInterval;
}
export interface MpsSharing {
  readonly strategy: 'MPS';
  /** 0..100 (NVIDIA's range); absent: MPS's default (100). */
  readonly defaultActiveThreadPercentage?: number;
  /** Bytes, at least 1 MiB (MPS sets whole MiB); absent: none set. */
  readonly defaultPinnedDeviceMemoryLimit?: number;
  /**
   * Bytes per device, keyed as the claim wrote it: a UUID of one of the devices the configuration applies to,
   * or an index into their UUIDs sorted (see perDeviceLimits).
   */
  readonly defaultPerDevicePinnedMemoryLimit?: Readonly<Record<string, number>>;
  /** The control daemon in multi-user mode (clients of different uids); absent: single user. */
  readonly multiUser?: boolean;
}
export type GpuSharing = TimeSlicingSharing | MpsSharing;

export const CONFIG_API_VERSION = 'resource.nvidia.com/v1beta1';
export type ConfigKind = 'GpuConfig' | 'MigDeviceConfig';
/** What an allocated device is: a whole GPU or a MIG device. */
export type ConfigDeviceKind = 'gpu' | 'mig';

/** One opaque configuration of this driver in the allocation, decoded. */
export interface DriverConfig {
  /** Its place in status.allocation.devices.config. */
  readonly index: number;
  /** The requests it applies to (a main request covers its subrequests); empty: every request. */
  readonly requests: readonly string[];
  readonly kind: ConfigKind;
  /** What it sets where it applies: a sharing, none, or why it is invalid (told only where it applies). */
  readonly verdict: { readonly sharing?: GpuSharing } | { readonly error: string };
}

const INTERVALS: readonly TimeSliceInterval[] = ['Default', 'Short', 'Medium', 'Long'];
const KINDS: readonly ConfigKind[] = ['GpuConfig', 'MigDeviceConfig'];
/** NVIDIA's other kinds of the group: not device configurations this driver can apply. */
const OTHER_NVIDIA_KINDS = [
  'VfioDeviceConfig',
  'ComputeDomainChannelConfig',
  'ComputeDomainDaemonConfig',
  'ComputeDomain',
  'ComputeDomainClique',
];
const MIB = 1024 * 1024;
const PINNED = 'defaultPinnedDeviceMemoryLimit';

/** The field path of the allocation's config entry `i`. */
export const configPath = (i: number): string => `status.allocation.devices.config[${i}]`;

class ConfigError extends Error {}
function fail(path: string, what: string): never {
  throw new ConfigError(`${path}: ${what}`);
}
const shown = (v: unknown): string => (v === undefined ? '(none)' : JSON.stringify(v));

/**
 * NVIDIA decodes parameters strictly: a field its types lack is an error, not ignored (names are
 * case-sensitive), and a value of the wrong JSON type is one too.
 */
function onlyFields(v: Record<string, unknown>, path: string, known: readonly string[]): void {
  for (const k of Object.keys(v))
    if (!known.includes(k)) fail(`${path}.${k}`, `unknown field (the fields here: ${known.join(', ')})`);
}

/** A decoded quantity: its text and its bytes. */
interface Quantity {
  readonly text: string;
  readonly bytes: number;
}
function quantity(v: unknown, path: string): Quantity {
  const text = typeof v === 'number' ? String(v) : v;
  const bytes = typeof text === 'string' ? parseQuantity(text) : null;
  if (typeof text !== 'string' || bytes === null)
    return fail(path, `${shown(v)} is not a non-negative quantity of bytes (e.g. 4Gi, 512Mi)`);
  return { text, bytes };
}

/** Sharing as decoded, before validation (null: the field is absent). */
interface DecodedMps {
  readonly percentage: number | null;
  readonly pinned: Quantity | null;
  readonly perDevice: ReadonlyMap<string, Quantity> | null;
  readonly multiUser: boolean | null;
}
interface DecodedSharing {
  readonly strategy: string;
  /** null: no timeSlicingConfig; undefined inside: no interval. */
  readonly timeSlicing: { readonly interval: string | undefined } | null;
  readonly mps: DecodedMps | null;
}

const absent = (v: unknown): v is null | undefined => v === undefined || v === null;

function decodeMps(m: unknown, path: string): DecodedMps | null {
  if (absent(m)) return null;
  if (!isObject(m)) return fail(path, `${shown(m)} is not an object`);
  const fields = [
    'defaultActiveThreadPercentage',
    'defaultPinnedDeviceMemoryLimit',
    'defaultPerDevicePinnedMemoryLimit',
    'multiUser',
  ];
  onlyFields(m, path, fields);
  const { defaultActiveThreadPercentage: pct, defaultPinnedDeviceMemoryLimit: pinned, multiUser } = m;
  if (!absent(pct) && !Number.isInteger(pct)) fail(`${path}.${fields[0]}`, `${shown(pct)} is not an integer`);
  if (!absent(multiUser) && typeof multiUser !== 'boolean')
    fail(`${path}.multiUser`, `${shown(multiUser)} is not true or false`);
  const per = m.defaultPerDevicePinnedMemoryLimit;
  let perDevice: Map<string, Quantity> | null = null;
  if (!absent(per)) {
    if (!isObject(per)) return fail(`${path}.${fields[2]}`, `${shown(per)} is not a map of device to quantity`);
    perDevice = new Map(Object.entries(per).map(([k, v]) => [k, quantity(v, `${path}.${fields[2]}[${shown(k)}]`)]));
  }
  return {
    percentage: absent(pct) ? null : (pct as number),
    pinned: absent(pinned) ? null : quantity(pinned, `${path}.${fields[1]}`),
    perDevice,
    multiUser: absent(multiUser) ? null : (multiUser as boolean),
  };
}

function decodeSharing(s: unknown, path: string, kind: ConfigKind): DecodedSharing | null {
  if (absent(s)) return null;
  if (!isObject(s)) return fail(path, `${shown(s)} is not an object`);
  // A MigDeviceConfig has no timeSlicingConfig: a MIG device has no time slice of its own.
  onlyFields(
    s,
    path,
    kind === 'GpuConfig' ? ['strategy', 'timeSlicingConfig', 'mpsConfig'] : ['strategy', 'mpsConfig'],
  );
  const { strategy, timeSlicingConfig: ts } = s;
  if (!absent(strategy) && typeof strategy !== 'string') fail(`${path}.strategy`, `${shown(strategy)} is not a string`);
  let timeSlicing: DecodedSharing['timeSlicing'] = null;
  if (!absent(ts)) {
    if (!isObject(ts)) return fail(`${path}.timeSlicingConfig`, `${shown(ts)} is not an object`);
    onlyFields(ts, `${path}.timeSlicingConfig`, ['interval']);
    const interval = ts.interval;
    if (!absent(interval) && typeof interval !== 'string')
      fail(`${path}.timeSlicingConfig.interval`, `${shown(interval)} is not a string`);
    timeSlicing = { interval: absent(interval) ? undefined : (interval as string) };
  }
  return {
    strategy: (strategy as string | undefined) ?? '',
    timeSlicing,
    mps: decodeMps(s.mpsConfig, `${path}.mpsConfig`),
  };
}

/** The parameters' kind and sharing; throws a ConfigError naming the field. */
function decodeParameters(p: unknown, path: string): { kind: ConfigKind; sharing: DecodedSharing | null } {
  const expected = `{apiVersion: ${CONFIG_API_VERSION}, kind: GpuConfig | MigDeviceConfig, sharing?}`;
  if (!isObject(p)) return fail(path, `${shown(p)} is not an object; expected ${expected}`);
  if (p.apiVersion !== CONFIG_API_VERSION)
    fail(`${path}.apiVersion`, `${shown(p.apiVersion)} is not ${CONFIG_API_VERSION}, the version this driver reads`);
  const kind = p.kind;
  if (typeof kind !== 'string' || !KINDS.includes(kind as ConfigKind)) {
    const why = OTHER_NVIDIA_KINDS.includes(kind as string)
      ? 'is not supported by this driver'
      : `is not a kind of ${CONFIG_API_VERSION}`;
    return fail(`${path}.kind`, `${shown(kind)} ${why}; this driver applies GpuConfig and MigDeviceConfig`);
  }
  onlyFields(p, path, ['apiVersion', 'kind', 'sharing']);
  return { kind: kind as ConfigKind, sharing: decodeSharing(p.sharing, `${path}.sharing`, kind as ConfigKind) };
}

function validateLimit(q: Quantity, path: string): number {
  if (q.bytes < MIB) fail(path, `${shown(q.text)} is less than 1Mi; MPS limits pinned memory in whole MiB`);
  return q.bytes;
}

function validateMps(m: DecodedMps | null, path: string): MpsSharing {
  if (m === null) return { strategy: 'MPS' };
  const { percentage, pinned, perDevice, multiUser } = m;
  if (percentage !== null && (percentage < 0 || percentage > 100))
    fail(
      `${path}.defaultActiveThreadPercentage`,
      `${percentage} is not within 0..100 (the percentage of the GPU's threads a client may use)`,
    );
  const keys = perDevice === null ? [] : [...perDevice.keys()].sort();
  const limits = Object.fromEntries(
    keys.map((k) => [
      k,
      validateLimit(perDevice?.get(k) as Quantity, `${path}.defaultPerDevicePinnedMemoryLimit[${shown(k)}]`),
    ]),
  );
  return {
    strategy: 'MPS',
    ...(percentage === null ? {} : { defaultActiveThreadPercentage: percentage }),
    ...(pinned === null ? {} : { defaultPinnedDeviceMemoryLimit: validateLimit(pinned, `${path}.${PINNED}`) }),
    ...(perDevice === null ? {} : { defaultPerDevicePinnedMemoryLimit: limits }),
    ...(multiUser === null ? {} : { multiUser }),
  };
}
/** What a decoded configuration sets where it applies; throws a ConfigError naming the field. */
function validate(kind: ConfigKind, s: DecodedSharing | null, path: string): GpuSharing | undefined {
  if (s === null) return undefined;
  const { strategy, timeSlicing, mps } = s;
  if (strategy !== 'TimeSlicing' && strategy !== 'MPS')
    return fail(`${path}.strategy`, `${shown(strategy)} is not a sharing strategy; it is TimeSlicing or MPS`);
  if (strategy === 'MPS') {
    if (timeSlicing !== null)
      fail(`${path}.timeSlicingConfig`, 'is set with strategy MPS; it goes with strategy TimeSlicing (remove it)');
    return validateMps(mps, `${path}.mpsConfig`);
  }
  // Time slices are a whole GPU's: on a MIG device strategy TimeSlicing sets nothing.
  if (kind === 'MigDeviceConfig') return undefined;
  if (mps !== null)
    fail(`${path}.mpsConfig`, 'is set with strategy TimeSlicing; it goes with strategy MPS (remove it)');
  // No timeSlicingConfig, or one without an interval: the Default interval.
  const interval = timeSlicing?.interval ?? 'Default';
  if (!INTERVALS.includes(interval as TimeSliceInterval))
    fail(
      `${path}.timeSlicingConfig.interval`,
      `${shown(interval)} is not a time-slice interval; it is ${INTERVALS.slice(0, -1).join(', ')} or Long`,
    );
  return { strategy: 'TimeSlicing', interval: interval as TimeSliceInterval };
}

/** Config entry `i`, or null when it is another driver's; throws a ConfigError naming the field. */
function decodeEntry(c: unknown, i: number, driver: string): { config: DriverConfig; source: string } | null {
  const path = configPath(i);
  if (!isObject(c)) return fail(path, `${shown(c)} is not an object`);
  const { source, requests, opaque } = c;
  if (source !== 'FromClass' && source !== 'FromClaim')
    fail(`${path}.source`, `${shown(source)} is neither FromClass nor FromClaim`);
  // An entry without opaque parameters, or another driver's, is not this driver's to read.
  if (!isObject(opaque) || opaque.driver !== driver) return null;
  if (!absent(requests) && !isStringList(requests))
    fail(`${path}.requests`, `${shown(requests)} is not a list of names`);
  const params = `${path}.opaque.parameters`;
  const { kind, sharing } = decodeParameters(opaque.parameters, params);
  let verdict: DriverConfig['verdict'];
  try {
    const s = validate(kind, sharing, `${params}.sharing`);
    verdict = s === undefined ? {} : { sharing: s };
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    verdict = { error: err.message };
  }
  return { config: { index: i, requests: (requests as string[] | null | undefined) ?? [], kind, verdict }, source };
}

/**
 * This driver's configurations in an allocation's `devices.config` list, lowest precedence first: those
 * of the DeviceClass before those of the claim, each in the order written. Every one must decode (an unknown
 * field, kind or version is an error, as NVIDIA's strict decoder has it); whether one is valid counts only
 * where it applies. An error names the field path and what would be right.
 */
export function driverConfigs(config: unknown, driver: string): { configs: DriverConfig[] } | { error: string } {
  if (absent(config)) return { configs: [] };
  if (!Array.isArray(config)) return { error: `status.allocation.devices.config: ${shown(config)} is not a list` };
  const byClass: DriverConfig[] = [];
  const byClaim: DriverConfig[] = [];
  try {
    for (const [i, c] of config.entries()) {
      const e = decodeEntry(c, i, driver);
      if (e !== null) (e.source === 'FromClass' ? byClass : byClaim).push(e.config);
    }
  } catch (err) {
    if (err instanceof ConfigError) return { error: err.message };
    throw err;
  }
  return { configs: [...byClass, ...byClaim] };
}

const names = (c: DriverConfig, request: string): boolean =>
  c.requests.some((r) => r === request || request.startsWith(`${r}/`));
const fits = (c: DriverConfig, kind: ConfigDeviceKind): boolean => (c.kind === 'GpuConfig') === (kind === 'gpu');
const deviceWord = (kind: ConfigDeviceKind): string => (kind === 'gpu' ? 'a whole GPU' : 'a MIG device');

/**
 * The sharing that applies to `device` (of `kind`) allocated for `request`, with the index of the
 * configuration it comes from; neither when none applies (no sharing). The configuration of highest
 * precedence wins among those naming the request and those naming no request; one of the latter
 * applies only to devices of its kind, while one naming the request must be of the device's kind.
 */
export function sharingFor(
  configs: readonly DriverConfig[],
  request: string,
  kind: ConfigDeviceKind,
  device: string,
): { readonly sharing?: GpuSharing; readonly config?: number } | { readonly error: string } {
  for (const c of [...configs].reverse()) {
    const named = names(c, request);
    if (!named && (c.requests.length > 0 || !fits(c, kind))) continue;
    if (!fits(c, kind))
      return {
        error:
          `${configPath(c.index)}: a ${c.kind} names request ${request}, whose device ${device} is ` +
          `${deviceWord(kind)}: a GpuConfig applies to whole GPUs, a MigDeviceConfig to MIG devices`,
      };
    if ('error' in c.verdict) return { error: c.verdict.error };
    return c.verdict.sharing === undefined ? { config: c.index } : { sharing: c.verdict.sharing, config: c.index };
  }
  return {};
}

/**
 * MPS's pinned-memory limit per device, in bytes, for the devices of `uuids` one MPS configuration applies
 * to: the default limit for each, then each per-device entry, keyed by one of the UUIDs or by an index into
 * them sorted. An error names the key that fits none.
 */
export function perDeviceLimits(
  sharing: MpsSharing,
  uuids: readonly string[],
): { readonly limits: Readonly<Record<string, number>> } | { readonly key: string; readonly error: string } {
  const sorted = [...new Set(uuids)].sort();
  const limits: Record<string, number> = {};
  const fallback = sharing.defaultPinnedDeviceMemoryLimit;
  if (fallback !== undefined) for (const u of sorted) limits[u] = fallback;
  for (const [key, bytes] of Object.entries(sharing.defaultPerDevicePinnedMemoryLimit ?? {})) {
    const index = /^[+-]?\d+$/.test(key) ? Number(key) : Number.NaN;
    const uuid = sorted.includes(key) ? key : sorted[index];
    if (uuid === undefined)
      return {
        key,
        error:
          `names no device of the configuration (${sorted.join(', ')}); a key is one of their UUIDs ` +
          `or an index 0..${sorted.length - 1} into them sorted`,
      };
    limits[uuid] = bytes;
  }
  return { limits };
}

/** Whether `v` is a GpuSharing as this module makes them (for a record read back); else what is wrong. */
export function checkSharing(v: unknown): string | null {
  if (!isObject(v)) return 'is not an object';
  if (v.strategy === 'TimeSlicing')
    return INTERVALS.includes(v.interval as TimeSliceInterval)
      ? null
      : `interval ${shown(v.interval)} is not ${INTERVALS.join(', ')}`;
  if (v.strategy !== 'MPS') return `strategy ${shown(v.strategy)} is neither TimeSlicing nor MPS`;
  const { defaultActiveThreadPercentage: pct, defaultPinnedDeviceMemoryLimit: pinned, multiUser } = v;
  const per = v.defaultPerDevicePinnedMemoryLimit;
  const bytes = (x: unknown): boolean => Number.isSafeInteger(x) && (x as number) >= MIB;
  if (pct !== undefined && !(Number.isInteger(pct) && (pct as number) >= 0 && (pct as number) <= 100))
    return `defaultActiveThreadPercentage ${shown(pct)} is not within 0..100`;
  if (pinned !== undefined && !bytes(pinned)) return `${PINNED} ${shown(pinned)} is not a byte count`;
  if (per !== undefined && !(isObject(per) && Object.values(per).every(bytes)))
    return `defaultPerDevicePinnedMemoryLimit ${shown(per)} is not a map of byte counts`;
  if (multiUser !== undefined && typeof multiUser !== 'boolean')
    return `multiUser ${shown(multiUser)} is not a boolean`;
  return null;
}
