// Builds our own C library (src/native/*.c, the GPU health thread) for one architecture:
// gcc for x64, aarch64-linux-gnu-gcc for arm64 (both installed by build/install-tools.sh). The flags
// are fixed and no path of the build machine reaches the output (-ffile-prefix-map, no debug
// information, stripped), and the sources are compiled in the fixed order of NATIVE_SOURCES, so two
// builds of the same tree are byte-identical.
//
//   buildNativeLibrary(arch, outFile)  the build embeds the result in the executable (build.ts)
//   ensureNativeLibrary(arch)          runs from source: .cache/native/<arch>/nvml-watch.so, rebuilt
//                                      when the source or this file is newer
//   node build/native.ts [--arch x64|arm64|all]
import { execFile } from 'node:child_process';
import { mkdirSync, renameSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { parseArch } from './runtime.ts';
import type { Arch } from './runtime.ts';

const execFileAsync = promisify(execFile);
const root = join(import.meta.dirname, '..');

/** The library's C files, in the order they are compiled and linked (part of the output's bytes). */
export const NATIVE_SOURCES: readonly string[] = ['nvml_watch.c', 'nvml_access.c', 'watch_loop.c', 'signals.c'].map(
  (file) => join(root, 'src', 'native', file),
);
/** The header they share: not compiled itself, but a change to it rebuilds the library. */
const NATIVE_HEADER = join(root, 'src', 'native', 'nvml_watch.h');
export const NATIVE_LIBRARY_NAME = 'nvml-watch.so';

const COMPILER: Record<Arch, { cc: string; install: string }> = {
  x64: { cc: 'gcc', install: 'build/install-tools.sh installs gcc' },
  arm64: {
    cc: 'aarch64-linux-gnu-gcc',
    install: 'build/install-tools.sh installs gcc-aarch64-linux-gnu and libc6-dev-arm64-cross',
  },
};

const FLAGS = [
  '-std=gnu11',
  '-O2',
  '-fPIC',
  '-shared',
  '-pthread',
  '-fvisibility=hidden',
  '-Wall',
  '-Wextra',
  '-Werror',
  `-ffile-prefix-map=${root}=.`,
  '-s',
  `-Wl,-soname,${NATIVE_LIBRARY_NAME}`,
  // The thread's code must stay mapped whatever a loader does with its handle.
  '-Wl,-z,nodelete',
  '-Wl,-z,relro',
  '-Wl,-z,now',
];

/** Compiles the library for `arch` into outFile (written under a temporary name, then renamed). */
export async function buildNativeLibrary(arch: Arch, outFile: string): Promise<string> {
  const { cc, install } = COMPILER[arch];
  const tmp = `${outFile}.tmp-${process.pid}-${Math.random().toString(16).slice(2)}`;
  try {
    await execFileAsync(cc, [...FLAGS, '-o', tmp, ...NATIVE_SOURCES], { cwd: root });
    renameSync(tmp, outFile);
  } catch (err) {
    rmSync(tmp, { force: true });
    const e = err as NodeJS.ErrnoException & { stderr?: string };
    if (e.code === 'ENOENT')
      throw new Error(`${cc} was not found; building ${NATIVE_LIBRARY_NAME} for ${arch} needs it (${install})`, {
        cause: err,
      });
    throw new Error(
      `building ${NATIVE_LIBRARY_NAME} for ${arch} failed: ${cc} ${FLAGS.join(' ')}\n${e.stderr ?? e.message}`,
      { cause: err },
    );
  }
  return outFile;
}

/** Where runs from source find the library of `arch`. */
export function nativeLibraryCachePath(arch: Arch): string {
  return join(root, '.cache', 'native', arch, NATIVE_LIBRARY_NAME);
}

/** Builds the source-run copy of `arch` when missing or older than its sources; returns its path. */
export async function ensureNativeLibrary(arch: Arch = process.arch === 'arm64' ? 'arm64' : 'x64'): Promise<string> {
  const out = nativeLibraryCachePath(arch);
  const mtime = (p: string): number => {
    try {
      return statSync(p).mtimeMs;
    } catch {
      return -1;
    }
  };
  const newest = Math.max(...[...NATIVE_SOURCES, NATIVE_HEADER, join(import.meta.dirname, 'native.ts')].map(mtime));
  if (mtime(out) >= newest) return out;
  mkdirSync(join(out, '..'), { recursive: true });
  return buildNativeLibrary(arch, out);
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { arch: { type: 'string', default: 'all' } } });
  const arches = parseArch(values.arch);
  for (const arch of arches) process.stdout.write(`${await ensureNativeLibrary(arch)}\n`);
}
