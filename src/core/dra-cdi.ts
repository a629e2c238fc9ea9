// DRA's CDI side, pure: the CDI device name the NVIDIA Container Toolkit's spec has for a GPU or MIG device (by the
// toolkit's naming strategies, and by the device node when NVML's indices moved since the spec was written), and
// the errors saying what to run when the spec is missing or stale. Reading the spec files is src/dra/cdi.ts's.
import type { DraNodeDevice } from './dra-claims.ts';

/** The CDI kind of the NVIDIA Container Toolkit's GPU spec. */
export const CDI_KIND = 'nvidia.com/gpu';

/** The command that writes the toolkit's spec where the runtime looks. */
export const CDI_GENERATE_HINT =
  'run `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` (or `systemctl ' +
  'restart nvidia-cdi-refresh.service` with NVIDIA Container Toolkit 1.18 or later)';

/** A CDI spec file as the adapter read it: its kind and, per device, its name and device node paths. */
export type CdiSpec =
  | {
      readonly path: string;
      readonly kind: string;
      readonly devices: readonly { readonly name: string; readonly deviceNodes: readonly string[] }[];
    }
  | { readonly path: string; readonly error: string };

/**
 * The names the toolkit may give a device, by `nvidia-ctk cdi generate --device-name-strategy`:
 * index (default: `0`, a MIG device `0:1`), uuid (`GPU-…`, `MIG-…`), type-index (`gpu0`, `mig0:1`).
 */
export function cdiNameCandidates(d: DraNodeDevice): string[] {
  if (d.mig !== undefined) {
    const idx = `${d.gpuIndex}:${d.mig.index}`;
    return [idx, d.mig.uuid, `mig${idx}`];
  }
  return [String(d.gpuIndex), d.gpuUuid, `gpu${d.gpuIndex}`];
}

export type CdiVerdict = { readonly id: string } | { readonly error: string };

type ReadSpec = Extract<CdiSpec, { kind: string }>;

/** A whole GPU's name in the toolkit's index strategies (`0`, `gpu0`): what an NVML index change can move. */
const INDEX_NAME = /^(gpu)?\d+$/;

/**
 * The index-named entry whose device node is this GPU's: after a GPU left the bus NVML numbers the
 * others anew, while a spec generated before still names each GPU by its index then, with its
 * /dev/nvidia<minor>. The device node, not today's index, says which entry is this GPU.
 */
function entryByDeviceNode(d: DraNodeDevice, specs: readonly ReadSpec[]): string | undefined {
  const node = `/dev/nvidia${d.minor}`;
  for (const spec of specs) {
    const e = spec.devices.find((x) => INDEX_NAME.test(x.name) && x.deviceNodes.includes(node));
    if (e !== undefined) return e.name;
  }
  return undefined;
}

/**
 * The entry named `name` in the specs, if it is this device: a whole GPU named by index must carry
 * /dev/nvidia<minor> when the spec lists device nodes (`stale`: it names another GPU).
 */
function entryNamed(
  d: DraNodeDevice,
  name: string,
  specs: readonly ReadSpec[],
): { found: true } | { stale: string } | undefined {
  for (const spec of specs) {
    const entry = spec.devices.find((e) => e.name === name);
    if (entry === undefined) continue;
    const node = `/dev/nvidia${d.minor}`;
    if (d.mig !== undefined || name === d.gpuUuid || entry.deviceNodes.length === 0 || entry.deviceNodes.includes(node))
      return { found: true };
    return { stale: `the CDI spec ${spec.path} is stale: its device ${name} has ${entry.deviceNodes.join(', ')}` };
  }
  return undefined;
}

/**
 * The CDI device ID (`nvidia.com/gpu=<name>`) of a device, from the toolkit's specs: the first of its
 * candidate names found; for a whole GPU whose index-named entry is another GPU's, the index-named
 * entry with its device node (an index that moved), else a stale spec. Missing and stale specs are
 * errors saying what to run.
 */
export function cdiDeviceId(d: DraNodeDevice, specs: readonly CdiSpec[], dirs: readonly string[]): CdiVerdict {
  const ours = specs.filter((s): s is ReadSpec => 'kind' in s && s.kind === CDI_KIND);
  const unreadable = specs.filter((s): s is Extract<CdiSpec, { error: string }> => 'error' in s);
  const unreadableNote =
    unreadable.length === 0
      ? ''
      : `; unreadable spec files: ${unreadable.map((s) => `${s.path} (${s.error})`).join(', ')}`;
  const what =
    d.mig === undefined
      ? `GPU ${d.gpuIndex} (${d.gpuUuid})`
      : `MIG device ${d.gpuIndex}:${d.mig.index} (${d.mig.uuid}) of GPU ${d.gpuUuid}`;
  if (ours.length === 0) {
    return {
      error:
        `no CDI spec of kind ${CDI_KIND} in ${dirs.join(' or ')}${unreadableNote}: the ` +
        `container runtime could not give the container ${what}; ${CDI_GENERATE_HINT}`,
    };
  }
  const candidates = cdiNameCandidates(d);
  let stale: string | undefined;
  for (const name of candidates) {
    const e = entryNamed(d, name, ours);
    if (e === undefined) continue;
    if ('found' in e) return { id: `${CDI_KIND}=${name}` };
    stale ??= e.stale;
  }
  const moved = d.mig === undefined ? entryByDeviceNode(d, ours) : undefined;
  if (moved !== undefined) return { id: `${CDI_KIND}=${moved}` };
  if (stale !== undefined) return { error: `${stale}, but ${what} is /dev/nvidia${d.minor}; ${CDI_GENERATE_HINT}` };
  return {
    error:
      `the CDI spec${ours.length > 1 ? 's' : ''} ${ours.map((s) => s.path).join(', ')}` +
      ` ${ours.length > 1 ? 'have' : 'has'} no device for ${what} (looked for ` +
      `${candidates.join(', ')}): ${ours.length > 1 ? 'they were' : 'it was'} generated ` +
      `before the GPUs or the MIG layout changed; ${CDI_GENERATE_HINT}${unreadableNote}`,
  };
}
