// Gives memory back after a burst of work. Node keeps what a burst made it take (V8's heap pages,
// freed malloc chunks) for as long as it runs; Go's runtime hands such memory back to the OS by
// itself. Here, once the heap has grown since the last time and the event loop has then been idle
// for a whole check interval, one full garbage collection and glibc's malloc_trim(0) return the
// freed pages. An idle daemon pays one cheap check per interval and nothing else; a busy one is
// never interrupted (a collection runs only after a quiet interval).
import { getHeapStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { Logger } from './log.ts';
import type { Koffi } from './native.ts';

/** What one check sees: how much of the interval the event loop was busy, and the heap in use. */
export interface MemoryCheck {
  readonly busyFraction: number;
  readonly heapUsedBytes: number;
}

export interface CompactionPolicy {
  /** Growth of the used heap since the last compaction (or start) that makes one worth doing. */
  readonly growthBytes: number;
  /** Busier than this, the interval is not quiet. */
  readonly quietBusyFraction: number;
}

export const DEFAULT_POLICY: CompactionPolicy = { growthBytes: 2 * 1024 * 1024, quietBusyFraction: 0.01 };

/** Whether to compact now: the heap grew past the threshold since `baselineBytes`, and the last interval was quiet. */
export function shouldCompact(check: MemoryCheck, baselineBytes: number, policy: CompactionPolicy = DEFAULT_POLICY): boolean {
  return check.busyFraction <= policy.quietBusyFraction && check.heapUsedBytes - baselineBytes >= policy.growthBytes;
}

export interface IdleCompaction {
  stop(): void;
}

/** Starts the checks (one unref'd timer). Without glibc's malloc_trim only the collection runs. */
export function startIdleCompaction(koffi: Koffi, log: Logger, intervalMs = 5000): IdleCompaction {
  // A collection on request: V8 offers it only with --expose-gc, which a new context picks up
  // (the flag is not in the executable's own flags, which would change what its code cache is
  // checked against).
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as (options: { type: 'major'; execution: 'sync'; flavor: 'last-resort' }) => void;
  let trim: ((pad: number) => number) | null = null;
  try {
    trim = koffi.load('libc.so.6').func('int malloc_trim(size_t pad)') as (pad: number) => number;
  } catch (err) {
    log.debug('malloc_trim is not available; only the heap is compacted', { error: err instanceof Error ? err.message : String(err) });
  }
  let baseline = getHeapStatistics().used_heap_size;
  let last = performance.eventLoopUtilization();
  let running = false;
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization();
    const busy = performance.eventLoopUtilization(now, last).utilization;
    last = now;
    const heapUsedBytes = getHeapStatistics().used_heap_size;
    if (running || !shouldCompact({ busyFraction: busy, heapUsedBytes }, baseline)) {
      // The heap may also shrink on its own: follow it down, so that growth is counted from there.
      baseline = Math.min(baseline, heapUsedBytes);
      return;
    }
    running = true;
    const t0 = performance.now();
    const rssBefore = process.memoryUsage.rss();
    try {
      // Synchronous: a pause of some milliseconds, taken only after a quiet interval. (An
      // asynchronous one returns before the sweeper has freed the pages that malloc_trim and the
      // OS should get back.)
      gc({ type: 'major', execution: 'sync', flavor: 'last-resort' });
      trim?.(0);
    } catch (err) {
      log.debug('idle compaction failed', { error: err instanceof Error ? err.message : String(err) });
    }
    baseline = getHeapStatistics().used_heap_size;
    last = performance.eventLoopUtilization();
    running = false;
    if (log.enabled('debug')) {
      log.debug('gave memory back after a busy spell', { rss_before_mib: (rssBefore / 1048576).toFixed(1), rss_mib: (process.memoryUsage.rss() / 1048576).toFixed(1), ms: (performance.now() - t0).toFixed(1) });
    }
  }, intervalMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
