// The composition root: options → NVML → device state → one gRPC server and registration per
// advertised resource, and back down on SIGTERM; SIGHUP re-reads the config file. Everything with a
// decision in it lives in core/; everything that touches the world in the adapters; this file only
// wires them.
import { access, constants as fsConstants } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { API_VERSION } from './api/messages.ts';
import { OPTION_SPECS, RESTART_ONLY_OPTIONS, helpText, parseOptions, showOption } from './cli/options.ts';
import type { OptionKey, Options, ParsedOptions } from './cli/options.ts';
import { CONTROL_DEVICE_NODES, hostPath, indexDevices } from './core/allocate.ts';
import { countHealthyGpus } from './core/devices.ts';
import type { Gpu } from './core/devices.ts';
import { describeHealthSettings, parseHealthSettings, watchesAnything } from './core/health.ts';
import type { HealthSettings } from './core/health.ts';
import { GPU_RESOURCE, describePlan, planResources } from './core/sharing.ts';
import type { PlannedResource } from './core/sharing.ts';
import { PreferredPolicy, buildScoreMatrix } from './core/topology.ts';
import { registerWithKubelet } from './kubelet/registration.ts';
import { Registrar } from './kubelet/registrar.ts';
import { SocketDirWatcher } from './kubelet/watcher.ts';
import { discoverGpus, readLinks } from './nvml/discovery.ts';
import { Nvml } from './nvml/nvml.ts';
import { EventWatcher } from './nvml/watcher.ts';
import { readNodeFacts } from './nvml/node-facts.ts';
import { Observer } from './observe/observer.ts';
import { HealthMonitor } from './plugin/health.ts';
import { PluginServer, fileIdentity } from './plugin/server.ts';
import { DevicePluginHandlers, PLUGIN_OPTIONS } from './plugin/service.ts';
import type { PluginState } from './plugin/service.ts';
import { errorText, stderrLogger } from './system/log.ts';
import type { Logger } from './system/log.ts';
import { loadKoffi } from './system/native.ts';
import { createNotifier } from './system/notify.ts';
import type { Notifier } from './system/notify.ts';
import type { Koffi } from './system/native.ts';
import { VERSION, versionText } from './system/version.ts';

export const RESOURCE_NAME = GPU_RESOURCE;

/** Socket file of a resource: gpu-device-plugin-<name without the vendor domain>.sock */
export function socketFileName(resource: string): string {
  return `gpu-device-plugin-${resource.slice(resource.indexOf('/') + 1)}.sock`;
}

/** How long a start waits for the kubelet before telling systemd it is up anyway (see run()). */
const READY_WITHOUT_KUBELET_MS = 10000;

/** The notifier once made, so a start that fails can still tell systemd why. */
let activeNotifier: Notifier | undefined;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function presentControlDevices(devRoot: string): Promise<string[]> {
  const present: string[] = [];
  for (const p of CONTROL_DEVICE_NODES) {
    try {
      await access(hostPath(devRoot, p), fsConstants.F_OK);
      present.push(p);
    } catch {
      // absent: not passed
    }
  }
  return present;
}

/** Opens NVML; with failOnInitError false, retries with capped backoff until it works or we stop. */
async function openNvml(koffi: Koffi, opts: Options, log: Logger, stopping: () => boolean): Promise<Nvml | undefined> {
  let delay = 1000;
  let lastProblem: string | undefined;
  for (;;) {
    try {
      const nvml = Nvml.open({ koffi, driverRoot: opts.driverRoot, log });
      if (lastProblem !== undefined) log.info('NVML is available now', { library: nvml.libraryPath });
      return nvml;
    } catch (err) {
      const problem = errorText(err);
      if (opts.failOnInitError) throw err;
      if (problem !== lastProblem) {
        log.warn('NVML is not available; retrying (fail-on-init-error is false)', { error: problem, retry_s: delay / 1000 });
        lastProblem = problem;
      }
      await sleep(delay);
      if (stopping()) return undefined;
      delay = Math.min(delay * 2, 30000);
    }
  }
}

