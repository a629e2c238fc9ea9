// npm run package → for each architecture (x64 and arm64; `--arch x64|arm64|all`, default all)
// dist/gpu-device-plugin_<version>_<amd64|arm64>.deb and
// dist/gpu-device-plugin-<version>-1.<x86_64|aarch64>.rpm, from the executables `npm run build` made
// (dist/gpu-device-plugin and dist/arm64/gpu-device-plugin).
//
// Both packages are staged here, file by file with explicit modes, and every timestamp is
// SOURCE_DATE_EPOCH (the git commit time unless set), so that two builds of one commit give
// byte-identical packages. The .deb is made by dpkg-deb (--root-owner-group, xz -6), the .rpm by
// rpmbuild from packaging/rpm/gpu-device-plugin.spec.in (no stripping: it would break the
// executable). The environment file and the man page are generated from the program's option
// table (build/docs.ts), the rpm %changelog from packaging/changelog. Both carry the operator's
// README.md, an example config file and the DRA RBAC and credential documents in
// /usr/share/doc/gpu-device-plugin/, and the DRA unit drop-in in /usr/share/gpu-device-plugin/.
import { execFile, execFileSync } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { executablePath } from './build.ts';
import { environmentFile, manPage } from './docs.ts';
import { PACKAGE_ARCH, parseArch, runtimeFor } from './runtime.ts';
import type { Arch } from './runtime.ts';

const execFileAsync = promisify(execFile);

export const ROOT = join(import.meta.dirname, '..');
export const PACKAGE = 'gpu-device-plugin';
export const BINARY_PATH = '/usr/bin/gpu-device-plugin';
export const UNIT_PATH = '/usr/lib/systemd/system/gpu-device-plugin.service';
/** The MPS control daemons' unit (never restarted by an upgrade: see the unit and the scripts). */
export const MPS_UNIT_PATH = '/usr/lib/systemd/system/gpu-device-plugin-mps.service';
export const MAN_PATH = '/usr/share/man/man8/gpu-device-plugin.8.gz';
export const ENV_FILE = { deb: '/etc/default/gpu-device-plugin', rpm: '/etc/sysconfig/gpu-device-plugin' } as const;
export const RPM_RELEASE = '1';
/** Documentation both packages install for operators (the .deb gzips README.md, as Debian policy
 * asks of documentation over 4 KiB; rpm installs it as is). */
export const DOC_DIR = `/usr/share/doc/${PACKAGE}`;
export const README = {
  source: join(ROOT, 'README.md'),
  deb: `${DOC_DIR}/README.md.gz`,
  rpm: `${DOC_DIR}/README.md`,
} as const;
/** An NVIDIA v1 config file showing time-slicing and the MIG strategy, which the plugin accepts. */
export const EXAMPLE_CONFIG = {
  source: join(ROOT, 'packaging', 'config.example.yaml'),
  installed: `${DOC_DIR}/examples/config.yaml`,
} as const;
/**
 * Dynamic Resource Allocation: the RBAC, admission policy, DeviceClasses and credential steps an
 * operator applies (documentation, small, uncompressed so they can be applied as they are), and the unit
 * drop-in a node switched to DRA links in. The drop-in is not under /usr/share/doc, which minimal
 * installs leave out (Debian policy: nothing may need /usr/share/doc to work).
 */
export const DRA_DOCS = {
  sources: [
    'README.md',
    'rbac.yaml',
    'admission-policy.yaml',
    'deviceclass.yaml',
    'deviceclasses-mig.yaml',
    'deviceclasses-sharing.yaml',
  ].map((name) => ({
    source: join(ROOT, 'packaging', 'dra', name),
    installed: `${DOC_DIR}/dra/${name}`,
  })),
} as const;
export const DRA_DROPIN = {
  source: join(ROOT, 'systemd', 'dra.conf'),
  installed: `/usr/share/${PACKAGE}/dra.conf`,
} as const;
/** Packages must stay below this size. Both use xz level 6 (about 26.5 MiB); level 9 would save
 * 0.3 MiB for a third more compression time. */
