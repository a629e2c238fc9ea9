// The DeviceClasses the packages ship for DRA mode (packaging/dra/), by name, and the one table the per-MIG-profile
// classes are made from (build/deviceclasses.ts writes deviceclasses-mig.yaml from it; a unit test holds the file
// to it). `check` names from here the classes a node's devices need. Each class name mirrors the extended resource
// the device plugin advertises the same devices under, so a pod asking that resource is served through DRA:
// whole GPUs `gpu.nvidia.com` ↔ nvidia.com/gpu (NVIDIA's DRA driver's class), a MIG profile `mig-<profile, + as
// .>.nvidia.com` ↔ nvidia.com/mig-<profile, + as .> (the mixed strategy's name; a class name is a DNS subdomain,
// which has no `/`).
import { migResourceName } from '../core/mig.ts';

/** The shipped classes' files, as installed (build/package.ts installs packaging/dra/ there). */
export const CLASS_DOCS_DIR = '/usr/share/doc/gpu-device-plugin/dra';
export const WHOLE_GPU_FILE = 'deviceclass.yaml';
export const MIG_FILE = 'deviceclasses-mig.yaml';
export const SHARING_FILE = 'deviceclasses-sharing.yaml';

export const WHOLE_GPU_CLASS = 'gpu.nvidia.com';
export const WHOLE_GPU_RESOURCE = 'nvidia.com/gpu';
/** Whole GPUs with NVIDIA's GpuConfig asking time-slicing, and MPS: claims share them, no extended resource. */
export const TIME_SLICED_CLASS = 'time-sliced.gpu.nvidia.com';
export const MPS_CLASS = 'mps.gpu.nvidia.com';

/**
 * The MIG profiles of the GPUs NVIDIA ships with MIG, full compute instances only (those DRA mode publishes),
 * as NVML names them: NVIDIA's MIG user guide and the profiles nvidia-mig-parted's default configuration
 * partitions each GPU into.
 */
export const MIG_PROFILES: readonly { readonly gpus: string; readonly profiles: readonly string[] }[] = [
  { gpus: 'A30-24GB', profiles: ['1g.6gb', '1g.6gb+me', '2g.12gb', '2g.12gb+me', '4g.24gb'] },
  { gpus: 'A100-40GB', profiles: ['1g.5gb', '1g.5gb+me', '1g.10gb', '2g.10gb', '3g.20gb', '4g.20gb', '7g.40gb'] },
  {
    gpus: 'A100-80GB, H100-80GB',
    profiles: ['1g.10gb', '1g.10gb+me', '1g.20gb', '2g.20gb', '3g.40gb', '4g.40gb', '7g.80gb'],
  },
  {
    gpus: 'H100-94GB (H100 NVL)',
    profiles: ['1g.12gb', '1g.12gb+me', '1g.24gb', '1g.24gb+me', '2g.24gb', '3g.47gb', '4g.47gb', '7g.94gb'],
  },
  {
    gpus: 'H100-96GB (GH200), H20',
    profiles: ['1g.12gb', '1g.12gb+me', '1g.24gb', '1g.24gb+me', '2g.24gb', '3g.48gb', '4g.48gb', '7g.96gb'],
  },
  {
    gpus: 'H200-141GB',
    profiles: ['1g.18gb', '1g.18gb+me', '1g.35gb', '2g.35gb', '3g.71gb', '4g.71gb', '7g.141gb'],
  },
  { gpus: 'B200', profiles: ['1g.23gb', '1g.23gb+me', '1g.45gb', '2g.45gb', '3g.90gb', '4g.90gb', '7g.180gb'] },
  { gpus: 'GB200', profiles: ['1g.23gb', '1g.23gb+me', '1g.47gb', '2g.47gb', '3g.93gb', '4g.93gb', '7g.186gb'] },
];

/** A MIG profile's extended resource, as the mixed strategy names it (`1g.10gb+me` → nvidia.com/mig-1g.10gb.me). */
export function migClassResource(profile: string): string {
  return migResourceName(profile);
}

/** The DeviceClass of a MIG profile: its resource's name after `nvidia.com/`, then `.nvidia.com`. */
export function migClassName(profile: string): string {
  return `${migClassResource(profile).replace(/^nvidia\.com\//, '')}.nvidia.com`;
}

/** Every profile of the table once, each with the GPUs that have it, in the table's order. */
export function shippedMigProfiles(): { profile: string; gpus: string[] }[] {
  const out = new Map<string, string[]>();
  for (const row of MIG_PROFILES)
    for (const p of row.profiles) out.set(p, [...(out.get(p) ?? []), ...row.gpus.split(', ')]);
  return [...out].map(([profile, gpus]) => ({ profile, gpus }));
}
