// The composition root, wiring only: options → scanner (NVML, src/nvml) → live node (snapshot and
// diff, core/snapshot.ts) → resource manager (servers and registrations, src/manager) → health
// monitor → signals. SIGHUP re-reads the config file and looks at the node again, through the same
// snapshot path; SIGTERM/SIGINT stop within 2 s.
import { dirname } from 'node:path';
import { ConfigError } from './cli/config.ts';
import { EXIT_ALREADY_RUNNING, EXIT_CONFIG, exitCodeFor } from './cli/exit-codes.ts';
import { describeOptions, parseOptions } from './cli/options.ts';
import type { Options, ParsedOptions } from './cli/options.ts';
import { planReload } from './cli/reload.ts';
import { describeHealthSettings, parseHealthSettings, watchesAnything } from './core/health.ts';
import type { HealthSettings } from './core/health.ts';
import type { Sharing } from './core/sharing.ts';
import { SharingError } from './core/sharing.ts';
import { healthCounts } from './core/snapshot.ts';
import type { PlanSettings } from './core/snapshot.ts';
import { routeGrpcLogs } from './kubelet/registration.ts';
import { LiveNode } from './manager/live-node.ts';
import { ResourceManager } from './manager/manager.ts';
import type { ServeSettings } from './manager/manager.ts';
import type { NodeSnapshot } from './core/snapshot.ts';
import type { NodeFacts } from './nvml/node-facts.ts';
import { Scanner } from './nvml/scanner.ts';
import { Observer } from './observe/observer.ts';
import { HealthMonitor } from './plugin/health.ts';
import { presentControlDevices } from './system/control-devices.ts';
import { imexChannelsAtStart } from './system/imex.ts';
import { processResources } from './system/resources.ts';
import { errorText, stderrLogger } from './system/log.ts';
import type { Logger } from './system/log.ts';
import { startIdleCompaction } from './system/memory.ts';
import { loadKoffi } from './system/native.ts';
import type { Koffi } from './system/native.ts';
import { lockSocketDirectory } from './system/instance-lock.ts';
import { ServiceStatus, notifyBeforeExit } from './system/service-status.ts';
import { Signals, ignoreRealtimeSignals } from './system/signals.ts';
import type { Daemon } from './system/signals.ts';
import { VERSION, versionText } from './system/version.ts';

const serveSettings = async (o: Options, imexChannels: readonly number[]): Promise<ServeSettings> => ({
  allocate: {
    imexChannels,
    passDeviceSpecs: o.passDeviceSpecs,
    devRoot: o.devRoot,
    presentControlDevices: o.passDeviceSpecs ? await presentControlDevices(o.devRoot) : [],
    deviceListStrategies: o.deviceListStrategy,
    cdiAnnotationPrefix: o.cdiAnnotationPrefix,
  },
  sharedPolicy: o.sharedDevicesAllocationPolicy,
});

/** What the plugin waits for while NVML cannot be opened (STATUS=). */
const NO_DRIVER = 'the NVIDIA driver (NVML cannot be loaded yet)';

/** What decides the advertised resources, from the options. */
const planSettings = (o: Options, sharing: Sharing): PlanSettings => ({
  deviceIdStrategy: o.deviceIdStrategy,
  sharing,
  migStrategy: o.migStrategy,
  needMigCapabilities: o.passDeviceSpecs,
});

