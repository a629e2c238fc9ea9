// One converging write of this node's ResourceSlices (the publisher's sync, slice-publisher.ts): read
// the node's slices of our driver fresh from the API server, and write only when what is there is not
// what we last had confirmed for the same content.
//
// * "Is it there?" is decided on what the API server confirmed to us, never on its JSON: each slice
//   we write is remembered by name with the uid and resourceVersion the server answered. A slice
//   listed with that uid and resourceVersion is ours, untouched; one missing, with another uid or
//   another resourceVersion (someone deleted, re-created or edited it) is written again. Comparing
//   the server's JSON with ours would see its defaults (canonical quantities, taints' timeAdded) as
//   changes and rewrite the slices for ever.
// * A server that drops dynamic MIG's counter sets (its DRAPartitionableDevices gate off) is told to the
//   caller, which publishes without them; the write stops before any partition device.
// * A write updates each slice in place with the pool generation one above the highest seen (never
//   delete-and-create: a slice keeps its name and uid), creates the missing ones and deletes the
//   surplus; each carries an owner reference to the Node.
import type { CounterSet } from '../core/dynamic-mig.ts';
import type { PoolContent, SliceDevice } from '../core/dra-slices.ts';
import type { KubeClient } from '../k8s/client.ts';
import { createSlice, deleteSlice, listNodeSlices, updateSlice } from '../k8s/resources.ts';
import type { ResourceSlice } from '../k8s/resources.ts';

/** The slices' names: `<node>-<driver>-<n>`, the node part shortened if the whole would pass 253. */
export function sliceName(nodeName: string, driver: string, n: number): string {
  const suffix = `-${driver}-${n}`;
  return `${nodeName.slice(0, 253 - suffix.length).replace(/[-.]+$/, '')}${suffix}`;
}

/** A slice as the API server confirmed our write of it. */
export interface SliceStamp {
  readonly uid: string;
  readonly resourceVersion: string;
}

/** A pool the API server confirmed: what it meant (our own description), and each slice's stamp. */
export interface Confirmed {
  readonly key: string;
  readonly generation: number;
  readonly devices: number;
  readonly slices: ReadonlyMap<string, SliceStamp>;
}

export interface PoolTarget {
  readonly client: KubeClient;
  readonly nodeName: string;
  readonly driver: string;
  /** The Node's uid for the owner reference (null: no owner reference). */
  readonly nodeUid: string | null;
}

/** Whether the listed slices are exactly the ones confirmed (same names, uids and resourceVersions). */
export function untouched(listed: readonly ResourceSlice[], confirmed: Confirmed): boolean {
  if (listed.length !== confirmed.slices.size) return false;
  return listed.every((s) => {
    const stamp = confirmed.slices.get(s.metadata.name ?? '');
    return stamp !== undefined && stamp.uid === s.metadata.uid && stamp.resourceVersion === s.metadata.resourceVersion;
  });
}

/** What changed between the confirmed slices and the listed ones, for the log (e.g. "deleted x"). */
export function driftText(listed: readonly ResourceSlice[], confirmed: Confirmed): string {
  const byName = new Map(listed.map((s) => [s.metadata.name ?? '', s]));
  const parts: string[] = [];
  for (const [name, stamp] of confirmed.slices) {
    const s = byName.get(name);
    if (s === undefined) parts.push(`${name} deleted`);
    else if (s.metadata.uid !== stamp.uid) parts.push(`${name} re-created`);
    else if (s.metadata.resourceVersion !== stamp.resourceVersion) parts.push(`${name} changed`);
  }
  for (const name of byName.keys()) if (!confirmed.slices.has(name)) parts.push(`${name} added`);
  return parts.join(', ');
}

/**
 * Lists the node's slices and, unless they are the confirmed ones of the same content, writes the
 * pool. Returns the new confirmation (the old one when nothing was written) and what was listed.
 * Throws what the API server says; a failure leaves nothing confirmed for the caller to trust.
 */
