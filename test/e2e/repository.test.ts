// The signed apt and yum repositories of build/repo.ts (`npm run repo`), checked with the package
// managers' own tools: apt-get update in a private apt root (its own Dir, status file and keyring;
// nothing of the host's apt configuration) against a file:// source with signed-by, refusing a
// tampered InRelease, Release, Packages, another key and an unsigned repository; rpmkeys --checksig
// on the signed rpms; dnf repoquery (Debian 12's dnf) with gpgcheck and repo_gpgcheck against a
// file:// repository, refusing a tampered repomd.xml and a missing signature. A throw-away key signs.
//
// The packages are built uncompressed (compression 'none') from the x64 executable for both
// architectures: the repository indexes and signs packages, whatever executable they hold.
// Needs the tools build/install-tools.sh installs (apt-utils, createrepo-c, dnf, gnupg, rpm).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { buildExecutable, executablePath } from '../../build/build.ts';
import { PACKAGE, ROOT, buildDeb, buildRpm, projectVersion } from '../../build/package.ts';
import {
  DEB_KEY,
  RPM_KEY,
  SUITE,
  buildRepository,
  channelOf,
  listTree,
  stopAgent,
  throwawayKey,
} from '../../build/repo.ts';

const VERSION = projectVersion();
const CHANNEL = channelOf(VERSION);
/** A patch release of the same minor version: the same channel. */
const PATCH = VERSION.replace(/\.(\d+)$/, (_, p: string) => `.${Number(p) + 1}`);
/** The next minor version: a channel of its own. */
const MINOR = VERSION.replace(/^(\d+)\.(\d+)\.\d+/, (_, a: string, b: string) => `${a}.${Number(b) + 1}.0`);

interface Run {
  code: number;
  out: string;
}

function exec(cmd: string, args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      cmd,
      args,
      { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, env: { PATH: process.env.PATH, LC_ALL: 'C.UTF-8', ...env } },
      (err, stdout, stderr) => {
        const code = err === null ? 0 : typeof err.code === 'number' ? err.code : -1;
        resolve({ code, out: `${stdout}${stderr}${err !== null && code === -1 ? err.message : ''}` });
      },
    );
  });
}

let work: string;
let tree: string;
let key: Awaited<ReturnType<typeof throwawayKey>>;
let packages: { deb: string; debArm: string; rpm: string; rpmArm: string; patch: string; minor: string };
const timings: string[] = [];

const debDir = (root = tree, ch = CHANNEL): string => join(root, ch, 'deb');
const rpmDir = (root = tree, ch = CHANNEL): string => join(root, ch, 'rpm');

/**
 * apt-get in a private root: its own configuration (APT_CONFIG), lists, cache and an empty dpkg
 * status; the only key it trusts is the one its sources line names with signed-by.
 */
function aptRoot(name: string, repo: string, keyFile: string): { apt: (...args: string[]) => Promise<Run> } {
  const r = join(work, 'apt', name);
  for (const d of ['etc/apt/apt.conf.d', 'etc/apt/sources.list.d', 'etc/apt/keyrings', 'var/lib/apt/lists/partial'])
    mkdirSync(join(r, d), { recursive: true });
  mkdirSync(join(r, 'var/cache/apt/archives/partial'), { recursive: true });
  mkdirSync(join(r, 'var/lib/dpkg'), { recursive: true });
  writeFileSync(join(r, 'var/lib/dpkg/status'), '');
  cpSync(keyFile, join(r, 'etc/apt/keyrings/gpu-device-plugin.asc'));
  writeFileSync(
    join(r, 'etc/apt/sources.list.d/gpu-device-plugin.list'),
    `deb [signed-by=${r}/etc/apt/keyrings/gpu-device-plugin.asc] file://${repo} ${SUITE} main\n`,
  );
  const conf = join(r, 'apt.conf');
  writeFileSync(
    conf,
    [
      `Dir "${r}/";`,
      `Dir::State::status "${r}/var/lib/dpkg/status";`,
      'APT::Architecture "amd64";',
      'APT::Architectures { "amd64"; "arm64"; };',
      'Acquire::Languages "none";',
      'Debug::NoLocking "true";',
      'APT::Sandbox::User "root";',
      '',
    ].join('\n'),
  );
  return { apt: (...args) => exec(args[0] === 'policy' ? 'apt-cache' : 'apt-get', args, { APT_CONFIG: conf }) };
}

