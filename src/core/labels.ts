// Node labels as GPU Feature Discovery (GFD) publishes them: same names, same value
// formats, so node selectors written for GFD keep working on a node that runs this plugin instead.
// Written to Node Feature Discovery's local feature file as `name=value` lines, sorted by name so
// that the same node state always gives the same bytes. Pure: plain data in, plain data out.
import { isFullInstance, migResourceName } from './mig.ts';
import type { MigDevice } from './mig.ts';
import { GPU_RESOURCE, activeSharing } from './sharing.ts';
import type { Sharing, SharingStrategy } from './sharing.ts';

export const LABEL_PREFIX = 'nvidia.com/';

/** What the labels are made of: one entry per GPU (in index order) and node-wide facts. */
export interface LabelGpu {
  /** NVML's product name, e.g. `Tesla V100-SXM2-32GB`. */
  readonly name: string;
  readonly memoryBytes: number;
  /** CUDA compute capability, or null when NVML could not say (then no family/compute labels). */
  readonly compute: { readonly major: number; readonly minor: number } | null;
  /** The GPU supports MIG (nvmlDeviceGetMigMode answers), whether or not MIG is enabled. */
  readonly migCapable: boolean;
  /** MIG mode is on now (current mode). */
  readonly migEnabled: boolean;
}

/** A MIG device as the labels see it; `parent` is its GPU's position in `gpus`. */
export type LabelMigDevice = Pick<
  MigDevice,
  'parent' | 'profile' | 'giSlices' | 'ciSlices' | 'memoryBytes' | 'multiprocessors' | 'engines'
>;

export interface LabelInput {
  readonly gpus: readonly LabelGpu[];
  /** nvmlSystemGetDriverVersion, e.g. `550.54.15`. */
  readonly driverVersion: string;
  /** nvmlSystemGetCudaDriverVersion_v2, e.g. 12040 for CUDA 12.4; null when unknown. */
  readonly cudaDriverVersion: number | null;
  /** The host's DMI product name as read (untrimmed), or null when the host does not say. */
  readonly machine: string | null;
  readonly sharing: Sharing;
  readonly migStrategy: 'none' | 'single' | 'mixed';
  /**
   * The MIG devices (every one discovered; only full compute instances are labelled, as only they
   * are advertised). With `single` they override gpu.product/.count/.memory and add
   * gpu.multiprocessors, gpu.slices.* and gpu.engines.*; with `mixed` each profile gets
   * `nvidia.com/mig-<profile>.count`, `.product`, `.replicas`, `.memory` and the same attributes.
   */
  readonly migDevices: readonly LabelMigDevice[];
  /**
   * Some GPU's driver asks for a node reboot (the health signals' recovery action NODE_REBOOT): our
   * own label `nvidia.com/gpu.node-reboot-required=true` while it does, for a maintenance job to select.
   */
  readonly nodeRebootRequired?: boolean;
}

export type Label = readonly [name: string, value: string];

/** GFD's sanitising of names: drop characters outside [A-Za-z0-9-_. ], then join the words with '-'. */
export function sanitise(text: string): string {
  return text
    .replace(/[^A-Za-z0-9\-_. ]/g, '')
    .split(/\s+/)
    .filter((w) => w !== '')
    .join('-');
}

/** GFD's architecture family for a compute capability. */
export function archFamily(major: number, minor: number): string {
  switch (major) {
    case 1:
      return 'tesla';
    case 2:
      return 'fermi';
    case 3:
      return 'kepler';
    case 5:
      return 'maxwell';
    case 6:
      return 'pascal';
    case 7:
      return minor < 5 ? 'volta' : 'turing';
    case 8:
      return minor < 9 ? 'ampere' : 'ada-lovelace';
    case 9:
      return 'hopper';
    case 10:
    case 12:
      return 'blackwell';
    default:
      return 'undefined';
  }
}

/**
 * How a resource (nvidia.com/gpu unless named) is shared, as GFD reads it from the config: replicas,
 * whether it is renamed, and the strategy (`time-slicing` or `mps`; `none` with one replica).
 */
