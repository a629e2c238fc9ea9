// What the DRA sharing agent (root) accepts of a request the plugin wrote: the agent trusts the plugin only about
// which claim gets which of this node's devices with which limits, so a request is checked like input from
// the API — its claim named as Kubernetes names one, every GPU or MIG device one that NVML lists on this node,
// every value in range — and against what the agent already serves: no GPU shared by more claims than the
// operator allows, no exclusive MPS claim on a GPU another claim holds (so a compute mode set for one claim is
// only ever put back when that claim ends), and the claims' shm tmpfs sizes within the operator's total.
// The whole-GPU index a daemon's compute mode goes by is NVML's, never the request's. A daemon's unit named by a
// partition of the same request (dynamic MIG) is resolved to the MIG device once the agent has made it.
import { claimUidProblem } from './dra-claims.ts';
import type { HostMps, HostMpsUnit, HostRequest } from './dra-sharing.ts';
import { partitionProblem } from './mig-instances.ts';
import type { MadePartition, PartitionRequest } from './mig-instances.ts';

/** A device of this node as NVML lists it: a whole GPU, or a MIG device with its parent GPU. */
export interface HostUnit {
  readonly uuid: string;
  /** The whole GPU it is (its own UUID) or lives on. */
  readonly gpuUuid: string;
  /** NVML's index of the whole GPU; absent for a MIG device. */
  readonly gpuIndex?: number;
  readonly memoryMiB: number;
}

/** This node's devices by UUID. */
export type HostInventory = ReadonlyMap<string, HostUnit>;

/** What the operator allows the agent to serve (README: Security model). */
export interface AdmissionLimits {
  /** Claims that may hold one GPU at once (time-slices, MPS daemons, MIG devices of it). */
  readonly maxClaimsPerGpu: number;
  /** Each MPS claim's shm tmpfs size, in bytes. */
  readonly shmBytesPerClaim: number;
  /** The sum of every MPS claim's shm tmpfs size, in bytes. */
  readonly shmBytesTotal: number;
}

export type Admission = { readonly request: HostRequest } | { readonly error: string };

const DNS_LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/;

const shown = (s: string): string => JSON.stringify(s.length > 80 ? `${s.slice(0, 80)}…` : s);

function claimProblem(r: HostRequest): string | null {
  const uid = claimUidProblem(r.claim.uid);
  if (uid !== null) return uid;
  if (!DNS_LABEL.test(r.claim.namespace))
    return `the namespace ${shown(r.claim.namespace)} is not a Kubernetes namespace (a DNS label)`;
  if (!DNS_SUBDOMAIN.test(r.claim.name))
    return `the claim name ${shown(r.claim.name)} is not a Kubernetes object name (a DNS subdomain)`;
  return null;
}

/** The unit as NVML lists it, with NVML's index; an error names what is wrong with the request's. */
function checkUnit(u: HostMpsUnit, at: string, inventory: HostInventory): HostMpsUnit | string {
  const unit = inventory.get(u.uuid);
  if (unit === undefined) return `${at}: ${shown(u.uuid)} is no GPU or MIG device of this node (NVML lists it not)`;
  if (unit.gpuIndex === undefined && u.gpuIndex !== undefined)
    return `${at}: ${u.uuid} is a MIG device, which has no compute mode of its own; gpuIndex is not allowed`;
  if (unit.gpuIndex !== undefined && u.gpuIndex !== undefined && u.gpuIndex !== unit.gpuIndex)
    return `${at}: gpuIndex ${u.gpuIndex} is not GPU ${u.uuid}'s (NVML's index is ${unit.gpuIndex})`;
  if (!Number.isInteger(u.pinnedMemLimitMiB) || u.pinnedMemLimitMiB < 1 || u.pinnedMemLimitMiB > unit.memoryMiB)
    return (
      `${at}: pinnedMemLimitMiB ${u.pinnedMemLimitMiB} is not a whole number ` +
      `from 1 to ${unit.memoryMiB} (its memory)`
    );
  return {
    uuid: u.uuid,
    ...(unit.gpuIndex === undefined ? {} : { gpuIndex: unit.gpuIndex }),
    pinnedMemLimitMiB: u.pinnedMemLimitMiB,
  };
}

