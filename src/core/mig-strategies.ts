// The MIG strategies none/single/mixed with NVIDIA's validation: the resources each advertises (fed through the same
// time-slicing rules as whole GPUs), and the MIG mode changes waiting for a GPU reset. Plain data in, plain data out.
import { MAX_DEVICE_ID_LENGTH } from './devices.ts';
import type { AdvertisedDevice, DeviceIdStrategy, Gpu } from './devices.ts';
import { isFullInstance, isMigResource, migDeviceId, migResourceName } from './mig.ts';
import type { MigDevice, MigLayout, MigStrategy } from './mig.ts';
import { GPU_RESOURCE, SharingError, advertisedName, planResources, replicaId } from './sharing.ts';
import type { PlannedResource, Sharing } from './sharing.ts';

/** Start-stopping problem with the node for the chosen strategy; names the GPUs and what differs. */
export class MigStrategyError extends Error {
  override name = 'MigStrategyError';
}

export interface MigPlan {
  readonly resources: PlannedResource[];
  /** Things worth one log line each (skipped GPUs, sub-instances not advertised). */
  readonly notes: string[];
}

const enabled = (layout: MigLayout, pos: number): boolean => layout.modes[pos]?.current === true;

function gpuList(gpus: readonly Gpu[], positions: readonly number[]): string {
  return positions.map((p) => gpus[p]?.index ?? p).join(', ');
}

/**
 * Why a node is not valid for the single strategy, or null when it is (or has no MIG-enabled GPU,
 * in which case single acts like none). NVIDIA's rules: every GPU MIG-enabled, each with MIG
 * devices, all of one profile.
 */
export function singleStrategyProblem(gpus: readonly Gpu[], layout: MigLayout): string | null {
  const on = gpus.map((_, i) => i).filter((i) => enabled(layout, i));
  if (on.length === 0) return null;
  const problems: string[] = [];
  const off = gpus.map((_, i) => i).filter((i) => !enabled(layout, i));
  if (off.length > 0)
    problems.push(
      `GPU ${gpuList(gpus, off)} ${off.length === 1 ? 'has' : 'have'} MIG disabled while ` +
        `GPU ${gpuList(gpus, on)} ${on.length === 1 ? 'has' : 'have'} it enabled`,
    );
  const empty = on.filter((i) => !layout.devices.some((d) => d.parent === i));
  if (empty.length > 0)
    problems.push(`GPU ${gpuList(gpus, empty)} ${empty.length === 1 ? 'has' : 'have'} MIG enabled but no MIG devices`);
  const byProfile = new Map<string, Set<number>>();
  for (const d of layout.devices) {
    const set = byProfile.get(d.profile) ?? new Set<number>();
    set.add(d.parent);
    byProfile.set(d.profile, set);
  }
  if (byProfile.size > 1) {
    const parts = [...byProfile].map(
      ([p, g]) =>
        `${p} on GPU ${gpuList(
          gpus,
          [...g].sort((a, b) => a - b),
        )}`,
    );
    problems.push(`MIG devices differ in profile: ${parts.join('; ')}`);
  }
  if (problems.length === 0) return null;
  return (
    `--mig-strategy=single needs every GPU in MIG mode with MIG devices of one profile: ` +
    `${problems.join('; ')} (use --mig-strategy=mixed, or re-partition the GPUs alike)`
  );
}

function checkId(id: string, what: string): void {
  if (id.length === 0 || id.length > MAX_DEVICE_ID_LENGTH) {
    throw new Error(
      `${what} has device ID ${JSON.stringify(id)} of ${id.length} characters; ` +
        `the kubelet accepts 1 to ${MAX_DEVICE_ID_LENGTH}`,
    );
  }
}

/** The advertised devices of some MIG devices, with the replicas a time-slicing entry asks for. */
function migDevices(
  list: readonly { d: MigDevice; pos: number }[],
  gpus: readonly Gpu[],
  strategy: DeviceIdStrategy,
  replicas: number,
): AdvertisedDevice[] {
  const out: AdvertisedDevice[] = [];
  for (const { d } of list) {
    // Advertised by MIG UUID whatever the strategy; the runtime gets the strategy's name.
    const runtimeName = migDeviceId(d, gpus, strategy);
    const uuid = gpus[d.parent]?.uuid ?? '';
    if (replicas <= 1) {
      checkId(d.uuid, `MIG device ${d.uuid}`);
      out.push({ id: d.uuid, uuid, gpu: d.parent, runtimeName, mig: d.uuid });
      continue;
    }
    for (let n = 0; n < replicas; n++) {
      const id = replicaId(d.uuid, n);
      checkId(id, `MIG device ${d.uuid}`);
      out.push({ id, uuid, gpu: d.parent, runtimeName, replica: n, mig: d.uuid });
    }
  }
  return out;
}

/**
 * MIG devices under resource names, with the time-slicing entries that name those resources.
 * Entries for MIG resources replicate every device of the resource (`devices: all`); a selection
 * by count or list is refused naming the key. Entries for resources this node does not have change
 * nothing (a re-layout may bring them).
 */
