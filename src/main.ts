// The composition root, wiring only, in dependency order: options → observer, what serves the
// kubelet (the resource manager, or in DRA mode src/dra/mode.ts's DRA plugin and slice publisher),
// systemd status, state file and MPS daemon watch (the consumers, src/manager/consumer.ts) → live
// node (snapshots, health, the configuration in force: src/manager) → scanner (NVML, src/nvml) → signals. SIGHUP re-reads the
// config file and looks at the node again, through the same snapshot path; SIGTERM/SIGINT stop in 2 s.
import { dirname } from 'node:path';
import { badOptions, cannotStart, refuseSecondInstance, startError } from './config/exit-codes.ts';
import { describeOptions } from './config/describe-options.ts';
import { parseOptions } from './config/parse-options.ts';
import type { ParsedOptions } from './config/options.ts';
import { parseHealthSettings, watchesAnything } from './core/health.ts';
import type { HealthSettings } from './core/health.ts';
import { routeGrpcLogs } from './kubelet/registration.ts';
import { reloadConfig, runningConfig } from './manager/config.ts';
import type { RunningConfig } from './manager/config.ts';
import { LiveNode } from './manager/live-node.ts';
import { ResourceManager } from './manager/manager.ts';
import { MpsDaemonWatch, controlClientAsk } from './mps/health-watch.ts';
import type { NodeConsumer, Registrations } from './manager/consumer.ts';
import type { DraMode } from './dra/mode.ts';
import { NvmlSessions } from './nvml/node-reader.ts';
import { Scanner } from './nvml/scanner.ts';
import { Observer } from './observe/observer.ts';
import { StatePublisher } from './observe/snapshot-state.ts';
import { StateFile, defaultStateFile } from './observe/state-file.ts';
import { imexChannelsAtStart } from './system/imex.ts';
import { processResources } from './system/resources.ts';
import { carryOnAfterUnexpected, errorText, exitProcess, stderrLogger } from './system/log.ts';
import type { Logger } from './system/log.ts';
import { startIdleCompaction } from './system/memory.ts';
import { loadKoffi } from './system/native.ts';
import type { Koffi } from './system/native.ts';
import { lockSocketDirectory } from './system/instance-lock.ts';
import { NodeStatus, ServiceStatus } from './system/service-status.ts';
import { Signals, ignoreRealtimeSignals } from './system/signals.ts';
import type { Daemon } from './system/signals.ts';
import { VERSION, versionText } from './system/version.ts';

