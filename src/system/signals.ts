// The daemon's signals. SIGTERM/SIGINT stop it: whatever hangs, the process is gone within 2 s.
// SIGHUP (systemctl reload) reloads, one at a time; one that arrives while starting runs once the
// daemon has started (its default action would end the process).
import { errorText } from './log.ts';
import type { Logger } from './log.ts';

export interface Daemon {
  stop(): Promise<void>;
  reload(): Promise<void>;
}

const STOP_LIMIT_MS = 1900;

export class Signals {
  private readonly log: Logger;
  private daemon: Daemon | undefined;
  private stopping = false;
  private hupWhileStarting = false;
  private reloads: Promise<void> = Promise.resolve();

  constructor(log: Logger) {
    this.log = log;
    process.on('SIGTERM', () => this.stop('SIGTERM'));
    process.on('SIGINT', () => this.stop('SIGINT'));
    process.on('SIGHUP', () => {
      if (this.daemon !== undefined) return this.reload();
      if (!this.hupWhileStarting) log.info('SIGHUP while starting: the config file is read again once started');
      this.hupWhileStarting = true;
    });
  }

  /** The daemon has started: signals reach it from now on (a SIGHUP that came meanwhile runs now). */
  started(daemon: Daemon): void {
    this.daemon = daemon;
    if (this.hupWhileStarting) this.reload();
  }

  private stop(signal: string): void {
    if (this.stopping) return;
    this.stopping = true;
    this.log.info('stopping', { signal });
    setTimeout(() => { this.log.error('stop took too long; exiting'); process.exit(1); }, STOP_LIMIT_MS).unref();
    void (this.daemon?.stop() ?? Promise.resolve()).then(
      () => { this.log.info('stopped'); process.exit(0); },
      (err: unknown) => { this.log.error('error while stopping', { error: errorText(err) }); process.exit(1); },
    );
  }

  private reload(): void {
    const d = this.daemon;
    if (this.stopping || d === undefined) return;
    this.reloads = this.reloads.then(() => d.reload()).catch((err: unknown) => this.log.error('SIGHUP failed; the running configuration is kept', { error: errorText(err) }));
  }
}
