// Waiting on what a stand-in saw, never on the clock: a value probed now and again on each of an
// emitter's events, with a timeout whose message says what never came (and the stand-in's state).
import type { EventEmitter } from 'node:events';

export function waitOnEvent<T>(
  emitter: EventEmitter,
  event: string,
  probe: () => T | undefined,
  timeoutMs: number,
  timedOut: () => string,
): Promise<T> {
  const now = probe();
  if (now !== undefined) return Promise.resolve(now);
  return new Promise<T>((resolve, reject) => {
    const onEvent = (): void => {
      const v = probe();
      if (v !== undefined) {
        clearTimeout(timer);
        emitter.off(event, onEvent);
        resolve(v);
      }
    };
    const timer = setTimeout(() => {
      emitter.off(event, onEvent);
      reject(new Error(timedOut()));
    }, timeoutMs);
    emitter.on(event, onEvent);
  });
}
