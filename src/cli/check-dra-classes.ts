// `check`'s lines in DRA mode on the cluster's DeviceClasses: which classes the devices this node publishes need
// (whole GPUs → gpu.nvidia.com, each MIG profile present → its class, named as check-dra-class-table.ts names them),
// and which of them the cluster lacks or has without the extended resource the device plugin served them under —
// pods asking nvidia.com/gpu or nvidia.com/mig-… are then not served through DRA (WARN). The time-sliced and MPS
// classes are a note (INFO). The classes are listed with the kubeconfig's credentials (the shipped rbac.yaml grants
// the nodes `list deviceclasses` for this); an API server that cannot be reached, or credentials that may not list
// DeviceClasses (a role applied before that rule), make a note saying so, never a failure.
import { join } from 'node:path';
import { draDevices } from '../core/dra-devices.ts';
import { NO_MIG } from '../core/mig.ts';
import type { MigStrategy } from '../core/mig.ts';
import { KubeApiError, KubeClient, KubeUnreachableError } from '../k8s/client.ts';
import { loadKubeconfig } from '../k8s/kubeconfig.ts';
import { listDeviceClasses } from '../k8s/resources.ts';
import type { DeviceClassObject } from '../k8s/resources.ts';
import { errorText } from '../system/log.ts';
import {
  CLASS_DOCS_DIR,
  MIG_FILE,
  MIG_PROFILES,
  MPS_CLASS,
  SHARING_FILE,
  TIME_SLICED_CLASS,
  WHOLE_GPU_CLASS,
  WHOLE_GPU_FILE,
  WHOLE_GPU_RESOURCE,
  migClassName,
  migClassResource,
} from './check-dra-class-table.ts';
import type { CheckLine } from './check-report.ts';
import type { NodeReport } from './inspect.ts';

/** A class the node's devices need: its name, the extended resource it must name, what needs it, its shipped file. */
export interface ClassNeed {
  readonly name: string;
  readonly resource: string;
  readonly what: string;
  /** The shipped file that holds it, or null when no shipped class has this profile. */
  readonly file: string | null;
}

/** The classes the DRA devices of this node need, in the order the devices come. */
export function neededClasses(report: NodeReport, migStrategy: MigStrategy): ClassNeed[] {
  const { devices } = draDevices({ gpus: report.gpus, mig: report.mig ?? NO_MIG }, migStrategy);
  const shipped = new Set(MIG_PROFILES.flatMap((r) => r.profiles));
  const needs = new Map<string, ClassNeed & { count: number }>();
  for (const d of devices) {
    const profile = d.mig?.profile;
    const name = profile === undefined ? WHOLE_GPU_CLASS : migClassName(profile);
    const had = needs.get(name);
    if (had !== undefined) {
      had.count++;
      continue;
    }
    needs.set(
      name,
      profile === undefined
        ? { name, resource: WHOLE_GPU_RESOURCE, what: 'whole GPUs', file: WHOLE_GPU_FILE, count: 1 }
        : {
            name,
            resource: migClassResource(profile),
            what: `MIG ${profile}`,
            file: shipped.has(profile) ? MIG_FILE : null,
            count: 1,
          },
    );
  }
  return [...needs.values()].map(({ count, ...n }) => ({ ...n, what: `${count} ${n.what}` }));
}

/** The cluster's DeviceClasses through the kubeconfig's credentials (5 s per request). */
async function listWithKubeconfig(kubeconfig: string): Promise<DeviceClassObject[]> {
  const client = new KubeClient(await loadKubeconfig(kubeconfig));
  try {
    return await listDeviceClasses(client, 5000);
  } finally {
    client.close();
  }
}

export interface ClassCheckDeps {
  /** Lists the cluster's DeviceClasses (default: with the kubeconfig's credentials). */
  readonly list?: (kubeconfig: string) => Promise<DeviceClassObject[]>;
}

const NAME = 'device classes';
/** The shipped RBAC, beside the classes, that grants the nodes `list deviceclasses`. */
export const RBAC_FILE = 'rbac.yaml';

/** Why the classes could not be listed, as a line; null when the error is not one of the expected kinds. */
function unlistedLine(err: unknown): CheckLine {
  if (err instanceof KubeApiError && (err.code === 403 || err.code === 401))
    return {
      status: 'INFO',
      name: NAME,
      detail:
        `not checked: these credentials may not list DeviceClasses (${err.code} ${err.reason}; ` +
        (err.code === 403
          ? `the cluster's role for the nodes predates the shipped ${RBAC_FILE}, which grants it)`
          : 'the API server does not accept them)'),
      fix:
        `kubectl get deviceclasses, and compare with the classes of ${CLASS_DOCS_DIR}/` +
        (err.code === 403 ? `; or let the nodes list them: kubectl apply -f ${join(CLASS_DOCS_DIR, RBAC_FILE)}` : ''),
    };
  if (err instanceof KubeUnreachableError)
    return { status: 'INFO', name: NAME, detail: `not checked: the API server did not answer: ${errorText(err)}` };
  return { status: 'WARN', name: NAME, detail: `could not list DeviceClasses: ${errorText(err)}` };
}

