// The CDI side of a dynamic MIG partition, pure: a container of the claim gets its parent GPU through the NVIDIA
// Container Toolkit's own CDI device (named, never copied: its hooks and mounts stay the toolkit's), and from the
// plugin's claim spec the two capability device nodes that open the partition's GPU and compute instance to it,
// with the partition's MIG UUID as CUDA_VISIBLE_DEVICES. A process that holds the parent's /dev/nvidia<minor> sees
// only the MIG devices whose capabilities it holds. The runtime creates the nodes inside the container (type,
// major and minor are given); nothing is made on the host.
import { CLAIM_CDI_KIND } from './dra-sharing.ts';
import type { MadePartition } from './mig-instances.ts';

/** The major of the driver's nvidia-caps devices, from /proc/devices' text; null when it has none. */
export function capsMajor(procDevices: string): number | null {
  const m = /^\s*(\d+)\s+nvidia-caps\s*$/m.exec(procDevices);
  return m === null ? null : Number(m[1]);
}

/** The CDI device name of one partition of a claim: unique across the plugin's claim specs. */
export function partitionCdiName(uid: string, device: string): string {
  return `${uid}-${device}`;
}

/** The claim's partition spec (its file's content) and the CDI IDs of its devices, one per partition. */
export function partitionCdiSpec(
  uid: string,
  made: readonly MadePartition[],
  major: number,
): { readonly ids: readonly string[]; readonly spec: object } {
  const node = (minor: number) => ({
    path: `/dev/nvidia-caps/nvidia-cap${minor}`,
    type: 'c',
    major,
    minor,
    permissions: 'rw',
  });
  const devices = made.map((p) => ({
    name: partitionCdiName(uid, p.device),
    containerEdits: {
      env: [`CUDA_VISIBLE_DEVICES=${p.uuid}`],
      deviceNodes: [node(p.giCapMinor), node(p.ciCapMinor)],
    },
  }));
  return {
    ids: devices.map((d) => `${CLAIM_CDI_KIND}=${d.name}`),
    spec: { cdiVersion: '0.6.0', kind: CLAIM_CDI_KIND, devices },
  };
}
