// A simulated GPU node for end-to-end tests, the demo and the benchmarks: the fake NVML (built from
// test/fake-nvml) with a topology file, a sysfs fixture with the GPUs' NUMA nodes, the kubelet
// stand-in, and the plugin — by default the built single executable, copied into an empty folder and
// run with no node_modules and no node on its PATH. With `arch: 'arm64'` the plugin is the aarch64
// executable, run by qemu (binfmt_misc) against the cross-built fake NVML; the kubelet stand-in
// stays native.
import { spawn } from 'node:child_process';
import { EventEmitter } from 'node:events';
import type { ChildProcess } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
  openSync,
  writeSync,
  closeSync,
  constants as fsc,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { executablePath } from '../../build/build.ts';
import { AARCH64_SYSROOT } from '../../build/runtime.ts';
import type { Arch } from '../../build/runtime.ts';
import { buildFakeNvml, buildFakeNvmlArm64 } from '../fake-nvml/build.ts';
import { KubeletStandIn } from './kubelet.ts';
import { onEvent, onFileChange, waitFor, waitUntil } from './wait.ts';

export const ROOT = join(import.meta.dirname, '..', '..');
export const TOPOLOGIES = join(ROOT, 'test', 'fixtures', 'topologies');
export const BUILT_EXECUTABLE = executablePath('x64');
/** Where `npm run build` writes each architecture's executable. */
export const BUILT_EXECUTABLES: Readonly<Record<Arch, string>> = {
  x64: BUILT_EXECUTABLE,
  arm64: executablePath('arm64'),
};
/** The aarch64 C library and loader that qemu uses for the arm64 executable (libc6-arm64-cross). */
export { AARCH64_SYSROOT };

const isolated: Partial<Record<Arch, string>> = {};

/** The built executable of `arch`, copied once per test process into an empty folder of its own. */
export function executable(arch: Arch = 'x64'): string {
  let path = isolated[arch];
  if (path === undefined) {
    const built = BUILT_EXECUTABLES[arch];
    if (!existsSync(built)) throw new Error(`${built} is missing; run npm run build first (npm test does)`);
    const dir = mkdtempSync(join(tmpdir(), 'gdp-exe-'));
    path = join(dir, 'gpu-device-plugin');
    copyFileSync(built, path);
    isolated[arch] = path;
    // A copy is the executable's full size (about 115 MiB): gone with the process that made it.
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  }
  return path;
}

/**
 * Environment an executable of `arch` needs on this machine: for arm64, where qemu finds the
 * aarch64 loader and libraries (the host has no /lib/ld-linux-aarch64.so.1).
 */
export function archEnv(arch: Arch): Record<string, string> {
  return arch === 'arm64' ? { QEMU_LD_PREFIX: AARCH64_SYSROOT } : {};
}

export interface TopologyGpu {
  uuid: string;
  name: string;
  minor: number;
  busId: string;
  memoryMiB: number;
  numaNode?: number;
}

export interface Topology {
  gpus: TopologyGpu[];
  [key: string]: unknown;
}

export function loadTopology(name: string): Topology {
  const path = name.includes('/') ? name : join(TOPOLOGIES, `${name}.json`);
  return JSON.parse(readFileSync(path, 'utf8')) as Topology;
}

/** sysfs fixture: bus/pci/devices/<bus id>/numa_node for every GPU of the topology. */
export function writeSysfs(root: string, topo: Topology): void {
  for (const g of topo.gpus) {
    const m = /^([0-9a-fA-F]+):(.*)$/.exec(g.busId);
    const id = m ? `${(m[1] ?? '').slice(-4)}:${m[2] ?? ''}`.toLowerCase() : g.busId.toLowerCase();
    const dir = join(root, 'bus', 'pci', 'devices', id);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'numa_node'), `${g.numaNode ?? -1}\n`);
  }
}

export interface PluginExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/**
 * Milliseconds on the system-wide monotonic clock (libuv's hrtime is CLOCK_MONOTONIC), so that
 * instants taken in different processes on one machine can be compared.
 */
export function monotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** A running plugin process, with its log lines. */
export class PluginProcess extends EventEmitter {
  readonly child: ChildProcess;
  readonly lines: string[] = [];
  /** monotonicMs() just before the process was spawned. */
  readonly spawnedAt: number;
  readonly exited: Promise<PluginExit>;
  exit: PluginExit | undefined;

