// What the process holds, for the debug log after a re-discovery: handles by kind (timers, sockets,
// watchers, ...), open file descriptors and heap, so that growth over many of them shows.
import { readdirSync } from 'node:fs';

export function processResources(): Record<string, string | number> {
  const kinds = new Map<string, number>();
  for (const k of process.getActiveResourcesInfo()) kinds.set(k, (kinds.get(k) ?? 0) + 1);
  let fds = -1;
  try {
    fds = readdirSync('/proc/self/fd').length;
  } catch {
    // not Linux: unknown
  }
  const mem = process.memoryUsage();
  return {
    handles: [...kinds]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([k, n]) => `${k}:${n}`)
      .join(','),
    fds,
    heap_kib: Math.round(mem.heapUsed / 1024),
    rss_kib: Math.round(mem.rss / 1024),
  };
}
