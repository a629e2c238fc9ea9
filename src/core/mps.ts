// MPS sharing: where each resource's control daemon lives under the MPS root, what a
// container of that resource gets, how many clients a GPU serves, and the daemons' plan — which
// GPUs each serves and the default limits it sets (pinned memory per GPU, active-thread percentage).
// The plugin, the control daemon unit (`mps-control-daemon`) and `check` all derive their paths and
// limits from here, so the two processes cannot disagree. Pure.
import type { Gpu } from './devices.ts';
import type { MigLayout } from './mig.ts';
import { SharingError, activeSharing, advertisedName } from './sharing.ts';
import type { PlannedResource, Sharing } from './sharing.ts';

/** The package's MPS root (NVIDIA's chart uses the same). */
export const DEFAULT_MPS_ROOT = '/run/nvidia/mps';
/** Where a container finds its resource's pipe directory (NVIDIA's). */
export const MPS_CONTAINER_ROOT = '/mps';
export const MPS_PIPE_ENV = 'CUDA_MPS_PIPE_DIRECTORY';
/**
 * MPS clients per GPU from Volta (compute capability 7.0) on, and before it. NVIDIA's plugin compares
 * with 7.5 (isAtLeastVolta), wrongly holding V100s (7.0) to 16; 7.0 is where CUDA's MPS documentation
 * raises the limit to 48.
 */
export const MPS_CLIENTS_FROM_VOLTA = 48;
export const MPS_CLIENTS_BEFORE_VOLTA = 16;

/** One resource's daemon directory layout under the root: `<root>/<resource>/{pipe,log,.started}`. */
export interface MpsPaths {
  readonly dir: string;
  readonly pipeDir: string;
  readonly logDir: string;
  readonly startedFile: string;
}

function join(...parts: string[]): string {
  return parts.join('/').replace(/\/+/g, '/');
}

export function mpsPaths(root: string, resource: string): MpsPaths {
  const dir = join(root, resource);
  return { dir, pipeDir: join(dir, 'pipe'), logDir: join(dir, 'log'), startedFile: join(dir, '.started') };
}

/** The tmpfs shared by the daemons and their clients (the containers' /dev/shm). */
export function mpsShmDir(root: string): string {
  return join(root, 'shm');
}

/** Written once every resource's daemon is up. */
export function mpsReadyFile(root: string): string {
  return join(root, '.ready');
}

/** The pipe directory inside a container of this resource. */
export function containerPipeDir(resource: string): string {
  return join(MPS_CONTAINER_ROOT, resource, 'pipe');
}

/** Most MPS clients one GPU serves: 48 from Volta (7.0), 16 before it or when the capability is unknown. */
export function maxMpsClients(compute: { readonly major: number; readonly minor: number } | null): number {
  return compute !== null && compute.major >= 7 ? MPS_CLIENTS_FROM_VOLTA : MPS_CLIENTS_BEFORE_VOLTA;
}

/** One GPU a daemon serves. */
export interface MpsDaemonGpu {
  readonly uuid: string;
  /** NVML index on the node. */
  readonly index: number;
  /**
   * The device number the daemon knows it by: its position in the daemon's CUDA_VISIBLE_DEVICES
   * (MPS numbers the visible devices from 0), used by set_default_device_pinned_mem_limit.
   */
  readonly mpsDevice: number;
  /** Default pinned-memory limit per client: the GPU's memory / replicas, in MiB. */
  readonly pinnedMemLimitMiB: number;
}

/** One control daemon: the resource it serves, its GPUs and default limits. */
export interface MpsDaemonPlan {
  readonly resource: string;
  readonly replicas: number;
  readonly gpus: readonly MpsDaemonGpu[];
  /** 100 / replicas, rounded down (at least 1). */
  readonly activeThreadPercentage: number;
}

/**
 * The daemons for a plan: one per MPS resource (PlannedResource.mps), serving the GPUs its replicas
 * are carved from, in NVML index order. `gpus` is the list the plan was made from.
 */
export function planMpsDaemons(resources: readonly PlannedResource[], gpus: readonly Gpu[]): MpsDaemonPlan[] {
  const out: MpsDaemonPlan[] = [];
  for (const r of resources) {
    if (r.mps !== true) continue;
    // Only replicas are the daemon's clients: whole GPUs beside them under nvidia.com/gpu (a devices
    // selection leaving some out) are not served by it.
    const perGpu = new Map<number, number>();
    for (const d of r.devices) if (d.replica !== undefined) perGpu.set(d.gpu, (perGpu.get(d.gpu) ?? 0) + 1);
    if (perGpu.size === 0) continue;
    const positions = [...perGpu.keys()].sort((a, b) => (gpus[a]?.index ?? a) - (gpus[b]?.index ?? b));
    const replicas = Math.max(...perGpu.values());
    out.push({
      resource: r.name,
      replicas,
      activeThreadPercentage: Math.max(1, Math.floor(100 / replicas)),
      gpus: positions.map((pos, k) => {
        const gpu = gpus[pos] as Gpu;
        const n = perGpu.get(pos) ?? replicas;
        return {
          uuid: gpu.uuid,
          index: gpu.index,
          mpsDevice: k,
          pinnedMemLimitMiB: Math.floor(gpu.memoryBytes / (1024 * 1024) / n),
        };
      }),
    });
  }
  return out;
}

