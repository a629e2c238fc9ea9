// DRA devices: which devices of a node are published to the API server for Dynamic Resource
// Allocation, and their names — the names NVIDIA's DRA driver gives them, so that
// DeviceClasses, claims and CEL selectors written for NVIDIA's driver keep working on our nodes.
// Pure: plain data in, plain data out.
//
// NAMES.
// * A whole GPU is `gpu-<minor>` (its /dev/nvidia<minor> number: stable across reboots and NVML
//   index changes, unlike the index).
// * A MIG device is `gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>`, the
//   profile with its dots removed and lower-cased (`1g.10gb` → `1g10gb`: gpu-0-mig-1g10gb-19-0).
//   A DRA device name must be a DNS label, which has no `+`: a profile with attributes
//   (`1g.10gb+me`) has its `+` made a `-` (gpu-0-mig-1g10gb-me-20-6). The GI profile id and the
//   placement start make the name unique on its GPU (two GPU instances of one profile never share
//   a placement) and stable across driver restarts, unlike the GI id, which NVML hands out.
//
// WHICH DEVICES.
// * --mig-strategy none: every GPU whole (MIG is not even read; a GPU left in MIG mode is published
//   whole, as the device-plugin mode advertises it).
// * single or mixed: a MIG-disabled GPU whole; a MIG-enabled GPU not at all, but its MIG devices
//   instead (a GPU in MIG mode cannot run a CUDA process on the whole GPU, so publishing it whole too
//   would offer something that cannot be used). In DRA the two strategies mean the same: the single
//   strategy's uniformity rule is about the one resource name `nvidia.com/gpu` of the device-plugin
//   API, which DRA does not have (claims select MIG devices by their `profile` attribute).
// * Only full compute instances (the compute instance has every slice of its GPU instance): a
//   sub-instance (1c.2g.20gb) would share its GPU instance's name with its siblings, and the
//   device-plugin mode does not advertise them either. A MIG-enabled GPU without MIG devices, and a
//   MIG device whose GPU-instance profile id or placement NVML could not give, are left out; a note
//   says so.
import type { Gpu } from './devices.ts';
import { canonicalProfile } from './dynamic-mig.ts';
import type { PartitionableGpu } from './dynamic-mig.ts';
import { isFullInstance } from './mig.ts';
import type { MigDevice, MigLayout, MigStrategy } from './mig.ts';

/** A DNS label (RFC 1123): what a DRA device name must be. */
export const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
export const DNS_LABEL_MAX = 63;

/** One device published through DRA. */
export interface DraDevice {
  /** The device's name in the ResourceSlice (and in allocation results). */
  readonly name: string;
  readonly kind: 'gpu' | 'mig';
  /** Position of its GPU (the parent of a MIG device) in the snapshot's gpus. */
  readonly gpu: number;
  /** Its GPU's UUID (the parent's for a MIG device). */
  readonly uuid: string;
  /** For a MIG device, the MIG device itself. */
  readonly mig?: MigDevice;
}

/** The name of a whole GPU. */
export function gpuDeviceName(gpu: Pick<Gpu, 'minor'>): string {
  return `gpu-${gpu.minor}`;
}

/**
 * The name of a MIG device, or null when it cannot be named as NVIDIA names it (NVML did not give
 * its GPU instance's profile id or placement).
 */
export function migDeviceName(
  parent: Pick<Gpu, 'minor'>,
  d: Pick<MigDevice, 'profile' | 'giProfileId' | 'placementStart'>,
): string | null {
  if (d.giProfileId === undefined || d.placementStart === undefined) return null;
  return `gpu-${parent.minor}-mig-${canonicalProfile(d.profile)}-${d.giProfileId}-${d.placementStart}`;
}

