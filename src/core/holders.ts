// Which pod holds which device, from the kubelet's PodResources answer: each device ID of this
// plugin's resources (nvidia.com/...) traced back to its GPU — a whole GPU by UUID or index, a
// time-slicing replica `<id>::<n>` to the GPU it is cut from. IDs that name no GPU of the node
// (stale IDs, other nodes' devices) are kept apart, not dropped; MIG devices lead to their GPU
// through `carved`. Pure.
import { RESOURCE_DOMAIN, parseReplicaId } from './sharing.ts';

export interface PodDevices {
  readonly namespace: string;
  readonly pod: string;
  readonly containers: readonly {
    readonly name: string;
    readonly devices: readonly { readonly resource: string; readonly ids: readonly string[] }[];
  }[];
}

export interface Holder {
  readonly namespace: string;
  readonly pod: string;
  readonly container: string;
  readonly resource: string;
  readonly deviceId: string;
  /** The replica number when the device is a time-slicing replica. */
  readonly replica?: number;
}

/**
 * `carved`: IDs of devices carved from a GPU that are neither its UUID nor its index (MIG devices:
 * their `MIG-…` UUID or `<gpu index>:<MIG index>` index), with the GPU's position.
 */
export function deviceHolders(
  gpus: readonly { readonly index: number; readonly uuid: string }[],
  pods: readonly PodDevices[],
  carved: ReadonlyMap<string, number> = new Map(),
): { perGpu: Holder[][]; others: Holder[] } {
  const byId = new Map<string, number>(carved);
  gpus.forEach((g, pos) => {
    byId.set(g.uuid, pos);
    byId.set(String(g.index), pos);
  });
  const perGpu: Holder[][] = gpus.map(() => []);
  const others: Holder[] = [];
  for (const p of pods) {
    for (const c of p.containers) {
      for (const d of c.devices) {
        if (!d.resource.startsWith(`${RESOURCE_DOMAIN}/`)) continue;
        for (const id of d.ids) {
          const base = { namespace: p.namespace, pod: p.pod, container: c.name, resource: d.resource, deviceId: id };
          const replica = parseReplicaId(id);
          const pos = byId.get(replica === null ? id : replica.base);
          if (pos === undefined) others.push(base);
          else perGpu[pos]?.push(replica === null ? base : { ...base, replica: replica.replica });
        }
      }
    }
  }
  const order = (a: Holder, b: Holder): number =>
    `${a.namespace}/${a.pod}/${a.container}/${a.deviceId}` < `${b.namespace}/${b.pod}/${b.container}/${b.deviceId}`
      ? -1
      : 1;
  for (const list of perGpu) list.sort(order);
  others.sort(order);
  return { perGpu, others };
}

/** `namespace/pod/container`, with the replica (`#2`) when the device is one. */
export function holderText(h: Holder): string {
  return `${h.namespace}/${h.pod}/${h.container}${h.replica === undefined ? '' : ` (replica ${h.replica})`}`;
}
