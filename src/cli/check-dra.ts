// `check`'s lines for the kubelet API mode: in DRA mode what DRA needs on this node (the
// kubeconfig, the API server reachable from the unit's sandbox, the kubelet's plugin directories
// writable, the NVIDIA Container Toolkit's CDI spec naming the GPUs), and in either mode one line
// saying what the other mode would need. check.ts runs them; the judging of the sandbox is
// sandbox.ts's; the kubeconfig is resolved by the daemon's own loader (src/k8s/kubeconfig.ts) and the
// CDI spec read and judged by the daemon's own code (src/dra/cdi.ts, core/dra-cdi.ts), so check
// refuses what the daemon would refuse.
import { connect } from 'node:net';
import { readFile, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';
import type { UnitRead } from './host-view.ts';
import { CDI_KIND, cdiDeviceId, cdiNameCandidates } from '../core/dra-cdi.ts';
import type { DraNodeDevice } from '../core/dra-claims.ts';
import { cdiSpecDirs, readCdiSpecs } from '../dra/cdi.ts';
import type { NodeReport } from './inspect.ts';
import { resolveKubeconfig } from '../k8s/kubeconfig.ts';
import type { KubeconfigRef } from '../k8s/kubeconfig.ts';
import type { Options } from '../config/options.ts';
import { readableInSandbox, writableInSandbox } from './sandbox.ts';
import { networkInSandbox } from './sandbox-network.ts';

/** Where the packages install the DRA drop-in, and where a node switched to DRA links it. */
const DRA_DROPIN_SOURCE = '/usr/share/gpu-device-plugin/dra.conf';
const DRA_DROPIN_LINK = '/etc/systemd/system/gpu-device-plugin.service.d/dra.conf';
export const LINK_DROPIN =
  `mkdir -p ${dirname(DRA_DROPIN_LINK)} && ln ` +
  `-s ${DRA_DROPIN_SOURCE} ${DRA_DROPIN_LINK} && systemctl daemon-reload`;
export const DRA_DOCS = '/usr/share/doc/gpu-device-plugin/dra/README.md';

/**
 * writableForService of check-writable.ts: a directory the service writes into, judged by the sandbox, then on disk.
 */
export type WritableCheck = (
  name: string,
  dir: string,
  unit: UnitRead,
  isRoot: boolean,
  fix: string,
) => Promise<CheckLine>;

export interface DraCheckDeps {
  readonly writable: WritableCheck;
  /** Whether a TCP connection to host:port opens within the time (default: net.connect, 2 s). */
  readonly tcpProbe?: (host: string, port: number) => Promise<string | null>;
}

function probe(host: string, port: number): Promise<string | null> {
  return new Promise((resolve) => {
    const s = connect({ host, port });
    const done = (why: string | null): void => {
      s.destroy();
      resolve(why);
    };
    s.setTimeout(2000, () => done('no answer within 2 s'));
    s.once('connect', () => done(null));
    s.once('error', (err) => done(errorText(err)));
  });
}

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

/** Everything DRA mode needs, one line each. `report` is NVML's view (null when NVML is not available). */
export async function draChecks(
  o: Options,
  unit: UnitRead,
  isRoot: boolean,
  env: Readonly<Record<string, string | undefined>>,
  report: NodeReport | null,
  deps: DraCheckDeps,
): Promise<CheckLine[]> {
  const lines: CheckLine[] = [];
  const kc = await kubeconfigCheck(o.kubeconfig, unit);
  lines.push(...kc.lines);
  lines.push(...(await apiServerChecks(kc.summary, unit, deps.tcpProbe ?? probe)));
  const dropin = `link the DRA drop-in: ${LINK_DROPIN}`;
  lines.push(
    await deps.writable(
      'plugins registry',
      o.kubeletPluginsRegistry,
      unit,
      isRoot,
      `the kubelet (1.34 or later) creates it at its start: is ` +
        `it running? or set --kubelet-plugins-registry; ${dropin}`,
    ),
  );
  lines.push(
    await driverDirectoryCheck(join(o.kubeletPluginsDir, o.draDriverName), unit, isRoot, deps.writable, dropin),
  );
  lines.push(await toolkitCdiCheck(env, report));
  return lines;
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
async function kubeconfigCheck(
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
  return { summary, lines };
}

/** The API server: the unit's sandbox lets the service reach it, and it answers TCP from here. */
async function apiServerChecks(
  kc: KubeconfigSummary | null,
  unit: UnitRead,
  tcpProbe: (host: string, port: number) => Promise<string | null>,
): Promise<CheckLine[]> {
  if (kc === null) return [{ status: 'SKIP', name: 'api server', detail: 'not checked: no usable kubeconfig (above)' }];
  const v = networkInSandbox(unit.sandbox, kc.host);
  const target = `${kc.host}:${kc.port}`;
  const lines: CheckLine[] = [];
  if (v.reachable === false)
    lines.push({
      status: 'FAIL',
      name: 'sandbox network',
      detail: `the service could not reach ${target}: ${v.why} (unit: ${unit.source})`,
      fix: `link the DRA drop-in: ${LINK_DROPIN}`,
    });
  else if (v.reachable === 'unknown')
    lines.push({
      status: 'WARN',
      name: 'sandbox network',
      detail: v.why,
      fix:
        `make sure IPAddressAllow= covers the addresses of ${kc.host} ` +
        `(and the DNS server's), or name the server by IP address`,
    });
  else
    lines.push({
      status: 'PASS',
      name: 'sandbox network',
      detail: `the unit's sandbox lets the service reach ${target} (${v.how})`,
    });
  const why = await tcpProbe(kc.host, kc.port);
  lines.push(
    why === null
      ? { status: 'PASS', name: 'api server', detail: `${target} accepts TCP connections from this node` }
      : {
          status: 'FAIL',
          name: 'api server',
          detail: `${target}: ${why}`,
          fix: 'is the API server up and the server address in the kubeconfig right? a firewall between?',
        },
  );
  return lines;
}

/**
 * The driver's own directory (dra.sock, the checkpoint): writable in the sandbox; the drop-in's
 * ExecStartPre= creates it.
 */
async function driverDirectoryCheck(
  dir: string,
  unit: UnitRead,
  isRoot: boolean,
  writable: WritableCheck,
  dropin: string,
): Promise<CheckLine> {
  const name = 'plugin directory';
  const v = writableInSandbox(unit.sandbox, dir);
  const exists = await stat(dir).then(
    (s) => s.isDirectory(),
    () => false,
  );
  if (v.writable && v.private !== true && !exists) {
    return {
      status: 'SKIP',
      name,
      detail:
        `${dir} does not exist yet; the unit's sandbox allows writing it ` +
        `(${v.how}) and the DRA drop-in's ExecStartPre= creates it at start`,
    };
  }
  return writable(
    name,
    dir,
    unit,
    isRoot,
    `${dropin}; with another --dra-driver-name or --kubelet-plugins-dir, ` +
      `add its directory to ReadWritePaths= and to the ExecStartPre= mkdir`,
  );
}

/** A whole GPU as the daemon's prepare looks it up in the toolkit's spec. */
function wholeGpu(g: NodeReport['gpus'][number]): DraNodeDevice {
  return { name: `gpu-${g.minor}`, gpuUuid: g.uuid, gpuIndex: g.index, minor: g.minor };
}

/**
 * The NVIDIA Container Toolkit's CDI spec (kind nvidia.com/gpu), read and judged as the daemon's prepare
 * does (src/dra/cdi.ts, core/dra-cdi.ts cdiDeviceId): present, naming every GPU (by index, UUID or
 * gpu<index>), and a GPU named by index holding that GPU's device node.
 */
export async function toolkitCdiCheck(
  env: Readonly<Record<string, string | undefined>>,
  report: NodeReport | null,
): Promise<CheckLine> {
  const name = 'cdi spec';
  const dirs = cdiSpecDirs(env);
  const specs = await readCdiSpecs(dirs);
  const ours = specs.flatMap((s) => ('kind' in s && s.kind === CDI_KIND ? [s] : []));
  const generate =
    '`nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` (or ' +
    "enable the toolkit's nvidia-cdi-refresh, which keeps it current)";
  if (ours.length === 0) {
    const broken = specs.flatMap((s) => ('error' in s ? [`${s.path}: ${s.error}`] : []));
    return {
      status: 'FAIL',
      name,
      detail:
        `DRA hands containers their GPUs as CDI devices ${CDI_KIND}=<name>, ` +
        `but no CDI spec in ${dirs.join(' or ')} has ` +
        `kind ${CDI_KIND}${broken.length > 0 ? `; unreadable: ${broken.join('; ')}` : ''}: ` +
        `prepared claims would fail`,
      fix: `generate it: ${generate}`,
    };
  }
  const paths = ours.map((s) => s.path).join(', ');
  if (report === null)
    return {
      status: 'SKIP',
      name,
      detail: `${paths} has kind ${CDI_KIND}; whether it names the node's GPUs was not checked: NVML is not available`,
    };
  const names = new Set(ours.flatMap((s) => s.devices.map((d) => d.name)));
  const missing = report.gpus.filter((g) => !cdiNameCandidates(wholeGpu(g)).some((n) => names.has(n)));
  if (missing.length > 0) {
    return {
      status: 'FAIL',
      name,
      detail:
        `${paths} (${CDI_KIND}) names neither the UUID nor the index ` +
        `of ${missing.map((g) => `GPU ${g.index} (${g.uuid})`).join(', ')}: it is stale, ` +
        `and claims given ${missing.length === 1 ? 'that GPU' : 'those GPUs'} would fail`,
      fix: `regenerate it: ${generate}`,
    };
  }
  const verdicts = report.gpus.map((g) => cdiDeviceId(wholeGpu(g), specs, dirs));
  const refused = verdicts.flatMap((v) => ('error' in v ? [v.error] : []));
  if (refused.length > 0)
    return { status: 'FAIL', name, detail: refused.join('; '), fix: `regenerate it: ${generate}` };
  const typeIndex = verdicts.some((v) => 'id' in v && /=gpu\d+$/.test(v.id));
  return {
    status: 'PASS',
    name,
    detail:
      `${paths} names all ${report.gpus.length} GPUs ` +
      `as ${CDI_KIND}=<${typeIndex ? 'index, UUID or gpu<index>' : 'index or UUID'}>`,
  };
}

/** One line: what the mode this node does not run would need, from what check sees now. */
export async function otherModeLine(o: Options, unit: UnitRead, envFile: string): Promise<CheckLine> {
  if (o.kubeletApi === 'dra') {
    const dir = dirname(o.kubeletSocket);
    const ok = writableInSandbox(unit.sandbox, dir).writable;
    return {
      status: 'INFO',
      name: 'device-plugin mode',
      detail:
        `device-plugin mode would need: KUBELET_API=device-plugin (or unset) in ${envFile} ` +
        `and a restart; ${dir} writable (${ok ? 'the unit allows it' : 'the unit does NOT allow it'}); ` +
        `the kubelet removes this node's ResourceSlices 30 s after the DRA plugin ` +
        `stops, and pods asking nvidia.com/gpu are then served by the device plugin`,
    };
  }
  const network = networkInSandbox(unit.sandbox, '192.0.2.1').reachable !== false;
  const registry = writableInSandbox(unit.sandbox, o.kubeletPluginsRegistry).writable;
  const ready =
    network && registry
      ? "the unit's sandbox already allows it"
      : `the unit's sandbox does not allow it yet (` +
        [network ? '' : 'no network', registry ? '' : `${o.kubeletPluginsRegistry} read-only`]
          .filter((x) => x !== '')
          .join(', ') +
        `): ${LINK_DROPIN}`;
  return {
    status: 'INFO',
    name: 'DRA mode',
    detail:
      `to switch this node to DRA: KUBELET_API=dra and KUBECONFIG=<a node-scoped ` +
      `kubeconfig> in ${envFile}; ${ready}; the RBAC, admission policy and ` +
      `DeviceClass of ${dirname(DRA_DOCS)}; then systemctl restart gpu-device-plugin ` +
      `(try it first: gpu-device-plugin check --kubelet-api=dra --kubeconfig=FILE)`,
  };
}
