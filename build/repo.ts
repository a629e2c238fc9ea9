// npm run repo → a signed apt repository and a signed yum/dnf repository of the packages that
// `npm run package` built, laid out so that any static web server or object store serves the tree as
// it is. One repository per minor version, as pkgs.k8s.io does, so that an operator's sources pin a
// minor version and get its patch releases:
//
//   <out>/v0.1/deb/Release.key                               the public key (armored), for /etc/apt/keyrings
//   <out>/v0.1/deb/dists/stable/{Release,InRelease,Release.gpg}
//   <out>/v0.1/deb/dists/stable/main/binary-{amd64,arm64}/Packages{,.gz}
//   <out>/v0.1/deb/pool/main/g/gpu-device-plugin/*.deb
//   <out>/v0.1/rpm/{x86_64,aarch64}/*.rpm                   signed with rpmsign --addsign
//   <out>/v0.1/rpm/repodata/{repomd.xml,repomd.xml.asc,repomd.xml.key,…}
//
// Every index is written by Debian's tools: apt-ftparchive (apt-utils) for Packages and Release,
// createrepo_c for repodata, gpg for the signatures, rpmsign for the packages. Packages already in
// <out> stay there and are indexed again with the new ones: keeping the tree (or syncing it back
// from where it is served) and running this for each release adds that release to its channel.
//
// The key is the operator's: a GnuPG home directory holding the secret key (--gnupg-home,
// GDP_REPO_GNUPGHOME) or an exported armored secret key (--signing-key FILE, GDP_REPO_SIGNING_KEY,
// imported into a throw-away home for the run); --key-id (GDP_REPO_KEY_ID) picks one of several. The
// key must sign without asking for a passphrase (an unprotected key, or one gpg-agent has unlocked).
// Without a key this refuses. Dates in the indexes are SOURCE_DATE_EPOCH (the commit time unless
// set), so the same packages give the same Packages, Release and repodata contents; the signatures
// carry the time they were made.
import { execFile } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, relative } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { PACKAGE, ROOT, debFileName, projectVersion, rpmFileName, sourceDateEpoch } from './package.ts';

const execFileAsync = promisify(execFile);

/** The apt suite and component every channel uses: `deb [signed-by=…] <base>/v0.1/deb stable main`. */
export const SUITE = 'stable';
export const COMPONENT = 'main';
export const DEB_ARCHES = ['amd64', 'arm64'] as const;
/** Where each channel keeps its public key for operators (the names pkgs.k8s.io uses). */
export const DEB_KEY = 'Release.key';
export const RPM_KEY = 'repodata/repomd.xml.key';

export type SigningKey = { gnupgHome: string } | { armoredKeyFile: string };

export interface RepoOptions {
  /** The .deb and .rpm files to publish. */
  packages: readonly string[];
  /** The tree's root: channels go in <outDir>/v<major>.<minor>/. */
  outDir: string;
  signing: SigningKey;
  /** Fingerprint or key ID, when the home holds several secret keys. */
  keyId?: string | undefined;
  /** Date of the indexes; default SOURCE_DATE_EPOCH, else the commit time. */
  sourceDateEpoch?: number;
  /** The channel's name instead of v<major>.<minor> of the packages' version (tests: another vendor's repository). */
  channel?: string;
  /** Origin and Label of the apt Release file; default the package's name. */
  origin?: string;
}

export interface Channel {
  name: string;
  deb: string;
  rpm: string;
}

interface PackageFile {
  file: string;
  kind: 'deb' | 'rpm';
  name: string;
  version: string;
  arch: string;
}

async function run(cmd: string, args: readonly string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv } = {}) {
  try {
    return await execFileAsync(cmd, args, {
      cwd: opts.cwd,
      env: opts.env ?? { ...process.env, LC_ALL: 'C.UTF-8' },
      encoding: 'utf8',
      maxBuffer: 64 * 1024 * 1024,
    });
  } catch (err) {
    const e = err as { code?: unknown; stderr?: string; stdout?: string };
    if (e.code === 'ENOENT')
      throw new Error(`${cmd} is not installed: run build/install-tools.sh (apt-utils, createrepo-c, gnupg, rpm)`);
    throw new Error(`${cmd} ${args.join(' ')} failed: ${e.stderr ?? ''}${e.stdout ?? ''}`.trim(), { cause: err });
  }
}

