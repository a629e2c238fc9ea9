// What decides the advertised resources, from the options: one mapping for the daemon (src/main.ts)
// and for `check`, which plans the same way to say whether the daemon would start.
import type { Sharing } from '../core/sharing.ts';
import type { PlanSettings } from '../core/snapshot.ts';
import type { DraSettings } from './dra-section.ts';
import type { Options } from './options.ts';

/**
 * The plan settings of these options and config file sections. The consumable capacity is DRA's only: in
 * device-plugin mode the section is left out, so one file can serve a node in either mode.
 */
export function planSettings(
  o: Pick<Options, 'deviceIdStrategy' | 'migStrategy' | 'passDeviceSpecs'> & Partial<Pick<Options, 'kubeletApi'>>,
  sharing: Sharing,
  dra: DraSettings = {},
): PlanSettings {
  const on = o.kubeletApi === 'dra';
  const { consumableCapacity, dynamicMig } = dra;
  return {
    deviceIdStrategy: o.deviceIdStrategy,
    sharing,
    migStrategy: o.migStrategy,
    needMigCapabilities: o.passDeviceSpecs,
    ...(consumableCapacity !== undefined && on ? { consumableCapacity } : {}),
    ...(dynamicMig === true && on ? { dynamicMig } : {}),
  };
}