/** One advertised resource: its socket, gRPC server, registration loop and directory watcher. */
interface ResourceRuntime {
  readonly name: string;
  readonly socketPath: string;
  readonly handlers: DevicePluginHandlers;
  /** Set right after the runtime is made (their callbacks refer to it). */
  registrar: Registrar | undefined;
  watcher: SocketDirWatcher | undefined;
  server: PluginServer | undefined;
  attemptedKubelet: string | null;
  registered: boolean;
}

interface Running {
  stop(): Promise<void>;
  /** Re-reads the config file and applies a valid change; logs and keeps the running one otherwise. */
  reload(): Promise<void>;
}

interface RunInput {
  argv: readonly string[];
  env: Readonly<Record<string, string | undefined>>;
  parsed: ParsedOptions;
  healthSettings: HealthSettings;
  log: Logger;
  onStopRequest: (fn: () => Promise<void>) => void;
}

const flagOf = (key: OptionKey): string => `--${OPTION_SPECS.find((s) => s.key === key)?.flag ?? key}`;

async function run(input: RunInput): Promise<Running | undefined> {
  const { healthSettings, log } = input;
  let opts: Options = input.parsed.options;
  let sharing = input.parsed.sharing;
  let stopping = false;
  let running: Running | undefined;
  input.onStopRequest(async () => {
    stopping = true;
    if (running !== undefined) await running.stop();
  });

  const koffi = loadKoffi();
  let notifier: Notifier;
  try {
    notifier = createNotifier(koffi);
  } catch (err) {
    log.warn('cannot talk to systemd (NOTIFY_SOCKET); readiness and watchdog are not reported', { error: errorText(err) });
    notifier = createNotifier(koffi, {});
  }
  activeNotifier = notifier;
  // The watchdog is fed from a timer on the event loop, so a stuck loop stops feeding it.
  let watchdogTimer: NodeJS.Timeout | undefined;
  if (notifier.watchdogMs !== null) {
    watchdogTimer = setInterval(() => notifier.notify('WATCHDOG=1'), Math.max(notifier.watchdogMs / 2, 50));
    watchdogTimer.unref();
  }
  notifier.notify('STATUS=starting: opening NVML');
  // READY=1 normally follows the first registration. A node may bring its kubelet (or its driver) up
  // much later — during maintenance apt upgrades this package while the kubelet is stopped — and a
  // start that waited for it would block apt/dnf and hit systemd's start timeout. So READY=1 also
  // goes out READY_WITHOUT_KUBELET_MS after start, with a STATUS saying what the plugin waits for.
  let readySent = false;
  let waitingFor = 'NVML';
  const sendReady = (statusLine: string): void => {
    notifier.notify(readySent ? statusLine : `READY=1\n${statusLine}`);
    readySent = true;
  };
  const readyTimer = setTimeout(() => {
    if (!readySent) sendReady(`STATUS=waiting for ${waitingFor}; retrying`);
  }, READY_WITHOUT_KUBELET_MS);
  readyTimer.unref();
  const nvml = await openNvml(koffi, opts, log, () => stopping);
  if (nvml === undefined) return undefined;
  waitingFor = 'the kubelet';
  const sysfsRoot = process.env['SYSFS_ROOT'] || '/sys';
  const driverVersion = nvml.driverVersion();
  log.info('NVML initialised', { library: nvml.libraryPath, driver: driverVersion });

  let found = discoverGpus(nvml, sysfsRoot, log);
  let delay = 1000;
  while (found.gpus.length === 0 && !stopping) {
    log.warn('no GPUs found; waiting for some to appear', { retry_s: delay / 1000 });
    await sleep(delay);
    delay = Math.min(delay * 2, 30000);
    found = discoverGpus(nvml, sysfsRoot, log);
  }
  if (stopping) {
    nvml.shutdown();
    return undefined;
  }
  const gpus: readonly Gpu[] = found.gpus;
  // Topology is read once; the policy answers every GetPreferredAllocation from it without NVML.
  const links = readLinks(nvml, found, log);
  const scores = buildScoreMatrix(links.gpus, (i, j) => links.pcie[i]?.[j] ?? -1);
  const policy = new PreferredPolicy(scores);
  let nvlinkPairs = 0;
  for (let i = 0; i < scores.size; i++) for (let j = i + 1; j < scores.size; j++) if (scores.nvlinks(i, j) > 0) nvlinkPairs++;
  log.info('topology read', { gpus: scores.size, nvlink_pairs: nvlinkPairs });
  for (const g of gpus) {
    log.info('GPU found', { index: g.index, uuid: g.uuid, name: g.name, bus: g.busId, numa: g.numaNode, memory_mib: Math.round(g.memoryBytes / 1048576) });
  }
  let plan: PlannedResource[];
  try {
    plan = planResources(gpus, opts.deviceIdStrategy, sharing);
  } catch (err) {
    nvml.shutdown();
    throw new Error(opts.configFile === null ? errorText(err) : `config file ${opts.configFile}: ${errorText(err)}`, { cause: err });
  }
  let controlDevices = opts.passDeviceSpecs ? await presentControlDevices(opts.devRoot) : [];
  log.info('advertising', { resources: describePlan(plan), device_list_strategy: opts.deviceListStrategy.join(','), device_id_strategy: opts.deviceIdStrategy });

  const resources = new Map<string, ResourceRuntime>();
  let registeredOnce = false;
  // Node labels for NFD and metrics for node_exporter, both off by default.
  const observer = new Observer({ nfdFeaturesFile: opts.nfdFeaturesFile, nfdRemoveOnStop: opts.nfdRemoveOnStop, metricsFile: opts.metricsFile,
    metricsIntervalSeconds: opts.metricsInterval, sysfsRoot, version: VERSION, log });
  const metrics = observer.metrics;
  const facts = observer.wantsLabels ? readNodeFacts(nvml, gpus, found.handles, log) : undefined;
  const nodeState = (): Promise<void> => observer.nodeState({ gpus: facts?.gpus ?? [], driverVersion, cudaDriverVersion: facts?.cudaDriverVersion ?? null, sharing, migStrategy: opts.migStrategy });
  const status = (): string => {
    const h = monitor.health();
    return `STATUS=${registeredOnce ? 'registered' : 'waiting for the kubelet'}; ${countHealthyGpus(h)} of ${gpus.length} GPUs healthy`;
  };
  // Health lives per GPU in the monitor, which outlives reloads; every device of a GPU (whole or
  // replica) takes that GPU's health.
  const monitor: HealthMonitor = new HealthMonitor(gpus, healthSettings, {
    enabled: opts.healthRecovery,
    quietMs: opts.healthRecoveryQuietPeriod * 1000,
  }, log, (h) => {
    for (const rt of resources.values()) rt.handlers.update({ ...rt.handlers.current, health: h });
    log.info('device counts', { healthy: countHealthyGpus(h), total: gpus.length });
    notifier.notify(status());
    observer.healthChanged();
  });

  const stateFor = (r: PlannedResource): PluginState => ({
    gpus,
    devices: r.devices,
    index: indexDevices(r.devices, gpus),
    health: monitor.health(),
    chooser: policy,
    sharedPolicy: opts.sharedDevicesAllocationPolicy,
    allocateSettings: {
      passDeviceSpecs: opts.passDeviceSpecs,
      devRoot: opts.devRoot,
      presentControlDevices: controlDevices,
      deviceListStrategies: opts.deviceListStrategy,
      cdiAnnotationPrefix: opts.cdiAnnotationPrefix,
      failRequestsGreaterThanOne: r.failRequestsGreaterThanOne,
      resourceName: r.name,
    },
  });

  let watcher: EventWatcher | undefined;
  const watchHealth = watchesAnything(healthSettings);
  log.info('health checks', { settings: describeHealthSettings(healthSettings), recovery: opts.healthRecovery ? `${opts.healthRecoveryQuietPeriod}s` : 'off' });
  if (!watchHealth) log.info('health checks are off (DP_DISABLE_HEALTHCHECKS); GPUs are not watched');
  // Started once registered (or after 2 s without a kubelet), so its thread's start-up does not
  // compete with the first registration; until then nothing is advertised anyway.
  const startWatcher = (): void => {
    if (watcher !== undefined || !watchHealth || stopping) return;
    watcher = EventWatcher.start({
      library: nvml.libraryPath,
      gpus: gpus.map((g) => ({ nvmlIndex: g.index, uuid: g.uuid })),
      probeIntervalMs: opts.healthProbeInterval * 1000,
      waitTimeoutMs: 200,
      log,
      logLevel: opts.logLevel,
      journal: process.env['JOURNAL_STREAM'] !== undefined,
      writeLine: (line) => process.stderr.write(line),
      onReady: (watched, unsupported) => {
        for (const pos of unsupported) {
          const g = gpus[pos];
          log.warn('GPU supports no health events; watched by the probe only', { gpu: g?.index, uuid: g?.uuid });
        }
        log.info('watching GPU health', { event_gpus: watched.length, probe_s: opts.healthProbeInterval });
      },
      onEvents: (events) => {
        observer.xids(events);
        monitor.onEvents(events);
      },
      onProbe: (results) => monitor.onProbe(results),
    });
  };
  setTimeout(startWatcher, 2000).unref();

  const startResource = (r: PlannedResource): ResourceRuntime => {
    const socketPath = join(dirname(opts.kubeletSocket), socketFileName(r.name));
    const rlog = log.child({ resource: r.name });
    const handlers = new DevicePluginHandlers(stateFor(r), rlog, metrics.resource(r.name));
    const rt: ResourceRuntime = { name: r.name, socketPath, handlers, registrar: undefined, watcher: undefined, server: undefined, attemptedKubelet: null, registered: false };
    const ensureServing = async (): Promise<void> => {
      if (rt.server !== undefined && (await rt.server.stillOurs())) return;
      if (rt.server !== undefined) {
        // Stop the old server first: closing a unix listener unlinks its path, which must not be the new one.
        handlers.endStreams();
        await rt.server.stop();
        rt.server = undefined;
      }
      rt.server = await PluginServer.start(socketPath, handlers);
      rlog.debug('serving', { socket: socketPath });
    };
    const registrar = new Registrar({
      log: rlog,
      recorder: metrics.resource(r.name),
      ensureServing,
      register: async () => {
        rt.attemptedKubelet = await fileIdentity(opts.kubeletSocket);
        await registerWithKubelet(opts.kubeletSocket, {
          version: API_VERSION,
          endpoint: basename(socketPath),
          resource_name: r.name,
          options: PLUGIN_OPTIONS,
        }, 10000);
      },
      upToDate: async () =>
        rt.server !== undefined && (await rt.server.stillOurs()) && (await fileIdentity(opts.kubeletSocket)) === rt.attemptedKubelet,
      onRegistered: () => {
        rt.registered = true;
        if (!registeredOnce && [...resources.values()].every((x) => x.registered)) {
          registeredOnce = true;
          observer.registered();
          clearTimeout(readyTimer);
          sendReady(status());
        } else notifier.notify(status());
        startWatcher();
        rlog.debug('device counts', { devices: rt.handlers.current.devices.length, healthy_gpus: countHealthyGpus(monitor.health()), ms_since_start: Math.round(performance.now()) });
      },
    });
    const dirWatcher = new SocketDirWatcher({
      kubeletSocket: opts.kubeletSocket,
      pluginSocket: socketPath,
      servedIdentity: () => rt.server?.identity ?? null,
      attemptedKubelet: () => rt.attemptedKubelet,
      onChange: (reason) => registrar.kick(reason),
      onDirectoryGone: (dir) => {
        log.error('the socket directory was deleted and re-created since start, and this process still sees the old one (a service mount namespace); exiting so that systemd restarts it with a fresh view', { dir });
        process.exit(1);
      },
      checkIntervalMs: opts.socketCheckInterval * 1000,
      log: rlog,
    });
    rt.registrar = registrar;
    rt.watcher = dirWatcher;
    resources.set(r.name, rt);
    dirWatcher.start();
    registrar.kick('start');
    return rt;
  };

  const stopResource = async (rt: ResourceRuntime): Promise<void> => {
    resources.delete(rt.name);
    rt.watcher?.stop();
    rt.registrar?.stop();
    rt.handlers.endStreams();
    if (rt.server !== undefined) await rt.server.stop();
    rt.server = undefined;
  };

  for (const r of plan) startResource(r);
  observer.start(() => {
    const h = monitor.health();
    return {
      driverVersion,
      gpus: gpus.map((g, i) => ({ index: g.index, uuid: g.uuid, healthy: h[i] === 'Healthy' })),
      resources: [...resources.values()].map((rt) => {
        const ds = rt.handlers.current.devices;
        return { name: rt.name, devices: ds.length, healthy: ds.filter((d) => h[d.gpu] === 'Healthy').length };
      }),
    };
  });
  void nodeState();

  const reload = async (): Promise<void> => {
    const file = opts.configFile;
    if (file === null) {
      log.info('SIGHUP: there is no config file to reload (neither --config-file nor CONFIG_FILE is set); nothing changed');
      return;
    }
    let next: ParsedOptions;
    let nextPlan: PlannedResource[];
    try {
      next = parseOptions(input.argv, input.env);
      nextPlan = planResources(gpus, next.options.deviceIdStrategy, next.sharing);
    } catch (err) {
      log.warn('config reload refused; the running configuration is kept', { file, error: errorText(err).replace(`config file ${file}: `, '') });
      return;
    }
    const restartOnly = RESTART_ONLY_OPTIONS.filter((k) => showOption(next.options[k]) !== showOption(opts[k]));
    const merged: Options = { ...next.options };
    for (const k of RESTART_ONLY_OPTIONS) (merged as unknown as Record<string, unknown>)[k] = opts[k];
    const changed = OPTION_SPECS.map((s) => s.key).filter((k) => !RESTART_ONLY_OPTIONS.includes(k) && showOption(merged[k]) !== showOption(opts[k]));
    const sharingChanged = JSON.stringify(next.sharing) !== JSON.stringify(sharing);
    if (restartOnly.length > 0) {
      log.warn('config reload: some changed options take effect only at restart; their running values are kept', { options: restartOnly.map(flagOf) });
    }
    if (changed.length === 0 && !sharingChanged) {
      log.info('config reloaded; nothing to change', { file });
      return;
    }
    if (merged.passDeviceSpecs && (merged.devRoot !== opts.devRoot || !opts.passDeviceSpecs)) controlDevices = await presentControlDevices(merged.devRoot);
    opts = merged;
    sharing = next.sharing;
    plan = nextPlan;
    const wanted = new Set(nextPlan.map((r) => r.name));
    for (const rt of [...resources.values()]) {
      if (!wanted.has(rt.name)) {
        log.info('resource no longer advertised', { resource: rt.name });
        await stopResource(rt);
      }
    }
    for (const r of nextPlan) {
      const rt = resources.get(r.name);
      if (rt === undefined) {
        startResource(r);
        continue;
      }
      const before = rt.handlers.current.devices.map((d) => d.id).join(' ');
      rt.handlers.update(stateFor(r));
      // A changed device set is registered again, as NVIDIA's plugin does on SIGHUP: the kubelet
      // opens a fresh stream and sees the new list from its first message.
      if (r.devices.map((d) => d.id).join(' ') !== before) rt.registrar?.kick('config reloaded');
    }
    log.info('config reloaded', { file, changed: [...changed.map(flagOf), ...(sharingChanged ? ['sharing'] : [])], resources: describePlan(nextPlan) });
    await nodeState();
  };

  running = {
    stop: async () => {
      notifier.notify('STOPPING=1\nSTATUS=stopping');
      if (watchdogTimer !== undefined) clearInterval(watchdogTimer);
      monitor.stop();
      const stopObserver = observer.stop();
      const stopWatcher = watcher?.stop(800);
      await Promise.all([...resources.values()].map((rt) => stopResource(rt)));
      await stopWatcher;
      await stopObserver;
      nvml.shutdown();
      notifier.close();
    },
    reload,
  };
  return running;
}