/** A copy of a channel's apt indexes (dists/ only: apt-get update reads nothing else) to tamper with. */
function distsCopy(name: string): string {
  const to = join(work, 'tampered', name);
  cpSync(join(debDir(), 'dists'), join(to, 'dists'), { recursive: true });
  return to;
}

function dnf(name: string, repo: string, keyUrl: string): Promise<Run> {
  const d = join(work, 'dnf', name);
  mkdirSync(join(d, 'root'), { recursive: true });
  writeFileSync(join(d, 'dnf.conf'), `[main]\ncachedir=${d}/cache\nreposdir=${d}/none\n`);
  return exec('dnf', [
    '-q',
    '-y',
    '--config',
    join(d, 'dnf.conf'),
    '--installroot',
    join(d, 'root'),
    '--releasever',
    '1',
    '--repofrompath',
    `gpu-device-plugin,file://${repo}`,
    '--repo',
    'gpu-device-plugin',
    '--setopt=gpu-device-plugin.gpgcheck=1',
    '--setopt=gpu-device-plugin.repo_gpgcheck=1',
    `--setopt=gpu-device-plugin.gpgkey=${keyUrl}`,
    'repoquery',
    '--qf',
    '%{name} %{version} %{arch}',
  ]);
}

describe('npm run repo: signed apt and yum repositories', { concurrency: false }, () => {
  before(async () => {
    const t0 = performance.now();
    work = mkdtempSync(join(tmpdir(), 'gdp-repo-'));
    tree = join(work, 'tree');
    const exe = executablePath('x64');
    if (!existsSync(exe)) await buildExecutable();
    const out = join(work, 'packages');
    const opts = { executable: exe, outDir: out, compression: 'none' } as const;
    const [deb, debArm, rpm, rpmArm, patch, minor, k] = await Promise.all([
      buildDeb(opts),
      buildDeb({ ...opts, arch: 'arm64' }),
      buildRpm(opts),
      buildRpm({ ...opts, arch: 'arm64' }),
      buildDeb({ ...opts, version: PATCH }),
      buildDeb({ ...opts, version: MINOR }),
      throwawayKey(join(work, 'key')),
    ]);
    packages = { deb, debArm, rpm, rpmArm, patch, minor };
    key = k;
    timings.push(`six packages and a key: ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    const t1 = performance.now();
    await buildRepository({
      packages: [deb, debArm, rpm, rpmArm],
      outDir: tree,
      signing: { armoredKeyFile: key.secretKeyFile },
    });
    timings.push(`repository (four packages): ${((performance.now() - t1) / 1000).toFixed(1)} s`);
  });

  after(async () => {
    if (key !== undefined) await stopAgent(key.home);
    if (work !== undefined) rmSync(work, { recursive: true, force: true });
    process.stderr.write(`repository test timings:\n  ${timings.join('\n  ')}\n`);
  });

  test('without a key, npm run repo refuses and names what to pass', async () => {
    const env = { GDP_REPO_GNUPGHOME: '', GDP_REPO_SIGNING_KEY: '' };
    const r = await exec(
      process.execPath,
      [join(ROOT, 'build', 'repo.ts'), '--out', join(work, 'none'), packages.deb],
      env,
    );
    assert.equal(r.code, 2, r.out);
    assert.match(r.out, /^npm run repo: no signing key: pass --gnupg-home DIR \(or GDP_REPO_GNUPGHOME=DIR\)/);
    assert.match(r.out, /--signing-key FILE \(or GDP_REPO_SIGNING_KEY=FILE\)/);
    assert.equal(existsSync(join(work, 'none')), false, 'nothing written');
  });

  test('the layout: one channel per minor version with dists/, the pool, repodata/ and the public keys', () => {
    const deb = listTree(debDir());
    for (const f of [
      DEB_KEY,
      `dists/${SUITE}/Release`,
      `dists/${SUITE}/InRelease`,
      `dists/${SUITE}/Release.gpg`,
      `dists/${SUITE}/main/binary-amd64/Packages`,
      `dists/${SUITE}/main/binary-amd64/Packages.gz`,
      `dists/${SUITE}/main/binary-arm64/Packages`,
      `dists/${SUITE}/main/binary-arm64/Packages.gz`,
    ])
      assert.ok(deb.includes(f), `${f} in ${deb.join(', ')}`);
    assert.equal(deb.filter((f) => f.startsWith(`pool/main/g/${PACKAGE}/`) && f.endsWith('.deb')).length, 2);
    const rpm = listTree(rpmDir());
    for (const f of ['repodata/repomd.xml', 'repodata/repomd.xml.asc', RPM_KEY])
      assert.ok(rpm.includes(f), `${f} in ${rpm.join(', ')}`);
    assert.ok(
      rpm.some((f) => /^x86_64\/.*\.x86_64\.rpm$/.test(f)) && rpm.some((f) => /^aarch64\/.*\.aarch64\.rpm$/.test(f)),
    );
    const release = readFileSync(join(debDir(), 'dists', SUITE, 'Release'), 'utf8');
    assert.match(release, /^Architectures: amd64 arm64$/m);
    assert.match(release, /^Components: main$/m);
    assert.match(release, new RegExp(`^Suite: ${SUITE}$`, 'm'));
  });

  test(
    'apt-get update verifies the signature with signed-by; both ' +
      'architectures are candidates; apt-get download checks the hash',
    async () => {
      const t0 = performance.now();
      const { apt } = aptRoot('good', debDir(), join(debDir(), DEB_KEY));
      const u = await apt('update');
      assert.equal(u.code, 0, u.out);
      assert.doesNotMatch(u.out, /^(W|E):/m, u.out);
      timings.push(`apt-get update: ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      const policy = await apt('policy', PACKAGE, `${PACKAGE}:arm64`);
      assert.equal(policy.code, 0, policy.out);
      assert.equal(
        policy.out.match(new RegExp(`Candidate: ${VERSION.replace(/\./g, '\\.')}$`, 'gm'))?.length,
        2,
        policy.out,
      );
      const dl = join(work, 'download');
      mkdirSync(dl);
      const d = await exec('sh', ['-c', `cd ${dl} && apt-get download ${PACKAGE}`], {
        APT_CONFIG: join(work, 'apt', 'good', 'apt.conf'),
      });
      assert.equal(d.code, 0, d.out);
      assert.ok(readFileSync(join(dl, `${PACKAGE}_${VERSION}_amd64.deb`)).equals(readFileSync(packages.deb)));
    },
  );

  const refusals: [string, () => string, RegExp, string?][] = [
    [
      'a tampered InRelease',
      () => {
        const d = distsCopy('inrelease');
        const f = join(d, 'dists', SUITE, 'InRelease');
        writeFileSync(f, readFileSync(f, 'utf8').replace('Suite: stable', 'Suite: stablE'));
        return d;
      },
      /BADSIG|The following signatures were invalid/,
    ],
    [
      'a tampered Release (no InRelease: Release and Release.gpg)',
      () => {
        const d = distsCopy('release');
        rmSync(join(d, 'dists', SUITE, 'InRelease'));
        const f = join(d, 'dists', SUITE, 'Release');
        writeFileSync(f, readFileSync(f, 'utf8').replace('Suite: stable', 'Suite: stablE'));
        return d;
      },
      /BADSIG|The following signatures were invalid/,
    ],
    [
      'a tampered Packages (and Packages.gz)',
      () => {
        const d = distsCopy('packages');
        const f = join(d, 'dists', SUITE, 'main', 'binary-amd64', 'Packages');
        const text = readFileSync(f, 'utf8').replace(
          /^Maintainer: .*$/m,
          'Maintainer: someone else <x@example.invalid>',
        );
        writeFileSync(f, text);
        writeFileSync(`${f}.gz`, gzipSync(text));
        return d;
      },
      /Hash Sum mismatch|File has unexpected size/,
    ],
    [
      'an unsigned repository (no InRelease, no Release.gpg)',
      () => {
        const d = distsCopy('unsigned');
        rmSync(join(d, 'dists', SUITE, 'InRelease'));
        rmSync(join(d, 'dists', SUITE, 'Release.gpg'));
        return d;
      },
      /is not signed/,
    ],
    ['a repository signed by another key than signed-by names', () => debDir(), /NO_PUBKEY|is not signed/, 'other'],
  ];
  for (const [what, make, refused, otherKey] of refusals) {
    test(`apt-get update refuses ${what}`, async () => {
      let keyFile = join(debDir(), DEB_KEY);
      if (otherKey !== undefined) {
        const other = await throwawayKey(join(work, 'other-key'), 'someone else');
        await stopAgent(other.home);
        keyFile = join(work, 'other-key', 'public.asc');
        const r = await exec('gpg', ['--homedir', other.home, '--batch', '--armor', '--export', other.fingerprint]);
        writeFileSync(keyFile, r.out);
      }
      const { apt } = aptRoot(what.replace(/\W+/g, '-'), make(), keyFile);
      const u = await apt('update');
      assert.notEqual(u.code, 0, u.out);
      assert.match(u.out, refused);
      const policy = await apt('policy', PACKAGE);
      assert.doesNotMatch(policy.out, /Candidate: \d/, `nothing of the refused repository is used:\n${policy.out}`);
    });
  }

  test('rpmkeys --checksig: every rpm carries a V4 signature of the key; a changed byte fails it', async () => {
    const db = join(work, 'rpmdb');
    mkdirSync(db);
    const imp = await exec('rpmkeys', ['--dbpath', db, '--import', join(rpmDir(), RPM_KEY)]);
    assert.equal(imp.code, 0, imp.out);
    const id = key.fingerprint.slice(-8).toLowerCase();
    for (const arch of ['x86_64', 'aarch64']) {
      const rpm = join(rpmDir(), arch, `${PACKAGE}-${VERSION}-1.${arch}.rpm`);
      const r = await exec('rpmkeys', ['--dbpath', db, '--checksig', '-v', rpm]);
      assert.equal(r.code, 0, r.out);
      assert.match(r.out, new RegExp(`Header V4 RSA/SHA512 Signature, key ID ${id}: OK`), r.out);
    }
    const bad = join(work, 'tampered.rpm');
    const bytes = readFileSync(join(rpmDir(), 'x86_64', `${PACKAGE}-${VERSION}-1.x86_64.rpm`));
    bytes[bytes.length - 4096] = (bytes[bytes.length - 4096] ?? 0) ^ 0xff;
    writeFileSync(bad, bytes);
    const r = await exec('rpmkeys', ['--dbpath', db, '--checksig', bad]);
    assert.notEqual(r.code, 0, r.out);
    assert.match(r.out, /NOT OK/);
  });

  test(
    'dnf repoquery with gpgcheck=1 and repo_gpgcheck=1 reads the ' +
      'repository; a tampered repomd.xml or a missing signature is refused',
    async () => {
      const t0 = performance.now();
      const keyUrl = `file://${join(rpmDir(), RPM_KEY)}`;
      const ok = await dnf('good', rpmDir(), keyUrl);
      timings.push(`dnf repoquery: ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      assert.equal(ok.code, 0, ok.out);
      assert.match(ok.out, new RegExp(`^${PACKAGE} ${VERSION.replace(/\./g, '\\.')} x86_64$`, 'm'));
      assert.match(ok.out, new RegExp(`^${PACKAGE} ${VERSION.replace(/\./g, '\\.')} aarch64$`, 'm'));

      const tampered = join(work, 'tampered', 'rpm');
      cpSync(join(rpmDir(), 'repodata'), join(tampered, 'repodata'), { recursive: true });
      const repomd = join(tampered, 'repodata', 'repomd.xml');
      writeFileSync(repomd, readFileSync(repomd, 'utf8').replace(/<revision>(\d+)</, '<revision>1$1<'));
      const bad = await dnf('tampered', tampered, keyUrl);
      assert.notEqual(bad.code, 0, bad.out);
      assert.match(bad.out, /repomd\.xml GPG signature verification error: Bad GPG signature/);

      rmSync(`${repomd}.asc`);
      writeFileSync(repomd, readFileSync(join(rpmDir(), 'repodata', 'repomd.xml')));
      const unsigned = await dnf('unsigned', tampered, keyUrl);
      assert.notEqual(unsigned.code, 0, unsigned.out);
      assert.match(unsigned.out, /GPG verification is enabled, but GPG signature is not available/);
    },
  );

  test(
    'published again from the same packages: every file is the same ' +
      'but the three signatures; another tree gets the same apt indexes',
    async () => {
      const before = new Map(listTree(tree).map((f) => [f, readFileSync(join(tree, f))]));
      const all = [packages.deb, packages.debArm, packages.rpm, packages.rpmArm];
      const t0 = performance.now();
      await buildRepository({ packages: all, outDir: tree, signing: { gnupgHome: key.home } });
      timings.push(`repository again, same tree: ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      const signatures = [`dists/${SUITE}/InRelease`, `dists/${SUITE}/Release.gpg`, 'repodata/repomd.xml.asc'];
      assert.deepEqual(listTree(tree), [...before.keys()]);
      for (const [f, bytes] of before)
        if (!signatures.some((s) => f.endsWith(s)))
          assert.ok(readFileSync(join(tree, f)).equals(bytes), `${f} changed`);
      const other = join(work, 'tree2');
      await buildRepository({ packages: all, outDir: other, signing: { armoredKeyFile: key.secretKeyFile } });
      for (const f of listTree(join(other, CHANNEL, 'deb')).filter((f) =>
        /(^|\/)(Packages(\.gz)?|Release|Release\.key)$/.test(f),
      ))
        assert.ok(readFileSync(join(debDir(other), f)).equals(readFileSync(join(debDir(), f))), `${f} differs`);
    },
  );

  test(
    'a patch release joins its minor version channel (both versions ' +
      'listed); the next minor version gets a channel of its own',
    async () => {
      await buildRepository({
        packages: [packages.patch, packages.minor],
        outDir: tree,
        signing: { armoredKeyFile: key.secretKeyFile },
      });
      const next = channelOf(MINOR);
      assert.notEqual(next, CHANNEL);
      assert.ok(existsSync(join(debDir(tree, next), 'dists', SUITE, 'InRelease')));
      const { apt } = aptRoot('channels', debDir(), join(debDir(), DEB_KEY));
      const u = await apt('update');
      assert.equal(u.code, 0, u.out);
      const policy = await apt('policy', PACKAGE);
      assert.match(policy.out, new RegExp(`Candidate: ${PATCH.replace(/\./g, '\\.')}$`, 'm'), policy.out);
      assert.match(policy.out, new RegExp(`^ +${VERSION.replace(/\./g, '\\.')} 500$`, 'm'), policy.out);
      assert.doesNotMatch(
        policy.out,
        new RegExp(MINOR.replace(/\./g, '\\.')),
        'the next minor version is not in this channel',
      );
    },
  );
});