export function gpuSharing(
  sharing: Sharing,
  resource: string = GPU_RESOURCE,
): { replicas: number; renamed: boolean; strategy: SharingStrategy } {
  const active = activeSharing(sharing);
  const r = active?.config.resources.find((x) => x.name === resource);
  if (active === null || r === undefined) return { replicas: 1, renamed: false, strategy: 'none' };
  return {
    replicas: r.replicas,
    renamed: r.rename !== null || active.config.renameByDefault,
    strategy: r.replicas > 1 ? active.strategy : 'none',
  };
}

/**
 * The GPU model the gpu.* labels describe. GFD labels one model; on a node with several it warns and
 * the last one it happens to visit wins. Here: the model with the most GPUs, the lowest index on a tie.
 */
export function labelledModel(gpus: readonly LabelGpu[]): { gpu: LabelGpu; count: number; others: string[] } | null {
  const counts = new Map<string, { gpu: LabelGpu; count: number }>();
  for (const g of gpus) {
    const c = counts.get(g.name);
    if (c === undefined) counts.set(g.name, { gpu: g, count: 1 });
    else c.count++;
  }
  let best: { gpu: LabelGpu; count: number } | null = null;
  for (const c of counts.values()) if (best === null || c.count > best.count) best = c;
  if (best === null) return null;
  const chosen = best.gpu.name;
  return { ...best, others: [...counts.keys()].filter((n) => n !== chosen) };
}

function driverParts(version: string): { major: string; minor: string; rev: string } | null {
  const parts = version.trim().split('.');
  if (parts.length < 2 || parts.length > 3 || parts.some((p) => p === '')) return null;
  return { major: parts[0] ?? '', minor: parts[1] ?? '', rev: parts[2] ?? '' };
}

