// The scanner: reads the node into a NodeScan (core/snapshot.ts) and keeps doing so while the node
// changes under us. Its parts, one job each:
// * session.ts — the NVML session: opened at start, re-opened on request and, with capped backoff,
//   after the driver went (UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH);
// * rediscovery.ts — the slow identity timer and the empty-node backoff;
// * health-supervisor.ts — the health thread on the session, and the scans its probes ask for;
// * node-reader.ts — what is read, through NVML (the session interface a test fakes).
// Scans run one at a time (a coalescing serial queue): requests that arrive meanwhile fold into one
// more. A scan is asked for at start, on request (SIGHUP: NVML is shut down and opened again first,
// so that a GPU reset or hot-plugged since is enumerated afresh), by re-discovery, by the probes, and
// when NVML answers that the driver is gone: then the driver is reported down (scan null) until a
// session opens again, and the health thread restarts with it.
import type { EventBatchEntry, ProbeRound } from '../core/health-events.ts';
import type { SignalName, SignalReading } from '../core/health-signals.ts';
import type { NodeScan } from '../core/snapshot.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue } from '../system/timers.ts';
import type { WatchedGpu } from './events.ts';
import { HealthSupervisor } from './health-supervisor.ts';
import { isDriverGone } from './node-reader.ts';
import type { NodeReader, NodeSessions } from './node-reader.ts';
import { Rediscovery } from './rediscovery.ts';
import { SessionKeeper } from './session.ts';

export interface ScannerOptions {
  /** Opens NVML sessions (node-reader.ts NvmlSessions; a fake in tests). */
  sessions: NodeSessions;
  log: Logger;
  /** Milliseconds between cheap identity checks; 0: no timer. */
  rediscoverIntervalMs: number;
  /**
   * Health watching (the health thread); null: GPUs are not watched. `signals`: the health signals
   * it reads, asked at each start of the thread.
   */
  health: { probeIntervalMs: number; signals?: () => readonly SignalName[] } | null;
  /** A scan (null: the driver does not answer). The next scan waits for the promise. */
  onScan(scan: NodeScan | null, reason: string): Promise<void>;
  /**
   * Started without the driver, the first scan that reached it failed (a config that does not fit
   * the GPUs, say): the caller's to judge, as it judges a start() that throws.
   */
  onStartFailed(err: unknown): void;
  onEvents(events: EventBatchEntry[]): void;
  onProbe(results: ProbeRound): void;
  /** Readings of the health signals, by GPU UUID. */
  onSignals?(readings: ReadonlyMap<string, SignalReading>): void;
  /** The health thread watches these GPUs now (the unsupported ones by the probe only). */
  onWatching?(watched: readonly WatchedGpu[], unsupported: readonly WatchedGpu[]): void;
}

interface Request {
  reason: string;
  /** Shut NVML down and open it again before scanning. */
  reopen: boolean;
}

export class Scanner {
  private readonly opts: ScannerOptions;
  private readonly log: Logger;
  private readonly session: SessionKeeper;
  private readonly rediscovery: Rediscovery;
  private readonly health: HealthSupervisor | null;
  private readonly queue: CoalescingQueue<Request>;
  private lastScan: NodeScan | null = null;
  private scans = 0;
  /** A scan has been taken in by onScan. */
  private applied = false;
  private stopped = false;

  constructor(opts: ScannerOptions) {
    this.opts = opts;
    this.log = opts.log;
    this.session = new SessionKeeper({
      sessions: opts.sessions,
      log: opts.log,
      onDown: (_problem, reason) => opts.onScan(null, reason),
    });
    this.queue = new CoalescingQueue<Request>(
      (r) => this.scanGuarded(r),
      (a, b) => ({ reason: a.reason, reopen: a.reopen || b.reopen }),
    );
    this.rediscovery = new Rediscovery({
      intervalMs: opts.rediscoverIntervalMs,
      reader: () => this.session.current,
      busy: () => this.queue.busy || this.session.down,
      rescan: (reason, reopen) => void this.request({ reason, reopen }),
    });
    this.health =
      opts.health === null
        ? null
        : new HealthSupervisor({
            log: opts.log,
            probeIntervalMs: opts.health.probeIntervalMs,
            onEvents: (e) => opts.onEvents(e),
            onProbe: (r) => opts.onProbe(r),
            ...(opts.health.signals === undefined ? {} : { signals: opts.health.signals }),
            onSignals: (r) => opts.onSignals?.(r),
            ...(opts.onWatching === undefined ? {} : { onWatching: opts.onWatching }),
            rescan: (reason, reopen) => void this.request({ reason, reopen }),
            checkIdentity: () => this.rediscovery.check(),
          });
  }

