import { foreignInstances, freePartitions } from '../core/dynamic-mig.ts';
import { join } from 'node:path';
import { draDevices, migDevicesByName, withoutClaimedInstances } from '../core/dra-devices.ts';
import { CLAIM_MPS_RESOURCE, claimDaemonName, claimMpsRoot } from '../core/dra-sharing.ts';
import type { HostDevice } from '../core/dra-sharing.ts';
import { mpsPaths } from '../core/mps.ts';
import type { AppliedSnapshot, NodeConsumer } from '../node/consumer.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CDI_WRITE_DIR } from './cdi.ts';
import { CHECKPOINT_FILE } from './checkpoint.ts';
import { DraClaims } from './claims.ts';
import type { ClaimReader, PreparedClaim } from './claims.ts';
import { HealthStream } from './health.ts';
import { DraRegistration } from './registration.ts';
import type { RegistrationListener } from './registration.ts';
import { HostSharing } from './sharing.ts';
import { DraSockets } from './sockets.ts';

/** The devices this node offers through DRA now, named as its ResourceSlice names them, with their memory. */
export type DeviceLister = (applied: AppliedSnapshot) => readonly HostDevice[];

/**
 * The devices core/dra-devices.ts publishes for the snapshot (the slice publisher's list, by the MIG
 * strategy in force), with what prepare and the health stream need of each.
 */
