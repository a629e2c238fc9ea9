/**
 * Builds the fake NVML (a C shared library with the real libnvidia-ml ABI) in two variants, and
 * on request a third for aarch64:
 *
 *   .cache/fake-nvml/current/libnvidia-ml.so.1   every symbol the fake knows
 *   .cache/fake-nvml/old/libnvidia-ml.so.1       -DFAKE_OLD_DRIVER: an old driver without the
 *                                                newer entry points (see fake_nvml.c)
 *   .cache/fake-nvml/arm64/libnvidia-ml.so.1     `current` cross-built with aarch64-linux-gnu-gcc,
 *                                                for the arm64 executable under qemu
 *
 * and, from sub-directories (so they stay out of the library), two programs under the real ones'
 * names (x64 only):
 *
 *   .cache/fake-nvml/mps/nvidia-cuda-mps-control (see mps-control/fake_mps_control.c)
 *   .cache/fake-nvml/smi/nvidia-smi              (see nvidia-smi/fake_nvidia_smi.c; it shares json.c)
 *
 * A variant is rebuilt only when a source under test/fake-nvml/ (or this script) is newer than
 * it, so repeated test runs cost nothing. The output is written to a temporary name and renamed
 * into place, so test processes building at the same time never load half a file.
 *
 * CLI:   node_modules/.bin/node test/fake-nvml/build.ts     (exit status 1 if gcc fails)
 * Tests: const { current, old } = await buildFakeNvml();    (directories, for LD_LIBRARY_PATH
 *                                                            or koffi.load(join(dir, LIBRARY_NAME)))
 *        const arm64 = await buildFakeNvmlArm64();       (the aarch64 variant's directory)
 *        const mpsDir = await buildFakeMpsControl();     (a directory holding nvidia-cuda-mps-control,
 *                                                         to put first on PATH)
 *        const smiDir = await buildFakeNvidiaSmi();      (a directory holding nvidia-smi)
 */
import { execFile } from 'node:child_process';
import { mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const LIBRARY_NAME = 'libnvidia-ml.so.1';
export const MPS_CONTROL_NAME = 'nvidia-cuda-mps-control';
export const NVIDIA_SMI_NAME = 'nvidia-smi';

const sourceDir = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(sourceDir, '..', '..');

/** Where the two variants go; one sub-directory per variant. */
export const FAKE_NVML_CACHE = path.join(repoRoot, '.cache', 'fake-nvml');

const COMMON_FLAGS = [
  '-shared',
  '-fPIC',
  '-O2',
  '-pthread',
  '-Wall',
  '-Wextra',
  '-Werror',
  `-Wl,-soname,${LIBRARY_NAME}`,
  // Its control thread may outlive every nvmlShutdown (a node change in effect), so a dlclose
  // by a caller that re-opens NVML (as the plugin does when the driver goes) must not unmap it.
  '-Wl,-z,nodelete',
];

type Variant = { name: 'current' | 'old' | 'arm64'; defines: string[]; compiler: string; install: string };

const VARIANTS: Variant[] = [
  { name: 'current', defines: [], compiler: 'gcc', install: 'apt-get install gcc' },
  { name: 'old', defines: ['-DFAKE_OLD_DRIVER'], compiler: 'gcc', install: 'apt-get install gcc' },
];
const ARM64: Variant = {
  name: 'arm64',
  defines: [],
  compiler: 'aarch64-linux-gnu-gcc',
  install: 'build/install-tools.sh installs gcc-aarch64-linux-gnu and libc6-dev-arm64-cross',
};

export class FakeNvmlBuildError extends Error {
  override name = 'FakeNvmlBuildError';
}

type Sources = { cFiles: string[]; newestMtimeMs: number };

async function listSources(): Promise<Sources> {
  const entries = await readdir(sourceDir);
  const cFiles: string[] = [];
  let newestMtimeMs = (await stat(fileURLToPath(import.meta.url))).mtimeMs;
  for (const entry of entries.sort()) {
    if (!entry.endsWith('.c') && !entry.endsWith('.h')) continue;
    const full = path.join(sourceDir, entry);
    newestMtimeMs = Math.max(newestMtimeMs, (await stat(full)).mtimeMs);
    if (entry.endsWith('.c')) cFiles.push(full);
  }
  if (cFiles.length === 0) throw new FakeNvmlBuildError(`no C sources found in ${sourceDir}`);
  return { cFiles, newestMtimeMs };
}

async function mtimeOrNull(file: string): Promise<number | null> {
  try {
    return (await stat(file)).mtimeMs;
  } catch (error: unknown) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw error;
  }
}

function runGcc(variant: Variant, args: string[]): Promise<void> {
  const gcc = variant.compiler;
  return new Promise((resolve, reject) => {
    execFile(gcc, args, { maxBuffer: 16 * 1024 * 1024 }, (error, _stdout, stderr) => {
      if (!error) {
        resolve();
        return;
      }
      const code = (error as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') {
        reject(
          new FakeNvmlBuildError(
            `${gcc} was not found on PATH; the fake NVML's ${variant.name} variant needs it (${variant.install})`,
          ),
        );
        return;
      }
      const output = String(stderr).trim();
      reject(new FakeNvmlBuildError(`${gcc} failed (${error.message.split('\n')[0]})${output ? `:\n${output}` : ''}`));
    });
  });
}

