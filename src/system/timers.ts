// Named concurrency helpers, so that no class hand-rolls pending/running/drain flags or keeps
// timers it may forget to clear:
// * TimerOwner: every timer (and anything else with a dispose step) one object holds, by name,
//   replaced when set again and all cleared by dispose();
// * CoalescingQueue: jobs run one at a time; requests that arrive while one runs fold into one more
//   run (their arguments merged), and every caller learns when a run that started after its request
//   has finished.
// * KeyedQueue: jobs with the same key run one after another, in the order they came, each to its own
//   result; jobs with different keys run side by side.
// Timers are unref'd (none of them keeps the process alive on its own), except a sleep() someone awaits.

/** Holds named timers; dispose() clears every one. */
export class TimerOwner {
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private disposed = false;

  /**
   * Runs fn once after ms; replaces the timer of that name. Nothing after dispose(). keepAlive: the
   * timer holds the process up (work in progress waits on it), unlike the others.
   */
  after(name: string, ms: number, fn: () => void, keepAlive = false): void {
    this.clear(name);
    if (this.disposed) return;
    const t = setTimeout(() => {
      this.timers.delete(name);
      fn();
    }, ms);
    if (!keepAlive) t.unref();
    this.timers.set(name, t);
  }

  /** Runs fn every ms; replaces the timer of that name. Nothing after dispose(). */
  every(name: string, ms: number, fn: () => void): void {
    this.clear(name);
    if (this.disposed) return;
    const t = setInterval(fn, ms);
    t.unref();
    this.timers.set(name, t);
  }

  has(name: string): boolean {
    return this.timers.has(name);
  }

  /** Clears the timer of that name (a sleep() under it resolves at once). */
  clear(name: string): void {
    const t = this.timers.get(name);
    if (t !== undefined) clearTimeout(t);
    this.timers.delete(name);
    const wake = this.wakers.get(name);
    this.wakers.delete(name);
    wake?.();
  }

  /**
   * A promise resolving after ms, or at once when cleared or disposed meanwhile (never rejects). The
   * timer holds the process up: something is waiting on it.
   */
  sleep(name: string, ms: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.disposed) return resolve();
      this.after(
        name,
        ms,
        () => {
          this.wakers.delete(name);
          resolve();
        },
        true,
      );
      this.wakers.set(name, resolve);
    });
  }

  private readonly wakers = new Map<string, () => void>();

  dispose(): void {
    this.disposed = true;
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
    for (const w of this.wakers.values()) w();
    this.wakers.clear();
  }
}

/**
 * Runs `job` one at a time. request(arg) folds into the pending run (merge(pending, arg)) and
 * resolves once a run that started after the request has finished (rejecting with that run's error).
 */
export class CoalescingQueue<A> {
  private readonly job: (arg: A) => Promise<void>;
  private readonly merge: (pending: A, next: A) => A;
  private pending: { arg: A; done: Promise<void>; resolve: () => void; reject: (err: unknown) => void } | null = null;
  private running: Promise<void> | null = null;
  private closed = false;

  constructor(job: (arg: A) => Promise<void>, merge: (pending: A, next: A) => A) {
    this.job = job;
    this.merge = merge;
  }

  /** A run is under way. */
  get busy(): boolean {
    return this.running !== null;
  }

  request(arg: A): Promise<void> {
    if (this.closed) return Promise.resolve();
    if (this.pending !== null) {
      this.pending.arg = this.merge(this.pending.arg, arg);
      return this.pending.done;
    }
    let resolve!: () => void;
    let reject!: (err: unknown) => void;
    const done = new Promise<void>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    this.pending = { arg, done, resolve, reject };
    if (this.running === null) this.running = this.drain();
    return done;
  }

  private async drain(): Promise<void> {
    while (this.pending !== null && !this.closed) {
      const p = this.pending;
      this.pending = null;
      try {
        await this.job(p.arg);
        p.resolve();
      } catch (err) {
        p.reject(err);
      }
    }
    // Closed with a request still pending: it resolves (nothing more runs).
    this.pending?.resolve();
    this.pending = null;
    this.running = null;
  }

  /** No run starts after this; resolves when the one under way (if any) has finished. */
  async close(): Promise<void> {
    this.closed = true;
    await this.running;
  }
}

/** Jobs of one key run one after another, in order; each caller gets its own job's result or error. */
export class KeyedQueue<K> {
  /** Per key, the end of the jobs so far: the next one runs after it. */
  private readonly tails = new Map<K, Promise<unknown>>();

  run<T>(key: K, job: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const result = prev.then(job);
    const tail = result.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return result;
  }

  /** Resolves once every job queued so far has finished. */
  async drain(): Promise<void> {
    await Promise.all([...this.tails.values()]);
  }
}
