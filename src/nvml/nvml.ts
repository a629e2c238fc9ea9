// The NVML adapter: opens libnvidia-ml.so.1 through koffi, turns every failure into an NvmlError
// that names the function, the code, NVML's own text and the GPU, and binds newer symbols lazily.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Koffi } from '../system/native.ts';
import type { Logger } from '../system/log.ts';
import { BASIC_SYMBOLS, LAZY_SYMBOLS, bind, nvmlTypes } from './bindings.ts';
import type { BasicSymbol, LazySymbol, NativeFn } from './bindings.ts';
import { NVML, NvmlError, fallbackErrorText } from './errors.ts';
import type { GpuRef } from './errors.ts';

export const NVML_SONAME = 'libnvidia-ml.so.1';

/** An opaque nvmlDevice_t as koffi hands it back. */
export interface DeviceHandle {
  readonly __nvmlDevice: unique symbol;
}

export interface PciInfo {
  busIdLegacy: string;
  domain: number;
  bus: number;
  device: number;
  pciDeviceId: number;
  pciSubSystemId: number;
  busId: string;
}

export class NvmlLoadError extends Error {
  override name = 'NvmlLoadError';
}

/** Library folders of a driver installed under a root other than '/' (containerised drivers). */
export function driverLibraryCandidates(driverRoot: string, arch: string = process.arch): string[] {
  const triplet = arch === 'arm64' ? 'aarch64-linux-gnu' : 'x86_64-linux-gnu';
  const dirs = [
    'usr/lib64',
    `usr/lib/${triplet}`,
    `usr/lib/${triplet}/nvidia/current`,
    'usr/lib',
    'lib64',
    `lib/${triplet}`,
    'lib',
  ];
  return dirs.map((d) => join(driverRoot, d, NVML_SONAME));
}

export interface OpenOptions {
  koffi: Koffi;
  driverRoot: string;
  log: Logger;
  /** Load exactly this library instead of searching for it (tests). */
  library?: string;
}

function cString(buf: Buffer): string {
  const end = buf.indexOf(0);
  return buf.toString('utf8', 0, end < 0 ? buf.length : end);
}

export class Nvml {
  readonly libraryPath: string;
  private readonly lib: ReturnType<Koffi['load']>;
  private readonly basic: Record<BasicSymbol, NativeFn>;
  private readonly lazy = new Map<LazySymbol, NativeFn | null>();
  private readonly log: Logger;
  private initialised = false;

  private constructor(lib: ReturnType<Koffi['load']>, path: string, basic: Record<BasicSymbol, NativeFn>, log: Logger) {
    this.lib = lib;
    this.libraryPath = path;
    this.basic = basic;
    this.log = log;
  }

  /** Loads the library and initialises NVML. Throws NvmlLoadError or NvmlError saying what to check. */
  static open(opts: OpenOptions): Nvml {
    const { koffi } = opts;
    nvmlTypes(koffi);
    const tried: string[] = [];
    let lib: ReturnType<Koffi['load']> | undefined;
    let path = NVML_SONAME;
    const candidates =
      opts.library !== undefined
        ? [opts.library]
        : [
            ...(opts.driverRoot !== '/' && opts.driverRoot !== ''
              ? driverLibraryCandidates(opts.driverRoot).filter((p) => existsSync(p))
              : []),
            NVML_SONAME,
          ];
    for (const candidate of candidates) {
      try {
        lib = koffi.load(candidate);
        path = candidate;
        break;
      } catch (err) {
        tried.push(`${candidate}: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    if (lib === undefined) {
      throw new NvmlLoadError(
        `cannot load NVML (${NVML_SONAME}): ${tried.join('; ')}; is the NVIDIA driver installed, and ` +
          `is --driver-root (NVIDIA_DRIVER_ROOT, now ${JSON.stringify(opts.driverRoot)}) where it lives?`,
      );
    }
    const basic = {} as Record<BasicSymbol, NativeFn>;
    for (const [name, decl] of Object.entries(BASIC_SYMBOLS) as [BasicSymbol, string][]) {
      const fn = bind(lib, decl);
      if (fn === undefined) {
        lib.unload();
        throw new NvmlLoadError(
          `${path} lacks ${name}, which every supported NVIDIA driver ` +
            `has; is it really NVIDIA's NVML? Reinstall the driver`,
        );
      }
      basic[name] = fn;
    }
    const nvml = new Nvml(lib, path, basic, opts.log);
    nvml.check('nvmlInit_v2', basic.nvmlInit_v2() as number);
    nvml.initialised = true;
    return nvml;
  }

  errorText(code: number): string {
    try {
      const s = this.basic.nvmlErrorString(code);
      return typeof s === 'string' && s.length > 0 ? s : fallbackErrorText(code);
    } catch {
      return fallbackErrorText(code);
    }
  }