async function run(argv: readonly string[], parsed: ParsedOptions, health: HealthSettings, log: Logger, service: ServiceStatus, koffi: Koffi): Promise<Daemon> {
  let opts = parsed.options;
  let sharing = parsed.sharing;
  // Looked for once: the IMEX options are restart-only. A required channel that is missing stops the start.
  const imexChannels = await imexChannelsAtStart(opts, log);
  let registered = false;
  /** Started without a driver: a config that does not fit the first GPUs seen ends the process from onScan. */
  let waitingForDriver = false;
  const sysfsRoot = process.env['SYSFS_ROOT'] || '/sys';
  // Node labels for NFD and metrics for node_exporter (src/observe), both off by default.
  const observer = new Observer({ nfdFeaturesFile: opts.nfdFeaturesFile, nfdRemoveOnStop: opts.nfdRemoveOnStop, metricsFile: opts.metricsFile,
    metricsIntervalSeconds: opts.metricsInterval, sysfsRoot, version: VERSION, log });
  let facts: NodeFacts | null = null;
  // Labels follow every snapshot with a driver that answers (while it is down they stay as they were).
  const labelsFor = async (s: NodeSnapshot | null): Promise<void> => {
    if (s === null || s.driverVersion === null) return;
    await observer.nodeState({
      gpus: s.gpus.map((g, i) => ({ name: g.name, memoryBytes: g.memoryBytes, migEnabled: s.mig.modes[i]?.current === true, ...(facts?.gpus.get(g.uuid) ?? { compute: null, migCapable: false }) })),
      driverVersion: s.driverVersion, cudaDriverVersion: facts?.cudaDriverVersion ?? null, sharing, migStrategy: opts.migStrategy, migDevices: s.mig.devices,
    });
  };
  const status = (): string => {
    // No driver yet (FAIL_ON_INIT_ERROR=false, as the packaged service runs): say that, not the kubelet.
    if (node.snapshot === null || (node.snapshot.driverVersion === null && node.snapshot.gpus.length === 0)) return `STATUS=waiting for ${NO_DRIVER}; retrying`;
    const c = healthCounts(node.snapshot);
    const mig = c !== null && c.mig.total > 0 ? `, ${c.mig.healthy} of ${c.mig.total} MIG devices` : '';
    // "registered" only while every resource is: one that lost its registration says so again.
    const now = registered && manager.allRegisteredNow();
    return `STATUS=${now ? 'registered' : 'waiting for the kubelet'}; ${c?.gpus.healthy ?? 0} of ${c?.gpus.total ?? 0} GPUs healthy${mig}`;
  };
  const manager = new ResourceManager({
    kubeletSocket: opts.kubeletSocket,
    socketCheckIntervalMs: opts.socketCheckInterval * 1000,
    log,
    recorder: (name) => observer.metrics.resource(name),
    onRegistered: (all) => {
      if (all) observer.registered();
      registered ||= all;
      service.status(status(), registered);
      scanner.releaseWorker();
    },
    onRegistrationLost: () => service.status(status()),
    onDirectoryGone: (dir, why) => {
      log.error(`lost the socket directory: ${why}; exiting so that systemd restarts the service with a fresh view of it`, { dir });
      service.status(`STATUS=lost the socket directory ${dir}; exiting to be restarted`);
      process.exit(1);
    },
  });
  const monitor = new HealthMonitor([], health, { enabled: opts.healthRecovery, quietMs: opts.healthRecoveryQuietPeriod * 1000 }, log, () => node.healthChanged());
  const node: LiveNode = new LiveNode({
    log, manager, monitor, recoveryEnabled: opts.healthRecovery,
    plan: planSettings(opts, sharing),
    serve: await serveSettings(opts, imexChannels),
    onApplied: (snapshot) => {
      service.status(status());
      observer.changed();
      void labelsFor(snapshot);
    },
  });
  observer.start(() => {
    const s = node.snapshot;
    const h = s?.health ?? [];
    return {
      driverVersion: s?.driverVersion ?? 'not answering',
      gpus: (s?.gpus ?? []).map((g, i) => ({ index: g.index, uuid: g.uuid, healthy: h[i] === 'Healthy' })),
      resources: s === null ? [] : healthCounts(s).resources,
    };
  });
  log.info('health checks', { settings: describeHealthSettings(health), recovery: opts.healthRecovery ? `${opts.healthRecoveryQuietPeriod}s` : 'off' });
  if (!watchesAnything(health)) log.info('health checks are off (DP_DISABLE_HEALTHCHECKS); GPUs are not watched');
  const scanner: Scanner = new Scanner({
    koffi, driverRoot: opts.driverRoot, sysfsRoot, log,
    rediscoverIntervalMs: opts.rediscoverInterval * 1000,
    mig: opts.migStrategy !== 'none',
    health: watchesAnything(health) ? { probeIntervalMs: opts.healthProbeInterval * 1000 } : null,
    onScan: (scan, reason) => node.scanned(scan, reason).then(() => service.waitFor(scan === null ? NO_DRIVER : 'the kubelet'), (err: unknown) => {
      // No driver yet, so no GPUs to check the time-slicing devices against: checked at the first scan.
      if (scan === null && err instanceof SharingError && node.snapshot === null) return service.waitFor(NO_DRIVER);
      // The time-slicing section names a GPU the node lacks (or shares one twice): a configuration error.
      const e = err instanceof SharingError && opts.configFile !== null ? new ConfigError(`config file ${opts.configFile}: ${err.message}`) : err;
      // Started without a driver, and the first GPUs seen do not fit the file: the start fails now, as
      // it would have with the driver there (nothing has been advertised; a later rescan that does not
      // fit keeps what is advertised).
      if (waitingForDriver && e instanceof ConfigError && (node.snapshot === null || node.snapshot.gpus.length === 0)) {
        log.error('cannot start', { error: e.message });
        service.failed(e, 'configuration error');
        process.exit(EXIT_CONFIG);
      }
      throw e;
    }),
    onEvents: (events) => {
      observer.xids(events);
      monitor.onEvents(events);
    },
    ...(observer.wantsLabels ? { onFacts: (f: NodeFacts) => { facts = f; } } : {}),
    onProbe: (results) => monitor.onProbe(results),
    onWatching: (watched, unsupported, gpus) => {
      for (const pos of unsupported) log.warn('GPU supports no health events; watched by the probe only', { gpu: gpus[pos]?.index, uuid: gpus[pos]?.uuid });
      log.info('watching GPU health', { event_gpus: watched.length, probe_s: opts.healthProbeInterval });
    },
  });
  setTimeout(() => scanner.releaseWorker(), 2000).unref();
  // Memory a burst of RPCs or events made the process take goes back to the OS once it is quiet again.
  const memory = startIdleCompaction(koffi, log);
  try {
    scanner.open();
  } catch (err) {
    if (opts.failOnInitError) throw err;
    waitingForDriver = true;
    await scanner.startWithoutDriver(errorText(err));
  }
  if (scanner.library !== null) await scanner.start();

  return {
    stop: async () => {
      service.stopping();
      monitor.stop();
      memory.stop();
      await Promise.all([scanner.stop(), manager.stop(), observer.stop()]);
      service.close();
    },
    // SIGHUP: the config file again (a bad one is refused, the running one kept), then a fresh scan.
    reload: async () => {
      const file = opts.configFile;
      if (file === null) log.info('SIGHUP: there is no config file to reload (neither --config-file nor CONFIG_FILE is set); looking at the GPUs again');
      else {
        try {
          const r = planReload(opts, sharing, parseOptions(argv, process.env));
          if (r.restartOnly.length > 0) log.warn('config reload: some changed options take effect only at restart; their running values are kept', { options: r.restartOnly });
          if (r.changed.length === 0 && !r.sharingChanged) log.info('config reloaded; nothing to change', { file });
          else {
            // The new settings are in force before the snapshot is applied, so the labels written from
            // it (onApplied) are the new ones; a refused plan puts the running ones back.
            const running = { opts, sharing };
            opts = r.options;
            sharing = r.sharing;
            let resources: string;
            try {
              resources = await node.reconfigure(planSettings(r.options, r.sharing), await serveSettings(r.options, imexChannels), 'config reloaded');
            } catch (err) {
              ({ opts, sharing } = running);
              throw err;
            }
            scanner.setInterval(opts.rediscoverInterval * 1000);
            log.info('config reloaded', { file, changed: [...r.changed, ...(r.sharingChanged ? ['sharing'] : [])], resources });
          }
        } catch (err) {
          log.warn('config reload refused; the running configuration is kept', { file, error: errorText(err).replace(`config file ${file}: `, '') });
        }
      }
      void scanner.rescan('reload', true).then(() => log.enabled('debug') && log.debug('process resources', processResources()));
    },
  };
}

