// The real MpsHost (daemon.ts's port): compute modes through NVML, directories and files, the
// shared tmpfs through mount(8)/umount(8), and `nvidia-cuda-mps-control -f` as a child process.
//
// Why `-f` (foreground) and not `-d` (NVIDIA's): a forked daemon is nobody's child, so its death is
// only noticed by polling; in the foreground it is our child and its exit reaches us at once (and
// systemd sees it in the unit's cgroup either way). Stopping it still goes through `quit`.
//
// Why mount(8) and not mount(2) through koffi: a child process never blocks the event loop, the
// option string is the same as NVIDIA's, and mount(8) reports errors in words.
//
// The control daemon (and the per-user MPS servers it forks) must see the same /dev/shm as its
// clients, whose /dev/shm is `<root>/shm` (the plugin's Allocate mounts it there). So it runs in a
// mount namespace of its own in which `<root>/shm` is bound onto /dev/shm: unshare(1) then a
// shell's `mount --bind` then `exec` — the pid we hold is the control program's throughout.
import { spawn } from 'node:child_process';
import { chmod, mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { mpsShmDir } from '../core/mps.ts';
import type { MpsDaemonPlan, MpsPaths } from '../core/mps.ts';
import { getComputeMode, setComputeMode } from '../nvml/compute-mode.ts';
import type { DeviceHandle, Nvml } from '../nvml/nvml.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { mpsCommand, mpsEnvironment } from './control-client.ts';
import type { ControlChild, ControlExit, MpsHost } from './daemon.ts';

/** The tmpfs size: half of MemTotal (NVIDIA's), 65536k when /proc/meminfo cannot be read. */
export function shmSize(meminfo: string | null): string {
  const m = meminfo === null ? null : /^MemTotal:\s+(\d+)\s+kB$/m.exec(meminfo);
  if (m === null) return '65536k';
  return `${Math.floor(Number(m[1]) / 2)}k`;
}

/** Whether `dir` is a mount point, from /proc/self/mountinfo's text (octal escapes decoded). */
export function isMountPoint(mountinfo: string, dir: string): boolean {
  const decode = (s: string): string =>
    s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
  return mountinfo.split('\n').some((line) => decode(line.split(' ')[4] ?? '') === dir);
}

function run(program: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      err += d;
    });
    child.on('error', (e) => reject(new Error(`cannot run ${program}: ${e.message}`)));
    child.on('close', (code, signal) => {
      if (code === 0) resolve();
      else
        reject(
          new Error(
            `${program} ${args.join(' ')} ` +
              `${signal !== null ? `was killed by ${signal}` : `exited with status ${code}`}` +
              `${err.trim() ? `: ${err.trim()}` : ''}`,
          ),
        );
    });
  });
}

export interface HostOptions {
  /** The MPS root (its shm is the control daemon's /dev/shm). */
  readonly root: string;
  readonly nvml: Nvml;
  /** nvidia-cuda-mps-control (findMpsControl). */
  readonly program: string;
  readonly log: Logger;
  /** The control daemon's first answer is waited for this long (default 10 s). */
  readonly startTimeoutMs?: number;
  /** Each client command's timeout (default 5 s). */
  readonly commandTimeoutMs?: number;
}

export class RealMpsHost implements MpsHost {
  private readonly o: HostOptions;
  constructor(o: HostOptions) {
    this.o = o;
  }

  private handle(gpu: { readonly uuid: string; readonly index: number }): DeviceHandle {
    const { nvml } = this.o;
    // The plan's index first; any index if the GPUs moved since (a GPU removed from the bus).
    const count = nvml.deviceCount();
    for (const i of [gpu.index, ...Array.from({ length: count }, (_, k) => k).filter((k) => k !== gpu.index)]) {
      if (i >= count) continue;
      const h = nvml.handleByIndex(i);
      if (nvml.uuid(h, { index: i }) === gpu.uuid) return h;
    }
    throw new Error(`GPU ${gpu.uuid} (index ${gpu.index} when planned) is not among the ${count} GPUs NVML shows now`);
  }

  async setComputeMode(
    gpu: { readonly uuid: string; readonly index: number },
    mode: 'exclusive-process' | 'default',
  ): Promise<void> {
    const h = this.handle(gpu);
    const ref = { index: gpu.index, uuid: gpu.uuid };
    setComputeMode(this.o.nvml, h, ref, mode);
    // Read back, so the log says what the driver now holds.
    this.o.log.info('compute mode set', { gpu: gpu.uuid, mode: getComputeMode(this.o.nvml, h, ref) });
  }

