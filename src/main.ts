// The composition root, wiring only: options → observer → what serves the kubelet (src/plugin/mode.ts,
// or in DRA mode src/dra/mode.ts) → STATUS and state file → live node (src/node) → scanner → signals.
// SIGHUP re-reads the config file and looks at the node again; SIGTERM/SIGINT stop in 2 s.
import { draOf } from './config/dra-section.ts';
import { badOptions, cannotStart, refuseSecondInstance } from './config/exit-codes.ts';
import { describeOptions } from './config/describe-options.ts';
import type { EventBatchEntry } from './core/health-events.ts';
import { routeGrpcLogs } from './kubelet/registration.ts';
import { readDaemonOptions, readsNodeFacts, runningConfig } from './node/config.ts';
import type { RunningConfig } from './node/config.ts';
import { LiveNode } from './node/live-node.ts';
import { nodeScanner, reloadNode } from './node/scanning.ts';
import { Observer, observerSettings } from './observe/observer.ts';
import { StatePublisher } from './observe/snapshot-state.ts';
import { StateFile, defaultStateFile } from './observe/state-file.ts';
import { devicePluginLockDirectory, startDevicePluginMode } from './plugin/mode.ts';
import { imexChannelsAtStart } from './system/imex.ts';
import { lockSocketDirectory } from './system/instance-lock.ts';
import { carryOnAfterUnexpected, stderrLogger } from './system/log.ts';
import type { Logger } from './system/log.ts';
import { startIdleCompaction } from './system/memory.ts';
import { loadKoffi } from './system/native.ts';
import type { Koffi } from './system/native.ts';
import { NodeStatus, ServiceStatus } from './system/service-status.ts';
import { Signals, ignoreRealtimeSignals } from './system/signals.ts';
import type { Daemon } from './system/signals.ts';
import { VERSION, versionText } from './system/version.ts';

/** What the daemon starts from: its arguments, the options and health settings read from them, the log. */
type Start = ReturnType<typeof readDaemonOptions> & { argv: readonly string[]; log: Logger; sysfsRoot: string };

/** What serves the GPUs: the device-plugin mode, or DRA mode (loaded only on a node that chose it). */
async function serving(s: Start, service: ServiceStatus, observer: Observer, node: () => LiveNode<RunningConfig>) {
  const [o, log] = [s.parsed.options, s.log];
  const onDirectoryGone = (dir: string, why: string): never => service.lostDirectory(log, dir, why);
  const imexChannels = await imexChannelsAtStart(o, log); // once: restart-only; a required one missing stops the start
  if (o.kubeletApi === 'dra')
    return (await import('./dra/mode.ts')).startDraMode({
      options: o,
      log,
      sysfsRoot: s.sysfsRoot,
      onDirectoryGone,
      node,
    });
  const recorder = (name: string) => observer.metrics.resource(name);
  return startDevicePluginMode({ options: o, log, imexChannels, recorder, onDirectoryGone, node });
}

async function run(s: Start, service: ServiceStatus, koffi: Koffi): Promise<Daemon> {
  const { parsed, health, log } = s;
  const opts = parsed.options;
  const observer = new Observer(observerSettings(opts, { sysfsRoot: s.sysfsRoot, version: VERSION, log }));
  const mode = await serving(s, service, observer, () => node);
  const reg = mode.registrations;
  observer.advertisedBy(reg);
  const status = new NodeStatus(service, reg);
  // What `info` shows: the state as the kubelet was told it, in a root-only file of the runtime directory.
  const file = new StateFile(defaultStateFile(process.env), log);
  const state = new StatePublisher(file, reg, VERSION, 'claims' in mode ? mode.claims : undefined);
  const config = runningConfig(opts, parsed.sharing, parsed.signalPolicy, health, draOf(parsed));
  const consumers = [...mode.consumers, status, observer, state];
  const recovery = { enabled: opts.healthRecovery, quietMs: opts.healthRecoveryQuietPeriod * 1000 };
  const claimedPartitions = 'claimedPartitions' in mode ? mode.claimedPartitions : undefined;
  const node = new LiveNode<RunningConfig>({
    log,
    config,
    health,
    recovery,
    consumers,
    ...(claimedPartitions === undefined ? {} : { claimedPartitions }),
  });
  const facts = readsNodeFacts(opts, observer.wantsLabels);
  const onStartFailed = (err: unknown): void => cannotStart(err, log, service);
  const onEvents = (e: readonly EventBatchEntry[]): void => observer.xids(e);
  const scanner = nodeScanner(node, { ...s, koffi, options: opts, facts, onEvents, onStartFailed });
  // The health thread starts once registered (or after 2 s), so that its start-up does not hold up the registration.
  reg.onRegistered((all) => {
    if (all) observer.registered();
    status.registered(all);
    state.registrationChanged();
    scanner.releaseWorker();
  });
  reg.onRegistrationLost(() => [status.registrationLost(), state.registrationChanged()]);
  if ('onChange' in mode) mode.onChange({ status: () => status.refresh(), claims: () => state.changed() });
  observer.start();
  const memory = startIdleCompaction(koffi, log); // what a burst of RPCs or events took goes back to the OS
  await scanner.start(opts.failOnInitError);
  const stop = async (): Promise<void> => {
    service.stopping();
    memory.stop();
    mode.stop(); // lets go of what could hold the stop up (DRA: API requests in flight)
    await Promise.all([scanner.stop(), node.stop()]);
    service.close();
  };
  return { stop, reload: () => reloadNode(node, scanner, s.argv, log) };
}

/** The daemon (entry.ts has answered --version and --help). */
export async function main(argv: readonly string[]): Promise<void> {
  let read: ReturnType<typeof readDaemonOptions>;
  try {
    read = readDaemonOptions(argv, process.env);
  } catch (err) {
    return badOptions(err);
  }
  const { parsed, health } = read;
  const opts = parsed.options;
  const log = stderrLogger(opts.logLevel);
  routeGrpcLogs(log);
  carryOnAfterUnexpected(log);
  // One plugin per socket directory (DRA: per driver plugin directory); a second one is refused naming the first.
  const dra = opts.kubeletApi === 'dra' ? await import('./dra/mode.ts') : null;
  const at = dra === null ? devicePluginLockDirectory(opts) : await dra.draLockDirectory(opts);
  const lock = await lockSocketDirectory(at.dir, log, (err) => refuseSecondInstance(err, log), at.hint);
  if (lock instanceof Error) refuseSecondInstance(lock, log);
  const signals = new Signals(log);
  log.info('starting', { version: versionText().trim(), ...describeOptions(parsed) });
  const foreign = parsed.foreignConfigKeys;
  if (foreign.length > 0)
    log.info('config file keys for GPU feature discovery are not used by this plugin', { keys: foreign });
  let service: ServiceStatus | undefined;
  try {
    const koffi = loadKoffi();
    ignoreRealtimeSignals(koffi);
    service = new ServiceStatus(koffi, log);
    const sysfsRoot = process.env.SYSFS_ROOT || '/sys';
    signals.started(await run({ argv, parsed, health, log, sysfsRoot }, service, koffi));
  } catch (err) {
    cannotStart(err, log, service);
  }
}