  /** Emits 'line' for each line it prints and 'exit' when it has exited. */
  constructor(cmd: string, args: readonly string[], env: NodeJS.ProcessEnv) {
    super();
    this.spawnedAt = monotonicMs();
    this.child = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let buf = '';
    const onData = (chunk: Buffer): void => {
      buf += chunk.toString('utf8');
      for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        this.lines.push(line);
        if (process.env.SIM_ECHO) process.stderr.write(`  [plugin] ${line}\n`);
        this.emit('line', line);
      }
    };
    this.child.stdout?.on('data', onData);
    this.child.stderr?.on('data', onData);
    this.exited = new Promise((resolve) => {
      this.child.on('exit', (code, signal) => {
        this.exit = { code, signal };
        resolve(this.exit);
        this.emit('exit', this.exit);
      });
    });
  }

  get pid(): number {
    const p = this.child.pid;
    if (p === undefined) throw new Error('plugin process has no pid');
    return p;
  }

  /** Lines matching re, counting from line index `from`. */
  matching(re: RegExp, from = 0): string[] {
    return this.lines.slice(from).filter((l) => re.test(l));
  }

  /** Resolves with the first line matching re at or after line index `from` (default: any line so far). */
  waitForLine(re: RegExp, timeoutMs = 10000, from = 0): Promise<string> {
    let next = from;
    const log = (): string => `its log:\n${this.lines.join('\n')}`;
    return waitFor(
      () => {
        for (; next < this.lines.length; next++) if (re.test(this.lines[next]!)) return this.lines[next];
        return undefined;
      },
      {
        on: onEvent(this, 'line', 'exit'),
        deadlineMs: timeoutMs,
        what: () => `plugin printed no line matching ${re}; ${log()}`,
        hopeless: () =>
          this.exit === undefined
            ? undefined
            : `plugin exited (${JSON.stringify(this.exit)}) before printing a line matching ${re}; ${log()}`,
      },
    );
  }

  /** Open file descriptors of the process (from /proc). */
  fdCount(): number {
    return readdirSync(`/proc/${this.pid}/fd`).length;
  }

  /** Resident set size in KiB, total and anonymous (from /proc). */
  rss(): { totalKiB: number; anonKiB: number } {
    const status = readFileSync(`/proc/${this.pid}/status`, 'utf8');
    const field = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? NaN);
    return { totalKiB: field('VmRSS'), anonKiB: field('RssAnon') };
  }

  signal(sig: NodeJS.Signals): void {
    this.child.kill(sig);
  }

  async kill(): Promise<void> {
    if (this.exit === undefined) {
      this.child.kill('SIGKILL');
      await this.exited;
    }
  }
}

export interface SimOptions {
  /** Fixture name (test/fixtures/topologies/<name>.json) or path. */
  topology?: string;
  /** Which fake NVML build the plugin finds: current, the old-driver variant, or none at all. */
  nvml?: 'current' | 'old' | 'none';
  /** Start the kubelet stand-in before the plugin (default true). */
  kubelet?: boolean;
  args?: readonly string[];
  env?: Readonly<Record<string, string>>;
  /** Run the TypeScript sources instead of the executable (only for debugging). */
  fromSource?: boolean;
  /** Wait for the first registration (default: when a kubelet is started). */
  waitRegistered?: boolean;
  /** Which built executable runs (default x64); arm64 runs under qemu with the aarch64 fake NVML. */
  arch?: Arch;
  /** Another x64 executable to run instead of the built one (a bench comparing builds), used in place. */
  executable?: string;
  /** The host's DMI product name (sys/class/dmi/id/product_name); absent by default. */
  machine?: string;
  /**
   * Runs once the node's folders exist, just before the plugin starts: for something that stands in
   * for the kubelet on `kubeletDir` from elsewhere (the bench's stand-in in a process of its own);
   * give `kubelet: false` with it.
   */
  beforePlugin?: (node: SimNode) => Promise<void>;
}

/** What the fake NVML writes for its `stats` command. */
export interface FakeNvmlStats {
  total: number;
  calls: Record<string, number>;
  droppedEvents: number;
  computeModes: Record<string, number>;
}

let statsFiles = 0;

/**
 * The fake NVML's stats, asked for with `send` (one command to its control FIFO) and written into
 * `dir`. Commands run in order and the file appears whole (renamed into place), so this is also a
 * barrier: once it resolves, every command sent before has been applied.
 */
export async function fakeNvmlStats(send: (command: string) => void, dir: string): Promise<FakeNvmlStats> {
  const path = join(dir, `stats-${process.pid}-${++statsFiles}.json`);
  send(`stats ${path}`);
  await waitUntil(() => existsSync(path), { on: onFileChange(dir), what: `the fake NVML's stats in ${path}` });
  return JSON.parse(readFileSync(path, 'utf8')) as FakeNvmlStats;
}

/** Writes one command to a fake NVML's control FIFO (see SimNode.nvml). */
export function nvmlCommand(control: string, command: string): void {
  // Nobody reads the FIFO for a moment while the plugin re-opens NVML (ENXIO): try again briefly.
  let fd: number | undefined;
  for (let tries = 0; fd === undefined; tries++) {
    try {
      fd = openSync(control, fsc.O_WRONLY | fsc.O_NONBLOCK);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENXIO' || tries >= 300) throw err;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
    }
  }
  try {
    writeSync(fd, `${command}\n`);
  } finally {
    closeSync(fd);
  }
}