export async function convergePool(
  t: PoolTarget,
  content: PoolContent,
  key: string,
  last: Confirmed | null,
): Promise<{ confirmed: Confirmed; wrote: boolean; drift: string; countersDropped: boolean }> {
  const existing = await listNodeSlices(t.client, t.nodeName, t.driver);
  if (last !== null && last.key === key && untouched(existing, last))
    return { confirmed: last, wrote: false, drift: '', countersDropped: false };
  const drift = last === null ? '' : driftText(existing, last);
  const generation = Math.max(last?.generation ?? 0, ...existing.map((s) => s.spec?.pool?.generation ?? 0)) + 1;
  const { stamps: slices, countersDropped } = await writePool(t, content, existing, generation);
  const devices = content.slices.reduce((n, sl) => n + sl.length, 0);
  return { confirmed: { key, generation, devices, slices }, wrote: true, drift, countersDropped };
}

async function writePool(
  t: PoolTarget,
  content: PoolContent,
  existing: readonly ResourceSlice[],
  generation: number,
): Promise<{ stamps: Map<string, SliceStamp>; countersDropped: boolean }> {
  // Dynamic MIG's counter sets first, in slices of their own (a slice holds counter sets or devices, never both).
  const parts: { readonly devices?: readonly SliceDevice[]; readonly sharedCounters?: readonly CounterSet[] }[] = [
    ...(content.counterSets ?? []).map((sharedCounters) => ({ sharedCounters })),
    ...content.slices.map((devices) => ({ devices })),
  ];
  const count = parts.length;
  const names = parts.map((_, i) => sliceName(t.nodeName, t.driver, i));
  const byName = new Map(existing.map((s) => [s.metadata.name ?? '', s]));
  // Slices of ours under other names (another version, NVIDIA's generated names) are reused in
  // place for the slices we would otherwise create.
  const spare = existing.filter((s) => !names.includes(s.metadata.name ?? ''));
  const owner =
    t.nodeUid === null ? [] : [{ apiVersion: 'v1', kind: 'Node', name: t.nodeName, uid: t.nodeUid, controller: true }];
  const body = (name: string, part: (typeof parts)[number], from?: ResourceSlice): ResourceSlice => ({
    metadata: {
      name,
      ...(from?.metadata.resourceVersion !== undefined ? { resourceVersion: from.metadata.resourceVersion } : {}),
      ...(from?.metadata.uid !== undefined ? { uid: from.metadata.uid } : {}),
      ownerReferences: owner,
    },
    spec: {
      driver: t.driver,
      nodeName: t.nodeName,
      pool: { name: content.pool, generation, resourceSliceCount: count },
      ...(part.sharedCounters !== undefined
        ? { sharedCounters: part.sharedCounters }
        : { devices: part.devices ?? [] }),
    },
  });
  const stamps = new Map<string, SliceStamp>();
  for (let i = 0; i < count; i++) {
    const part = parts[i] as (typeof parts)[number];
    const name = names[i] as string;
    const there = byName.get(name) ?? spare.shift();
    const got =
      there !== undefined
        ? await updateSlice(t.client, body(there.metadata.name ?? name, part, there))
        : await createSlice(t.client, body(name, part));
    stamps.set(got.metadata.name ?? name, {
      uid: got.metadata.uid ?? '',
      resourceVersion: got.metadata.resourceVersion ?? '',
    });
    // A server whose DRAPartitionableDevices gate is off stores the slice without its counter sets. The
    // partitions would then count nothing: stop before writing them, leaving the pool incomplete (unused).
    if (part.sharedCounters !== undefined && (got.spec.sharedCounters ?? []).length === 0)
      return { stamps, countersDropped: true };
  }
  for (const s of spare) await deleteSlice(t.client, s.metadata.name ?? '', s.metadata.uid);
  return { stamps, countersDropped: false };
}
