// What `mps-control-daemon` reads: the plugin's own options (parseOptions: command line, environment
// file, config file, with `--mps-root` and `sharing.mps` and their refusals), turned into the control
// daemons' plan through the plugin's own planning (core/sharing.ts planResources → core/mps.ts
// planMpsDaemons), so the two units cannot disagree on which GPUs a resource has or on its limits.
import { planMpsDaemons } from '../core/mps.ts';
import type { MpsDaemonPlan } from '../core/mps.ts';
import type { Gpu } from '../core/devices.ts';
import { planResources } from '../core/sharing.ts';
import type { Sharing } from '../core/sharing.ts';
import { parseOptions } from '../cli/options.ts';
import type { Options } from '../cli/options.ts';

export interface MpsSettings {
  readonly options: Options;
  /** The MPS root (--mps-root); '' when not set, which parseOptions refuses when sharing.mps is configured. */
  readonly mpsRoot: string;
  readonly sharing: Sharing;
}

/** The options and sharing for the subcommand; throws OptionError/ConfigError naming what is wrong. */
export function readMpsSettings(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): MpsSettings {
  const parsed = parseOptions(argv, env);
  return { options: parsed.options, mpsRoot: parsed.options.mpsRoot, sharing: parsed.sharing };
}

/** The control daemons for these GPUs: one per resource of sharing.mps, none without it. */
export function mpsDaemonPlans(settings: Pick<MpsSettings, 'options' | 'sharing'>, gpus: readonly Gpu[]): MpsDaemonPlan[] {
  if (settings.sharing.mps === undefined || settings.sharing.mps === null) return [];
  return planMpsDaemons(planResources(gpus, settings.options.deviceIdStrategy, settings.sharing), gpus);
}
