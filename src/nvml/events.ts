// What the NVML event worker and the main thread say to each other (plain, structured-clonable data).
// The event and probe shapes are the health policy's (core/health.ts); positions are in WorkerSettings.gpus.
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

export interface WorkerSettings {
  /** The NVML library the main thread loaded (path or soname). */
  library: string;
  /** The GPUs to watch; positions in this list are the positions used in messages. */
  gpus: WatchedGpu[];
  probeIntervalMs: number;
  /** Upper bound on one blocking wait, so a stop is noticed promptly. */
  waitTimeoutMs: number;
  /** Int32 flag: non-zero asks the worker to stop. */
  stop: SharedArrayBuffer;
  logLevel: 'debug' | 'info' | 'warn' | 'error';
  journal: boolean;
}


export type WorkerMessage =
  | { type: 'ready'; watched: number[]; unsupported: number[] }
  | { type: 'events'; events: EventBatchEntry[] }
  | { type: 'probe'; results: ProbeResult[] }
  | { type: 'log'; line: string }
  /** NVML answered that the driver is gone (unloaded, version mismatch); the worker has stopped watching. */
  | { type: 'driver-gone'; message: string }
  | { type: 'stopped' }
  | { type: 'failed'; message: string };
