// Node labels as GPU Feature Discovery (GFD) publishes them (FACTS §7): same names, same value
// formats, so node selectors written for GFD keep working on a node that runs this plugin instead.
// Written to Node Feature Discovery's local feature file as `name=value` lines, sorted by name so
// that the same node state always gives the same bytes. Pure: plain data in, plain data out.
import { GPU_RESOURCE } from './sharing.ts';
import type { Sharing } from './sharing.ts';

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
}

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
   * Extension point for MIG: labels the MIG strategy adds (mixed: `nvidia.com/mig-<profile>.count`,
   * `.memory`, …) or overrides (single: `nvidia.com/gpu.product`, `.count`, `.memory`, …), as GFD
   * does. Given without the `nvidia.com/` prefix or with it; they win over the labels made here.
   */
  readonly migLabels?: readonly (readonly [string, string])[];
}

export type Label = readonly [name: string, value: string];

/** GFD's sanitising of names: drop characters outside [A-Za-z0-9-_. ], then join the words with '-'. */
export function sanitise(text: string): string {
  return text.replace(/[^A-Za-z0-9\-_. ]/g, '').split(/\s+/).filter((w) => w !== '').join('-');
}

/** GFD's architecture family for a compute capability. */
export function archFamily(major: number, minor: number): string {
  switch (major) {
    case 1: return 'tesla';
    case 2: return 'fermi';
    case 3: return 'kepler';
    case 5: return 'maxwell';
    case 6: return 'pascal';
    case 7: return minor < 5 ? 'volta' : 'turing';
    case 8: return minor < 9 ? 'ampere' : 'ada-lovelace';
    case 9: return 'hopper';
    case 10:
    case 12: return 'blackwell';
    default: return 'undefined';
  }
}

/** How nvidia.com/gpu is shared, as GFD reads it from the config: replicas and whether it is renamed. */
export function gpuSharing(sharing: Sharing): { replicas: number; renamed: boolean } {
  const ts = sharing.timeSlicing;
  const r = ts?.resources.find((x) => x.name === GPU_RESOURCE);
  if (ts === null || r === undefined) return { replicas: 1, renamed: false };
  return { replicas: r.replicas, renamed: r.rename !== null || ts.renameByDefault };
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
  const set = (name: string, value: string | number): void => {
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
  if (input.migStrategy !== 'none') set('mig.strategy', input.migStrategy);
  // This plugin does not share GPUs through MPS.
  set('mps.capable', 'false');

  const { replicas, renamed } = gpuSharing(input.sharing);
  const shared = replicas > 1;
  const product = sanitise(model.gpu.name);
  set('gpu.product', shared && !renamed ? `${product}-SHARED` : product);
  set('gpu.count', model.count);
  set('gpu.replicas', replicas);
  set('gpu.sharing-strategy', shared ? 'time-slicing' : 'none');
  const memoryMiB = Math.floor(model.gpu.memoryBytes / 1048576);
  if (memoryMiB > 0) set('gpu.memory', memoryMiB);
  const cc = model.gpu.compute;
  if (cc !== null && cc.major > 0) {
    set('gpu.family', archFamily(cc.major, cc.minor));
    set('gpu.compute.major', cc.major);
    set('gpu.compute.minor', cc.minor);
  }

  for (const [name, value] of input.migLabels ?? []) set(name, value);
  return [...out.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

/** The feature file: one `name=value` line per label, as NFD's local source reads it. */
export function labelsFile(labels: readonly Label[]): string {
  return labels.map(([n, v]) => `${n}=${v}\n`).join('');
}
