// The configuration in force and SIGHUP's reload of it. The options and the sharing section are
// turned into what the live node plans and serves by (NodeSettings); a reload reads the config file
// again, keeps restart-only options at their running values (config/reload.ts), and hands the result to
// the live node, whose reconfigure() is the transaction: a config that does not fit is refused and
// the running one kept.
import type { Options, ParsedOptions } from '../config/options.ts';
import { planSettings } from '../config/plan-settings.ts';
import { planReload } from '../config/reload.ts';
import type { Sharing } from '../core/sharing.ts';
import { presentControlDevices } from '../system/control-devices.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import type { NodeSettings } from './consumer.ts';
import type { LiveNode } from './live-node.ts';

/** What the daemon runs with: the options, the sharing section, and what they make for the live node. */
export interface RunningConfig extends NodeSettings {
  readonly options: Options;
  readonly sharing: Sharing;
}

/** The running configuration of some options; IMEX channels are looked for once, at start. */
export async function runningConfig(
  o: Options,
  sharing: Sharing,
  imexChannels: readonly number[],
): Promise<RunningConfig> {
  return {
    options: o,
    sharing,
    plan: planSettings(o, sharing),
    serve: {
      allocate: {
        imexChannels,
        passDeviceSpecs: o.passDeviceSpecs,
        devRoot: o.devRoot,
        presentControlDevices: o.passDeviceSpecs ? await presentControlDevices(o.devRoot) : [],
        deviceListStrategies: o.deviceListStrategy,
        cdiAnnotationPrefix: o.cdiAnnotationPrefix,
        mpsRoot: o.mpsRoot,
      },
      sharedPolicy: o.sharedDevicesAllocationPolicy,
    },
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
  imexChannels: readonly number[],
  log: Logger,
): Promise<boolean> {
  const running = node.config;
  const file = running.options.configFile;
  if (file === null) {
    log.info(
      'SIGHUP: there is no config file to reload (neither --config-file nor CONFIG_FILE is set); looking at the GPUs again',
    );
    return false;
  }
  try {
    const r = planReload(running.options, running.sharing, read());
    if (r.restartOnly.length > 0)
      log.warn('config reload: some changed options take effect only at restart; their running values are kept', {
        options: r.restartOnly,
      });
    if (r.changed.length === 0 && !r.sharingChanged) {
      log.info('config reloaded; nothing to change', { file });
      return false;
    }
    // The new settings are in force while their snapshot is applied, so the labels written from it
    // are the new ones; a refused plan puts the running ones back (LiveNode.reconfigure).
    const resources = await node.reconfigure(
      await runningConfig(r.options, r.sharing, imexChannels),
      'config reloaded',
    );
    log.info('config reloaded', { file, changed: [...r.changed, ...(r.sharingChanged ? ['sharing'] : [])], resources });
    return true;
  } catch (err) {
    log.warn('config reload refused; the running configuration is kept', {
      file,
      error: errorText(err).replace(`config file ${file}: `, ''),
    });
    return false;
  }
}
