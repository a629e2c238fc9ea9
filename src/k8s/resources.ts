// The REST paths the DRA driver uses, typed to the fields it reads or writes: ResourceSlices
// (resource.k8s.io/v1: list by node and driver, create, update, delete), a ResourceClaim get, a Node
// get, the DeviceClass list `check` reads, and the start-time access check (SelfSubjectAccessReview,
// authorization.k8s.io/v1).
import type { KubeClient } from './client.ts';
import { KubeApiError } from './client.ts';

export const RESOURCE_API = '/apis/resource.k8s.io/v1';

export interface ObjectMeta {
  readonly name?: string;
  readonly generateName?: string;
  readonly namespace?: string;
  readonly uid?: string;
  readonly resourceVersion?: string;
  readonly generation?: number;
  readonly labels?: Readonly<Record<string, string>>;
  readonly ownerReferences?: readonly OwnerReference[];
}

export interface OwnerReference {
  readonly apiVersion: string;
  readonly kind: string;
  readonly name: string;
  readonly uid: string;
  readonly controller?: boolean;
}

export interface ResourceSliceSpec {
  readonly driver: string;
  readonly nodeName: string;
  readonly pool: { readonly name: string; readonly generation: number; readonly resourceSliceCount: number };
  /** A slice holds devices or, for partitionable devices, counter sets (sharedCounters), never both. */
  readonly devices?: readonly unknown[];
  readonly sharedCounters?: readonly unknown[];
}

export interface ResourceSlice {
  readonly apiVersion?: string;
  readonly kind?: string;
  readonly metadata: ObjectMeta;
  readonly spec: ResourceSliceSpec;
}

interface List<T> {
  readonly metadata?: { readonly resourceVersion?: string };
  readonly items: readonly T[];
}

export interface NodeObject {
  readonly metadata: ObjectMeta;
}

export interface ResourceClaimObject {
  readonly metadata: ObjectMeta;
  readonly spec?: unknown;
  readonly status?: unknown;
}

/** The field selector of one node's slices of one driver (for a list and a watch). */
export function nodeSliceSelector(nodeName: string, driver: string): string {
  return `spec.nodeName=${nodeName},spec.driver=${driver}`;
}

/** The slices of one driver on one node. */
export async function listNodeSlices(c: KubeClient, nodeName: string, driver: string): Promise<ResourceSlice[]> {
  return (await listNodeSlicesAt(c, nodeName, driver)).items;
}

/** The slices of one driver on one node, with the list's resourceVersion (to watch from). */
export async function listNodeSlicesAt(
  c: KubeClient,
  nodeName: string,
  driver: string,
): Promise<{ items: ResourceSlice[]; resourceVersion: string }> {
  const list = await c.request<List<ResourceSlice>>('GET', `${RESOURCE_API}/resourceslices`, {
    query: { fieldSelector: nodeSliceSelector(nodeName, driver) },
  });
  return { items: [...(list?.items ?? [])], resourceVersion: list?.metadata?.resourceVersion ?? '' };
}

export function createSlice(c: KubeClient, slice: ResourceSlice): Promise<ResourceSlice> {
  return c.request<ResourceSlice>('POST', `${RESOURCE_API}/resourceslices`, {
    body: { apiVersion: 'resource.k8s.io/v1', kind: 'ResourceSlice', ...slice },
  });
}

/** Update in place; metadata.resourceVersion makes it conditional (a stale one → 409 Conflict). */
export function updateSlice(c: KubeClient, slice: ResourceSlice): Promise<ResourceSlice> {
  const name = slice.metadata.name ?? '';
  return c.request<ResourceSlice>('PUT', `${RESOURCE_API}/resourceslices/${encodeURIComponent(name)}`, {
    body: { apiVersion: 'resource.k8s.io/v1', kind: 'ResourceSlice', ...slice },
  });
}

/** Delete, on condition that it is still this uid; a slice already gone is no error. */
export async function deleteSlice(c: KubeClient, name: string, uid?: string): Promise<void> {
  try {
    await c.request('DELETE', `${RESOURCE_API}/resourceslices/${encodeURIComponent(name)}`, {
      body: { apiVersion: 'v1', kind: 'DeleteOptions', ...(uid !== undefined ? { preconditions: { uid } } : {}) },
    });
  } catch (err) {
    if (err instanceof KubeApiError && err.code === 404) return;
    throw err;
  }
}

