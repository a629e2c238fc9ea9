// The NVML session the scanner reads through: opened at start, closed and opened again on request
// (SIGHUP: a GPU reset or hot-plugged since is enumerated afresh) and when the driver goes (then
// opened again with capped backoff until it answers). "The driver is down" is said once per outage,
// through onDown, and "answers again" once it does.
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';
import type { NodeReader, NodeSessions } from './node-reader.ts';

export const FIRST_RETRY_MS = 1000;
export const MAX_BACKOFF_MS = 30000;

export interface SessionKeeperOptions {
  sessions: NodeSessions;
  log: Logger;
  /**
   * The driver stopped answering (once per outage; reason 'start' when
   * NVML never opened): every GPU is reported unhealthy until it does.
   */
  onDown(problem: string, reason: string): Promise<void>;
}

export class SessionKeeper {
  private readonly o: SessionKeeperOptions;
  private readonly timers = new TimerOwner();
  private reader: NodeReader | null = null;
  private downFlag = false;
  private stopped = false;
  private libraryPath: string | null = null;

  constructor(o: SessionKeeperOptions) {
    this.o = o;
  }

  /** The open session, or null (none yet, or closed after the driver went). */
  get current(): NodeReader | null {
    return this.reader;
  }

  /** The driver was reported down and has not answered since. */
  get down(): boolean {
    return this.downFlag;
  }

  get library(): string | null {
    return this.libraryPath;
  }

  /** The first open; throws what opening throws (the caller decides whether that is fatal). */
  open(): NodeReader {
    const r = this.o.sessions.open();
    this.reader = r;
    this.libraryPath = r.library;
    this.o.log.info('NVML initialised', { library: r.library, driver: r.driverVersion() });
    return r;
  }

  /** Takes the open session away (to close it once the health thread has let go of it). */
  take(): NodeReader | null {
    const r = this.reader;
    this.reader = null;
    return r;
  }

  /** A scan read fine: the driver answers. */
  up(): void {
    this.downFlag = false;
  }

  /** The driver stopped answering: close the session and report it (once). */
  async lost(problem: string, close: NodeReader | null): Promise<void> {
    close?.close();
    if (this.reader === close) this.reader = null;
    await this.reportDown(problem);
  }

  /** NVML could not be opened at start and that is not fatal: report the driver down now. */
  async startDown(problem: string): Promise<void> {
    this.downFlag = true;
    this.o.log.warn('NVML is not available; retrying (fail-on-init-error is false)', { error: problem });
    await this.o.onDown(problem, 'start');
  }

  private async reportDown(problem: string): Promise<void> {
    if (this.downFlag) return;
    this.downFlag = true;
    this.o.log.warn(
      'the NVIDIA driver does not answer; every GPU is reported unhealthy until it does (re-opening NVML with backoff)',
      { error: problem },
    );
    await this.o.onDown(problem, 'driver gone');
  }

  /** The open session, opening one (with capped backoff while the driver does not answer); null once stopped. */
  async ensure(reason: string): Promise<NodeReader | null> {
    if (this.reader !== null) return this.reader;
    let delay = FIRST_RETRY_MS;
    let last: string | undefined;
    for (;;) {
      if (this.stopped) return null;
      try {
        const r = this.o.sessions.open();
        this.libraryPath = r.library;
        if (this.downFlag || last !== undefined)
          this.o.log.info('NVML answers again', { library: r.library, driver: r.driverVersion(), reason });
        this.reader = r;
        return r;
      } catch (err) {
        const problem = errorText(err);
        if (!this.downFlag) await this.reportDown(problem);
        else if (problem !== last)
          this.o.log.debug('NVML cannot be opened yet', { error: problem, retry_s: delay / 1000 });
        last = problem;
        await this.timers.sleep('retry', delay);
        delay = Math.min(delay * 2, MAX_BACKOFF_MS);
      }
    }
  }

  /** No more opening; the session is shut down (not unloaded: the process is about to exit). */
  stop(): void {
    this.stopped = true;
    this.timers.dispose();
    this.reader?.shutdown();
    this.reader = null;
  }
}