export const publishedDevices: DeviceLister = (applied) => {
  const { snapshot, settings } = applied;
  const partitionable = settings.plan.dynamicMig === true ? snapshot.mig.partitionable : undefined;
  const all = draDevices(snapshot, settings.plan.migStrategy ?? 'none');
  const listed = withoutClaimedInstances(snapshot, all, partitionable).devices.flatMap((d): HostDevice[] => {
    const gpu = snapshot.gpus[d.gpu];
    if (gpu === undefined) return [];
    const base = { name: d.name, gpuUuid: gpu.uuid, gpuIndex: gpu.index, minor: gpu.minor };
    if (d.mig === undefined) return [{ ...base, memoryBytes: gpu.memoryBytes }];
    return [{ ...base, memoryBytes: d.mig.memoryBytes, mig: { uuid: d.mig.uuid, index: d.mig.index } }];
  });
  if (partitionable === undefined) return listed;
  // Dynamic MIG: each free placement of a MIG-mode GPU, carved at prepare (the slice publisher offers the same);
  // the claimed ones whose instances exist among them.
  const claimed = snapshot.claimedPartitions ?? new Set<string>();
  const made = migDevicesByName(snapshot);
  const instanceOf = (name: string): { instanceUuid?: string } => {
    const uuid = claimed.has(name) ? made.get(name)?.uuid : undefined;
    return uuid === undefined ? {} : { instanceUuid: uuid };
  };
  const partitions = snapshot.gpus.flatMap((gpu, i): HostDevice[] => {
    const p = partitionable.get(gpu.uuid);
    if (p === undefined || snapshot.mig.modes[i]?.current !== true) return [];
    const instances = foreignInstances({ minor: gpu.minor, ...p }, claimed);
    return freePartitions({ minor: gpu.minor, profiles: p.profiles, instances }).map((f) => ({
      name: f.name,
      gpuUuid: gpu.uuid,
      gpuIndex: gpu.index,
      minor: gpu.minor,
      memoryBytes: f.profile.memoryMiB * 1024 * 1024,
      partition: { giProfileId: f.profile.id, start: f.placement.start, size: f.placement.size },
      ...instanceOf(f.name),
    }));
  });
  return [...listed, ...partitions];
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
  /** Where the CDI specs of MPS claims are written (default /var/run/cdi). */
  readonly cdiWriteDir?: string;
  /** The MPS root where the MPS unit's agent reads sharing requests (null, the default: claims cannot share). */
  readonly mpsRoot?: string | null;
  /** How long prepare waits for the agent (sharing.ts ANSWER_TIMEOUT_MS by default). */
  readonly sharingAnswerTimeoutMs?: number;
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
  /** The timeout each health report states, seconds (default 30, the kubelet's); resent every third of it. */
  readonly healthTimeoutSec?: number;
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
  private readonly mpsRoot: string | null;
  private readonly lister: DeviceLister;
  private readonly now: () => number;
  private readonly registration: DraRegistration;
  private readonly claims: DraClaims;
  private readonly sharing: HostSharing;
  private readonly health: HealthStream;
  private readonly sockets: DraSockets;
  private nodeDevices: readonly HostDevice[] = [];
  private startedAt = 0;
  private started: Promise<void> | undefined;
  /** Why the checkpoint could not be written at the last check (logged once), or undefined. */
  private checkpointProblem: string | undefined;

  constructor(opts: DraKubeletPluginOptions) {
    const log = opts.log.child({ driver: opts.driver });
    this.driver = opts.driver;
    this.lister = opts.devices ?? publishedDevices;
    this.mpsRoot = opts.mpsRoot ?? null;
    this.now = opts.now ?? Date.now;
    this.checkpointPath = opts.checkpointPath ?? join(opts.pluginsDir, opts.driver, CHECKPOINT_FILE);
    const { driver, nodeName } = opts;
    const devices = (): readonly HostDevice[] => this.nodeDevices;
    const sharing = new HostSharing({
      mpsRoot: opts.mpsRoot ?? null,
      cdiDir: opts.cdiWriteDir ?? CDI_WRITE_DIR,
      log,
      procRoot: process.env.PROC_ROOT || '/proc',
      ...(opts.sharingAnswerTimeoutMs === undefined ? {} : { answerTimeoutMs: opts.sharingAnswerTimeoutMs }),
    });
    this.sharing = sharing;
    const cdi = opts.cdiDirs === undefined ? {} : { cdiDirs: opts.cdiDirs };
    const bootId = opts.bootIdPath === undefined ? {} : { bootIdPath: opts.bootIdPath };
    const checkpointPath = this.checkpointPath;
    this.claims = new DraClaims({
      driver,
      nodeName,
      claims: opts.claims,
      devices,
      sharing,
      checkpointPath,
      ...cdi,
      ...bootId,
      now: this.now,
      log,
    });
    this.health = new HealthStream(nodeName, opts.healthTimeoutSec);
    this.sockets = new DraSockets({
      driver,
      registryDir: opts.registryDir,
      pluginsDir: opts.pluginsDir,
      endpointServices: () => [...this.claims.bindings(), ...this.health.bindings()],
      registrationServices: () => [this.registration.binding()],
      onRegistrationSocketLost: (reason) => this.registration.lost(reason),
      onPluginDirMade: () => this.claims.persist().then(() => undefined),
      afterPass: () => this.convergeCheckpoint(log),
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

  /** The dynamic MIG partitions prepared claims hold (claims.ts). */
  claimedPartitions(preparedOnly = false): Set<string> {
    return this.claims.claimedPartitions(preparedOnly);
  }

  /** The claims the checkpoint holds (for `info`). */
  preparedClaims(): PreparedClaim[] {
    return this.claims.preparedClaims();
  }

  /** After the checkpoint's claims changed (a prepare or unprepare written), and once it was read at start. */
  onClaimsChanged(fn: () => void): void {
    this.claims.onClaimsChanged(fn);
  }

  /** The MPS control daemons of the prepared claims: their names, pipe directories and the units they serve. */
  claimDaemons(): Map<string, { resource: string; dirs: { pipeDir: string; logDir: string }; units: string[] }> {
    const out = new Map<string, { resource: string; dirs: { pipeDir: string; logDir: string }; units: string[] }>();
    const root = this.mpsRoot;
    if (root === null) return out;
    // Only prepared claims' daemons: one being prepared has none yet (a claim's partitions are recorded before).
    const prepared = new Set(
      this.claims.preparedClaims().flatMap((c) => (c.state === 'PrepareCompleted' ? c.uid : [])),
    );
    for (const [uid, r] of this.claims.sharingRequests()) {
      if (r.mps === undefined || !prepared.has(uid)) continue;
      const p = mpsPaths(claimMpsRoot(root, uid), CLAIM_MPS_RESOURCE);
      const resource = claimDaemonName(r.claim);
      out.set(`${resource}|${p.pipeDir}`, {
        resource,
        dirs: { pipeDir: p.pipeDir, logDir: p.logDir },
        // A partition's unit is the MIG device the agent made for it.
        units: [
          ...r.mps.units.map((u) => u.uuid),
          ...(r.mps.partitionUnits ?? []).flatMap((u) => this.sharing.madeUuid(uid, u.partition) ?? []),
        ],
      });
    }
    return out;
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

  /**
   * On every socket check (5 s) the checkpoint is compared with its file: one removed or edited by someone
   * else is written again (with it gone, a restart would withdraw the sharing of claims still prepared).
   */
  private async convergeCheckpoint(log: Logger): Promise<void> {
    try {
      if (await this.claims.persist())
        log.warn('the DRA checkpoint was removed or changed by someone else; written again', {
          checkpoint: this.checkpointPath,
        });
      if (this.checkpointProblem !== undefined)
        log.info('DRA checkpoint written again', { checkpoint: this.checkpointPath });
      this.checkpointProblem = undefined;
    } catch (err) {
      const problem = errorText(err);
      if (problem !== this.checkpointProblem)
        log.error('cannot write the DRA checkpoint; trying again at each check', { error: problem });
      this.checkpointProblem = problem;
    }
  }
}
