// `check`'s lines for DRA mode, instead of the kubelet lines: what DRA needs on this node, run in order — the
// kubeconfig (check-kubeconfig.ts), the API server reachable from the unit's sandbox and over TCP, the kubelet's
// plugin directories writable, the NVIDIA Container Toolkit's CDI spec naming the GPUs (check-toolkit-cdi.ts), the
// cluster's DeviceClasses for the devices this node publishes (check-dra-classes.ts).
// check.ts runs them; the judging of the sandbox is sandbox.ts's.
import { connect } from 'node:net';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';
import type { UnitRead } from './host-view.ts';
import { kubeconfigCheck } from './check-kubeconfig.ts';
import type { KubeconfigSummary } from './check-kubeconfig.ts';
import type { ClassCheckDeps } from './check-dra-classes.ts';
import { toolkitCdiCheck } from './check-toolkit-cdi.ts';
import { draClassesCheck } from './check-dra-classes.ts';
import { LINK_DROPIN } from './dra-install.ts';
import type { NodeReport } from './inspect.ts';
import type { Options } from '../config/options.ts';
import { writableInSandbox } from './sandbox.ts';
import { networkInSandbox } from './sandbox-network.ts';

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
  /** How the cluster's DeviceClasses are listed (default: with the kubeconfig's credentials). */
  readonly classes?: ClassCheckDeps;
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
  lines.push(
    ...(await draClassesCheck(o.kubeconfig, kc.summary !== null, report, o.migStrategy, o.draDriverName, deps.classes)),
  );
  return lines;
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
