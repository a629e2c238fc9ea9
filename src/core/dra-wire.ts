// The shapes of what a ResourceSlice holds (resource.k8s.io/v1): a device's attributes, capacities, taints and the
// counters it consumes, and the counter sets of partitionable devices. Types only, shared by the slices
// (dra-slices.ts) and dynamic MIG (dynamic-mig.ts, dra-partitions.ts).
import type { WireRequestPolicy } from './dra-capacity.ts';

/** One attribute value: exactly one of int, bool, string, version (resource.k8s.io/v1 DeviceAttribute). */
export type DeviceAttribute =
  | { readonly int: number }
  | { readonly bool: boolean }
  | { readonly string: string }
  | { readonly version: string };

export interface DeviceTaint {
  readonly key: string;
  readonly value?: string;
  readonly effect: 'NoSchedule' | 'NoExecute' | 'None';
}

/** A capacity of a device: its value, and on a device allocated several times its request policy. */
export interface DeviceCapacity {
  readonly value: string;
  readonly requestPolicy?: WireRequestPolicy;
}

export interface Counter {
  readonly value: string;
}

export interface CounterSet {
  readonly name: string;
  readonly counters: Readonly<Record<string, Counter>>;
}

export interface DeviceCounterConsumption {
  readonly counterSet: string;
  readonly counters: Readonly<Record<string, Counter>>;
}

/** A device as written in a ResourceSlice (resource.k8s.io/v1 Device). */
export interface SliceDevice {
  readonly name: string;
  readonly attributes: Readonly<Record<string, DeviceAttribute>>;
  readonly capacity: Readonly<Record<string, DeviceCapacity>>;
  /** A dynamic MIG partition: the counters it takes from its GPU's counter set (core/dra-partitions.ts). */
  readonly consumesCounters?: readonly DeviceCounterConsumption[];
  /** Present (true) only with consumable capacity: several claims may be allocated the device at once. */
  readonly allowMultipleAllocations?: true;
  readonly taints?: readonly DeviceTaint[];
}
