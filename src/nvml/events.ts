// What the NVML event worker and the main thread say to each other (plain, structured-clonable data).

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

/** gpu: a position in WorkerSettings.gpus; null: the event named no device (all GPUs); -1: a device we do not manage. */
export type WatchedEvent =
  /** gi/ci: the MIG device the XID names (0xFFFFFFFF: the whole GPU); absent from pre-MIG drivers. */
  | { kind: 'xid'; gpu: number | null; xid: number; gi?: number; ci?: number }
  | { kind: 'ecc-double'; gpu: number | null }
  | { kind: 'ecc-single'; gpu: number | null };

/** Identical events of one batch travel once, with how many there were (a storm is mostly repeats). */
export interface EventBatchEntry {
  event: WatchedEvent;
  count: number;
}

export type ProbeResult = 'ok' | 'lost' | 'error';

export type WorkerMessage =
  | { type: 'ready'; watched: number[]; unsupported: number[] }
  | { type: 'events'; events: EventBatchEntry[] }
  | { type: 'probe'; results: ProbeResult[] }
  | { type: 'log'; line: string }
  | { type: 'stopped' }
  | { type: 'failed'; message: string };
