// Fault injection for the API server stand-in (apiserver.ts): a test names which requests go wrong
// (method, path, optional query parameters) and how, for the next N that match:
// - reset: the connection is destroyed without an answer (the client sees ECONNRESET);
// - status: a real Kubernetes Status answer — 500 InternalError, 503 ServiceUnavailable, 504 Timeout,
//   409 Conflict, 429 TooManyRequests with a Retry-After header and details.retryAfterSeconds;
// - delay: the answer is held back this long, then served as usual (past the client's timeout, the
//   client has given up by then, as with a real server that hangs).
// Each rule counts what it did (`hits`), so a test can wait until its faults were really met.
import type { IncomingMessage, ServerResponse } from 'node:http';

export type FaultAction =
  | { readonly kind: 'reset' }
  | { readonly kind: 'status'; readonly code: number; readonly retryAfterS?: number; readonly message?: string }
  | { readonly kind: 'delay'; readonly ms: number };

export interface FaultRule {
  /** GET, POST, PUT, DELETE; any when absent. */
  readonly method?: string;
  /** The request's path without its query: equal to a string, or matching a RegExp. */
  readonly path: string | RegExp;
  /** Query parameters the request must carry with these values (e.g. { watch: 'true' }). */
  readonly query?: Readonly<Record<string, string>>;
  /** How many matching requests go wrong (default 1). */
  readonly times?: number;
  readonly action: FaultAction;
}

/** A rule in force: how many requests it has hit, and how many it still will. */
export interface Fault {
  readonly rule: FaultRule;
  hits: number;
  left: number;
}

const REASONS: Readonly<Record<number, string>> = {
  409: 'Conflict',
  429: 'TooManyRequests',
  500: 'InternalError',
  503: 'ServiceUnavailable',
  504: 'Timeout',
};

/** The Status body a real API server sends with this code. */
export function faultStatus(code: number, path: string, a: { retryAfterS?: number; message?: string }): object {
  const reason = REASONS[code] ?? 'InternalError';
  const name = path.split('/').at(-1) ?? '';
  const message =
    a.message ??
    (code === 409
      ? `Operation cannot be fulfilled on resourceslices.resource.k8s.io "${name}": the object has been modified; ` +
        'please apply your changes to the latest version and try again'
      : code === 429
        ? 'Too many requests, please try again later.'
        : code === 503
          ? 'the server is currently unable to handle the request'
          : code === 504
            ? 'Timeout: request did not complete within the allowed duration'
            : 'Internal error occurred: injected by the test');
  const details: Record<string, unknown> = {};
  if (code === 409) Object.assign(details, { name, group: 'resource.k8s.io', kind: 'resourceslices' });
  if (a.retryAfterS !== undefined) details.retryAfterSeconds = a.retryAfterS;
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    ...(Object.keys(details).length > 0 ? { details } : {}),
    code,
  };
}

export class FaultTable {
  private readonly rules: Fault[] = [];

  add(rule: FaultRule): Fault {
    const f: Fault = { rule, hits: 0, left: rule.times ?? 1 };
    this.rules.push(f);
    return f;
  }

  clear(): void {
    this.rules.length = 0;
  }

  /** The action for this request, if a rule with hits left matches it (the rule's count goes down). */
  take(method: string, url: URL): FaultAction | undefined {
    for (const f of this.rules) {
      if (f.left <= 0) continue;
      const r = f.rule;
      if (r.method !== undefined && r.method !== method) continue;
      if (typeof r.path === 'string' ? r.path !== url.pathname : !r.path.test(url.pathname)) continue;
      if (r.query !== undefined && !Object.entries(r.query).every(([k, v]) => url.searchParams.get(k) === v)) continue;
      f.left--;
      f.hits++;
      return r.action;
    }
    return undefined;
  }
}

/**
 * Carries out a fault: the code answered (0 for a reset). A delay waits, then returns -1: the caller
 * serves the request as usual.
 */
export async function applyFault(a: FaultAction, req: IncomingMessage, res: ServerResponse): Promise<number> {
  if (a.kind === 'reset') {
    // Read nothing more, answer nothing: the socket goes as a crashed server's or a proxy's would.
    req.socket.destroy();
    return 0;
  }
  if (a.kind === 'delay') {
    await new Promise((resolve) => setTimeout(resolve, a.ms));
    return -1;
  }
  const url = new URL(req.url ?? '/', 'http://stand-in');
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (a.retryAfterS !== undefined) headers['retry-after'] = String(a.retryAfterS);
  // Drain the body so the connection stays usable for keep-alive.
  for await (const _ of req) {
    // discarded
  }
  res.writeHead(a.code, headers);
  res.end(JSON.stringify(faultStatus(a.code, url.pathname, a)));
  return a.code;
}
