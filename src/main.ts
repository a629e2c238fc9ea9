// The composition root: options → NVML → device state → gRPC server → registration, and back down
// on SIGTERM. Everything with a decision in it lives in core/; everything that touches the world in
// the adapters; this file only wires them.
import { access, constants as fsConstants } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { API_VERSION } from './api/messages.ts';
import { helpText, parseOptions } from './cli/options.ts';
import type { Options } from './cli/options.ts';
import { CONTROL_DEVICE_NODES, hostPath, indexDevices } from './core/allocate.ts';
import { countHealthy, wholeGpuDevices } from './core/devices.ts';
import type { Health } from './core/devices.ts';
import { describeHealthSettings, parseHealthSettings } from './core/health.ts';
import type { HealthSettings } from './core/health.ts';
import { PreferredPolicy, buildScoreMatrix } from './core/topology.ts';
import { registerWithKubelet } from './kubelet/registration.ts';
import { Registrar } from './kubelet/registrar.ts';
import { SocketDirWatcher } from './kubelet/watcher.ts';
import { discoverGpus, readLinks } from './nvml/discovery.ts';
import { Nvml } from './nvml/nvml.ts';
import { EventWatcher } from './nvml/watcher.ts';
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

export const RESOURCE_NAME = 'nvidia.com/gpu';

/** Socket file of a resource: gpu-device-plugin-<name without the vendor domain>.sock */
export function socketFileName(resource: string): string {
  return `gpu-device-plugin-${resource.slice(resource.indexOf('/') + 1)}.sock`;
}

let activeNotifier: Notifier | undefined;
function setNotifier(n: Notifier): void {
  activeNotifier = n;
}

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

