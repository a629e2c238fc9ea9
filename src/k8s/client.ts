// A small Kubernetes API client over node:http / node:https: JSON requests to the few REST paths the
// DRA driver uses, with a per-request timeout, keep-alive connections, TLS with the kubeconfig's CA
// and client certificate, bearer tokens, and errors that say what the server said (a Kubernetes
// Status: reason, code, message, causes) or why it could not be reached. Nothing blocks: every call
// is a promise. See README.md for why this is ours and not @kubernetes/client-node.
import { Agent as HttpAgent, request as httpRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { IncomingMessage, RequestOptions } from 'node:http';
import { readFile } from 'node:fs/promises';
import type { KubeTarget } from './kubeconfig.ts';

export const DEFAULT_TIMEOUT_MS = 15_000;
/** More than any answer we expect (a ResourceSlice list of one node is a few hundred KiB at most). */
const MAX_RESPONSE_BYTES = 16 * 1024 * 1024;

/** One cause of an Invalid (422) answer: which field, and what is wrong with it. */
export interface StatusCause {
  readonly reason?: string;
  readonly message?: string;
  readonly field?: string;
}

/** The API server answered with an error (a Kubernetes Status, or at least an HTTP code). */
export class KubeApiError extends Error {
  override name = 'KubeApiError';
  readonly code: number;
  /** NotFound, AlreadyExists, Conflict, Invalid, Forbidden, Unauthorized, … ('' when the answer was no Status). */
  readonly reason: string;
  readonly causes: readonly StatusCause[];
  readonly method: string;
  readonly path: string;
  /** The server's message, unadorned. */
  readonly serverMessage: string;

  constructor(
    method: string,
    path: string,
    code: number,
    reason: string,
    serverMessage: string,
    causes: readonly StatusCause[],
  ) {
    const causeText =
      causes.length === 0
        ? ''
        : `: ${causes.map((c) => `${c.field ?? '?'}: ${c.message ?? c.reason ?? ''}`).join('; ')}`;
    super(`${method} ${path}: ${code}${reason === '' ? '' : ` ${reason}`}: ${serverMessage}${causeText}`);
    this.code = code;
    this.reason = reason;
    this.causes = causes;
    this.method = method;
    this.path = path;
    this.serverMessage = serverMessage;
  }
}

/** The API server could not be reached, or did not answer in time: worth retrying later. */
export class KubeUnreachableError extends Error {
  override name = 'KubeUnreachableError';
  readonly method: string;
  readonly path: string;
  /** ECONNREFUSED, ETIMEDOUT (our timeout), ECONNRESET, ENOTFOUND, … or '' */
  readonly errno: string;

  constructor(method: string, path: string, server: string, errno: string, detail: string) {
    super(`${method} ${path}: cannot reach the API server ${server}: ${detail}`);
    this.method = method;
    this.path = path;
    this.errno = errno;
  }
}

export interface RequestOptionsK {
  readonly body?: unknown;
  readonly timeoutMs?: number;
  /** Query parameters. */
  readonly query?: Readonly<Record<string, string>>;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The error of a non-2xx answer, from its body (a Status when the server wrote one). */
export function apiErrorOf(method: string, path: string, code: number, body: string): KubeApiError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    parsed = undefined;
  }
  if (isObj(parsed) && parsed.kind === 'Status') {
    const details = isObj(parsed.details) ? parsed.details : {};
    const causes = Array.isArray(details.causes)
      ? details.causes.filter(isObj).map(
          (c): StatusCause => ({
            ...(typeof c.reason === 'string' ? { reason: c.reason } : {}),
            ...(typeof c.message === 'string' ? { message: c.message } : {}),
            ...(typeof c.field === 'string' ? { field: c.field } : {}),
          }),
        )
      : [];
    return new KubeApiError(
      method,
      path,
      typeof parsed.code === 'number' ? parsed.code : code,
      typeof parsed.reason === 'string' ? parsed.reason : '',
      typeof parsed.message === 'string' ? parsed.message : '(no message)',
      causes,
    );
  }
  const snippet = body.trim().slice(0, 200);
  return new KubeApiError(method, path, code, '', snippet === '' ? '(empty answer)' : snippet, []);
}

export class KubeClient {
  readonly target: KubeTarget;
  private readonly base: URL;
  private readonly agent: HttpAgent | HttpsAgent;

  constructor(target: KubeTarget) {
    this.target = target;
    this.base = new URL(target.server);
    const https = this.base.protocol === 'https:';
    this.agent = https
      ? new HttpsAgent({
          keepAlive: true,
          maxSockets: 4,
          ...(target.ca !== undefined ? { ca: target.ca } : {}),
          ...(target.cert !== undefined ? { cert: target.cert, key: target.key } : {}),
          rejectUnauthorized: target.insecureSkipTlsVerify !== true,
          ...(target.tlsServerName !== undefined ? { servername: target.tlsServerName } : {}),
        })
      : new HttpAgent({ keepAlive: true, maxSockets: 4 });
  }

  /** The server's URL, for messages. */
  get server(): string {
    return this.target.server;
  }

