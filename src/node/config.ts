// The configuration in force and SIGHUP's reload of it. The options and the sharing section are
// turned into what every mode reads (NodeSettings); a reload reads the config file
// again, keeps restart-only options at their running values (config/reload.ts), and hands the result to
// the live node, whose reconfigure() is the transaction: a config that does not fit is refused and
// the running one kept.
import { parseOptions } from '../config/parse-options.ts';
import type { Options, ParsedOptions } from '../config/options.ts';
import { parseHealthSettings } from '../core/health-policy.ts';
import type { HealthSettings } from '../core/health-policy.ts';
import { DEFAULT_SIGNAL_POLICY, signalPolicyWithEnvironment } from '../core/health-signals.ts';
import type { SignalPolicy } from '../core/health-signals.ts';
import { planSettings } from '../config/plan-settings.ts';
import { planReload } from '../config/reload.ts';
import { draOf } from '../config/dra-section.ts';
import type { DraSettings } from '../config/dra-section.ts';
import type { Sharing } from '../core/sharing.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import type { NodeSettings } from './consumer.ts';
import type { LiveNode } from './live-node.ts';

/** What the daemon runs with: the options, the sharing section, and what they make for the live node. */
export interface RunningConfig extends NodeSettings {
  readonly options: Options;
  readonly sharing: Sharing;
  /** The config file's `health` section as read (before the environment). */
  readonly healthSection?: SignalPolicy;
  /** DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS, read at start. */
  readonly health?: HealthSettings;
  readonly signalPolicy: SignalPolicy;
}

/**
 * The running configuration of some options: the health signals' policy is the file's `health`
 * section (the defaults without one) with the environment's signal names over it; the `dra` section's
 * consumable capacity goes into the plan (DRA mode only).
 */
export function runningConfig(
  o: Options,
  sharing: Sharing,
  healthSection?: SignalPolicy,
  health?: HealthSettings,
  dra: DraSettings = {},
): RunningConfig {
  const section = healthSection ?? DEFAULT_SIGNAL_POLICY;
  return {
    options: o,
    sharing,
    plan: planSettings(o, sharing, dra),
    ...(healthSection === undefined ? {} : { healthSection }),
    ...(health === undefined ? {} : { health }),
    signalPolicy: health === undefined ? section : signalPolicyWithEnvironment(section, health),
  };
}

/**
 * SIGHUP's config reload: `read` parses the options again (argv and environment, the file among
 * them). A bad file is refused naming why; the running configuration is kept. Returns whether a
 * new configuration is in force.
 */
export async function reloadConfig(
  node: LiveNode<RunningConfig>,
  read: () => ParsedOptions,
  log: Logger,
): Promise<boolean> {
  const running = node.config;
  const file = running.options.configFile;
  if (file === null) {
    log.info(
      'SIGHUP: there is no config file to reload (neither ' +
        '--config-file nor CONFIG_FILE is set); looking at the GPUs again',
    );
    return false;
  }
  try {
    const next = read();
    const { consumableCapacity, dynamicMig } = running.plan;
    const dra = { ...(consumableCapacity ? { consumableCapacity } : {}), ...(dynamicMig ? { dynamicMig } : {}) };
    const r = planReload(running.options, running.sharing, next, running.healthSection, dra);
    if (r.restartOnly.length > 0)
      log.warn('config reload: some changed options take effect only at restart; their running values are kept', {
        options: r.restartOnly,
      });
    if (r.changed.length === 0 && !r.sharingChanged && !r.healthChanged && !r.draChanged) {
      log.info('config reloaded; nothing to change', { file });
      return false;
    }
    // The new settings are in force while their snapshot is applied, so the labels written from it
    // are the new ones; a refused plan puts the running ones back (LiveNode.reconfigure).
    const config = runningConfig(r.options, r.sharing, next.signalPolicy, running.health, draOf(next));
    await node.reconfigure(config, 'config reloaded');
    const sections = [
      ...(r.sharingChanged ? ['sharing'] : []),
      ...(r.healthChanged ? ['health'] : []),
      ...(r.draChanged ? ['dra'] : []),
    ];
    log.info('config reloaded', { file, changed: [...r.changed, ...sections] });
    return true;
  } catch (err) {
    log.warn('config reload refused; the running configuration is kept', {
      file,
      error: errorText(err).replace(`config file ${file}: `, ''),
    });
    return false;
  }
}

/**
 * Whether scans read the node facts (compute capability, CUDA driver version): DRA's ResourceSlices
 * always carry them; otherwise the node labels need them, and with a config file so may MPS (its
 * client limit), since SIGHUP may turn it on.
 */
export function readsNodeFacts(o: Pick<Options, 'kubeletApi' | 'configFile'>, writesLabels: boolean): boolean {
  return o.kubeletApi === 'dra' || writesLabels || o.configFile !== null;
}

/**
 * The daemon's options and its health settings (DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS); throws what they
 * refuse.
 */
export function readDaemonOptions(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
): { readonly parsed: ParsedOptions; readonly health: HealthSettings } {
  const parsed = parseOptions(argv, env);
  return { parsed, health: parseHealthSettings(env.DP_DISABLE_HEALTHCHECKS, env.DP_ENABLE_HEALTHCHECKS) };
}
