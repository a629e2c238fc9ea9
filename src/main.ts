// The composition root, wiring only, in dependency order: options → observer, resource manager and
// systemd status (the consumers, src/manager/consumer.ts) → live node (snapshots and their diffs,
// health, the configuration in force: src/manager) → scanner (NVML, src/nvml) → signals. SIGHUP
// re-reads the config file and looks at the node again, through the same snapshot path;
// SIGTERM/SIGINT stop within 2 s.
import { parseOptions } from './cli/options.ts';
import type { ParsedOptions } from './cli/options.ts';
import { parseHealthSettings, watchesAnything } from './core/health.ts';
import type { HealthSettings } from './core/health.ts';
import { routeGrpcLogs } from './kubelet/registration.ts';
import { reloadConfig, runningConfig } from './manager/config.ts';
import type { RunningConfig } from './manager/config.ts';
import { LiveNode } from './manager/live-node.ts';
import { ResourceManager } from './manager/manager.ts';
import { NvmlSessions } from './nvml/node-reader.ts';
import { Scanner } from './nvml/scanner.ts';
import { Observer } from './observe/observer.ts';
import { StatePublisher } from './observe/snapshot-state.ts';
import { StateFile, defaultStateFile } from './observe/state-file.ts';
import { imexChannelsAtStart } from './system/imex.ts';
import { processResources } from './system/resources.ts';
import { errorText, stderrLogger } from './system/log.ts';
import type { Logger } from './system/log.ts';
import { startIdleCompaction } from './system/memory.ts';
import { loadKoffi } from './system/native.ts';
import type { Koffi } from './system/native.ts';
import { NodeStatus, ServiceStatus } from './system/service-status.ts';
import { Signals } from './system/signals.ts';
import type { Daemon } from './system/signals.ts';
import { VERSION, versionText } from './system/version.ts';

async function run(argv: readonly string[], parsed: ParsedOptions, health: HealthSettings, log: Logger, service: ServiceStatus, koffi: Koffi): Promise<Daemon> {
  const opts = parsed.options;
  // Looked for once: the IMEX options are restart-only. A required channel that is missing stops the start.
  const imexChannels = await imexChannelsAtStart(opts, log);
  const sysfsRoot = process.env['SYSFS_ROOT'] || '/sys';
  // Node labels for NFD and metrics for node_exporter (src/observe), both off by default.
  const observer = new Observer({ nfdFeaturesFile: opts.nfdFeaturesFile, nfdRemoveOnStop: opts.nfdRemoveOnStop, metricsFile: opts.metricsFile,
    metricsIntervalSeconds: opts.metricsInterval, sysfsRoot, version: VERSION, log });
  const manager = new ResourceManager({
    kubeletSocket: opts.kubeletSocket, socketCheckIntervalMs: opts.socketCheckInterval * 1000, log,
    recorder: (name) => observer.metrics.resource(name),
    onDirectoryGone: (dir, why) => {
      log.error(`lost the socket directory: ${why}; exiting so that systemd restarts the service with a fresh view of it`, { dir });
      service.status(`STATUS=lost the socket directory ${dir}; exiting to be restarted`);
      process.exit(1);
    },
  });
  const status = new NodeStatus(service, manager);
  // What `info` shows: the state as the kubelet was told it, in a root-only file of the runtime directory.
  const state = new StatePublisher(new StateFile(defaultStateFile(process.env), log), manager, VERSION);
  const node = new LiveNode<RunningConfig>({
    log, config: await runningConfig(opts, parsed.sharing, imexChannels), health,
    recovery: { enabled: opts.healthRecovery, quietMs: opts.healthRecoveryQuietPeriod * 1000 },
    consumers: [manager, status, observer, state],
  });
  const scanner = new Scanner({
    sessions: new NvmlSessions({ koffi, driverRoot: opts.driverRoot, sysfsRoot, log, mig: opts.migStrategy !== 'none', facts: observer.wantsLabels }),
    log, rediscoverIntervalMs: opts.rediscoverInterval * 1000,
    health: watchesAnything(health) ? { probeIntervalMs: opts.healthProbeInterval * 1000 } : null,
    onScan: (scan, reason) => node.scanned(scan, reason).catch((err: unknown) => {
      throw opts.configFile === null ? err : new Error(`config file ${opts.configFile}: ${errorText(err)}`, { cause: err });
    }),
    onEvents: (events) => { observer.xids(events); node.onEvents(events); },
    onProbe: (results) => node.onProbe(results),
  });
  node.onRescanWanted((reason) => scanner.rescan(reason));
  // The health thread starts once registered (or after 2 s), so that its start-up does not hold up the registration.
  manager.onRegistered((all) => { if (all) observer.registered(); status.registered(all); state.registrationChanged(); scanner.releaseWorker(); });
  manager.onRegistrationLost(() => { status.registrationLost(); state.registrationChanged(); });
  observer.start();
  // Memory a burst of RPCs or events made the process take goes back to the OS once it is quiet again.
  const memory = startIdleCompaction(koffi, log);
  await scanner.start(opts.failOnInitError);

  return {
    stop: async () => {
      service.stopping();
      memory.stop();
      await Promise.all([scanner.stop(), node.stop()]);
      service.close();
    },
    // SIGHUP: the config file again (a bad one is refused, the running one kept), then a fresh scan.
    reload: async () => {
      if (await reloadConfig(node, () => parseOptions(argv, process.env), imexChannels, log)) scanner.setInterval(node.config.options.rediscoverInterval * 1000);
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
    process.exitCode = 2;
    return;
  }
  const opts = parsed.options;
  const log = stderrLogger(opts.logLevel);
  routeGrpcLogs(log);
  process.on('uncaughtException', (err) => log.error('unexpected error; carrying on', { error: errorText(err), stack: err.stack?.split('\n')[1]?.trim() }));
  process.on('unhandledRejection', (err) => log.error('unexpected rejection; carrying on', { error: errorText(err) }));

  const signals = new Signals(log);
  log.info('starting', { version: versionText().trim(), kubelet_socket: opts.kubeletSocket, device_id_strategy: opts.deviceIdStrategy, config_file: opts.configFile ?? 'none' });
  if (parsed.foreignConfigKeys.length > 0) log.info('config file keys for GPU feature discovery are not used by this plugin', { keys: parsed.foreignConfigKeys });
  let service: ServiceStatus | undefined;
  try {
    const koffi = loadKoffi();
    service = new ServiceStatus(koffi, log);
    signals.started(await run(argv, parsed, health, log, service, koffi));
  } catch (err) {
    log.error('cannot start', { error: errorText(err) });
    service?.failed(err);
    process.exit(1);
  }
}
