// `gpu-device-plugin mps-control-daemon`: the composition for the MPS control daemon unit
// (gpu-device-plugin-mps.service). Options → NVML (the GPUs, for the plan) → the control program →
// the supervisor (daemon.ts) with the real host (daemon-host.ts) → signals. SIGHUP re-reads the
// config; SIGTERM/SIGINT stop (quit, compute modes back, files removed, shm unmounted).
import { badOptions, cannotStart, startError } from '../config/exit-codes.ts';
import { DEFAULT_MPS_ROOT } from '../core/mps.ts';
import { NvmlSessions } from '../nvml/node-reader.ts';
import { Nvml } from '../nvml/nvml.ts';
import type { MpsDaemonPlan } from '../core/mps.ts';
import { carryOnAfterUnexpected, errorText, stderrLogger } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { loadKoffi } from '../system/native.ts';
import type { Koffi } from '../system/native.ts';
import { ServiceStatus } from '../system/service-status.ts';
import { Signals, ignoreRealtimeSignals } from '../system/signals.ts';
import type { Daemon } from '../system/signals.ts';
import { versionText } from '../system/version.ts';
import { findMpsControl, MPS_CONTROL_PROGRAM } from './control-client.ts';
import { mpsDaemonPlans, readMpsSettings } from './daemon-config.ts';
import type { MpsSettings } from './daemon-config.ts';
import { MpsSupervisor } from './daemon.ts';
import { RealMpsHost } from './daemon-host.ts';

