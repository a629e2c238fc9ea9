// The .deb and the .rpm, built once here from the executable `npm run build` made: their contents,
// the maintainer scripts run by the real dpkg and rpm in throwaway roots (with recording stand-ins
// for deb-systemd-helper, deb-systemd-invoke and systemctl), lintian, the systemd unit
// (systemd-analyze verify and security), size, and that two builds give the same .deb. The arm64
// .deb and .rpm (from dist/arm64/gpu-device-plugin) get their architecture fields, dependencies,
// contents, lintian, rpm -K and the same maintainer-script runs; they are built with gzip -1 here
// (compression 'fast'), because xz on a second 115 MB executable would add minutes and changes none
// of those.
//
// Needs root (dpkg and rpm chroot into the throwaway roots to run the scripts) and the tools
// build/install-tools.sh installs; without them the tests fail, they never skip.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  appendFileSync,
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { buildExecutable, executablePath } from '../../build/build.ts';
import { PACKAGE_ARCH } from '../../build/runtime.ts';
import type { Arch } from '../../build/runtime.ts';
import { PACKAGE_SETTINGS, environmentFile } from '../../build/docs.ts';
import {
  BINARY_PATH,
  DOC_DIR,
  DRA_DOCS,
  DRA_DROPIN,
  ENV_FILE,
  EXAMPLE_CONFIG,
  MAN_PATH,
  MAX_PACKAGE_BYTES,
  MPS_UNIT_PATH,
  PACKAGE,
  README,
  UNIT_PATH,
  buildDeb,
  buildRpm,
  debFileName,
  packageVersion,
  projectVersion,
  rpmFileName,
  sourceDateEpoch,
} from '../../build/package.ts';
import { OPTION_SPECS } from '../../src/config/option-table.ts';
import { parseUnitSandbox, writableInSandbox } from '../../src/cli/sandbox.ts';
import { networkInSandbox } from '../../src/cli/sandbox-network.ts';

const execFileAsync = promisify(execFile);
const VERSION = projectVersion();
const OLD_VERSION = '0.0.1';
const UNIT = 'gpu-device-plugin.service';
const MPS_UNIT = 'gpu-device-plugin-mps.service';
const TOOLS = [
  'dpkg',
  'dpkg-deb',
  'dpkg-shlibdeps',
  'rpm',
  'rpmbuild',
  'lintian',
  'man',
  'systemd-analyze',
  'gzip',
  'setpriv',
];
const PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

let work: string;
let exe: string;
let exeSha: string;
let deb: string;
let rpm: string;
let oldDeb: string;
let oldRpm: string;
let oldRpmAgain: string;
let extracted: string;
let secondDeb: Promise<string>;
let lintian: Promise<{ status: number; out: string }>;

/** One architecture's packages, the executable they carry, and the older ones to upgrade from. */
interface Packages {
  arch: Arch;
  exeSha: string;
  deb: string;
  rpm: string;
  oldDeb: string;
  oldRpm: string;
}
let x64: Packages;
let arm64: Packages;
let arm64Lintian: Promise<{ status: number; out: string }>;

function sha256(path: string): string {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

function sh(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv; input?: string } = {}): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, ...opts });
  if (r.error) throw r.error;
  assert.equal(r.status, 0, `${cmd} ${args.join(' ')} exited ${String(r.status)}:\n${r.stderr}${r.stdout}`);
  return r.stdout;
}

/** Keeps a promise's rejection for whoever awaits it later, without an unhandled-rejection crash. */
function later<T>(p: Promise<T>): Promise<T> {
  p.catch(() => undefined);
  return p;
}

function onPath(tool: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' }).status === 0;
}

before(async () => {
  const missing = TOOLS.filter((t) => !onPath(t));
  assert.deepEqual(missing, [], `missing tools: ${missing.join(', ')}; run build/install-tools.sh`);
  assert.equal(process.getuid?.(), 0, 'these tests run dpkg and rpm on throwaway roots, which needs root');

  work = mkdtempSync(join(tmpdir(), 'gdp-packaging-'));
  // Private copies of the executables: dist/ may be rebuilt while these tests run.
  const copyOf = async (arch: Arch): Promise<string> => {
    const built = executablePath(arch);
    if (!existsSync(built)) await buildExecutable(undefined, arch);
    const copy = join(work, `exe-${arch}`, PACKAGE);
    mkdirSync(dirname(copy));
    copyFileSync(built, copy);
    chmodSync(copy, 0o755);
    return copy;
  };
  exe = await copyOf('x64');
  exeSha = sha256(exe);
  const armExe = await copyOf('arm64');

  const epoch = sourceDateEpoch();
  const common = { executable: exe, sourceDateEpoch: epoch };
  // The arm64 packages, quickly compressed (see the top), built while the x64 ones compress.
  const armCommon = { arch: 'arm64', executable: armExe, sourceDateEpoch: epoch } as const;
  const armBuilt = later(
    Promise.all([
      buildDeb({ ...armCommon, outDir: join(work, 'arm64'), compression: 'fast' }),
      buildRpm({ ...armCommon, outDir: join(work, 'arm64'), compression: 'fast' }),
      buildDeb({ ...armCommon, outDir: join(work, 'arm64-old'), version: OLD_VERSION, compression: 'none' }),
      buildRpm({ ...armCommon, outDir: join(work, 'arm64-old'), version: OLD_VERSION, compression: 'none' }),
    ]),
  );
  // The release packages, and older uncompressed builds to upgrade from.
  [deb, rpm] = await Promise.all([
    buildDeb({ ...common, outDir: join(work, 'a') }),
    buildRpm({ ...common, outDir: join(work, 'a') }),
  ]);
  [oldDeb, oldRpm, oldRpmAgain] = await Promise.all([
    buildDeb({ ...common, outDir: join(work, 'old'), version: OLD_VERSION, compression: 'none' }),
    buildRpm({ ...common, outDir: join(work, 'old'), version: OLD_VERSION, compression: 'none' }),
    buildRpm({ ...common, outDir: join(work, 'old-again'), version: OLD_VERSION, compression: 'none' }),
  ]);
  // Running while the tests below go on: the second build of the .deb, and lintian (as an
  // unprivileged user, as lintian wants; the package is made readable for it).
  secondDeb = later(buildDeb({ ...common, outDir: join(work, 'b') }));
  const lintDir = join(work, 'lint');
  mkdirSync(lintDir, { mode: 0o755 });
  chmodSync(work, 0o755);
  const lintDeb = join(lintDir, 'package.deb');
  copyFileSync(deb, lintDeb);
  chmodSync(lintDeb, 0o644);
  const runLintian = (pkg: string): Promise<{ status: number; out: string }> =>
    later(
      execFileAsync(
        'setpriv',
        ['--reuid=65534', '--regid=65534', '--clear-groups', '--', 'lintian', '--pedantic', pkg],
        {
          env: { PATH, HOME: lintDir, LC_ALL: 'C.UTF-8' },
          encoding: 'utf8',
          maxBuffer: 16 * 1024 * 1024,
        },
      ).then(
        ({ stdout, stderr }) => ({ status: 0, out: stdout + stderr }),
        (err: { code?: number; stdout?: string; stderr?: string }) => ({
          status: err.code ?? -1,
          out: `${err.stdout ?? ''}${err.stderr ?? ''}`,
        }),
      ),
    );
  lintian = runLintian(lintDeb);

  extracted = join(work, 'x');
  sh('dpkg-deb', ['-x', deb, extracted]);
  x64 = { arch: 'x64', exeSha, deb, rpm, oldDeb, oldRpm };

  const [armDeb, armRpm, armOldDeb, armOldRpm] = await armBuilt;
  arm64 = { arch: 'arm64', exeSha: sha256(armExe), deb: armDeb, rpm: armRpm, oldDeb: armOldDeb, oldRpm: armOldRpm };
  const armLintDeb = join(lintDir, 'package-arm64.deb');
  copyFileSync(armDeb, armLintDeb);
  chmodSync(armLintDeb, 0o644);
  // After the x64 run, not beside it: lintian is heavy, and the machine is shared.
  arm64Lintian = later(lintian.then(() => runLintian(armLintDeb)));
});

