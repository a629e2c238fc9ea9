// The scanner: reads the node through NVML into a NodeScan (core/snapshot.ts) and keeps doing so
// while the node changes under us. It owns the NVML session and the health thread (watcher.ts:
// events and probes, on the session it lends), and scans:
// * at start, and on request (SIGHUP: NVML is shut down and opened again first, so that a GPU reset
//   or hot-plugged since is enumerated afresh);
// * when the health thread's probes see a GPU lost, or a lost one answering again;
// * when NVML answers that the driver is gone (UNINITIALIZED, DRIVER_NOT_LOADED,
//   LIB_RM_VERSION_MISMATCH): it reports the driver down (scan null), closes NVML and opens it
//   again with capped backoff until the driver answers, then scans and restarts the health thread;
// * on a slow timer, and when a probe starts failing, reading only the cheap identity (count,
//   UUIDs, MIG modes, and with MIG on the MIG devices' UUIDs, so a re-layout is seen) and scanning
//   fully when it differs from the last scan's.
// With MIG on, a scan also reads the MIG layout (nvml/mig.ts) and the MIG devices' capability nodes.
// Scans run one at a time; requests that arrive meanwhile fold into one more.
import type { Gpu } from '../core/devices.ts';
import type { EventBatchEntry, ProbeRound } from '../core/health.ts';
import { sameIdentity } from '../core/snapshot.ts';
import type { NodeIdentity, NodeScan } from '../core/snapshot.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import type { Koffi } from '../system/native.ts';
import { discoverGpus, readLinks } from './discovery.ts';
import { discoverMig, nvmlHasMig, readMigCapabilities } from './mig.ts';
import type { MigDevice, MigLayout, MigMode } from '../core/mig.ts';
import { readNodeFacts } from './node-facts.ts';
import { NVML, NvmlError, meansDriverGone } from './errors.ts';
import { Nvml } from './nvml.ts';
import type { WatchedGpu } from './events.ts';
import { EventWatcher } from './watcher.ts';

export interface ScannerOptions {
  koffi: Koffi;
  driverRoot: string;
  sysfsRoot: string;
  log: Logger;
  /** Read MIG modes and devices (--mig-strategy single or mixed). */
  mig?: boolean;
  /** Environment with PROC_ROOT, for mig-minors (default process.env). */
  env?: Readonly<Record<string, string | undefined>>;
  /** Seconds between cheap identity checks; 0: no timer. */
  rediscoverIntervalMs: number;
  /** Health watching (the health thread); null: GPUs are not watched. */
  health: { probeIntervalMs: number } | null;
  /** A scan (null: the driver does not answer). The next scan waits for the promise. */
  onScan(scan: NodeScan | null, reason: string): Promise<void>;
  onEvents(events: EventBatchEntry[]): void;
  onProbe(results: ProbeRound): void;
  /** The worker watches these GPUs now (the unsupported ones by the probe only). */
  onWatching?(watched: readonly WatchedGpu[], unsupported: readonly WatchedGpu[]): void;
  /** Every scan also reads what the node labels need (node-facts.ts), in the scan's facts. */
  facts?: boolean;
}

interface Request {
  reason: string;
  /** Shut NVML down and open it again before scanning. */
  reopen: boolean;
}

