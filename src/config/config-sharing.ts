// The config file's `sharing` section (NVIDIA's ReplicatedResources under `timeSlicing` or `mps`: one or
// the other) and its pattern-renaming `resources` section, which is refused; every value checked with
// its key path.
import { MPS_CLIENTS_FROM_VOLTA } from '../core/mps.ts';
import { GPU_RESOURCE, MAX_REPLICAS, NO_SHARING, qualifyResourceName } from '../core/sharing.ts';
import type { DeviceSelection, GpuRef, Sharing, TimeSlicedResource, TimeSlicing } from '../core/sharing.ts';
import { showValue } from './config-reader.ts';
import type { Reader } from './config-reader.ts';

const MIG_REF = /^(\d+:\d+|MIG-.*)$/;
/** A MIG resource of the mixed strategy: nvidia.com/mig-<profile> with + written as '.'. */
const MIG_RESOURCE = /^nvidia\.com\/mig-(\d+c\.)?\d+g\.\d+gb(\.[a-z][a-z.]*|-me)?$/;
const GPU_UUID = /^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

function deviceSelection(r: Reader, v: unknown, path: string, mps: boolean): DeviceSelection {
  if (v === null || v === undefined) return { kind: 'all' };
  if (typeof v === 'string') {
    if (v === 'all') return { kind: 'all' };
    r.fail(path, `${showValue(v)} is not allowed; expected "all", a number of GPUs, or a list of GPU indices or UUIDs`);
  }
  if (typeof v === 'number') {
    if (!Number.isInteger(v) || v < 1)
      r.fail(path, `${showValue(v)} is not allowed; a number of GPUs must be a whole number of at least 1`);
    return { kind: 'count', count: v };
  }
  if (!Array.isArray(v))
    r.fail(path, `${showValue(v)} is not allowed; expected "all", a number of GPUs, or a list of GPU indices or UUIDs`);
  if (v.length === 0)
    r.fail(
      path,
      'an empty list selects no GPU; expected at least one GPU index or UUID (leave devices out for all GPUs)',
    );
  const refs: GpuRef[] = v.map((item: unknown, i): GpuRef => {
    const at = `${path}[${i}]`;
    if (typeof item === 'number' && Number.isInteger(item) && item >= 0) return { index: item };
    if (typeof item === 'string') {
      if (/^(0|[1-9]\d*)$/.test(item)) return { index: Number(item) };
      if (GPU_UUID.test(item)) return { uuid: item };
      if (MIG_REF.test(item) && mps)
        r.fail(
          at,
          `${showValue(item)} is a MIG device; sharing using MPS is ` +
            `not supported for MIG devices: name GPUs by index or GPU UUID`,
        );
      if (MIG_REF.test(item))
        r.fail(
          at,
          `${showValue(item)} is a MIG device; MIG devices are not selected one by one (a MIG ` +
            `resource is time-sliced whole: leave devices out), and GPUs are named by index or GPU UUID`,
        );
    }
    return r.fail(
      at,
      `${showValue(item)} is not allowed; expected a GPU index (0, 1, ` +
        `...) or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)`,
    );
  });
  return { kind: 'list', refs };
}

function resourceName(r: Reader, v: unknown, path: string): string {
  if (typeof v !== 'string')
    r.fail(path, `${showValue(v)} is not allowed; expected a resource name such as gpu or ${GPU_RESOURCE}`);
  const q = qualifyResourceName(v);
  if ('problem' in q) r.fail(path, q.problem);
  return q.name;
}

/**
 * MPS replicas per GPU: at least 2, as NVIDIA's config v1 asks of every replicated resource ("number
 * of replicas must be >= 2"; one client would be the whole GPU behind a daemon), and at most the 48
 * clients an MPS server takes on any GPU (core/mps.ts; a pre-Volta GPU's 16 is checked against the
 * node). Time-slicing keeps accepting 1 to MAX_REPLICAS, as this plugin always has.
 */
const MPS_MIN_REPLICAS = 2;

