// Partitionable devices (KEP-4815) in the API server stand-in: the write-time rules of resource/v1 for a
// slice's sharedCounters and a device's consumesCounters, with the real server's messages and field paths
// (pkg/apis/resource/validation: validateCounterSet, validateDeviceCounterConsumption, validateSet and
// validateMap), and the scheduler's check of a whole pool (duplicate counter sets or devices, a device naming a
// counter set or counter the pool lacks), which the API server leaves to run time: a pool that fails it is
// unusable, so a test asks for it with poolProblems().
import type { Json, JsonObject } from './apiserver.ts';

/** Limits from resource/v1 types.go (ResourceSliceMax*). */
export const COUNTER_LIMITS = {
  counterSetsPerSlice: 8,
  countersPerCounterSet: 32,
  consumptionsPerDevice: 2,
  countersPerConsumption: 32,
} as const;

/** The causes a validation collects (the stand-in's Causes). */
export interface CounterCauses {
  invalid(field: string, value: Json | undefined, why: string): void;
  required(field: string, why?: string): void;
  tooMany(field: string, n: number, max: number): void;
  duplicate(field: string, value: Json): void;
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_LABEL_MAX = 63;
const DNS_LABEL_MSG =
  'a lowercase RFC 1123 label must consist of lower case alphanumeric ' +
  "characters or '-', and must start and end with an alphanumeric character " +
  "(e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

function isObject(v: Json | undefined): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function present(v: Json | undefined): boolean {
  return v !== undefined && v !== null;
}

/** A counter or counter-set name: a DNS label (ValidateDNS1123Label), each problem a cause at `at`. */
function validateCounterName(name: string, at: string, c: CounterCauses): void {
  if (name.length > DNS_LABEL_MAX) c.invalid(at, name, `must be no more than ${DNS_LABEL_MAX} characters`);
  if (!DNS_LABEL.test(name)) c.invalid(at, name, DNS_LABEL_MSG);
}

/** A counters map: at most `max` keys (checked first, alone), each key a DNS label reported at the map's path. */
function validateCounters(counters: Json | undefined, at: string, max: number, c: CounterCauses): void {
  if (!isObject(counters) || Object.keys(counters).length === 0) {
    if (present(counters) && !isObject(counters)) c.invalid(at, counters, 'must be a map');
    else c.required(at, '');
    return;
  }
  const keys = Object.keys(counters);
  if (keys.length > max) {
    c.tooMany(at, keys.length, max);
    return;
  }
  for (const k of keys) validateCounterName(k, at, c);
}

/** The named items of a list: too many reported alone; otherwise each item, then every repeated name. */
function validateNamedList(
  list: Json[],
  at: string,
  max: number,
  key: string,
  item: (o: JsonObject, f: string) => void,
  c: CounterCauses,
): void {
  if (list.length > max) {
    c.tooMany(at, list.length, max);
    return;
  }
  for (const [i, o] of list.entries()) {
    if (isObject(o)) item(o, `${at}[${i}]`);
    else c.invalid(`${at}[${i}]`, o, 'must be an object');
  }
  const seen = new Set<string>();
  for (const [i, o] of list.entries()) {
    const name = isObject(o) && typeof o[key] === 'string' ? o[key] : '';
    if (seen.has(name)) c.duplicate(`${at}[${i}]`, name);
    else seen.add(name);
  }
}

/**
 * A slice's sharedCounters: never beside devices (since 1.35), at most 8 sets, each named by a unique DNS label
 * with 1 to 32 counters whose names are DNS labels.
 */
export function validateSharedCounters(spec: JsonObject, c: CounterCauses): void {
  const sets = spec.sharedCounters;
  if (present(sets) && present(spec.devices))
    c.invalid('spec', '', 'only one of `sharedCounters` or `devices` is allowed');
  if (!present(sets)) return;
  if (!Array.isArray(sets)) {
    c.invalid('spec.sharedCounters', sets, 'must be a list');
    return;
  }
  validateNamedList(
    sets,
    'spec.sharedCounters',
    COUNTER_LIMITS.counterSetsPerSlice,
    'name',
    (set, f) => {
      const name = set.name;
      if (typeof name !== 'string' || name === '') c.required(`${f}.name`, '');
      else validateCounterName(name, `${f}.name`, c);
      validateCounters(set.counters, `${f}.counters`, COUNTER_LIMITS.countersPerCounterSet, c);
    },
    c,
  );
}

/** A device's consumesCounters: at most 2 entries, one per counter set, each with 1 to 32 counters. */
export function validateConsumesCounters(device: JsonObject, at: string, c: CounterCauses): void {
  const list = device.consumesCounters;
  if (!present(list)) return;
  const f = `${at}.consumesCounters`;
  if (!Array.isArray(list)) {
    c.invalid(f, list, 'must be a list');
    return;
  }
  validateNamedList(
    list,
    f,
    COUNTER_LIMITS.consumptionsPerDevice,
    'counterSet',
    (use, g) => {
      const set = use.counterSet;
      if (typeof set !== 'string' || set === '') c.required(`${g}.counterSet`, '');
      else validateCounterName(set, `${g}.counterSet`, c);
      validateCounters(use.counters, `${g}.counters`, COUNTER_LIMITS.countersPerConsumption, c);
    },
    c,
  );
}

function listOf(v: Json | undefined): JsonObject[] {
  return Array.isArray(v) ? v.filter(isObject) : [];
}

/**
 * What the scheduler finds wrong with one pool's slices (all of them, counter-only slices included), in its
 * words: `duplicate counter set name X`, `duplicate device name X`, `counter set X not found`,
 * `counter X not found in counter set Y`. Empty when the pool is usable. Only the slices of the highest
 * generation count, as for the scheduler.
 */
export function poolProblems(slices: readonly JsonObject[]): string[] {
  const specs = slices.map((s) => s.spec).filter(isObject);
  const gen = (s: JsonObject): number =>
    isObject(s.pool) && typeof s.pool.generation === 'number' ? s.pool.generation : 0;
  const top = Math.max(0, ...specs.map(gen));
  const current = specs.filter((s) => gen(s) === top);
  const problems: string[] = [];
  const sets = new Map<string, Set<string>>();
  for (const set of current.flatMap((s) => listOf(s.sharedCounters))) {
    const name = String(set.name);
    if (sets.has(name)) problems.push(`duplicate counter set name ${name}`);
    else sets.set(name, new Set(isObject(set.counters) ? Object.keys(set.counters) : []));
  }
  const devices = new Set<string>();
  for (const d of current.flatMap((s) => listOf(s.devices))) {
    const name = String(d.name);
    if (devices.has(name)) problems.push(`duplicate device name ${name}`);
    devices.add(name);
    for (const use of listOf(d.consumesCounters)) {
      const setName = String(use.counterSet);
      const counters = sets.get(setName);
      if (counters === undefined) {
        problems.push(`counter set ${setName} not found`);
        continue;
      }
      for (const k of isObject(use.counters) ? Object.keys(use.counters) : [])
        if (!counters.has(k)) problems.push(`counter ${k} not found in counter set ${setName}`);
    }
  }
  return problems;
}

/**
 * Whether the DRAPartitionableDevices feature gate is on by default at this server version (gitVersion such as
 * v1.35.2): alpha, off, in 1.33 to 1.35; beta, on, from 1.36.
 */
export function partitionableByDefault(gitVersion: string): boolean {
  const m = /^v?(\d+)\.(\d+)/.exec(gitVersion);
  if (m === null) return true;
  const major = Number(m[1]);
  return major > 1 || Number(m[2]) >= 36;
}

function usesPartitionable(spec: Json | undefined): boolean {
  if (!isObject(spec)) return false;
  if (listOf(spec.sharedCounters).length > 0 || present(spec.perDeviceNodeSelection)) return true;
  return listOf(spec.devices).some(
    (d) =>
      listOf(d.consumesCounters).length > 0 || present(d.nodeName) || present(d.nodeSelector) || present(d.allNodes),
  );
}

/**
 * What a server with the gate off does before validating a write: it drops, without a word, every
 * partitionable-devices field (sharedCounters, perDeviceNodeSelection, and each device's consumesCounters and
 * node selection), unless the stored slice already used them. The partitions then stand alone, counting nothing.
 */
export function dropDisabledPartitionable(spec: Json | undefined, oldSpec: Json | undefined): void {
  if (!isObject(spec) || usesPartitionable(oldSpec)) return;
  delete spec.sharedCounters;
  delete spec.perDeviceNodeSelection;
  for (const d of listOf(spec.devices)) {
    delete d.consumesCounters;
    delete d.nodeName;
    delete d.nodeSelector;
    delete d.allNodes;
  }
}
