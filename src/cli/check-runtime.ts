// What the container runtime needs on the host for the device-list strategy and --pass-device-specs:
// CDI specs naming the devices the daemon passes (and the IMEX channels), the device nodes. The specs
// are read by the DRA mode's own reader (src/dra/cdi.ts), from the same directories.
import { access, constants as fsc } from 'node:fs/promises';
import { CDI_KIND, CONTROL_DEVICE_NODES, hostPath } from '../core/allocate.ts';
import type { CdiSpec } from '../core/dra-cdi.ts';
import { CDI_IMEX_KIND } from '../core/imex.ts';
import type { MigPlan } from '../core/mig-strategies.ts';
import type { Options, ParsedOptions } from '../config/options.ts';
import { cdiSpecDirs, readCdiSpecs } from '../dra/cdi.ts';
import type { CheckLine } from './check-report.ts';
import type { NodeReport } from './inspect.ts';

/** The device names of the specs of one kind. */
function namesOfKind(specs: readonly CdiSpec[], kind: string): string[] {
  return specs.flatMap((s) => ('kind' in s && s.kind === kind ? s.devices.map((d) => d.name) : []));
}

/** With a CDI device-list strategy: a spec of our kind that names every device the daemon would pass. */
function cdiSpecCheck(
  o: Options,
  cdi: readonly string[],
  dirs: readonly string[],
  specs: readonly CdiSpec[],
  r: NodeReport | null,
  plan: MigPlan | null,
): CheckLine {
  const ours = specs.flatMap((s) => ('kind' in s && s.kind === CDI_KIND ? [s] : []));
  const generate =
    `\`nvidia-ctk cdi generate --vendor k8s.device-plugin.nvidia.com --class gpu ` +
    `--device-name-strategy ${o.deviceIdStrategy} --output /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml\``;
  const name = `cdi spec`;
  const broken = specs.flatMap((s) => ('error' in s ? [`${s.path}: ${s.error}`] : []));
  if (ours.length === 0) {
    const other = specs.flatMap((s) => ('kind' in s && s.kind.endsWith('/gpu') ? [`${s.path} (kind ${s.kind})`] : []));
    return {
      status: 'FAIL',
      name,
      detail:
        `--device-list-strategy=${cdi.join(',')} asks the runtime for ${CDI_KIND}=<id>, but no CDI spec in ` +
        `${dirs.join(' or ')} has kind ${CDI_KIND}` +
        `${other.length > 0 ? `; found ${other.join(', ')}, which the runtime does not match to these names` : ''}` +
        `${broken.length > 0 ? `; unreadable: ${broken.join('; ')}` : ''}`,
      fix: `generate one: ${generate}`,
    };
  }
  const paths = ours.map((s) => s.path).join(', ');
  if (plan === null || r === null) {
    return {
      status: 'SKIP',
      name,
      detail:
        `${paths} has kind ${CDI_KIND}; whether it names the node's devices was not ` +
        `checked: ${r === null ? 'NVML is not available' : 'the config does not fit the node'}`,
    };
  }
  const have = new Set(namesOfKind(ours, CDI_KIND));
  const want = [...new Set(plan.resources.flatMap((res) => res.devices.map((d) => d.runtimeName)))];
  const missing = want.filter((n) => !have.has(n));
  if (missing.length > 0) {
    return {
      status: 'FAIL',
      name,
      detail:
        `${paths} (${CDI_KIND}) does not name ${missing.length} of the ${want.length} devices ` +
        `the daemon passes (--device-id-strategy=${o.deviceIdStrategy}): ${missing.slice(0, 4).join(', ')}` +
        `${missing.length > 4 ? ', …' : ''}; containers given them fail to start`,
      fix: `regenerate it: ${generate}`,
    };
  }
  return {
    status: 'PASS',
    name,
    detail: `${paths} names all ${want.length} devices as ${CDI_KIND}=<${o.deviceIdStrategy}>`,
  };
}

/** With a CDI device-list strategy and IMEX channels: Allocate names the channels as CDI devices too. */
function imexSpecCheck(specs: readonly CdiSpec[], imexChannels: readonly number[]): CheckLine {
  const have = new Set(namesOfKind(specs, CDI_IMEX_KIND));
  const missing = imexChannels.filter((id) => !have.has(String(id)));
  return missing.length === 0
    ? {
        status: 'PASS',
        name: 'cdi imex spec',
        detail: `a CDI spec names ${imexChannels.map((id) => `${CDI_IMEX_KIND}=${id}`).join(', ')}`,
      }
    : {
        status: 'FAIL',
        name: 'cdi imex spec',
        detail:
          `containers are given ${missing.map((id) => `${CDI_IMEX_KIND}=${id}`).join(', ')}, ` +
          `which no CDI spec names`,
        fix:
          'generate the IMEX channel spec with `nvidia-ctk cdi generate --vendor ' +
          'k8s.device-plugin.nvidia.com --class imex-channel` (or one naming channel<N> as device <N>)',
      };
}

async function exists(path: string): Promise<boolean> {
  return access(path, fsc.F_OK).then(
    () => true,
    () => false,
  );
}

/** With --pass-device-specs: the device nodes Allocate passes exist under --dev-root. */
async function deviceNodesCheck(o: Options, r: NodeReport | null): Promise<CheckLine> {
  const name = 'device nodes';
  if (r === null)
    return {
      status: 'SKIP',
      name,
      detail: 'not checked: NVML is not available to say which /dev/nvidia<minor> the GPUs have',
    };
  const want = [CONTROL_DEVICE_NODES[0] as string, ...r.gpus.map((g) => `/dev/nvidia${g.minor}`)];
  const missing: string[] = [];
  for (const p of want) if (!(await exists(hostPath(o.devRoot, p)))) missing.push(hostPath(o.devRoot, p));
  if (missing.length > 0)
    return {
      status: 'FAIL',
      name,
      detail:
        `--pass-device-specs passes ${want.length} nodes under ` +
        `--dev-root=${o.devRoot}; missing: ${missing.join(', ')}`,
      fix:
        "check --dev-root (NVIDIA_DEV_ROOT); the driver's udev rules or " +
        'nvidia-persistenced create the nodes (nvidia-modprobe -c <minor>)',
    };
  return {
    status: 'PASS',
    name,
    detail: `${want.length} nodes passed with --pass-device-specs exist under ${o.devRoot} (${want.join(', ')})`,
  };
}

/**
 * What the device-list strategy and --pass-device-specs need on the host: CDI specs naming our devices,
 * the device nodes.
 */
export async function strategyChecks(
  parsed: ParsedOptions,
  r: NodeReport | null,
  plan: MigPlan | null,
  imexChannels: readonly number[],
  env: Readonly<Record<string, string | undefined>>,
): Promise<CheckLine[]> {
  const o = parsed.options;
  const out: CheckLine[] = [];
  const cdi = o.deviceListStrategy.filter((s) => s === 'cdi-annotations' || s === 'cdi-cri');
  if (cdi.length > 0) {
    const dirs = cdiSpecDirs(env);
    const specs = await readCdiSpecs(dirs);
    out.push(cdiSpecCheck(o, cdi, dirs, specs, r, plan));
    if (imexChannels.length > 0) out.push(imexSpecCheck(specs, imexChannels));
  }
  if (o.passDeviceSpecs) out.push(await deviceNodesCheck(o, r));
  return out;
}
