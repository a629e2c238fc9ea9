// A kubeconfig file, read into what the API client needs: the server's URL, how to trust it (CA data
// or file, or insecure-skip-tls-verify), and who we are (client certificate and key, data or file;
// a bearer token, inline or a token file that is re-read on every request, as bound tokens rotate).
// The current context (or the one asked for) picks the cluster and user. Paths in the file are
// relative to the file's folder, as kubectl takes them. Exec and auth-provider credential plugins
// are refused with a clear error: a node service should not depend on a cloud CLI being installed,
// and a node-scoped client certificate or token file does what it needs.
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, isAbsolute, resolve } from 'node:path';
import type * as Yaml from 'yaml';

let yaml: typeof Yaml | undefined;
function loadYaml(): typeof Yaml {
  yaml ??=
    typeof require === 'function'
      ? (require('yaml') as typeof Yaml)
      : (createRequire(import.meta.url)('yaml') as typeof Yaml);
  return yaml;
}

/** What the client connects with. Buffers are PEM. */
export interface KubeTarget {
  /** https://host:port[/prefix] or http:// (tests). */
  readonly server: string;
  readonly ca?: Buffer;
  readonly insecureSkipTlsVerify?: boolean;
  /** SNI / certificate name to check instead of the server's host. */
  readonly tlsServerName?: string;
  readonly cert?: Buffer;
  readonly key?: Buffer;
  readonly token?: string;
  /** Re-read for every request (a projected or rotated token). */
  readonly tokenFile?: string;
  /** Dial this unix socket instead of the server's host (tests, and API server proxies). */
  readonly socketPath?: string;
  /** Where these facts came from, for error messages: `<file> (context <name>)`. */
  readonly source: string;
  /** The files `ca`, `cert` and `key` were read from (not the *-data keys): re-read when they change. */
  readonly files?: CredentialFiles;
}

/** Files a kubeconfig names for TLS, absolute. */
export interface CredentialFiles {
  readonly ca?: string;
  readonly cert?: string;
  readonly key?: string;
}

