// What the scanner needs of NVML, behind two small interfaces so that it can be driven in-process by
// a fake (test/unit/scanner.test.ts): a NodeSessions opens a session; a NodeReader is one open
// session that reads the whole node (a NodeScan), reads its cheap identity, lends itself to the
// health thread, and closes. NvmlSessions is the real one: discovery.ts, mig.ts and node-facts.ts on
// libnvidia-ml, with the raw ABI calls of the identity read as typed functions here.
import type { Gpu } from '../core/devices.ts';
import type { EventBatchEntry, ProbeRound } from '../core/health-events.ts';
import type { SignalName, SignalReading } from '../core/health-signals.ts';
import type { MigDevice, MigLayout, MigMode } from '../core/mig.ts';
import type { NodeIdentity, NodeScan } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';
import type { Koffi } from '../system/native.ts';
import { discoverGpus, readLinks } from './discovery.ts';
import { NVML, NvmlError, meansDriverGone } from './errors.ts';
import type { WatchedGpu } from './events.ts';
import { discoverMig, nvmlHasMig, readMigCapabilities } from './mig.ts';
import { readNodeFacts } from './node-facts.ts';
import { Nvml } from './nvml.ts';
import type { DeviceHandle } from './nvml.ts';
import { placeUnreadable } from './unreadable.ts';
import { EventWatcher } from './watcher.ts';

/** The health thread on a session: what it reports, and how it is stopped. */
export interface HealthWatchHandlers {
  onReady(watched: WatchedGpu[], unsupported: WatchedGpu[]): void;
  onEvents(events: EventBatchEntry[]): void;
  onProbe(results: ProbeRound): void;
  /** NVML said the driver is gone; the thread has stopped watching. */
  onDriverGone(message: string): void;
  /** The health signals the thread reads (none when absent) and their readings, by GPU UUID. */
  readonly signals?: readonly SignalName[];
  onSignals?(readings: ReadonlyMap<string, SignalReading>): void;
}

export interface HealthWatch {
  /** Stops the thread and waits for it (NVML may not be closed under it); logs a call longer than limitMs. */
  stop(limitMs: number): Promise<void>;
}

/** One open session on the node. */
export interface NodeReader {
  readonly library: string;
  driverVersion(): string;
  /** Everything about the node; `last`: the previous scan, for a GPU that cannot be read now. Throws. */
  read(last: NodeScan | null): NodeScan;
  /** Count, UUIDs, MIG modes (and, with MIG, the MIG devices' UUIDs): what re-discovery compares. Throws. */
  identity(): NodeIdentity;
  /** Starts the health thread on this session, watching these GPUs. */
  watch(gpus: readonly Gpu[], probeIntervalMs: number, handlers: HealthWatchHandlers): HealthWatch;
  /** Shuts the session down and unloads the library. */
  close(): void;
  /** Shuts the session down only (the process is about to exit). */
  shutdown(): void;
}

/** Opens sessions: throws what opening throws (no driver, no library). */
export interface NodeSessions {
  open(): NodeReader;
}

/** Whether an error means the driver stopped answering (every GPU is concerned, not one). */
export function isDriverGone(err: unknown): err is NvmlError {
  return err instanceof NvmlError && meansDriverGone(err.code);
}

export interface NvmlSessionOptions {
  koffi: Koffi;
  driverRoot: string;
  sysfsRoot: string;
  log: Logger;
  /** Read MIG modes and devices (--mig-strategy single or mixed). */
  mig: boolean;
  /** Read what the node labels need (node-facts.ts) with every scan. */
  facts: boolean;
  /** Environment with PROC_ROOT, for mig-minors (default process.env). */
  env?: Readonly<Record<string, string | undefined>>;
}

/** Sessions on libnvidia-ml. */
export class NvmlSessions implements NodeSessions {
  private readonly o: NvmlSessionOptions;
  /** A driver without MIG functions was reported (once per process). */
  migMissingLogged = false;
  /** The GPUs the last scan kept as last seen because NVML counted them but could not read them. */
  unreadable: ReadonlySet<string> = new Set();

  constructor(o: NvmlSessionOptions) {
    this.o = o;
  }

  open(): NodeReader {
    return new NvmlReader(
      Nvml.open({ koffi: this.o.koffi, driverRoot: this.o.driverRoot, log: this.o.log }),
      this.o,
      this,
    );
  }

  /**
   * A reader on a session the caller opened and keeps (the MPS control daemon unit, which also sets
   * compute modes on it): the same scan as the plugin's, so both plan from the same facts. The caller
   * closes `nvml`, not the reader.
   */
  on(nvml: Nvml): Pick<NodeReader, 'read'> {
    return new NvmlReader(nvml, this.o, this);
  }
}

// ---- typed MIG calls of the identity read --------------------------------------------------------

/**
 * Current MIG mode, plus 2 when a different mode is pending; null when NVML cannot say. Throws when the driver is gone.
 */
