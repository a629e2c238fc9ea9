// Starts and stops the GPU health thread (our C library, src/native/nvml_watch.c) and hands what it
// reports to callbacks. The thread borrows the caller's NVML session: NVML's blocking event wait
// and the per-GPU probes run there, never on the event loop nor on libuv's shared thread pool. It
// writes fixed-size records into a pipe, read here through the event loop (a net.Socket on the
// pipe: no pool thread is involved); the layout below mirrors struct gdp_record.
import { Socket } from 'node:net';
import type { Logger } from '../system/log.ts';
import { loadWatchLibrary } from '../system/native.ts';
import type { Koffi } from '../system/native.ts';
import { NvmlError } from './errors.ts';
import type { EventBatchEntry, ProbeResult, ProbeRound, WatchedEvent, WatchedGpu } from './events.ts';
import { EVENT_TYPES, UNMANAGED_DEVICE } from './events.ts';
import type { Nvml } from './nvml.ts';

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
  /** Events, each naming its GPU by UUID (the thread's positions translated here, from the list it was started with). */
  onEvents(events: EventBatchEntry[]): void;
  /** One probe round: each GPU's answer by UUID. */
  onProbe(results: ProbeRound): void;
  /** NVML said the driver is gone; the thread has stopped watching. */
  onDriverGone?(message: string): void;
}

