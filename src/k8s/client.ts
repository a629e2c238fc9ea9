// A small Kubernetes API client over node:http / node:https: JSON requests to the few REST paths the DRA driver
// uses, with a per-request timeout, keep-alive connections, TLS with the kubeconfig's CA and client certificate
// (files re-read when they change: credentials.ts), bearer tokens, client-go's retries (retry.ts), and errors that
// say what the server said (a Status: reason, code, message, causes) or why it could not be reached. Nothing
// blocks. See README.md for why this is ours and not @kubernetes/client-node.
import { Agent as HttpAgent, request as httpRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { IncomingMessage, RequestOptions } from 'node:http';
import { readFile } from 'node:fs/promises';
import { KubeApiError, KubeUnreachableError, apiErrorOf } from './errors.ts';
import { RETRY_AFTER_MAX, isConnectionReset, retryAfterMs } from './retry.ts';
import { certificateNotAfter, credentialStamp, readCredentialFiles } from './credentials.ts';
import type { KubeTarget } from './kubeconfig.ts';

export { KubeApiError, KubeUnreachableError, apiErrorOf } from './errors.ts';
export type { StatusCause } from './errors.ts';

export const DEFAULT_TIMEOUT_MS = 15_000;
/** More than any answer we expect (a ResourceSlice list of one node is a few hundred KiB at most). */
const MAX_RESPONSE_BYTES = 16 * 1024 * 1024;

export interface RequestOptionsK {
  readonly body?: unknown;
  readonly timeoutMs?: number;
  /** Query parameters. */
  readonly query?: Readonly<Record<string, string>>;
}

/** What the client reports of its credentials: the client certificate read (at start and after each change). */
export interface KubeClientHooks {
  readonly onClientCertificate?: (c: { readonly file: string; readonly notAfter: Date | null }) => void;
  /** A request waits out the Retry-After of a 429 or 5xx before it is sent again. */
  readonly onRetryAfter?: (w: { readonly method: string; readonly path: string; readonly ms: number }) => void;
}

interface Answer {
  readonly code: number;
  readonly body: string;
  readonly retryAfter: string | undefined;
}

/** A 2xx answer's JSON (undefined for an empty one), or the error of any other. */
function decode<T>(method: string, path: string, a: Answer): T {
  if (a.code < 200 || a.code > 299) throw apiErrorOf(method, path, a.code, a.body);
  if (a.body.trim() === '') return undefined as T;
  try {
    return JSON.parse(a.body) as T;
  } catch (err) {
    throw new KubeApiError(method, path, a.code, '', `the answer is not JSON (${(err as Error).message})`, []);
  }
}

export class KubeClient {
  readonly target: KubeTarget;
  private readonly base: URL;
  private agent: HttpAgent | HttpsAgent;
  private tls: { ca?: Buffer; cert?: Buffer; key?: Buffer };
  /** The credential files as last read (credentials.ts's stamp). */
  private stamp: string | null = null;
  private readonly waits = new Set<() => void>();
  private closed = false;
  private readonly hooks: KubeClientHooks;

  constructor(target: KubeTarget, hooks: KubeClientHooks = {}) {
    this.target = target;
    this.hooks = hooks;
    this.base = new URL(target.server);
    this.tls = {
      ...(target.ca !== undefined ? { ca: target.ca } : {}),
      ...(target.cert !== undefined ? { cert: target.cert, key: target.key } : {}),
    };
    this.agent = this.makeAgent();
    this.reportCertificate();
  }

  private makeAgent(): HttpAgent | HttpsAgent {
    if (this.base.protocol !== 'https:') return new HttpAgent({ keepAlive: true, maxSockets: 4 });
    const { insecureSkipTlsVerify, tlsServerName } = this.target;
    const name = tlsServerName !== undefined ? { servername: tlsServerName } : {};
    return new HttpsAgent({
      keepAlive: true,
      maxSockets: 4,
      ...this.tls,
      rejectUnauthorized: !insecureSkipTlsVerify,
      ...name,
    });
  }

  private reportCertificate(): void {
    if (this.tls.cert === undefined || this.hooks.onClientCertificate === undefined) return;
    const file = this.target.files?.cert ?? `client-certificate-data of ${this.target.source}`;
    this.hooks.onClientCertificate({ file, notAfter: certificateNotAfter(this.tls.cert) });
  }

  /**
   * The credential files read again when they changed since last read (or always, `force`: after a 401), and
   * new connections made with them. A file that cannot be read keeps the credentials in use.
   */
  private async refreshCredentials(force: boolean): Promise<void> {
    const files = this.target.files;
    if (files === undefined) return;
    const stamp = await credentialStamp(files);
    if (this.stamp === null && !force) this.stamp = stamp;
    if (stamp === this.stamp && !force) return;
    const pems = await readCredentialFiles(files).catch(() => null);
    if (pems === null) return;
    this.stamp = stamp;
    this.tls = { ...this.tls, ...pems };
    const old = this.agent;
    this.agent = this.makeAgent();
    old.destroy();
    this.reportCertificate();
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

  /** The options of one request to `fullPath` (the server's path prefix included). */
  private options(method: string, fullPath: string, headers: Record<string, string>): RequestOptions {
    const https = this.base.protocol === 'https:';
    return {
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
  }

  private fullPath(path: string, query: Readonly<Record<string, string>> | undefined): string {
    const prefix = this.base.pathname.replace(/\/+$/, '');
    return `${prefix}${path}${query === undefined ? '' : `?${new URLSearchParams(query).toString()}`}`;
  }

  private async headers(method: string, path: string, payload?: Buffer): Promise<Record<string, string>> {
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
    return headers;
  }

  /** One exchange: the answer's code, body and Retry-After, or KubeUnreachableError. */
  private async exchange(method: string, path: string, o: RequestOptionsK): Promise<Answer> {
    const payload = o.body === undefined ? undefined : Buffer.from(JSON.stringify(o.body));
    const opts = this.options(method, this.fullPath(path, o.query), await this.headers(method, path, payload));
    const timeoutMs = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const https = this.base.protocol === 'https:';
    return new Promise<Answer>((resolve, reject) => {
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
        const retryAfter = res.headers['retry-after'];
        res.on('end', () =>
          resolve({ code: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8'), retryAfter }),
        );
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
  }

  /** Waits `ms` on a timer close() cancels. */
  private wait(ms: number, method: string, path: string): Promise<void> {
    return new Promise((resolve, reject) => {
      const cancel = (): void => {
        clearTimeout(timer);
        reject(new KubeUnreachableError(method, path, this.server, 'ECANCELED', 'the client was closed'));
      };
      const timer = setTimeout(() => {
        this.waits.delete(cancel);
        resolve();
      }, ms);
      this.waits.add(cancel);
    });
  }

  /**
   * One JSON request. Resolves with the parsed answer of a 2xx; rejects with KubeApiError (the server
   * said no) or KubeUnreachableError (no answer, or none within the timeout). As client-go does: a GET
   * whose connection was closed before any answer (a kept-alive one the server had dropped) is sent once
   * more on a new one; a 429 or 5xx with `Retry-After` is sent again after that wait, at most
   * RETRY_AFTER_MAX times; a 401 reads the credential files again and is sent once more.
   */
  async request<T = unknown>(method: string, path: string, o: RequestOptionsK = {}): Promise<T> {
    let resent = false;
    let reauthorized = false;
    let waited = 0;
    let force = false;
    for (;;) {
      await this.refreshCredentials(force);
      force = false;
      let a: Answer;
      try {
        a = await this.exchange(method, path, o);
      } catch (err) {
        if (err instanceof KubeUnreachableError && method === 'GET' && !resent && isConnectionReset(err.errno)) {
          resent = true;
          continue;
        }
        throw err;
      }
      if (a.code === 401 && !reauthorized && this.target.files !== undefined) {
        reauthorized = force = true;
        continue;
      }
      const ms = retryAfterMs(a.code, a.retryAfter);
      if (ms !== null && waited < RETRY_AFTER_MAX && !this.closed) {
        waited++;
        const waiting = this.wait(ms, method, path);
        this.hooks.onRetryAfter?.({ method, path, ms });
        await waiting;
        continue;
      }
      return decode<T>(method, path, a);
    }
  }

  /**
   * A streaming GET (a watch): resolves with the open answer once a 2xx arrives, for the caller to
   * read as it comes and to end with destroy(); rejects as request() does. The request has no
   * timeout once answered: the caller asks the server for one (timeoutSeconds) and guards the rest.
   */
  async stream(path: string, query: Readonly<Record<string, string>>, timeoutMs?: number): Promise<IncomingMessage> {
    await this.refreshCredentials(false);
    const opts = this.options('GET', this.fullPath(path, query), await this.headers('GET', path));
    const ms = timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const https = this.base.protocol === 'https:';
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
    this.closed = true;
    for (const cancel of [...this.waits]) cancel();
    this.waits.clear();
    this.agent.destroy();
  }
}
