// The health signals of a node snapshot (snapshot.ts): each GPU's evaluated signals by GPU UUID
// (health-signals.ts), carried over by UUID like its health, and the units a critical bad signal
// takes out of service — the GPU and every MIG device on it (replicas follow their unit). Pure.
import type { Gpu } from './devices.ts';
import { badSignals } from './health-signals.ts';
import type { GpuSignals } from './health-signals.ts';
import type { MigLayout } from './mig.ts';

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
