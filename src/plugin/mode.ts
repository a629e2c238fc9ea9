// The device-plugin mode's part of the composition (--kubelet-api=device-plugin; main.ts composes the
// rest, shared with DRA mode: scanner, live node, observer, STATUS, state file), as src/dra/mode.ts is
// DRA's. One consumer of the node model, the planner (planner.ts: the resources planned from each
// snapshot, and its log of what is advertised), with two listeners of its plans: the resources (the
// resource manager, with how answers are given worked out from the options in force) and the MPS
// daemon watch (src/mps), whose reports go back to the live node. The manager is the registrations
// the shared consumers hear, the planner what they show per resource (advertised()).
import { dirname } from 'node:path';
import type { Options } from '../config/options.ts';
import { MpsDaemonWatch, controlClientAsk } from '../mps/health-watch.ts';
import type { RunningConfig } from '../node/config.ts';
import type { NodeConsumer, Registrations } from '../node/consumer.ts';
import type { LiveNode } from '../node/live-node.ts';
import { presentControlDevices } from '../system/control-devices.ts';
import { errorText } from '../system/log.ts';
import { ResourceManager } from './manager.ts';
import type { ManagerContext, ServeSettings } from './manager.ts';
import { ResourcePlanner } from './planner.ts';
import type { AppliedPlan, PlanListener } from './planner.ts';

/** How answers are given, from the options; IMEX channels were looked for once, at start. */
export async function serveSettings(o: Options, imexChannels: readonly number[]): Promise<ServeSettings> {
  return {
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
  };
}

/** The resource manager as a listener of the plans under the running configuration: it works out the serve settings. */
export class DevicePluginResources implements PlanListener<RunningConfig> {
  readonly name = 'device plugin resources';
  private readonly manager: ResourceManager;
  private readonly imexChannels: readonly number[];
  private serve: { readonly options: Options; readonly settings: ServeSettings } | null = null;

  constructor(manager: ResourceManager, imexChannels: readonly number[]) {
    this.manager = manager;
    this.imexChannels = imexChannels;
  }

  async apply(applied: AppliedPlan<RunningConfig>): Promise<void> {
    const options = applied.settings.options;
    if (this.serve?.options !== options)
      this.serve = { options, settings: await serveSettings(options, this.imexChannels) };
    await this.manager.apply({ ...applied, settings: { ...applied.settings, serve: this.serve.settings } });
  }

  stop(): Promise<void> {
    return this.manager.stop();
  }
}

export interface DevicePluginModeDeps extends Omit<ManagerContext, 'kubeletSocket' | 'socketCheckIntervalMs'> {
  readonly options: Options;
  readonly imexChannels: readonly number[];
  /** Hears when an MPS daemon starts or stops answering; known once made (the node is made after its consumers). */
  readonly node: () => Pick<LiveNode<RunningConfig>, 'onMpsDaemon'>;
}

/** The directory locked against a second instance: the kubelet's socket directory. */
export function devicePluginLockDirectory(o: Pick<Options, 'kubeletSocket'>): { dir: string; hint?: string } {
  return { dir: dirname(o.kubeletSocket) };
}

/**
 * The device-plugin mode, composed: its consumers and its registrations (the resource manager, and the planner's view).
 */
export interface DevicePluginMode {
  readonly manager: ResourceManager;
  readonly planner: ResourcePlanner<RunningConfig>;
  readonly consumers: readonly NodeConsumer<RunningConfig>[];
  readonly registrations: Registrations;
  stop(): void;
}

export function startDevicePluginMode(d: DevicePluginModeDeps): DevicePluginMode {
  const { options: o, log } = d;
  const manager = new ResourceManager({
    kubeletSocket: o.kubeletSocket,
    socketCheckIntervalMs: o.socketCheckInterval * 1000,
    log,
    onDirectoryGone: d.onDirectoryGone,
    ...(d.recorder === undefined ? {} : { recorder: d.recorder }),
    ...(d.serverFactory === undefined ? {} : { serverFactory: d.serverFactory }),
  });
  // MPS control daemons, asked for as long as the plugin runs; their answers come back as snapshots.
  const mpsWatch = new MpsDaemonWatch<RunningConfig>({
    log,
    rootOf: (c) => c.options.mpsRoot || null,
    ask: controlClientAsk(o.driverRoot),
    report: (resource, report) => {
      d.node()
        .onMpsDaemon(resource, report)
        .catch((err: unknown) => log.error('cannot apply an MPS daemon state', { resource, error: errorText(err) }));
    },
  });
  const planner = new ResourcePlanner<RunningConfig>(
    [new DevicePluginResources(manager, d.imexChannels), mpsWatch],
    log,
  );
  const registrations: Registrations = {
    allRegisteredNow: () => manager.allRegisteredNow(),
    registrationStates: () => manager.registrationStates(),
    onRegistered: (fn) => manager.onRegistered(fn),
    onRegistrationLost: (fn) => manager.onRegistrationLost(fn),
    advertised: () => planner.advertised(),
  };
  return { manager, planner, consumers: [planner], registrations, stop: () => undefined };
}