async function describe(file: string): Promise<PackageFile> {
  if (file.endsWith('.deb')) {
    const { stdout } = await run('dpkg-deb', ['--show', `--showformat=\${Package} \${Version} \${Architecture}`, file]);
    const [name = '', version = '', arch = ''] = stdout.trim().split(' ');
    return { file, kind: 'deb', name, version, arch };
  }
  if (file.endsWith('.rpm')) {
    const { stdout } = await run('rpm', ['-qp', '--nosignature', '--qf', '%{NAME} %{VERSION} %{ARCH}', file]);
    const [name = '', version = '', arch = ''] = stdout.trim().split(' ');
    return { file, kind: 'rpm', name, version, arch };
  }
  throw new Error(`${file}: neither a .deb nor an .rpm`);
}

/** The channel a version belongs to: v<major>.<minor>. */
export function channelOf(version: string): string {
  const m = /^(\d+)\.(\d+)\./.exec(version);
  if (m === null) throw new Error(`version ${JSON.stringify(version)} has no major.minor`);
  return `v${m[1]}.${m[2]}`;
}

/** A GnuPG home to sign with, and the fingerprint of the key; done() removes what was made for the run. */
interface Signer {
  home: string;
  fingerprint: string;
  done(): Promise<void>;
}

async function gpg(home: string, args: readonly string[]): Promise<string> {
  return (await run('gpg', ['--homedir', home, '--batch', '--no-tty', '--yes', ...args])).stdout;
}

async function signer(key: SigningKey, keyId: string | undefined): Promise<Signer> {
  let home: string;
  let made = false;
  if ('gnupgHome' in key) {
    if (!existsSync(key.gnupgHome)) throw new Error(`the GnuPG home ${key.gnupgHome} does not exist`);
    home = key.gnupgHome;
  } else {
    if (!existsSync(key.armoredKeyFile)) throw new Error(`the signing key file ${key.armoredKeyFile} does not exist`);
    home = mkdtempSync(join(tmpdir(), 'gdp-repo-gnupg-'));
    made = true;
    await gpg(home, ['--import', key.armoredKeyFile]);
  }
  const done = async (): Promise<void> => {
    if (!made) return;
    await run('gpgconf', ['--homedir', home, '--kill', 'gpg-agent']).catch(() => undefined);
    rmSync(home, { recursive: true, force: true });
  };
  try {
    const listing = await gpg(home, ['--with-colons', '--list-secret-keys', ...(keyId === undefined ? [] : [keyId])]);
    // A primary key (sec) with its fingerprint (fpr) on the next record; the key must be able to sign.
    const keys: { fpr: string; sign: boolean }[] = [];
    let cur: { fpr: string; sign: boolean } | undefined;
    for (const line of listing.split('\n')) {
      const f = line.split(':');
      if (f[0] === 'sec') {
        cur = { fpr: '', sign: /S/.test(f[11] ?? '') };
        keys.push(cur);
      } else if (f[0] === 'fpr' && cur !== undefined && cur.fpr === '') cur.fpr = f[9] ?? '';
    }
    const usable = keys.filter((k) => k.sign && k.fpr !== '');
    if (usable.length === 0)
      throw new Error(`no secret key that can sign in ${home}${keyId ? ` matching ${keyId}` : ''}`);
    if (usable.length > 1)
      throw new Error(
        `${home} holds ${usable.length} secret signing keys ` +
          `(${usable.map((k) => k.fpr).join(', ')}): pick one with --key-id`,
      );
    return { home, fingerprint: usable[0]!.fpr, done };
  } catch (err) {
    await done();
    throw err;
  }
}

function rfc2822(epoch: number): string {
  return new Date(epoch * 1000).toUTCString().replace(/GMT$/, 'UTC');
}

/** Replaces a file with new content by rename (readers of a served tree never see half a file). */
function replaceFile(path: string, content: string | Buffer): void {
  writeFileSync(`${path}.tmp`, content);
  renameSync(`${path}.tmp`, path);
}