/** Builds one variant if it is missing or older than the sources; returns its directory. */
async function buildVariant(variant: Variant, sources: Sources): Promise<string> {
  const dir = path.join(FAKE_NVML_CACHE, variant.name);
  const output = path.join(dir, LIBRARY_NAME);
  const builtAt = await mtimeOrNull(output);
  if (builtAt !== null && builtAt >= sources.newestMtimeMs) return dir;

  await mkdir(dir, { recursive: true });
  const temporary = `${output}.tmp-${process.pid}-${Math.random().toString(16).slice(2)}`;
  try {
    await runGcc(variant, [...COMMON_FLAGS, ...variant.defines, '-o', temporary, ...sources.cFiles]);
    await rename(temporary, output);
  } catch (error: unknown) {
    await rm(temporary, { force: true });
    throw error;
  }
  return dir;
}

let pending: Promise<{ current: string; old: string }> | undefined;

/**
 * Builds (when needed) both variants and returns their directories. Each directory holds one
 * file named libnvidia-ml.so.1. Concurrent calls in one process share the same build.
 */
export function buildFakeNvml(): Promise<{ current: string; old: string }> {
  pending ??= (async () => {
    const sources = await listSources();
    const [current, old] = await Promise.all(VARIANTS.map((variant) => buildVariant(variant, sources)));
    if (current === undefined || old === undefined) throw new FakeNvmlBuildError('internal error: missing variant');
    return { current, old };
  })();
  const result = pending;
  // A failed build may be retried after the sources were fixed.
  result.catch(() => {
    if (pending === result) pending = undefined;
  });
  return result;
}

let pendingArm64: Promise<string> | undefined;

/** Builds (when needed) the aarch64 variant and returns its directory. */
export function buildFakeNvmlArm64(): Promise<string> {
  pendingArm64 ??= listSources().then((sources) => buildVariant(ARM64, sources));
  const result = pendingArm64;
  result.catch(() => {
    if (pendingArm64 === result) pendingArm64 = undefined;
  });
  return result;
}

/** A program built from the C files of one sub-directory (and any shared sources) into a folder of the cache. */
type Program = { sourceDir: string; shared: string[]; outDir: string; name: string };

const MPS_PROGRAM: Program = {
  sourceDir: path.join(sourceDir, 'mps-control'),
  shared: [],
  outDir: path.join(FAKE_NVML_CACHE, 'mps'),
  name: MPS_CONTROL_NAME,
};
const SMI_PROGRAM: Program = {
  sourceDir: path.join(sourceDir, 'nvidia-smi'),
  // The fake NVML's JSON reader: the fake nvidia-smi reads the same GPU file.
  shared: [path.join(sourceDir, 'json.c'), path.join(sourceDir, 'json.h')],
  outDir: path.join(FAKE_NVML_CACHE, 'smi'),
  name: NVIDIA_SMI_NAME,
};

async function buildProgram(program: Program): Promise<string> {
  const entries = (await readdir(program.sourceDir)).sort();
  const own = entries.filter((e) => e.endsWith('.c') || e.endsWith('.h')).map((e) => path.join(program.sourceDir, e));
  const cFiles = [...own, ...program.shared].filter((file) => file.endsWith('.c'));
  if (!own.some((file) => file.endsWith('.c')))
    throw new FakeNvmlBuildError(`no C sources found in ${program.sourceDir}`);
  let newest = (await stat(fileURLToPath(import.meta.url))).mtimeMs;
  for (const file of [...own, ...program.shared]) newest = Math.max(newest, (await stat(file)).mtimeMs);
  const output = path.join(program.outDir, program.name);
  const builtAt = await mtimeOrNull(output);
  if (builtAt !== null && builtAt >= newest) return program.outDir;
  await mkdir(program.outDir, { recursive: true });
  const temporary = `${output}.tmp-${process.pid}-${Math.random().toString(16).slice(2)}`;
  try {
    await runGcc(VARIANTS[0]!, ['-O2', '-Wall', '-Wextra', '-Werror', '-o', temporary, ...cFiles, '-lm']);
    await rename(temporary, output);
  } catch (error: unknown) {
    await rm(temporary, { force: true });
    throw error;
  }
  return program.outDir;
}

const pendingPrograms = new Map<Program, Promise<string>>();

/** Builds (when needed) one program; concurrent calls in one process share the build, a failed one may be retried. */
function buildOnce(program: Program): Promise<string> {
  const existing = pendingPrograms.get(program);
  if (existing) return existing;
  const result = buildProgram(program);
  pendingPrograms.set(program, result);
  result.catch(() => {
    if (pendingPrograms.get(program) === result) pendingPrograms.delete(program);
  });
  return result;
}

/** Builds (when needed) the fake nvidia-cuda-mps-control and returns its directory. */
export function buildFakeMpsControl(): Promise<string> {
  return buildOnce(MPS_PROGRAM);
}

/** Builds (when needed) the fake nvidia-smi and returns its directory. */
export function buildFakeNvidiaSmi(): Promise<string> {
  return buildOnce(SMI_PROGRAM);
}

if (import.meta.main) {
  try {
    const [{ current, old }, arm64, mps, smi] = await Promise.all([
      buildFakeNvml(),
      buildFakeNvmlArm64(),
      buildFakeMpsControl(),
      buildFakeNvidiaSmi(),
    ]);
    console.log(`fake NVML: ${path.join(current, LIBRARY_NAME)}`);
    console.log(`fake NVML (old driver): ${path.join(old, LIBRARY_NAME)}`);
    console.log(`fake NVML (aarch64): ${path.join(arm64, LIBRARY_NAME)}`);
    console.log(`fake MPS control: ${path.join(mps, MPS_CONTROL_NAME)}`);
    console.log(`fake nvidia-smi: ${path.join(smi, NVIDIA_SMI_NAME)}`);
  } catch (error: unknown) {
    const message = error instanceof Error ? error.message : String(error);
    console.error(`fake NVML build failed: ${message}`);
    process.exitCode = 1;
  }
}
