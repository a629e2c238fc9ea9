// MPS sharing (FACTS §10): where each resource's control daemon lives under the MPS root, what a
// container of that resource gets, how many clients a GPU serves, and the daemons' plan — which
// GPUs each serves and the default limits it sets (pinned memory per GPU, active-thread percentage).
// The plugin, the control daemon unit (`mps-control-daemon`) and `check` all derive their paths and
// limits from here, so the two processes cannot disagree. Pure.
import type { Gpu } from './devices.ts';
import type { PlannedResource } from './sharing.ts';

/** The package's MPS root (NVIDIA's chart uses the same). */
export const DEFAULT_MPS_ROOT = '/run/nvidia/mps';
/** Where a container finds its resource's pipe directory (NVIDIA's). */
export const MPS_CONTAINER_ROOT = '/mps';
export const MPS_PIPE_ENV = 'CUDA_MPS_PIPE_DIRECTORY';
/** MPS clients per GPU from Volta (compute capability 7.0) on, and before it. */
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
    const perGpu = new Map<number, number>();
    for (const d of r.devices) perGpu.set(d.gpu, (perGpu.get(d.gpu) ?? 0) + 1);
    const positions = [...perGpu.keys()].sort((a, b) => (gpus[a]?.index ?? a) - (gpus[b]?.index ?? b));
    const replicas = Math.max(...perGpu.values());
    out.push({
      resource: r.name,
      replicas,
      activeThreadPercentage: Math.max(1, Math.floor(100 / replicas)),
      gpus: positions.map((pos, k) => {
        const gpu = gpus[pos] as Gpu;
        const n = perGpu.get(pos) ?? replicas;
        return { uuid: gpu.uuid, index: gpu.index, mpsDevice: k, pinnedMemLimitMiB: Math.floor(gpu.memoryBytes / (1024 * 1024) / n) };
      }),
    });
  }
  return out;
}