export function mpsDaemonHelp(): string {
  return `${[
    'Usage: gpu-device-plugin mps-control-daemon [options]',
    '',
    'Runs the MPS control daemons for the resources of sharing.mps in the config file, as the unit',
    'gpu-device-plugin-mps.service does: per resource, its GPUs in compute mode EXCLUSIVE_PROCESS (through',
    `NVML), <root>/<resource>/{pipe,log}, ${MPS_CONTROL_PROGRAM} -f (under --driver-root, then on PATH)`,
    'with the default limits set (pinned memory per GPU = its memory / replicas, active threads =',
    '100 / replicas), <root>/<resource>/.started, <root>/.ready once all are up, and the shared tmpfs',
    '<root>/shm. A control daemon that dies is started again (its clients must restart).',
    '',
    `  --mps-root DIR   the MPS root (env MPS_ROOT; config file flags.mpsRoot); required with sharing.mps;`,
    `                   the package's environment file sets ${DEFAULT_MPS_ROOT}`,
    '',
    'With --kubelet-api=dra (KUBELET_API) it is the DRA sharing agent instead: for each prepared claim that',
    "shares its GPUs (NVIDIA's GpuConfig), the request the plugin writes under <root>/dra/requests gets an MPS",
    "control daemon of its own with the claim's limits under <root>/dra/claims/<uid>, and its GPUs the claim's",
    'time-slice (nvidia-smi compute-policy; Default again once no claim asks one); each is answered under',
    '<root>/dra/answers.',
    '',
    "It takes the plugin's options (see gpu-device-plugin --help), of which these matter: --config-file,",
    '--driver-root, --device-id-strategy, --log-level. Without sharing.mps it says so (READY=1) and exits 0.',
    '',
    'Signals: SIGTERM, SIGINT stop (each daemon told to quit, compute modes back to DEFAULT, files and',
    'the shm removed). SIGHUP re-reads the config: the same GPUs per resource get the default limits',
    'again (clients that connect later get them); any other change is logged as needing',
    '`systemctl restart gpu-device-plugin-mps`, which ends every MPS client, and is not applied.',
    'Exit status: 0 a clean stop, 1 it could not start, 2 a configuration error.',
  ].join('\n')}\n`;
}

export async function mpsControlDaemon(argv: readonly string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(mpsDaemonHelp());
    return;
  }
  let settings: MpsSettings;
  try {
    settings = readMpsSettings(argv, process.env);
  } catch (err) {
    return badOptions(err);
  }
  const opts = settings.options;
  const log = stderrLogger(opts.logLevel);
  carryOnAfterUnexpected(log);
  const signals = new Signals(log);
  log.info('starting the MPS control daemons', {
    version: versionText().trim(),
    root: settings.mpsRoot,
    configFile: opts.configFile,
    driverRoot: opts.driverRoot,
  });
  let service: ServiceStatus | undefined;
  try {
    const koffi = loadKoffi();
    ignoreRealtimeSignals(koffi);
    // READY=1 only once the daemons are up (or there are none): the supervisor says it.
    service = new ServiceStatus(koffi, log, { starting: 'starting the MPS control daemons', readyWithinMs: null });
    const daemon = await startDaemons(argv, settings, koffi, log, service);
    if (daemon !== null) signals.started(daemon);
  } catch (err) {
    cannotStart(err, log, service);
  }
}

/** The plans of some settings, from the node read as the plugin's scanner reads it; a misfit names the config file. */
function planner(koffi: Koffi, nvml: Nvml, log: Logger): (s: MpsSettings) => MpsDaemonPlan[] {
  const sysfsRoot = process.env.SYSFS_ROOT || '/sys';
  // The MIG layout with --mig-strategy single/mixed and the compute capabilities for the MPS client
  // limit, so the plan refuses what the plugin refuses.
  return (s) => {
    try {
      const sessions = new NvmlSessions({
        koffi,
        driverRoot: s.options.driverRoot,
        sysfsRoot,
        log,
        mig: s.options.migStrategy !== 'none',
        facts: true,
      });
      return mpsDaemonPlans(s, sessions.on(nvml).read(null));
    } catch (err) {
      throw startError(err, s.options.configFile);
    }
  };
}

/**
 * The daemons of the config, started; null when there are none to run: READY=1 has gone out with a
 * STATUS saying so, and the process ends (exit 0), so on a node without MPS the unit the plugin
 * Wants= is inactive and costs nothing. A config that adds MPS takes `systemctl restart
 * gpu-device-plugin-mps` (or the plugin's next start).
 */
async function startDaemons(
  argv: readonly string[],
  settings: MpsSettings,
  koffi: Koffi,
  log: Logger,
  service: ServiceStatus,
): Promise<Daemon | null> {
  if (settings.options.kubeletApi === 'dra') {
    const { startDraAgent } = await import('./dra-agent-main.ts');
    return startDraAgent(
      settings,
      () => Nvml.open({ koffi, driverRoot: settings.options.driverRoot, log }),
      log,
      service,
    );
  }
  if (settings.sharing.mps === undefined || settings.sharing.mps === null) {
    // Known before NVML is opened: on a node without MPS whose driver is not (yet) loaded, the unit
    // must still end inactive (exit 0) rather than fail and be restarted every RestartSec.
    log.info('no MPS resources configured (sharing.mps in the config file): no control daemon to run', {
      root: settings.mpsRoot,
    });
    service.status('STATUS=no MPS resources configured', true);
    service.close();
    process.exitCode = 0;
    return null;
  }
  const nvml = Nvml.open({ koffi, driverRoot: settings.options.driverRoot, log });
  const plan = planner(koffi, nvml, log);
  const plans = plan(settings);
  const program = plans.length > 0 ? await controlProgram(settings.options.driverRoot) : MPS_CONTROL_PROGRAM;
  const host = new RealMpsHost({ root: settings.mpsRoot, nvml, program, log });
  const supervisor = new MpsSupervisor({ root: settings.mpsRoot, log, status: (l, r) => service.status(l, r), host });
  await supervisor.start(plans);
  if (plans.length === 0) {
    nvml.close();
    service.close();
    process.exitCode = 0;
    return null;
  }
  const stop = async (): Promise<void> => {
    service.stopping('stopping the MPS control daemons');
    try {
      await supervisor.stop();
    } finally {
      nvml.close();
      service.close();
    }
  };
  return { stop, reload: () => reloadDaemons(argv, settings, plan, supervisor, log) };
}

/** The control program under the driver root, then on PATH; throws naming where it looked. */
async function controlProgram(driverRoot: string): Promise<string> {
  const found = await findMpsControl(driverRoot);
  if ('path' in found) return found.path;
  throw new Error(
    `${MPS_CONTROL_PROGRAM} not found (looked at ${found.looked.join(', ')}); ` +
      `install the driver's CUDA MPS tools or set --driver-root`,
  );
}

/**
 * SIGHUP: the config again; only the default limits of the same daemons are applied, anything else is logged and kept.
 */
async function reloadDaemons(
  argv: readonly string[],
  running: MpsSettings,
  plan: (s: MpsSettings) => MpsDaemonPlan[],
  supervisor: MpsSupervisor,
  log: Logger,
): Promise<void> {
  let next: MpsSettings;
  try {
    next = readMpsSettings(argv, process.env);
  } catch (err) {
    log.error('SIGHUP: the config cannot be read; the MPS control daemons keep running as they are', {
      error: errorText(err),
    });
    return;
  }
  if (next.mpsRoot !== running.mpsRoot) {
    log.warn(
      `SIGHUP: the MPS root changes from ${running.mpsRoot} to ${next.mpsRoot}; restart the unit to ` +
        `apply it (systemctl restart gpu-device-plugin-mps — it ends every MPS client); running as before`,
    );
    return;
  }
  let plans: MpsDaemonPlan[];
  try {
    plans = plan(next);
  } catch (err) {
    log.error('SIGHUP: the new config does not fit this node; the MPS control daemons keep running as they are', {
      error: errorText(err),
    });
    return;
  }
  await supervisor.reload(plans);
}
