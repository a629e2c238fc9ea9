// Health: which health units an event concerns. A unit is a GPU (by its UUID) or a MIG device (by its MIG UUID).
import type { Gpu } from './devices.ts';
import type { MigLayout } from './mig.ts';

/** The instance id NVML puts in an event that concerns the whole GPU. */
export const WHOLE_GPU_INSTANCE = 0xffffffff;

/** A GPU and every MIG device on it (UUIDs; the GPU first). */
export function unitsOfGpu(gpus: readonly Gpu[], layout: MigLayout, uuid: string): string[] {
  const pos = gpus.findIndex((g) => g.uuid === uuid);
  const out = [uuid];
  if (pos >= 0) for (const m of layout.devices) if (m.parent === pos) out.push(m.uuid);
  return out;
}

/** The units an event concerns, or why it concerns none (the GI/CI it names is no MIG device known here). */
export type EventTargets = { readonly units: readonly string[] } | { readonly unknown: string };

/**
 * The units an event on GPU `uuid` concerns. An event naming a MIG device (GI/CI) concerns that
 * device only; one for the whole GPU (0xFFFFFFFF, or absent) the GPU and every MIG device on it.
 * On a GPU whose MIG mode was not read (--mig-strategy=none: it is served whole, MIG mode or not),
 * an event naming a MIG device concerns the GPU itself, as NVIDIA's plugin has it. Otherwise a
 * GI/CI this layout does not know concerns nothing known: the caller looks at the MIG layout again
 * and asks once more.
 */
export function eventUnits(
  gpus: readonly Gpu[],
  layout: MigLayout,
  uuid: string,
  gi: number | undefined,
  ci: number | undefined,
): EventTargets {
  const pos = gpus.findIndex((g) => g.uuid === uuid);
  if (gi === undefined || gi === WHOLE_GPU_INSTANCE || layout.modes[pos] == null)
    return { units: unitsOfGpu(gpus, layout, uuid) };
  const hits = layout.devices
    .filter((m) => m.parent === pos && m.gi === gi && (ci === undefined || ci === WHOLE_GPU_INSTANCE || m.ci === ci))
    .map((m) => m.uuid);
  if (hits.length > 0) return { units: hits };
  return {
    unknown:
      `GPU instance ${gi}${ci === undefined || ci === WHOLE_GPU_INSTANCE ? '' : `, compute instance ${ci}`} ` +
      `is no MIG device known on this GPU`,
  };
}