export function migModeCode(nvml: Nvml, h: DeviceHandle, index: number): { mode: number | null; enabled: boolean } {
  const current = [0];
  const pending = [0];
  const code = nvml.callCode('nvmlDeviceGetMigMode', h, current, pending);
  if (meansDriverGone(code)) nvml.check('nvmlDeviceGetMigMode', code, { index });
  if (code !== NVML.SUCCESS) return { mode: null, enabled: false };
  const cur = current[0] ?? 0;
  return { mode: cur + ((pending[0] ?? 0) !== cur ? 2 : 0), enabled: cur === 1 };
}

/** How many MIG devices a GPU can have (0 when NVML cannot say). */
export function maxMigDeviceCount(nvml: Nvml, h: DeviceHandle): number {
  const max = [0];
  return nvml.callCode('nvmlDeviceGetMaxMigDeviceCount', h, max) === NVML.SUCCESS ? (max[0] ?? 0) : 0;
}

/** The handle of MIG device i of a GPU, or null when there is none there. Throws when the driver is gone. */
export function migDeviceHandle(nvml: Nvml, h: DeviceHandle, i: number): DeviceHandle | null {
  const m: unknown[] = [null];
  const code = nvml.callCode('nvmlDeviceGetMigDeviceHandleByIndex', h, i, m);
  if (meansDriverGone(code)) nvml.check('nvmlDeviceGetMigDeviceHandleByIndex', code);
  return code === NVML.SUCCESS ? (m[0] as DeviceHandle) : null;
}

class NvmlReader implements NodeReader {
  private readonly nvml: Nvml;
  private readonly o: NvmlSessionOptions;
  private readonly sessions: NvmlSessions;

  constructor(nvml: Nvml, o: NvmlSessionOptions, sessions: NvmlSessions) {
    this.nvml = nvml;
    this.o = o;
    this.sessions = sessions;
  }

  get library(): string {
    return this.nvml.libraryPath;
  }

  driverVersion(): string {
    return this.nvml.driverVersion();
  }

  read(last: NodeScan | null): NodeScan {
    const nvml = this.nvml;
    const log = this.o.log;
    const driverVersion = nvml.driverVersion();
    const found = discoverGpus(nvml, this.o.sysfsRoot, log, false);
    const links = readLinks(nvml, found, log);
    const facts = this.o.facts ? { facts: readNodeFacts(nvml, found.gpus, found.handles, log) } : {};
    const gpus = [...found.gpus];
    const nvlinks = [...links.gpus];
    let pcie = links.pcie.map((row) => [...row]);
    const unreadable = found.unreadable ?? [];
    const { placed, unplaced } = placeUnreadable(
      last?.gpus ?? [],
      found.gpus,
      unreadable.map((u) => u.index),
      this.sessions.unreadable,
      (g) => this.atAddress(g.busId),
    );
    const errorAt = (index: number): string | undefined => unreadable.find((u) => u.index === index)?.error.message;
    for (const index of unplaced)
      log.error('GPU cannot be read and is not advertised', { gpu: index, error: errorAt(index) });
    for (const known of placed) {
      // A GPU fallen off the bus is still counted by NVML: keep what we knew of it, so that it is
      // advertised Unhealthy (the probe says lost) rather than vanishing and returning.
      log.warn('GPU cannot be read; it stays listed as last seen, Unhealthy once its probe says it is lost', {
        gpu: known.index,
        uuid: known.uuid,
        error: errorAt(known.index),
      });
      const at = gpus.findIndex((g) => g.index > known.index);
      const pos = at < 0 ? gpus.length : at;
      gpus.splice(pos, 0, known);
      nvlinks.splice(pos, 0, { busId: known.busId, links: [] });
      pcie = pcie.map((row) => {
        const r = [...row];
        r.splice(pos, 0, -1);
        return r;
      });
      pcie.splice(pos, 0, new Array<number>(gpus.length).fill(-1));
    }
    this.sessions.unreadable = new Set(placed.map((g) => g.uuid));
    return { driverVersion, gpus, nvlinks, pcie, ...facts, ...this.readMig(found, gpus, last) };
  }

  /** Whether NVML has a GPU at this PCI address, lost or not (null: it cannot say). Throws when the driver is gone. */
  private atAddress(busId: string): boolean | null {
    const nvml = this.nvml;
    if (!nvml.has('nvmlDeviceGetHandleByPciBusId_v2')) return null;
    const code = nvml.callCode('nvmlDeviceGetHandleByPciBusId_v2', busId, [null]);
    if (meansDriverGone(code)) nvml.check('nvmlDeviceGetHandleByPciBusId_v2', code, {});
    if (code === NVML.SUCCESS || code === NVML.ERROR_GPU_IS_LOST) return true;
    return code === NVML.ERROR_NOT_FOUND ? false : null;
  }

