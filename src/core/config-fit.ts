// Whether the settings fit the node: the plan the daemon makes from a scan, and the reasons it refuses
// one. The daemon's snapshot (core/snapshot.ts) and `gpu-device-plugin check` both plan through
// planForNode and migCapabilitiesProblem, so a config that `check` passes is one the daemon starts
// with, and one the daemon refuses fails `check` with the same message. Pure: plain data in and out.
import type { Gpu } from './devices.ts';
import { capacityFitProblem } from './dra-capacity.ts';
import { MigStrategyError, planMigResources } from './mig-strategies.ts';
import type { MigLayout } from './mig.ts';
import type { MigPlan } from './mig-strategies.ts';
import { mpsPlanProblem } from './mps.ts';
import type { ComputeByUuid } from './mps.ts';
import { SharingError } from './sharing.ts';
import type { PlanSettings } from './snapshot.ts';

/**
 * The resources these settings advertise on these GPUs. Throws SharingError (naming the key),
 * MigStrategyError, or an Error for device IDs the kubelet would refuse. MPS replicas are checked
 * against the node (core/mps.ts mpsPlanProblem): not on MIG, and within each GPU's client limit when
 * `compute` (the node facts' compute capabilities) is given. DRA's consumable capacity must fit every GPU's
 * memory (SharingError naming its key).
 */
export function planForNode(
  gpus: readonly Gpu[],
  mig: MigLayout,
  settings: PlanSettings,
  compute?: ComputeByUuid,
): MigPlan {
  const plan = planMigResources(gpus, mig, settings.migStrategy ?? 'none', settings.deviceIdStrategy, settings.sharing);
  const mps = mpsPlanProblem(plan.resources, gpus, mig, settings.sharing, compute);
  if (mps !== null) throw mps;
  const capacity = capacityFitProblem(gpus, settings.consumableCapacity);
  if (capacity !== null) throw new SharingError(capacity.path, capacity.message);
  return plan;
}

/** Why a plan's MIG devices cannot be given their capability nodes (with --pass-device-specs), or null. */
export function migCapabilitiesProblem(
  plan: MigPlan,
  settings: PlanSettings,
  caps: { readonly problem: string } | ReadonlyMap<unknown, unknown>,
): string | null {
  const usesMig = plan.resources.some((r) => r.devices.some((d) => d.mig !== undefined));
  if (settings.needMigCapabilities !== true || !usesMig || !('problem' in caps)) return null;
  return `${caps.problem}; --pass-device-specs cannot give MIG devices their capability nodes`;
}

/** What the daemon's start decides for a node: the plan, or why it refuses to start and what is at fault. */
export type StartFit =
  | { readonly ok: true; readonly plan: MigPlan }
  | {
      readonly ok: false;
      readonly problem: string;
      /**
       * What to change: a config key path (sharing.timeSlicing…), or an option
       * (--mig-strategy, --pass-device-specs), or null for the node itself.
       */
      readonly key: string | null;
    };

/** planForNode and migCapabilitiesProblem as the first snapshot applies them: any problem stops the start. */
export function fitAtStart(
  gpus: readonly Gpu[],
  mig: MigLayout,
  settings: PlanSettings,
  caps: { readonly problem: string } | ReadonlyMap<unknown, unknown>,
  compute?: ComputeByUuid,
): StartFit {
  let plan: MigPlan;
  try {
    plan = planForNode(gpus, mig, settings, compute);
  } catch (err) {
    const problem = err instanceof Error ? err.message : String(err);
    if (err instanceof SharingError) return { ok: false, problem, key: err.path };
    if (err instanceof MigStrategyError) return { ok: false, problem, key: '--mig-strategy' };
    return { ok: false, problem, key: null };
  }
  const capsProblem = migCapabilitiesProblem(plan, settings, caps);
  if (capsProblem !== null) return { ok: false, problem: capsProblem, key: '--pass-device-specs' };
  return { ok: true, plan };
}