/** The daemon (entry.ts has answered --version and --help). */
export async function main(argv: readonly string[]): Promise<void> {
  let parsed: ParsedOptions;
  let health: HealthSettings;
  try {
    parsed = parseOptions(argv, process.env);
    health = parseHealthSettings(process.env['DP_DISABLE_HEALTHCHECKS'], process.env['DP_ENABLE_HEALTHCHECKS']);
  } catch (err) {
    process.stderr.write(`gpu-device-plugin: ${errorText(err)}\n`);
    notifyBeforeExit(`STATUS=configuration error: ${errorText(err)}`);
    process.exitCode = EXIT_CONFIG;
    return;
  }
  const opts = parsed.options;
  const log = stderrLogger(opts.logLevel);
  routeGrpcLogs(log);
  process.on('uncaughtException', (err) => log.error('unexpected error; carrying on', { error: errorText(err), stack: err.stack?.split('\n')[1]?.trim() }));
  process.on('unhandledRejection', (err) => log.error('unexpected rejection; carrying on', { error: errorText(err) }));

  // One plugin per socket directory: a second one is refused here, in one line naming the first.
  const refuse = (err: Error): never => {
    log.error(err.message);
    notifyBeforeExit(`STATUS=${err.message}`);
    return process.exit(EXIT_ALREADY_RUNNING);
  };
  const lock = await lockSocketDirectory(dirname(opts.kubeletSocket), log, refuse);
  if (lock instanceof Error) refuse(lock);
  const signals = new Signals(log);
  log.info('starting', { version: versionText().trim(), ...describeOptions(parsed) });
  if (parsed.foreignConfigKeys.length > 0) log.info('config file keys for GPU feature discovery are not used by this plugin', { keys: parsed.foreignConfigKeys });
  let service: ServiceStatus | undefined;
  try {
    const koffi = loadKoffi();
    ignoreRealtimeSignals(koffi);
    service = new ServiceStatus(koffi, log);
    signals.started(await run(argv, parsed, health, log, service, koffi));
  } catch (err) {
    log.error('cannot start', { error: errorText(err) });
    const code = exitCodeFor(err);
    service?.failed(err, code === EXIT_CONFIG ? 'configuration error' : 'cannot start');
    process.exit(code);
  }
}