after(async () => {
  await Promise.allSettled([secondDeb, lintian, arm64Lintian]);
  if (work) rmSync(work, { recursive: true, force: true });
});

// ---------------------------------------------------------------------------------------------
// Throwaway roots: a shell, rm, /dev/null, and stand-ins that record how they are called.

interface Chroot {
  root: string;
  calls(): string[];
  clear(): void;
}

function copyWithLibs(tool: string, root: string, as: string): void {
  const target = join(root, as);
  mkdirSync(dirname(target), { recursive: true });
  copyFileSync(realpathSync(tool), target);
  chmodSync(target, 0o755);
  for (const line of execFileSync('ldd', [tool], { encoding: 'utf8' }).split('\n')) {
    const m = /(?:=>\s*)?(\/\S+)\s+\(0x/.exec(line);
    if (!m?.[1]) continue;
    const lib = join(root, m[1]);
    if (existsSync(lib)) continue;
    mkdirSync(dirname(lib), { recursive: true });
    copyFileSync(realpathSync(m[1]), lib);
  }
}

function makeChroot(name: string): Chroot {
  const root = join(work, name);
  for (const d of ['bin', 'usr/bin', 'dev', 'tmp', 'var/tmp', 'var/log', 'run/systemd/system', 'etc'])
    mkdirSync(join(root, d), { recursive: true });
  copyWithLibs(execFileSync('sh', ['-c', 'command -v sh'], { encoding: 'utf8' }).trim(), root, '/bin/sh');
  for (const tool of ['rm', 'mkdir'])
    copyWithLibs(
      execFileSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).trim(),
      root,
      `/usr/bin/${tool}`,
    );
  // The scripts send output to /dev/null; a plain file does for that.
  writeFileSync(join(root, 'dev', 'null'), '');
  chmodSync(join(root, 'dev', 'null'), 0o666);
  for (const stub of ['deb-systemd-helper', 'deb-systemd-invoke', 'systemctl']) {
    const p = join(root, 'usr', 'bin', stub);
    writeFileSync(p, `#!/bin/sh\necho "${stub} $*" >> /stub-calls\nexit 0\n`);
    chmodSync(p, 0o755);
  }
  const log = join(root, 'stub-calls');
  return {
    root,
    calls: () =>
      existsSync(log)
        ? readFileSync(log, 'utf8')
            .split('\n')
            .filter((l) => l !== '')
        : [],
    clear: () => rmSync(log, { force: true }),
  };
}

function mode(path: string): string {
  return (statSync(path).mode & 0o7777).toString(8).padStart(4, '0');
}

// ---------------------------------------------------------------------------------------------

async function lintianSilent(run: Promise<{ status: number; out: string }>): Promise<void> {
  const { status, out } = await run;
  assert.equal(out, '');
  assert.equal(status, 0);
}

