// Starts and stops the GPU health thread (our C library, src/native/nvml_watch.c) and hands what it
// reports to callbacks. The thread borrows the caller's NVML session: NVML's blocking event wait
// and the per-GPU probes run there, never on the event loop nor on libuv's shared thread pool. It
// writes fixed-size records into a pipe, read here through the event loop (a net.Socket on the
// pipe: no pool thread is involved); the layout below mirrors struct gdp_record.
import { Socket } from 'node:net';
import type { Logger } from '../system/log.ts';
import { loadWatchLibrary } from '../system/native.ts';
import type { Koffi } from '../system/native.ts';
import type { SignalName, SignalReading } from '../core/health-signals.ts';
import { NvmlError } from './errors.ts';
import type { EventBatchEntry, ProbeResult, ProbeRound, WatchedEvent, WatchedGpu } from './events.ts';
import { EVENT_TYPES, UNMANAGED_DEVICE } from './events.ts';
import type { Nvml } from './nvml.ts';
import { decodeSignalsRecord, SIGNALS_END_RECORD, SIGNALS_RECORD, signalsMask } from './signals-record.ts';

export interface EventWatcherOptions {
  /** The NVML session the thread borrows; it must stay open until stop() has resolved. */
  nvml: Nvml;
  koffi: Koffi;
  gpus: WatchedGpu[];
  probeIntervalMs: number;
  /** Upper bound on one blocking wait, so a stop is noticed promptly. */
  waitTimeoutMs: number;
  log: Logger;
  /** The thread watches these GPUs for events; the unsupported ones are watched by the probe only. */
  onReady(watched: WatchedGpu[], unsupported: WatchedGpu[]): void;
  /**
   * Events, each naming its GPU by UUID (the thread's positions translated here, from the list it was started with).
   */
  onEvents(events: EventBatchEntry[]): void;
  /** One probe round: each GPU's answer by UUID. */
  onProbe(results: ProbeRound): void;
  /** NVML said the driver is gone; the thread has stopped watching. */
  onDriverGone?(message: string): void;
  /** The health signals the thread reads with every probe and when their events arrive (default none). */
  signals?: readonly SignalName[];
  /** Readings of the signals: every GPU's after a probe, or those of the GPUs an event named; by UUID. */
  onSignals?(readings: ReadonlyMap<string, SignalReading>): void;
  /** The time a reading is stamped with, in ms (default performance.now(): only differences matter). */
  now?(): number;
}

// struct gdp_record (40 bytes) and its constants, as in src/native/nvml_watch.h.
const RECORD = 40;
const REC = {
  warnHandle: 1,
  warnRegister: 2,
  watched: 3,
  unsupported: 4,
  ready: 5,
  probe: 6,
  probeEnd: 7,
  event: 8,
  eventsEnd: 9,
  waitFailed: 10,
  driverGone: 11,
  failed: 12,
  stopped: 13,
} as const;
const FUNCTION_NAMES: Readonly<Record<number, string>> = {
  1: 'nvmlDeviceGetHandleByIndex_v2',
  2: 'nvmlDeviceGetMemoryInfo',
  3: 'nvmlEventSetCreate',
  4: 'nvmlDeviceGetSupportedEventTypes',
  5: 'nvmlDeviceRegisterEvents',
  6: 'nvmlEventSetWait_v2',
  7: 'nvmlEventSetWait',
};
const PROBE_RESULTS: readonly ProbeResult[] = ['ok', 'lost', 'error'];

type NativeFn = (...args: unknown[]) => unknown;
interface WatchApi {
  start: NativeFn;
  stop: NativeFn;
  join: NativeFn;
}
let api: WatchApi | undefined;

function watchApi(koffi: Koffi): WatchApi {
  if (api === undefined) {
    const lib = loadWatchLibrary();
    koffi.opaque('gdp_watch');
    api = {
      start: lib.func(
        'int gdp_watch_start(const char *library, const uint32_t *indices, uint32_t ' +
          'count, uint32_t probe_interval_ms, uint32_t wait_timeout_ms, int32_t ' +
          'wait_version, uint32_t signals, _Out_ gdp_watch **out, _Out_ int32_t *fd)',
      ) as NativeFn,
      stop: lib.func('void gdp_watch_stop(gdp_watch *w)') as NativeFn,
      join: lib.func('int gdp_watch_join(gdp_watch *w)') as NativeFn,
    };
  }
  return api;
}

/** The records that only log (the thread's warnings and failure), by record type. */
const LOGGED: Readonly<Record<number, { level: 'warn' | 'error'; message: string; gpu?: 'ref' | 'indexed' }>> = {
  [REC.warnHandle]: { level: 'warn', message: 'cannot watch GPU; it is reported by the probe only', gpu: 'indexed' },
  [REC.warnRegister]: { level: 'warn', message: 'cannot register for GPU events; the probe watches it', gpu: 'ref' },
  [REC.waitFailed]: { level: 'warn', message: 'NVML event wait failed; retrying' },
  [REC.failed]: { level: 'error', message: 'GPU health watcher failed; health is no longer watched' },
};