export const MAX_PACKAGE_BYTES = 28 * 1024 * 1024;

const PACKAGING = join(ROOT, 'packaging');

export interface BuildOptions {
  /** The architecture packaged; default x64 (amd64, x86_64). */
  arch?: Arch;
  /** The executable to package; default the build's for the architecture (build/build.ts executablePath). */
  executable?: string;
  /** Where the package is written; default dist/. */
  outDir?: string;
  /** Timestamp for every file and archive member; default $SOURCE_DATE_EPOCH, else the commit time. */
  sourceDateEpoch?: number;
  /** Upstream version; default package.json's. Tests use it to make an older build. */
  version?: string;
  /**
   * 'release' (xz -6, the default), 'fast' (gzip -1: seconds instead of minutes, for test packages
   * that lintian checks) or 'none' (uncompressed, for throwaway test packages).
   */
  compression?: Compression;
}

export type Compression = 'release' | 'fast' | 'none';

interface Resolved {
  arch: Arch;
  executable: string;
  outDir: string;
  epoch: number;
  version: string;
  compression: Compression;
}

function resolve(opts: BuildOptions): Resolved {
  const arch = opts.arch ?? 'x64';
  return {
    arch,
    executable: opts.executable ?? executablePath(arch),
    outDir: opts.outDir ?? join(ROOT, 'dist'),
    epoch: opts.sourceDateEpoch ?? sourceDateEpoch(),
    version: opts.version ?? projectVersion(),
    compression: opts.compression ?? 'release',
  };
}

export function projectVersion(): string {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string };
  return pkg.version;
}

/** SOURCE_DATE_EPOCH when set, else the commit time of HEAD. */
export function sourceDateEpoch(): number {
  const fromEnv = process.env.SOURCE_DATE_EPOCH;
  if (fromEnv !== undefined && fromEnv !== '') {
    const n = Number(fromEnv);
    if (!Number.isInteger(n) || n < 0)
      throw new Error(`SOURCE_DATE_EPOCH=${JSON.stringify(fromEnv)} is not a whole number of seconds`);
    return n;
  }
  let out: string;
  try {
    out = execFileSyncText('git', ['log', '-1', '--format=%ct'], ROOT);
  } catch (err) {
    throw new Error('cannot read the commit time with git; set SOURCE_DATE_EPOCH', { cause: err });
  }
  return Number(out.trim());
}

function execFileSyncText(cmd: string, args: string[], cwd: string): string {
  return execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

/**
 * Package version: semver's pre-release separator becomes "~", which sorts before the release in
 * both dpkg and rpm (0.2.0~rc.1 < 0.2.0). Without a Debian revision the .deb is a native package.
 */
export function packageVersion(upstream: string): string {
  if (!/^\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]*)?$/.test(upstream))
    throw new Error(`version ${JSON.stringify(upstream)} is not semver`);
  return upstream.replace('-', '~');
}

export interface ChangelogEntry {
  version: string;
  distribution: string;
  urgency: string;
  /** Change lines as written, without the two-space indent. */
  lines: string[];
  maintainer: string;
  date: Date;
}

/** Parses a Debian changelog (packaging/changelog). */
export function parseChangelog(text: string): ChangelogEntry[] {
  const entries: ChangelogEntry[] = [];
  let cur: Omit<ChangelogEntry, 'maintainer' | 'date'> | undefined;
  for (const line of text.split('\n')) {
    const head = /^([a-z0-9][a-z0-9.+-]*) \(([^)]+)\) ([^;]+); urgency=(\S+)$/.exec(line);
    if (head) {
      if (cur) throw new Error(`changelog entry ${cur.version} has no trailer line`);
      cur = { version: head[2] ?? '', distribution: head[3] ?? '', urgency: head[4] ?? '', lines: [] };
      continue;
    }
    const trailer = /^ -- (.+ <[^>]+>) {2}(.+)$/.exec(line);
    if (trailer) {
      if (!cur) throw new Error('changelog trailer without an entry');
      const date = new Date(trailer[2] ?? '');
      if (Number.isNaN(date.getTime())) throw new Error(`changelog entry ${cur.version}: bad date ${trailer[2] ?? ''}`);
      entries.push({ ...cur, lines: trimBlank(cur.lines), maintainer: trailer[1] ?? '', date });
      cur = undefined;
      continue;
    }
    if (cur && (line.startsWith('  ') || line === '')) cur.lines.push(line.slice(2));
    else if (line.trim() !== '') throw new Error(`changelog: unexpected line ${JSON.stringify(line)}`);
  }
  if (cur) throw new Error(`changelog entry ${cur.version} has no trailer line`);
  if (entries.length === 0) throw new Error('changelog has no entries');
  return entries;
}

