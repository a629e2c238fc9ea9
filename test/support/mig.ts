// MIG helpers for tests: the fake NVML's MIG UUIDs, and mig-minors as the NVIDIA driver writes it.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** GPU-instance profile ids (as nvidia-smi shows them) of the 80 GB boards the MIG fixtures use. */
export const PROFILE_ID: Readonly<Record<string, number>> = {
  '1g.10gb': 19,
  '1g.10gb+me': 20,
  '1g.20gb': 15,
  '2g.20gb': 14,
  '3g.40gb': 9,
  '4g.40gb': 5,
  '7g.80gb': 0,
};

/**
 * The fake NVML's MIG UUID: the parent's, its last six hex digits replaced by the GPU instance's
 * profile id, GI and CI (for a sub-instance, the profile of its GPU instance: 2g.20gb for 1c.2g.20gb).
 */
export function migUuid(gpuUuid: string, profile: string, gi: number, ci = 0): string {
  const id = PROFILE_ID[profile];
  if (id === undefined) throw new Error(`no profile id known for ${profile}`);
  const hex = (n: number): string => n.toString(16).padStart(2, '0');
  return `MIG-${gpuUuid.slice(4, -6)}${hex(id)}${hex(gi)}${hex(ci)}`;
}

/**
 * /proc/driver/nvidia-caps/mig-minors as the driver writes it: config 1, monitor 2, then per GPU
 * minor 15 GPU instances, each an access entry followed by 8 compute-instance entries, from minor 3
 * (so gpu0/gi1/access is 12 and gpu0/gi1/ci0/access 13).
 */
export function migMinorsText(gpuMinors: number): string {
  const lines = ['config 1', 'monitor 2'];
  for (let gpu = 0; gpu < gpuMinors; gpu++) {
    for (let gi = 0; gi < 15; gi++) {
      const base = 3 + gpu * 135 + gi * 9;
      lines.push(`gpu${gpu}/gi${gi}/access ${base}`);
      for (let ci = 0; ci < 8; ci++) lines.push(`gpu${gpu}/gi${gi}/ci${ci}/access ${base + 1 + ci}`);
    }
  }
  return `${lines.join('\n')}\n`;
}

/** Writes mig-minors under a proc root (for PROC_ROOT). */
export function writeMigMinors(procRoot: string, gpuMinors: number): void {
  mkdirSync(join(procRoot, 'driver', 'nvidia-caps'), { recursive: true });
  writeFileSync(join(procRoot, 'driver', 'nvidia-caps', 'mig-minors'), migMinorsText(gpuMinors));
}
