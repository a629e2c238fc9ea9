// What a GPU watcher (the NVML event worker, in practice) reports, as plain data: the events it saw,
// batched with their counts, and each round of probes. The health tracker (health-tracker.ts) turns them
// into health transitions.

/** The `gpu` of an event that names a device this plugin does not manage (NVML's own, or another's). */
export const UNMANAGED_DEVICE = -1;

/**
 * What a GPU watcher reports (the NVML event worker, in practice), as plain data. gpu: the UUID of
 * the GPU the event names (the watcher translates the thread's positions in its own list); null:
 * the event named no device (all GPUs); UNMANAGED_DEVICE: a device not managed.
 */
export type WatchedEvent =
  /** gi/ci: the MIG device the XID names (0xFFFFFFFF: the whole GPU); absent from pre-MIG drivers. */
  | { kind: 'xid'; gpu: string | null | typeof UNMANAGED_DEVICE; xid: number; gi?: number; ci?: number }
  | { kind: 'ecc-double'; gpu: string | null | typeof UNMANAGED_DEVICE }
  | { kind: 'ecc-single'; gpu: string | null | typeof UNMANAGED_DEVICE };

/** Identical events of one batch travel once, with how many there were (a storm is mostly repeats). */
export interface EventBatchEntry {
  event: WatchedEvent;
  count: number;
}

/** A probe's answer for one GPU: 'lost' is GPU_IS_LOST; 'error' any other failure (no verdict). */
export type ProbeResult = 'ok' | 'lost' | 'error';

/** One round of probes: each watched GPU's answer, by its UUID. */
export type ProbeRound = ReadonlyMap<string, ProbeResult>;
