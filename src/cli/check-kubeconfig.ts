// `check`'s kubeconfig line in DRA mode: the kubeconfig resolved by the daemon's own loader (src/k8s/kubeconfig.ts),
// so check refuses what the daemon would refuse, readable by the service in the unit's sandbox, with a server and
// credentials the plugin can use and the files it names there; and its summary (context, server, trust, user),
// which the API server lines use.
import { readFile, stat } from 'node:fs/promises';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';
import type { UnitRead } from './host-view.ts';
import { DRA_DOCS } from './dra-install.ts';
import { certificateNotAfter, expiryText, judgeExpiry } from '../k8s/credentials.ts';
import { resolveKubeconfig } from '../k8s/kubeconfig.ts';
import type { KubeconfigRef } from '../k8s/kubeconfig.ts';
import { readableInSandbox } from './sandbox.ts';

/** What `check` says of a kubeconfig: the context in force, its server and how it is trusted, who the user is. */
export interface KubeconfigSummary {
  readonly context: string;
  readonly cluster: string;
  readonly user: string;
  /** The server URL, and its host (IP literal or name, no brackets) and port. */
  readonly server: string;
  readonly host: string;
  readonly port: number;
  /** How the server's certificate is checked: embedded CA, a CA file, the system's roots, or not at all. */
  readonly ca: string;
  /** The user's credentials in words: client certificate, token, token file. */
  readonly credentials: string;
  /** Files the kubeconfig names (CA, client certificate and key, token file), absolute. */
  readonly files: readonly { readonly what: string; readonly path: string }[];
}

/** The summary of a resolved kubeconfig, or the problem in words (no credentials at all). */
export function kubeconfigSummary(r: KubeconfigRef): KubeconfigSummary | { readonly problem: string } {
  const url = new URL(r.server);
  const host = url.hostname.replace(/^\[|\]$/g, '');
  const port = url.port !== '' ? Number(url.port) : url.protocol === 'https:' ? 443 : 80;
  const files: { what: string; path: string }[] = [];
  let ca: string;
  if (url.protocol !== 'https:') ca = 'plain HTTP, no TLS: only for a server on this host or a test';
  else if (r.ca !== undefined && 'data' in r.ca) ca = 'embedded CA';
  else if (r.ca !== undefined) {
    files.push({ what: 'certificate-authority', path: r.ca.file });
    ca = `CA ${r.ca.file}`;
  } else if (r.insecureSkipTlsVerify) ca = "the server's certificate is NOT checked (insecure-skip-tls-verify)";
  else ca = "the system's CA roots";
  let credentials: string;
  if (r.cert !== undefined && r.key !== undefined) {
    if ('file' in r.cert) files.push({ what: 'client-certificate', path: r.cert.file });
    if ('file' in r.key) files.push({ what: 'client-key', path: r.key.file });
    credentials = `client certificate (${'data' in r.cert && 'data' in r.key ? 'embedded' : 'files'})`;
  } else if (r.token !== undefined) credentials = 'bearer token';
  else if (r.tokenFile !== undefined) {
    files.push({ what: 'tokenFile', path: r.tokenFile });
    credentials = `bearer token from ${r.tokenFile}`;
  } else
    return {
      problem:
        `user ${JSON.stringify(r.user)} has no credentials the plugin can use ` +
        `(client-certificate[-data] with client-key[-data], token or tokenFile)`,
    };
  return { context: r.context, cluster: r.cluster, user: r.user, server: r.server, host, port, ca, credentials, files };
}

/** The files a kubeconfig names that the service could not read: hidden by the sandbox, or not there. */
async function unreadableFiles(summary: KubeconfigSummary, unit: UnitRead): Promise<string[]> {
  const missing: string[] = [];
  for (const f of summary.files) {
    const v = readableInSandbox(unit.sandbox, f.path);
    if (!v.writable || v.private === true) missing.push(`${f.what} ${f.path}: ${v.writable ? v.how : v.why}`);
    else if (
      !(await stat(f.path).then(
        (s) => s.isFile(),
        () => false,
      ))
    )
      missing.push(`${f.what} ${f.path} does not exist`);
  }
  return missing;
}

