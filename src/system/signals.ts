// The daemon's signals. SIGTERM/SIGINT/SIGQUIT stop it (sockets removed): whatever hangs, the
// process is gone within 2 s. SIGHUP (systemctl reload) reloads, one at a time; one that arrives while
// starting runs once the daemon has started (its default action would end the process).
// Every other signal whose default action ends or stops the process is ignored with a log line, so a
// stray `kill -USR2` neither kills the daemon silently nor leaves its socket behind: SIGUSR1 (Node's
// debugger signal: the executable is built with --disable-sigusr1, so it opens no inspector), SIGUSR2,
// SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT, SIGXCPU, SIGXFSZ, SIGTSTP, SIGTTIN, SIGTTOU.
// Left as they are: the fault signals (SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS),
// which report a broken process (it dumps core and systemd restarts it); those ignored by default
// (SIGCHLD, SIGURG, SIGWINCH, SIGCONT; SIGPIPE, which Node ignores); and the realtime signals, which
// Node cannot listen to (ignoreRealtimeSignals sets them to SIG_IGN, without a log line).
import { errorText, exitProcess } from './log.ts';
import type { Logger } from './log.ts';
import type { Koffi } from './native.ts';

export interface Daemon {
  stop(): Promise<void>;
  reload(): Promise<void>;
}

const STOP_LIMIT_MS = 1900;

/** Signals ignored with a log line (see the top of this file), with what the line adds. */
export const IGNORED_SIGNALS: Readonly<Partial<Record<NodeJS.Signals, string>>> = {
  SIGUSR1: 'this build has no debugger (Node is started with --disable-sigusr1)',
  SIGUSR2: '',
  SIGALRM: '',
  SIGVTALRM: '',
  SIGPROF: '',
  SIGIO: '',
  SIGPWR: '',
  SIGSTKFLT: '',
  SIGXCPU: '',
  SIGXFSZ: '',
  SIGTSTP: '',
  SIGTTIN: '',
  SIGTTOU: '',
};

/** Linux's realtime signals as the C library hands them out (glibc keeps 32 and 33 for itself). */
const SIGRTMIN = 34;
const SIGRTMAX = 64;

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
    process.on('SIGQUIT', () => this.stop('SIGQUIT'));
    for (const [sig, why] of Object.entries(IGNORED_SIGNALS)) {
      process.on(sig as NodeJS.Signals, () =>
        log.warn(
          `${sig} ignored: the plugin stops on SIGTERM, SIGINT or ` +
            `SIGQUIT and reloads on SIGHUP${why === '' ? '' : `; ${why}`}`,
        ),
      );
    }
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
    setTimeout(() => {
      this.log.error('stop took too long; exiting');
      exitProcess(1);
    }, STOP_LIMIT_MS).unref();
    void (this.daemon?.stop() ?? Promise.resolve()).then(
      () => {
        this.log.info('stopped');
        exitProcess(0);
      },
      (err: unknown) => {
        this.log.error('error while stopping', { error: errorText(err) });
        exitProcess(1);
      },
    );
  }

  private reload(): void {
    const d = this.daemon;
    if (this.stopping || d === undefined) return;
    this.reloads = this.reloads
      .then(() => d.reload())
      .catch((err: unknown) =>
        this.log.error('SIGHUP failed; the running configuration is kept', { error: errorText(err) }),
      );
  }
}

/**
 * Sets the realtime signals (SIGRTMIN..SIGRTMAX), whose default action ends the process and which
 * Node cannot listen to, to SIG_IGN through the C library. `signal` is declared with an integer
 * handler: SIG_IGN is the pointer value 1, passed in the same register as a pointer.
 */
export function ignoreRealtimeSignals(koffi: Koffi): void {
  const libc = koffi.load('libc.so.6');
  const signal = libc.func('intptr_t signal(int sig, intptr_t handler)') as (
    sig: number,
    handler: number,
  ) => number | bigint;
  const SIG_IGN = 1;
  for (let sig = SIGRTMIN; sig <= SIGRTMAX; sig++) signal(sig, SIG_IGN);
  // With --disable-sigusr1 Node leaves SIGUSR1 blocked in every thread: a SIGUSR1 then does nothing,
  // not even the log line. Unblocked in the main thread, it reaches the listener above.
  if (process.execArgv.includes('--disable-sigusr1')) {
    const sigmask = libc.func('int pthread_sigmask(int how, const uint8_t *set, uint8_t *oldset)') as (
      how: number,
      set: Buffer,
      old: null,
    ) => number;
    const SIG_UNBLOCK = 1;
    const SIGUSR1 = 10;
    const set = Buffer.alloc(128);
    set[Math.floor((SIGUSR1 - 1) / 8)] = 1 << ((SIGUSR1 - 1) % 8);
    sigmask(SIG_UNBLOCK, set, null);
  }
}
