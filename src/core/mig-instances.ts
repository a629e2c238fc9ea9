// Dynamic MIG on the privileged side, pure: what a claim asks the MPS unit's agent to carve (a GPU instance of a
// profile at a placement on a parent GPU, with one compute instance spanning it), the agent's record of what it
// carves, and the one next step that brings one record entry to what is wanted — from whatever state a crash
// left it in (the intent written, the GPU instance made but not recorded, no compute instance yet).
//
// OWNERSHIP. The agent only ever touches a GPU instance its record names, or one it finds at exactly the profile
// and placement its record says it was about to create *and* whose id was not there before (the record keeps the
// ids present at that moment): an instance someone else made — mig-parted, nvidia-smi, a static layout — is
// never adopted, finished or destroyed.
import { isObject } from './json.ts';

/** One partition a claim asks for: what `gpu-<minor>-mig-<profile>-<giProfileId>-<start>` stands for. */
export interface PartitionRequest {
  /** The DRA device name (the claim's allocation names it). */
  readonly device: string;
  readonly parentUuid: string;
  readonly giProfileId: number;
  readonly start: number;
  readonly size: number;
}

/**
 * One unit of a claim's MPS daemon that is a partition of the same request, named by its device name: its MIG UUID
 * exists only once the agent has made the instance, which then resolves it (core/dra-admission.ts). Without a
 * pinned-memory limit of its own (none configured), the daemon gives it the instance's whole memory.
 */
export interface PartitionMpsUnit {
  readonly partition: string;
  readonly pinnedMemLimitMiB?: number;
}

/** A partition's MPS unit from parsed JSON; throws naming what is wrong. */
export function parsePartitionMpsUnit(v: unknown, at: string): PartitionMpsUnit {
  if (!isObject(v) || typeof v.partition !== 'string')
    throw new Error(`${at}: needs partition (the device name of one of the request's partitions)`);
  const limit = v.pinnedMemLimitMiB;
  if (limit !== undefined && typeof limit !== 'number') throw new Error(`${at}.pinnedMemLimitMiB: not a number`);
  return { partition: v.partition, ...(limit === undefined ? {} : { pinnedMemLimitMiB: limit }) };
}

/** A partition made: its instances, the MIG device's UUID, and the minors of its two capability device nodes. */
export interface MadePartition extends PartitionRequest {
  readonly gi: number;
  readonly ci: number;
  readonly uuid: string;
  readonly giCapMinor: number;
  readonly ciCapMinor: number;
}

/** One entry of the agent's record: a partition of a claim, as far as it got. */
export interface RecordEntry extends PartitionRequest {
  readonly claimUid: string;
  /** GPU-instance ids on the parent when the intent was written: never this entry's. */
  readonly before: readonly number[];
  readonly gi: number | null;
  readonly ci: number | null;
}

/** A GPU instance on a GPU now, with its compute instances. */
export interface GpuInstanceNow {
  readonly gi: number;
  readonly profileId: number;
  readonly start: number;
  readonly size: number;
  readonly cis: readonly number[];
}

/** The next step for one entry. */
export type Step =
  | { readonly kind: 'create-gi' }
  /** The GPU instance is there but not recorded (a crash right after making it): record it. */
  | { readonly kind: 'adopt-gi'; readonly gi: number }
  | { readonly kind: 'create-ci'; readonly gi: number }
  | { readonly kind: 'adopt-ci'; readonly gi: number; readonly ci: number }
  | { readonly kind: 'ready'; readonly gi: number; readonly ci: number }
  | { readonly kind: 'destroy-ci'; readonly gi: number; readonly ci: number }
  | { readonly kind: 'destroy-gi'; readonly gi: number }
  /** Nothing of it on the GPU: the entry can go. */
  | { readonly kind: 'forget' };

/** The GPU instance this entry stands for now, by its recorded id, or found at its placement and not foreign. */
function instanceOf(e: RecordEntry, now: readonly GpuInstanceNow[]): GpuInstanceNow | undefined {
  // By its recorded id, and still at its profile and placement (an id freed and given to another's instance is not it).
  if (e.gi !== null) return now.find((g) => g.gi === e.gi && g.profileId === e.giProfileId && g.start === e.start);
  return now.find(
    (g) => g.profileId === e.giProfileId && g.start === e.start && g.size === e.size && !e.before.includes(g.gi),
  );
}

