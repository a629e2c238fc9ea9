// GetPreferredAllocation: validate the kubelet's question and answer it. Whole GPUs go to a GPU
// chooser working on GPU positions (the exact topology policy in production). Replicas
// (time-slicing) are picked one at a time by the shared-devices allocation policy: `distributed`
// takes the next replica from the GPU with the fewest replicas in use, `packed` from the GPU with
// the most that still has one free. MIG devices are picked the same way by parent GPU (`packed`
// fills one GPU's MIG devices before the next, keeping other GPUs free for large profiles), within
// one NUMA node when one can hold the whole answer. Pure.
import type { DeviceIndex } from './allocate.ts';
import type { AdvertisedDevice } from './devices.ts';
import { showId } from './allocate.ts';
import { RequestError } from './request-error.ts';
import type { SharedAllocationPolicy } from './sharing.ts';

export interface GpuChooser {
  /** Picks `size` GPU positions from `available` that include all of `mustInclude`; sorted ascending. */
  choose(available: readonly number[], mustInclude: readonly number[], size: number): number[];
}

/** The plain choice: the must-include GPUs, then the lowest available positions. */
export const lowestFirstChooser: GpuChooser = {
  choose(available, mustInclude, size) {
    const chosen = new Set(mustInclude);
    for (const g of [...available].sort((a, b) => a - b)) {
      if (chosen.size >= size) break;
      chosen.add(g);
    }
    return [...chosen].sort((a, b) => a - b);
  },
};

export interface PreferredQuestion {
  readonly available_deviceIDs: readonly string[];
  readonly must_include_deviceIDs: readonly string[];
  readonly allocation_size: number;
}

function positions(ids: readonly string[], what: string, ci: number, index: DeviceIndex): number[] {
  const seen = new Set<string>();
  return ids.map((id) => {
    const dev = index.byId.get(id);
    if (dev === undefined)
      throw new RequestError(
        `container request ${ci}: ${what} device ID ${showId(id)} is not one this plugin advertises`,
      );
    if (seen.has(id))
      throw new RequestError(`container request ${ci}: ${what} device ID ${showId(id)} is listed twice`);
    seen.add(id);
    return dev.gpu;
  });
}

/**
 * Picks `size` IDs from `available` including every one of `mustInclude`, for a resource whose GPUs
 * have several IDs (replicas). A GPU's replicas in use are those it advertises minus those the kubelet
 * says are available, plus those picked so far (must-include first). One ID at a time: `distributed`
 * picks from the GPU with the fewest in use, `packed` from the one with the most; ties go to the
 * lower GPU position, and within a GPU the lowest replica comes first. The answer is in advertised
 * order. Inputs are assumed checked (known, distinct IDs; mustInclude within available; size fits).
 */
export function chooseReplicas(
  available: readonly string[],
  mustInclude: readonly string[],
  size: number,
  index: DeviceIndex,
  policy: SharedAllocationPolicy,
  groupOf?: (d: AdvertisedDevice) => number,
): string[] {
  const group = groupOf ?? ((d: AdvertisedDevice) => d.gpu);
  const gpuOf = (id: string): number => {
    const d = index.byId.get(id);
    if (d === undefined) throw new Error(`device ID ${showId(id)} is not advertised`);
    return group(d);
  };
  let perGroup: ReadonlyMap<number, number> = index.perGpu;
  if (groupOf !== undefined) {
    const counts = new Map<number, number>();
    for (const d of index.byId.values()) counts.set(group(d), (counts.get(group(d)) ?? 0) + 1);
    perGroup = counts;
  }
  const order = (id: string): number => index.order.get(id) ?? Number.MAX_SAFE_INTEGER;
  const inUse = new Map<number, number>();
  const free = new Map<number, string[]>();
  for (const id of available) {
    const g = gpuOf(id);
    const list = free.get(g);
    if (list === undefined) free.set(g, [id]);
    else list.push(id);
  }
  for (const [g, ids] of free) {
    inUse.set(g, (perGroup.get(g) ?? ids.length) - ids.length);
    ids.sort((a, b) => order(a) - order(b));
  }
  const chosen = new Set<string>();
  const left = new Map<number, number>();
  for (const [g, ids] of free) left.set(g, ids.length);
  const next = new Map<number, number>();
  const take = (id: string): void => {
    const g = gpuOf(id);
    chosen.add(id);
    inUse.set(g, (inUse.get(g) ?? 0) + 1);
    left.set(g, (left.get(g) ?? 1) - 1);
  };
  for (const id of mustInclude) take(id);
  while (chosen.size < size) {
    let best: number | undefined;
    for (const g of free.keys()) {
      if ((left.get(g) ?? 0) <= 0) continue;
      if (best === undefined) {
        best = g;
        continue;
      }
      const a = inUse.get(g) ?? 0;
      const b = inUse.get(best) ?? 0;
      const better = policy === 'packed' ? a > b : a < b;
      if (better || (a === b && g < best)) best = g;
    }
    if (best === undefined) throw new Error(`no available device left after ${chosen.size} of ${size}`);
    const ids = free.get(best) ?? [];
    let at = next.get(best) ?? 0;
    while (at < ids.length && chosen.has(ids[at] as string)) at++;
    const id = ids[at];
    if (id === undefined) throw new Error(`GPU position ${best} has no free replica left`);
    next.set(best, at + 1);
    take(id);
  }
  return [...chosen].sort((a, b) => order(a) - order(b));
}

