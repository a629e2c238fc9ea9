// What decides the advertised resources, from the options: one mapping for the daemon (src/main.ts)
// and for `check`, which plans the same way to say whether the daemon would start.
import type { ConsumableCapacity } from '../core/dra-capacity.ts';
import type { Sharing } from '../core/sharing.ts';
import type { PlanSettings } from '../core/snapshot.ts';
import type { Options } from './options.ts';

/**
 * The plan settings of these options and config file sections. The consumable capacity is DRA's only: in
 * device-plugin mode the section is left out, so one file can serve a node in either mode.
 */
export function planSettings(
  o: Pick<Options, 'deviceIdStrategy' | 'migStrategy' | 'passDeviceSpecs'> & Partial<Pick<Options, 'kubeletApi'>>,
  sharing: Sharing,
  consumableCapacity?: ConsumableCapacity,
): PlanSettings {
  return {
    deviceIdStrategy: o.deviceIdStrategy,
    sharing,
    migStrategy: o.migStrategy,
    needMigCapabilities: o.passDeviceSpecs,
    ...(consumableCapacity !== undefined && o.kubeletApi === 'dra' ? { consumableCapacity } : {}),
  };
}