async function debChannel(dir: string, debs: readonly PackageFile[], s: Signer, epoch: number, origin: string) {
  const pool = join(dir, 'pool', COMPONENT, PACKAGE[0] ?? 'g', PACKAGE);
  mkdirSync(pool, { recursive: true });
  for (const p of debs) copyFileSync(p.file, join(pool, basename(p.file)));
  const dist = join(dir, 'dists', SUITE);
  for (const arch of DEB_ARCHES) {
    const at = join(dist, COMPONENT, `binary-${arch}`);
    mkdirSync(at, { recursive: true });
    // Filename: fields relative to the repository's root, so apt-ftparchive runs there.
    const { stdout } = await run('apt-ftparchive', ['--arch', arch, 'packages', 'pool'], { cwd: dir });
    replaceFile(join(at, 'Packages'), stdout);
    replaceFile(join(at, 'Packages.gz'), gzipSync(stdout, { level: 9 }));
  }
  for (const f of ['Release', 'InRelease', 'Release.gpg']) rmSync(join(dist, f), { force: true });
  const field = (name: string, value: string): string[] => ['-o', `APT::FTPArchive::Release::${name}=${value}`];
  const { stdout: release } = await run(
    'apt-ftparchive',
    [
      ...field('Origin', origin),
      ...field('Label', origin),
      ...field('Suite', SUITE),
      ...field('Codename', SUITE),
      ...field('Architectures', DEB_ARCHES.join(' ')),
      ...field('Components', COMPONENT),
      ...field('Description', `${origin} packages`),
      ...field('Date', rfc2822(epoch)),
      'release',
      dist,
    ],
    { cwd: dir },
  );
  replaceFile(join(dist, 'Release'), release);
  const sign = ['--local-user', s.fingerprint, '--digest-algo', 'SHA512'];
  await gpg(s.home, [...sign, '--clearsign', '--output', join(dist, 'InRelease.tmp'), join(dist, 'Release')]);
  await gpg(s.home, [
    ...sign,
    '--armor',
    '--detach-sign',
    '--output',
    join(dist, 'Release.gpg.tmp'),
    join(dist, 'Release'),
  ]);
  renameSync(join(dist, 'InRelease.tmp'), join(dist, 'InRelease'));
  renameSync(join(dist, 'Release.gpg.tmp'), join(dist, 'Release.gpg'));
  replaceFile(join(dir, DEB_KEY), await gpg(s.home, ['--armor', '--export', s.fingerprint]));
}

async function rpmDigests(file: string): Promise<string> {
  const q = ['-qp', '--nosignature', '--qf', '%{SHA256HEADER} %{PAYLOADDIGEST}', file];
  return (await run('rpm', q)).stdout;
}

