// Loads koffi's native module (the FFI engine) without its JavaScript loader, so the same code path
// serves a source checkout and the single executable. Inside the executable the module travels as an
// SEA asset: it is written to a private directory (0700) on a filesystem that allows executable
// mappings, its sha256 checked against the value recorded at build time, loaded, and removed.
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { constants as osConstants } from 'node:os';
import { join } from 'node:path';
import type * as KoffiModule from 'koffi';
import { assetSourcePath, readAsset, runningAsSea } from './assets.ts';

export type Koffi = typeof KoffiModule;

/** The koffi version the bundle was built against; the native module must match it. */
const KOFFI_VERSION = '3.3.4';

// Replaced by the build with the sha256 of the embedded koffi.node (see build/build.ts).
declare const __KOFFI_SHA256__: string | undefined;
function expectedSha256(): string | undefined {
  return typeof __KOFFI_SHA256__ === 'string' ? __KOFFI_SHA256__ : undefined;
}

export class NativeModuleError extends Error {
  override name = 'NativeModuleError';
}

let loaded: { koffi: Koffi; path: string } | undefined;

function dlopen(path: string): Koffi {
  const mod: { exports: unknown } = { exports: {} };
  process.dlopen(mod, path, osConstants.dlopen.RTLD_NOW);
  const k = mod.exports as Koffi;
  if (typeof k.load !== 'function' || k.version !== KOFFI_VERSION) {
    throw new NativeModuleError(`${path} is not koffi ${KOFFI_VERSION} (found version ${String(k.version)})`);
  }
  return k;
}

/** Directories tried in turn for the extracted module: the unit's own, then the usual temporary one. */
export function extractionCandidates(env: NodeJS.ProcessEnv = process.env): string[] {
  const dirs: string[] = [];
  for (const key of ['GPU_DEVICE_PLUGIN_NATIVE_DIR', 'RUNTIME_DIRECTORY', 'STATE_DIRECTORY', 'CACHE_DIRECTORY']) {
    const v = env[key];
    if (v) dirs.push(...v.split(':').filter((d) => d.length > 0));
  }
  dirs.push(tmpdir(), '/var/tmp');
  return [...new Set(dirs)];
}

function extractAndLoad(): { koffi: Koffi; path: string } {
  const bytes = readAsset('koffi.node');
  const want = expectedSha256();
  const got = createHash('sha256').update(bytes).digest('hex');
  if (want === undefined) throw new NativeModuleError('the executable carries no recorded sha256 for koffi.node');
  if (got !== want) {
    throw new NativeModuleError(`embedded koffi.node has sha256 ${got}, expected ${want}: the executable was tampered with or corrupted; reinstall the package`);
  }
  const failures: string[] = [];
  for (const base of extractionCandidates()) {
    let dir: string | undefined;
    try {
      dir = mkdtempSync(join(base, 'gpu-device-plugin-'));
      chmodSync(dir, 0o700);
      const file = join(dir, 'koffi.node');
      writeFileSync(file, bytes, { mode: 0o500, flag: 'wx' });
      // Check what was written, not only what was embedded: the directory could be shared.
      const again = createHash('sha256').update(readAsset('koffi.node')).digest('hex');
      if (again !== want) throw new NativeModuleError('koffi.node changed while being extracted');
      const koffi = dlopen(file);
      return { koffi, path: file };
    } catch (err) {
      failures.push(`${base}: ${err instanceof Error ? err.message : String(err)}`);
    } finally {
      // The mapping stays valid after the file is gone; nothing is left on disk.
      if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
    }
  }
  throw new NativeModuleError(`could not load the embedded koffi.node from any directory (${failures.join('; ')}); set RuntimeDirectory= in the unit or GPU_DEVICE_PLUGIN_NATIVE_DIR to a directory on an exec-allowed filesystem`);
}

/** The koffi API, loaded once per thread. */
export function loadKoffi(): Koffi {
  if (loaded === undefined) {
    loaded = runningAsSea() ? extractAndLoad() : { koffi: dlopen(assetSourcePath('koffi.node')), path: assetSourcePath('koffi.node') };
  }
  return loaded.koffi;
}