/** dpkg on a throwaway root: install, upgrade keeping the operator's edits, remove keeping them, reinstall, purge. */
function dpkgLifecycle(p: Packages): void {
  const { deb, oldDeb, exeSha } = p;
  const c = makeChroot(`dpkg-root-${p.arch}`);
  const admin = join(c.root, 'var', 'lib', 'dpkg');
  for (const d of ['info', 'updates', 'triggers']) mkdirSync(join(admin, d), { recursive: true });
  writeFileSync(join(admin, 'status'), '');
  writeFileSync(join(admin, 'available'), '');
  // The real dpkg, acting on the throwaway root; it chroots there to run the maintainer scripts.
  const dpkg = (...args: string[]): string =>
    sh('dpkg', [`--root=${c.root}`, `--log=${join(c.root, 'var', 'log', 'dpkg.log')}`, '--force-depends', ...args], {
      env: { PATH, LC_ALL: 'C.UTF-8' },
    });
  const status = (): string =>
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format fields
    sh('dpkg-query', [`--admindir=${admin}`, '-W', '-f=${db:Status-Abbrev}${Version}', PACKAGE]).trim();
  // A foreign architecture's package installs once dpkg knows the architecture.
  if (p.arch !== 'x64') dpkg('--add-architecture', PACKAGE_ARCH[p.arch].deb);
  const envFile = join(c.root, ENV_FILE.deb);
  const at = (p: string): string => join(c.root, p);
  const svc = (cmd: string): string => `${cmd} ${UNIT}`;
  const mps = (cmd: string): string => `${cmd} ${MPS_UNIT}`;
  // The MPS unit: unmasked and known to deb-systemd-helper; never started, restarted or
  // try-restarted by the scripts (the plugin's Wants= starts it; an upgrade must not restart it).
  const mpsConfigure = [mps('deb-systemd-helper unmask'), mps('deb-systemd-helper update-state')];

  // First installation (of an older build): enabled and started.
  dpkg('-i', oldDeb);
  assert.equal(status(), `ii ${OLD_VERSION}`);
  assert.deepEqual(c.calls(), [
    svc('deb-systemd-helper unmask'),
    ...mpsConfigure,
    svc('deb-systemd-helper --quiet was-enabled'),
    svc('deb-systemd-helper enable'),
    'systemctl --system daemon-reload',
    svc('deb-systemd-invoke start'),
  ]);

  // The operator sets an option; the service has extracted its native module into its state directory.
  appendFileSync(envFile, 'LOG_LEVEL=debug\n');
  const edited = readFileSync(envFile, 'utf8');
  mkdirSync(at('/var/lib/gpu-device-plugin/gpu-device-plugin-x'), { recursive: true });
  writeFileSync(at('/var/lib/gpu-device-plugin/gpu-device-plugin-x/koffi.node'), '');

  // Upgrade: no stop before unpacking, then try-restart (only a running service is restarted).
  // The MPS unit is neither stopped nor restarted: its clients' CUDA contexts would die with it.
  c.clear();
  dpkg('-i', deb);
  assert.equal(status(), `ii ${packageVersion(VERSION)}`);
  assert.deepEqual(c.calls(), [
    svc('deb-systemd-helper unmask'),
    ...mpsConfigure,
    svc('deb-systemd-helper --quiet was-enabled'),
    svc('deb-systemd-helper enable'),
    'systemctl --system daemon-reload',
    svc('deb-systemd-invoke try-restart'),
  ]);
  assert.deepEqual(
    c.calls().filter((call) => call.endsWith(MPS_UNIT) && /invoke|systemctl/.test(call)),
    [],
    'nothing stops or restarts the MPS unit on upgrade',
  );
  assert.equal(mode(at(MPS_UNIT_PATH)), '0644');
  assert.equal(readFileSync(envFile, 'utf8'), edited, 'the edited environment file is kept');
  for (const leftover of ['.dpkg-dist', '.dpkg-new', '.dpkg-old']) assert.ok(!existsSync(envFile + leftover), leftover);
  assert.equal(sha256(at(BINARY_PATH)), exeSha);
  assert.equal(mode(at(BINARY_PATH)), '0755');
  // The operator's documentation is installed.
  assert.equal(
    execFileSync('gzip', ['-dc', at(README.deb)], { encoding: 'utf8' }),
    readFileSync(README.source, 'utf8'),
  );
  assert.equal(readFileSync(at(EXAMPLE_CONFIG.installed), 'utf8'), readFileSync(EXAMPLE_CONFIG.source, 'utf8'));
  assert.equal(mode(at(EXAMPLE_CONFIG.installed)), '0644');
  for (const f of [...DRA_DOCS.sources, DRA_DROPIN])
    assert.equal(readFileSync(at(f.installed), 'utf8'), readFileSync(f.source, 'utf8'), f.installed);
  assert.equal(mode(at(UNIT_PATH)), '0644');
  assert.equal(mode(envFile), '0644');
  assert.equal(readFileSync(join(admin, 'info', `${PACKAGE}.conffiles`), 'utf8'), `${ENV_FILE.deb}\n`);
  assert.match(
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format field
    sh('dpkg-query', [`--admindir=${admin}`, '-W', '-f=${Conffiles}', PACKAGE]),
    new RegExp(`^ ${ENV_FILE.deb} [0-9a-f]{32}$`, 'm'),
  );

  // Removal: stopped, unit masked (enablement remembered for a reinstallation), configuration kept.
  c.clear();
  dpkg('-r', PACKAGE);
  assert.equal(status(), `rc ${packageVersion(VERSION)}`);
  assert.deepEqual(c.calls(), [
    svc('deb-systemd-invoke stop'),
    mps('deb-systemd-invoke stop'),
    'systemctl --system daemon-reload',
    svc('deb-systemd-helper mask'),
    mps('deb-systemd-helper mask'),
  ]);
  assert.ok(!existsSync(at(BINARY_PATH)));
  assert.ok(!existsSync(at(UNIT_PATH)));
  assert.ok(!existsSync(at(MPS_UNIT_PATH)));
  assert.ok(!existsSync(at(README.deb)), 'removal removes the documentation');
  assert.equal(readFileSync(envFile, 'utf8'), edited, 'removal keeps the configuration');

  // Reinstallation after removal: started again (not only try-restarted), configuration as left.
  c.clear();
  dpkg('-i', deb);
  assert.deepEqual(c.calls(), [
    svc('deb-systemd-helper unmask'),
    ...mpsConfigure,
    svc('deb-systemd-helper --quiet was-enabled'),
    svc('deb-systemd-helper enable'),
    'systemctl --system daemon-reload',
    svc('deb-systemd-invoke start'),
  ]);
  assert.equal(readFileSync(envFile, 'utf8'), edited);
  assert.ok(!existsSync(at('/var/lib/gpu-device-plugin/package-removed')));
  c.clear();
  dpkg('-r', PACKAGE);
  assert.deepEqual(c.calls(), [
    svc('deb-systemd-invoke stop'),
    mps('deb-systemd-invoke stop'),
    'systemctl --system daemon-reload',
    svc('deb-systemd-helper mask'),
    mps('deb-systemd-helper mask'),
  ]);

  // Purge: enablement forgotten, configuration and state gone.
  c.clear();
  dpkg('-P', PACKAGE);
  assert.deepEqual(c.calls(), [
    svc('deb-systemd-helper purge'),
    svc('deb-systemd-helper unmask'),
    mps('deb-systemd-helper purge'),
    mps('deb-systemd-helper unmask'),
  ]);
  assert.ok(!existsSync(envFile), 'purge removes the environment file');
  assert.ok(!existsSync(at('/var/lib/gpu-device-plugin')), 'purge removes the state directory');
  assert.equal(spawnSync('dpkg-query', [`--admindir=${admin}`, '-W', PACKAGE], { stdio: 'ignore' }).status, 1);
}