/** The labels for a node state, sorted by name. A node without GPUs gets none (as with GFD). */
export function nodeLabels(input: LabelInput): Label[] {
  const out = new Map<string, string>();
  const set: SetLabel = (name, value) => {
    out.set(name.startsWith(LABEL_PREFIX) ? name : `${LABEL_PREFIX}${name}`, String(value));
  };
  const model = labelledModel(input.gpus);
  if (model === null) return [];

  set('gpu.machine', input.machine === null ? 'unknown' : sanitise(input.machine) || 'unknown');

  const driver = driverParts(input.driverVersion);
  if (driver !== null) {
    set('cuda.driver.major', driver.major);
    set('cuda.driver.minor', driver.minor);
    set('cuda.driver.rev', driver.rev);
    set('cuda.driver-version.major', driver.major);
    set('cuda.driver-version.minor', driver.minor);
    set('cuda.driver-version.revision', driver.rev);
    set('cuda.driver-version.full', input.driverVersion.trim());
  }
  if (input.cudaDriverVersion !== null && input.cudaDriverVersion > 0) {
    const major = Math.floor(input.cudaDriverVersion / 1000);
    const minor = Math.floor((input.cudaDriverVersion % 1000) / 10);
    set('cuda.runtime.major', major);
    set('cuda.runtime.minor', minor);
    set('cuda.runtime-version.major', major);
    set('cuda.runtime-version.minor', minor);
    set('cuda.runtime-version.full', `${major}.${minor}`);
  }

  set('mig.capable', String(input.gpus.some((g) => g.migCapable)));
  if (input.nodeRebootRequired === true) set('gpu.node-reboot-required', 'true');
  if (input.migStrategy !== 'none') set('mig.strategy', input.migStrategy);
  // GFD: false unless MPS is configured; then false when a GPU has MIG enabled (MPS is not for MIG devices).
  const mps = activeSharing(input.sharing)?.strategy === 'mps';
  set('mps.capable', String(mps && !input.gpus.some((g) => g.migEnabled)));

  const { replicas, renamed, strategy } = gpuSharing(input.sharing);
  const shared = replicas > 1;
  const product = sanitise(model.gpu.name);
  // -SHARED with either strategy, unless renamed (GFD's getProductName).
  set('gpu.product', shared && !renamed ? `${product}-SHARED` : product);
  set('gpu.count', model.count);
  set('gpu.replicas', replicas);
  set('gpu.sharing-strategy', strategy);
  const memoryMiB = Math.floor(model.gpu.memoryBytes / 1048576);
  if (memoryMiB > 0) set('gpu.memory', memoryMiB);
  const cc = model.gpu.compute;
  if (cc !== null && cc.major > 0) {
    set('gpu.family', archFamily(cc.major, cc.minor));
    set('gpu.compute.major', cc.major);
    set('gpu.compute.minor', cc.minor);
  }

  if (input.migStrategy === 'single') singleMigLabels(input, set, product);
  if (input.migStrategy === 'mixed') mixedMigLabels(input, set);
  return [...out.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

type SetLabel = (name: string, value: string | number) => void;

/** GFD's attribute labels of a MIG device type, under `<key>.` (gpu, or mig-<profile>). */
function migAttributeLabels(set: SetLabel, key: string, d: LabelMigDevice): void {
  set(`${key}.memory`, Math.floor(d.memoryBytes / 1048576));
  set(`${key}.multiprocessors`, d.multiprocessors);
  set(`${key}.slices.gi`, d.giSlices);
  set(`${key}.slices.ci`, d.ciSlices);
  for (const [engine, n] of Object.entries(d.engines)) set(`${key}.engines.${engine}`, n);
}

/** The product label of a MIG type: parent model, `-MIG-`, profile (`+` as `.`, which label values allow). */
const migProduct = (model: string, profile: string): string => `${sanitise(model)}-MIG-${profile.replace(/\+/g, '.')}`;

/**
 * single: the gpu.* labels describe the MIG devices. A node that does not fit the strategy (MIG on
 * some GPUs only, an enabled GPU without devices, or more than one profile) gets GFD's invalid
 * labels: count and memory 0, product `<model>-MIG-INVALID`. No GPU in MIG mode: as `none`.
 */
function singleMigLabels(input: LabelInput, set: SetLabel, product: string): void {
  const enabled = input.gpus.filter((g) => g.migEnabled).length;
  if (enabled === 0) return;
  const devices = input.migDevices.filter(isFullInstance);
  const profiles = new Set(devices.map((d) => d.profile));
  const emptyParent = input.gpus.some((g, i) => g.migEnabled && !devices.some((d) => d.parent === i));
  const first = devices[0];
  if (enabled !== input.gpus.length || emptyParent || profiles.size !== 1 || first === undefined) {
    set('gpu.count', 0);
    set('gpu.memory', 0);
    set('gpu.product', `${product}-MIG-INVALID`);
    return;
  }
  const { replicas, renamed } = gpuSharing(input.sharing);
  const name = migProduct(input.gpus[first.parent]?.name ?? '', first.profile);
  set('gpu.product', replicas > 1 && !renamed ? `${name}-SHARED` : name);
  set('gpu.count', devices.length);
  migAttributeLabels(set, 'gpu', first);
}

/** mixed: the gpu.* labels stay as with `none`; every profile advertised gets labels of its own. */
function mixedMigLabels(input: LabelInput, set: SetLabel): void {
  const byProfile = new Map<string, LabelMigDevice[]>();
  for (const d of input.migDevices.filter(isFullInstance))
    byProfile.set(d.profile, [...(byProfile.get(d.profile) ?? []), d]);
  for (const [profile, devices] of byProfile) {
    const resource = migResourceName(profile);
    const key = resource.slice(LABEL_PREFIX.length);
    const { replicas, renamed } = gpuSharing(input.sharing, resource);
    const model = labelledModel(devices.map((d) => input.gpus[d.parent]).filter((g) => g !== undefined));
    const name = migProduct(model?.gpu.name ?? '', profile);
    set(`${key}.count`, devices.length);
    set(`${key}.product`, replicas > 1 && !renamed ? `${name}-SHARED` : name);
    set(`${key}.replicas`, replicas);
    migAttributeLabels(set, key, devices[0]!);
  }
}

/** The feature file: one `name=value` line per label, as NFD's local source reads it. */
export function labelsFile(labels: readonly Label[]): string {
  return labels.map(([n, v]) => `${n}=${v}\n`).join('');
}
