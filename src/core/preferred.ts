// GetPreferredAllocation: validate the kubelet's question and answer it with a GPU chooser.
// The chooser works on GPU positions, so the same policy serves whole GPUs now and derived
// devices (replicas, MIG) later. Pure.
import type { DeviceIndex } from './allocate.ts';
import { showId } from './allocate.ts';
import { RequestError } from './request-error.ts';

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
    if (dev === undefined) throw new RequestError(`container request ${ci}: ${what} device ID ${showId(id)} is not one this plugin advertises`);
    if (seen.has(id)) throw new RequestError(`container request ${ci}: ${what} device ID ${showId(id)} is listed twice`);
    seen.add(id);
    return dev.gpu;
  });
}

/** Answers every container request, in order. Throws RequestError for impossible questions. */
export function preferredAllocation(
  containers: readonly PreferredQuestion[],
  index: DeviceIndex,
  chooser: GpuChooser,
): string[][] {
  if (containers.length === 0) throw new RequestError('GetPreferredAllocation request has no container requests; expected one per container');
  if (containers.length > Math.max(index.byId.size, 1)) {
    throw new RequestError(`GetPreferredAllocation request has ${containers.length} container requests, more than the ${index.byId.size} devices this plugin advertises`);
  }
  return containers.map((c, ci) => {
    const size = c.allocation_size;
    const avail = c.available_deviceIDs;
    if (!Number.isInteger(size) || size < 1) {
      throw new RequestError(`container request ${ci}: allocation_size ${size} is not allowed; expected 1 to ${avail.length} (the available devices)`);
    }
    if (avail.length > index.byId.size) {
      throw new RequestError(`container request ${ci}: ${avail.length} available device IDs, more than the ${index.byId.size} this plugin advertises`);
    }
    const availGpus = positions(avail, 'available', ci, index);
    const mustGpus = positions(c.must_include_deviceIDs, 'must-include', ci, index);
    const availSet = new Set(avail);
    for (const id of c.must_include_deviceIDs) {
      if (!availSet.has(id)) throw new RequestError(`container request ${ci}: must-include device ID ${showId(id)} is not among the available devices`);
    }
    if (size < mustGpus.length) {
      throw new RequestError(`container request ${ci}: allocation_size ${size} is smaller than the ${mustGpus.length} must-include devices`);
    }
    if (size > availGpus.length) {
      throw new RequestError(`container request ${ci}: allocation_size ${size} is larger than the ${availGpus.length} available devices`);
    }
    // Whole GPUs: one advertised ID per GPU position, so positions map back one to one.
    const idOf = new Map<number, string>();
    avail.forEach((id, i) => idOf.set(availGpus[i] as number, id));
    const chosen = chooser.choose(availGpus, mustGpus, size);
    return chosen.map((g) => {
      const id = idOf.get(g);
      if (id === undefined) throw new Error(`GPU chooser returned position ${g}, which was not available`);
      return id;
    });
  });
}
