// Keeps the plugin registered with the kubelet for ever: serve first, then Register; on failure
// retry with capped backoff; on a kick (the kubelet came back, our socket vanished) try at once; when
// the kubelet is gone (its socket removed) report the registration lost and wait for a kick.
// Logs once per change of state, not once per retry: before the first registration a problem is a
// WARN at once; after a loss (a routine kubelet restart) failures stay at debug and the one line is
// the INFO of the new registration, unless it takes longer than `quietMs` (then one WARN).
import type { RegistrationRecorder } from '../core/metrics.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';

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

export class Registrar {
  private readonly deps: RegistrarDeps;
  private state: RegistrarState = 'idle';
  private timer: NodeJS.Timeout | undefined;
  private again = false;
  private reason = 'start';
  private backoffMs: number;
  private attempts = 0;
  private lastProblem: string | undefined;
  private registrations = 0;
  /** Since a registration was lost: the WARN that it takes long is due when this timer fires. */
  private overdue: NodeJS.Timeout | undefined;
  private lostReason: string | undefined;

  constructor(deps: RegistrarDeps) {
    this.deps = deps;
    this.backoffMs = deps.initialBackoffMs ?? 50;
  }

  get current(): RegistrarState {
    return this.state;
  }

  get registrationCount(): number {
    return this.registrations;
  }

  /** Register as soon as possible (cancels a pending backoff; queues behind an attempt in flight). */
  kick(reason: string): void {
    if (this.state === 'stopped') return;
    this.reason = reason;
    if (this.state === 'registered') this.markLost(reason);
    if (this.state === 'registering') {
      this.again = true;
      return;
    }
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    this.backoffMs = this.deps.initialBackoffMs ?? 50;
    void this.attempt();
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
    if (this.overdue !== undefined) clearTimeout(this.overdue);
    const quietMs = this.deps.quietMs ?? 30000;
    this.overdue = setTimeout(() => {
      this.overdue = undefined;
      if (this.state === 'registered' || this.state === 'stopped') return;
      this.deps.log.warn('still not registered with the kubelet; retrying', {
        reason: this.lostReason,
        error: this.lastProblem ?? 'no kubelet socket to register with',
        waited_ms: quietMs,
      });
      this.lostReason = undefined;
    }, quietMs);
    this.overdue.unref?.();
  }

  stop(): void {
    this.state = 'stopped';
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.overdue !== undefined) clearTimeout(this.overdue);
    this.overdue = undefined;
  }

  private stopped(): boolean {
    return this.state === 'stopped';
  }

  private async attempt(): Promise<void> {
    this.state = 'registering';
    this.again = false;
    this.attempts++;
    const reason = this.reason;
    try {
      await this.deps.ensureServing();
      await this.deps.register();
      if (this.stopped()) return;
      this.registrations++;
      this.deps.recorder?.registered();
      if (this.overdue !== undefined) clearTimeout(this.overdue);
      this.overdue = undefined;
      this.lostReason = undefined;
      this.deps.log.info('registered with the kubelet', { reason, attempts: this.attempts });
      this.deps.onRegistered?.(this.attempts, reason);
      this.attempts = 0;
      this.lastProblem = undefined;
      this.backoffMs = this.deps.initialBackoffMs ?? 50;
      this.state = 'registered';
      if (this.again) {
        this.again = false;
        const current = this.deps.upToDate === undefined ? false : await this.deps.upToDate().catch(() => false);
        if (!current && !this.stopped()) this.kick(this.reason);
      }
    } catch (err) {
      if (this.stopped()) return;
      const problem = errorText(err);
      if (problem !== this.lastProblem) {
        // After a loss the kubelet is most likely restarting: quiet until `quietMs` have passed.
        const level = this.overdue !== undefined ? 'debug' : 'warn';
        this.deps.log[level]('cannot register with the kubelet yet; retrying', {
          reason,
          error: problem,
          retry_ms: this.backoffMs,
        });
        this.lastProblem = problem;
      }
      this.state = 'waiting';
      if (this.again) {
        this.kick(this.reason);
        return;
      }
      this.timer = setTimeout(() => {
        this.timer = undefined;
        void this.attempt();
      }, this.backoffMs);
      this.backoffMs = Math.min(this.backoffMs * 2, this.deps.maxBackoffMs ?? 5000);
    }
  }
}