/** The options MPS depends on (config/options.ts): the MIG strategy and the root. */
export interface MpsOptions {
  readonly migStrategy: 'none' | 'single' | 'mixed';
  /** --mps-root; '' when not set. */
  readonly mpsRoot: string;
}

/**
 * Why MPS cannot be used with these options (checked before NVML is
 * opened), naming what to change; null when it can or is not configured.
 */
export function mpsOptionsProblem(
  sharing: Sharing,
  o: MpsOptions,
): { readonly key: string; readonly message: string } | null {
  if (sharing.mps === undefined || sharing.mps === null) return null;
  if (sharing.timeSlicing !== null) {
    return {
      key: 'sharing.mps',
      message: 'MPS and time-slicing exclude each other; keep sharing.mps or sharing.timeSlicing, not both',
    };
  }
  if (o.migStrategy === 'mixed') {
    return {
      key: '--mig-strategy',
      message:
        'using --mig-strategy=mixed is not supported with MPS (sharing using MPS is not ' +
        'supported for MIG devices); use --mig-strategy=none, or share with sharing.timeSlicing',
    };
  }
  if (o.mpsRoot === '') {
    return {
      key: '--mps-root',
      message:
        `using MPS requires --mps-root (MPS_ROOT, flags.mpsRoot): the host directory of the MPS control ` +
        `daemons' pipes and shm; set it, e.g. --mps-root=${DEFAULT_MPS_ROOT} (the package's env file does)`,
    };
  }
  return null;
}

/** What the client limit needs of a GPU, by UUID (core/snapshot.ts NodeFacts.gpus). */
export type ComputeByUuid = ReadonlyMap<
  string,
  { readonly compute: { readonly major: number; readonly minor: number } | null }
>;

/**
 * Why a plan's MPS replicas cannot be served on this node, as a SharingError naming the config key:
 * a GPU with MIG enabled (NVIDIA: "sharing using MPS is not supported for MIG devices"), or more
 * replicas on a GPU than its MPS server takes clients (maxMpsClients). `compute` absent: the facts
 * were not read, and the client limit is not checked (the daemon's own plan, which reads them, does).
 */
export function mpsPlanProblem(
  resources: readonly PlannedResource[],
  gpus: readonly Gpu[],
  mig: MigLayout,
  sharing: Sharing,
  compute?: ComputeByUuid,
): SharingError | null {
  const active = activeSharing(sharing);
  if (active === null || active.strategy !== 'mps') return null;
  const entryOf = (resource: string, replicas: number): string => {
    const k = active.config.resources.findIndex(
      (e) => e.replicas === replicas && advertisedName(e, active.config.renameByDefault) === resource,
    );
    return k < 0 ? `${active.key}.resources` : `${active.key}.resources[${k}]`;
  };
  for (const r of resources) {
    const migDevice = r.devices.find((d) => d.mig !== undefined);
    if (migDevice !== undefined) {
      return new SharingError(
        active.key,
        `sharing using MPS is not supported for MIG devices (${r.name} would hold MIG device ` +
          `${migDevice.mig}); use --mig-strategy=none with MIG disabled, or share with sharing.timeSlicing`,
      );
    }
    if (r.mps !== true) continue;
    const perGpu = new Map<number, number>();
    for (const d of r.devices) if (d.replica !== undefined) perGpu.set(d.gpu, (perGpu.get(d.gpu) ?? 0) + 1);
    for (const [pos, n] of perGpu) {
      const gpu = gpus[pos];
      if (gpu === undefined) continue;
      if (mig.modes[pos]?.current === true) {
        return new SharingError(
          `${entryOf(r.name, n)}.devices`,
          `GPU ${gpu.index} (${gpu.uuid}) has MIG enabled; sharing using MPS is not supported for MIG ` +
            `devices; disable MIG on it (nvidia-smi -i ${gpu.index} -mig 0) or leave it out of devices`,
        );
      }
      if (compute === undefined) continue;
      const cc = compute.get(gpu.uuid)?.compute ?? null;
      const max = maxMpsClients(cc);
      if (n > max) {
        const what =
          cc === null
            ? 'its compute capability is unknown, so it is held to'
            : `compute capability ${cc.major}.${cc.minor} serves at most`;
        return new SharingError(
          `${entryOf(r.name, n)}.replicas`,
          `${n} replicas of GPU ${gpu.index} (${gpu.uuid}) are more MPS clients than ` +
            `it takes: ${what} ${max} (${MPS_CLIENTS_FROM_VOLTA} from Volta, compute ` +
            `capability 7.0, ${MPS_CLIENTS_BEFORE_VOLTA} before); ask for at most ${max}`,
        );
      }
    }
  }
  return null;
}
