// The publisher's watch of its own ResourceSlices (as the ResourceSlice controller of Kubernetes'
// dynamic-resource-allocation library keeps one): someone may delete or edit a slice of ours
// (`kubectl delete resourceslice`, a clean-up script, the kubelet's wipe), and the node would then
// offer nothing until our next change. List the node's slices of our driver, then watch from the
// list's resourceVersion; every event and every list goes to the publisher, which compares with what
// the API server confirmed to it and syncs when they differ.
//
// * The watch ends (the server's timeoutSeconds, a restart, a cut connection): watch again from the
//   last resourceVersion seen (bookmarks move it on); if that cannot be opened, list again.
// * 410 Gone (the resourceVersion is older than the server keeps, as an answer or an ERROR event):
//   list again at once.
// * Anything that fails is retried with capped backoff; it logs at debug level only, the publisher's
//   own syncs tell the operator whether the API server answers. A 401 is the exception: the publisher
//   may have nothing to write while the server no longer takes our credentials (its client CA rotated
//   before the node's certificate), so the watch says so once (ERROR), and once (INFO) when a list
//   succeeds again with the renewed files.
import { KubeApiError } from '../k8s/client.ts';
import type { KubeClient } from '../k8s/client.ts';
import { listNodeSlicesAt, nodeSliceSelector, RESOURCE_API } from '../k8s/resources.ts';
import type { ResourceSlice } from '../k8s/resources.ts';
import { isGone, openWatch } from '../k8s/watch.ts';
import type { OpenWatch, WatchEvent } from '../k8s/watch.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';
import { UNAUTHENTICATED } from './slice-log.ts';

export interface SliceWatchOptions {
  readonly client: KubeClient;
  readonly nodeName: string;
  readonly driver: string;
  readonly log: Logger;
  /** A list of the node's slices of our driver (at the start and after each 410 or failure). */
  readonly onList: (items: readonly ResourceSlice[]) => void;
  readonly onEvent: (e: WatchEvent<ResourceSlice>) => void;
  /** Retry delays: the first, doubled up to the cap. Default 1 s to 30 s. */
  readonly backoff?: { readonly initialMs: number; readonly maxMs: number };
  /** How long the server keeps one watch open (default 300 s). */
  readonly timeoutSeconds?: number;
}

export class SliceWatch {
  private readonly o: SliceWatchOptions;
  private readonly timers = new TimerOwner();
  private rv: string | null = null;
  private open: OpenWatch | null = null;
  private stopped = false;
  private delayMs: number;
  private warnedForbidden = false;
  /** The last list or watch got a 401, logged; cleared (with an INFO) by the next list that succeeds. */
  private refused = false;
  /** Lists made, watches opened (tests and the log). */
  lists = 0;
  watches = 0;

  constructor(o: SliceWatchOptions) {
    this.o = o;
    this.delayMs = o.backoff?.initialMs ?? 1000;
  }

  start(): void {
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
    this.timers.dispose();
    this.open?.stop();
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      try {
        await this.once();
      } catch (err) {
        if (this.stopped) return;
        // Gone: the resourceVersion is too old, list again at once. Anything else: list again after a wait.
        const gone = isGone(err);
        this.rv = null;
        if (gone) continue;
        if (err instanceof KubeApiError && err.code === 401 && !this.refused) {
          this.refused = true;
          this.o.log.error(UNAUTHENTICATED, { node: this.o.nodeName, error: errorText(err) });
        }
        if (err instanceof KubeApiError && err.code === 403 && !this.warnedForbidden) {
          this.warnedForbidden = true;
          this.o.log.warn(
            'DRA: the credentials may not watch our ResourceSlices; a slice someone else deletes is restored only at ' +
              'the periodic resync (apply the RBAC shipped with the package: it grants watch)',
            { node: this.o.nodeName, error: errorText(err) },
          );
        }
        this.o.log.debug('DRA: the watch of our ResourceSlices failed; listing again', {
          node: this.o.nodeName,
          error: errorText(err),
          retryMs: this.delayMs,
        });
        await this.timers.sleep('retry', this.delayMs);
        this.delayMs = Math.min(this.delayMs * 2, this.o.backoff?.maxMs ?? 30_000);
      }
    }
  }

  /** One list (when needed) and one watch until it ends. */
  private async once(): Promise<void> {
    const { client, nodeName, driver } = this.o;
    if (this.rv === null) {
      const list = await listNodeSlicesAt(client, nodeName, driver);
      this.lists++;
      this.rv = list.resourceVersion;
      if (this.refused) {
        this.refused = false;
        this.o.log.info('DRA: the API server accepts our credentials again; our ResourceSlices are watched', {
          node: nodeName,
        });
      }
      this.o.onList(list.items);
    }
    if (this.stopped) return;
    const w = await openWatch<ResourceSlice>(client, {
      path: `${RESOURCE_API}/resourceslices`,
      fieldSelector: nodeSliceSelector(nodeName, driver),
      resourceVersion: this.rv,
      ...(this.o.timeoutSeconds !== undefined ? { timeoutSeconds: this.o.timeoutSeconds } : {}),
      onEvent: (e) => {
        const rv = e.object.metadata?.resourceVersion;
        if (rv !== undefined && rv !== '') this.rv = rv;
        if (e.type !== 'BOOKMARK') this.o.onEvent(e);
      },
    });
    this.watches++;
    this.open = w;
    if (this.stopped) w.stop();
    const opened = Date.now();
    const end = await w.ended;
    this.open = null;
    // A server that ends every watch at once must not make this a busy loop.
    if (Date.now() - opened < 1000) {
      await this.timers.sleep('retry', this.delayMs);
      this.delayMs = Math.min(this.delayMs * 2, this.o.backoff?.maxMs ?? 30_000);
    } else this.delayMs = this.o.backoff?.initialMs ?? 1000;
    if (end.how === 'gone') this.rv = null;
    if (end.how !== 'closed') {
      this.o.log.debug('DRA: the watch of our ResourceSlices ended; watching again', {
        node: nodeName,
        how: end.how,
        ...(end.how === 'gone' ? { message: end.message } : { error: end.error }),
      });
    }
  }
}
