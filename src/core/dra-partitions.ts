// Dynamic MIG in the node's pool, pure: each GPU that is in MIG mode and whose profiles and placements NVML gave
// (the settings' partitionable GPUs: on only with the config file's `dra.dynamicMig`) is published as NVIDIA's
// DRA driver publishes it for partitionable devices — its counter set (core/dynamic-mig.ts) in slices of counter
// sets alone, at most 8 per slice, and one device per profile and placement that fits beside the instances the
// GPU already has (those stay published as today's MIG devices and are never touched), with the parent's
// attributes and its health as taints, consuming its counters and memory slices. An instance the package made
// for a claim (the snapshot's claimedPartitions) is no such obstacle: it stays the partition it was allocated as,
// consuming its counters, so the pool does not change under a prepared claim; its taints are its MIG device's.
import type { DeviceAttribute, SliceDevice } from './dra-wire.ts';
import type { Gpu } from './devices.ts';
import { counterSetSlices, foreignInstances, gpuCounterSet, partitionDevices } from './dynamic-mig.ts';
import type { CounterSet, PartitionableGpu } from './dynamic-mig.ts';

export interface PartitionPool {
  /** Counter sets cut into slices of their own. */
  readonly counterSets: readonly (readonly CounterSet[])[];
  /** Each partitionable GPU's partition devices, by its position in the snapshot's GPUs. */
  readonly devices: ReadonlyMap<number, readonly SliceDevice[]>;
}

/**
 * The partitionable GPUs' counter sets and devices. `attributes(gpu)` gives what a MIG device of the GPU carries
 * from it (productName, versions, PCI) and `taints(gpu, device)` a device's health: its GPU's, or for a claimed
 * partition whose instance exists, that MIG device's (as for the GPU's static MIG devices).
 */
export function partitionPool(
  gpus: readonly Gpu[],
  migOn: (position: number) => boolean,
  partitionable: ReadonlyMap<string, PartitionableGpu>,
  attributes: (gpu: Gpu) => Readonly<Record<string, DeviceAttribute>>,
  taints: (gpu: Gpu, device: string) => SliceDevice['taints'],
  claimed: ReadonlySet<string> = new Set(),
): PartitionPool {
  const sets: CounterSet[] = [];
  const devices = new Map<number, SliceDevice[]>();
  gpus.forEach((gpu, position) => {
    const p = partitionable.get(gpu.uuid);
    if (p === undefined || !migOn(position) || p.profiles.length === 0) return;
    const parentAttributes = { ...attributes(gpu), parentUUID: { string: gpu.uuid } };
    const instances = foreignInstances({ minor: gpu.minor, ...p }, claimed);
    const model = { minor: gpu.minor, profiles: p.profiles, instances, parentAttributes };
    sets.push(gpuCounterSet(model));
    const withTaints = (d: SliceDevice): SliceDevice => {
      const t = taints(gpu, d.name) ?? [];
      return t.length > 0 ? { ...d, taints: t } : d;
    };
    devices.set(position, partitionDevices(model).map(withTaints));
  });
  return { counterSets: counterSetSlices(sets), devices };
}