/** The kubeconfig: readable by the service, parseable, a server and credentials, the files it names there. */
export async function kubeconfigCheck(
  path: string | null,
  unit: UnitRead,
): Promise<{ lines: CheckLine[]; summary: KubeconfigSummary | null }> {
  const name = 'kubeconfig';
  const fix = `make a node-scoped kubeconfig as ${DRA_DOCS} says, and set KUBECONFIG to it`;
  if (path === null)
    return {
      summary: null,
      lines: [
        { status: 'FAIL', name, detail: '--kubelet-api=dra but no --kubeconfig (KUBECONFIG)', fix, config: true },
      ],
    };
  const seen = readableInSandbox(unit.sandbox, path);
  if (!seen.writable || seen.private === true) {
    return {
      summary: null,
      lines: [
        {
          status: 'FAIL',
          name,
          detail: `${path}: ${seen.writable ? seen.how : seen.why} (unit: ${unit.source})`,
          fix: 'keep it under /etc, e.g. /etc/gpu-device-plugin/kubeconfig',
        },
      ],
    };
  }
  let text: string;
  let mode: number;
  try {
    [text, mode] = await Promise.all([readFile(path, 'utf8'), stat(path).then((s) => s.mode)]);
  } catch (err) {
    return { summary: null, lines: [{ status: 'FAIL', name, detail: `${path}: ${errorText(err)}`, fix }] };
  }
  let ref: KubeconfigRef;
  try {
    ref = resolveKubeconfig(text, path);
  } catch (err) {
    // The daemon's loader's words (they name the file and the key at fault): what the daemon would
    // refuse to start with.
    return { summary: null, lines: [{ status: 'FAIL', name, detail: errorText(err).split('\n')[0] ?? '', fix }] };
  }
  const summary = kubeconfigSummary(ref);
  if ('problem' in summary)
    return { summary: null, lines: [{ status: 'FAIL', name, detail: `${path}: ${summary.problem}`, fix }] };
  const missing = await unreadableFiles(summary, unit);
  if (missing.length > 0)
    return {
      summary,
      lines: [
        {
          status: 'FAIL',
          name,
          detail: `${path}: ${missing.join('; ')}`,
          fix:
            'embed them (kubectl config set-credentials --embed-certs, ' +
            'set-cluster --embed-certs) or keep them under /etc',
        },
      ],
    };
  const lines: CheckLine[] = [
    {
      status: 'PASS',
      name,
      detail:
        `${path}: context ${summary.context}, server ${summary.server} ` +
        `(${summary.ca}), user ${summary.user} with a ${summary.credentials}`,
    },
  ];
  if ((mode & 0o077) !== 0)
    lines.push({
      status: 'WARN',
      name: 'kubeconfig mode',
      detail:
        `${path} is mode ${(mode & 0o777).toString(8).padStart(4, '0')}: ` +
        `others on the node can read the node's credentials`,
      fix: `chmod 0600 ${path}`,
    });
  return { summary, lines: [...lines, ...[await clientCertificateLine(ref, path)].filter((l) => l !== null)] };
}

/** The client certificate's expiry: PASS with its date, WARN within 30 days, FAIL once expired; null for none. */
export async function clientCertificateLine(
  ref: KubeconfigRef,
  path: string,
  now = new Date(),
): Promise<CheckLine | null> {
  if (ref.cert === undefined) return null;
  const name = 'client certificate';
  const file = 'file' in ref.cert ? ref.cert.file : `client-certificate-data of ${path}`;
  const pem = 'file' in ref.cert ? await readFile(ref.cert.file).catch(() => null) : ref.cert.data;
  const notAfter = pem === null ? null : certificateNotAfter(pem);
  if (notAfter === null)
    return { status: 'FAIL', name, detail: `${file} is not a PEM certificate`, fix: 'give the node its certificate' };
  const e = judgeExpiry(notAfter, now);
  const fix = "renew the node's client certificate; the plugin reads the new file without a restart";
  if (e.state === 'valid')
    return { status: 'PASS', name, detail: `${file} valid until ${notAfter.toISOString()} (${e.daysLeft} days)` };
  return { status: e.state === 'expired' ? 'FAIL' : 'WARN', name, detail: expiryText(e, file) ?? '', fix };
}
