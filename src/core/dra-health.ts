// DRA's device health, pure: the list the DRAResourceHealth stream sends — each device's health, since when and
// why, from the node snapshot — and whether two lists say the same. Sending it is src/dra/health.ts's. A device
// whose DRA claim's MPS control daemon was asked and does not answer is Unhealthy for as long as it does not.
import type { DraNodeDevice } from './dra-claims.ts';
import { withSignalReasons } from './snapshot-signals.ts';
import { unitsOfSilentClaimDaemons } from './snapshot.ts';
import type { NodeSnapshot } from './snapshot.ts';

export type DeviceHealthState = 'Healthy' | 'Unhealthy';

export interface DraDeviceHealth {
  readonly device: string;
  readonly health: DeviceHealthState;
  /** Unix seconds of the last change (or of `nowSec` when nothing ever happened to it). */
  readonly lastUpdated: number;
  /** Why (the health model's reason), at most MAX_HEALTH_MESSAGE characters; empty when healthy with nothing to say. */
  readonly message: string;
}

export const MAX_HEALTH_MESSAGE = 1024;

function clip(s: string): string {
  return s.length <= MAX_HEALTH_MESSAGE ? s : `${s.slice(0, MAX_HEALTH_MESSAGE - 1)}…`;
}

/**
 * The health of every device, from the snapshot: a MIG device's own (by MIG UUID; a claimed partition's, its
 * instance's once the scan holds it), a GPU's by its UUID, with its GPU's critical health signals; every device
 * Unhealthy while the driver does not answer.
 */
export function deviceHealthList(
  snapshot: Pick<NodeSnapshot, 'health' | 'gpuHealth' | 'migHealth' | 'driverVersion'> &
    Partial<Pick<NodeSnapshot, 'signals' | 'mpsDaemons'>>,
  devices: readonly DraNodeDevice[],
  nowSec: number,
): DraDeviceHealth[] {
  const silent = unitsOfSilentClaimDaemons({ mpsDaemons: snapshot.mpsDaemons ?? new Map() });
  return devices.map((d) => {
    const unit = d.mig?.uuid ?? d.instanceUuid ?? d.gpuUuid;
    const daemon = silent.get(unit);
    if (daemon !== undefined && snapshot.driverVersion !== null) {
      const since = snapshot.mpsDaemons?.get(daemon.daemon)?.since ?? nowSec * 1000;
      const message = `the MPS control daemon of ${daemon.daemon} does not answer: ${daemon.reason}`;
      return { device: d.name, health: 'Unhealthy', lastUpdated: Math.floor(since / 1000), message: clip(message) };
    }
    const h = unit === d.gpuUuid ? snapshot.gpuHealth.get(unit) : snapshot.migHealth.get(unit);
    const health: DeviceHealthState = snapshot.health.get(unit) ?? 'Unhealthy';
    const [since, own] = [h?.since ?? null, h?.reason ?? ''];
    let message = withSignalReasons(h?.state.health === 'Unhealthy' ? own : '', snapshot.signals, d.gpuUuid) || own;
    if (snapshot.driverVersion === null)
      message = `the NVIDIA driver does not answer${message === '' ? '' : ` (last: ${message})`}`;
    else if (!snapshot.health.has(unit)) message = 'the health model has no entry for this device';
    return {
      device: d.name,
      health,
      lastUpdated: since === null ? nowSec : Math.floor(since / 1000),
      message: clip(message),
    };
  });
}

/** Whether two health lists say the same (the stream sends a new message only when they differ). */
export function sameHealth(a: readonly DraDeviceHealth[], b: readonly DraDeviceHealth[]): boolean {
  return (
    a.length === b.length &&
    a.every((x, i) => {
      const y = b[i];
      return (
        y !== undefined &&
        x.device === y.device &&
        x.health === y.health &&
        x.message === y.message &&
        x.lastUpdated === y.lastUpdated
      );
    })
  );
}