/** `sharing.timeSlicing` or `sharing.mps`: the same shape (NVIDIA's ReplicatedResources); null when absent. */
function replicated(r: Reader, v: unknown, path: string, mps: boolean): TimeSlicing | null {
  const ts = r.mapping(v, path);
  if (ts === null) return null;
  const what = mps ? 'MPS' : 'time-slicing';
  r.keys(ts, path, ['renameByDefault', 'failRequestsGreaterThanOne', 'resources']);
  const list = ts.resources;
  const lpath = `${path}.resources`;
  if (list === undefined || list === null)
    r.fail(lpath, `missing; ${what} needs at least one resource, e.g. [{name: nvidia.com/gpu, replicas: 4}]`);
  if (!Array.isArray(list)) r.fail(lpath, `${showValue(list)} is not allowed; expected a list of resources`);
  if (list.length === 0)
    r.fail(
      lpath,
      'an empty list is not allowed; expected at least one resource, e.g. {name: nvidia.com/gpu, replicas: 4}',
    );
  const [min, max] = mps ? [MPS_MIN_REPLICAS, MPS_CLIENTS_FROM_VOLTA] : [1, MAX_REPLICAS];
  const range = mps
    ? `an integer from ${min} to ${max} (an MPS server takes at most ${max} clients per GPU; 16 before Volta)`
    : `an integer from ${min} to ${max}`;
  const resources = list.map((item: unknown, i): TimeSlicedResource => {
    const at = `${lpath}[${i}]`;
    const m = r.mapping(item, at);
    if (m === null) return r.fail(at, 'null is not allowed; expected a mapping with name and replicas');
    r.keys(m, at, ['name', 'rename', 'replicas', 'devices']);
    if (m.name === undefined || m.name === null)
      r.fail(`${at}.name`, `missing; expected the resource to share, ${GPU_RESOURCE}`);
    const name = resourceName(r, m.name, `${at}.name`);
    if (mps && name !== GPU_RESOURCE) {
      // NVIDIA: MPS shares full GPUs under nvidia.com/gpu only ("not supported for MIG devices").
      const mig = MIG_RESOURCE.test(name) ? ' (sharing using MPS is not supported for MIG devices)' : '';
      r.fail(
        `${at}.name`,
        `${showValue(m.name)} is not allowed${mig}; MPS shares whole GPUs: expected ${GPU_RESOURCE} (or gpu)`,
      );
    }
    if (name !== GPU_RESOURCE && !MIG_RESOURCE.test(name)) {
      r.fail(
        `${at}.name`,
        `${showValue(m.name)} is not allowed; expected ${GPU_RESOURCE} (or gpu), ` +
          `or a MIG resource of the mixed strategy such as nvidia.com/mig-1g.10gb`,
      );
    }
    const rename =
      m.rename === undefined || m.rename === null || m.rename === '' ? null : resourceName(r, m.rename, `${at}.rename`);
    const rep = m.replicas;
    if (rep === undefined || rep === null) r.fail(`${at}.replicas`, `missing; expected ${range}`);
    if (typeof rep !== 'number' || !Number.isInteger(rep) || rep < min || rep > max) {
      r.fail(`${at}.replicas`, `${showValue(rep)} is not allowed; expected ${range}`);
    }
    return { name, rename, replicas: rep, devices: deviceSelection(r, m.devices, `${at}.devices`, mps) };
  });
  return {
    renameByDefault: r.bool(ts.renameByDefault, `${path}.renameByDefault`) ?? false,
    // NVIDIA's default: false for time-slicing, true for MPS (api/config/v1/config.go).
    failRequestsGreaterThanOne: r.bool(ts.failRequestsGreaterThanOne, `${path}.failRequestsGreaterThanOne`) ?? mps,
    resources,
  };
}

export function sharingSection(r: Reader, v: unknown): Sharing {
  const m = r.mapping(v, 'sharing');
  if (m === null) return NO_SHARING;
  r.keys(m, 'sharing', ['timeSlicing', 'mps']);
  const timeSlicing = replicated(r, m.timeSlicing, 'sharing.timeSlicing', false);
  const mps = replicated(r, m.mps, 'sharing.mps', true);
  if (mps === null) return { timeSlicing };
  // NVIDIA's plugin quietly lets MPS win over time-slicing; a file asking for both is refused here.
  if (timeSlicing !== null)
    r.fail('sharing.mps', 'MPS and time-slicing exclude each other; keep sharing.mps or sharing.timeSlicing, not both');
  return { timeSlicing: null, mps };
}

export function patternResources(r: Reader, v: unknown): void {
  const m = r.mapping(v, 'resources');
  if (m === null) return;
  r.keys(m, 'resources', ['gpus', 'mig']);
  for (const k of ['gpus', 'mig']) {
    const list = m[k];
    if (list === undefined || list === null || (Array.isArray(list) && list.length === 0)) continue;
    r.fail(
      `resources.${k}`,
      "renaming resources by pattern is not supported (NVIDIA's plugin ignores this section " +
        'too); remove it, or rename shared GPUs with sharing.timeSlicing.resources[].rename',
    );
  }
}
