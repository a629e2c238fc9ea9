// What decides the advertised resources, from the options: one mapping for the daemon (src/main.ts)
// and for `check`, which plans the same way to say whether the daemon would start.
import type { Sharing } from '../core/sharing.ts';
import type { PlanSettings } from '../core/snapshot.ts';
import type { Options } from './options.ts';

export function planSettings(
  o: Pick<Options, 'deviceIdStrategy' | 'migStrategy' | 'passDeviceSpecs'>,
  sharing: Sharing,
): PlanSettings {
  return {
    deviceIdStrategy: o.deviceIdStrategy,
    sharing,
    migStrategy: o.migStrategy,
    needMigCapabilities: o.passDeviceSpecs,
  };
}
