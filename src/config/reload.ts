// SIGHUP's config reload, decided: which options changed, which of those only take effect at a
// restart (their running values are kept), and whether the sharing, health and dra sections changed.
import type { DraSettings } from './dra-section.ts';
import type { SignalPolicy } from '../core/health-signals.ts';
import type { Sharing } from '../core/sharing.ts';
import { showOption } from './describe-options.ts';
import { OPTION_SPECS } from './option-table.ts';
import type { OptionKey, Options, ParsedOptions } from './options.ts';

/** Options that a config reload cannot change in a running plugin (they need a restart). */
export const RESTART_ONLY_OPTIONS: readonly OptionKey[] = [
  'kubeletSocket',
  'driverRoot',
  'failOnInitError',
  'configFile',
  'logLevel',
  'socketCheckInterval',
  'healthProbeInterval',
  'healthRecovery',
  'healthRecoveryQuietPeriod',
  'migStrategy',
  // Channels are looked for once, at start.
  'imexChannelIds',
  'imexRequired',
  'nfdFeaturesFile',
  'nfdRemoveOnStop',
  'metricsFile',
  'metricsInterval',
  // The control daemons (a unit of their own) were started under it; containers must get their pipes.
  'mpsRoot',
  // The mode and where it talks: a switch is a restart.
  'kubeletApi',
  'kubeconfig',
  'nodeName',
  'draDriverName',
  'kubeletPluginsRegistry',
  'kubeletPluginsDir',
];

export interface ReloadPlan {
  /** The options to run with: the new ones, restart-only ones at their running values. */
  readonly options: Options;
  readonly sharing: Sharing;
  /** Flags (--name) of the options that change now. */
  readonly changed: readonly string[];
  /** Flags of the options that changed in the file but only take effect at a restart. */
  readonly restartOnly: readonly string[];
  readonly sharingChanged: boolean;
  /** The `health` section changed (the health signals' policy). */
  readonly healthChanged: boolean;
  /** The `dra` section changed: consumable capacity or dynamic MIG (DRA mode publishes it at once). */
  readonly draChanged: boolean;
}

const flagOf = (key: OptionKey): string => `--${OPTION_SPECS.find((s) => s.key === key)?.flag ?? key}`;

export function planReload(
  running: Options,
  runningSharing: Sharing,
  next: ParsedOptions,
  runningHealth?: SignalPolicy,
  runningDra: DraSettings = {},
): ReloadPlan {
  const restartOnly = RESTART_ONLY_OPTIONS.filter((k) => showOption(next.options[k]) !== showOption(running[k]));
  const merged: Options = { ...next.options };
  for (const k of RESTART_ONLY_OPTIONS) (merged as unknown as Record<string, unknown>)[k] = running[k];
  const changed = OPTION_SPECS.map((s) => s.key).filter(
    (k) => !RESTART_ONLY_OPTIONS.includes(k) && showOption(merged[k]) !== showOption(running[k]),
  );
  return {
    options: merged,
    sharing: next.sharing,
    changed: changed.map(flagOf),
    restartOnly: restartOnly.map(flagOf),
    sharingChanged: JSON.stringify(next.sharing) !== JSON.stringify(runningSharing),
    healthChanged: JSON.stringify(next.signalPolicy) !== JSON.stringify(runningHealth),
    // Only DRA mode publishes it (plan-settings.ts); the mode is restart-only.
    draChanged:
      running.kubeletApi === 'dra' &&
      (JSON.stringify(next.consumableCapacity) !== JSON.stringify(runningDra.consumableCapacity) ||
        (next.dynamicMig === true) !== (runningDra.dynamicMig === true)),
  };
}