/**
 * Units named by partition: each one of the request's own partitions, once, never in an exclusive daemon, with a
 * limit (if any) within its parent GPU's memory (the instance's own is checked once it is made: resolveMpsUnits).
 */
function checkPartitionUnits(m: HostMps, partitions: readonly PartitionRequest[], inventory: HostInventory) {
  const seen = new Set<string>();
  for (const [i, u] of (m.partitionUnits ?? []).entries()) {
    const at = `mps.partitionUnits[${i}]`;
    const p = partitions.find((x) => x.device === u.partition);
    if (p === undefined) return `${at}: ${shown(u.partition)} is none of the request's partitions`;
    if (seen.has(u.partition)) return `${at}: partition ${u.partition} named twice`;
    seen.add(u.partition);
    if (m.exclusive) return `${at}: ${u.partition} is a MIG device; an exclusive daemon is for whole GPUs only`;
    const most = inventory.get(p.parentUuid)?.memoryMiB ?? 0;
    const l = u.pinnedMemLimitMiB;
    if (l !== undefined && (!Number.isInteger(l) || l < 1 || l > most))
      return `${at}: pinnedMemLimitMiB ${l} is not a whole number from 1 to ${most} (its GPU's memory)`;
  }
  return null;
}

function checkMps(m: HostMps, partitions: readonly PartitionRequest[], inventory: HostInventory): HostMps | string {
  const t = m.activeThreadPercentage;
  if (!Number.isInteger(t) || t < 1 || t > 100)
    return `mps.activeThreadPercentage ${t} is not a whole number from 1 to 100`;
  if (new Set(m.units.map((u) => u.uuid)).size !== m.units.length) return 'mps.units names one device twice';
  const units: HostMpsUnit[] = [];
  for (const [i, u] of m.units.entries()) {
    const checked = checkUnit(u, `mps.units[${i}]`, inventory);
    if (typeof checked === 'string') return checked;
    if (m.exclusive && checked.gpuIndex === undefined)
      return `mps.units[${i}]: ${u.uuid} is a MIG device; an exclusive daemon is for whole GPUs only`;
    units.push(checked);
  }
  const byPartition = checkPartitionUnits(m, partitions, inventory);
  if (byPartition !== null) return byPartition;
  const rest = m.partitionUnits === undefined ? {} : { partitionUnits: m.partitionUnits };
  return { activeThreadPercentage: t, exclusive: m.exclusive, units, ...rest };
}

/**
 * The daemon's units once the request's partitions are made: each unit named by partition resolved to the MIG
 * device made for it, with its limit, or the instance's whole memory as NVML lists it; an error names the unit.
 */
export function resolveMpsUnits(
  m: HostMps,
  made: readonly MadePartition[],
  inventory: HostInventory,
): HostMps | { readonly error: string } {
  const units: HostMpsUnit[] = [...m.units];
  for (const [i, u] of (m.partitionUnits ?? []).entries()) {
    const at = `mps.partitionUnits[${i}] (${u.partition})`;
    const p = made.find((x) => x.device === u.partition);
    if (p === undefined) return { error: `${at}: no MIG device was made for it` };
    const memory = inventory.get(p.uuid)?.memoryMiB;
    if (memory === undefined) return { error: `${at}: its MIG device ${p.uuid} is not listed by NVML` };
    const l = u.pinnedMemLimitMiB ?? memory;
    if (l > memory) return { error: `${at}: pinnedMemLimitMiB ${l} is more than its MIG device's ${memory} MiB` };
    units.push({ uuid: p.uuid, pinnedMemLimitMiB: l });
  }
  return { activeThreadPercentage: m.activeThreadPercentage, exclusive: m.exclusive, units };
}

function checkPartitions(partitions: readonly PartitionRequest[], inventory: HostInventory): string | null {
  const devices = new Set<string>();
  for (const [i, p] of partitions.entries()) {
    const problem = partitionProblem(p);
    if (problem !== null) return `partitions[${i}]: ${problem}`;
    if (inventory.get(p.parentUuid)?.gpuIndex === undefined)
      return `partitions[${i}]: ${shown(p.parentUuid)} is no whole GPU of this node (NVML lists it not)`;
    if (devices.has(p.device)) return `partitions[${i}]: device ${p.device} named twice`;
    devices.add(p.device);
  }
  return null;
}

