// Runs on a worker thread of its own: NVML's blocking event wait and the per-GPU probes happen here,
// never on the event loop and never on libuv's shared thread pool. It posts batches of what it saw;
// the health policy (core/health.ts) decides what they mean, on the main thread.
import { parentPort, workerData } from 'node:worker_threads';
import { loadKoffi } from '../system/native.ts';
import { createLogger } from '../system/log.ts';
import { nvmlTypes } from './bindings.ts';
import { NVML, NvmlError, meansDriverGone } from './errors.ts';
import { Nvml } from './nvml.ts';
import type { DeviceHandle } from './nvml.ts';
import type { EventBatchEntry, WatchedGpu, WorkerMessage, WorkerSettings, WatchedEvent } from './events.ts';
import { EVENT_TYPES } from './events.ts';

const settings = workerData as WorkerSettings;
const port = parentPort;
if (port === null) throw new Error('event-worker.ts must run as a worker thread');
const post = (m: WorkerMessage): void => port.postMessage(m);
const stopFlag = new Int32Array(settings.stop);
const stopping = (): boolean => Atomics.load(stopFlag, 0) !== 0;

// Log lines are formatted here with the main thread's settings and written there, in order.
const log = createLogger({
  level: settings.logLevel,
  journal: settings.journal,
  write: (line) => post({ type: 'log', line }),
});

