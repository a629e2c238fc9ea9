// Loads the native code the program carries: koffi's native module (the FFI engine), without its
// JavaScript loader, and our own C library (src/native/: the GPU health thread), loaded through
// koffi. Inside the executable both travel as SEA assets and are extracted in one pass: written to
// one private directory (0700) on a filesystem that allows executable mappings, each written file
// read back and its sha256 checked against the value recorded at build time, loaded, and the
// directory removed. From a source checkout they are loaded where they lie.
import { createHash } from 'node:crypto';
import { chmodSync, closeSync, mkdtempSync, openSync, readSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { constants as osConstants } from 'node:os';
import { join } from 'node:path';
import type * as KoffiModule from 'koffi';
import { assetBytes, assetSourcePath, runningAsSea } from './assets.ts';
import type { AssetName } from './assets.ts';

export type Koffi = typeof KoffiModule;
export type KoffiLibrary = ReturnType<Koffi['load']>;

/** The koffi version the bundle was built against; the native module must match it. */
const KOFFI_VERSION = '3.3.4';

// Replaced by the build with the sha256 of each embedded native file (see build/build.ts).
declare const __KOFFI_SHA256__: string | undefined;
declare const __NVML_WATCH_SHA256__: string | undefined;
function expectedSha256(name: NativeAsset): string | undefined {
  if (name === 'koffi.node') return typeof __KOFFI_SHA256__ === 'string' ? __KOFFI_SHA256__ : undefined;
  return typeof __NVML_WATCH_SHA256__ === 'string' ? __NVML_WATCH_SHA256__ : undefined;
}

type NativeAsset = Extract<AssetName, 'koffi.node' | 'nvml-watch.so'>;

export class NativeModuleError extends Error {
  override name = 'NativeModuleError';
}

interface Loaded {
  koffi: Koffi;
  /** Our C library; inside the executable loaded with koffi (same pass), from source on first use. */
  watch: KoffiLibrary | undefined;
}

let loaded: Loaded | undefined;

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

/** A tampered or corrupted executable: no other directory can help. */
class TamperedError extends NativeModuleError {}

/** sha256 of a file, read in small pieces (no copy of the whole file on the heap). */
function fileSha256(file: string): string {
  const hash = createHash('sha256');
  const buf = Buffer.allocUnsafe(64 * 1024);
  const fd = openSync(file, 'r');
  try {
    for (let n = readSync(fd, buf); n > 0; n = readSync(fd, buf)) hash.update(buf.subarray(0, n));
  } finally {
    closeSync(fd);
  }
  return hash.digest('hex');
}

/** Writes one embedded file into dir and checks what was written (the file, not the blob). */
function extract(dir: string, name: NativeAsset): string {
  const want = expectedSha256(name);
  if (want === undefined) throw new TamperedError(`the executable carries no recorded sha256 for ${name}`);
  const file = join(dir, name);
  writeFileSync(file, assetBytes(name), { mode: 0o500, flag: 'wx' });
  const got = fileSha256(file);
  if (got !== want) {
    throw new TamperedError(
      `embedded ${name} has sha256 ${got}, expected ${want}: the ` +
        `executable was tampered with or corrupted; reinstall the package`,
    );
  }
  return file;
}

function extractAndLoad(): Loaded {
  const failures: string[] = [];
  for (const base of extractionCandidates()) {
    let dir: string | undefined;
    try {
      dir = mkdtempSync(join(base, 'gpu-device-plugin-'));
      chmodSync(dir, 0o700);
      const koffiFile = extract(dir, 'koffi.node');
      const watchFile = extract(dir, 'nvml-watch.so');
      const koffi = dlopen(koffiFile);
      return { koffi, watch: koffi.load(watchFile) };
    } catch (err) {
      if (err instanceof TamperedError) throw new NativeModuleError(err.message);
      failures.push(`${base}: ${err instanceof Error ? err.message : String(err)}`);
    } finally {
      // The mappings stay valid after the files are gone; nothing is left on disk.
      if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
    }
  }
  throw new NativeModuleError(
    `could not load the embedded native modules (koffi.node, nvml-watch.so) from ` +
      `any directory (${failures.join('; ')}); set RuntimeDirectory= in the unit ` +
      `or GPU_DEVICE_PLUGIN_NATIVE_DIR to a directory on an exec-allowed filesystem`,
  );
}

function load(): Loaded {
  if (loaded === undefined) {
    loaded = runningAsSea() ? extractAndLoad() : { koffi: dlopen(assetSourcePath('koffi.node')), watch: undefined };
  }
  return loaded;
}

/** The koffi API, loaded once per process. */
export function loadKoffi(): Koffi {
  return load().koffi;
}

/** Our C library (src/native/nvml_watch.c), loaded once per process. */
export function loadWatchLibrary(): KoffiLibrary {
  const l = load();
  if (l.watch === undefined) {
    const path = assetSourcePath('nvml-watch.so');
    try {
      l.watch = l.koffi.load(path);
    } catch (err) {
      throw new NativeModuleError(
        `cannot load ${path} (${err instanceof Error ? err.message : String(err)}); ` +
          `runs from source need it built: node build/native.ts`,
      );
    }
  }
  return l.watch;
}
