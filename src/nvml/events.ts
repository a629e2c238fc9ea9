// What the GPU health thread reports, in the health policy's shapes (core/health.ts); positions are
// positions in the list of watched GPUs.
import type { EventBatchEntry, ProbeResult, WatchedEvent } from '../core/health.ts';
export type { EventBatchEntry, ProbeResult, WatchedEvent };

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
