// Gives memory back after a burst of work. Node keeps what a burst made it take (V8's heap pages,
// freed malloc chunks) for as long as it runs; Go's runtime hands such memory back to the OS by
// itself. Here, once the heap has grown since the last time and the event loop has then been idle
// for a whole check interval, one full garbage collection and glibc's malloc_trim(0) return the
// freed pages. An idle daemon pays one cheap check per interval and nothing else; a busy one is
// never interrupted (a collection runs only after a quiet interval). Growth is read as the resident
// set, not the heap: what hostile requests leave behind is mostly outside it (buffers, malloc).
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { Logger } from './log.ts';
import type { Koffi } from './native.ts';

/** What one check sees: how much of the interval the event loop was busy, and the resident set. */
export interface MemoryCheck {
  readonly busyFraction: number;
  readonly rssBytes: number;
}

export interface CompactionPolicy {
  /** Growth of the resident set since the last compaction (or start) that makes one worth doing. */
  readonly growthBytes: number;
  /** Busier than this, the interval is not quiet. */
  readonly quietBusyFraction: number;
}

// Quiet: at most 3 % busy. The first interval after a burst holds V8's own clean-up collection
// (measured at 1.3–2.2 % busy), which a 1 % bound took for work, putting the compaction off by one
// more interval (10–15 s after the burst instead of 5–10).
export const DEFAULT_POLICY: CompactionPolicy = { growthBytes: 4 * 1024 * 1024, quietBusyFraction: 0.03 };

/**
 * Whether to compact now: the resident set grew past the threshold
 * since `baselineBytes`, and the last interval was quiet.
 */
export function shouldCompact(
  check: MemoryCheck,
  baselineBytes: number,
  policy: CompactionPolicy = DEFAULT_POLICY,
): boolean {
  return check.busyFraction <= policy.quietBusyFraction && check.rssBytes - baselineBytes >= policy.growthBytes;
}

export interface IdleCompaction {
  stop(): void;
}

/** Starts the checks (one unref'd timer). Without glibc's malloc_trim only the collection runs. */
export function startIdleCompaction(koffi: Koffi, log: Logger, intervalMs = 5000): IdleCompaction {
  // Made on the first compaction, not at start: a new context and a library lookup cost start-up time.
  let tools:
    | {
        gc: (options: { type: 'major'; execution: 'sync'; flavor: 'last-resort' }) => void;
        trim: ((pad: number) => number) | null;
      }
    | undefined;
  const compactionTools = (): NonNullable<typeof tools> => {
    if (tools !== undefined) return tools;
    // A collection on request: V8 offers it only with --expose-gc, which a new context picks up
    // (the flag is not in the executable's own flags, which would change what its code cache is
    // checked against).
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as NonNullable<typeof tools>['gc'];
    let trim: ((pad: number) => number) | null = null;
    try {
      trim = koffi.load('libc.so.6').func('int malloc_trim(size_t pad)') as (pad: number) => number;
    } catch (err) {
      log.debug('malloc_trim is not available; only the heap is compacted', {
        error: err instanceof Error ? err.message : String(err),
      });
    }
    tools = { gc, trim };
    return tools;
  };
  let baseline = process.memoryUsage.rss();
  let last = performance.eventLoopUtilization();
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization();
    const busy = performance.eventLoopUtilization(now, last).utilization;
    last = now;
    const rssBytes = process.memoryUsage.rss();
    if (!shouldCompact({ busyFraction: busy, rssBytes }, baseline)) {
      // It may also shrink on its own (V8's memory reducer): follow it down, so that growth is counted from there.
      baseline = Math.min(baseline, rssBytes);
      return;
    }
    const t0 = performance.now();
    try {
      // Synchronous: a pause of some milliseconds, taken only after a quiet interval. (An
      // asynchronous one returns before the sweeper has freed the pages that malloc_trim and the
      // OS should get back.)
      const { gc, trim } = compactionTools();
      gc({ type: 'major', execution: 'sync', flavor: 'last-resort' });
      trim?.(0);
    } catch (err) {
      log.debug('idle compaction failed', { error: err instanceof Error ? err.message : String(err) });
    }
    // What is left (code compiled meanwhile, pages of the executable it touched) is the new floor.
    baseline = process.memoryUsage.rss();
    last = performance.eventLoopUtilization();
    if (log.enabled('debug')) {
      log.debug('gave memory back after a busy spell', {
        rss_before_mib: (rssBytes / 1048576).toFixed(1),
        rss_mib: (baseline / 1048576).toFixed(1),
        ms: (performance.now() - t0).toFixed(1),
      });
    }
  }, intervalMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