/** The node's MIG devices by their DRA names (those NVML gave a profile id and placement for). */
export function migDevicesByName(node: {
  readonly gpus: readonly Gpu[];
  readonly mig: MigLayout;
}): ReadonlyMap<string, MigDevice> {
  const out = new Map<string, MigDevice>();
  for (const d of node.mig.devices) {
    const parent = node.gpus[d.parent];
    const name = parent === undefined ? null : migDeviceName(parent, d);
    if (name !== null) out.set(name, d);
  }
  return out;
}

export interface DraDeviceList {
  readonly devices: readonly DraDevice[];
  /** What was left out and why, one line each. */
  readonly notes: readonly string[];
}

/**
 * The DRA devices of a node (GPUs in snapshot order, each MIG-enabled GPU's MIG devices in place of
 * it), by the rules above. A name that is no DNS label of at most 63 characters, or one that
 * repeats, is a note and the device is left out (it cannot be published; the others can).
 */
export function draDevices(
  node: { readonly gpus: readonly Gpu[]; readonly mig: MigLayout },
  migStrategy: MigStrategy,
): DraDeviceList {
  const devices: DraDevice[] = [];
  const notes: string[] = [];
  const seen = new Map<string, string>();
  const add = (d: DraDevice, what: string): void => {
    if (d.name.length > DNS_LABEL_MAX || !DNS_LABEL.test(d.name)) {
      notes.push(
        `${what} is not published: its DRA device name ${JSON.stringify(d.name)} ` +
          `is not a DNS label of at most ${DNS_LABEL_MAX} characters`,
      );
      return;
    }
    const other = seen.get(d.name);
    if (other !== undefined) {
      notes.push(`${what} is not published: its DRA device name ${d.name} is already ${other}'s`);
      return;
    }
    seen.set(d.name, what);
    devices.push(d);
  };
  node.gpus.forEach((gpu, pos) => {
    const what = `GPU ${gpu.index} (${gpu.uuid})`;
    const migOn = migStrategy !== 'none' && node.mig.modes[pos]?.current === true;
    if (!migOn) {
      add({ name: gpuDeviceName(gpu), kind: 'gpu', gpu: pos, uuid: gpu.uuid }, what);
      return;
    }
    const mine = node.mig.devices.filter((d) => d.parent === pos);
    if (mine.length === 0) {
      notes.push(`${what} has MIG enabled but no MIG devices; nothing of it is published until it has some`);
      return;
    }
    for (const m of mine) {
      const mWhat = `MIG device ${m.uuid} (${m.profile} on GPU ${gpu.index})`;
      if (!isFullInstance(m)) {
        notes.push(
          `${mWhat} is not published: only full compute instances are (a sub-instance shares its GPU instance's name)`,
        );
        continue;
      }
      const name = migDeviceName(gpu, m);
      if (name === null) {
        notes.push(
          `${mWhat} is not published: NVML gave no GPU-instance ` +
            `profile id or placement for it, which its DRA name is made of`,
        );
        continue;
      }
      add({ name, kind: 'mig', gpu: pos, uuid: gpu.uuid, mig: m }, mWhat);
    }
  });
  return { devices, notes };
}

/**
 * The list without the MIG devices that stand for claimed dynamic MIG partitions (the snapshot's
 * claimedPartitions) of GPUs published as partitionable: the partition device of the same name is published in
 * their place (core/dra-partitions.ts), consuming its counters.
 */
export function withoutClaimedInstances(
  node: { readonly claimedPartitions?: ReadonlySet<string> },
  list: DraDeviceList,
  partitionable: ReadonlyMap<string, PartitionableGpu> | undefined,
): DraDeviceList {
  const claimed = node.claimedPartitions;
  if (partitionable === undefined || claimed === undefined || claimed.size === 0) return list;
  const replaced = (d: DraDevice): boolean =>
    d.mig !== undefined && claimed.has(d.name) && (partitionable.get(d.uuid)?.profiles.length ?? 0) > 0;
  return { ...list, devices: list.devices.filter((d) => !replaced(d)) };
}