async function run(
  argv: readonly string[],
  parsed: ParsedOptions,
  health: HealthSettings,
  log: Logger,
  service: ServiceStatus,
  koffi: Koffi,
): Promise<Daemon> {
  const opts = parsed.options;
  const imexChannels = await imexChannelsAtStart(opts, log); // once: restart-only; a required one missing stops the start
  const sysfsRoot = process.env.SYSFS_ROOT || '/sys';
  // Node labels for NFD and metrics for node_exporter (src/observe), both off by default.
  const observer = new Observer({
    nfdFeaturesFile: opts.nfdFeaturesFile,
    nfdRemoveOnStop: opts.nfdRemoveOnStop,
    metricsFile: opts.metricsFile,
    metricsIntervalSeconds: opts.metricsInterval,
    sysfsRoot,
    version: VERSION,
    log,
  });
  const lostDirectory = (dir: string, why: string): never => {
    log.error(
      `lost the socket directory: ${why}; exiting so that systemd restarts the service with a fresh view of it`,
      { dir },
    );
    service.status(`STATUS=lost the socket directory ${dir}; exiting to be restarted`);
    return exitProcess(1);
  };
  // What serves the GPUs to the kubelet: the device-plugin resources, or in DRA mode the DRA kubelet
  // plugin and the ResourceSlice publisher (src/dra/mode.ts). Either is consumers and registrations.
  let serving: { consumers: readonly NodeConsumer[]; registrations: Registrations; stop(): void };
  let dra: DraMode | null = null;
  if (opts.kubeletApi === 'dra') {
    // Loaded only on a node that chose DRA: a device-plugin node does not evaluate the API client and DRA's protos.
    const { startDraMode } = await import('./dra/mode.ts');
    dra = await startDraMode({ options: opts, log, sysfsRoot, onDirectoryGone: lostDirectory });
    serving = dra;
  } else {
    const manager = new ResourceManager({
      kubeletSocket: opts.kubeletSocket,
      socketCheckIntervalMs: opts.socketCheckInterval * 1000,
      log,
      recorder: (name) => observer.metrics.resource(name),
      onDirectoryGone: lostDirectory,
    });
    serving = { consumers: [manager], registrations: manager, stop: () => undefined };
  }
  const registrations = serving.registrations;
  const status = new NodeStatus(service, registrations);
  // What `info` shows: the state as the kubelet was told it, in a root-only file of the runtime directory.
  const state = new StatePublisher(
    new StateFile(defaultStateFile(process.env), log),
    registrations,
    VERSION,
    dra?.claims,
  );
  // MPS control daemons, asked for as long as the plugin runs; their answers come back as snapshots.
  const mpsWatch = new MpsDaemonWatch<RunningConfig>({
    log,
    rootOf: (c) => c.options.mpsRoot || null,
    ask: controlClientAsk(opts.driverRoot),
    report: (resource, report) => {
      node
        .onMpsDaemon(resource, report)
        .catch((err: unknown) => log.error('cannot apply an MPS daemon state', { resource, error: errorText(err) }));
    },
  });
  const node: LiveNode<RunningConfig> = new LiveNode<RunningConfig>({
    log,
    config: await runningConfig(opts, parsed.sharing, imexChannels),
    health,
    recovery: { enabled: opts.healthRecovery, quietMs: opts.healthRecoveryQuietPeriod * 1000 },
    consumers: [...serving.consumers, status, observer, state, mpsWatch],
    servesResources: dra === null,
  });
  const scanner = new Scanner({
    // Facts (compute capability) also hold MPS replicas to each GPU's client limit; with a config file, since SIGHUP may turn MPS on.
    sessions: new NvmlSessions({
      koffi,
      driverRoot: opts.driverRoot,
      sysfsRoot,
      log,
      mig: opts.migStrategy !== 'none',
      facts: observer.wantsLabels || opts.configFile !== null,
    }),
    log,
    rediscoverIntervalMs: opts.rediscoverInterval * 1000,
    health: watchesAnything(health) ? { probeIntervalMs: opts.healthProbeInterval * 1000 } : null,
    onScan: (scan, reason) =>
      node.scanned(scan, reason).catch((err: unknown) => {
        throw startError(err, opts.configFile);
      }),
    onStartFailed: (err) => cannotStart(err, log, service),
    onEvents: (events) => {
      observer.xids(events);
      node.onEvents(events);
    },
    onProbe: (results) => node.onProbe(results),
  });
  node.onRescanWanted((reason) => scanner.rescan(reason));
  // The health thread starts once registered (or after 2 s), so that its start-up does not hold up the registration.
  registrations.onRegistered((all) => {
    if (all) observer.registered();
    status.registered(all);
    state.registrationChanged();
    scanner.releaseWorker();
  });
  registrations.onRegistrationLost(() => {
    status.registrationLost();
    state.registrationChanged();
  });
  dra?.onChange({ status: () => status.refresh(), claims: () => state.changed() });
  observer.start();
  // Memory a burst of RPCs or events made the process take goes back to the OS once it is quiet again.
  const memory = startIdleCompaction(koffi, log);
  await scanner.start(opts.failOnInitError);

  return {
    stop: async () => {
      service.stopping();
      memory.stop();
      // What serves the kubelet lets go of what could hold the stop up (DRA: API requests in flight).
      serving.stop();
      await Promise.all([scanner.stop(), node.stop()]);
      service.close();
    },
    // SIGHUP: the config file again (a bad one is refused, the running one kept), then a fresh scan.
    reload: async () => {
      if (await reloadConfig(node, () => parseOptions(argv, process.env), imexChannels, log))
        scanner.setInterval(node.config.options.rediscoverInterval * 1000);
      void scanner
        .rescan('reload', true)
        .then(() => log.enabled('debug') && log.debug('process resources', processResources()));
    },
  };
}

/** The daemon (entry.ts has answered --version and --help). */
export async function main(argv: readonly string[]): Promise<void> {
  let parsed: ParsedOptions;
  let health: HealthSettings;
  try {
    parsed = parseOptions(argv, process.env);
    health = parseHealthSettings(process.env.DP_DISABLE_HEALTHCHECKS, process.env.DP_ENABLE_HEALTHCHECKS);
  } catch (err) {
    return badOptions(err);
  }
  const opts = parsed.options;
  const log = stderrLogger(opts.logLevel);
  routeGrpcLogs(log);
  carryOnAfterUnexpected(log);
  // One plugin per socket directory (in DRA mode, per driver plugin directory): a second one is refused in one line naming the first.
  const lockAt =
    opts.kubeletApi === 'dra'
      ? await (await import('./dra/mode.ts')).draLockDirectory(opts)
      : { dir: dirname(opts.kubeletSocket), hint: undefined };
  const lock = await lockSocketDirectory(lockAt.dir, log, (err) => refuseSecondInstance(err, log), lockAt.hint);
  if (lock instanceof Error) refuseSecondInstance(lock, log);
  const signals = new Signals(log);
  log.info('starting', { version: versionText().trim(), ...describeOptions(parsed) });
  if (parsed.foreignConfigKeys.length > 0)
    log.info('config file keys for GPU feature discovery are not used by this plugin', {
      keys: parsed.foreignConfigKeys,
    });
  let service: ServiceStatus | undefined;
  try {
    const koffi = loadKoffi();
    ignoreRealtimeSignals(koffi);
    service = new ServiceStatus(koffi, log);
    signals.started(await run(argv, parsed, health, log, service, koffi));
  } catch (err) {
    cannotStart(err, log, service);
  }
}