export class KubeconfigError extends Error {
  override name = 'KubeconfigError';
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function named(list: unknown, name: string, kind: string, file: string): Obj {
  const entries = Array.isArray(list) ? list : [];
  const hit = entries.find((e): e is Obj => isObj(e) && e.name === name);
  if (hit === undefined) {
    const known =
      entries
        .filter(isObj)
        .map((e) => String(e.name))
        .join(', ') || 'none';
    throw new KubeconfigError(`${file}: no ${kind} named ${JSON.stringify(name)} (${kind}s: ${known})`);
  }
  const inner = hit[kind];
  if (!isObj(inner)) throw new KubeconfigError(`${file}: ${kind} ${JSON.stringify(name)} has no ${kind} map`);
  return inner;
}

const text = (o: Obj, key: string): string | undefined =>
  typeof o[key] === 'string' && o[key] !== '' ? (o[key] as string) : undefined;

/** PEM given inline (base64 data in the file) or as a file (absolute path, resolved from the kubeconfig's folder). */
export type PemSource = { readonly data: Buffer } | { readonly file: string };

/**
 * A kubeconfig's context in force, resolved without reading anything else: the names, the server,
 * and where the CA, client certificate, key and token come from. `check` judges this (the files it
 * names are checked against the unit's sandbox); parseKubeconfig then reads the files.
 */
export interface KubeconfigRef {
  readonly file: string;
  readonly context: string;
  readonly cluster: string;
  /** '' when the context names no user (anonymous). */
  readonly user: string;
  readonly server: string;
  readonly ca?: PemSource;
  readonly insecureSkipTlsVerify: boolean;
  readonly tlsServerName?: string;
  readonly cert?: PemSource;
  readonly key?: PemSource;
  readonly token?: string;
  /** Absolute. */
  readonly tokenFile?: string;
}

function pemSource(o: Obj, dataKey: string, fileKey: string, base: string): PemSource | undefined {
  const data = text(o, dataKey);
  if (data !== undefined) return { data: Buffer.from(data, 'base64') };
  const path = text(o, fileKey);
  if (path === undefined) return undefined;
  return { file: isAbsolute(path) ? path : resolve(base, path) };
}

async function readPem(src: PemSource | undefined, what: string, file: string): Promise<Buffer | undefined> {
  if (src === undefined) return undefined;
  if ('data' in src) return src.data;
  try {
    return await readFile(src.file);
  } catch (err) {
    throw new KubeconfigError(`${file}: cannot read the ${what} ${src.file} (${(err as Error).message})`);
  }
}

/**
 * Resolves a kubeconfig's text (file: its path, for relative paths and
 * messages); reads nothing else. Throws KubeconfigError naming the key at fault.
 */
export function resolveKubeconfig(content: string, file: string, context?: string): KubeconfigRef {
  let doc: unknown;
  try {
    doc = loadYaml().parse(content);
  } catch (err) {
    throw new KubeconfigError(`${file} is not a kubeconfig: ${(err as Error).message}`);
  }
  if (!isObj(doc))
    throw new KubeconfigError(`${file} is not a kubeconfig: expected a map with clusters, users and contexts`);
  const ctxName = context ?? text(doc, 'current-context');
  if (ctxName === undefined)
    throw new KubeconfigError(
      `${file} has no current-context; set one (kubectl config use-context) or name the context`,
    );
  const ctx = named(doc.contexts, ctxName, 'context', file);
  const clusterName = text(ctx, 'cluster');
  const userName = text(ctx, 'user');
  if (clusterName === undefined)
    throw new KubeconfigError(`${file}: context ${JSON.stringify(ctxName)} names no cluster`);
  const cluster = named(doc.clusters, clusterName, 'cluster', file);
  const user = userName === undefined ? {} : named(doc.users, userName, 'user', file);
  const server = text(cluster, 'server');
  if (server === undefined) throw new KubeconfigError(`${file}: cluster ${JSON.stringify(clusterName)} has no server`);
  let url: URL;
  try {
    url = new URL(server);
  } catch {
    throw new KubeconfigError(
      `${file}: cluster ${JSON.stringify(clusterName)} has ` +
        `server ${JSON.stringify(server)}, which is not a URL (expected https://host:port)`,
    );
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:')
    throw new KubeconfigError(`${file}: server ${server} is neither https:// nor http://`);
  if (user.exec !== undefined || user['auth-provider'] !== undefined) {
    throw new KubeconfigError(
      `${file}: user ${JSON.stringify(userName)} ` +
        `uses ${user.exec !== undefined ? 'an exec' : 'an auth-provider'} credential ` +
        `plugin, which this service does not run; give it a node-scoped client certificate ` +
        `(client-certificate/client-key) or a token (token or tokenFile) instead`,
    );
  }
  const base = dirname(file);
  const ca = pemSource(cluster, 'certificate-authority-data', 'certificate-authority', base);
  const cert = pemSource(user, 'client-certificate-data', 'client-certificate', base);
  const key = pemSource(user, 'client-key-data', 'client-key', base);
  if ((cert === undefined) !== (key === undefined))
    throw new KubeconfigError(
      `${file}: user ${JSON.stringify(userName)} has a client ${cert === undefined ? 'key' : 'certificate'} ` +
        `without its ${cert === undefined ? 'certificate' : 'key'}`,
    );
  const tokenFile = text(user, 'tokenFile');
  const token = text(user, 'token');
  const tlsServerName = text(cluster, 'tls-server-name');
  return {
    file,
    context: ctxName,
    cluster: clusterName,
    user: userName ?? '',
    server: server.replace(/\/+$/, ''),
    insecureSkipTlsVerify: cluster['insecure-skip-tls-verify'] === true,
    ...(ca !== undefined ? { ca } : {}),
    ...(tlsServerName !== undefined ? { tlsServerName } : {}),
    ...(cert !== undefined && key !== undefined ? { cert, key } : {}),
    ...(token !== undefined ? { token } : {}),
    ...(tokenFile !== undefined ? { tokenFile: isAbsolute(tokenFile) ? tokenFile : resolve(base, tokenFile) } : {}),
  };
}

/** Parses a kubeconfig's text (file: its path, for relative paths and messages) and reads the files it names. */
export async function parseKubeconfig(content: string, file: string, context?: string): Promise<KubeTarget> {
  const r = resolveKubeconfig(content, file, context);
  const ca = await readPem(r.ca, 'certificate authority', file);
  const cert = await readPem(r.cert, 'client certificate', file);
  const key = await readPem(r.key, 'client key', file);
  const files: CredentialFiles = {
    ...(r.ca !== undefined && 'file' in r.ca ? { ca: r.ca.file } : {}),
    ...(r.cert !== undefined && 'file' in r.cert ? { cert: r.cert.file } : {}),
    ...(r.key !== undefined && 'file' in r.key ? { key: r.key.file } : {}),
  };
  return {
    ...(Object.keys(files).length > 0 ? { files } : {}),
    server: r.server,
    source: `${file} (context ${r.context})`,
    ...(ca !== undefined ? { ca } : {}),
    ...(r.insecureSkipTlsVerify ? { insecureSkipTlsVerify: true } : {}),
    ...(r.tlsServerName !== undefined ? { tlsServerName: r.tlsServerName } : {}),
    ...(cert !== undefined && key !== undefined ? { cert, key } : {}),
    ...(r.token !== undefined ? { token: r.token } : {}),
    ...(r.tokenFile !== undefined ? { tokenFile: r.tokenFile } : {}),
  };
}

/** Reads and parses a kubeconfig file. */
export async function loadKubeconfig(file: string, context?: string): Promise<KubeTarget> {
  let content: string;
  try {
    content = await readFile(file, 'utf8');
  } catch (err) {
    throw new KubeconfigError(
      `cannot read the kubeconfig ${file} (${(err as Error).message}); ` +
        `--kubeconfig names the file this service reaches the API server with`,
    );
  }
  return parseKubeconfig(content, file, context);
}