/** A record's fixed header: its type, the GPU's position in the thread's list, an NVML code and function. */
interface RecordHeader {
  type: number;
  gpu: number;
  code: number;
  func: number;
}

/** The started thread (its handle and the pipe it writes its records to), or why it could not start. */
function startThread(opts: EventWatcherOptions): { a: WatchApi; handle: unknown; fd: number } | { error: string } {
  const { nvml, log, gpus } = opts;
  // Older drivers have only the first version of the wait (same signature, shorter struct).
  const waitVersion = nvml.has('nvmlEventSetWait_v2') ? 2 : nvml.has('nvmlEventSetWait') ? 1 : 0;
  if (waitVersion === 0) log.warn('NVML has no event wait; GPUs are watched by the probe only');
  let a: WatchApi;
  try {
    a = watchApi(opts.koffi);
  } catch (err) {
    return { error: err instanceof Error ? err.message : String(err) };
  }
  const out: unknown[] = [null];
  const fd = [0];
  const rc = a.start(
    nvml.libraryPath,
    Uint32Array.from(gpus, (g) => g.nvmlIndex),
    gpus.length,
    opts.probeIntervalMs,
    opts.waitTimeoutMs,
    waitVersion,
    signalsMask(opts.signals ?? []),
    out,
    fd,
  ) as number;
  if (rc !== 0)
    return {
      error:
        `cannot start the health thread ` +
        `(errno ${rc}${rc === 2 ? ': NVML is not loaded' : rc === 38 ? ': NVML lacks a function it needs' : ''})`,
    };
  return { a, handle: out[0], fd: fd[0] ?? -1 };
}

/** Hands each whole record read from the pipe to onRecord, keeping a partial one for the next chunk. */
function readRecords(socket: Socket, onRecord: (b: Buffer, at: number) => void): void {
  let rest: Buffer | null = null;
  socket.on('data', (chunk: Buffer) => {
    const b = rest === null ? chunk : Buffer.concat([rest, chunk]);
    const whole = b.length - (b.length % RECORD);
    for (let at = 0; at < whole; at += RECORD) onRecord(b, at);
    rest = whole === b.length ? null : Buffer.from(b.subarray(whole));
  });
}

/**
 * Folds the thread's records into the callbacks: the watched and unsupported lists until ready, probe
 * results until the round ends, events until the batch ends. Logging records are logged even while
 * stopping; the rest are dropped then (they are about GPUs no longer watched).
 */
class RecordFolder {
  private readonly opts: EventWatcherOptions;
  private readonly isStopping: () => boolean;
  private readonly watched: WatchedGpu[] = [];
  private readonly unsupported: WatchedGpu[] = [];
  private probe = new Map<string, ProbeResult>();
  private batch: EventBatchEntry[] = [];
  private signals = new Map<string, SignalReading>();

  constructor(opts: EventWatcherOptions, isStopping: () => boolean) {
    this.opts = opts;
    this.isStopping = isStopping;
  }

  /** The record at `at` in `b`. */
  record(b: Buffer, at: number): void {
    const r: RecordHeader = {
      type: b.readUInt32LE(at),
      gpu: b.readInt32LE(at + 4),
      code: b.readUInt32LE(at + 8),
      func: b.readUInt32LE(at + 12),
    };
    const logged = LOGGED[r.type];
    if (logged !== undefined) {
      const gpu = logged.gpu === undefined ? {} : this.gpuRef(r.gpu);
      const index = logged.gpu === 'indexed' ? { index: this.opts.gpus[r.gpu]?.nvmlIndex ?? r.gpu } : undefined;
      this.opts.log[logged.level](logged.message, { ...gpu, error: this.error(r.func, r.code, index) });
      return;
    }
    if (r.type === REC.probe) {
      this.probed(r, b, at);
      return;
    }
    if (r.type === REC.stopped || this.isStopping()) return;
    this.fold(r, b, at);
  }

  /** A record that is not dropped while stopping, nor only logged. */
  private fold(r: RecordHeader, b: Buffer, at: number): void {
    const { opts } = this;
    const g = opts.gpus[r.gpu];
    switch (r.type) {
      case REC.watched:
        if (g !== undefined) this.watched.push(g);
        break;
      case REC.unsupported:
        if (g !== undefined) this.unsupported.push(g);
        break;
      case REC.ready:
        opts.onReady(this.watched, this.unsupported);
        break;
      case REC.probeEnd: {
        const results = this.probe;
        this.probe = new Map();
        opts.onProbe(results);
        break;
      }
      case REC.event:
        this.batch.push({ event: this.event(r, b, at), count: b.readUInt32LE(at + 28) });
        break;
      case REC.eventsEnd: {
        const events = this.batch;
        this.batch = [];
        opts.onEvents(events);
        break;
      }
      case SIGNALS_RECORD: {
        const { position, reading } = decodeSignalsRecord(b, at, opts.now?.() ?? performance.now());
        const gpu = opts.gpus[position];
        if (gpu !== undefined) this.signals.set(gpu.uuid, reading);
        break;
      }
      case SIGNALS_END_RECORD: {
        const readings = this.signals;
        this.signals = new Map();
        opts.onSignals?.(readings);
        break;
      }
      case REC.driverGone:
        this.probe = new Map();
        opts.onDriverGone?.(this.error(r.func, r.code, r.func === 2 ? { index: g?.nvmlIndex ?? r.gpu } : undefined));
        break;
    }
  }

