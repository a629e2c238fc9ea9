// A Debian 12 container with a real systemd as PID 1, for testing the package as a node would run
// it (the real-systemd tests boot it through packaged-node.ts). What it takes to boot one on a host
// whose PID 1 is not systemd is in boot() below.
//
// The root file system comes from Debian's debootstrap (--variant=minbase plus systemd, dbus and the
// packages asked for), built once per machine into CACHE_DIR and reused: its directory is named by a
// stamp of what it contains, so a changed package list builds a new one. Every boot runs on an
// overlayfs over it, so each run starts from a clean system and leaves the cache untouched.
import { execFile, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { EventEmitter } from 'node:events';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  utimesSync,
  watch,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { onEvent } from '../support/wait.ts';
import type { Trigger } from '../support/wait.ts';

/** Where root file systems are kept between runs (outside the checkout). */
export const CACHE_DIR = process.env.GDP_SYSTEM_TEST_CACHE || '/var/cache/gpu-device-plugin-tests';
/** Debian's mirror; the one in the machine's apt sources serves debootstrap too. */
export const MIRROR = process.env.GDP_DEBIAN_MIRROR || 'http://deb.debian.org/debian';
const SUITE = 'bookworm';
const BASE_PACKAGES = ['systemd', 'systemd-sysv', 'dbus'];
const STAMP_FILE = '.gdp-rootfs-stamp.json';
/**
 * A root with another stamp is deleted once unused this long (a checkout with another package list may
 * still use it).
 */
const UNUSED_MS = 7 * 24 * 3600 * 1000;
const PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Connects to systemd's private bus (argv[1]), authenticates as root, and prints a dot for each message it gets. */
const BUS_LISTENER = `
const bus = require('node:net').createConnection(process.argv[1]);
let open = false;
bus.on('connect', () => bus.write('\\0AUTH EXTERNAL 30\\r\\n'));
bus.on('data', (c) => {
  if (open) process.stdout.write('.');
  else if (c.toString('latin1').startsWith('OK ')) { open = true; bus.write('BEGIN\\r\\n'); }
});
bus.on('close', () => process.exit(0));
bus.on('error', () => process.exit(1));
`;

export interface ExecResult {
  code: number;
  stdout: string;
  stderr: string;
}

function exec(
  cmd: string,
  args: readonly string[],
  opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<ExecResult> {
  return new Promise((resolve) => {
    execFile(
      cmd,
      args,
      {
        encoding: 'utf8',
        maxBuffer: 64 * 1024 * 1024,
        timeout: opts.timeoutMs ?? 120000,
        env: opts.env ?? { PATH, LC_ALL: 'C.UTF-8' },
      },
      (err, stdout, stderr) => {
        const code =
          err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1;
        resolve({ code, stdout, stderr: err !== null && code === -1 ? `${stderr}${err.message}` : stderr });
      },
    );
  });
}

async function must(
  cmd: string,
  args: readonly string[],
  opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<string> {
  const r = await exec(cmd, args, opts);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.code}:\n${r.stderr}${r.stdout}`);
  return r.stdout;
}

/** Package names of a Depends: field (first of alternatives, versions dropped). */
export function dependencyNames(depends: string): string[] {
  return depends
    .split(',')
    .map((d) => (d.split('|')[0] ?? '').trim().split(/[\s(:]/)[0] ?? '')
    .filter((n) => n !== '');
}

export interface Rootfs {
  path: string;
  /** Whether this call ran debootstrap (false: taken from the cache). */
  built: boolean;
  ms: number;
}

/**
 * A minbase Debian 12 root with systemd, dbus and `extra`, from the cache or made now (into a
 * temporary directory, renamed into place when complete). Each use touches its stamp file; roots
 * with other stamps unused for a week are removed.
 */
export async function cachedRootfs(extra: readonly string[]): Promise<Rootfs> {
  const t0 = performance.now();
  const packages = [...new Set([...BASE_PACKAGES, ...extra])].sort();
  const spec = { suite: SUITE, variant: 'minbase', mirror: MIRROR, packages };
  const stamp = createHash('sha256').update(JSON.stringify(spec)).digest('hex').slice(0, 16);
  const name = `${SUITE}-minbase-${stamp}`;
  const path = join(CACHE_DIR, name);
  if (existsSync(join(path, STAMP_FILE))) {
    const now = new Date();
    utimesSync(join(path, STAMP_FILE), now, now);
    return { path, built: false, ms: performance.now() - t0 };
  }

  mkdirSync(CACHE_DIR, { recursive: true });
  const tmp = mkdtempSync(join(CACHE_DIR, '.build-'));
  try {
    const r = await exec('debootstrap', ['--variant=minbase', `--include=${packages.join(',')}`, SUITE, tmp, MIRROR], {
      timeoutMs: 15 * 60000,
    });
    if (r.code !== 0) {
      let log = '';
      try {
        log = readFileSync(join(tmp, 'debootstrap', 'debootstrap.log'), 'utf8')
          .split('\n')
          .slice(-30)
          .join('\n');
      } catch {
        /* none */
      }
      throw new Error(
        `debootstrap of Debian ${SUITE} from ${MIRROR} failed (exit ${r.code}); ` +
          `set GDP_DEBIAN_MIRROR for another mirror:\n${r.stderr.slice(-3000)}\n${log}`,
      );
    }
    writeFileSync(join(tmp, STAMP_FILE), `${JSON.stringify(spec, null, 2)}\n`);
    try {
      renameSync(tmp, path);
    } catch (err) {
      // Another run made the same one meanwhile: use that.
      if (!existsSync(join(path, STAMP_FILE))) throw err;
      rmSync(tmp, { recursive: true, force: true });
    }
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    throw err;
  }
  for (const old of readdirSync(CACHE_DIR)) {
    // A build interrupted a day ago or more.
    if (old.startsWith('.build-') && Date.now() - statSync(join(CACHE_DIR, old)).mtimeMs > 24 * 3600 * 1000)
      rmSync(join(CACHE_DIR, old), { recursive: true, force: true });
    if (!old.startsWith(`${SUITE}-minbase-`) || old === name) continue;
    let lastUse = 0;
    try {
      lastUse = statSync(join(CACHE_DIR, old, STAMP_FILE)).mtimeMs;
    } catch {
      /* incomplete: remove */
    }
    if (Date.now() - lastUse > UNUSED_MS) rmSync(join(CACHE_DIR, old), { recursive: true, force: true });
  }
  return { path, built: true, ms: performance.now() - t0 };
}

export interface BootOptions {
  rootfs: string;
  /** Host directories bound read-only into the container: [host path, path inside]. */
  bindRo?: readonly (readonly [string, string])[];
  /** Files written into the container's root before it boots: path inside → content. */
  files?: Readonly<Record<string, string | Buffer>>;
  /** The machine name (its hostname): unique per boot, so that two runs on one machine never meet. */
  machine: string;
}

export class Container {
  readonly dir: string;
  /** The container's root as the host sees it (the overlay). */
  readonly root: string;
  private readonly nspawn: ChildProcess;
  private readonly nspawnLog: string[] = [];
  private readonly nspawnExit: Promise<number | null>;
  private pid1Value = 0;
  /** Emits 'activity' on each journal entry and each change in /run (where stand-ins keep their state). */
  private readonly activity = new EventEmitter();
  private readonly watchers: { close(): void }[] = [];

  private constructor(dir: string, root: string, nspawn: ChildProcess) {
    this.dir = dir;
    this.root = root;
    this.nspawn = nspawn;
    nspawn.stdout?.on('data', (c: Buffer) => this.nspawnLog.push(c.toString()));
    nspawn.stderr?.on('data', (c: Buffer) => this.nspawnLog.push(c.toString()));
    this.nspawnExit = new Promise((resolve) => nspawn.on('exit', (code) => resolve(code)));
  }

  /** PID of the container's systemd, as the host sees it. */
  get pid1(): number {
    return this.pid1Value;
  }

  /**
   * Boots the root (through a fresh overlay) and waits until its systemd reports `running`.
   * Throws, with nspawn's output, when it does not: the caller's test then fails.
   */
  static async boot(opts: BootOptions): Promise<Container> {
    try {
      return await Container.bootOnce(opts);
    } catch (err) {
      // Two containers booting at once can leave one's early oneshot unit without its cgroup ("Failed to
      // attach to cgroup"): that boot ends "degraded" through no fault of what is tested. A second boot on
      // a fresh overlay is clean; any other failure, or a second degraded boot, stands.
      if (!/the container's systemd is "degraded"/.test((err as Error).message)) throw err;
      return await Container.bootOnce(opts);
    }
  }

  private static async bootOnce(opts: BootOptions): Promise<Container> {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-nspawn-'));
    const upper = join(dir, 'upper');
    const work = join(dir, 'work');
    const root = join(dir, 'root');
    for (const d of [upper, work, root]) mkdirSync(d);
    try {
      await must('mount', [
        '-t',
        'overlay',
        'overlay',
        '-o',
        `lowerdir=${opts.rootfs},upperdir=${upper},workdir=${work}`,
        root,
      ]);
    } catch (err) {
      rmSync(dir, { recursive: true, force: true });
      throw err;
    }
    for (const [inside, content] of Object.entries(opts.files ?? {})) {
      const at = join(root, inside);
      mkdirSync(join(at, '..'), { recursive: true });
      writeFileSync(at, content);
    }
    // --register=no --keep-unit: no host systemd or machined to register with. The unified
    // hierarchy: the host's cgroups are hybrid, and the container's v1 hierarchies would be
    // read-only. bpf() allowed: without it the container's systemd silently skips DeviceAllow= and
    // IPAddressDeny=.
    const args = [
      '-D',
      root,
      '-M',
      opts.machine,
      '-b',
      '--register=no',
      '--keep-unit',
      '--private-network',
      '--console=passive',
      '--system-call-filter=bpf',
      ...(opts.bindRo ?? []).map(([h, c]) => `--bind-ro=${h}:${c}`),
    ];
    const nspawn = spawn('systemd-nspawn', args, {
      env: { PATH, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const c = new Container(dir, root, nspawn);
    try {
      c.pid1Value = await c.findPid1(60000);
      // Until systemd has made its private bus, systemctl cannot connect; until it has made /run/systemd/system
      // (a moment after it is PID 1, longer on a loaded machine), systemctl calls the system "offline": try again.
      const early = (x: { stdout: string; stderr: string }): boolean =>
        /Failed to connect to bus/.test(x.stderr) || x.stdout.trim() === 'offline';
      let r = await c.sh('systemctl is-system-running --wait', { timeoutMs: 120000 });
      for (let i = 0; i < 300 && early(r); i++) {
        await new Promise((res) => setTimeout(res, 100));
        r = await c.sh('systemctl is-system-running --wait', { timeoutMs: 120000 });
      }
      if (r.stdout.trim() !== 'running') {
        const failed = await c.sh(
          'systemctl --failed --no-legend --plain; journalctl -b -p warning -o short --no-pager | tail -40',
        );
        throw new Error(
          `the container's systemd is ${JSON.stringify(r.stdout.trim())}, ` +
            `not running:\n${failed.stdout}${failed.stderr}`,
        );
      }
      c.watchActivity();
    } catch (err) {
      const log = c.nspawnLog.join('');
      await c.teardown();
      throw new Error(
        `cannot boot Debian ${SUITE} with systemd-nspawn: ${(err as Error).message}\n` +
          `systemd-nspawn ${args.join(' ')}:\n${log}`,
        { cause: err },
      );
    }
    return c;
  }

  /**
   * Something happened in the container: a journal entry was written (journalctl -f in it), a file in
   * its /run changed (inotify through /proc/<pid>/root), or a unit's properties changed (its systemd's
   * D-Bus signals). What a test waits on leaves one of these.
   */
  onActivity(): Trigger {
    return onEvent(this.activity, 'activity');
  }

  private watchActivity(): void {
    const poke = (): boolean => this.activity.emit('activity');
    const journal = spawn(
      'nsenter',
      ['-t', String(this.pid1Value), '-a', '--', 'journalctl', '-f', '-n', '0', '-q', '-o', 'cat', '--no-pager'],
      { env: { PATH, LC_ALL: 'C.UTF-8' }, stdio: ['ignore', 'pipe', 'ignore'] },
    );
    journal.stdout.on('data', poke);
    this.watchers.push({ close: () => journal.kill('SIGKILL') });
    const run = watch(`/proc/${this.pid1Value}/root/run`, { persistent: false }, poke);
    run.on('error', poke);
    this.watchers.push(run);
    // A direct connection to systemd's private bus, from a process in the container's PID namespace
    // (systemd drops peers it cannot see): systemd sends every unit's PropertiesChanged to such peers
    // unconditionally, so a change that no journal entry tells of (StatusText) arrives as bytes.
    const bus = spawn(
      'nsenter',
      [
        '-t',
        String(this.pid1Value),
        '-p',
        '--',
        process.execPath,
        '-e',
        BUS_LISTENER,
        `/proc/${this.pid1Value}/root/run/systemd/private`,
      ],
      { env: { PATH }, stdio: ['ignore', 'pipe', 'ignore'] },
    );
    bus.stdout.on('data', poke);
    this.watchers.push({ close: () => bus.kill('SIGKILL') });
  }

  /** The descendant of nspawn that is PID 1 in its own PID namespace. */
  private async findPid1(timeoutMs: number): Promise<number> {
    const end = performance.now() + timeoutMs;
    while (performance.now() < end) {
      const nspawnPid = this.nspawn.pid;
      if (nspawnPid === undefined || this.nspawn.exitCode !== null)
        throw new Error(`systemd-nspawn exited (${String(this.nspawn.exitCode)})`);
      const queue = [nspawnPid];
      while (queue.length > 0) {
        const pid = queue.shift()!;
        let status = '';
        try {
          status = readFileSync(`/proc/${pid}/status`, 'utf8');
        } catch {
          continue;
        }
        const nspid = /^NSpid:\s+(.*)$/m.exec(status)?.[1]?.trim().split(/\s+/) ?? [];
        // PID 1 of the new namespace is nspawn's own child until it executes systemd.
        if (pid !== nspawnPid && nspid.length > 1 && nspid.at(-1) === '1' && /^Name:\s+systemd$/m.test(status))
          return pid;
        try {
          for (const task of readdirSync(`/proc/${pid}/task`)) {
            const kids = readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8').trim();
            if (kids !== '') queue.push(...kids.split(/\s+/).map(Number));
          }
        } catch {
          /* gone */
        }
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`no systemd as PID 1 under systemd-nspawn within ${timeoutMs} ms`);
  }

  /** Runs a shell script in all of the container's namespaces (as its root). */
  sh(script: string, opts: { timeoutMs?: number } = {}): Promise<ExecResult> {
    return exec('nsenter', ['-t', String(this.pid1Value), '-a', '--', '/bin/sh', '-c', script], opts);
  }

  /** Like sh(), but a non-zero exit throws with the script and its output. */
  async run(script: string, opts: { timeoutMs?: number } = {}): Promise<string> {
    const r = await this.sh(script, opts);
    if (r.code !== 0) throw new Error(`in the container, exit ${r.code}: ${script}\n${r.stderr}${r.stdout}`);
    return r.stdout;
  }

  /** Powers the container off, kills nspawn and PID 1 if they linger, unmounts and removes the overlay. */
  async teardown(): Promise<void> {
    for (const w of this.watchers.splice(0)) w.close();
    if (this.pid1Value !== 0 && this.nspawn.exitCode === null) {
      await this.sh('systemctl poweroff --no-block', { timeoutMs: 10000 });
      await Promise.race([this.nspawnExit, new Promise((r) => setTimeout(r, 15000))]);
    }
    for (const pid of [this.nspawn.pid, this.pid1Value]) {
      if (pid === undefined || pid === 0) continue;
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    await Promise.race([this.nspawnExit, new Promise((r) => setTimeout(r, 5000))]);
    for (let i = 0; i < 50; i++) {
      const r = await exec('umount', [this.root]);
      if (r.code === 0 || !readFileSync('/proc/self/mountinfo', 'utf8').includes(` ${this.root} `)) break;
      await new Promise((res) => setTimeout(res, 100));
      if (i === 49) await exec('umount', ['-l', this.root]);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
