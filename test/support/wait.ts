// The one way a test waits: on something the code under test did. A probe reads the state the test
// waits for; it is read at once and again each time one of the triggers says something happened (an
// event emitted, a line logged, a file written, a process ended: process-exit.ts). The deadline only fails a wait that
// never came true; no wait resolves because time passed, and nothing is re-read on a clock.
//
//   const devices = await waitFor(() => kubelet.devices('nvidia.com/gpu'), {
//     on: onEvent(kubelet, 'devices'),
//     what: 'a device list',
//   });
import type { EventEmitter } from 'node:events';
import { type FSWatcher, watch } from 'node:fs';
import { CoalescingQueue } from '../../src/system/timers.ts';

/**
 * Something that happens: calls `again` each time the state a probe reads may have changed, from
 * when it is subscribed until the returned function unsubscribes it.
 */
export type Trigger = (again: () => void) => () => void;

export interface WaitOptions {
  /** What never came, for the error at the deadline (a function: read then, so it can show the state). */
  what: string | (() => string | Promise<string>);
  /** When to read the probe again. */
  on: Trigger | readonly Trigger[];
  /** The liveness bound, in ms (default 30 s): past it the wait fails. It never makes a wait succeed. */
  deadlineMs?: number;
  /**
   * Why the wait can no longer come true (the process that would do it has exited), or undefined:
   * read after each probe that found nothing; a reason fails the wait at once.
   */
  hopeless?: () => string | undefined;
}

/** The real timer functions, taken before any test mocks them: a deadline is wall-clock time even then. */
const { setTimeout: startDeadline, clearTimeout: clearDeadline } = globalThis;

/**
 * Resolves with the first value other than undefined the probe returns, read now and after each
 * trigger (reads never overlap: triggers during a read fold into one more read). A probe that throws
 * counts as "not yet"; its last error is shown if the deadline passes.
 */
export function waitFor<T>(
  probe: () => T | undefined | Promise<T | undefined>,
  opts: WaitOptions,
): Promise<NonNullable<T>> {
  const deadlineMs = opts.deadlineMs ?? 30_000;
  return new Promise<NonNullable<T>>((resolve, reject) => {
    let done = false;
    let lastError: unknown;
    const unsubscribe: (() => void)[] = [];
    const finish = (): void => {
      done = true;
      clearDeadline(deadline);
      for (const u of unsubscribe) u();
      void reads.close();
    };
    const reads = new CoalescingQueue<null>(
      async () => {
        if (done) return;
        let v: T | undefined;
        try {
          v = await probe();
        } catch (err) {
          lastError = err;
          return;
        }
        if (done) return;
        if (v !== undefined && v !== null) {
          finish();
          resolve(v as NonNullable<T>);
          return;
        }
        const reason = opts.hopeless?.();
        if (reason !== undefined) {
          finish();
          reject(new Error(reason));
        }
      },
      () => null,
    );
    const again = (): void => {
      if (!done) void reads.request(null);
    };
    const deadline = startDeadline(async () => {
      if (done) return;
      finish();
      let what: string;
      try {
        what = typeof opts.what === 'string' ? opts.what : await opts.what();
      } catch (err) {
        what = `(describing the wait failed: ${(err as Error).message})`;
      }
      const last = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
      reject(new Error(`not within ${deadlineMs} ms${last}: ${what}`));
    }, deadlineMs);
    for (const t of Array.isArray(opts.on) ? opts.on : [opts.on as Trigger]) unsubscribe.push(t(again));
    again();
  });
}

/** Like waitFor, for a condition: resolves once pred() is true. */
export async function waitUntil(pred: () => boolean | Promise<boolean>, opts: WaitOptions): Promise<void> {
  await waitFor(async () => ((await pred()) ? true : undefined), opts);
}

/** Each of these events of an emitter. */
export function onEvent(emitter: EventEmitter, ...events: string[]): Trigger {
  return (again) => {
    for (const e of events) emitter.on(e, again);
    return () => {
      for (const e of events) emitter.off(e, again);
    };
  };
}

/** Anything created, written, renamed or removed in a directory (inotify; the directory must exist). */
export function onFileChange(dir: string): Trigger {
  return (again) => {
    const w: FSWatcher = watch(dir, { persistent: false }, again);
    w.on('error', again);
    return () => w.close();
  };
}
