// DRA mode (--kubelet-api=dra), composed; main.ts composes the rest, shared with the device-plugin
// mode: scanner, live node, observer, STATUS, state file. It replaces the device-plugin resource
// manager with two consumers of the node model sharing one API client, and tells the shared consumers
// about the kubelet's registrations through node/consumer.ts's Registrations:
//   * DraKubeletPlugin, the kubelet side: the plugin registration (registration.ts), the two sockets
//     kept served (sockets.ts), the claims (claims.ts) and the health stream (health.ts), fed the
//     node's devices (core/dra-devices.ts's list, the one the slice publisher publishes);
//   * the ResourceSlice publisher (slice-publisher.ts), which republishes after every kubelet
//     registration (the kubelet deletes its node's slices at its start);
//   * the kubeconfig is read at start: one that cannot be used stops the start (exit 2, naming why);
//   * the credentials are checked (SelfSubjectAccessReviews): ones that may not do what DRA needs stop
//     the start (exit 2), naming the permissions and the RBAC shipped with the package; an API server
//     that does not answer is one WARN, and the start goes on (the publisher retries);
//   * the two directories the systemd drop-in bind-mounts (ReadWritePaths=) are watched as the
//     device-plugin socket directory is (kubelet/watcher.ts SocketDirView): lost from this process's
//     view, the daemon exits 1 for systemd to restart it.
import { mkdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { OptionError } from '../config/errors.ts';
import type { Options } from '../config/options.ts';
import type { ClaimState } from '../core/daemon-state.ts';
import type { DraNodeDevice } from '../core/dra-claims.ts';
import { draDevices } from '../core/dra-devices.ts';
import { KubeClient, KubeUnreachableError } from '../k8s/client.ts';
import { KubeconfigError, loadKubeconfig } from '../k8s/kubeconfig.ts';
import { getResourceClaim } from '../k8s/resources.ts';
import { SocketDirView } from '../kubelet/watcher.ts';
import type { AppliedSnapshot, NodeConsumer, Registrations } from '../node/consumer.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { cdiSpecDirs } from './cdi.ts';
import { CHECKPOINT_FILE } from './checkpoint.ts';
import { DraClaims } from './claims.ts';
import type { ClaimReader, PreparedClaim } from './claims.ts';
import { HealthStream } from './health.ts';
import { DraRegistration } from './registration.ts';
import type { RegistrationListener } from './registration.ts';
import { SlicePublisher, accessProblem } from './slice-publisher.ts';
import { DraSockets } from './sockets.ts';

/** The devices this node offers through DRA now, named as its ResourceSlice names them. */
export type DeviceLister = (applied: AppliedSnapshot) => readonly DraNodeDevice[];

/**
 * The devices core/dra-devices.ts publishes for the snapshot (the slice publisher's list, by the MIG
 * strategy in force), with what prepare and the health stream need of each.
 */
export const publishedDevices: DeviceLister = (applied) => {
  const { snapshot, settings } = applied;
  return draDevices(snapshot, settings.plan.migStrategy ?? 'none').devices.flatMap((d): DraNodeDevice[] => {
    const gpu = snapshot.gpus[d.gpu];
    if (gpu === undefined) return [];
    const base = { name: d.name, gpuUuid: gpu.uuid, gpuIndex: gpu.index, minor: gpu.minor };
    return [d.mig === undefined ? base : { ...base, mig: { uuid: d.mig.uuid, index: d.mig.index } }];
  });
};

export interface DraKubeletPluginOptions {
  /** The DRA driver name (gpu.nvidia.com by default in the options). */
  readonly driver: string;
  /** This node's name: the pool every device of ours is in. */
  readonly nodeName: string;
  /** The kubelet's plugin watcher directory (/var/lib/kubelet/plugins_registry). */
  readonly registryDir: string;
  /** The kubelet's plugins directory (/var/lib/kubelet/plugins): dra.sock goes in <pluginsDir>/<driver>/. */
  readonly pluginsDir: string;
  readonly claims: ClaimReader;
  /** Default publishedDevices: the same list the slice publisher publishes. */
  readonly devices?: DeviceLister;
  /** Where CDI specs are looked for (default /etc/cdi, /var/run/cdi). */
  readonly cdiDirs?: readonly string[];
  /** Default <pluginsDir>/<driver>/gpu-device-plugin-checkpoint.json (checkpoint.ts). */
  readonly checkpointPath?: string;
  /** Default /proc/sys/kernel/random/boot_id. */
  readonly bootIdPath?: string;
  /** The periodic socket check (inotify can miss events); default 5000 ms. */
  readonly checkIntervalMs?: number;
  /**
   * Awaited before a failure to serve the sockets is reported: the composition looks whether this
   * process lost its view of the directories (and then exits with that reason instead).
   */
  readonly beforeServeProblem?: () => Promise<void>;
  /** Wall clock, ms since the epoch (the health stream's times); default Date.now. */
  readonly now?: () => number;
  readonly log: Logger;
}

/** The DRA kubelet plugin: a consumer of the node model composing registration, sockets, claims and health. */
export class DraKubeletPlugin implements NodeConsumer {
  readonly name = 'dra-kubelet-plugin';
  readonly driver: string;
  readonly registrationSocket: string;
  readonly endpoint: string;
  readonly checkpointPath: string;
  private readonly lister: DeviceLister;
  private readonly now: () => number;
  private readonly registration: DraRegistration;
  private readonly claims: DraClaims;
  private readonly health: HealthStream;
  private readonly sockets: DraSockets;
  private nodeDevices: readonly DraNodeDevice[] = [];
  private startedAt = 0;
  private started: Promise<void> | undefined;

  constructor(opts: DraKubeletPluginOptions) {
    const log = opts.log.child({ driver: opts.driver });
    this.driver = opts.driver;
    this.lister = opts.devices ?? publishedDevices;
    this.now = opts.now ?? Date.now;
    this.checkpointPath = opts.checkpointPath ?? join(opts.pluginsDir, opts.driver, CHECKPOINT_FILE);
    const { driver, nodeName } = opts;
    const devices = (): readonly DraNodeDevice[] => this.nodeDevices;
    const cdi = opts.cdiDirs === undefined ? {} : { cdiDirs: opts.cdiDirs };
    const bootId = opts.bootIdPath === undefined ? {} : { bootIdPath: opts.bootIdPath };
    const checkpointPath = this.checkpointPath;
    this.claims = new DraClaims({
      driver,
      nodeName,
      claims: opts.claims,
      devices,
      checkpointPath,
      ...cdi,
      ...bootId,
      now: this.now,
      log,
    });
    this.health = new HealthStream(nodeName);
    this.sockets = new DraSockets({
      driver,
      registryDir: opts.registryDir,
      pluginsDir: opts.pluginsDir,
      endpointServices: () => [...this.claims.bindings(), ...this.health.bindings()],
      registrationServices: () => [this.registration.binding()],
      onRegistrationSocketLost: (reason) => this.registration.lost(reason),
      onPluginDirMade: () => this.claims.persist(),
      ...(opts.beforeServeProblem === undefined ? {} : { beforeServeProblem: opts.beforeServeProblem }),
      ...(opts.checkIntervalMs === undefined ? {} : { checkIntervalMs: opts.checkIntervalMs }),
      log,
    });
    this.registrationSocket = this.sockets.registrationSocket;
    this.endpoint = this.sockets.endpoint;
    this.registration = new DraRegistration({ driver, endpoint: this.endpoint, log });
  }

  /** After every registration the kubelet confirms (NotifyRegistrationStatus true). */
  onRegistered(fn: RegistrationListener): void {
    this.registration.onRegistered(fn);
  }

  /** A registration stopped counting: our registration socket went, or the kubelet refused us. */
  onRegistrationLost(fn: RegistrationListener): void {
    this.registration.onRegistrationLost(fn);
  }

  /** Registered now (the kubelet's last word was yes, and our registration socket is the one it saw). */
  get registered(): boolean {
    return this.registration.registered;
  }

  get registrations(): number {
    return this.registration.registrations;
  }

  /** The claims the checkpoint holds (for `info`). */
  preparedClaims(): PreparedClaim[] {
    return this.claims.preparedClaims();
  }

  /** After the checkpoint's claims changed (a prepare or unprepare written), and once it was read at start. */
  onClaimsChanged(fn: () => void): void {
    this.claims.onClaimsChanged(fn);
  }

  async apply(applied: AppliedSnapshot): Promise<void> {
    this.nodeDevices = this.lister(applied);
    if (this.started === undefined) {
      this.startedAt = Math.floor(this.now() / 1000);
      this.started = this.start();
    }
    this.health.update(applied.snapshot, this.nodeDevices, this.startedAt);
    await this.started;
  }

  private async start(): Promise<void> {
    // The plugin directory is made when the sockets are served: a start without a kubelet's
    // directories goes on, and serves once they appear.
    await this.claims.open();
    await this.sockets.start();
  }

  async stop(): Promise<void> {
    await this.started?.catch(() => undefined);
    await this.sockets.quiesce();
    await this.health.close();
    await this.claims.drain();
    await this.sockets.close();
  }
}

/** The RBAC the package ships for DRA mode (packaging/dra/rbac.yaml). */
export const DRA_RBAC = '/usr/share/doc/gpu-device-plugin/dra/rbac.yaml';
/** How long the start waits for each credentials check before starting anyway (the publisher then retries). */
export const START_ACCESS_TIMEOUT_MS = 3000;

/** The directory one DRA plugin of this driver owns: <plugins dir>/<driver> (dra.sock, the checkpoint). */
export function draPluginDir(o: Pick<Options, 'kubeletPluginsDir' | 'draDriverName'>): string {
  return join(o.kubeletPluginsDir, o.draDriverName);
}

/**
 * The directory to lock against a second instance (as the device-plugin mode locks its socket
 * directory): the driver's plugin directory, made now when the kubelet's plugins directory exists, so
 * that two processes started together cannot both serve before one of them holds it.
 */
export async function draLockDirectory(
  o: Pick<Options, 'kubeletPluginsDir' | 'draDriverName'>,
): Promise<{ dir: string; hint: string }> {
  const dir = draPluginDir(o);
  const parent = await stat(o.kubeletPluginsDir).then(
    (s) => s.isDirectory(),
    () => false,
  );
  // One that cannot be made now is locked when it appears (the plugin's serving says why it cannot).
  if (parent) await mkdir(dir, { recursive: true, mode: 0o750 }).catch(() => undefined);
  return { dir, hint: 'give this one another --dra-driver-name or --kubelet-plugins-dir' };
}

export interface DraModeDeps {
  readonly options: Options;
  readonly log: Logger;
  readonly sysfsRoot: string;
  /** This process no longer sees one of the DRA directories (exit 1: systemd restarts it). */
  onDirectoryGone(dir: string, why: string): void;
}

/** DRA mode, composed: its two consumers, its registrations, and a stop for what is not a consumer. */
export interface DraMode {
  readonly plugin: DraKubeletPlugin;
  readonly publisher: SlicePublisher;
  readonly consumers: readonly NodeConsumer[];
  readonly registrations: Registrations;
  /** The prepared claims, for the state file. */
  readonly claims: () => ClaimState[];
  /**
   * status: what statusWords() says may have changed (a publication, or the API server failing); claims: a claim
   * prepared or unprepared.
   */
  onChange(listeners: { status(): void; claims(): void }): void;
  stop(): void;
}

/** The kubeconfig and the credentials' access, checked; throws OptionError (exit 2) when they cannot work. */
async function connect(o: Options, log: Logger): Promise<KubeClient> {
  if (o.kubeconfig === null) throw new OptionError('--kubelet-api=dra needs --kubeconfig (KUBECONFIG)');
  let client: KubeClient;
  try {
    client = new KubeClient(await loadKubeconfig(o.kubeconfig));
  } catch (err) {
    if (err instanceof KubeconfigError) throw new OptionError(`--kubeconfig: ${err.message}`);
    throw err;
  }
  let problem: string | null;
  try {
    // A short wait: an API server that drops packets must not hold the start up (the publisher retries).
    problem = await accessProblem(client, START_ACCESS_TIMEOUT_MS);
  } catch (err) {
    if (!(err instanceof KubeUnreachableError)) {
      client.close();
      throw new OptionError(
        `the API server ${client.server} refused to check these credentials ` +
          `(${client.target.source}): ${errorText(err)}; see ${DRA_RBAC}`,
      );
    }
    log.warn(
      'DRA: the API server does not answer at start; starting anyway, ResourceSlices will be published when it does',
      { server: client.server, error: errorText(err) },
    );
    return client;
  }
  if (problem !== null) {
    client.close();
    throw new OptionError(`${problem}: ${DRA_RBAC}`);
  }
  return client;
}

export async function startDraMode(d: DraModeDeps): Promise<DraMode> {
  const o = d.options;
  const client = await connect(o, d.log);
  const plugin = new DraKubeletPlugin({
    driver: o.draDriverName,
    nodeName: o.nodeName,
    registryDir: o.kubeletPluginsRegistry,
    pluginsDir: o.kubeletPluginsDir,
    claims: { getResourceClaim: (namespace, name) => getResourceClaim(client, namespace, name) },
    cdiDirs: cdiSpecDirs(process.env),
    log: d.log,
    beforeServeProblem: async () => {
      await Promise.all(views.map((v) => v.checkNow()));
    },
  });
  const publisher = new SlicePublisher({
    client,
    nodeName: o.nodeName,
    driver: o.draDriverName,
    log: d.log,
    sysfsRoot: d.sysfsRoot,
  });
  // The kubelet deletes its node's slices when it starts: write them again after every registration.
  plugin.onRegistered(() => publisher.republish());
  const views = [o.kubeletPluginsRegistry, draPluginDir(o)].map(
    (dir) => new SocketDirView({ dir, onDirectoryGone: (gone, why) => d.onDirectoryGone(gone, why), log: d.log }),
  );
  for (const v of views) v.start();
  const name = `${o.draDriverName} (DRA)`;
  const registrations: Registrations = {
    allRegisteredNow: () => plugin.registered,
    registrationStates: () => [{ name, registered: plugin.registered }],
    onRegistered: (fn) => plugin.onRegistered(() => fn(true)),
    onRegistrationLost: (fn) => plugin.onRegistrationLost(() => fn()),
    statusWords: (registeredNow) => {
      const s = publisher.status();
      const published =
        s.devices === null
          ? s.failing === null
            ? 'no devices published yet'
            : 'no devices published yet (the API server does not answer)'
          : `${s.devices} devices published${s.failing === null ? '' : ' (the API server does not answer now)'}`;
      return (
        `${registeredNow ? 'registered with the kubelet' : "waiting for the kubelet's plugin watcher"} ` +
        `(DRA, driver ${o.draDriverName}); ${published}`
      );
    },
  };
  return {
    plugin,
    publisher,
    consumers: [plugin, publisher],
    registrations,
    claims: () => plugin.preparedClaims(),
    onChange: (l) => {
      publisher.events.on('synced', () => l.status());
      publisher.events.on('failed', () => l.status());
      plugin.onClaimsChanged(() => l.claims());
    },
    // Called as the daemon starts to stop, before the consumers' stop: a slice request in flight to
    // an API server that hangs ends now, not at its timeout after the 2 s stop limit.
    stop: () => {
      for (const v of views) v.stop();
      publisher.halt();
      client.close();
    },
  };
}
