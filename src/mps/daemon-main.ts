// `gpu-device-plugin mps-control-daemon`: the composition for the MPS control daemon unit
// (gpu-device-plugin-mps.service). Options → NVML (the GPUs, for the plan) → the control program →
// the supervisor (daemon.ts) with the real host (daemon-host.ts) → signals. SIGHUP re-reads the
// config; SIGTERM/SIGINT stop (quit, compute modes back, files removed, shm unmounted).
import { badOptions, cannotStart, startError } from '../config/exit-codes.ts';
import { DEFAULT_MPS_ROOT } from '../core/mps.ts';
import { NvmlSessions } from '../nvml/node-reader.ts';
import { Nvml } from '../nvml/nvml.ts';
import { carryOnAfterUnexpected, errorText, stderrLogger } from '../system/log.ts';
import { loadKoffi } from '../system/native.ts';
import { createNotifier } from '../system/notify.ts';
import type { Notifier } from '../system/notify.ts';
import { Signals, ignoreRealtimeSignals } from '../system/signals.ts';
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
  let notifier: Notifier | undefined;
  const status = (line: string, ready = false): void => {
    notifier?.notify(ready ? `READY=1\n${line}` : line);
  };
  try {
    const koffi = loadKoffi();
    ignoreRealtimeSignals(koffi);
    try {
      notifier = createNotifier(koffi);
    } catch (err) {
      log.warn('cannot talk to systemd (NOTIFY_SOCKET); readiness is not reported', { error: errorText(err) });
    }
    if (notifier?.watchdogMs != null)
      setInterval(() => notifier?.notify('WATCHDOG=1'), Math.max(notifier.watchdogMs / 2, 50)).unref();
    if (settings.sharing.mps === undefined || settings.sharing.mps === null) {
      // Nothing to run, known before NVML is opened: on a node without MPS whose driver is not (yet)
      // loaded, the unit the plugin Wants= must still end inactive (exit 0) rather than fail and be
      // restarted every RestartSec for as long as the node runs.
      log.info('no MPS resources configured (sharing.mps in the config file): no control daemon to run', {
        root: settings.mpsRoot,
      });
      status('STATUS=no MPS resources configured', true);
      notifier?.close();
      process.exitCode = 0;
      return;
    }
    const nvml = Nvml.open({ koffi, driverRoot: opts.driverRoot, log });
    const sysfsRoot = process.env.SYSFS_ROOT || '/sys';
    // The node read as the plugin's scanner reads it (MIG layout with --mig-strategy single/mixed, the
    // compute capabilities for the MPS client limit), so the plan refuses what the plugin refuses.
    const scan = (s: MpsSettings): ReturnType<typeof mpsDaemonPlans> =>
      mpsDaemonPlans(
        s,
        new NvmlSessions({
          koffi,
          driverRoot: s.options.driverRoot,
          sysfsRoot,
          log,
          mig: s.options.migStrategy !== 'none',
          facts: true,
        })
          .on(nvml)
          .read(null),
      );
    const plan = (s: MpsSettings): ReturnType<typeof mpsDaemonPlans> => {
      try {
        return scan(s);
      } catch (err) {
        throw startError(err, s.options.configFile);
      }
    };
    const plans = plan(settings);
    let program = MPS_CONTROL_PROGRAM;
    if (plans.length > 0) {
      const found = await findMpsControl(opts.driverRoot);
      if (!('path' in found))
        throw new Error(
          `${MPS_CONTROL_PROGRAM} not found (looked at ${found.looked.join(', ')}); install the driver's CUDA MPS tools or set --driver-root`,
        );
      program = found.path;
    }
    const supervisor = new MpsSupervisor({
      root: settings.mpsRoot,
      log,
      status,
      host: new RealMpsHost({ root: settings.mpsRoot, nvml, program, log }),
    });
    await supervisor.start(plans);
    if (plans.length === 0) {
      // Nothing to run: READY=1 has gone out with the STATUS saying so, and the process ends (exit 0),
      // so on a node without MPS the unit the plugin Wants= is inactive and costs nothing. A config
      // that adds MPS takes `systemctl restart gpu-device-plugin-mps` (or the plugin's next start).
      nvml.close();
      notifier?.close();
      process.exitCode = 0;
      return;
    }
    signals.started({
      stop: async () => {
        notifier?.notify('STOPPING=1\nSTATUS=stopping the MPS control daemons');
        try {
          await supervisor.stop();
        } finally {
          nvml.close();
          notifier?.close();
        }
      },
      reload: async () => {
        let next: MpsSettings;
        try {
          next = readMpsSettings(argv, process.env);
        } catch (err) {
          log.error('SIGHUP: the config cannot be read; the MPS control daemons keep running as they are', {
            error: errorText(err),
          });
          return;
        }
        if (next.mpsRoot !== settings.mpsRoot) {
          log.warn(
            `SIGHUP: the MPS root changes from ${settings.mpsRoot} to ${next.mpsRoot}; restart the unit to apply it (systemctl restart gpu-device-plugin-mps — it ends every MPS client); running as before`,
          );
          return;
        }
        let plans: ReturnType<typeof mpsDaemonPlans>;
        try {
          plans = plan(next);
        } catch (err) {
          log.error('SIGHUP: the new config does not fit this node; the MPS control daemons keep running as they are', {
            error: errorText(err),
          });
          return;
        }
        await supervisor.reload(plans);
      },
    });
  } catch (err) {
    cannotStart(err, log, { failed: (e, what) => notifier?.notify(`STATUS=${what}: ${errorText(e)}\nERRNO=5`) }); // as the plugin says it (service-status.ts)
  }
}
