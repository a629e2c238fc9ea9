/**
 * Builds the fake NVML (a C shared library with the real libnvidia-ml ABI) in two variants:
 *
 *   .cache/fake-nvml/current/libnvidia-ml.so.1   every symbol the fake knows
 *   .cache/fake-nvml/old/libnvidia-ml.so.1       -DFAKE_OLD_DRIVER: an old driver without the
 *                                                newer entry points (see fake_nvml.c)
 *
 * A variant is rebuilt only when a source under test/fake-nvml/ (or this script) is newer than
 * it, so repeated test runs cost nothing. The output is written to a temporary name and renamed
 * into place, so test processes building at the same time never load half a file.
 *
 * CLI:   node_modules/.bin/node test/fake-nvml/build.ts     (exit status 1 if gcc fails)
 * Tests: const { current, old } = await buildFakeNvml();    (directories, for LD_LIBRARY_PATH
 *                                                            or koffi.load(join(dir, LIBRARY_NAME)))
 */
import { execFile } from 'node:child_process';
import { mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const LIBRARY_NAME = 'libnvidia-ml.so.1';

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

type Variant = { name: 'current' | 'old'; defines: string[] };

const VARIANTS: Variant[] = [
  { name: 'current', defines: [] },
  { name: 'old', defines: ['-DFAKE_OLD_DRIVER'] },
];

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

function runGcc(args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile('gcc', args, { maxBuffer: 16 * 1024 * 1024 }, (error, _stdout, stderr) => {
      if (!error) {
        resolve();
        return;
      }
      const code = (error as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') {
        reject(new FakeNvmlBuildError('gcc was not found on PATH; the fake NVML needs a C compiler (apt-get install gcc)'));
        return;
      }
      const output = String(stderr).trim();
      reject(new FakeNvmlBuildError(`gcc failed (${error.message.split('\n')[0]})${output ? `:\n${output}` : ''}`));
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
    await runGcc([...COMMON_FLAGS, ...variant.defines, '-o', temporary, ...sources.cFiles]);
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

if (import.meta.main) {
  try {
    const { current, old } = await buildFakeNvml();
    console.log(`fake NVML: ${path.join(current, LIBRARY_NAME)}`);
    console.log(`fake NVML (old driver): ${path.join(old, LIBRARY_NAME)}`);
  } catch (error: unknown) {
    const message = error instanceof Error ? error.message : String(error);
    console.error(`fake NVML build failed: ${message}`);
    process.exitCode = 1;
  }
}