async function rpmChannel(dir: string, rpms: readonly PackageFile[], s: Signer, epoch: number) {
  const added: string[] = [];
  for (const p of rpms) {
    mkdirSync(join(dir, p.arch), { recursive: true });
    const to = join(dir, p.arch, basename(p.file));
    // The same package published again keeps its signed copy (and the tree its bytes): signing adds to
    // the signature header only, so the header and payload digests tell the unsigned build's copy.
    if (existsSync(to) && (await rpmDigests(to)) === (await rpmDigests(p.file))) continue;
    copyFileSync(p.file, to);
    added.push(to);
  }
  if (added.length > 0) {
    // No ~/.rpmmacros of whoever runs this: HOME is a throw-away directory.
    const home = mkdtempSync(join(tmpdir(), 'gdp-repo-rpm-'));
    try {
      await run(
        'rpmsign',
        [
          '--addsign',
          // Debian's rpm names gpg2, which Debian no longer ships: the gpg that signed the rest.
          '--define',
          `__gpg ${(await run('sh', ['-c', 'command -v gpg'])).stdout.trim()}`,
          '--define',
          `_gpg_name ${s.fingerprint}`,
          '--define',
          `_gpg_path ${s.home}`,
          ...added,
        ],
        { env: { ...process.env, HOME: home, LC_ALL: 'C.UTF-8' } },
      );
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  }
  // No sqlite databases (not reproducible; dnf and yum read the XML), dates from SOURCE_DATE_EPOCH.
  await run('createrepo_c', [
    '--quiet',
    '--no-database',
    '--revision',
    String(epoch),
    '--set-timestamp-to-revision',
    dir,
  ]);
  const repomd = join(dir, 'repodata', 'repomd.xml');
  await gpg(s.home, [
    '--local-user',
    s.fingerprint,
    '--digest-algo',
    'SHA512',
    '--armor',
    '--detach-sign',
    '--output',
    `${repomd}.asc`,
    repomd,
  ]);
  replaceFile(join(dir, RPM_KEY), await gpg(s.home, ['--armor', '--export', s.fingerprint]));
}

/** Publishes the packages into their channels of the tree under outDir, signed; returns the channels written. */
export async function buildRepository(opts: RepoOptions): Promise<Channel[]> {
  if (opts.packages.length === 0) throw new Error('no packages to publish');
  const described = await Promise.all(opts.packages.map(describe));
  const epoch = opts.sourceDateEpoch ?? sourceDateEpoch();
  const byChannel = new Map<string, PackageFile[]>();
  for (const p of described) {
    const ch = opts.channel ?? channelOf(p.version);
    byChannel.set(ch, [...(byChannel.get(ch) ?? []), p]);
  }
  const s = await signer(opts.signing, opts.keyId);
  try {
    const channels: Channel[] = [];
    for (const [name, files] of byChannel) {
      const ch = { name, deb: join(opts.outDir, name, 'deb'), rpm: join(opts.outDir, name, 'rpm') };
      const debs = files.filter((f) => f.kind === 'deb');
      const rpms = files.filter((f) => f.kind === 'rpm');
      if (debs.length > 0) await debChannel(ch.deb, debs, s, epoch, opts.origin ?? PACKAGE);
      if (rpms.length > 0) await rpmChannel(ch.rpm, rpms, s, epoch);
      channels.push(ch);
    }
    return channels;
  } finally {
    await s.done();
  }
}

/** The signing key from options or the environment; a clear refusal naming what to pass when there is none. */
export function signingKeyFrom(values: { 'gnupg-home'?: string; 'signing-key'?: string }): SigningKey {
  const home = values['gnupg-home'] ?? process.env.GDP_REPO_GNUPGHOME ?? '';
  const file = values['signing-key'] ?? process.env.GDP_REPO_SIGNING_KEY ?? '';
  if (home !== '' && file !== '') throw new Error('give either a GnuPG home or a signing key file, not both');
  if (home !== '') return { gnupgHome: home };
  if (file !== '') return { armoredKeyFile: file };
  throw new Error(
    'no signing key: pass --gnupg-home DIR (or GDP_REPO_GNUPGHOME=DIR), a GnuPG home holding the secret key, ' +
      'or --signing-key FILE (or GDP_REPO_SIGNING_KEY=FILE), a secret key exported with ' +
      '`gpg --armor --export-secret-keys KEYID`; with several keys there, add --key-id (GDP_REPO_KEY_ID)',
  );
}

/**
 * A throw-away signing key (RSA 3072, no passphrase, no expiry) in a new GnuPG home, for tests and
 * for trying the repository out; returns the home, the fingerprint and the armored secret key.
 */
export async function throwawayKey(
  dir: string,
  name = 'gpu-device-plugin test repository',
): Promise<{
  home: string;
  fingerprint: string;
  secretKeyFile: string;
}> {
  const home = join(dir, 'gnupg');
  mkdirSync(home, { recursive: true, mode: 0o700 });
  await gpg(home, [
    '--passphrase',
    '',
    '--quick-generate-key',
    `${name} <repo@example.invalid>`,
    'rsa3072',
    'sign',
    'never',
  ]);
  const s = await signer({ gnupgHome: home }, undefined);
  const secretKeyFile = join(dir, 'secret-key.asc');
  writeFileSync(secretKeyFile, await gpg(home, ['--armor', '--export-secret-keys', s.fingerprint]), { mode: 0o600 });
  return { home, fingerprint: s.fingerprint, secretKeyFile };
}

/** Stops the gpg-agent a GnuPG home started (tests remove the home afterwards). */
export async function stopAgent(home: string): Promise<void> {
  await run('gpgconf', ['--homedir', home, '--kill', 'gpg-agent']).catch(() => undefined);
}

/** Files of a tree, relative and sorted (for the reproducibility check and the listing printed). */
export function listTree(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => relative(dir, join(e.parentPath, e.name)))
    .sort();
}

/** A path as the operator will read it: relative to the working directory when inside it. */
function shown(path: string): string {
  const rel = relative(process.cwd(), path);
  return rel.startsWith('..') ? path : rel;
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      out: { type: 'string', default: join(ROOT, 'dist', 'repo') },
      version: { type: 'string' },
      'gnupg-home': { type: 'string' },
      'signing-key': { type: 'string' },
      'key-id': { type: 'string' },
    },
  });
  const signing = signingKeyFrom(values);
  let packages = positionals;
  if (packages.length === 0) {
    const version = values.version ?? projectVersion();
    packages = (['x64', 'arm64'] as const).flatMap((arch) => [
      join(ROOT, 'dist', debFileName(version, arch)),
      join(ROOT, 'dist', rpmFileName(version, arch)),
    ]);
    const missing = packages.filter((p) => !existsSync(p));
    if (missing.length > 0) throw new Error(`missing ${missing.map(shown).join(', ')}: run npm run package first`);
  }
  const t0 = performance.now();
  const keyId = values['key-id'] ?? (process.env.GDP_REPO_KEY_ID || undefined);
  const channels = await buildRepository({ packages, outDir: values.out, signing, keyId });
  for (const ch of channels) {
    process.stdout.write(`${ch.name}:\n`);
    for (const d of [ch.deb, ch.rpm])
      if (existsSync(d)) for (const f of listTree(d)) process.stdout.write(`  ${shown(join(d, f))}\n`);
  }
  process.stdout.write(`in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
}

if (import.meta.main) {
  await main().catch((err: unknown) => {
    process.stderr.write(`npm run repo: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(2);
  });
}