function trimBlank(lines: string[]): string[] {
  let a = 0;
  let b = lines.length;
  while (a < b && lines[a]?.trim() === '') a++;
  while (b > a && lines[b - 1]?.trim() === '') b--;
  return lines.slice(a, b);
}

function readChangelog(): { text: string; entries: ChangelogEntry[] } {
  const text = readFileSync(join(PACKAGING, 'changelog'), 'utf8');
  return { text, entries: parseChangelog(text) };
}

/** The changelog's newest entry must be the version being packaged (a release step). */
function checkChangelog(entries: ChangelogEntry[], r: Resolved, explicitVersion: boolean): ChangelogEntry {
  const top = entries[0];
  if (top === undefined) throw new Error('changelog has no entries');
  const want = packageVersion(r.version);
  if (top.version !== want && !explicitVersion) {
    throw new Error(
      `packaging/changelog starts with ${top.version} but package.json ` +
        `says ${r.version}: add a changelog entry for ${want}`,
    );
  }
  return top;
}

const DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/** The Debian changelog as an rpm %changelog (newest first). */
export function rpmChangelog(entries: readonly ChangelogEntry[]): string {
  const out: string[] = [];
  for (const e of entries) {
    const d = e.date;
    const day =
      `${DAYS[d.getUTCDay()] ?? ''} ${MONTHS[d.getUTCMonth()] ?? ''} ` +
      `${String(d.getUTCDate()).padStart(2, '0')} ${d.getUTCFullYear()}`;
    if (out.length > 0) out.push('');
    out.push(`* ${day} ${e.maintainer} - ${e.version}-${RPM_RELEASE}`);
    for (const line of e.lines) {
      if (line.trim() === '') continue;
      out.push(line.replace(/^\* /, '- ').replace(/^ {2}/, '  ').replace(/%/g, '%%'));
    }
  }
  return out.join('\n');
}

/** The copyright file: packaging/copyright plus the Node.js runtime's license, which it references. */
export function copyrightText(arch: Arch = 'x64'): string {
  const head = readFileSync(join(PACKAGING, 'copyright'), 'utf8').trimEnd();
  const node = readFileSync(runtimeFor(arch).nodeLicense, 'utf8').replace(/\r\n/g, '\n').trimEnd().split('\n');
  const body = node.map((l) => (l.trim() === '' ? ' .' : ` ${l.trimEnd()}`));
  return `${head}\n\nLicense: Node.js\n${body.join('\n')}\n`;
}

// ---------------------------------------------------------------------------------------------
// Staging

interface Tree {
  root: string;
  file(path: string, content: string | Buffer, mode: number): void;
  copy(path: string, from: string, mode: number): void;
}

function tree(root: string): Tree {
  const place = (path: string): string => {
    const abs = join(root, path);
    mkdirSync(dirname(abs), { recursive: true, mode: 0o755 });
    return abs;
  };
  return {
    root,
    file(path, content, mode) {
      const abs = place(path);
      writeFileSync(abs, content);
      chmodSync(abs, mode);
    },
    copy(path, from, mode) {
      const abs = place(path);
      copyFileSync(from, abs);
      chmodSync(abs, mode);
    },
  };
}

