// What `check` needs to know of a kubeconfig in DRA mode, and no more: the context in force, its
// cluster's server and CA, and which credentials its user has (and the files they name). Pure: the
// parsed YAML in, a summary or the problem out. The daemon's API client (src/k8s, issue 21) loads
// the kubeconfig itself; this only says, before a start, whether it can work.
import { posix } from 'node:path';

export interface KubeconfigSummary {
  readonly context: string;
  readonly cluster: string;
  readonly user: string;
  /** The server URL as written, and its host (IP literal or name, no brackets) and port. */
  readonly server: string;
  readonly host: string;
  readonly port: number;
  /** How the server's certificate is checked: embedded CA, a CA file, the system's roots, or not at all. */
  readonly ca: string;
  /** The user's credentials in words: client certificate, token, token file, exec plugin. */
  readonly credentials: string;
  /** Files the kubeconfig names (CA, client certificate and key, token file), absolute. */
  readonly files: readonly { readonly what: string; readonly path: string }[];
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(o: Obj, key: string): string | null {
  const v = o[key];
  return typeof v === 'string' && v !== '' ? v : null;
}

/** The named entry's inner mapping of a kubeconfig list (clusters: [{name, cluster: {...}}]). */
function named(doc: Obj, list: string, inner: string, name: string): Obj | null {
  const entries = doc[list];
  if (!Array.isArray(entries)) return null;
  for (const e of entries as unknown[]) {
    if (isObj(e) && e['name'] === name) return isObj(e[inner]) ? e[inner] : {};
  }
  return null;
}

/**
 * The context in force (current-context, or the only one) with its cluster and user, or the
 * problem in words naming the key at fault. `file` is the kubeconfig's path: relative file names
 * in it are relative to its directory, as kubectl reads them.
 */
export function describeKubeconfig(doc: unknown, file: string): KubeconfigSummary | { readonly problem: string } {
  if (!isObj(doc)) return { problem: 'is not a YAML mapping (apiVersion: v1, kind: Config, clusters, users, contexts)' };
  const contexts = Array.isArray(doc['contexts']) ? (doc['contexts'] as unknown[]).filter(isObj) : [];
  let context = str(doc, 'current-context');
  if (context === null) {
    if (contexts.length !== 1) return { problem: `has no current-context and ${contexts.length} contexts; set one with \`kubectl config --kubeconfig=${file} use-context NAME\`` };
    context = typeof contexts[0]?.['name'] === 'string' ? contexts[0]['name'] : '';
  }
  const ctx = named(doc, 'contexts', 'context', context);
  if (ctx === null) return { problem: `current-context ${JSON.stringify(context)} is not among its contexts` };
  const clusterName = str(ctx, 'cluster');
  const userName = str(ctx, 'user');
  if (clusterName === null || userName === null) return { problem: `context ${JSON.stringify(context)} names no ${clusterName === null ? 'cluster' : 'user'}` };
  const cluster = named(doc, 'clusters', 'cluster', clusterName);
  if (cluster === null) return { problem: `cluster ${JSON.stringify(clusterName)} (of context ${JSON.stringify(context)}) is not among its clusters` };
  const user = named(doc, 'users', 'user', userName);
  if (user === null) return { problem: `user ${JSON.stringify(userName)} (of context ${JSON.stringify(context)}) is not among its users` };

  const server = str(cluster, 'server');
  if (server === null) return { problem: `cluster ${JSON.stringify(clusterName)} has no server` };
  let url: URL;
  try {
    url = new URL(server);
  } catch {
    return { problem: `cluster ${JSON.stringify(clusterName)}: server ${JSON.stringify(server)} is not a URL; expected https://HOST:PORT` };
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') return { problem: `cluster ${JSON.stringify(clusterName)}: server ${JSON.stringify(server)} is not an https URL` };
  const host = url.hostname.replace(/^\[|\]$/g, '');
  const port = url.port !== '' ? Number(url.port) : url.protocol === 'https:' ? 443 : 80;

  const abs = (p: string): string => (posix.isAbsolute(p) ? p : posix.join(posix.dirname(file), p));
  const files: { what: string; path: string }[] = [];
  let ca: string;
  if (str(cluster, 'certificate-authority-data') !== null) ca = 'embedded CA';
  else if (str(cluster, 'certificate-authority') !== null) {
    const p = abs(str(cluster, 'certificate-authority') as string);
    files.push({ what: 'certificate-authority', path: p });
    ca = `CA ${p}`;
  } else if (cluster['insecure-skip-tls-verify'] === true) ca = 'the server\'s certificate is NOT checked (insecure-skip-tls-verify)';
  else ca = 'the system\'s CA roots';

  let credentials: string;
  const certData = str(user, 'client-certificate-data');
  const cert = str(user, 'client-certificate');
  const keyData = str(user, 'client-key-data');
  const key = str(user, 'client-key');
  if (certData !== null || cert !== null) {
    if (keyData === null && key === null) return { problem: `user ${JSON.stringify(userName)} has a client certificate but no client-key or client-key-data` };
    if (cert !== null) files.push({ what: 'client-certificate', path: abs(cert) });
    if (key !== null) files.push({ what: 'client-key', path: abs(key) });
    credentials = `client certificate (${cert === null && key === null ? 'embedded' : 'files'})`;
  } else if (str(user, 'token') !== null) credentials = 'bearer token';
  else if (str(user, 'tokenFile') !== null) {
    const p = abs(str(user, 'tokenFile') as string);
    files.push({ what: 'tokenFile', path: p });
    credentials = `bearer token from ${p}`;
  } else if (isObj(user['exec']) && typeof user['exec']['command'] === 'string') credentials = `exec plugin ${user['exec']['command']}`;
  else return { problem: `user ${JSON.stringify(userName)} has no credentials the plugin can use (client-certificate[-data] with client-key[-data], token, tokenFile or exec)` };
  return { context, cluster: clusterName, user: userName, server, host, port, ca, credentials, files };
}