export async function main(argv: readonly string[]): Promise<void> {
  if (argv.includes('--version')) {
    process.stdout.write(versionText());
    return;
  }
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(helpText(VERSION));
    return;
  }
  let parsed: ParsedOptions;
  let healthSettings: HealthSettings;
  try {
    parsed = parseOptions(argv, process.env);
    healthSettings = parseHealthSettings(process.env['DP_DISABLE_HEALTHCHECKS'], process.env['DP_ENABLE_HEALTHCHECKS']);
  } catch (err) {
    if (err instanceof Error) {
      process.stderr.write(`gpu-device-plugin: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    throw err;
  }
  const opts = parsed.options;
  const log = stderrLogger(opts.logLevel);
  process.on('uncaughtException', (err) => log.error('unexpected error; carrying on', { error: errorText(err), stack: err.stack?.split('\n')[1]?.trim() }));
  process.on('unhandledRejection', (err) => log.error('unexpected rejection; carrying on', { error: errorText(err) }));

  let stopFn: (() => Promise<void>) | undefined;
  let stopping = false;
  const onSignal = (signal: string): void => {
    if (stopping) return;
    stopping = true;
    log.info('stopping', { signal });
    // Hard limit: whatever hangs, the process is gone within 2 s of the signal.
    setTimeout(() => {
      log.error('stop took too long; exiting');
      process.exit(1);
    }, 1900).unref();
    void (stopFn?.() ?? Promise.resolve()).then(
      () => { log.info('stopped'); process.exit(0); },
      (err: unknown) => { log.error('error while stopping', { error: errorText(err) }); process.exit(1); },
    );
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
  // SIGHUP re-reads the config file (its default action would end the process). Reloads run one at
  // a time; one that arrives while the plugin is still starting is done once it has started.
  let running: Running | undefined;
  let reloadPending = false;
  let reloads: Promise<void> = Promise.resolve();
  const reload = (): void => {
    if (stopping || running === undefined) return;
    const r = running;
    reloads = reloads.then(() => r.reload()).catch((err: unknown) => log.error('config reload failed; the running configuration is kept', { error: errorText(err) }));
  };
  process.on('SIGHUP', () => {
    if (running === undefined) {
      if (!reloadPending) log.info('SIGHUP while starting: the config file is read again once started');
      reloadPending = true;
      return;
    }
    reload();
  });

  log.info('starting', { version: versionText().trim(), kubelet_socket: opts.kubeletSocket, device_id_strategy: opts.deviceIdStrategy, config_file: opts.configFile ?? 'none' });
  if (parsed.foreignConfigKeys.length > 0) {
    log.info('config file keys for GPU feature discovery are not used by this plugin', { keys: parsed.foreignConfigKeys });
  }
  try {
    running = await run({ argv, env: process.env, parsed, healthSettings, log, onStopRequest: (fn) => { stopFn = fn; } });
    if (reloadPending) reload();
  } catch (err) {
    log.error('cannot start', { error: errorText(err) });
    activeNotifier?.notify(`STATUS=cannot start: ${errorText(err)}\nERRNO=5`);
    process.exit(1);
  }
}