/** The request with NVML's indexes, or what is wrong with it on its own (before any other claim is looked at). */
function checkAlone(r: HostRequest, inventory: HostInventory): HostRequest | string {
  const claim = claimProblem(r);
  if (claim !== null) return claim;
  const seen = new Set<string>();
  for (const [i, t] of r.timeSlices.entries()) {
    const unit = inventory.get(t.uuid);
    if (unit?.gpuIndex === undefined)
      return `timeSlices[${i}]: ${shown(t.uuid)} is no whole GPU of this node (NVML lists it not)`;
    if (seen.has(t.uuid)) return `timeSlices[${i}]: GPU ${t.uuid} named twice`;
    seen.add(t.uuid);
  }
  const partitions = checkPartitions(r.partitions ?? [], inventory);
  if (partitions !== null) return partitions;
  if (r.mps === undefined) return r;
  const mps = checkMps(r.mps, r.partitions ?? [], inventory);
  return typeof mps === 'string' ? mps : { ...r, mps };
}

/** The whole GPUs a request holds (a MIG device holds its parent), and those it wants for itself alone. */
function gpusOf(r: HostRequest, inventory: HostInventory): { all: Set<string>; alone: Set<string> } {
  const all = new Set([...r.timeSlices.map((t) => t.uuid), ...(r.partitions ?? []).map((p) => p.parentUuid)]);
  const alone = new Set<string>();
  for (const u of r.mps?.units ?? []) {
    const gpu = inventory.get(u.uuid)?.gpuUuid ?? u.uuid;
    all.add(gpu);
    if (r.mps?.exclusive === true) alone.add(gpu);
  }
  return { all, alone };
}

const claimText = (r: HostRequest): string => `${r.claim.namespace}/${r.claim.name} (uid ${r.claim.uid})`;

function sharingProblem(r: HostRequest, held: readonly HostRequest[], inventory: HostInventory, l: AdmissionLimits) {
  const mine = gpusOf(r, inventory);
  for (const gpu of mine.all) {
    const holders = held.filter((h) => gpusOf(h, inventory).all.has(gpu));
    const exclusive = holders.find((h) => gpusOf(h, inventory).alone.has(gpu));
    if (exclusive !== undefined) return `GPU ${gpu} is held alone (exclusive MPS) by claim ${claimText(exclusive)}`;
    if (mine.alone.has(gpu) && holders.length > 0)
      return `an exclusive MPS daemon needs GPU ${gpu} alone, but claim ${claimText(holders[0] as HostRequest)} has it`;
    if (holders.length + 1 > l.maxClaimsPerGpu)
      return (
        `GPU ${gpu} is held by ${holders.length} claims already, the most --dra-max-claims-per-gpu ` +
        `(DRA_MAX_CLAIMS_PER_GPU) allows is ${l.maxClaimsPerGpu}`
      );
  }
  if (r.mps === undefined) return null;
  const daemons = held.filter((h) => h.mps !== undefined).length + 1;
  if (daemons * l.shmBytesPerClaim > l.shmBytesTotal)
    return (
      `${daemons} MPS claims with a ${l.shmBytesPerClaim}-byte shm each would pass --dra-mps-shm-total ` +
      `(DRA_MPS_SHM_TOTAL) of ${l.shmBytesTotal} bytes`
    );
  return null;
}

/**
 * Whether the agent serves `r` beside `held` (the other claims it serves now): the request as the agent will act
 * on it (NVML's indexes), or the reason it is refused, naming the field, the device or the limit.
 */
export function admitRequest(
  r: HostRequest,
  held: readonly HostRequest[],
  inventory: HostInventory,
  limits: AdmissionLimits,
): Admission {
  const checked = checkAlone(r, inventory);
  if (typeof checked === 'string') return { error: checked };
  const others = held.filter((h) => h.claim.uid !== r.claim.uid);
  const problem = sharingProblem(checked, others, inventory, limits);
  return problem === null ? { request: checked } : { error: problem };
}
