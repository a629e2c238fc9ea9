// What the ResourceSlice publisher tells the operator about the API server: one WARN when it stops
// answering (unreachable, timeout, 5xx), one INFO when a sync has really left the slices current
// again, never a line per retry; an error the server gives (401/403, 422, an unknown Node) is logged
// once per distinct text. It also keeps the backoff delay: doubled after each failure up to the cap,
// back to the first after a success.
import { KubeApiError, KubeUnreachableError } from '../k8s/client.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';

/** The API server has no Node of our name: slices for it would be owned by nothing and scheduled nowhere. */
export class NodeUnknownError extends Error {
  override name = 'NodeUnknownError';
  constructor(node: string, server: string) {
    super(
      `the API server ${server} has no Node named ${JSON.stringify(node)}; is the node name right (it must ` +
        `be the kubelet's --hostname-override or the host name), and has the kubelet registered the node?`,
    );
  }
}

export class PublishLog {
  private readonly log: Logger;
  private readonly where: { readonly server: string; readonly node: string };
  private readonly backoff: { readonly initialMs: number; readonly maxMs: number };
  private loggedError: string | null = null;
  private delayMs: number;
  /** The last failure's text while the API server fails us, else null. */
  failing: string | null = null;
  failures = 0;

  constructor(log: Logger, server: string, node: string, backoff?: { initialMs: number; maxMs: number }) {
    this.log = log;
    this.where = { server, node };
    this.backoff = backoff ?? { initialMs: 1000, maxMs: 30_000 };
    this.delayMs = this.backoff.initialMs;
  }

  /** A sync left the slices current. */
  succeeded(): void {
    this.delayMs = this.backoff.initialMs;
    this.loggedError = null;
    if (this.failing !== null) {
      this.log.info('DRA: the API server answers again; ResourceSlices are current', this.where);
      this.failing = null;
    }
  }

  /** A sync failed: logs it if it is news, and returns how long to wait before the retry. */
  failed(err: unknown): number {
    const text = errorText(err);
    if (err instanceof KubeUnreachableError || (err instanceof KubeApiError && (err.code >= 500 || err.code === 429))) {
      if (this.failing === null) {
        this.log.warn('DRA: the API server does not answer; ResourceSlices will be published when it does', {
          ...this.where,
          error: text,
        });
      }
    } else if (this.loggedError !== text) {
      this.log.error(refusal(err), { ...this.where, error: text });
      this.loggedError = text;
    }
    this.failing = text;
    this.failures++;
    const delay = this.delayMs;
    this.delayMs = Math.min(this.delayMs * 2, this.backoff.maxMs);
    return delay;
  }
}

/** The ERROR for a 401, from the publisher or the watch: renewed credential files are read without a restart. */
export const UNAUTHENTICATED =
  'DRA: the API server does not accept our credentials (401: an untrusted or expired client certificate, ' +
  "or an unknown token); ResourceSlices will be published once the kubeconfig's credential files are " +
  'renewed (they are re-read)';

/** The ERROR for a refusal: who is not authenticated (401) is told apart from what is not allowed (403). */
function refusal(err: unknown): string {
  if (err instanceof KubeApiError && err.code === 401) return UNAUTHENTICATED;
  if (err instanceof KubeApiError && err.code === 403)
    return 'DRA: the API server refuses our credentials; ResourceSlices cannot be published until the RBAC allows it';
  if (err instanceof NodeUnknownError)
    return 'DRA: ResourceSlices cannot be published for a node the API server does not know';
  return 'DRA: the API server refused the ResourceSlices';
}