  /** One GPU's answer in the current probe round. */
  private probed(r: RecordHeader, b: Buffer, at: number): void {
    const result = PROBE_RESULTS[Number(b.readBigUInt64LE(at + 16))] ?? 'error';
    if (result === 'error' && r.code !== 0)
      this.opts.log.debug('probe failed', { ...this.gpuRef(r.gpu), error: this.opts.nvml.errorText(r.code) });
    const g = this.opts.gpus[r.gpu];
    if (g !== undefined) this.probe.set(g.uuid, result);
  }

  /** The event an event record reports, its GPU named by UUID. */
  private event(r: RecordHeader, b: Buffer, at: number): WatchedEvent {
    const kind = b.readUInt32LE(at + 24);
    // The thread says -1 for an event naming no device, -2 for a device not in its list.
    const pos =
      r.gpu === -1 ? null : r.gpu === -2 ? UNMANAGED_DEVICE : (this.opts.gpus[r.gpu]?.uuid ?? UNMANAGED_DEVICE);
    return kind === EVENT_TYPES.xid
      ? {
          kind: 'xid',
          gpu: pos,
          xid: Number(b.readBigUInt64LE(at + 16)),
          ...((r.func & 1) !== 0 ? { gi: b.readUInt32LE(at + 32), ci: b.readUInt32LE(at + 36) } : {}),
        }
      : kind === EVENT_TYPES.eccDouble
        ? { kind: 'ecc-double', gpu: pos }
        : { kind: 'ecc-single', gpu: pos };
  }

  private gpuRef(pos: number): { gpu: number | undefined; uuid: string | undefined } {
    return { gpu: this.opts.gpus[pos]?.nvmlIndex, uuid: this.opts.gpus[pos]?.uuid };
  }

  /** The message of the NVML error a record carries (function by its number in nvml_watch.c). */
  private error(func: number, code: number, gpu?: { index: number }): string {
    return new NvmlError(FUNCTION_NAMES[func] ?? `function ${func}`, code, this.opts.nvml.errorText(code), gpu).message;
  }
}

export class EventWatcher {
  private readonly api: WatchApi | null;
  private readonly log: Logger;
  private handle: unknown;
  private readonly ended: Promise<void>;
  /** Set by stop(): what the thread still says is about GPUs no longer watched, and is dropped. */
  private stopping = false;
  private stopped: Promise<void> | undefined;

  private constructor(a: WatchApi | null, log: Logger, handle: unknown, ended: Promise<void>) {
    this.api = a;
    this.log = log;
    this.handle = handle;
    this.ended = ended;
  }

  static start(opts: EventWatcherOptions): EventWatcher {
    const { log } = opts;
    const started = startThread(opts);
    if ('error' in started) {
      log.error('GPU health watcher failed; health is no longer watched', { error: started.error });
      return new EventWatcher(null, log, null, Promise.resolve());
    }
    const socket = new Socket({ fd: started.fd, readable: true, writable: false });
    const ended = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    const w = new EventWatcher(started.a, log, started.handle, ended);
    const folder = new RecordFolder(opts, () => w.stopping);
    readRecords(socket, (b, at) => folder.record(b, at));
    socket.on('end', () => socket.destroy());
    socket.on('error', (err: Error) => {
      if (!w.stopping)
        log.error('GPU health watcher failed; health is no longer watched', {
          error: `reading its reports: ${err.message}`,
        });
      socket.destroy();
    });
    return w;
  }

  /**
   * Asks the thread to stop and waits for it. It notices within one wait timeout, or as soon as the
   * NVML call it is in returns: a call that takes longer than limitMs is logged, and still waited
   * for (NVML may not be closed under it).
   */
  stop(limitMs: number): Promise<void> {
    this.stopped ??= this.stopOnce(limitMs);
    return this.stopped;
  }

  private async stopOnce(limitMs: number): Promise<void> {
    this.stopping = true;
    if (this.api === null) return;
    const a = this.api;
    a.stop(this.handle);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => {
      timer = setTimeout(() => resolve('late'), limitMs);
    });
    const outcome = await Promise.race([this.ended.then(() => 'done' as const), late]);
    clearTimeout(timer);
    if (outcome === 'late') {
      this.log.warn('the GPU health thread is still inside an NVML call; waiting for it to return', {
        waited_ms: limitMs,
      });
      await this.ended;
    }
    // The thread closed its end of the pipe as its last act: the join returns at once.
    a.join(this.handle);
    this.handle = null;
  }
}