function planMigGroups(
  groups: ReadonlyMap<string, { d: MigDevice; pos: number }[]>,
  gpus: readonly Gpu[],
  strategy: DeviceIdStrategy,
  sharing: Sharing,
  handled: (name: string) => boolean,
): PlannedResource[] {
  const ts = sharing.timeSlicing;
  const out = new Map<string, PlannedResource>();
  const sharedNames = new Set<string>();
  ts?.resources.forEach((r, k) => {
    if (!handled(r.name)) return;
    const path = `sharing.timeSlicing.resources[${k}]`;
    if (r.devices.kind !== 'all')
      throw new SharingError(
        `${path}.devices`,
        `MIG resources are time-sliced whole; expected all (or no devices key) for ${r.name}`,
      );
    if (sharedNames.has(r.name))
      throw new SharingError(`${path}.name`, `${r.name} is already time-sliced by an earlier entry`);
    sharedNames.add(r.name);
    const list = groups.get(r.name);
    if (list === undefined || list.length === 0) return;
    const target = advertisedName(r, ts.renameByDefault);
    const prev = out.get(target);
    const devices = [...(prev?.devices ?? []), ...migDevices(list, gpus, strategy, r.replicas)];
    out.set(target, {
      name: target,
      devices,
      shared: r.replicas > 1 || (prev?.shared ?? false),
      failRequestsGreaterThanOne: ts.failRequestsGreaterThanOne && r.replicas > 1,
    });
  });
  for (const [name, list] of groups) {
    if (sharedNames.has(name) || list.length === 0) continue;
    const prev = out.get(name);
    out.set(name, {
      name,
      devices: [...(prev?.devices ?? []), ...migDevices(list, gpus, strategy, 1)],
      shared: prev?.shared ?? false,
      failRequestsGreaterThanOne: prev?.failRequestsGreaterThanOne ?? false,
    });
  }
  return [...out.values()];
}

/**
 * The resources to advertise under a MIG strategy:
 * - none: MIG ignored; every GPU whole (as planResources).
 * - single: no MIG-enabled GPU → as none; otherwise the node must be uniform (MigStrategyError
 *   naming the GPUs and what differs) and every MIG device is advertised as nvidia.com/gpu.
 * - mixed: MIG-disabled GPUs whole under nvidia.com/gpu; one resource per full-compute-instance
 *   profile, nvidia.com/mig-<profile with + as .>; sub-instances (1c.2g.20gb) and MIG-enabled GPUs
 *   without MIG devices are not advertised (a note says so).
 * Time-slicing applies by resource name. Resources without devices are left out.
 */
export function planMigResources(
  gpus: readonly Gpu[],
  layout: MigLayout,
  migStrategy: MigStrategy,
  strategy: DeviceIdStrategy,
  sharing: Sharing,
): MigPlan {
  const notes: string[] = [];
  const anyEnabled = gpus.some((_, i) => enabled(layout, i));
  if (migStrategy === 'none' || !anyEnabled) {
    return { resources: planResources(gpus, strategy, sharing, { skipResource: isMigResource }), notes };
  }
  const devs = layout.devices
    .map((d, pos) => ({ d, pos }))
    .filter(({ d }) => enabled(layout, d.parent) && gpus[d.parent] !== undefined);
  if (migStrategy === 'single') {
    const problem = singleStrategyProblem(gpus, layout);
    if (problem !== null) throw new MigStrategyError(problem);
    const resources = planMigGroups(
      new Map([[GPU_RESOURCE, devs]]),
      gpus,
      strategy,
      sharing,
      (n) => n === GPU_RESOURCE,
    );
    return { resources, notes };
  }
  const whole = new Set(gpus.map((_, i) => i).filter((i) => !enabled(layout, i)));
  const isMig = isMigResource;
  const wholePlan =
    whole.size === 0 ? [] : planResources(gpus, strategy, sharing, { wholeGpus: whole, skipResource: isMig });
  const groups = new Map<string, { d: MigDevice; pos: number }[]>();
  const skipped = new Map<string, number>();
  for (const x of devs) {
    if (!isFullInstance(x.d)) {
      skipped.set(x.d.profile, (skipped.get(x.d.profile) ?? 0) + 1);
      continue;
    }
    const name = migResourceName(x.d.profile);
    const list = groups.get(name) ?? [];
    list.push(x);
    groups.set(name, list);
  }
  for (const [profile, n] of skipped)
    notes.push(
      `${n} MIG device${n === 1 ? '' : 's'} of profile ${profile} not advertised: ` +
        `the mixed strategy advertises full compute instances only`,
    );
  for (let i = 0; i < gpus.length; i++) {
    if (enabled(layout, i) && !devs.some(({ d }) => d.parent === i)) {
      notes.push(
        `GPU ${gpus[i]?.index} (${gpus[i]?.uuid}) has MIG enabled but no MIG devices; it is skipped until it has some`,
      );
    }
  }
  const migPlan = planMigGroups(groups, gpus, strategy, sharing, isMig);
  const resources = [
    ...wholePlan.filter((r) => r.devices.length > 0),
    ...migPlan.sort((a, b) => a.name.localeCompare(b.name)),
  ];
  return { resources, notes };
}

/** MIG modes where pending differs from current: logged, never acted on (a GPU reset applies them). */
export function pendingModeChanges(gpus: readonly Gpu[], layout: MigLayout): string[] {
  const out: string[] = [];
  layout.modes.forEach((m, i) => {
    if (m !== null && m !== undefined && m.current !== m.pending) {
      const g = gpus[i];
      out.push(
        `GPU ${g?.index} (${g?.uuid}): MIG mode is ${m.current ? 'enabled' : 'disabled'} now and ` +
          `${m.pending ? 'enabled' : 'disabled'} after the next GPU reset; nothing changes until then`,
      );
    }
  });
  return out;
}