/** The DeviceClass lines: the classes this node's devices need that the cluster lacks, and the sharing classes. */
export async function draClassesCheck(
  kubeconfig: string | null,
  kubeconfigUsable: boolean,
  report: NodeReport | null,
  migStrategy: MigStrategy,
  driver: string,
  deps: ClassCheckDeps = {},
): Promise<CheckLine[]> {
  if (report === null)
    return [
      {
        status: 'SKIP',
        name: NAME,
        detail: 'not checked: NVML is not available, so what this node publishes is not known',
      },
    ];
  if (kubeconfig === null || !kubeconfigUsable)
    return [{ status: 'SKIP', name: NAME, detail: 'not checked: no usable kubeconfig (above)' }];
  const needs = neededClasses(report, migStrategy);
  let classes: DeviceClassObject[];
  try {
    classes = await (deps.list ?? listWithKubeconfig)(kubeconfig);
  } catch (err) {
    return [unlistedLine(err)];
  }
  const byName = new Map(classes.map((c) => [c.metadata.name ?? '', c]));
  const lines = [classesLine(needs, byName, driver)];
  if (needs.some((n) => n.name === WHOLE_GPU_CLASS)) lines.push(sharingLine(byName));
  return lines;
}

function classesLine(
  needs: readonly ClassNeed[],
  byName: ReadonlyMap<string, DeviceClassObject>,
  driver: string,
): CheckLine {
  const other =
    driver === WHOLE_GPU_CLASS
      ? ''
      : `; the shipped classes select driver ${WHOLE_GPU_CLASS}, this node publishes as ${driver}`;
  if (needs.length === 0)
    return { status: 'INFO', name: NAME, detail: `this node publishes no devices, so needs no DeviceClass${other}` };
  const problems: string[] = [];
  const files = new Set<string>();
  const unshipped: string[] = [];
  for (const n of needs) {
    const have = byName.get(n.name);
    const ern = have?.spec?.extendedResourceName;
    if (have !== undefined && ern === n.resource) continue;
    problems.push(
      have === undefined
        ? `${n.name} (for ${n.what})`
        : `${n.name} names ${ern === undefined ? 'no extended resource' : ern}, not ${n.resource} (for ${n.what})`,
    );
    if (n.file === null) unshipped.push(n.what.replace(/^\d+ MIG /, ''));
    else files.add(join(CLASS_DOCS_DIR, n.file));
  }
  const names = needs.map((n) => n.name).join(', ');
  if (problems.length === 0)
    return {
      status: 'PASS',
      name: NAME,
      detail: `the cluster has ${names} for the devices this node publishes${other}`,
    };
  const fixes = [
    ...(files.size === 0 ? [] : [`kubectl apply ${[...files].map((f) => `-f ${f}`).join(' ')}`]),
    ...(unshipped.length === 0
      ? []
      : [`write a class for ${unshipped.join(', ')} as those of ${join(CLASS_DOCS_DIR, MIG_FILE)} are`]),
  ];
  return {
    status: 'WARN',
    name: NAME,
    detail:
      `the cluster lacks DeviceClass ${problems.join(', ')}: pods asking ` +
      `${needs.map((n) => n.resource).join(' or ')} are not served through DRA on this node${other}`,
    fix: fixes.join('; '),
  };
}

function sharingLine(byName: ReadonlyMap<string, DeviceClassObject>): CheckLine {
  const names = [TIME_SLICED_CLASS, MPS_CLASS];
  const lacking = names.filter((n) => !byName.has(n));
  return {
    status: 'INFO',
    name: 'sharing classes',
    detail:
      lacking.length === 0
        ? `the cluster has ${names.join(' and ')} (whole GPUs time-sliced or with MPS for the containers of a claim)`
        : `the cluster lacks ${lacking.join(' and ')} (whole GPUs time-sliced or with MPS for the containers ` +
          `of a claim; claims may carry NVIDIA's GpuConfig themselves instead)`,
    ...(lacking.length === 0 ? {} : { fix: `kubectl apply -f ${join(CLASS_DOCS_DIR, SHARING_FILE)}` }),
  };
}