// struct gdp_record (40 bytes) and its constants, as in src/native/nvml_watch.h.
const RECORD = 40;
const REC = {
  warnHandle: 1, warnRegister: 2, watched: 3, unsupported: 4, ready: 5, probe: 6, probeEnd: 7,
  event: 8, eventsEnd: 9, waitFailed: 10, driverGone: 11, failed: 12, stopped: 13,
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
interface WatchApi { start: NativeFn; stop: NativeFn; join: NativeFn }
let api: WatchApi | undefined;

function watchApi(koffi: Koffi): WatchApi {
  if (api === undefined) {
    const lib = loadWatchLibrary();
    koffi.opaque('gdp_watch');
    api = {
      start: lib.func('int gdp_watch_start(const char *library, const uint32_t *indices, uint32_t count, uint32_t probe_interval_ms, uint32_t wait_timeout_ms, int32_t wait_version, _Out_ gdp_watch **out, _Out_ int32_t *fd)') as NativeFn,
      stop: lib.func('void gdp_watch_stop(gdp_watch *w)') as NativeFn,
      join: lib.func('int gdp_watch_join(gdp_watch *w)') as NativeFn,
    };
  }
  return api;
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
    const { nvml, log, gpus } = opts;
    const failed = (error: string): EventWatcher => {
      log.error('GPU health watcher failed; health is no longer watched', { error });
      return new EventWatcher(null, log, null, Promise.resolve());
    };
    // Older drivers have only the first version of the wait (same signature, shorter struct).
    const waitVersion = nvml.has('nvmlEventSetWait_v2') ? 2 : nvml.has('nvmlEventSetWait') ? 1 : 0;
    if (waitVersion === 0) log.warn('NVML has no event wait; GPUs are watched by the probe only');
    let a: WatchApi;
    try {
      a = watchApi(opts.koffi);
    } catch (err) {
      return failed(err instanceof Error ? err.message : String(err));
    }
    const out: unknown[] = [null];
    const fd = [0];
    const rc = a.start(nvml.libraryPath, Uint32Array.from(gpus, (g) => g.nvmlIndex), gpus.length, opts.probeIntervalMs, opts.waitTimeoutMs, waitVersion, out, fd) as number;
    if (rc !== 0) return failed(`cannot start the health thread (errno ${rc}${rc === 2 ? ': NVML is not loaded' : rc === 38 ? ': NVML lacks a function it needs' : ''})`);
    const socket = new Socket({ fd: fd[0] ?? -1, readable: true, writable: false });
    const ended = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    const w = new EventWatcher(a, log, out[0], ended);
    const gpuRef = (pos: number): { gpu: number | undefined; uuid: string | undefined } => ({ gpu: gpus[pos]?.nvmlIndex, uuid: gpus[pos]?.uuid });
    const error = (func: number, code: number, gpu?: { index: number }): string =>
      new NvmlError(FUNCTION_NAMES[func] ?? `function ${func}`, code, nvml.errorText(code), gpu).message;

    const watched: WatchedGpu[] = [];
    const unsupported: WatchedGpu[] = [];
    let probe = new Map<string, ProbeResult>();
    let batch: EventBatchEntry[] = [];
    let rest: Buffer | null = null;
    const record = (b: Buffer, at: number): void => {
      const type = b.readUInt32LE(at);
      const gpu = b.readInt32LE(at + 4);
      const code = b.readUInt32LE(at + 8);
      const func = b.readUInt32LE(at + 12);
      switch (type) {
        case REC.warnHandle:
          log.warn('cannot watch GPU; it is reported by the probe only', { ...gpuRef(gpu), error: error(func, code, { index: gpus[gpu]?.nvmlIndex ?? gpu }) });
          return;
        case REC.warnRegister:
          log.warn('cannot register for GPU events; the probe watches it', { ...gpuRef(gpu), error: error(func, code) });
          return;
        case REC.waitFailed:
          log.warn('NVML event wait failed; retrying', { error: error(func, code) });
          return;
        case REC.failed:
          log.error('GPU health watcher failed; health is no longer watched', { error: error(func, code) });
          return;
        case REC.probe: {
          const result = PROBE_RESULTS[Number(b.readBigUInt64LE(at + 16))] ?? 'error';
          if (result === 'error' && code !== 0) log.debug('probe failed', { ...gpuRef(gpu), error: nvml.errorText(code) });
          const g = gpus[gpu];
          if (g !== undefined) probe.set(g.uuid, result);
          return;
        }
        case REC.stopped:
          return;
      }
      if (w.stopping) return;
      switch (type) {
        case REC.watched: if (gpus[gpu] !== undefined) watched.push(gpus[gpu]); break;
        case REC.unsupported: if (gpus[gpu] !== undefined) unsupported.push(gpus[gpu]); break;
        case REC.ready: opts.onReady(watched, unsupported); break;
        case REC.probeEnd: {
          const results = probe;
          probe = new Map();
          opts.onProbe(results);
          break;
        }
        case REC.event: {
          const kind = b.readUInt32LE(at + 24);
          // The thread says -1 for an event naming no device, -2 for a device not in its list.
          const pos = gpu === -1 ? null : gpu === -2 ? UNMANAGED_DEVICE : gpus[gpu]?.uuid ?? UNMANAGED_DEVICE;
          const event: WatchedEvent = kind === EVENT_TYPES.xid
            ? { kind: 'xid', gpu: pos, xid: Number(b.readBigUInt64LE(at + 16)), ...((func & 1) !== 0 ? { gi: b.readUInt32LE(at + 32), ci: b.readUInt32LE(at + 36) } : {}) }
            : kind === EVENT_TYPES.eccDouble ? { kind: 'ecc-double', gpu: pos } : { kind: 'ecc-single', gpu: pos };
          batch.push({ event, count: b.readUInt32LE(at + 28) });
          break;
        }
        case REC.eventsEnd: {
          const events = batch;
          batch = [];
          opts.onEvents(events);
          break;
        }
        case REC.driverGone:
          probe = new Map();
          opts.onDriverGone?.(error(func, code, func === 2 ? { index: gpus[gpu]?.nvmlIndex ?? gpu } : undefined));
          break;
      }
    };
    socket.on('data', (chunk: Buffer) => {
      const b = rest === null ? chunk : Buffer.concat([rest, chunk]);
      const whole = b.length - (b.length % RECORD);
      for (let at = 0; at < whole; at += RECORD) record(b, at);
      rest = whole === b.length ? null : Buffer.from(b.subarray(whole));
    });
    socket.on('end', () => socket.destroy());
    socket.on('error', (err: Error) => {
      if (!w.stopping) log.error('GPU health watcher failed; health is no longer watched', { error: `reading its reports: ${err.message}` });
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
    const late = new Promise<'late'>((resolve) => { timer = setTimeout(() => resolve('late'), limitMs); });
    const outcome = await Promise.race([this.ended.then(() => 'done' as const), late]);
    clearTimeout(timer);
    if (outcome === 'late') {
      this.log.warn('the GPU health thread is still inside an NVML call; waiting for it to return', { waited_ms: limitMs });
      await this.ended;
    }
    // The thread closed its end of the pipe as its last act: the join returns at once.
    a.join(this.handle);
    this.handle = null;
  }
}
