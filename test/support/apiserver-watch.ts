// Watch for the API server stand-in (apiserver.ts): `GET …/resourceslices?watch=true` answers 200 and
// then newline-delimited JSON events, as the real server does (chunked, one
// {"type","object"} per line), with its resourceVersion semantics:
// - resourceVersion absent or "0": an ADDED event for each matching object now, then the changes;
// - resourceVersion R: every change after R that the bounded history still holds, then the changes;
//   R older than the history (compacted, as etcd compacts) → an ERROR event holding a 410 Expired
//   Status, then the end — the client must list again;
// - allowWatchBookmarks=true: bookmark() sends a BOOKMARK with the current resourceVersion;
// - timeoutSeconds: the server ends the watch then (no event), as the real one does;
// - field and label selectors filter the events (the caller's `matches`).
// cut() ends every open watch: abruptly (the connection dropped) or with a 410 ERROR event.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Json, JsonObject } from './apiserver.ts';

export type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface Recorded {
  readonly rv: number;
  readonly type: EventType;
  readonly object: JsonObject;
}

interface Watcher {
  readonly res: ServerResponse;
  readonly matches: (o: JsonObject) => boolean;
  readonly bookmarks: boolean;
  readonly timer: NodeJS.Timeout | undefined;
}

function expired(rv: string, oldest: number): Json {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message: `too old resource version: ${rv} (${oldest})`,
    reason: 'Expired',
    code: 410,
  };
}

export class WatchHub {
  private readonly history: Recorded[] = [];
  /** A watch from a resourceVersion below this gets 410: the history before it is gone. */
  private oldest = 0;
  private readonly open = new Set<Watcher>();
  private readonly max: number;
  /** Watches opened (tests wait on this). */
  opened = 0;

  constructor(max = 200) {
    this.max = max;
  }

  get openCount(): number {
    return this.open.size;
  }

  /** A change of an object, at its new resourceVersion: kept in the history, sent to the open watches. */
  record(type: EventType, object: JsonObject, rv: number): void {
    this.history.push({ rv, type, object });
    while (this.history.length > this.max) this.oldest = (this.history.shift() as Recorded).rv;
    for (const w of this.open) if (w.matches(object)) this.send(w, { type, object });
  }

  /** Drops the whole history (etcd's compaction): a watch from a resourceVersion below `rv` gets 410. */
  compact(rv: number): void {
    this.history.length = 0;
    this.oldest = rv;
  }

  /** A BOOKMARK with resourceVersion `rv` to every open watch that asked for them. */
  bookmark(rv: number, apiVersion: string, kind: string): void {
    for (const w of this.open) {
      if (w.bookmarks)
        this.send(w, { type: 'BOOKMARK', object: { apiVersion, kind, metadata: { resourceVersion: String(rv) } } });
    }
  }

  /** Ends every open watch: the connection dropped, or (gone) a 410 ERROR event and a clean end. */
  cut(gone = false): number {
    const n = this.open.size;
    for (const w of [...this.open]) {
      this.close(w);
      if (gone) {
        w.res.end(`${JSON.stringify({ type: 'ERROR', object: expired(String(this.oldest), this.oldest) })}\n`);
      } else w.res.socket?.destroy();
    }
    return n;
  }

  /** Answers a watch request; `now` lists the matching objects for a watch from "0". */
  serve(
    req: IncomingMessage,
    res: ServerResponse,
    url: URL,
    matches: (o: JsonObject) => boolean,
    now: () => JsonObject[],
  ): void {
    const rvParam = url.searchParams.get('resourceVersion') ?? '';
    const timeoutS = Number(url.searchParams.get('timeoutSeconds') ?? '0');
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    this.opened++;
    const from = rvParam === '' || rvParam === '0' ? null : Number(rvParam);
    if (from !== null && (!Number.isFinite(from) || from < this.oldest)) {
      res.end(`${JSON.stringify({ type: 'ERROR', object: expired(rvParam, this.oldest) })}\n`);
      return;
    }
    const w: Watcher = {
      res,
      matches,
      bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true',
      timer: timeoutS > 0 ? setTimeout(() => this.end(w), timeoutS * 1000) : undefined,
    };
    this.open.add(w);
    req.socket.on('close', () => this.close(w));
    if (from === null) for (const o of now()) this.send(w, { type: 'ADDED', object: o });
    else
      for (const e of this.history)
        if (e.rv > from && matches(e.object)) this.send(w, { type: e.type, object: e.object });
  }

  private send(w: Watcher, e: { type: string; object: Json }): void {
    w.res.write(`${JSON.stringify(e)}\n`);
  }

  private end(w: Watcher): void {
    this.close(w);
    w.res.end();
  }

  private close(w: Watcher): void {
    if (w.timer !== undefined) clearTimeout(w.timer);
    this.open.delete(w);
  }
}