  async makeDirs(dir: string): Promise<void> {
    // Each missing directory, from the top, created 0755 whatever the umask; `dir` itself 0755 too.
    const missing: string[] = [];
    for (let d = dir; ; d = dirname(d)) {
      const exists = await stat(d).then(
        (s) => {
          if (!s.isDirectory())
            throw new Error(`${d} is in the way of the MPS directory ${dir}: it is not a directory`);
          return true;
        },
        () => false,
      );
      if (exists || d === dirname(d)) break;
      missing.unshift(d);
    }
    for (const d of missing) {
      await mkdir(d).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== 'EEXIST') throw new Error(`cannot create ${d}: ${e.message}`);
      });
      await chmod(d, 0o755);
    }
    await chmod(dir, 0o755);
  }

  async writeFile(path: string, text: string): Promise<void> {
    await writeFile(path, text, { mode: 0o644 });
  }

  async remove(path: string): Promise<void> {
    await rm(path, { recursive: true, force: true });
  }

  async mountShm(dir: string): Promise<{ mounted: boolean; size: string }> {
    const size = shmSize(await readFile('/proc/meminfo', 'utf8').catch(() => null));
    if (isMountPoint(await readFile('/proc/self/mountinfo', 'utf8'), dir)) return { mounted: false, size };
    await run('mount', ['-t', 'tmpfs', '-o', `rw,nosuid,nodev,noexec,relatime,mode=1777,size=${size}`, 'tmpfs', dir]);
    return { mounted: true, size };
  }

  async unmountShm(dir: string): Promise<void> {
    if (!isMountPoint(await readFile('/proc/self/mountinfo', 'utf8'), dir)) return;
    await run('umount', [dir]);
  }

  async command(paths: MpsPaths, command: string, timeoutMs?: number): Promise<string> {
    return mpsCommand(this.o.program, paths, command, { timeoutMs: timeoutMs ?? this.o.commandTimeoutMs ?? 5000 });
  }

  startControl(plan: MpsDaemonPlan, paths: MpsPaths): Promise<ControlChild> {
    return startControlDaemon(this.o, plan, paths, mpsShmDir(this.o.root));
  }
}

/**
 * Starts `nvidia-cuda-mps-control -f` for one plan in its own mount namespace (/dev/shm = shmDir),
 * and resolves once it answers its client; rejects (after killing it) when it exits or stays silent.
 */
export async function startControlDaemon(
  o: HostOptions,
  plan: MpsDaemonPlan,
  paths: MpsPaths,
  shmDir: string,
): Promise<ControlChild> {
  const env = mpsEnvironment(
    paths,
    plan.gpus.map((g) => g.uuid),
  );
  const script = 'mount --bind "$1" /dev/shm || exit 1; exec "$2" -f';
  const child = spawn(
    'unshare',
    ['--mount', '--propagation', 'slave', '--', '/bin/sh', '-c', script, 'sh', shmDir, o.program],
    { env, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const log = o.log.child({ resource: plan.resource });
  let tail = '';
  const forward = (d: string): void => {
    tail = (tail + d).slice(-2000);
    for (const line of d.split('\n'))
      if (line.trim() !== '') log.debug('nvidia-cuda-mps-control', { line: line.trim() });
  };
  child.stdout.setEncoding('utf8').on('data', forward);
  child.stderr.setEncoding('utf8').on('data', forward);
  const exited = new Promise<ControlExit>((resolve) => {
    child.on('error', (e) => {
      tail += `cannot run unshare: ${e.message}`;
      resolve({ code: null, signal: null });
    });
    child.on('close', (code, signal) => resolve({ code, signal }));
  });
  const handle: ControlChild = {
    pid: child.pid ?? -1,
    exited,
    kill: () => {
      child.kill('SIGTERM');
    },
  };
  let gone = false;
  void exited.then(() => {
    gone = true;
  });
  const end = performance.now() + (o.startTimeoutMs ?? 10000);
  let last = '';
  while (!gone) {
    try {
      await mpsCommand(o.program, paths, 'get_default_active_thread_percentage', { timeoutMs: 2000 });
      return handle;
    } catch (err) {
      last = errorText(err);
    }
    if (performance.now() > end) {
      child.kill('SIGTERM');
      throw new Error(
        `${o.program} -f for ${plan.resource} did not answer within ${o.startTimeoutMs ?? 10000} ms (last: ${last})`,
      );
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const exit = await exited;
  throw new Error(
    `${o.program} -f for ${plan.resource} ` +
      `${exit.signal !== null ? `was killed by ${exit.signal}` : `exited with status ${exit.code}`}` +
      ` before answering${tail.trim() ? `: ${tail.trim().split('\n').slice(-3).join(' / ')}` : ''}`,
  );
}