/** What to do next for `e` when its claim still wants it (`wanted`) or not, given the GPU's instances `now`. */
export function nextStep(e: RecordEntry, now: readonly GpuInstanceNow[], wanted: boolean): Step {
  const gi = instanceOf(e, now);
  if (!wanted) {
    if (gi === undefined) return { kind: 'forget' };
    const ci = gi.cis[0];
    return ci === undefined ? { kind: 'destroy-gi', gi: gi.gi } : { kind: 'destroy-ci', gi: gi.gi, ci };
  }
  if (gi === undefined) return { kind: 'create-gi' };
  if (e.gi === null) return { kind: 'adopt-gi', gi: gi.gi };
  const ci = e.ci !== null && gi.cis.includes(e.ci) ? e.ci : gi.cis[0];
  if (ci === undefined) return { kind: 'create-ci', gi: gi.gi };
  if (e.ci !== ci) return { kind: 'adopt-ci', gi: gi.gi, ci };
  return { kind: 'ready', gi: gi.gi, ci };
}

/** A partition request's fields checked (ranges of NVML's placements: 8 memory slices at most). */
export function partitionProblem(p: PartitionRequest): string | null {
  if (!/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(p.device))
    return `device ${JSON.stringify(p.device)} is no device name`;
  const whole = (n: number, lo: number, hi: number): boolean => Number.isInteger(n) && n >= lo && n <= hi;
  if (!whole(p.giProfileId, 0, 63)) return `${p.device}: giProfileId ${p.giProfileId} is not a whole number 0 to 63`;
  if (!whole(p.size, 1, 8) || !whole(p.start, 0, 7) || p.start + p.size > 8)
    return `${p.device}: placement ${p.start}+${p.size} is not within the GPU's 8 memory slices`;
  return null;
}

function int(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v);
}

/** A partition request from parsed JSON; throws naming what is wrong. */
export function parsePartition(v: unknown, at: string): PartitionRequest {
  if (
    !isObject(v) ||
    typeof v.device !== 'string' ||
    typeof v.parentUuid !== 'string' ||
    !int(v.giProfileId) ||
    !int(v.start) ||
    !int(v.size)
  )
    throw new Error(`${at}: needs device, parentUuid (strings), giProfileId, start and size (whole numbers)`);
  return { device: v.device, parentUuid: v.parentUuid, giProfileId: v.giProfileId, start: v.start, size: v.size };
}

/** A made partition from an answer's JSON; throws naming what is wrong. */
export function parseMadePartition(v: unknown, at: string): MadePartition {
  const p = parsePartition(v, at);
  if (
    !isObject(v) ||
    !int(v.gi) ||
    !int(v.ci) ||
    typeof v.uuid !== 'string' ||
    !int(v.giCapMinor) ||
    !int(v.ciCapMinor)
  )
    throw new Error(`${at}: needs gi, ci, giCapMinor, ciCapMinor (whole numbers) and uuid`);
  return { ...p, gi: v.gi, ci: v.ci, uuid: v.uuid, giCapMinor: v.giCapMinor, ciCapMinor: v.ciCapMinor };
}

/** The record's entries from its file's text; an entry that cannot be the agent's is dropped. */
export function parseRecord(text: string): RecordEntry[] {
  const doc: unknown = JSON.parse(text);
  if (!isObject(doc) || !Array.isArray(doc.entries)) return [];
  return doc.entries.flatMap((e: unknown, i) => {
    try {
      const p = parsePartition(e, `entries[${i}]`);
      if (!isObject(e) || typeof e.claimUid !== 'string' || !Array.isArray(e.before) || !e.before.every(int)) return [];
      const gi = int(e.gi) ? e.gi : null;
      const ci = int(e.ci) ? e.ci : null;
      return [{ ...p, claimUid: e.claimUid, before: e.before as number[], gi, ci }];
    } catch {
      return [];
    }
  });
}

export function serializeRecord(entries: readonly RecordEntry[]): string {
  return `${JSON.stringify({ entries }, null, 1)}\n`;
}