function run(): void {
  const koffi = loadKoffi();
  nvmlTypes(koffi);
  const nvml = Nvml.open({ koffi, driverRoot: '/', log, library: settings.library });
  // After the driver went, the library is unloaded too, so that the next open can load a new one.
  let unload = false;
  try {
    const handles: (DeviceHandle | null)[] = settings.gpus.map((g: WatchedGpu) => {
      try {
        return nvml.handleByIndex(g.nvmlIndex);
      } catch (err) {
        log.warn('cannot watch GPU; it is reported by the probe only', { gpu: g.nvmlIndex, uuid: g.uuid, error: (err as Error).message });
        return null;
      }
    });
    const byAddress = new Map<bigint, number>();
    handles.forEach((h, pos) => {
      if (h !== null) byAddress.set(koffi.address(h), pos);
    });
    // Event registration: what each GPU supports, of XID, double- and single-bit ECC.
    let set: unknown = null;
    const unsupported: number[] = [];
    const watched: number[] = [];
    // Older drivers have only the first version of the wait (same signature, shorter struct).
    const waitName = nvml.has('nvmlEventSetWait_v2') ? 'nvmlEventSetWait_v2' as const : nvml.has('nvmlEventSetWait') ? 'nvmlEventSetWait' as const : null;
    if (waitName === null) {
      log.warn('NVML has no event wait; GPUs are watched by the probe only');
    } else {
      const out: unknown[] = [null];
      nvml.check('nvmlEventSetCreate', nvml.callCode('nvmlEventSetCreate', out));
      set = out[0];
      const wanted = EVENT_TYPES.xid | EVENT_TYPES.eccDouble | EVENT_TYPES.eccSingle;
      handles.forEach((h, pos) => {
        const g = settings.gpus[pos];
        if (h === null || g === undefined) return;
        const supported = [0n];
        const code = nvml.callCode('nvmlDeviceGetSupportedEventTypes', h, supported);
        const mask = code === NVML.SUCCESS ? BigInt(supported[0] ?? 0) & BigInt(wanted) : 0n;
        if (mask === 0n) {
          unsupported.push(pos);
          return;
        }
        const rc = nvml.callCode('nvmlDeviceRegisterEvents', h, mask, set);
        if (rc === NVML.SUCCESS) watched.push(pos);
        else {
          unsupported.push(pos);
          log.warn('cannot register for GPU events; the probe watches it', { gpu: g.nvmlIndex, uuid: g.uuid, error: new NvmlError('nvmlDeviceRegisterEvents', rc, nvml.errorText(rc)).message });
        }
      });
    }
    post({ type: 'ready', watched, unsupported });

    const data: Record<string, unknown> = {};
    let nextProbe = 0;
    // One batch: identical events folded into one entry with a count.
    const batch = new Map<string, EventBatchEntry>();
    // The driver stopped answering: say so once and stop; the scanner re-opens NVML and starts a new worker.
    let driverGone: NvmlError | null = null;
    while (!stopping() && driverGone === null) {
      const now = performance.now();
      if (now >= nextProbe) {
        const results = handles.map((h, pos) => {
          if (h === null) return 'error' as const;
          const rc = nvml.probe(h);
          if (rc === NVML.SUCCESS) return 'ok' as const;
          if (rc === NVML.ERROR_GPU_IS_LOST) return 'lost' as const;
          if (meansDriverGone(rc)) driverGone = new NvmlError('nvmlDeviceGetMemoryInfo', rc, nvml.errorText(rc), { index: settings.gpus[pos]?.nvmlIndex ?? pos });
          log.debug('probe failed', { gpu: settings.gpus[pos]?.nvmlIndex, error: nvml.errorText(rc) });
          return 'error' as const;
        });
        if (driverGone !== null) break;
        post({ type: 'probe', results });
        nextProbe = now + settings.probeIntervalMs;
      }
      if (set === null || watched.length === 0 || waitName === null) {
        // Nothing to wait on: sleep until the next probe, waking early to stop.
        Atomics.wait(stopFlag, 0, 0, Math.min(settings.waitTimeoutMs, Math.max(1, nextProbe - performance.now())));
        continue;
      }
      const timeout = Math.max(1, Math.min(settings.waitTimeoutMs, Math.ceil(nextProbe - performance.now())));
      let rc = nvml.callCode(waitName, set, data, timeout);
      let drained = 0;
      // Drain what is already queued without waiting, so a storm travels in batches.
      while (rc === NVML.SUCCESS) {
        const addr = data['device'] === null || data['device'] === undefined ? null : koffi.address(data['device']);
        const pos = addr === null ? null : (byAddress.get(addr) ?? -1);
        const type = Number(data['eventType']);
        const ev: WatchedEvent = type === EVENT_TYPES.xid
          ? { kind: 'xid', gpu: pos, xid: Number(data['eventData']) }
          : type === EVENT_TYPES.eccDouble ? { kind: 'ecc-double', gpu: pos } : { kind: 'ecc-single', gpu: pos };
        const key = `${ev.kind}:${ev.gpu}:${ev.kind === 'xid' ? ev.xid : ''}`;
        const entry = batch.get(key);
        if (entry === undefined) batch.set(key, { event: ev, count: 1 });
        else entry.count++;
        if (++drained >= 4096 || stopping()) break;
        rc = nvml.callCode(waitName, set, data, 0);
      }
      if (batch.size > 0) {
        post({ type: 'events', events: [...batch.values()] });
        batch.clear();
      }
      if (meansDriverGone(rc)) {
        driverGone = new NvmlError(waitName, rc, nvml.errorText(rc));
        break;
      }
      if (rc !== NVML.SUCCESS && rc !== NVML.ERROR_TIMEOUT) {
        log.warn('NVML event wait failed; retrying', { error: new NvmlError(waitName, rc, nvml.errorText(rc)).message });
        Atomics.wait(stopFlag, 0, 0, settings.waitTimeoutMs);
      }
    }
    unload = driverGone !== null;
    if (driverGone !== null) post({ type: 'driver-gone', message: (driverGone as NvmlError).message });
    else if (set !== null) nvml.callCode('nvmlEventSetFree', set);
  } finally {
    if (unload) nvml.close();
    else nvml.shutdown();
  }
}

try {
  run();
  post({ type: 'stopped' });
} catch (err) {
  post({ type: 'failed', message: err instanceof Error ? err.message : String(err) });
}
