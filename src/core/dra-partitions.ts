// Dynamic MIG in the node's pool, pure: each GPU that is in MIG mode and whose profiles and placements NVML gave
// (the settings' partitionable GPUs: on only with the config file's `dra.dynamicMig`) is published as NVIDIA's
// DRA driver publishes it for partitionable devices — its counter set (core/dynamic-mig.ts) in slices of counter
// sets alone, at most 8 per slice, and one device per profile and placement that fits beside the instances the
// GPU already has (those stay published as today's MIG devices and are never touched), with the parent's
// attributes and its health as taints, consuming its counters and memory slices.
import type { DeviceAttribute, SliceDevice } from './dra-wire.ts';
import type { Gpu } from './devices.ts';
import { counterSetSlices, gpuCounterSet, partitionDevices } from './dynamic-mig.ts';
import type { CounterSet, PartitionableGpu } from './dynamic-mig.ts';

export interface PartitionPool {
  /** Counter sets cut into slices of their own. */
  readonly counterSets: readonly (readonly CounterSet[])[];
  /** Each partitionable GPU's partition devices, by its position in the snapshot's GPUs. */
  readonly devices: ReadonlyMap<number, readonly SliceDevice[]>;
}

/**
 * The partitionable GPUs' counter sets and devices. `attributes(gpu)` gives what a MIG device of the GPU carries
 * from it (productName, versions, PCI) and `taints(gpu)` its health, as for the GPU's static MIG devices.
 */
export function partitionPool(
  gpus: readonly Gpu[],
  migOn: (position: number) => boolean,
  partitionable: ReadonlyMap<string, PartitionableGpu>,
  attributes: (gpu: Gpu) => Readonly<Record<string, DeviceAttribute>>,
  taints: (gpu: Gpu) => SliceDevice['taints'],
): PartitionPool {
  const sets: CounterSet[] = [];
  const devices = new Map<number, SliceDevice[]>();
  gpus.forEach((gpu, position) => {
    const p = partitionable.get(gpu.uuid);
    if (p === undefined || !migOn(position) || p.profiles.length === 0) return;
    const parentAttributes = { ...attributes(gpu), parentUUID: { string: gpu.uuid } };
    const model = { minor: gpu.minor, profiles: p.profiles, instances: p.instances, parentAttributes };
    sets.push(gpuCounterSet(model));
    const t = taints(gpu) ?? [];
    devices.set(
      position,
      partitionDevices(model).map((d) => ({ ...d, ...(t.length > 0 ? { taints: t } : {}) })),
    );
  });
  return { counterSets: counterSetSlices(sets), devices };
}
