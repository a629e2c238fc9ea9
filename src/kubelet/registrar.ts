// Keeps the plugin registered with the kubelet for ever: serve first, then Register; on failure
// retry with capped backoff; on a kick (the kubelet came back, our socket vanished) try at once; when
// the kubelet is gone (its socket removed) report the registration lost and wait for a kick.
// Logs once per change of state, not once per retry: before the first registration a problem is a
// WARN at once; after a loss (a routine kubelet restart) failures stay at debug and the one line is
// the INFO of the new registration, unless it takes longer than `quietMs` (then one WARN).
// One attempt at a time (CoalescingQueue): kicks during an attempt fold into one more; the backoff
// and the quiet period are named timers (TimerOwner).
import type { RegistrationRecorder } from '../core/metrics.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';

export interface RegistrarDeps {
  /** Makes sure our socket exists and is served (recreating it if needed). */
  ensureServing(): Promise<void>;
  /** One Register call. */
  register(): Promise<void>;
  /**
   * Whether the registration just made still stands (same kubelet socket, same plugin socket). A kick
   * that arrived during an attempt leads to another attempt only if it does not.
   */
  upToDate?(): Promise<boolean>;
  /** Called after every successful registration. */
  onRegistered?(attempts: number, reason: string): void;
  /** Called when a registration stops counting (a kick while registered: the kubelet or our socket changed). */
  onUnregistered?(reason: string): void;
  log: Logger;
  /** Counts every registration the kubelet accepted (metrics). */
  recorder?: RegistrationRecorder;
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** How long after a loss of the registration failures stay at debug (default 30 s). */
  quietMs?: number;
}

export type RegistrarState = 'idle' | 'registering' | 'registered' | 'waiting' | 'stopped';

/** Why an attempt runs: a kick (the backoff starts over) or the backoff's retry timer. */
interface AttemptRequest {
  readonly reason: string;
  readonly retry: boolean;
}

/** Timer names. */
const RETRY = 'retry';
/** Since a registration was lost: the WARN that it takes long is due when this fires. */
const OVERDUE = 'overdue';

export class Registrar {
  private readonly deps: RegistrarDeps;
  private state: RegistrarState = 'idle';
  private readonly timers = new TimerOwner();
  private readonly attempts = new CoalescingQueue<AttemptRequest>(
    (req) => this.attempt(req),
    (pending, next) => ({ reason: next.reason, retry: pending.retry && next.retry }),
  );
  private backoffMs: number;
  private tries = 0;
  private lastProblem: string | undefined;
  private registrations = 0;
  private lostReason: string | undefined;

  constructor(deps: RegistrarDeps) {
    this.deps = deps;
    this.backoffMs = this.initialBackoff();
  }

  get current(): RegistrarState {
    return this.state;
  }

  get registrationCount(): number {
    return this.registrations;
  }

  private initialBackoff(): number {
    return this.deps.initialBackoffMs ?? 50;
  }

  /** Register as soon as possible (cancels a pending backoff; queues behind an attempt in flight). */
  kick(reason: string): void {
    if (this.state === 'stopped') return;
    if (this.state === 'registered') {
      this.markLost(reason);
      this.state = 'idle';
    }
    this.timers.clear(RETRY);
    void this.attempts.request({ reason, retry: false });
  }

  /**
   * The kubelet is gone (its socket removed): the registration no longer stands, and there is nothing
   * to register with until a kick says the kubelet is back. An attempt in flight fails on its own.
   */
  lost(reason: string): void {
    if (this.state !== 'registered') return;
    this.markLost(reason);
    this.state = 'idle';
  }

  private markLost(reason: string): void {
    this.lostReason = reason;
    this.lastProblem = undefined;
    this.deps.log.debug('the registration with the kubelet no longer stands', { reason });
    this.deps.onUnregistered?.(reason);
    const quietMs = this.deps.quietMs ?? 30000;
    this.timers.after(OVERDUE, quietMs, () => {
      if (this.state === 'registered' || this.state === 'stopped') return;
      this.deps.log.warn('still not registered with the kubelet; retrying', {
        reason: this.lostReason,
        error: this.lastProblem ?? 'no kubelet socket to register with',
        waited_ms: quietMs,
      });
      this.lostReason = undefined;
    });
  }

  stop(): void {
    this.state = 'stopped';
    this.timers.dispose();
    void this.attempts.close();
  }

  private stopped(): boolean {
    return this.state === 'stopped';
  }

  /**
   * One attempt. A kick that arrived during the one before, which registered, leads to an attempt
   * only if that registration no longer stands (then it is lost now).
   */
  private async attempt(req: AttemptRequest): Promise<void> {
    if (this.stopped()) return;
    this.timers.clear(RETRY);
    if (this.state === 'registered') {
      const current = this.deps.upToDate === undefined ? false : await this.deps.upToDate().catch(() => false);
      if (current || this.stopped()) return;
      this.markLost(req.reason);
    }
    if (!req.retry) this.backoffMs = this.initialBackoff();
    this.state = 'registering';
    this.tries++;
    try {
      await this.deps.ensureServing();
      await this.deps.register();
    } catch (err) {
      this.failed(req.reason, err);
      return;
    }
    if (!this.stopped()) this.succeeded(req.reason);
  }

  private succeeded(reason: string): void {
    this.registrations++;
    this.deps.recorder?.registered();
    this.timers.clear(OVERDUE);
    this.lostReason = undefined;
    this.deps.log.info('registered with the kubelet', { reason, attempts: this.tries });
    this.deps.onRegistered?.(this.tries, reason);
    this.tries = 0;
    this.lastProblem = undefined;
    this.backoffMs = this.initialBackoff();
    this.state = 'registered';
  }

  private failed(reason: string, err: unknown): void {
    if (this.stopped()) return;
    const problem = errorText(err);
    if (problem !== this.lastProblem) {
      // After a loss the kubelet is most likely restarting: quiet until `quietMs` have passed.
      const level = this.timers.has(OVERDUE) ? 'debug' : 'warn';
      this.deps.log[level]('cannot register with the kubelet yet; retrying', {
        reason,
        error: problem,
        retry_ms: this.backoffMs,
      });
      this.lastProblem = problem;
    }
    this.state = 'waiting';
    // A kick that arrived meanwhile runs next and clears this timer. It holds the process up: with
    // nothing served yet, the retry is the daemon's only work.
    this.timers.after(RETRY, this.backoffMs, () => void this.attempts.request({ reason, retry: true }), true);
    this.backoffMs = Math.min(this.backoffMs * 2, this.deps.maxBackoffMs ?? 5000);
  }
}