  /** The MIG layout by position in `gpus` (the scan's list), and the MIG devices' capability nodes. */
  private readMig(
    found: ReturnType<typeof discoverGpus>,
    gpus: readonly Gpu[],
    last: NodeScan | null,
  ): Pick<NodeScan, 'mig' | 'migCapabilities'> {
    if (!this.o.mig) return {};
    const nvml = this.nvml;
    const has = nvmlHasMig(nvml);
    if (!has.ok) {
      if (!this.sessions.migMissingLogged)
        this.o.log.warn('this NVIDIA driver has no MIG functions; MIG is off and every GPU is advertised whole', {
          missing: has.missing,
          library: nvml.libraryPath,
        });
      this.sessions.migMissingLogged = true;
      return {};
    }
    const read = discoverMig(nvml, found.gpus, found.handles, this.o.log);
    if (read === null) return {};
    // discoverMig speaks of found.gpus; the scan's list may hold a lost GPU more (not MIG-readable).
    const pos = new Map(gpus.map((g, i) => [g.uuid, i]));
    const modes: (MigMode | null)[] = gpus.map(() => null);
    read.modes.forEach((m, i) => {
      const at = pos.get(found.gpus[i]?.uuid ?? '');
      if (at !== undefined) modes[at] = m;
    });
    const devices: MigDevice[] = [];
    for (const d of read.devices) {
      const at = pos.get(found.gpus[d.parent]?.uuid ?? '');
      if (at !== undefined) devices.push({ ...d, parent: at });
    }
    // A lost GPU kept in the list keeps the MIG layout last read on it, as it keeps its other facts:
    // its MIG devices stay listed (Unhealthy with it) rather than vanishing, and the node still fits
    // the MIG strategy it fitted.
    const readable = new Set(found.gpus.map((g) => g.uuid));
    gpus.forEach((g, at) => {
      if (readable.has(g.uuid) || last?.mig === undefined) return;
      const was = last.gpus.findIndex((x) => x.uuid === g.uuid);
      if (was < 0) return;
      modes[at] = last.mig.modes[was] ?? null;
      for (const d of last.mig.devices) if (d.parent === was) devices.push({ ...d, parent: at });
    });
    devices.sort((x, y) => x.parent - y.parent || x.index - y.index);
    const mig: MigLayout = { modes, devices, ...(read.partitionable ? { partitionable: read.partitionable } : {}) };
    return { mig, migCapabilities: readMigCapabilities(gpus, mig, this.o.env ?? process.env) };
  }

  identity(): NodeIdentity {
    const nvml = this.nvml;
    const count = nvml.deviceCount();
    const uuids: string[] = [];
    const migModes: (number | null)[] = [];
    const mig = nvml.has('nvmlDeviceGetMigMode', true);
    const migDevices: string[][] = [];
    const withDevices = this.o.mig && nvmlHasMig(nvml).ok;
    for (let index = 0; index < count; index++) {
      let h: DeviceHandle;
      try {
        h = nvml.handleByIndex(index);
        uuids.push(nvml.uuid(h, { index }));
      } catch (err) {
        if (err instanceof NvmlError && !meansDriverGone(err.code)) {
          uuids.push(`unreadable:${index}`);
          migModes.push(null);
          continue;
        }
        throw err;
      }
      if (!mig) {
        migModes.push(null);
        continue;
      }
      // Current mode, plus 2 when a different mode is pending (so a pending change is seen, and logged).
      const m = migModeCode(nvml, h, index);
      migModes.push(m.mode);
      if (withDevices) migDevices.push(m.enabled ? this.migDeviceUuids(h) : []);
    }
    return withDevices ? { uuids, migModes, migDevices } : { uuids, migModes };
  }

  /** The UUIDs of a MIG-enabled GPU's MIG devices, in index order (cheap: no attributes). */
  private migDeviceUuids(h: DeviceHandle): string[] {
    const out: string[] = [];
    const max = maxMigDeviceCount(this.nvml, h);
    for (let i = 0; i < max; i++) {
      const m = migDeviceHandle(this.nvml, h, i);
      if (m === null) continue;
      try {
        out.push(`${i}:${this.nvml.uuid(m, {})}`);
      } catch (err) {
        if (isDriverGone(err)) throw err;
        out.push(`${i}:unreadable`);
      }
    }
    return out;
  }

  watch(gpus: readonly Gpu[], probeIntervalMs: number, handlers: HealthWatchHandlers): HealthWatch {
    return EventWatcher.start({
      nvml: this.nvml,
      koffi: this.o.koffi,
      log: this.o.log,
      gpus: gpus.map((g) => ({ nvmlIndex: g.index, uuid: g.uuid })),
      probeIntervalMs,
      waitTimeoutMs: 200,
      onReady: (w, u) => handlers.onReady(w, u),
      onEvents: (e) => handlers.onEvents(e),
      onProbe: (r) => handlers.onProbe(r),
      onDriverGone: (m) => handlers.onDriverGone(m),
      signals: handlers.signals ?? [],
      onSignals: (r) => handlers.onSignals?.(r),
    });
  }

  close(): void {
    this.nvml.close();
  }

  shutdown(): void {
    this.nvml.shutdown();
  }
}