/** rpm on a throwaway root: install, upgrade keeping the operator's edits (executable not stripped), erase. */
function rpmLifecycle(p: Packages): void {
  const { rpm, oldRpm, exeSha } = p;
  const c = makeChroot(`rpm-root-${p.arch}`);
  // Debian's rpm wants --force-debian to install packages without a warning.
  // A foreign architecture's package needs --ignorearch on this machine.
  const foreign = p.arch === 'x64' ? [] : ['--ignorearch'];
  const rpmIn = (...args: string[]): string =>
    sh('rpm', [`--root=${c.root}`, '--dbpath=/var/lib/rpm', ...args], { env: { PATH, LC_ALL: 'C.UTF-8' } });
  rpmIn('--initdb');
  const envFile = join(c.root, ENV_FILE.rpm);
  const svc = (cmd: string): string => `${cmd} ${UNIT}`;

  rpmIn('-i', '--force-debian', '--nodeps', ...foreign, oldRpm);
  assert.deepEqual(c.calls(), [
    svc('systemctl --no-reload preset'),
    'systemctl daemon-reload',
    svc('systemctl --quiet is-enabled'),
    svc('systemctl start'),
  ]);
  appendFileSync(envFile, 'LOG_LEVEL=debug\n');
  const edited = readFileSync(envFile, 'utf8');
  mkdirSync(join(c.root, 'var/lib/gpu-device-plugin'), { recursive: true });

  c.clear();
  rpmIn('-U', '--force-debian', '--nodeps', ...foreign, rpm);
  assert.equal(rpmIn('-q', '--qf', '%{VERSION}', PACKAGE), packageVersion(VERSION));
  // Only the plugin is try-restarted: the MPS unit is left running on the old executable.
  assert.deepEqual(c.calls(), ['systemctl daemon-reload', svc('systemctl try-restart')]);
  assert.equal(readFileSync(envFile, 'utf8'), edited, 'the edited environment file is kept');
  assert.ok(!existsSync(`${envFile}.rpmnew`));
  assert.equal(
    sha256(join(c.root, BINARY_PATH)),
    exeSha,
    'the installed executable is the build, not stripped by rpmbuild',
  );
  // The operator's documentation is installed (%doc; rpm --excludedocs would leave it out).
  assert.equal(readFileSync(join(c.root, README.rpm), 'utf8'), readFileSync(README.source, 'utf8'));
  assert.equal(
    readFileSync(join(c.root, EXAMPLE_CONFIG.installed), 'utf8'),
    readFileSync(EXAMPLE_CONFIG.source, 'utf8'),
  );
  for (const f of [...DRA_DOCS.sources, DRA_DROPIN])
    assert.equal(readFileSync(join(c.root, f.installed), 'utf8'), readFileSync(f.source, 'utf8'), f.installed);

  c.clear();
  rpmIn('-e', '--force-debian', '--nodeps', PACKAGE);
  assert.deepEqual(c.calls(), [
    svc('systemctl --no-reload disable --now'),
    `systemctl --no-reload disable --now ${MPS_UNIT}`,
    'systemctl daemon-reload',
  ]);
  assert.ok(!existsSync(join(c.root, BINARY_PATH)));
  assert.ok(!existsSync(join(c.root, DOC_DIR)), 'erase removes the documentation');
  assert.equal(readFileSync(`${envFile}.rpmsave`, 'utf8'), edited, 'erase keeps the edited configuration as .rpmsave');
  assert.ok(!existsSync(join(c.root, 'var/lib/gpu-device-plugin')));
}

