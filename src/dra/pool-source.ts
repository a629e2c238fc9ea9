// What the node's pool holds, for the slice publisher: the content core/dra-slices.ts makes of a snapshot and the
// settings in force, with what only this adapter reads or remembers — each GPU's PCIe root (sysfs, read once per
// GPU), the driver version last seen (kept while the driver does not answer), and whether the API server takes
// dynamic MIG's counter sets in slices of their own (Kubernetes 1.35 or later, with the DRAPartitionableDevices
// gate on: a server without it drops them on write; either way MIG-mode GPUs get their MIG devices only, said
// once as an ERROR, and tried again at a reload). Split out of slice-publisher.ts, which publishes.
import { realpath } from 'node:fs/promises';
import { join } from 'node:path';
import { poolContent, standardBusId } from '../core/dra-slices.ts';
import type { PoolContent } from '../core/dra-slices.ts';
import type { NodeSnapshot, PlanSettings } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';

/** The PCIe root of a device from its sysfs path (`…/devices/pci0000:00/0000:00:01.0/0000:07:00.0` → pci0000:00). */
export function pcieRootOfPath(path: string): string | null {
  const m = /\/devices\/pci([0-9a-f]{4,8}):([0-9a-f]{2})(?:\/|$)/i.exec(path);
  if (m === null) return null;
  return `pci${(m[1] ?? '').slice(-4).toLowerCase()}:${(m[2] ?? '').toLowerCase()}`;
}

export interface ServerVersion {
  readonly major: number;
  readonly minor: number;
}

export class PoolSource {
  private readonly o: {
    readonly nodeName: string;
    readonly driver: string;
    readonly sysfsRoot: string;
    readonly log: Logger;
  };
  private readonly pcieRoots = new Map<string, string | null>();
  private lastDriverVersion: string | null = null;
  private server: ServerVersion | null = null;
  private saidTooOld = false;
  private dropped = false;

  constructor(o: PoolSource['o']) {
    this.o = o;
  }

  /** The API server's version, once read (null: not known; counter slices are written). */
  setServerVersion(v: ServerVersion | null): void {
    if (v?.major !== this.server?.major || v?.minor !== this.server?.minor) this.saidTooOld = false;
    this.server = v;
  }

  /** The snapshot's PCIe roots not read yet. */
  async readPcieRoots(s: NodeSnapshot): Promise<void> {
    for (const g of s.gpus) {
      if (this.pcieRoots.has(g.busId)) continue;
      let root: string | null = null;
      try {
        root = pcieRootOfPath(await realpath(join(this.o.sysfsRoot, 'bus', 'pci', 'devices', standardBusId(g.busId))));
      } catch {
        root = null;
      }
      this.pcieRoots.set(g.busId, root);
    }
  }

  /**
   * The API server stored a counter-set slice without its counter sets: its DRAPartitionableDevices feature gate
   * is off (the default before 1.36). From now on MIG-mode GPUs are published without partitions.
   */
  countersDropped(): void {
    if (this.dropped) return;
    this.dropped = true;
    this.o.log.error(
      "DRA: dra.dynamicMig needs the API server's DRAPartitionableDevices feature gate (on by default from " +
        'Kubernetes 1.36): the server dropped the counter sets it was sent; MIG-mode GPUs are published with ' +
        'their MIG devices only',
    );
  }

  /**
   * A reload (SIGHUP): the API server's gate may have been turned on since, so counter sets are tried again (the
   * caller reads the version anew: a changed one is judged, and said, again).
   */
  retryCounters(): void {
    this.dropped = false;
  }

  private countersAllowed(): boolean {
    if (this.dropped) return false;
    const v = this.server;
    if (v === null || v.major > 1 || v.minor >= 35) return true;
    if (!this.saidTooOld) {
      this.saidTooOld = true;
      this.o.log.error(
        `DRA: dra.dynamicMig needs Kubernetes 1.35 or later (counter sets in ResourceSlices of their own); the API ` +
          `server is ${v.major}.${v.minor}: MIG-mode GPUs are published with their MIG devices only`,
      );
    }
    return false;
  }

  /** The pool of the snapshot under the plan's settings. */
  content(s: NodeSnapshot, plan: PlanSettings | undefined): PoolContent {
    this.lastDriverVersion = s.driverVersion ?? this.lastDriverVersion;
    const roots = new Map<string, string>();
    for (const g of s.gpus) {
      const r = this.pcieRoots.get(g.busId);
      if (r !== undefined && r !== null) roots.set(g.busId, r);
    }
    const capacity = plan?.consumableCapacity;
    const partitionable = plan?.dynamicMig === true ? s.mig.partitionable : undefined;
    return poolContent(
      s,
      {
        nodeName: this.o.nodeName,
        migStrategy: plan?.migStrategy ?? 'none',
        pcieRoots: roots,
        ...(this.lastDriverVersion !== null ? { lastDriverVersion: this.lastDriverVersion } : {}),
        ...(capacity !== undefined ? { consumableCapacity: capacity } : {}),
        ...(partitionable !== undefined && this.countersAllowed() ? { partitionable } : {}),
      },
      this.o.driver,
    );
  }
}