  private async authorization(): Promise<string | undefined> {
    if (this.target.tokenFile !== undefined) {
      try {
        return `Bearer ${(await readFile(this.target.tokenFile, 'utf8')).trim()}`;
      } catch (err) {
        throw new KubeUnreachableError(
          '-',
          '-',
          this.server,
          'ETOKEN',
          `cannot read the token file ${this.target.tokenFile} (${(err as Error).message})`,
        );
      }
    }
    return this.target.token !== undefined ? `Bearer ${this.target.token}` : undefined;
  }

  /**
   * One JSON request. Resolves with the parsed answer of a 2xx; rejects with KubeApiError (the server
   * said no) or KubeUnreachableError (no answer, or none within the timeout).
   */
  async request<T = unknown>(method: string, path: string, o: RequestOptionsK = {}): Promise<T> {
    const prefix = this.base.pathname.replace(/\/+$/, '');
    const qs = o.query === undefined ? '' : `?${new URLSearchParams(o.query).toString()}`;
    const fullPath = `${prefix}${path}${qs}`;
    const payload = o.body === undefined ? undefined : Buffer.from(JSON.stringify(o.body));
    let auth: string | undefined;
    try {
      auth = await this.authorization();
    } catch (err) {
      if (err instanceof KubeUnreachableError)
        throw new KubeUnreachableError(
          method,
          path,
          this.server,
          err.errno,
          err.message.replace(/^.*?: cannot reach the API server [^:]*: /, ''),
        );
      throw err;
    }
    const headers: Record<string, string> = { accept: 'application/json', 'user-agent': 'gpu-device-plugin' };
    if (payload !== undefined) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(payload.length);
    }
    if (auth !== undefined) headers.authorization = auth;
    const https = this.base.protocol === 'https:';
    const opts: RequestOptions = {
      method,
      path: fullPath,
      headers,
      agent: this.agent,
      ...(this.target.socketPath !== undefined
        ? { socketPath: this.target.socketPath }
        : {
            host: this.base.hostname.replace(/^\[|\]$/g, ''),
            port: this.base.port === '' ? (https ? 443 : 80) : Number(this.base.port),
          }),
    };
    const timeoutMs = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const { code, body } = await new Promise<{ code: number; body: string }>((resolve, reject) => {
      const req = (https ? httpsRequest : httpRequest)(opts, (res: IncomingMessage) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > MAX_RESPONSE_BYTES) {
            req.destroy(new Error(`the answer is larger than ${MAX_RESPONSE_BYTES} bytes`));
            return;
          }
          chunks.push(c);
        });
        res.on('end', () => resolve({ code: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', (err) => reject(err));
      });
      req.setTimeout(timeoutMs, () => {
        const err = new Error(`no answer within ${timeoutMs} ms`) as NodeJS.ErrnoException;
        err.code = 'ETIMEDOUT';
        req.destroy(err);
      });
      req.on('error', (err) => reject(err));
      req.end(payload);
    }).catch((err: unknown) => {
      const e = err as NodeJS.ErrnoException;
      throw new KubeUnreachableError(method, path, this.server, e.code ?? '', e.message);
    });
    if (code < 200 || code > 299) throw apiErrorOf(method, path, code, body);
    if (body.trim() === '') return undefined as T;
    try {
      return JSON.parse(body) as T;
    } catch (err) {
      throw new KubeApiError(method, path, code, '', `the answer is not JSON (${(err as Error).message})`, []);
    }
  }

  /**
   * A streaming GET (a watch): resolves with the open answer once a 2xx arrives, for the caller to
   * read as it comes and to end with destroy(); rejects as request() does. The request has no
   * timeout once answered: the caller asks the server for one (timeoutSeconds) and guards the rest.
   */
  async stream(path: string, query: Readonly<Record<string, string>>, timeoutMs?: number): Promise<IncomingMessage> {
    const prefix = this.base.pathname.replace(/\/+$/, '');
    const fullPath = `${prefix}${path}?${new URLSearchParams(query).toString()}`;
    const auth = await this.authorization();
    const headers: Record<string, string> = { accept: 'application/json', 'user-agent': 'gpu-device-plugin' };
    if (auth !== undefined) headers.authorization = auth;
    const https = this.base.protocol === 'https:';
    const opts: RequestOptions = {
      method: 'GET',
      path: fullPath,
      headers,
      agent: this.agent,
      ...(this.target.socketPath !== undefined
        ? { socketPath: this.target.socketPath }
        : {
            host: this.base.hostname.replace(/^\[|\]$/g, ''),
            port: this.base.port === '' ? (https ? 443 : 80) : Number(this.base.port),
          }),
    };
    const ms = timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = (https ? httpsRequest : httpRequest)(opts, (r) => {
        req.setTimeout(0);
        resolve(r);
      });
      req.setTimeout(ms, () =>
        req.destroy(Object.assign(new Error(`no answer within ${ms} ms`), { code: 'ETIMEDOUT' })),
      );
      req.on('error', reject);
      req.end();
    }).catch((err: unknown) => {
      const e = err as NodeJS.ErrnoException;
      throw new KubeUnreachableError('GET', path, this.server, e.code ?? '', e.message);
    });
    const code = res.statusCode ?? 0;
    if (code >= 200 && code <= 299) return res;
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    throw apiErrorOf('GET', path, code, Buffer.concat(chunks).toString('utf8'));
  }

  /** Closes idle keep-alive connections (the daemon stops). */
  close(): void {
    this.agent.destroy();
  }
}
