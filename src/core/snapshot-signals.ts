// The health signals of a node snapshot (snapshot.ts): each GPU's evaluated signals by GPU UUID
// (health-signals.ts), carried over by UUID like its health, and the units a critical bad signal
// takes out of service — the GPU and every MIG device on it (replicas follow their unit). Pure.
import type { Gpu } from './devices.ts';
import { badSignals } from './health-signals.ts';
import type { GpuSignals } from './health-signals.ts';
import type { MigLayout } from './mig.ts';
import type { GpuLinkInfo, NvLinkEnd } from './topology/index.ts';

/** Each GPU's signals by GPU UUID. */
export type NodeSignals = ReadonlyMap<string, GpuSignals>;

export const NO_SIGNALS: NodeSignals = new Map();

/** The signals of the GPUs present, carried over by UUID (a GPU that left takes its own with it). */
export function carrySignals(gpus: readonly Gpu[], previous: NodeSignals | undefined): NodeSignals {
  if (previous === undefined || previous.size === 0) return NO_SIGNALS;
  const out = new Map<string, GpuSignals>();
  for (const g of gpus) {
    const s = previous.get(g.uuid);
    if (s !== undefined) out.set(g.uuid, s);
  }
  return out;
}

/** Whether a GPU has a critical signal bad (it is out of service, with everything sharing it). */
export function hasCriticalSignal(signals: NodeSignals, gpuUuid: string): boolean {
  return badSignals(signals.get(gpuUuid), 'critical').length > 0;
}

/** The units (GPU UUIDs and MIG UUIDs) a critical bad signal makes Unhealthy. */
export function signalledUnits(gpus: readonly Gpu[], mig: MigLayout, signals: NodeSignals): ReadonlySet<string> {
  const out = new Set<string>();
  if (signals.size === 0) return out;
  gpus.forEach((g, at) => {
    if (!hasCriticalSignal(signals, g.uuid)) return;
    out.add(g.uuid);
    for (const d of mig.devices) if (d.parent === at) out.add(d.uuid);
  });
  return out;
}

/** The GPU UUID a unit (GPU UUID or MIG UUID) belongs to; undefined for a unit not on these GPUs. */
export function gpuOfUnit(gpus: readonly Gpu[], mig: MigLayout, unit: string): string | undefined {
  if (gpus.some((g) => g.uuid === unit)) return unit;
  const d = mig.devices.find((m) => m.uuid === unit);
  return d === undefined ? undefined : gpus[d.parent]?.uuid;
}

/**
 * The NVLinks in service: each GPU's links less those its nvlink signal says are down, and for each
 * of them one link of the GPU at the far end back to it (both ends count a link; the larger count
 * wins). What GetPreferredAllocation and the DRA nvlinkDomain attribute are built from.
 */
export function liveNvlinks(s: {
  readonly gpus: readonly Gpu[];
  readonly nvlinks: readonly GpuLinkInfo[];
  readonly signals: NodeSignals;
}): readonly GpuLinkInfo[] {
  const down = s.gpus.map((g) => {
    const st = s.signals.get(g.uuid)?.states.nvlink;
    const reading = s.signals.get(g.uuid)?.reading?.values.nvlink;
    const expected = s.signals.get(g.uuid)?.memory.expectedLinks ?? [];
    if (st?.bad !== true || reading === undefined || typeof reading === 'string') return new Set<number>();
    return new Set(expected.filter((l) => !reading.includes(l)));
  });
  if (down.every((d) => d.size === 0)) return s.nvlinks;
  const out = s.nvlinks.map((g, i) => ({
    busId: g.busId,
    links: g.links.filter((l) => l.link === undefined || !down[i]?.has(l.link)) as NvLinkEnd[],
  }));
  s.nvlinks.forEach((g, i) => {
    for (const l of g.links) {
      if (l.link === undefined || !down[i]?.has(l.link) || l.remote !== 'gpu') continue;
      const far = out.find((o) => o.busId.toLowerCase() === l.remoteBusId.toLowerCase());
      const back = far?.links.findIndex((e) => e.remoteBusId.toLowerCase() === g.busId.toLowerCase()) ?? -1;
      if (far !== undefined && back >= 0) far.links.splice(back, 1);
    }
  });
  return out;
}

/**
 * A unit's health message with the reasons of its GPU's critical bad signals after it (each with
 * what the operator does); `message` alone when none is bad, '' when neither says anything.
 */
export function withSignalReasons(message: string, signals: NodeSignals | undefined, gpu: string): string {
  const reasons = badSignals(signals?.get(gpu), 'critical').map((st) => `${st.signal}: ${st.reason}`);
  return [...(message === '' ? [] : [message]), ...reasons].join('; ');
}