describe('the .deb', () => {
  test('control fields: version, architecture, library dependencies (no nodejs, driver only suggested)', () => {
    const field = (name: string): string => sh('dpkg-deb', ['-f', deb, name]).trim();
    assert.equal(field('Package'), PACKAGE);
    assert.equal(field('Version'), packageVersion(VERSION));
    assert.equal(field('Architecture'), 'amd64');
    const depends = field('Depends');
    for (const lib of ['libc6', 'libstdc++6', 'libgcc-s1'])
      assert.match(depends, new RegExp(`(^|, )${lib.replace(/\+/g, '\\+')} \\(>= `), `Depends: ${depends}`);
    assert.doesNotMatch(depends, /node|nvidia/i);
    assert.match(field('Suggests'), /libnvidia-ml1/);
    assert.equal(field('Recommends'), '');
    assert.ok(Number(field('Installed-Size')) > 100_000);
  });

  test('contents: paths, modes, root ownership; the environment file is the only conffile', () => {
    const listing = sh('dpkg-deb', ['-c', deb]);
    const entries = new Map<string, { perms: string; owner: string }>();
    for (const line of listing.trim().split('\n')) {
      const [perms = '', owner = '', , , , path = ''] = line.split(/\s+/);
      entries.set(path.replace(/^\./, ''), { perms, owner });
    }
    const expect: Record<string, string> = {
      [BINARY_PATH]: '-rwxr-xr-x',
      [UNIT_PATH]: '-rw-r--r--',
      [MPS_UNIT_PATH]: '-rw-r--r--',
      [ENV_FILE.deb]: '-rw-r--r--',
      [MAN_PATH]: '-rw-r--r--',
      [`/usr/share/doc/${PACKAGE}/copyright`]: '-rw-r--r--',
      [`/usr/share/doc/${PACKAGE}/changelog.gz`]: '-rw-r--r--',
      [README.deb]: '-rw-r--r--',
      [EXAMPLE_CONFIG.installed]: '-rw-r--r--',
      ...Object.fromEntries([...DRA_DOCS.sources, DRA_DROPIN].map((f) => [f.installed, '-rw-r--r--'])),
      [`/usr/share/lintian/overrides/${PACKAGE}`]: '-rw-r--r--',
    };
    for (const [path, perms] of Object.entries(expect)) {
      assert.equal(entries.get(path)?.perms, perms, `${path} in\n${listing}`);
    }
    for (const [path, e] of entries) {
      assert.equal(e.owner, 'root/root', path);
      if (e.perms.startsWith('d')) assert.equal(e.perms, 'drwxr-xr-x', path);
    }
    assert.equal(sh('dpkg-deb', ['-I', deb, 'conffiles']), `${ENV_FILE.deb}\n`);
    for (const script of ['postinst', 'prerm', 'postrm']) {
      const text = sh('dpkg-deb', ['-I', deb, script]);
      assert.match(text, /^#!\/bin\/sh\n/);
      sh('sh', ['-n'], { input: text });
    }
  });

  test('the packaged executable is byte-identical to the build (not stripped) and runs', () => {
    const packaged = join(extracted, BINARY_PATH);
    assert.equal(sha256(packaged), exeSha);
    assert.equal(mode(packaged), '0755');
    const v = spawnSync(packaged, ['--version'], { encoding: 'utf8', env: { PATH: '/nonexistent' } });
    assert.equal(v.status, 0, v.stderr);
    assert.match(v.stdout, new RegExp(`^gpu-device-plugin ${VERSION.replace(/\./g, '\\.')} `));
  });

  test(
    'the environment file lists every option with its default, range and one line of ' +
      'help, commented out but for the driver wait and the MPS root the service needs',
    () => {
      const text = readFileSync(join(extracted, ENV_FILE.deb), 'utf8');
      assert.equal(text, environmentFile(ENV_FILE.deb));
      const lines = text.split('\n');
      for (const spec of OPTION_SPECS) {
        const set = PACKAGE_SETTINGS[spec.key];
        const at = lines.indexOf(set === undefined ? `#${spec.env}=${spec.default ?? ''}` : `${spec.env}=${set.value}`);
        assert.ok(at > 0, `${spec.env} listed`);
        assert.ok(
          lines.slice(Math.max(0, at - 3), at).some((l) => l.startsWith(`# --${spec.flag} `) && l.includes(spec.help)),
          `${spec.env} has its help`,
        );
        const k = spec.kind;
        if (k.type === 'seconds')
          assert.ok(
            lines
              .slice(Math.max(0, at - 3), at)
              .some((l) => l.startsWith(`# --${spec.flag} (duration, from ${k.min} to ${k.max} seconds`)),
            `${spec.env} has its range`,
          );
      }
      // Only what the service needs is set (the driver wait, and the root of the MPS unit's daemons):
      // every other assignment is commented out.
      assert.deepEqual(
        lines.filter((l) => l !== '' && !l.startsWith('#')),
        ['FAIL_ON_INIT_ERROR=false', 'MPS_ROOT=/run/nvidia/mps'],
      );
    },
  );

  test(
    'the operator documentation: README.md (gzipped, as Debian ' +
      'policy asks above 4 KiB) and the example config in /usr/share/doc',
    () => {
      assert.equal(
        execFileSync('gzip', ['-dc', join(extracted, README.deb)], { encoding: 'utf8' }),
        readFileSync(README.source, 'utf8'),
      );
      assert.ok(statSync(README.source).size > 4096, 'README.md is over 4 KiB, so it is compressed');
      assert.ok(!existsSync(join(extracted, README.rpm)), 'README.md only once, compressed');
      const example = join(extracted, EXAMPLE_CONFIG.installed);
      assert.equal(readFileSync(example, 'utf8'), readFileSync(EXAMPLE_CONFIG.source, 'utf8'));
      assert.ok(statSync(example).size <= 4096, 'the example stays uncompressed, ready to copy');
      assert.match(readFileSync(example, 'utf8'), /^version: v1$/m);
    },
  );

  test('the man page documents every option and its variable', () => {
    const page = execFileSync('gzip', ['-dc', join(extracted, MAN_PATH)], { encoding: 'utf8' });
    assert.match(page, /^\.TH GPU\\-DEVICE\\-PLUGIN 8 /m);
    for (const spec of OPTION_SPECS) {
      assert.ok(page.includes(`\\-\\-${spec.flag.replace(/-/g, '\\-')}`), `--${spec.flag}`);
      assert.ok(page.includes(spec.env.replace(/-/g, '\\-')), spec.env);
      if (spec.kind.type === 'seconds')
        assert.ok(
          page.includes(`duration, from ${spec.kind.min} to ${spec.kind.max} seconds`),
          `--${spec.flag} has its range`,
        );
    }
    const r = spawnSync('man', ['--warnings', '-E', 'UTF-8', '-l', '-Tutf8', '-Z', join(extracted, MAN_PATH)], {
      encoding: 'utf8',
      env: { PATH, LC_ALL: 'C.UTF-8' },
    });
    assert.equal(r.status, 0);
    assert.equal(r.stderr, '');
  });

  test(
    "dpkg: install, upgrade keeping the operator's edits, " + 'remove keeping them, reinstall, purge removing them',
    () => {
      dpkgLifecycle(x64);
    },
  );

  test('lintian --pedantic prints nothing', () => lintianSilent(lintian));
});

describe('the .rpm', () => {
  const q = (...args: string[]): string => sh('rpm', ['-qp', ...args, rpm], { env: { PATH, LC_ALL: 'C.UTF-8' } });

  test('digests check out (rpm -K)', () => {
    assert.match(sh('rpm', ['-K', rpm]), /digests OK/);
  });

  test('file list with modes and owners; the environment file is %config(noreplace)', () => {
    const files = new Map<string, string>();
    for (const line of q('-lv').trim().split('\n')) {
      const parts = line.split(/\s+/);
      files.set(parts[parts.length - 1] ?? '', `${parts[0] ?? ''} ${parts[2] ?? ''}/${parts[3] ?? ''}`);
    }
    assert.deepEqual(Object.fromEntries(files), {
      [ENV_FILE.rpm]: '-rw-r--r-- root/root',
      [BINARY_PATH]: '-rwxr-xr-x root/root',
      '/usr/lib/systemd/system-preset/80-gpu-device-plugin.preset': '-rw-r--r-- root/root',
      [UNIT_PATH]: '-rw-r--r-- root/root',
      [MPS_UNIT_PATH]: '-rw-r--r-- root/root',
      [`/usr/share/licenses/${PACKAGE}`]: 'drwxr-xr-x root/root',
      [`/usr/share/licenses/${PACKAGE}/copyright`]: '-rw-r--r-- root/root',
      [MAN_PATH]: '-rw-r--r-- root/root',
      [DOC_DIR]: 'drwxr-xr-x root/root',
      [`${DOC_DIR}/examples`]: 'drwxr-xr-x root/root',
      [README.rpm]: '-rw-r--r-- root/root',
      [EXAMPLE_CONFIG.installed]: '-rw-r--r-- root/root',
      [`${DOC_DIR}/dra`]: 'drwxr-xr-x root/root',
      ...Object.fromEntries(DRA_DOCS.sources.map((f) => [f.installed, '-rw-r--r-- root/root'])),
      [`/usr/share/${PACKAGE}`]: 'drwxr-xr-x root/root',
      [DRA_DROPIN.installed]: '-rw-r--r-- root/root',
    });
    // The README, the example and the DRA documents are %doc (d in rpm's flags; rpm marks man pages so
    // by itself), so --excludedocs leaves them out; nothing else is: not the DRA drop-in, which a node
    // in DRA mode links into the unit.
    const docs = [EXAMPLE_CONFIG.installed, README.rpm, MAN_PATH, ...DRA_DOCS.sources.map((f) => f.installed)].sort();
    const flagged = q('--qf', '[%{FILEFLAGS:fflags} %{FILENAMES}\n]')
      .split('\n')
      .filter((l) => /^\S*d\S* /.test(l))
      .map((l) => l.split(' ')[1])
      .sort();
    assert.deepEqual(flagged, docs);
    assert.deepEqual(q('-d').trim().split('\n').sort(), docs);
    assert.equal(q('-c'), `${ENV_FILE.rpm}\n`);
    // Flags of the config file: c (config) and n (noreplace) in rpm's own notation.
    assert.match(q('--qf', '[%{FILEFLAGS:fflags} %{FILENAMES}\n]'), new RegExp(`^cn ${ENV_FILE.rpm}$`, 'm'));
    assert.equal(q('--qf', '%{VERSION}-%{RELEASE} %{ARCH}'), `${packageVersion(VERSION)}-1 x86_64`);
  });

  test('requirements: the C and C++ runtime libraries and systemd for the scriptlets, no nodejs', () => {
    const reqs = q('-R');
    for (const lib of ['libc.so.6()(64bit)', 'libstdc++.so.6()(64bit)', 'libgcc_s.so.1()(64bit)'])
      assert.ok(reqs.includes(lib), `${lib} in\n${reqs}`);
    assert.match(reqs, /^systemd$/m);
    assert.doesNotMatch(reqs, /node|nvidia/i);
    assert.match(q('--suggests'), /nvidia-container-toolkit/);
  });

  test('scriptlets: preset and start on install, disable --now on erase, try-restart on upgrade', () => {
    const s = q('--scripts');
    assert.match(
      s,
      new RegExp(
        String.raw`postinstall scriptlet[\s\S]*systemctl --no-reload preset ` +
          String.raw`gpu-device-plugin\.service[\s\S]*systemctl start gpu-device-plugin\.service`,
      ),
    );
    assert.match(s, /preuninstall scriptlet[\s\S]*systemctl --no-reload disable --now gpu-device-plugin\.service/);
    assert.match(s, /postuninstall scriptlet[\s\S]*systemctl try-restart gpu-device-plugin\.service/);
    assert.match(s, /preuninstall scriptlet[\s\S]*systemctl --no-reload disable --now gpu-device-plugin-mps\.service/);
    // The MPS unit is never (try-)restarted: only a comment names it in the upgrade branch.
    assert.doesNotMatch(s.replace(/^\s*#.*$/gm, ''), /(restart|start)\s+gpu-device-plugin-mps/);
  });

  test("rpm: install, upgrade keeping the operator's edits (executable not stripped), erase", () => {
    rpmLifecycle(x64);
  });
});

describe('the systemd unit', () => {
  test('systemd-analyze verify prints nothing', () => {
    // verify checks that ExecStart exists and that the Documentation= man page opens: point a copy
    // of the packaged unit at the extracted executable and `man` at the extracted pages.
    const dir = join(work, 'verify');
    mkdirSync(dir);
    const unit = readFileSync(join(extracted, UNIT_PATH), 'utf8');
    assert.match(unit, /^ExecStart=\/usr\/bin\/gpu-device-plugin$/m);
    writeFileSync(
      join(dir, UNIT),
      unit.replace(/^ExecStart=\/usr\/bin\/gpu-device-plugin$/m, `ExecStart=${join(extracted, BINARY_PATH)}`),
    );
    const r = spawnSync('systemd-analyze', ['verify', join(dir, UNIT)], {
      encoding: 'utf8',
      env: { PATH, LC_ALL: 'C.UTF-8', MANPATH: join(extracted, 'usr', 'share', 'man'), SYSTEMD_LOG_COLOR: '0' },
    });
    assert.equal(r.stdout + r.stderr, '');
    assert.equal(r.status, 0);
  });

  test(
    'with the DRA drop-in linked in, systemd-analyze verify prints ' +
      "nothing and the DRA mode's sandbox is what check expects",
    () => {
      const dir = join(work, 'verify-dra');
      mkdirSync(join(dir, `${UNIT}.d`), { recursive: true });
      const unit = readFileSync(join(extracted, UNIT_PATH), 'utf8');
      writeFileSync(
        join(dir, UNIT),
        unit.replace(/^ExecStart=\/usr\/bin\/gpu-device-plugin$/m, `ExecStart=${join(extracted, BINARY_PATH)}`),
      );
      const dropin = readFileSync(join(extracted, DRA_DROPIN.installed), 'utf8');
      writeFileSync(join(dir, `${UNIT}.d`, 'dra.conf'), dropin);
      const r = spawnSync('systemd-analyze', ['verify', join(dir, UNIT)], {
        encoding: 'utf8',
        env: { PATH, LC_ALL: 'C.UTF-8', MANPATH: join(extracted, 'usr', 'share', 'man'), SYSTEMD_LOG_COLOR: '0' },
      });
      assert.equal(r.stdout + r.stderr, '');
      assert.equal(r.status, 0);
      // A misspelt key in the drop-in would be reported: the drop-in is read.
      writeFileSync(join(dir, `${UNIT}.d`, 'zz-typo.conf'), '[Service]\nReadWritePath=/x\n');
      const typo = spawnSync('systemd-analyze', ['verify', join(dir, UNIT)], {
        encoding: 'utf8',
        env: { PATH, LC_ALL: 'C.UTF-8', MANPATH: join(extracted, 'usr', 'share', 'man'), SYSTEMD_LOG_COLOR: '0' },
      });
      assert.match(typo.stdout + typo.stderr, /Unknown key 'ReadWritePath'/);
      rmSync(join(dir, `${UNIT}.d`, 'zz-typo.conf'));
      const sb = parseUnitSandbox([unit, dropin]);
      for (const d of [
        '/var/lib/kubelet/plugins_registry',
        '/var/lib/kubelet/plugins/gpu.nvidia.com',
        '/var/lib/kubelet/device-plugins',
      ])
        assert.equal(writableInSandbox(sb, d).writable, true, d);
      assert.equal(
        writableInSandbox(sb, '/var/lib/kubelet/plugins/other.example.com').writable,
        false,
        "other drivers' directories stay read-only",
      );
      assert.equal(networkInSandbox(sb, '10.0.0.10').reachable, true);
      assert.equal(
        networkInSandbox(parseUnitSandbox([unit]), '10.0.0.10').reachable,
        false,
        'the device-plugin mode has no network',
      );
      // Exposure with the drop-in, for the record (the device-plugin mode's is held at 1.5 below).
      const sec = spawnSync(
        'systemd-analyze',
        ['security', '--offline=yes', '--threshold=25', '--no-pager', join(dir, UNIT)],
        { encoding: 'utf8', env: { PATH, LC_ALL: 'C.UTF-8', SYSTEMD_COLORS: '0' } },
      );
      const m = /Overall exposure level for \S+: (\d+\.\d)/.exec(sec.stdout);
      assert.ok(m?.[1], sec.stdout + sec.stderr);
      assert.ok(Number(m[1]) <= 2.5, `exposure in DRA mode ${m[1]}`);
    },
  );

  test('systemd-analyze security: exposure at most 1.5', () => {
    const r = spawnSync(
      'systemd-analyze',
      ['security', '--offline=yes', '--threshold=15', '--no-pager', join(extracted, UNIT_PATH)],
      { encoding: 'utf8', env: { PATH, LC_ALL: 'C.UTF-8', SYSTEMD_COLORS: '0' } },
    );
    const m = /Overall exposure level for \S+: (\d+\.\d)/.exec(r.stdout);
    assert.ok(m?.[1], r.stdout + r.stderr);
    assert.ok(Number(m[1]) <= 1.5, `exposure ${m[1]}`);
    assert.equal(r.status, 0, r.stderr);
  });

  test('readiness, restarts, ordering, environment files, directories and GPU access as specified', () => {
    const unit = readFileSync(join(extracted, UNIT_PATH), 'utf8');
    const values = (key: string): string[] =>
      [...unit.matchAll(new RegExp(`^${key}=(.*)$`, 'gm'))].map((m) => m[1] ?? '');
    assert.deepEqual(values('Type'), ['notify']);
    assert.deepEqual(values('NotifyAccess'), ['main']);
    assert.deepEqual(values('WatchdogSec'), ['30s']);
    assert.deepEqual(values('Restart'), ['always']);
    assert.deepEqual(values('ExecReload'), [`/bin/sh -c 'kill -HUP "$MAINPID"'`]);
    assert.deepEqual(values('After'), [
      'kubelet.service nvidia-persistenced.service nvidia-fabricmanager.service gpu-device-plugin-mps.service',
    ]);
    assert.deepEqual(values('Wants'), [MPS_UNIT]);
    assert.deepEqual([...values('Requires'), ...values('BindsTo'), ...values('Requisite')], []);
    assert.deepEqual(values('EnvironmentFile'), [`-${ENV_FILE.deb}`, `-${ENV_FILE.rpm}`]);
    assert.deepEqual(values('RuntimeDirectory'), ['gpu-device-plugin']);
    assert.deepEqual(values('StateDirectory'), ['gpu-device-plugin']);
    assert.deepEqual([...values('RuntimeDirectoryMode'), ...values('StateDirectoryMode')], ['0700', '0700']);
    assert.deepEqual(values('NoExecPaths'), []);
    assert.deepEqual(values('DevicePolicy'), ['closed']);
    assert.deepEqual(values('DeviceAllow'), ['char-nvidia* rw']);
    assert.deepEqual(values('PrivateDevices'), []);
    assert.deepEqual(values('MemoryDenyWriteExecute'), [], 'V8 needs writable-then-executable memory');
    assert.deepEqual(values('RestrictAddressFamilies'), ['AF_UNIX']);
    assert.deepEqual(values('CapabilityBoundingSet'), ['']);
    assert.deepEqual(values('ProtectSystem'), ['strict']);
    assert.deepEqual(values('ReadWritePaths'), ['-/var/lib/kubelet/device-plugins']);
  });
});

describe("the MPS control daemons' unit", () => {
  const unitText = (): string => readFileSync(join(extracted, MPS_UNIT_PATH), 'utf8');
  const values = (key: string): string[] =>
    [...unitText().matchAll(new RegExp(`^${key}=(.*)$`, 'gm'))].map((m) => m[1] ?? '');

  test("systemd-analyze verify prints nothing for it beside the plugin's unit", () => {
    const dir = join(work, 'verify-mps');
    mkdirSync(dir);
    const exeAt = join(extracted, BINARY_PATH);
    assert.match(unitText(), /^ExecStart=\/usr\/bin\/gpu-device-plugin mps-control-daemon$/m);
    writeFileSync(
      join(dir, MPS_UNIT),
      unitText().replace(/^ExecStart=\/usr\/bin\/gpu-device-plugin /m, `ExecStart=${exeAt} `),
    );
    writeFileSync(
      join(dir, UNIT),
      readFileSync(join(extracted, UNIT_PATH), 'utf8').replace(
        /^ExecStart=\/usr\/bin\/gpu-device-plugin$/m,
        `ExecStart=${exeAt}`,
      ),
    );
    const r = spawnSync('systemd-analyze', ['verify', join(dir, MPS_UNIT), join(dir, UNIT)], {
      encoding: 'utf8',
      env: { PATH, LC_ALL: 'C.UTF-8', MANPATH: join(extracted, 'usr', 'share', 'man'), SYSTEMD_LOG_COLOR: '0' },
    });
    assert.equal(r.stdout + r.stderr, '');
    assert.equal(r.status, 0);
  });

  test('systemd-analyze security: exposure at most 4.5 (no mount namespace: the shm tmpfs must reach the host)', () => {
    const r = spawnSync(
      'systemd-analyze',
      ['security', '--offline=yes', '--threshold=50', '--no-pager', join(extracted, MPS_UNIT_PATH)],
      { encoding: 'utf8', env: { PATH, LC_ALL: 'C.UTF-8', SYSTEMD_COLORS: '0' } },
    );
    const m = /Overall exposure level for \S+: (\d+\.\d)/.exec(r.stdout);
    assert.ok(m?.[1], r.stdout + r.stderr);
    assert.ok(Number(m[1]) <= 4.5, `exposure ${m[1]}`);
  });

  test(
    'notify, ordered before the plugin, reloaded with it, its own ' +
      'directories, the capabilities MPS needs and nothing mounting a namespace',
    () => {
      assert.deepEqual(values('Type'), ['notify']);
      assert.deepEqual(values('Before'), [UNIT]);
      assert.deepEqual(values('After'), ['nvidia-persistenced.service']);
      assert.deepEqual(values('ReloadPropagatedFrom'), [UNIT]);
      assert.deepEqual(values('ExecReload'), [`/bin/sh -c 'kill -HUP "$MAINPID"'`]);
      assert.deepEqual(
        values('KillMode'),
        ['mixed'],
        'SIGTERM to the program only, so it can tell the control daemons to quit',
      );
      assert.deepEqual(values('EnvironmentFile'), [`-${ENV_FILE.deb}`, `-${ENV_FILE.rpm}`]);
      assert.deepEqual(values('RuntimeDirectory'), ['gpu-device-plugin-mps']);
      assert.deepEqual(values('StateDirectory'), ['gpu-device-plugin-mps']);
      assert.deepEqual(values('CapabilityBoundingSet'), [
        'CAP_SYS_ADMIN CAP_SETUID CAP_SETGID CAP_CHOWN CAP_FOWNER CAP_KILL',
      ]);
      assert.deepEqual(values('DeviceAllow'), ['char-nvidia* rw']);
      assert.deepEqual(values('RestrictNamespaces'), ['mnt']);
      for (const key of [
        'ProtectSystem',
        'ReadWritePaths',
        'ProtectHome',
        'PrivateTmp',
        'PrivateDevices',
        'ProtectKernelTunables',
        'ProtectControlGroups',
        'MountFlags',
      ]) {
        assert.deepEqual(
          values(key),
          [],
          `${key} would give it a mount namespace whose shm mount never reaches the host`,
        );
      }
      // Never restarted by an upgrade, and no [Install]: the plugin's Wants= starts it.
      assert.doesNotMatch(unitText(), /^\[Install\]/m);
      assert.match(unitText(), /NEVER RESTARTED BY A PACKAGE UPGRADE/);
    },
  );
});

describe('release properties', () => {
  test(`both packages are at most ${MAX_PACKAGE_BYTES / 1024 / 1024} MiB`, () => {
    for (const p of [deb, rpm]) assert.ok(statSync(p).size <= MAX_PACKAGE_BYTES, `${p}: ${statSync(p).size} bytes`);
  });

  test('two builds of the .deb are byte-identical', async () => {
    const again = await secondDeb;
    assert.notEqual(again, deb);
    assert.equal(sha256(again), sha256(deb));
  });

  test(
    'two builds of the .rpm are byte-identical (compared ' + 'uncompressed: single-threaded xz adds nothing variable)',
    () => {
      assert.notEqual(oldRpmAgain, oldRpm);
      assert.equal(sha256(oldRpmAgain), sha256(oldRpm));
    },
  );
});

describe('the arm64 packages', () => {
  const field = (name: string): string => sh('dpkg-deb', ['-f', arm64.deb, name]).trim();
  const q = (...args: string[]): string => sh('rpm', ['-qp', ...args, arm64.rpm], { env: { PATH, LC_ALL: 'C.UTF-8' } });

  test('file names and architecture fields: arm64 .deb, aarch64 .rpm', () => {
    assert.equal(arm64.deb, join(dirname(arm64.deb), debFileName(VERSION, 'arm64')));
    assert.match(debFileName(VERSION, 'arm64'), /_arm64\.deb$/);
    assert.equal(field('Architecture'), 'arm64');
    assert.equal(field('Version'), packageVersion(VERSION));
    assert.equal(arm64.rpm, join(dirname(arm64.rpm), rpmFileName(VERSION, 'arm64')));
    assert.match(rpmFileName(VERSION, 'arm64'), /\.aarch64\.rpm$/);
    assert.equal(q('--qf', '%{VERSION}-%{RELEASE} %{ARCH}'), `${packageVersion(VERSION)}-1 aarch64`);
  });

  test('.deb dependencies: the same C and C++ runtime libraries as amd64, libatomic1 included, no nodejs', () => {
    const depends = field('Depends');
    assert.equal(depends, sh('dpkg-deb', ['-f', x64.deb, 'Depends']).trim());
    for (const lib of ['libc6', 'libstdc++6', 'libgcc-s1', 'libatomic1'])
      assert.match(depends, new RegExp(`(^|, )${lib.replace(/\+/g, '\\+')} \\(>= `), `Depends: ${depends}`);
    assert.match(depends, /libc6 \(>= 2\.34\)/);
    assert.doesNotMatch(depends, /node|nvidia|:arm64|cross/i);
  });

  test('.rpm requirements: the aarch64 loader and libraries, systemd for the scriptlets; rpm -K passes', () => {
    const reqs = q('-R');
    for (const lib of [
      'ld-linux-aarch64.so.1()(64bit)',
      'libc.so.6()(64bit)',
      'libstdc++.so.6()(64bit)',
      'libgcc_s.so.1()(64bit)',
      'libatomic.so.1()(64bit)',
    ])
      assert.ok(reqs.includes(lib), `${lib} in\n${reqs}`);
    assert.doesNotMatch(reqs, /x86-64|node|nvidia/i);
    assert.match(reqs, /^systemd$/m);
    assert.match(sh('rpm', ['-K', arm64.rpm]), /digests OK/);
  });

  test('both carry the aarch64 executable byte for byte, and the same other files as x64', () => {
    const dir = join(work, 'x-arm64');
    sh('dpkg-deb', ['-x', arm64.deb, dir]);
    const packaged = join(dir, BINARY_PATH);
    assert.equal(sha256(packaged), arm64.exeSha);
    assert.equal(readFileSync(packaged).readUInt16LE(18), 0xb7, 'ELF machine aarch64');
    const names = (listing: string): string[] =>
      listing
        .trim()
        .split('\n')
        .map((l) => l.split(/\s+/).slice(5).join(' '))
        .sort();
    assert.deepEqual(names(sh('dpkg-deb', ['-c', arm64.deb])), names(sh('dpkg-deb', ['-c', x64.deb])));
    assert.equal(q('-l'), sh('rpm', ['-qpl', x64.rpm]));
  });

  test('dpkg (arm64 added as a foreign architecture): install, upgrade, remove, reinstall, purge', () => {
    dpkgLifecycle(arm64);
  });

  test('rpm (--ignorearch): install, upgrade, erase', () => {
    rpmLifecycle(arm64);
  });

  test('lintian --pedantic prints nothing for the arm64 .deb', () => lintianSilent(arm64Lintian));
});