/**
 * Picks MIG devices (or replicas of them): within one NUMA node when one holds every must-include
 * device and enough available ones (packed takes the node with fewest available, keeping fuller
 * nodes free; distributed the one with most; ties to the lower node), then by `policy` over parent
 * GPUs — for replicas, over MIG devices, as replicas of whole GPUs are spread over GPUs.
 */
export function chooseMigDevices(
  available: readonly string[],
  mustInclude: readonly string[],
  size: number,
  index: DeviceIndex,
  policy: SharedAllocationPolicy,
): string[] {
  const dev = (id: string): AdvertisedDevice => {
    const d = index.byId.get(id);
    if (d === undefined) throw new Error(`device ID ${showId(id)} is not advertised`);
    return d;
  };
  const numa = (id: string): number => index.gpus[dev(id).gpu]?.numaNode ?? -1;
  const mustNodes = new Set(mustInclude.map(numa));
  const byNode = new Map<number, string[]>();
  for (const id of available) {
    const n = numa(id);
    byNode.set(n, [...(byNode.get(n) ?? []), id]);
  }
  let best: { node: number; ids: string[] } | undefined;
  for (const [node, ids] of [...byNode].sort((a, b) => a[0] - b[0])) {
    if (ids.length < size || (mustNodes.size > 0 && !(mustNodes.size === 1 && mustNodes.has(node)))) continue;
    const better =
      best === undefined || (policy === 'packed' ? ids.length < best.ids.length : ids.length > best.ids.length);
    if (better) best = { node, ids };
  }
  const pool = best?.ids ?? available;
  const groupOf = index.shared
    ? (d: AdvertisedDevice) => (d.mig === undefined ? -1 - d.gpu : (index.migGroups?.get(d.mig) ?? -1 - d.gpu))
    : (d: AdvertisedDevice) => d.gpu;
  return chooseReplicas(pool, mustInclude, size, index, policy, groupOf);
}

/**
 * Answers every container request, in order. Throws RequestError for impossible questions. Whole
 * GPUs go to `chooser`; a resource with replicas uses `policy` (default distributed).
 */
export function preferredAllocation(
  containers: readonly PreferredQuestion[],
  index: DeviceIndex,
  chooser: GpuChooser,
  policy: SharedAllocationPolicy = 'distributed',
): string[][] {
  if (containers.length === 0)
    throw new RequestError('GetPreferredAllocation request has no container requests; expected one per container');
  if (containers.length > Math.max(index.byId.size, 1)) {
    throw new RequestError(
      `GetPreferredAllocation request has ${containers.length} container ` +
        `requests, more than the ${index.byId.size} devices this plugin advertises`,
    );
  }
  return containers.map((c, ci) => {
    const size = c.allocation_size;
    const avail = c.available_deviceIDs;
    if (!Number.isInteger(size) || size < 1) {
      throw new RequestError(
        `container request ${ci}: allocation_size ${size} is not ` +
          `allowed; expected 1 to ${avail.length} (the available devices)`,
      );
    }
    if (avail.length > index.byId.size) {
      throw new RequestError(
        `container request ${ci}: ${avail.length} available device ` +
          `IDs, more than the ${index.byId.size} this plugin advertises`,
      );
    }
    const availGpus = positions(avail, 'available', ci, index);
    const mustGpus = positions(c.must_include_deviceIDs, 'must-include', ci, index);
    const availSet = new Set(avail);
    for (const id of c.must_include_deviceIDs) {
      if (!availSet.has(id))
        throw new RequestError(
          `container request ${ci}: must-include device ID ${showId(id)} is not among the available devices`,
        );
    }
    if (size < mustGpus.length) {
      throw new RequestError(
        `container request ${ci}: allocation_size ${size} is smaller than the ${mustGpus.length} must-include devices`,
      );
    }
    if (size > availGpus.length) {
      throw new RequestError(
        `container request ${ci}: allocation_size ${size} is larger than the ${availGpus.length} available devices`,
      );
    }
    if (index.mig === true) return chooseMigDevices(avail, c.must_include_deviceIDs, size, index, policy);
    if (index.shared) return chooseReplicas(avail, c.must_include_deviceIDs, size, index, policy);
    // Whole GPUs: one advertised ID per GPU position, so positions map back one to one.
    const idOf = new Map<number, string>();
    for (const [i, id] of avail.entries()) idOf.set(availGpus[i] as number, id);
    const chosen = chooser.choose(availGpus, mustGpus, size);
    return chosen.map((g) => {
      const id = idOf.get(g);
      if (id === undefined) throw new Error(`GPU chooser returned position ${g}, which was not available`);
      return id;
    });
  });
}