interface Running {
  stop(): Promise<void>;
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

async function run(opts: Options, healthSettings: HealthSettings, log: Logger, onStopRequest: (fn: () => Promise<void>) => void): Promise<Running | undefined> {
  let stopping = false;
  let running: Running | undefined;
  onStopRequest(async () => {
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
  setNotifier(notifier);
  // The watchdog is fed from a timer on the event loop, so a stuck loop stops feeding it.
  let watchdogTimer: NodeJS.Timeout | undefined;
  if (notifier.watchdogMs !== null) {
    watchdogTimer = setInterval(() => notifier.notify('WATCHDOG=1'), Math.max(notifier.watchdogMs / 2, 50));
    watchdogTimer.unref();
  }
  notifier.notify('STATUS=starting: opening NVML');
  const nvml = await openNvml(koffi, opts, log, () => stopping);
  if (nvml === undefined) return undefined;
  const sysfsRoot = process.env['SYSFS_ROOT'] || '/sys';
  log.info('NVML initialised', { library: nvml.libraryPath, driver: nvml.driverVersion() });

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
  // Topology is read once; the policy answers every GetPreferredAllocation from it without NVML.
  const links = readLinks(nvml, found, log);
  const scores = buildScoreMatrix(links.gpus, (i, j) => links.pcie[i]?.[j] ?? -1);
  const policy = new PreferredPolicy(scores);
  let nvlinkPairs = 0;
  for (let i = 0; i < scores.size; i++) for (let j = i + 1; j < scores.size; j++) if (scores.nvlinks(i, j) > 0) nvlinkPairs++;
  log.info('topology read', { gpus: scores.size, nvlink_pairs: nvlinkPairs });
  const devices = wholeGpuDevices(found.gpus, opts.deviceIdStrategy);
  const health: Health[] = found.gpus.map(() => 'Healthy');
  const state: PluginState = {
    gpus: found.gpus,
    devices,
    index: indexDevices(devices, found.gpus),
    health,
    chooser: policy,
    allocateSettings: {
      passDeviceSpecs: opts.passDeviceSpecs,
      devRoot: opts.devRoot,
      presentControlDevices: opts.passDeviceSpecs ? await presentControlDevices(opts.devRoot) : [],
    },
  };
  for (const g of found.gpus) {
    log.info('GPU found', { index: g.index, uuid: g.uuid, name: g.name, bus: g.busId, numa: g.numaNode, memory_mib: Math.round(g.memoryBytes / 1048576) });
  }
  const handlers = new DevicePluginHandlers(state, log);
  let registeredOnce = false;
  const status = (): string => {
    const h = handlers.current.health;
    return `STATUS=${registeredOnce ? 'registered' : 'waiting for the kubelet'}; ${countHealthy(devices, h)} of ${devices.length} GPUs healthy`;
  };
  const monitor = new HealthMonitor(found.gpus, healthSettings, {
    enabled: opts.healthRecovery,
    quietMs: opts.healthRecoveryQuietPeriod * 1000,
  }, log, (h) => {
    handlers.update({ ...handlers.current, health: h });
    log.info('device counts', { healthy: countHealthy(devices, h), total: devices.length });
    notifier.notify(status());
  });
  let watcher: EventWatcher | undefined;
  const watchHealth = !healthSettings.allDisabled || healthSettings.enabledXids.size > 0 || healthSettings.allEnabled;
  log.info('health checks', { settings: describeHealthSettings(healthSettings), recovery: opts.healthRecovery ? `${opts.healthRecoveryQuietPeriod}s` : 'off' });
  if (!watchHealth) log.info('health checks are off (DP_DISABLE_HEALTHCHECKS); GPUs are not watched');
  // Started once registered (or after 2 s without a kubelet), so its thread's start-up does not
  // compete with the first registration; until then nothing is advertised anyway.
  const startWatcher = (): void => {
    if (watcher !== undefined || !watchHealth || stopping) return;
    watcher = EventWatcher.start({
      library: nvml.libraryPath,
      gpus: found.gpus.map((g) => ({ nvmlIndex: g.index, uuid: g.uuid })),
      probeIntervalMs: opts.healthProbeInterval * 1000,
      waitTimeoutMs: 200,
      log,
      logLevel: opts.logLevel,
      journal: process.env['JOURNAL_STREAM'] !== undefined,
      writeLine: (line) => process.stderr.write(line),
      onReady: (watched, unsupported) => {
        for (const pos of unsupported) {
          const g = found.gpus[pos];
          log.warn('GPU supports no health events; watched by the probe only', { gpu: g?.index, uuid: g?.uuid });
        }
        log.info('watching GPU health', { event_gpus: watched.length, probe_s: opts.healthProbeInterval });
      },
      onEvents: (events) => monitor.onEvents(events),
      onProbe: (results) => monitor.onProbe(results),
    });
  };
  setTimeout(startWatcher, 2000).unref();
  const socketPath = join(dirname(opts.kubeletSocket), socketFileName(RESOURCE_NAME));
  let server: PluginServer | undefined;
  let attemptedKubelet: string | null = null;

  const ensureServing = async (): Promise<void> => {
    if (server !== undefined && (await server.stillOurs())) return;
    if (server !== undefined) {
      // Stop the old server first: closing a unix listener unlinks its path, which must not be the new one.
      handlers.endStreams();
      await server.stop();
      server = undefined;
    }
    server = await PluginServer.start(socketPath, handlers);
    log.debug('serving', { socket: socketPath });
  };

  const registrar = new Registrar({
    log,
    ensureServing,
    register: async () => {
      attemptedKubelet = await fileIdentity(opts.kubeletSocket);
      await registerWithKubelet(opts.kubeletSocket, {
        version: API_VERSION,
        endpoint: basename(socketPath),
        resource_name: RESOURCE_NAME,
        options: PLUGIN_OPTIONS,
      }, 10000);
    },
    upToDate: async () =>
      server !== undefined && (await server.stillOurs()) && (await fileIdentity(opts.kubeletSocket)) === attemptedKubelet,
    onRegistered: () => {
      if (!registeredOnce) {
        registeredOnce = true;
        notifier.notify(`READY=1\n${status()}`);
      } else notifier.notify(status());
      startWatcher();
      log.debug('device counts', { healthy: countHealthy(devices, handlers.current.health), total: devices.length, ms_since_start: Math.round(performance.now()) });
    },
  });
  const dirWatcher = new SocketDirWatcher({
    kubeletSocket: opts.kubeletSocket,
    pluginSocket: socketPath,
    servedIdentity: () => server?.identity ?? null,
    attemptedKubelet: () => attemptedKubelet,
    onChange: (reason) => registrar.kick(reason),
    checkIntervalMs: opts.socketCheckInterval * 1000,
    log,
  });
  dirWatcher.start();
  registrar.kick('start');

  running = {
    stop: async () => {
      notifier.notify('STOPPING=1\nSTATUS=stopping');
      if (watchdogTimer !== undefined) clearInterval(watchdogTimer);
      dirWatcher.stop();
      registrar.stop();
      monitor.stop();
      const stopWatcher = watcher?.stop(800);
      handlers.endStreams();
      if (server !== undefined) await server.stop();
      await stopWatcher;
      nvml.shutdown();
      notifier.close();
    },
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
  let opts: Options;
  let healthSettings: HealthSettings;
  try {
    opts = parseOptions(argv, process.env).options;
    healthSettings = parseHealthSettings(process.env['DP_DISABLE_HEALTHCHECKS'], process.env['DP_ENABLE_HEALTHCHECKS']);
  } catch (err) {
    if (err instanceof Error) {
      process.stderr.write(`gpu-device-plugin: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    throw err;
  }
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

  log.info('starting', { version: versionText().trim(), kubelet_socket: opts.kubeletSocket, device_id_strategy: opts.deviceIdStrategy });
  try {
    await run(opts, healthSettings, log, (fn) => { stopFn = fn; });
  } catch (err) {
    log.error('cannot start', { error: errorText(err) });
    activeNotifier?.notify(`STATUS=cannot start: ${errorText(err)}\nERRNO=5`);
    process.exit(1);
  }
}
