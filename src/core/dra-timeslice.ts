// Time-slicing under DRA, per GPU: which interval each GPU must have while its claims are prepared, whether
// a claim may be prepared beside the ones already there, and the nvidia-smi runs that take the GPUs from
// the intervals they have to the ones they must have. A GPU has one interval for every process on it, so
// every claim that time-slices a GPU asks the same interval; a GPU no claim time-slices is at Default,
// which is also where the driver starts it.

import type { TimeSliceInterval } from './dra-gpu-config.ts';

export type { TimeSliceInterval };

export const TIME_SLICE_INTERVALS: readonly TimeSliceInterval[] = ['Default', 'Short', 'Medium', 'Long'];

/**
 * The number `nvidia-smi compute-policy --set-timeslice` takes for an interval: 0=DEFAULT, 1=SHORT,
 * 2=MEDIUM, 3=LONG, as NVIDIA's DRA driver maps its intervals.
 */
export function timeSliceNumber(interval: TimeSliceInterval): 0 | 1 | 2 | 3 {
  switch (interval) {
    case 'Default':
      return 0;
    case 'Short':
      return 1;
    case 'Medium':
      return 2;
    case 'Long':
      return 3;
  }
}

/** The arguments of the nvidia-smi run that sets one GPU's interval (NVIDIA's driver runs the same). */
export function timeSliceArgs(gpuUuid: string, interval: TimeSliceInterval): string[] {
  return ['compute-policy', '-i', gpuUuid, '--set-timeslice', String(timeSliceNumber(interval))];
}

/** One GPU of a prepared (or to-be-prepared) claim whose sharing config is TimeSlicing. */
export interface TimeSliceClaimDevice {
  readonly claimUid: string;
  readonly namespace: string;
  readonly name: string;
  /** The whole GPU's UUID (time-slices are set per GPU). */
  readonly gpuUuid: string;
  readonly interval: TimeSliceInterval;
}

/**
 * The interval each GPU must have now: the one its claims ask, and Default for every GPU of `gpus` no
 * claim names. Prepared claims never disagree on a GPU (timeSliceConflict refuses that); if a list did,
 * its first claim on the GPU would win.
 */
export function wantedTimeSlices(
  prepared: readonly TimeSliceClaimDevice[],
  gpus: readonly string[] = [],
): Map<string, TimeSliceInterval> {
  const wanted = new Map<string, TimeSliceInterval>();
  for (const device of prepared) {
    if (!wanted.has(device.gpuUuid)) wanted.set(device.gpuUuid, device.interval);
  }
  for (const gpu of gpus) {
    if (!wanted.has(gpu)) wanted.set(gpu, 'Default');
  }
  return wanted;
}

/** Why a claim cannot be prepared beside the claims already there. */
export interface TimeSliceConflict {
  readonly gpuUuid: string;
  /** The claim already holding the GPU at another interval (the candidate itself when it asks two). */
  readonly holder: TimeSliceClaimDevice;
  /** The candidate's device asking the other interval. */
  readonly asking: TimeSliceClaimDevice;
  /** Names both claims, the GPU, both intervals and what would be accepted. */
  readonly message: string;
}

const claimName = (d: TimeSliceClaimDevice): string => `${d.namespace}/${d.name} (uid ${d.claimUid})`;

function conflictText(asking: TimeSliceClaimDevice, holder: TimeSliceClaimDevice): string {
  if (holder.claimUid === asking.claimUid) {
    return (
      `claim ${claimName(asking)} asks time-slice intervals ${holder.interval} and ${asking.interval} ` +
      `on GPU ${asking.gpuUuid}; a GPU has one interval for all its processes: give the requests ` +
      'that share this GPU the same timeSlicingConfig.interval'
    );
  }
  return (
    `claim ${claimName(asking)} asks time-slice interval ${asking.interval} on GPU ${asking.gpuUuid}, ` +
    `which claim ${claimName(holder)} holds at ${holder.interval}; a GPU has one interval for all its ` +
    `processes: ask ${holder.interval} for this GPU, or prepare this claim once ${holder.namespace}/` +
    `${holder.name} is unprepared`
  );
}

/**
 * Whether `candidate` (the time-sliced devices of one claim) may be prepared beside `prepared`: null when it
 * may, else the first conflict — a GPU another claim holds at another interval, or two intervals the
 * candidate itself asks on one GPU. The candidate's own earlier entries in `prepared` (a prepare repeated)
 * are not in its way.
 */
export function timeSliceConflict(
  prepared: readonly TimeSliceClaimDevice[],
  candidate: readonly TimeSliceClaimDevice[],
): TimeSliceConflict | null {
  const holders = new Map<string, TimeSliceClaimDevice>();
  for (const device of prepared) {
    if (candidate.some((c) => c.claimUid === device.claimUid)) continue;
    if (!holders.has(device.gpuUuid)) holders.set(device.gpuUuid, device);
  }
  for (const asking of candidate) {
    const holder = holders.get(asking.gpuUuid);
    if (holder === undefined) {
      holders.set(asking.gpuUuid, asking);
      continue;
    }
    if (holder.interval !== asking.interval) {
      return { gpuUuid: asking.gpuUuid, holder, asking, message: conflictText(asking, holder) };
    }
  }
  return null;
}

/** One nvidia-smi run: a GPU taken from the interval it has to the one it must have. */
export interface TimeSliceChange {
  readonly gpuUuid: string;
  readonly from: TimeSliceInterval;
  readonly to: TimeSliceInterval;
  /** nvidia-smi's arguments for it. */
  readonly args: readonly string[];
}

/**
 * The runs that take each GPU from `current` to `wanted`, in GPU UUID order. A GPU missing from `current` is
 * at Default (where the driver starts it); one missing from `wanted` must go back to Default.
 */
export function changesToApply(
  current: ReadonlyMap<string, TimeSliceInterval>,
  wanted: ReadonlyMap<string, TimeSliceInterval>,
): TimeSliceChange[] {
  const gpus = [...new Set([...current.keys(), ...wanted.keys()])].sort();
  const changes: TimeSliceChange[] = [];
  for (const gpuUuid of gpus) {
    const from = current.get(gpuUuid) ?? 'Default';
    const to = wanted.get(gpuUuid) ?? 'Default';
    if (from !== to) changes.push({ gpuUuid, from, to, args: timeSliceArgs(gpuUuid, to) });
  }
  return changes;
}
