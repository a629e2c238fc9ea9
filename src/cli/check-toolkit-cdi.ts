// `check`'s CDI line in DRA mode: the NVIDIA Container Toolkit's CDI spec read and judged by the daemon's own code
// (src/dra/cdi.ts, core/dra-cdi.ts), so check refuses what the daemon's prepare would refuse.
import type { CheckLine } from './check-report.ts';
import { CDI_KIND, cdiDeviceId, cdiNameCandidates } from '../core/dra-cdi.ts';
import type { DraNodeDevice } from '../core/dra-claims.ts';
import { cdiSpecDirs, readCdiSpecs } from '../dra/cdi.ts';
import type { NodeReport } from './inspect.ts';

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