const MAX_BACKOFF_MS = 30000;
/** How long the health thread waits at most for the first registration before it starts anyway. */
const WORKER_HOLD_MS = 2000;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export class Scanner {
  private readonly opts: ScannerOptions;
  private readonly log: Logger;
  private nvml: Nvml | null = null;
  private libraryPath: string | null = null;
  private worker: EventWatcher | undefined;
  private workerGpus: readonly Gpu[] = [];
  private workerReleased = false;
  private holdTimer: NodeJS.Timeout | undefined;
  private heldGpus: readonly Gpu[] | null = null;
  private lastScan: NodeScan | null = null;
  private lastIdentity: NodeIdentity | null = null;
  private lastProbe: ProbeRound = new Map();
  private pending: Request | null = null;
  private running: Promise<void> | null = null;
  private timer: NodeJS.Timeout | undefined;
  private emptyTimer: NodeJS.Timeout | undefined;
  private emptyDelayMs = 1000;
  private intervalMs: number;
  private stopped = false;
  /** The last worker stop asked for, so that stop() can wait for one a rescan began. */
  private workerStopping: Promise<void> = Promise.resolve();
  /** The driver was reported down and not yet back. */
  private down = false;
  private scans = 0;
  /** A scan has been taken in by onScan. */
  private applied = false;
  private identityChecks = 0;
  /** A driver without MIG functions was reported (once). */
  private migMissingLogged = false;

  constructor(opts: ScannerOptions) {
    this.opts = opts;
    this.log = opts.log;
    this.intervalMs = opts.rediscoverIntervalMs;
  }

  /** Full scans done (for tests and the log). */
  get scanCount(): number {
    return this.scans;
  }

  get identityCheckCount(): number {
    return this.identityChecks;
  }

  get library(): string | null {
    return this.libraryPath;
  }

  /** Opens NVML (throws what Nvml.open throws: the caller decides whether that is fatal). */
  private open(): void {
    this.nvml = Nvml.open({ koffi: this.opts.koffi, driverRoot: this.opts.driverRoot, log: this.log });
    this.libraryPath = this.nvml.libraryPath;
    this.log.info('NVML initialised', { library: this.nvml.libraryPath, driver: this.nvml.driverVersion() });
  }

  /**
   * Opens NVML and makes the first scan; throws what they throw (a config that does not fit the
   * node, say). NVML that cannot be opened is fatal only with failOnInitError; otherwise the driver
   * is reported down and looked for again with backoff.
   */
  async start(failOnInitError: boolean): Promise<void> {
    // The health thread waits for the first registration, or this long (see releaseWorker).
    const hold = setTimeout(() => this.releaseWorker(), WORKER_HOLD_MS);
    hold.unref();
    this.holdTimer = hold;
    try {
      this.open();
    } catch (err) {
      if (failOnInitError) throw err;
      await this.startWithoutDriver(errorText(err));
      return;
    }
    await this.request({ reason: 'start', reopen: false });
    this.arm();
  }

  /** NVML could not be opened at start and that is not fatal: report no driver, and retry with backoff. */
  private async startWithoutDriver(problem: string): Promise<void> {
    this.down = true;
    this.log.warn('NVML is not available; retrying (fail-on-init-error is false)', { error: problem });
    await this.opts.onScan(null, 'start');
    this.arm();
    void this.request({ reason: 'start', reopen: true });
  }

  /** Changes the timer (a config reload); 0 stops it. */
  setInterval(ms: number): void {
    if (ms === this.intervalMs) return;
    this.intervalMs = ms;
    this.arm();
  }

  /** Asks for a full scan; resolves once one that started after this call has finished. */
  rescan(reason: string, reopen = false): Promise<void> {
    return this.request({ reason, reopen });
  }

  private request(r: Request): Promise<void> {
    if (this.stopped) return Promise.resolve();
    this.pending = this.pending === null ? r : { reason: this.pending.reason, reopen: this.pending.reopen || r.reopen };
    if (this.running === null) this.running = this.drain();
    return this.running;
  }

  private async drain(): Promise<void> {
    try {
      while (this.pending !== null && !this.stopped) {
        const r = this.pending;
        this.pending = null;
        try {
          await this.scanOnce(r);
        } catch (err) {
          // The very first scan's failure is the caller's to judge; later ones keep the last scan in force.
          if (!this.applied && !this.down) throw err;
          this.log.error('scan failed; what was read before stays in force', { reason: r.reason, error: errorText(err) });
        }
      }
    } finally {
      this.running = null;
    }
  }

  private arm(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    if (this.intervalMs <= 0 || this.stopped) return;
    this.timer = setInterval(() => this.checkIdentity(), this.intervalMs);
    this.timer.unref();
  }

  /** The slow timer: count, UUIDs and MIG modes; a full scan only when they differ. */
  private checkIdentity(): void {
    if (this.running !== null || this.down || this.nvml === null) return;
    this.identityChecks++;
    let id: NodeIdentity;
    try {
      id = this.identity(this.nvml);
    } catch (err) {
      void this.request({ reason: `re-discovery: ${errorText(err)}`, reopen: false });
      return;
    }
    if (this.lastIdentity !== null && sameIdentity(id, this.lastIdentity)) return;
    void this.request({ reason: 're-discovery: the GPUs changed', reopen: false });
  }

  private identity(nvml: Nvml): NodeIdentity {
    const count = nvml.deviceCount();
    const uuids: string[] = [];
    const migModes: (number | null)[] = [];
    const mig = nvml.has('nvmlDeviceGetMigMode', true);
    const migDevices: string[][] = [];
    const withDevices = this.opts.mig === true && nvmlHasMig(nvml).ok;
    for (let index = 0; index < count; index++) {
      let h;
      try {
        h = nvml.handleByIndex(index);
        uuids.push(nvml.uuid(h, { index }));
      } catch (err) {
        if (err instanceof NvmlError && !meansDriverGone(err.code)) {
          uuids.push(`unreadable:${index}`);
          migModes.push(null);
          continue;
        }
        throw err;
      }
      if (!mig) {
        migModes.push(null);
        continue;
      }
      const current = [0];
      const pendingMode = [0];
      const code = nvml.callCode('nvmlDeviceGetMigMode', h, current, pendingMode);
      if (meansDriverGone(code)) nvml.check('nvmlDeviceGetMigMode', code, { index });
      // Current mode, plus 2 when a different mode is pending (so a pending change is seen, and logged).
      migModes.push(code === NVML.SUCCESS ? (current[0] ?? 0) + ((pendingMode[0] ?? 0) !== (current[0] ?? 0) ? 2 : 0) : null);
      if (withDevices && code === NVML.SUCCESS && current[0] === 1) migDevices.push(this.migDeviceUuids(nvml, h));
      else if (withDevices) migDevices.push([]);
    }
    return withDevices ? { uuids, migModes, migDevices } : { uuids, migModes };
  }

  /** The UUIDs of a MIG-enabled GPU's MIG devices, in index order (cheap: no attributes). */
  private migDeviceUuids(nvml: Nvml, h: unknown): string[] {
    const out: string[] = [];
    const max = [0];
    if (nvml.callCode('nvmlDeviceGetMaxMigDeviceCount', h, max) !== NVML.SUCCESS) return out;
    for (let i = 0; i < (max[0] ?? 0); i++) {
      const m: unknown[] = [null];
      const code = nvml.callCode('nvmlDeviceGetMigDeviceHandleByIndex', h, i, m);
      if (meansDriverGone(code)) nvml.check('nvmlDeviceGetMigDeviceHandleByIndex', code);
      if (code !== NVML.SUCCESS) continue;
      try {
        out.push(`${i}:${nvml.uuid(m[0] as never, {})}`);
      } catch (err) {
        if (err instanceof NvmlError && meansDriverGone(err.code)) throw err;
        out.push(`${i}:unreadable`);
      }
    }
    return out;
  }

  private async scanOnce(r: Request): Promise<void> {
    if (r.reopen && this.nvml !== null) {
      // Take the session first: stop() may run while the worker stops, and shuts down only what is still here.
      const old = this.nvml;
      this.nvml = null;
      await this.stopWorker();
      old.close();
      if (this.stopped) return;
    }
    if (this.nvml === null) {
      const nvml = await this.reopen(r.reason);
      if (nvml === null) return;
      this.nvml = nvml;
    }
    let scan: NodeScan;
    try {
      scan = this.read(this.nvml);
    } catch (err) {
      if (err instanceof NvmlError && meansDriverGone(err.code)) {
        await this.driverGone(err.message);
        return this.scanOnce({ reason: r.reason, reopen: false });
      }
      throw err;
    }
    this.scans++;
    this.lastScan = scan;
    this.down = false;
    this.log.debug('node scanned', { reason: r.reason, gpus: scan.gpus.length, driver: scan.driverVersion });
    // The worker's positions follow the GPU list: a new list means a new worker, started once the
    // snapshot with this list is in place (so no event lands on the wrong GPU).
    const sameGpus = this.worker !== undefined && JSON.stringify(this.workerGpus.map((g) => [g.index, g.uuid])) === JSON.stringify(scan.gpus.map((g) => [g.index, g.uuid]));
    if (!sameGpus) await this.stopWorker();
    await this.opts.onScan(scan, r.reason);
    this.applied = true;
    if (!sameGpus) this.startWorker(scan.gpus);
    this.lookAgainIfEmpty(scan);
  }

  /** A node without GPUs (yet) is looked at again with capped backoff, not only by the slow timer. */
  private lookAgainIfEmpty(scan: NodeScan): void {
    if (this.emptyTimer !== undefined) clearTimeout(this.emptyTimer);
    this.emptyTimer = undefined;
    if (scan.gpus.length > 0 || this.stopped) {
      this.emptyDelayMs = 1000;
      return;
    }
    this.emptyTimer = setTimeout(() => {
      this.emptyTimer = undefined;
      void this.request({ reason: 'no GPUs yet', reopen: true });
    }, this.emptyDelayMs);
    this.emptyTimer.unref();
    this.emptyDelayMs = Math.min(this.emptyDelayMs * 2, MAX_BACKOFF_MS);
  }

  /** Reads everything about the node; GPUs that cannot be read are kept from the last scan by NVML index. */
  private read(nvml: Nvml): NodeScan {
    const driverVersion = nvml.driverVersion();
    const found = discoverGpus(nvml, this.opts.sysfsRoot, this.log, false);
    this.lastIdentity = this.identity(nvml);
    const links = readLinks(nvml, found, this.log);
    const facts = this.opts.facts === true ? { facts: readNodeFacts(nvml, found.gpus, found.handles, this.log) } : {};
    const gpus = [...found.gpus];
    const nvlinks = [...links.gpus];
    let pcie = links.pcie.map((row) => [...row]);
    for (const u of found.unreadable ?? []) {
      const known = this.lastScan?.gpus.find((g) => g.index === u.index);
      if (known === undefined || gpus.some((g) => g.uuid === known.uuid)) {
        this.log.error('GPU cannot be read and is not advertised', { gpu: u.index, error: u.error.message });
        continue;
      }
      this.log.warn('GPU cannot be read; it stays listed as last seen, Unhealthy once its probe says it is lost', { gpu: u.index, uuid: known.uuid, error: u.error.message });
      // A GPU fallen off the bus is still counted by NVML: keep what we knew of it, so that it is
      // advertised Unhealthy (the probe says lost) rather than vanishing and returning.
      const at = gpus.findIndex((g) => g.index > u.index);
      const pos = at < 0 ? gpus.length : at;
      gpus.splice(pos, 0, known);
      nvlinks.splice(pos, 0, { busId: known.busId, links: [] });
      pcie = pcie.map((row) => { const r = [...row]; r.splice(pos, 0, -1); return r; });
      pcie.splice(pos, 0, new Array<number>(gpus.length).fill(-1));
    }
    return { driverVersion, gpus, nvlinks, pcie, ...facts, ...this.readMig(nvml, found, gpus) };
  }

  /** The MIG layout by position in `gpus` (the scan's list), and the MIG devices' capability nodes. */
  private readMig(nvml: Nvml, found: ReturnType<typeof discoverGpus>, gpus: readonly Gpu[]): Pick<NodeScan, 'mig' | 'migCapabilities'> {
    if (this.opts.mig !== true) return {};
    const has = nvmlHasMig(nvml);
    if (!has.ok) {
      if (!this.migMissingLogged) this.log.warn('this NVIDIA driver has no MIG functions; MIG is off and every GPU is advertised whole', { missing: has.missing, library: nvml.libraryPath });
      this.migMissingLogged = true;
      return {};
    }
    const read = discoverMig(nvml, found.gpus, found.handles, this.log);
    if (read === null) return {};
    // discoverMig speaks of found.gpus; the scan's list may hold a lost GPU more (not MIG-readable).
    const pos = new Map(gpus.map((g, i) => [g.uuid, i]));
    const modes: (MigMode | null)[] = gpus.map(() => null);
    read.modes.forEach((m, i) => {
      const at = pos.get(found.gpus[i]?.uuid ?? '');
      if (at !== undefined) modes[at] = m;
    });
    const devices: MigDevice[] = [];
    for (const d of read.devices) {
      const at = pos.get(found.gpus[d.parent]?.uuid ?? '');
      if (at !== undefined) devices.push({ ...d, parent: at });
    }
    // A lost GPU kept in the list keeps the MIG layout last read on it, as it keeps its other facts:
    // its MIG devices stay listed (Unhealthy with it) rather than vanishing, and the node still fits
    // the MIG strategy it fitted.
    const readable = new Set(found.gpus.map((g) => g.uuid));
    const last = this.lastScan;
    gpus.forEach((g, at) => {
      if (readable.has(g.uuid) || last?.mig === undefined) return;
      const was = last.gpus.findIndex((x) => x.uuid === g.uuid);
      if (was < 0) return;
      modes[at] = last.mig.modes[was] ?? null;
      for (const d of last.mig.devices) if (d.parent === was) devices.push({ ...d, parent: at });
    });
    devices.sort((x, y) => x.parent - y.parent || x.index - y.index);
    const mig: MigLayout = { modes, devices };
    return { mig, migCapabilities: readMigCapabilities(gpus, mig, this.opts.env ?? process.env) };
  }

  /** The driver stopped answering: report it once, close NVML (the worker too). */
  private async driverGone(message: string): Promise<void> {
    await this.stopWorker();
    this.nvml?.close();
    this.nvml = null;
    if (!this.down) {
      this.down = true;
      this.lastIdentity = null;
      this.log.warn('the NVIDIA driver does not answer; every GPU is reported unhealthy until it does (re-opening NVML with backoff)', { error: message });
      await this.opts.onScan(null, 'driver gone');
    }
  }

  /** Opens NVML again, with capped backoff while the driver does not answer; null once stopped. */
  private async reopen(reason: string): Promise<Nvml | null> {
    let delay = 1000;
    let last: string | undefined;
    for (;;) {
      if (this.stopped) return null;
      try {
        const nvml = Nvml.open({ koffi: this.opts.koffi, driverRoot: this.opts.driverRoot, log: this.log });
        this.libraryPath = nvml.libraryPath;
        if (this.down || last !== undefined) this.log.info('NVML answers again', { library: nvml.libraryPath, driver: nvml.driverVersion(), reason });
        return nvml;
      } catch (err) {
        const problem = errorText(err);
        if (!this.down) {
          this.down = true;
          this.log.warn('the NVIDIA driver does not answer; every GPU is reported unhealthy until it does (re-opening NVML with backoff)', { error: problem });
          await this.opts.onScan(null, 'driver gone');
        } else if (problem !== last) this.log.debug('NVML cannot be opened yet', { error: problem, retry_s: delay / 1000 });
        last = problem;
        await sleep(delay);
        delay = Math.min(delay * 2, MAX_BACKOFF_MS);
      }
    }
  }

  /**
   * Lets the event worker start (held back at start until the first registration, or 2 s, so that its
   * thread's start-up does not compete with it; until then nothing is advertised anyway).
   */
  releaseWorker(): void {
    if (this.workerReleased) return;
    this.workerReleased = true;
    clearTimeout(this.holdTimer);
    if (this.heldGpus !== null && this.worker === undefined && !this.down) this.startWorker(this.heldGpus);
    this.heldGpus = null;
  }

  private startWorker(gpus: readonly Gpu[]): void {
    const h = this.opts.health;
    if (h === null || this.stopped || this.nvml === null || gpus.length === 0) return;
    if (!this.workerReleased) {
      this.heldGpus = gpus;
      return;
    }
    this.workerGpus = gpus;
    this.lastProbe = new Map();
    this.worker = EventWatcher.start({
      nvml: this.nvml,
      koffi: this.opts.koffi,
      gpus: gpus.map((g) => ({ nvmlIndex: g.index, uuid: g.uuid })),
      probeIntervalMs: h.probeIntervalMs,
      waitTimeoutMs: 200,
      log: this.log,
      onReady: (watched, unsupported) => {
        for (const g of unsupported) this.log.warn('GPU supports no health events; watched by the probe only', { gpu: g.nvmlIndex, uuid: g.uuid });
        this.log.info('watching GPU health', { event_gpus: watched.length, probe_s: h.probeIntervalMs / 1000 });
        this.opts.onWatching?.(watched, unsupported);
      },
      onEvents: (events) => this.opts.onEvents(events),
      onProbe: (results) => {
        this.opts.onProbe(results);
        this.probed(results);
      },
      onDriverGone: (message) => {
        void this.request({ reason: `health watcher: ${message}`, reopen: false });
      },
    });
  }

  /** A GPU newly lost, or a lost one answering again: look at the node again. */
  private probed(results: ProbeRound): void {
    // The first probe of a worker compares with nothing: what it finds wrong counts as new.
    const before = this.lastProbe;
    this.lastProbe = results;
    const was = [...results].map(([uuid, r]) => [r, before.get(uuid)] as const);
    const lost = was.some(([r, b]) => r === 'lost' && b !== 'lost');
    const back = was.some(([r, b]) => r === 'ok' && b === 'lost');
    // A GPU back after a reset is enumerated afresh only by a new NVML session.
    if (lost || back) void this.request({ reason: back ? 'a lost GPU answers again' : 'a GPU is lost', reopen: back });
    // A handle that stopped answering (a GPU removed, say): the cheap identity check decides.
    else if (was.some(([r, b]) => r === 'error' && b !== 'error')) this.checkIdentity();
  }

  private async stopWorker(): Promise<void> {
    this.heldGpus = null;
    const w = this.worker;
    this.worker = undefined;
    this.workerGpus = [];
    if (w === undefined) return;
    const stopping = w.stop(800);
    this.workerStopping = stopping;
    await stopping;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.holdTimer);
    if (this.timer !== undefined) clearInterval(this.timer);
    if (this.emptyTimer !== undefined) clearTimeout(this.emptyTimer);
    this.timer = undefined;
    this.pending = null;
    await this.stopWorker();
    // A rescan in flight may be stopping the previous worker: the process must not exit while that
    // worker is still inside NVML (exiting under a native call aborts the process).
    await this.workerStopping;
    // Shut down only: the process is about to exit, and unloading buys nothing there.
    this.nvml?.shutdown();
    this.nvml = null;
  }
}