/** The API server's version (GET /version) as major and minor numbers; null when it does not say. */
export async function serverVersion(c: KubeClient): Promise<{ readonly major: number; readonly minor: number } | null> {
  const v = (await c.request('GET', '/version')) as { gitVersion?: unknown } | null;
  const m = typeof v?.gitVersion === 'string' ? /^v(\d+)\.(\d+)/.exec(v.gitVersion) : null;
  return m === null ? null : { major: Number(m[1]), minor: Number(m[2]) };
}

export function getNode(c: KubeClient, name: string): Promise<NodeObject> {
  return c.request<NodeObject>('GET', `/api/v1/nodes/${encodeURIComponent(name)}`);
}

export function getResourceClaim(c: KubeClient, namespace: string, name: string): Promise<ResourceClaimObject> {
  return c.request<ResourceClaimObject>(
    'GET',
    `${RESOURCE_API}/namespaces/${encodeURIComponent(namespace)}/resourceclaims/${encodeURIComponent(name)}`,
  );
}

export interface DeviceClassObject {
  readonly metadata: ObjectMeta;
  readonly spec?: { readonly extendedResourceName?: string; readonly selectors?: readonly unknown[] };
}

/** Every DeviceClass of the cluster (cluster-scoped; `check` compares them with what the node publishes). */
export async function listDeviceClasses(c: KubeClient, timeoutMs?: number): Promise<DeviceClassObject[]> {
  const list = await c.request<List<DeviceClassObject>>('GET', `${RESOURCE_API}/deviceclasses`, {
    ...(timeoutMs === undefined ? {} : { timeoutMs }),
  });
  return [...(list?.items ?? [])];
}

/** One permission the driver needs. */
export interface AccessNeed {
  readonly verb: string;
  readonly group: string;
  readonly resource: string;
  readonly name?: string;
}

/**
 * What the DRA driver does on the API server, asked at its start (the RBAC shipped with it grants this, and `list
 * deviceclasses` for `check`, left out here so that a role applied before that rule does not stop the start).
 */
export const DRA_ACCESS: readonly AccessNeed[] = [
  { verb: 'list', group: 'resource.k8s.io', resource: 'resourceslices' },
  { verb: 'create', group: 'resource.k8s.io', resource: 'resourceslices' },
  { verb: 'update', group: 'resource.k8s.io', resource: 'resourceslices' },
  { verb: 'delete', group: 'resource.k8s.io', resource: 'resourceslices' },
  { verb: 'get', group: 'resource.k8s.io', resource: 'resourceclaims' },
  { verb: 'get', group: '', resource: 'nodes' },
];

/** The access check's verdict: every need allowed, or which ones are not (and the server's reasons). */
export type AccessVerdict = { readonly ok: true } | { readonly ok: false; readonly denied: readonly string[] };

function needText(n: AccessNeed): string {
  return `${n.verb} ${n.resource}${n.group === '' ? '' : `.${n.group}`}${n.name === undefined ? '' : ` ${n.name}`}`;
}

/**
 * Asks the API server whether these credentials may do each need (a SelfSubjectAccessReview each,
 * which every authenticated user may create). Rejects only when the server cannot be asked (down,
 * or the review API itself refused): the caller retries or reports.
 */
export async function checkAccess(
  c: KubeClient,
  needs: readonly AccessNeed[] = DRA_ACCESS,
  timeoutMs?: number,
): Promise<AccessVerdict> {
  const denied: string[] = [];
  for (const n of needs) {
    const review = await c.request<{ status?: { allowed?: boolean; denied?: boolean; reason?: string } }>(
      'POST',
      '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
      {
        body: {
          apiVersion: 'authorization.k8s.io/v1',
          kind: 'SelfSubjectAccessReview',
          spec: {
            resourceAttributes: {
              verb: n.verb,
              group: n.group,
              resource: n.resource,
              ...(n.name !== undefined ? { name: n.name } : {}),
            },
          },
        },
        ...(timeoutMs === undefined ? {} : { timeoutMs }),
      },
    );
    if (review?.status?.allowed !== true)
      denied.push(`${needText(n)}${review?.status?.reason ? ` (${review.status.reason})` : ''}`);
  }
  return denied.length === 0 ? { ok: true } : { ok: false, denied };
}
