// What the GPU health thread reports, in the watcher's event shapes (core/health-events.ts); GPUs by UUID
// (watcher.ts translates the thread's positions in the list it was started with).
import { UNMANAGED_DEVICE } from '../core/health-events.ts';
import type { EventBatchEntry, ProbeResult, ProbeRound, WatchedEvent } from '../core/health-events.ts';
export type { EventBatchEntry, ProbeResult, ProbeRound, WatchedEvent };
export { UNMANAGED_DEVICE };

/** NVML event type bits (nvmlEventType*). */
export const EVENT_TYPES = {
  eccSingle: 0x1,
  eccDouble: 0x2,
  xid: 0x8,
} as const;

export interface WatchedGpu {
  /** NVML's index of the GPU (what nvmlDeviceGetHandleByIndex_v2 takes). */
  nvmlIndex: number;
  uuid: string;
}