/** Every entry below `dir`, sorted, as paths relative to it. */
function walk(dir: string): string[] {
  const out: string[] = [];
  const visit = (d: string): void => {
    for (const name of readdirSync(d).sort()) {
      const abs = join(d, name);
      out.push(relative(dir, abs));
      if (lstatSync(abs).isDirectory()) visit(abs);
    }
  };
  visit(dir);
  return out;
}

/** Directories 0755 and every timestamp set to the epoch (children before their directory). */
function normalise(root: string, epoch: number): void {
  const all = walk(root);
  for (const rel of all) {
    const abs = join(root, rel);
    if (lstatSync(abs).isDirectory()) chmodSync(abs, 0o755);
  }
  for (const rel of all.reverse()) utimesSync(join(root, rel), epoch, epoch);
  chmodSync(root, 0o755);
  utimesSync(root, epoch, epoch);
}

function gzip9n(text: string | Buffer): Buffer {
  return execFileSync('gzip', ['-9n', '-c'], { input: text, maxBuffer: 64 * 1024 * 1024 });
}

/** The files both packages carry, at their paths, with their modes. */
function stageCommon(t: Tree, r: Resolved, envFile: string): void {
  t.copy(BINARY_PATH, r.executable, 0o755);
  t.copy(UNIT_PATH, join(ROOT, 'systemd', 'gpu-device-plugin.service'), 0o644);
  t.copy(MPS_UNIT_PATH, join(ROOT, 'systemd', 'gpu-device-plugin-mps.service'), 0o644);
  t.file(envFile, environmentFile(envFile), 0o644);
  const man = manPage({
    version: r.version,
    date: new Date(r.epoch * 1000),
    environmentFiles: [ENV_FILE.deb, ENV_FILE.rpm],
  });
  t.file(MAN_PATH, gzip9n(man), 0o644);
  t.copy(DRA_DROPIN.installed, DRA_DROPIN.source, 0o644);
}

/**
 * The operator's documentation: README.md (the .deb gzips it, as dh_compress does with any
 * documentation over 4 KiB; the .rpm keeps it as is, marked %doc in the spec) and the example
 * config file under examples/ (small, left uncompressed so it can be copied as it is).
 */
function stageDocs(t: Tree, kind: 'deb' | 'rpm'): void {
  const readme = readFileSync(README.source);
  if (kind === 'deb') t.file(README.deb, gzip9n(readme), 0o644);
  else t.file(README.rpm, readme, 0o644);
  t.copy(EXAMPLE_CONFIG.installed, EXAMPLE_CONFIG.source, 0o644);
  for (const f of DRA_DOCS.sources) t.copy(f.installed, f.source, 0o644);
}

function workDir(kind: string): string {
  return mkdtempSync(join(tmpdir(), `gdp-${kind}-`));
}

async function run(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv } = {}): Promise<string> {
  try {
    const { stdout } = await execFileAsync(cmd, args, { ...opts, maxBuffer: 64 * 1024 * 1024, encoding: 'utf8' });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; stdout?: string; code?: unknown };
    throw new Error(`${cmd} ${args.join(' ')} failed (${String(e.code)}):\n${e.stderr ?? ''}${e.stdout ?? ''}`, {
      cause: err,
    });
  }
}

// ---------------------------------------------------------------------------------------------
// .deb