  /** Throws NvmlError unless code is SUCCESS. */
  check(func: string, code: number, gpu?: GpuRef): void {
    if (code !== NVML.SUCCESS) throw new NvmlError(func, code, this.errorText(code), gpu);
  }

  /**
   * A lazily bound symbol, or an NvmlError with FUNCTION_NOT_FOUND (logged once, unless quiet: the
   * caller says what is off) when the driver lacks it.
   */
  fn(name: LazySymbol, quiet = false): NativeFn {
    let f = this.lazy.get(name);
    if (f === undefined) {
      f = bind(this.lib, LAZY_SYMBOLS[name]) ?? null;
      this.lazy.set(name, f);
      if (f === null && !quiet)
        this.log.warn('NVML lacks a function; the feature that needs it is off', {
          function: name,
          library: this.libraryPath,
        });
    }
    if (f === null) throw new NvmlError(name, NVML.ERROR_FUNCTION_NOT_FOUND, 'Function Not Found', undefined);
    return f;
  }

  has(name: LazySymbol, quiet = false): boolean {
    try {
      this.fn(name, quiet);
      return true;
    } catch {
      return false;
    }
  }

  driverVersion(): string {
    const buf = Buffer.alloc(80);
    this.check('nvmlSystemGetDriverVersion', this.basic.nvmlSystemGetDriverVersion(buf, buf.length) as number);
    return cString(buf);
  }

  deviceCount(): number {
    const out = [0];
    this.check('nvmlDeviceGetCount_v2', this.basic.nvmlDeviceGetCount_v2(out) as number);
    return out[0] ?? 0;
  }

  handleByIndex(index: number): DeviceHandle {
    const out: unknown[] = [null];
    this.check('nvmlDeviceGetHandleByIndex_v2', this.basic.nvmlDeviceGetHandleByIndex_v2(index, out) as number, {
      index,
    });
    return out[0] as DeviceHandle;
  }

  uuid(h: DeviceHandle, gpu: GpuRef): string {
    const buf = Buffer.alloc(96);
    this.check('nvmlDeviceGetUUID', this.basic.nvmlDeviceGetUUID(h, buf, buf.length) as number, gpu);
    return cString(buf);
  }

  name(h: DeviceHandle, gpu: GpuRef): string {
    const buf = Buffer.alloc(96);
    this.check('nvmlDeviceGetName', this.basic.nvmlDeviceGetName(h, buf, buf.length) as number, gpu);
    return cString(buf);
  }

  minor(h: DeviceHandle, gpu: GpuRef): number {
    const out = [0];
    this.check('nvmlDeviceGetMinorNumber', this.basic.nvmlDeviceGetMinorNumber(h, out) as number, gpu);
    return out[0] ?? 0;
  }

  pciInfo(h: DeviceHandle, gpu: GpuRef): PciInfo {
    const out = {} as PciInfo;
    this.check('nvmlDeviceGetPciInfo_v3', this.basic.nvmlDeviceGetPciInfo_v3(h, out) as number, gpu);
    return out;
  }

  memoryTotal(h: DeviceHandle, gpu: GpuRef): number {
    const out = { total: 0, free: 0, used: 0 };
    this.check('nvmlDeviceGetMemoryInfo', this.basic.nvmlDeviceGetMemoryInfo(h, out) as number, gpu);
    return Number(out.total);
  }

  /** A cheap query that reaches the GPU: its return code (GPU_IS_LOST when the GPU fell off the bus). */
  probe(h: DeviceHandle): number {
    const out = { total: 0, free: 0, used: 0 };
    return this.basic.nvmlDeviceGetMemoryInfo(h, out) as number;
  }

  /** NUMA node from NVML, or undefined when this driver or GPU cannot say. */
  numaNode(h: DeviceHandle, gpu: GpuRef): number | undefined {
    if (!this.has('nvmlDeviceGetNumaNodeId')) return undefined;
    const out = [0];
    const code = this.fn('nvmlDeviceGetNumaNodeId')(h, out) as number;
    if (code === NVML.ERROR_NOT_SUPPORTED) return undefined;
    this.check('nvmlDeviceGetNumaNodeId', code, gpu);
    return out[0];
  }

  /** Calls a lazily bound function and returns its code (for callers that treat some codes as answers). */
  callCode(name: LazySymbol, ...args: unknown[]): number {
    return this.fn(name)(...args) as number;
  }

  shutdown(): void {
    if (!this.initialised) return;
    this.initialised = false;
    const code = this.basic.nvmlShutdown() as number;
    if (code !== NVML.SUCCESS) this.log.debug('nvmlShutdown failed', { code, error: this.errorText(code) });
  }

  /**
   * Shuts NVML down and unloads the library, so that opening it again loads the file on disk now
   * (a new driver's). Nothing may be called on this object afterwards.
   */
  close(): void {
    this.shutdown();
    try {
      this.lib.unload();
    } catch (err) {
      this.log.debug('cannot unload NVML', { error: err instanceof Error ? err.message : String(err) });
    }
  }
}
