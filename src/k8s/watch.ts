// One watch of a collection (`?watch=true`): the API server's answer is a stream of newline-delimited
// JSON events, {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}. openWatch() starts it
// from a resourceVersion (the one a list answered) with bookmarks asked for, hands each event to the
// caller and tells how it ended: the server closed it (its timeoutSeconds, a restart: re-watch from
// the last resourceVersion), it said 410 Gone (the resourceVersion is too old: list again), or the
// connection broke or went silent (re-watch, list again if that fails).
import type { IncomingMessage } from 'node:http';
import { KubeApiError } from './client.ts';
import type { KubeClient } from './client.ts';

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK';

export interface WatchEvent<T> {
  readonly type: WatchEventType;
  readonly object: T;
}

/** How a watch ended. */
export type WatchEnd =
  | { readonly how: 'closed' }
  | { readonly how: 'gone'; readonly message: string }
  | { readonly how: 'broken'; readonly error: string };

export interface WatchOptions<T> {
  readonly path: string;
  readonly fieldSelector?: string;
  readonly resourceVersion: string;
  /** How long the server keeps the watch open before it closes it (default 300 s). */
  readonly timeoutSeconds?: number;
  /** A watch silent this long is taken for a dead connection (default timeoutSeconds + 30 s). */
  readonly idleMs?: number;
  readonly onEvent: (e: WatchEvent<T>) => void;
}

export interface OpenWatch {
  /** Resolves when the watch ends, never rejects. */
  readonly ended: Promise<WatchEnd>;
  stop(): void;
}

const MAX_LINE = 16 * 1024 * 1024;

function objectOf(v: unknown): Record<string, unknown> | undefined {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

/**
 * Opens the watch; rejects like KubeClient.request() when the server does not accept it (410 Gone as a
 * KubeApiError with code 410: list again).
 */
export async function openWatch<T>(client: KubeClient, o: WatchOptions<T>): Promise<OpenWatch> {
  const timeoutSeconds = o.timeoutSeconds ?? 300;
  const res = await client.stream(o.path, {
    watch: 'true',
    allowWatchBookmarks: 'true',
    resourceVersion: o.resourceVersion,
    timeoutSeconds: String(timeoutSeconds),
    ...(o.fieldSelector !== undefined ? { fieldSelector: o.fieldSelector } : {}),
  });
  let stopped = false;
  const ended = readEvents(res, o, o.idleMs ?? (timeoutSeconds + 30) * 1000, () => stopped);
  return {
    ended,
    stop: () => {
      stopped = true;
      res.destroy();
    },
  };
}

function readEvents<T>(res: IncomingMessage, o: WatchOptions<T>, idleMs: number, stopped: () => boolean) {
  return new Promise<WatchEnd>((resolve) => {
    let buf = '';
    let done = false;
    const finish = (end: WatchEnd): void => {
      if (done) return;
      done = true;
      res.destroy();
      resolve(stopped() ? { how: 'closed' } : end);
    };
    res.setTimeout(idleMs, () => finish({ how: 'broken', error: `the watch sent nothing for ${idleMs} ms` }));
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      buf += chunk;
      if (buf.length > MAX_LINE) return finish({ how: 'broken', error: 'a watch event is larger than 16 MiB' });
      for (let nl = buf.indexOf('\n'); nl >= 0 && !done; nl = buf.indexOf('\n')) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line !== '') handleLine(line, o, finish);
      }
    });
    res.on('end', () => finish({ how: 'closed' }));
    res.on('error', (err) => finish({ how: 'broken', error: err.message }));
    res.on('close', () => finish({ how: 'broken', error: 'the connection closed' }));
  });
}

function handleLine<T>(line: string, o: WatchOptions<T>, finish: (e: WatchEnd) => void): void {
  let ev: Record<string, unknown> | undefined;
  try {
    ev = objectOf(JSON.parse(line));
  } catch {
    ev = undefined;
  }
  const type = ev?.type;
  const object = objectOf(ev?.object);
  if (ev === undefined || object === undefined) {
    finish({ how: 'broken', error: `a watch line is not an event: ${line.slice(0, 200)}` });
    return;
  }
  if (type === 'ERROR') {
    const code = object.code;
    const message = typeof object.message === 'string' ? object.message : '(no message)';
    finish(
      code === 410 ? { how: 'gone', message } : { how: 'broken', error: `watch error ${String(code)}: ${message}` },
    );
    return;
  }
  if (type !== 'ADDED' && type !== 'MODIFIED' && type !== 'DELETED' && type !== 'BOOKMARK') {
    finish({ how: 'broken', error: `unknown watch event type ${JSON.stringify(type)}` });
    return;
  }
  o.onEvent({ type, object: object as T });
}

/** Whether an error opening a watch says its resourceVersion is too old (list again). */
export function isGone(err: unknown): boolean {
  return err instanceof KubeApiError && (err.code === 410 || err.reason === 'Expired' || err.reason === 'Gone');
}