/** Debian library dependencies of an executable of the host's architecture, from dpkg-shlibdeps. */
async function shlibsDepends(binary: string): Promise<string> {
  const dir = workDir('shlibs');
  try {
    mkdirSync(join(dir, 'debian'));
    writeFileSync(join(dir, 'debian', 'control'), `Source: ${PACKAGE}\n\nPackage: ${PACKAGE}\nArchitecture: amd64\n`);
    const out = await run('dpkg-shlibdeps', ['-O', '--warnings=0', `-e${binary}`], { cwd: dir });
    const m = /^shlibs:Depends=(.+)$/m.exec(out);
    if (!m?.[1]) throw new Error(`dpkg-shlibdeps gave no dependencies: ${out}`);
    return m[1].trim();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * What an ELF executable asks of the dynamic linker: its libraries (DT_NEEDED, without the loader,
 * whose name is the architecture's) and, per library, the highest symbol version it needs.
 */
export async function elfRequirements(binary: string): Promise<string[]> {
  const dynamic = await run('readelf', ['--dynamic', '--wide', binary], { env: { ...process.env, LC_ALL: 'C' } });
  const needed = [...dynamic.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)]
    .map((m) => m[1] ?? '')
    .filter((l) => !/^ld-linux/.test(l));
  const versions = await run('readelf', ['--version-info', '--wide', binary], { env: { ...process.env, LC_ALL: 'C' } });
  const highest = new Map<string, string>();
  let file = '';
  for (const line of versions.split('\n')) {
    const f = /File: (\S+)\s+Cnt:/.exec(line);
    if (f) {
      file = f[1] ?? '';
      continue;
    }
    const v = /Name: ([A-Z_]+?)_?(\d+(?:\.\d+)*)\s/.exec(line);
    if (!v || file === '' || /^ld-linux/.test(file)) continue;
    const tag = `${v[1] ?? ''} ${v[2] ?? ''}`;
    const key = `${file} ${v[1] ?? ''}`;
    const cur = highest.get(key);
    if (cur === undefined || compareVersions(tag.split(' ')[1] ?? '', cur.split(' ')[1] ?? '') > 0)
      highest.set(key, tag);
  }
  return [...needed.sort(), ...[...highest].map(([k, v]) => `${k.split(' ')[0] ?? ''} ${v}`).sort()];
}

function compareVersions(a: string, b: string): number {
  const x = a.split('.').map(Number);
  const y = b.split('.').map(Number);
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/**
 * Debian dependencies of the packaged executable. For amd64, dpkg-shlibdeps reads them from the
 * host's libraries. For arm64 it cannot (it needs the arm64 libraries installed as such, and an
 * amd64 host only has the -arm64-cross copies, whose shlibs name other packages): the arm64 Node
 * runtime is built from the same sources with the same toolchain baseline, so it must need the same
 * libraries at the same highest symbol versions as the x64 one, which is checked here, and then
 * the x64 runtime's dependencies are the arm64 package's too.
 */
async function debDepends(r: Resolved, binary: string): Promise<string> {
  if (r.arch === 'x64') return shlibsDepends(binary);
  const x64 = runtimeFor('x64').node;
  // glibc's aarch64 port starts at GLIBC_2.17: any version up to it is met by every aarch64 glibc,
  // and asks nothing beyond x64's 2.2.5 or 2.12.
  const baseline = (reqs: string[]): string[] =>
    reqs.map((q) => {
      const m = / GLIBC (\S+)$/.exec(q);
      return m?.[1] !== undefined && compareVersions(m[1], '2.17') <= 0
        ? q.replace(/ GLIBC \S+$/, ' GLIBC baseline')
        : q;
    });
  const [want, got] = (await Promise.all([elfRequirements(x64), elfRequirements(binary)])).map(baseline) as [
    string[],
    string[],
  ];
  if (JSON.stringify(want) !== JSON.stringify(got)) {
    throw new Error(
      `the ${r.arch} executable needs other libraries or symbol versions than the x64 runtime, so its Debian ` +
        `dependencies cannot be taken from it:\n  x64:     ${want.join(', ')}\n  ${r.arch}: ${got.join(', ')}`,
    );
  }
  return shlibsDepends(x64);
}

/** Installed-Size as dpkg-gencontrol computes it: KiB per file, rounded up, plus 1 per other entry. */
function installedSizeKiB(root: string): number {
  let kib = 0;
  for (const rel of walk(root)) {
    if (rel === 'DEBIAN' || rel.startsWith('DEBIAN/')) continue;
    const st = lstatSync(join(root, rel));
    kib += st.isFile() ? Math.ceil(st.size / 1024) : 1;
  }
  return kib;
}

export function debFileName(version: string, arch: Arch = 'x64'): string {
  return `${PACKAGE}_${packageVersion(version)}_${PACKAGE_ARCH[arch].deb}.deb`;
}

export async function buildDeb(opts: BuildOptions = {}): Promise<string> {
  const r = resolve(opts);
  const { text: changelog, entries } = readChangelog();
  const top = checkChangelog(entries, r, opts.version !== undefined);
  const work = workDir('deb');
  try {
    const t = tree(join(work, 'root'));
    stageCommon(t, r, ENV_FILE.deb);
    t.file(`${DOC_DIR}/copyright`, copyrightText(r.arch), 0o644);
    // A native package (no Debian revision): its Debian changelog is changelog.gz.
    t.file(`${DOC_DIR}/changelog.gz`, gzip9n(changelog), 0o644);
    stageDocs(t, 'deb');
    t.copy(`/usr/share/lintian/overrides/${PACKAGE}`, join(PACKAGING, 'deb', 'lintian-overrides'), 0o644);

    const depends = await debDepends(r, join(t.root, BINARY_PATH));
    const control = readFileSync(join(PACKAGING, 'deb', 'control.in'), 'utf8')
      .replace('@VERSION@', packageVersion(r.version))
      .replace('@ARCH@', PACKAGE_ARCH[r.arch].deb)
      .replace('@MAINTAINER@', top.maintainer)
      .replace('@INSTALLED_SIZE@', String(installedSizeKiB(t.root)))
      .replace('@DEPENDS@', depends);
    if (/@[A-Z_]+@/.test(control)) throw new Error(`control.in has an unfilled placeholder:\n${control}`);
    t.file('/DEBIAN/control', control, 0o644);
    const conffiles: readonly string[] = [ENV_FILE.deb];
    t.file('/DEBIAN/conffiles', conffiles.map((c) => `${c}\n`).join(''), 0o644);
    for (const script of ['postinst', 'prerm', 'postrm'])
      t.copy(`/DEBIAN/${script}`, join(PACKAGING, 'deb', script), 0o755);
    // md5sums of every shipped file except the conffiles (dpkg tracks those itself), as dh_md5sums.
    const sums: string[] = [];
    for (const rel of walk(t.root)) {
      if (rel.startsWith('DEBIAN') || conffiles.includes(`/${rel}`)) continue;
      const abs = join(t.root, rel);
      if (!lstatSync(abs).isFile()) continue;
      sums.push(`${createHash('md5').update(readFileSync(abs)).digest('hex')}  ${rel}\n`);
    }
    t.file('/DEBIAN/md5sums', sums.join(''), 0o644);
    normalise(t.root, r.epoch);

    mkdirSync(r.outDir, { recursive: true });
    const out = join(r.outDir, debFileName(r.version, r.arch));
    const tmpOut = join(work, 'out.deb');
    // dpkg-deb always uses liblzma's multi-threaded encoder, whose output does not depend on the
    // number of threads: the same .deb on any machine.
    const compression = { release: ['-Zxz', '-z6'], fast: ['-Zgzip', '-z1'], none: ['-Znone'] }[r.compression];
    await run('dpkg-deb', ['--root-owner-group', ...compression, '--build', t.root, tmpOut], {
      env: { ...process.env, SOURCE_DATE_EPOCH: String(r.epoch), LC_ALL: 'C.UTF-8' },
    });
    rmSync(out, { force: true });
    renameOrCopy(tmpOut, out);
    return out;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

function renameOrCopy(from: string, to: string): void {
  try {
    renameSync(from, to);
  } catch {
    copyFileSync(from, to);
  }
}

// ---------------------------------------------------------------------------------------------
// .rpm

export function rpmFileName(version: string, arch: Arch = 'x64'): string {
  return `${PACKAGE}-${packageVersion(version)}-${RPM_RELEASE}.${PACKAGE_ARCH[arch].rpm}.rpm`;
}

export async function buildRpm(opts: BuildOptions = {}): Promise<string> {
  const r = resolve(opts);
  const { entries } = readChangelog();
  const top = checkChangelog(entries, r, opts.version !== undefined);
  const work = workDir('rpm');
  try {
    const stage = join(work, 'stage');
    const t = tree(stage);
    stageCommon(t, r, ENV_FILE.rpm);
    t.copy(
      '/usr/lib/systemd/system-preset/80-gpu-device-plugin.preset',
      join(PACKAGING, 'rpm', '80-gpu-device-plugin.preset'),
      0o644,
    );
    t.file(`/usr/share/licenses/${PACKAGE}/copyright`, copyrightText(r.arch), 0o644);
    stageDocs(t, 'rpm');
    normalise(stage, r.epoch);

    let spec = readFileSync(join(PACKAGING, 'rpm', 'gpu-device-plugin.spec.in'), 'utf8')
      .replace('@VERSION@', packageVersion(r.version))
      .replace('@RELEASE@', RPM_RELEASE)
      .replace('@PACKAGER@', top.maintainer)
      .replace('@STAGE@', stage)
      .replace('@CHANGELOG@', rpmChangelog(entries));
    if (r.compression !== 'release')
      spec = spec.replace(
        '%global _binary_payload w6.xzdio',
        `%global _binary_payload ${r.compression === 'fast' ? 'w1.gzdio' : 'w.ufdio'}`,
      );
    if (/@[A-Z]+@/.test(spec.replace(/^#.*$/gm, ''))) throw new Error('spec template has an unfilled placeholder');
    const specFile = join(work, `${PACKAGE}.spec`);
    writeFileSync(specFile, spec);

    const top_ = join(work, 'rpmbuild');
    const rpmOut = join(work, 'rpms');
    for (const d of ['BUILD', 'BUILDROOT', 'SOURCES', 'SPECS', 'SRPMS']) mkdirSync(join(top_, d), { recursive: true });
    await run(
      'rpmbuild',
      [
        '-bb',
        '--quiet',
        '--target',
        PACKAGE_ARCH[r.arch].rpm,
        '--define',
        `_topdir ${top_}`,
        '--define',
        `_rpmdir ${rpmOut}`,
        '--define',
        '_build_name_fmt %{NAME}-%{VERSION}-%{RELEASE}.%{ARCH}.rpm',
        specFile,
      ],
      {
        cwd: work,
        // No user macros (~/.rpmmacros) and a fixed locale, so that builds do not depend on who runs them.
        env: { ...process.env, HOME: work, SOURCE_DATE_EPOCH: String(r.epoch), LC_ALL: 'C.UTF-8', TZ: 'UTC' },
      },
    );
    mkdirSync(r.outDir, { recursive: true });
    const name = rpmFileName(r.version, r.arch);
    const out = join(r.outDir, name);
    rmSync(out, { force: true });
    renameOrCopy(join(rpmOut, name), out);
    return out;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/** Both packages of one architecture, built at the same time. */
export async function buildPackages(opts: BuildOptions = {}): Promise<{ deb: string; rpm: string }> {
  const epoch = opts.sourceDateEpoch ?? sourceDateEpoch();
  const [deb, rpm] = await Promise.all([
    buildDeb({ ...opts, sourceDateEpoch: epoch }),
    buildRpm({ ...opts, sourceDateEpoch: epoch }),
  ]);
  return { deb, rpm };
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { arch: { type: 'string', default: 'all' } } });
  const arches = parseArch(values.arch);
  const t0 = performance.now();
  const epoch = sourceDateEpoch();
  const built = await Promise.all(arches.map((arch) => buildPackages({ arch, sourceDateEpoch: epoch })));
  for (const p of built.flatMap(({ deb, rpm }) => [deb, rpm])) {
    const size = lstatSync(p).size;
    process.stdout.write(`built ${relative(process.cwd(), p)} (${(size / 1024 / 1024).toFixed(1)} MiB)\n`);
    if (size > MAX_PACKAGE_BYTES) throw new Error(`${p} is ${size} bytes, over the ${MAX_PACKAGE_BYTES}-byte limit`);
  }
  process.stdout.write(`in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
}
