// The device-plugin mode's part of the composition (--kubelet-api=device-plugin; main.ts composes the
// rest, shared with DRA mode: scanner, live node, observer, STATUS, state file), as src/dra/mode.ts is
// DRA's. Two consumers of the node model: the resources (the resource manager, with how answers are
// given worked out from the options in force and its own log of what is advertised) and the MPS daemon
// watch (src/mps), whose reports go back to the live node. The manager is the registrations the
// shared consumers hear.
import { dirname } from 'node:path';
import type { Options } from '../config/options.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import { MpsDaemonWatch, controlClientAsk } from '../mps/health-watch.ts';
import type { RunningConfig } from '../node/config.ts';
import type { AppliedSnapshot, NodeConsumer, Registrations } from '../node/consumer.ts';
import type { LiveNode } from '../node/live-node.ts';
import { presentControlDevices } from '../system/control-devices.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { describeResources } from './describe.ts';
import { ResourceManager } from './manager.ts';
import type { ManagerContext, ServeSettings } from './manager.ts';

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

/** The resource manager as a consumer of the running configuration: it works out the serve settings and logs the plan. */
export class DevicePluginResources implements NodeConsumer<RunningConfig> {
  readonly name = 'device plugin resources';
  private readonly manager: ResourceManager;
  private readonly imexChannels: readonly number[];
  private readonly log: Logger;
  private last: NodeSnapshot | null = null;
  private serve: { readonly options: Options; readonly settings: ServeSettings } | null = null;

  constructor(manager: ResourceManager, imexChannels: readonly number[], log: Logger) {
    this.manager = manager;
    this.imexChannels = imexChannels;
    this.log = log;
  }

  async apply(applied: AppliedSnapshot<RunningConfig>): Promise<void> {
    const options = applied.settings.options;
    if (this.serve?.options !== options)
      this.serve = { options, settings: await serveSettings(options, this.imexChannels) };
    describeResources(this.log, this.last, applied.snapshot, applied.change, applied.reason);
    this.last = applied.snapshot;
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

/** The device-plugin mode, composed: its consumers and its registrations (the resource manager). */
export interface DevicePluginMode {
  readonly manager: ResourceManager;
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
  return {
    manager,
    consumers: [new DevicePluginResources(manager, d.imexChannels, log), mpsWatch],
    registrations: manager,
    stop: () => undefined,
  };
}