export class SimNode {
  readonly dir: string;
  readonly kubeletDir: string;
  readonly sysfs: string;
  readonly control: string;
  readonly configPath: string;
  readonly topology: Topology;
  kubelet: KubeletStandIn | undefined;
  plugin!: PluginProcess;

  private constructor(dir: string, topology: Topology, configPath: string) {
    this.dir = dir;
    this.kubeletDir = join(dir, 'device-plugins');
    this.sysfs = join(dir, 'sys');
    this.control = join(dir, 'nvml-control');
    this.configPath = configPath;
    this.topology = topology;
  }

  get kubeletSocket(): string {
    return join(this.kubeletDir, 'kubelet.sock');
  }

  /** The state file the daemon publishes for `info`. */
  get stateFile(): string {
    return join(this.dir, 'state.json');
  }

  get pluginSocket(): string {
    return join(this.kubeletDir, 'gpu-device-plugin-gpu.sock');
  }

  static async start(opts: SimOptions = {}): Promise<SimNode> {
    const arch = opts.arch ?? 'x64';
    if (arch !== 'x64' && opts.nvml === 'old') throw new Error('the old-driver fake NVML is built for x64 only');
    const libs = arch === 'arm64' ? { current: await buildFakeNvmlArm64(), old: '' } : await buildFakeNvml();
    const dir = mkdtempSync(join(tmpdir(), 'gdp-sim-'));
    const name = opts.topology ?? 'demo-8';
    const topology = loadTopology(name);
    const configPath = name.includes('/') ? name : join(TOPOLOGIES, `${name}.json`);
    const node = new SimNode(dir, topology, configPath);
    mkdirSync(node.kubeletDir, { recursive: true });
    writeSysfs(node.sysfs, topology);
    if (opts.machine !== undefined) {
      mkdirSync(join(node.sysfs, 'class', 'dmi', 'id'), { recursive: true });
      writeFileSync(join(node.sysfs, 'class', 'dmi', 'id', 'product_name'), `${opts.machine}\n`);
    }
    if (opts.kubelet ?? true) node.kubelet = await KubeletStandIn.start(node.kubeletDir);
    await opts.beforePlugin?.(node);
    const nvmlDir = opts.nvml === 'old' ? libs.old : opts.nvml === 'none' ? join(dir, 'no-nvml') : libs.current;
    const env: NodeJS.ProcessEnv = {
      PATH: '/nonexistent',
      LD_LIBRARY_PATH: nvmlDir,
      FAKE_NVML_CONFIG: configPath,
      FAKE_NVML_CONTROL: node.control,
      SYSFS_ROOT: node.sysfs,
      TMPDIR: dir,
      // Each simulated node's daemon publishes its state for `info` in its own directory.
      GPU_DEVICE_PLUGIN_STATE_FILE: node.stateFile,
      ...archEnv(arch),
      ...opts.env,
    };
    const args = ['--kubelet-socket', node.kubeletSocket, ...(opts.args ?? [])];
    node.plugin = opts.fromSource
      ? new PluginProcess(join(ROOT, 'node_modules', '.bin', 'node'), [join(ROOT, 'src', 'entry.ts'), ...args], env)
      : new PluginProcess(opts.executable ?? executable(arch), args, env);
    if ((opts.waitRegistered ?? node.kubelet !== undefined) && node.kubelet !== undefined) {
      try {
        // Emulation is 10–20× slower: a liveness bound only, generous for qemu.
        await node.kubelet.waitForRegistrations(1, arch === 'x64' ? 15000 : 120000);
      } catch (err) {
        await node.stop();
        throw new Error(`${(err as Error).message}\nplugin log:\n${node.plugin.lines.join('\n')}`);
      }
    }
    return node;
  }

  /** Sends one command to the fake NVML's control FIFO (xid, dbe, lost, back, stats …). */
  nvml(command: string): void {
    nvmlCommand(this.control, command);
  }

  /** NVML call counts, as the fake library reports them. */
  nvmlStats(): Promise<FakeNvmlStats> {
    return fakeNvmlStats((command) => this.nvml(command), this.dir);
  }

  async stop(): Promise<void> {
    await this.plugin.kill();
    await this.kubelet?.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** rm -rf that retries while the plugin re-creates its socket in the directory being deleted. */
export function removeDirRetrying(dir: string): void {
  for (let i = 0; ; i++) {
    try {
      rmSync(dir, { recursive: true, force: true });
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOTEMPTY' || i > 1000) throw err;
    }
  }
}
