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
import { expiryText, judgeExpiry } from '../k8s/credentials.ts';
import { KubeClient, KubeUnreachableError } from '../k8s/client.ts';
import { KubeconfigError, loadKubeconfig } from '../k8s/kubeconfig.ts';
import { getResourceClaim } from '../k8s/resources.ts';
import { SocketDirView } from '../kubelet/watcher.ts';
import type { NodeConsumer, Registrations } from '../node/consumer.ts';
import { MpsDaemonWatch, controlClientAsk } from '../mps/health-watch.ts';
import type { RunningConfig } from '../node/config.ts';
import type { LiveNode } from '../node/live-node.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CDI_WRITE_DIR, cdiSpecDirs } from './cdi.ts';
import { SlicePublisher, accessProblem } from './slice-publisher.ts';
import { healthTimeoutFromEnv } from './health.ts';
import { DraKubeletPlugin } from './kubelet-plugin.ts';
import { CHECKPOINT_FILE, claimedPartitionsAt } from './checkpoint.ts';
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
  /**
   * Hears when a claim's MPS daemon starts or stops answering, and which dynamic MIG partitions the claims hold;
   * known once made (the node is made after its consumers).
   */
  readonly node: () => Pick<LiveNode<RunningConfig>, 'onMpsDaemon' | 'onClaimedPartitions'>;
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
   * The dynamic MIG partitions the checkpoint's claims held at start: the node's first snapshot has them, so that
   * the first slices written already publish their instances as those partitions.
   */
  readonly claimedPartitions: ReadonlySet<string>;
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
    client = new KubeClient(await loadKubeconfig(o.kubeconfig), {
      onClientCertificate: ({ file, notAfter }) => {
        const text = notAfter === null ? null : expiryText(judgeExpiry(notAfter, new Date()), file);
        if (text !== null) log.error(`DRA: ${text}`, { file, notAfter: notAfter?.toISOString() });
      },
      onRetryAfter: (w) => log.debug('DRA: the API server asks to wait before the request is sent again', w),
    });
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

/**
 * The prepared MPS claims' control daemons, asked for as long as the plugin runs (as the device-plugin's are):
 * their answers come back as snapshots, whose DRA views make the claim's devices Unhealthy and tainted.
 */
function watchClaimDaemons(plugin: DraKubeletPlugin, d: DraModeDeps): MpsDaemonWatch {
  const log = d.log;
  let units = new Map<string, readonly string[]>();
  const watch = new MpsDaemonWatch({
    log,
    rootOf: () => null,
    ask: controlClientAsk(d.options.driverRoot),
    report: (resource, report) => {
      const served = units.get(resource);
      const r = report === null ? null : { ...report, ...(served === undefined ? {} : { units: served }) };
      d.node()
        .onMpsDaemon(resource, r)
        .catch((err: unknown) => log.error('cannot apply an MPS daemon state', { resource, error: errorText(err) }));
    },
  });
  plugin.onClaimsChanged(() => {
    const wanted = plugin.claimDaemons();
    units = new Map([...wanted.values()].map((w) => [w.resource, w.units]));
    watch.watchDaemons(wanted);
  });
  return watch;
}

/**
 * The dynamic MIG partitions the claims hold, told to the node at every change of the claims; and the node looked
 * at again once a claim's instance is made or destroyed (its MIG device's health, its MPS daemon's units).
 */
function followClaimedPartitions(plugin: DraKubeletPlugin, d: DraModeDeps): void {
  let made = new Set<string>();
  plugin.onClaimsChanged(() => {
    const now = plugin.claimedPartitions(true);
    const lookAgain = now.size !== made.size || [...now].some((n) => !made.has(n));
    made = now;
    d.node()
      .onClaimedPartitions(plugin.claimedPartitions(), lookAgain)
      .catch((err: unknown) => d.log.error('cannot apply the claimed MIG partitions', { error: errorText(err) }));
  });
}

/** What the shared consumers know of DRA mode's registration, and its words for STATUS. */
function draRegistrations(plugin: DraKubeletPlugin, publisher: SlicePublisher, driver: string): Registrations {
  const name = `${driver} (DRA)`;
  return {
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
        `(DRA, driver ${driver}); ${published}`
      );
    },
  };
}

export async function startDraMode(d: DraModeDeps): Promise<DraMode> {
  const o = d.options;
  const healthTimeoutSec = healthTimeoutFromEnv(process.env);
  const client = await connect(o, d.log);
  const cdiDirs = cdiSpecDirs(process.env);
  const plugin = new DraKubeletPlugin({
    driver: o.draDriverName,
    nodeName: o.nodeName,
    registryDir: o.kubeletPluginsRegistry,
    pluginsDir: o.kubeletPluginsDir,
    claims: { getResourceClaim: (namespace, name) => getResourceClaim(client, namespace, name) },
    cdiDirs,
    // The last directory the runtime reads (/var/run/cdi by default): the one for generated specs.
    cdiWriteDir: cdiDirs[cdiDirs.length - 1] ?? CDI_WRITE_DIR,
    mpsRoot: o.mpsRoot || null,
    healthTimeoutSec,
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
  publisher.readServerVersion();
  // The kubelet deletes its node's slices when it starts: write them again after every registration.
  plugin.onRegistered(() => publisher.republish());
  const daemons = watchClaimDaemons(plugin, d);
  followClaimedPartitions(plugin, d);
  const views = [o.kubeletPluginsRegistry, draPluginDir(o)].map(
    (dir) => new SocketDirView({ dir, onDirectoryGone: (gone, why) => d.onDirectoryGone(gone, why), log: d.log }),
  );
  for (const v of views) v.start();
  const registrations = draRegistrations(plugin, publisher, o.draDriverName);
  const claimedPartitions = await claimedPartitionsAt(join(draPluginDir(o), CHECKPOINT_FILE));
  return {
    plugin,
    publisher,
    consumers: [plugin, publisher],
    registrations,
    claims: () => plugin.preparedClaims(),
    claimedPartitions,
    onChange: (l) => {
      publisher.events.on('synced', () => l.status());
      publisher.events.on('failed', () => l.status());
      plugin.onClaimsChanged(() => l.claims());
    },
    // Called as the daemon starts to stop, before the consumers' stop: a slice request in flight to
    // an API server that hangs ends now, not at its timeout after the 2 s stop limit.
    stop: () => {
      daemons.stop();
      for (const v of views) v.stop();
      publisher.halt();
      client.close();
    },
  };
}
