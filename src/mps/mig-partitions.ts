// Dynamic MIG's privileged side in the DRA sharing agent: the GPU and compute instances carved for claims, made
// through a port onto NVML (the instance calls need the mig/config capability the plugin has not), and the record
// that makes it crash-safe — kept in the agent's own state directory, written before each change to the GPU and
// after it, so a kill at any point (intent written, GPU instance made but not recorded, no compute instance yet)
// is finished or undone at the next sync. Each step comes from core/mig-instances.ts; an instance the record does
// not account for is never touched.
import { join } from 'node:path';
import { nextStep, parseRecord, serializeRecord } from '../core/mig-instances.ts';
import type { GpuInstanceNow, MadePartition, PartitionRequest, RecordEntry } from '../core/mig-instances.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { readRegularFile, writeFileSafely } from '../system/safe-fs.ts';
import { mkdir } from 'node:fs/promises';

/** The instance calls, by parent GPU UUID; each throws naming the GPU, the call and NVML's code and text. */
export interface MigPort {
  gpuInstances(parentUuid: string): Promise<readonly GpuInstanceNow[]>;
  /** A GPU instance of the profile at the placement: its id. */
  createGpuInstance(parentUuid: string, giProfileId: number, start: number, size: number): Promise<number>;
  /** One compute instance spanning the GPU instance: its id. */
  createComputeInstance(parentUuid: string, gi: number): Promise<number>;
  /** The MIG device of the instance pair: its UUID and the minors of its gi and ci capability device nodes. */
  migDevice(
    parentUuid: string,
    gi: number,
    ci: number,
  ): Promise<{ readonly uuid: string; readonly giCapMinor: number; readonly ciCapMinor: number }>;
  destroyComputeInstance(parentUuid: string, gi: number, ci: number): Promise<void>;
  destroyGpuInstance(parentUuid: string, gi: number): Promise<void>;
}

export const MIG_RECORD = 'mig-instances.json';
const MAX_RECORD_BYTES = 1024 * 1024;
/** Steps one entry may take in one call before it is called stuck (create GI, CI, and a read: 3 are needed). */
const MAX_STEPS = 6;

export class MigPartitions {
  private readonly port: MigPort;
  private readonly stateDir: string;
  private readonly log: Logger;
  private entries: RecordEntry[] = [];

  constructor(o: { readonly port: MigPort; readonly stateDir: string; readonly log: Logger }) {
    this.port = o.port;
    this.stateDir = o.stateDir;
    this.log = o.log;
  }

  private get file(): string {
    return join(this.stateDir, MIG_RECORD);
  }

  /** The record as the last agent left it (none: nothing carved). */
  async load(): Promise<void> {
    try {
      this.entries = parseRecord(await readRegularFile(this.stateDir, this.file, MAX_RECORD_BYTES));
    } catch {
      this.entries = [];
    }
  }

  /** The claims the record has partitions for. */
  claims(): string[] {
    return [...new Set(this.entries.map((e) => e.claimUid))];
  }

  private async save(): Promise<void> {
    await mkdir(this.stateDir, { recursive: true, mode: 0o700 });
    await writeFileSafely(this.stateDir, this.file, serializeRecord(this.entries), 0o600);
  }

  private async put(e: RecordEntry, was?: RecordEntry): Promise<RecordEntry> {
    this.entries = was === undefined ? [...this.entries, e] : this.entries.map((x) => (x === was ? e : x));
    await this.save();
    return e;
  }

  private async drop(e: RecordEntry): Promise<void> {
    this.entries = this.entries.filter((x) => x !== e);
    await this.save();
  }

  /** The claim's partitions made (or found made): throws naming the partition and what failed. */
  async ensure(claimUid: string, partitions: readonly PartitionRequest[]): Promise<MadePartition[]> {
    const made: MadePartition[] = [];
    for (const p of partitions) {
      try {
        made.push(await this.ensureOne(claimUid, p));
      } catch (err) {
        throw new Error(
          `MIG partition ${p.device} (profile ${p.giProfileId} at ${p.start}+${p.size}): ${errorText(err)}`,
        );
      }
    }
    return made;
  }

  private async ensureOne(claimUid: string, p: PartitionRequest): Promise<MadePartition> {
    let e = this.entries.find((x) => x.claimUid === claimUid && x.device === p.device);
    if (e === undefined) {
      const before = (await this.port.gpuInstances(p.parentUuid)).map((g) => g.gi);
      e = await this.put({ ...p, claimUid, before, gi: null, ci: null });
    }
    for (let i = 0; i < MAX_STEPS; i++) {
      const step = nextStep(e, await this.port.gpuInstances(p.parentUuid), true);
      switch (step.kind) {
        case 'create-gi': {
          const gi = await this.port
            .createGpuInstance(p.parentUuid, p.giProfileId, p.start, p.size)
            .catch(async (err: unknown) => {
              // Nothing was made: the intent goes, so no later look at this placement can take another's instance.
              await this.drop(e as RecordEntry);
              throw err;
            });
          e = await this.put({ ...e, gi }, e);
          this.log.info('MIG GPU instance created', { claim: claimUid, gpu: p.parentUuid, device: p.device, gi });
          break;
        }
        case 'adopt-gi':
          e = await this.put({ ...e, gi: step.gi }, e);
          break;
        case 'create-ci': {
          const ci = await this.port.createComputeInstance(p.parentUuid, step.gi);
          e = await this.put({ ...e, ci }, e);
          break;
        }
        case 'adopt-ci':
          e = await this.put({ ...e, ci: step.ci }, e);
          break;
        case 'ready': {
          const dev = await this.port.migDevice(p.parentUuid, step.gi, step.ci);
          return { ...p, gi: step.gi, ci: step.ci, ...dev };
        }
        default:
          throw new Error(`unexpected step ${step.kind} for a wanted partition`);
      }
    }
    throw new Error(`its instances did not settle after ${MAX_STEPS} steps`);
  }

  /** Every partition the record has for the claim destroyed (compute instance first); throws naming what failed. */
  async release(claimUid: string): Promise<void> {
    for (const entry of this.entries.filter((x) => x.claimUid === claimUid)) {
      let e = entry;
      for (let i = 0; i < MAX_STEPS; i++) {
        const step = nextStep(e, await this.port.gpuInstances(e.parentUuid), false);
        if (step.kind === 'forget') {
          await this.drop(e);
          break;
        }
        if (step.kind === 'destroy-ci') {
          await this.port.destroyComputeInstance(e.parentUuid, step.gi, step.ci);
          e = await this.put({ ...e, gi: step.gi, ci: null }, e);
        } else if (step.kind === 'destroy-gi') {
          await this.port.destroyGpuInstance(e.parentUuid, step.gi);
          this.log.info('MIG GPU instance destroyed', {
            claim: claimUid,
            gpu: e.parentUuid,
            device: e.device,
            gi: step.gi,
          });
        }
      }
    }
  }
}