  /** Full scans done (for tests and the log). */
  get scanCount(): number {
    return this.scans;
  }

  get identityCheckCount(): number {
    return this.rediscovery.checkCount;
  }

  get library(): string | null {
    return this.session.library;
  }

  /**
   * Opens NVML and makes the first scan; throws what they throw (a config that does not fit the
   * node, say). NVML that cannot be opened is fatal only with failOnInitError; otherwise the driver
   * is reported down and looked for again with backoff.
   */
  async start(failOnInitError: boolean): Promise<void> {
    try {
      this.session.open();
    } catch (err) {
      if (failOnInitError) throw err;
      await this.session.startDown(errorText(err));
      this.rediscovery.arm();
      void this.request({ reason: 'start', reopen: true }).catch((e: unknown) => this.opts.onStartFailed(e));
      return;
    }
    await this.request({ reason: 'start', reopen: false });
    this.rediscovery.arm();
  }

  /** Lets the health thread start (the first registration; otherwise it starts after a short hold). */
  releaseWorker(): void {
    this.health?.release();
  }

  /** Changes the re-discovery timer (a config reload); 0 stops it. */
  setInterval(ms: number): void {
    this.rediscovery.setInterval(ms);
  }

  /** Asks for a full scan; resolves once one that started after this call has finished. */
  rescan(reason: string, reopen = false): Promise<void> {
    return this.request({ reason, reopen });
  }

  private request(r: Request): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return this.queue.request(r);
  }

  private async scanGuarded(r: Request): Promise<void> {
    if (this.stopped) return;
    try {
      await this.scanOnce(r);
    } catch (err) {
      // The very first scan's failure is the caller's to judge; later ones keep the last scan in force.
      if (!this.applied && !this.session.down) throw err;
      this.log.error('scan failed; what was read before stays in force', { reason: r.reason, error: errorText(err) });
    }
  }

  private async scanOnce(r: Request): Promise<void> {
    if (r.reopen && this.session.current !== null) {
      // Take the session first: stop() may run while the thread stops, and shuts down only what is still here.
      const old = this.session.take();
      await this.health?.halt();
      old?.close();
      if (this.stopped) return;
    }
    const reader = await this.session.ensure(r.reason);
    if (reader === null) return;
    let scan: NodeScan;
    try {
      scan = reader.read(this.lastScan);
      this.rediscovery.remember(reader.identity());
    } catch (err) {
      if (!isDriverGone(err)) throw err;
      await this.driverGone(reader, err.message);
      return this.scanOnce({ reason: r.reason, reopen: false });
    }
    this.scans++;
    this.lastScan = scan;
    this.session.up();
    this.log.debug('node scanned', { reason: r.reason, gpus: scan.gpus.length, driver: scan.driverVersion });
    // The thread follows the GPU list: a new list, a new thread (on the same session).
    const same = this.health?.watches(scan.gpus) ?? true;
    if (!same) await this.health?.halt();
    await this.opts.onScan(scan, r.reason);
    this.applied = true;
    if (!same) this.health?.start(reader, scan.gpus);
    this.rediscovery.scanned(scan);
  }

  /** The driver stopped answering: the thread lets go of the session, which is closed; reported once. */
  private async driverGone(reader: NodeReader, message: string): Promise<void> {
    await this.health?.halt();
    this.rediscovery.remember(null);
    await this.session.lost(message, reader);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.rediscovery.stop();
    await this.health?.stop();
    this.session.stop();
  }
}
