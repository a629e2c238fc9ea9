// What the subcommands `info` and `check` see of the node: NVML, the GPUs, their links and pair
// scores, and their MIG modes and devices, read once through the same adapters the daemon uses.
import type { Gpu, Health } from '../core/devices.ts';
import type { NodeFacts } from '../core/snapshot.ts';
import { MigStrategyError, planMigResources } from '../core/mig-strategies.ts';
import type { MigDevice, MigLayout, MigStrategy } from '../core/mig.ts';
import { NO_SHARING } from '../core/sharing.ts';
import { buildScoreMatrix } from '../core/topology/index.ts';
import { discoverMig } from '../nvml/mig.ts';
import { getComputeMode } from '../nvml/compute-mode.ts';
import type { ComputeMode } from '../nvml/compute-mode.ts';
import { discoverGpus, readLinks } from '../nvml/discovery.ts';
import type { DiscoveredGpus, NodeLinks } from '../nvml/discovery.ts';
import { readNodeFacts } from '../nvml/node-facts.ts';
import { NVML } from '../nvml/errors.ts';
import { Nvml } from '../nvml/nvml.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { loadKoffi } from '../system/native.ts';

export interface PairInfo {
  /** NVML PCIe topology level, -1 when unknown. */
  pcie: number;
  nvlinks: number;
  /** Both GPUs reach the same NVSwitch fabric. */
  nvswitch: boolean;
  score: number;
}

export interface NodeReport {
  library: string;
  driverVersion: string;
  gpus: (Gpu & { health: Health })[];
  /** pairs[i][j], by GPU position; the diagonal is null. */
  pairs: (PairInfo | null)[][];
  /** MIG as NVML reports it, or null when this driver has no MIG functions. */
  mig: MigLayout | null;
  /** Each GPU's compute mode (by position), or why NVML could not say; absent: not read (older callers). */
  computeModes?: (ComputeMode | { error: string })[];
  /**
   * Compute capabilities and MIG capability, as the daemon reads them (the MPS client limit needs them); absent when
   * not read.
   */
  facts?: NodeFacts;
}

/** A MIG device as `info` shows it: with the resource it is advertised under for a strategy. */
export interface MigDeviceView extends MigDevice {
  /** The resource under the strategy, or null when the strategy does not advertise it. */
  resource: string | null;
}

/**
 * Where each MIG device goes under a strategy (by UUID), or the reason the node is not valid for
 * it (single on a non-uniform node).
 */
export function migResources(
  r: NodeReport,
  strategy: MigStrategy,
): { devices: MigDeviceView[]; problem: string | null; notes: string[] } {
  const layout = r.mig;
  if (layout === null) return { devices: [], problem: null, notes: [] };
  const byUuid = new Map<string, string>();
  let problem: string | null = null;
  let notes: string[] = [];
  try {
    const plan = planMigResources(r.gpus, layout, strategy, 'uuid', NO_SHARING);
    notes = plan.notes;
    for (const res of plan.resources) for (const d of res.devices) if (d.mig !== undefined) byUuid.set(d.mig, res.name);
  } catch (err) {
    if (!(err instanceof MigStrategyError)) throw err;
    problem = err.message;
  }
  return { devices: layout.devices.map((d) => ({ ...d, resource: byUuid.get(d.uuid) ?? null })), problem, notes };
}

export type InspectResult = { ok: true; report: NodeReport } | { ok: false; error: string };

/** Each pair's PCIe relation, NVLinks, shared NVSwitch fabric and score, by GPU position. */
function pairInfo(links: NodeLinks, n: number): (PairInfo | null)[][] {
  const scores = buildScoreMatrix(links.gpus, (i, j) => links.pcie[i]?.[j] ?? -1);
  const switchLinks = links.gpus.map((g) => g.links.filter((l) => l.remote === 'switch').length);
  return Array.from({ length: n }, (_, i) =>
    Array.from({ length: n }, (_, j): PairInfo | null =>
      i === j
        ? null
        : {
            pcie: links.pcie[i]?.[j] ?? -1,
            nvlinks: scores.nvlinks(i, j),
            nvswitch: (switchLinks[i] ?? 0) > 0 && (switchLinks[j] ?? 0) > 0,
            score: scores.score(i, j),
          },
    ),
  );
}

/** Each GPU's compute mode (MPS needs EXCLUSIVE_PROCESS, which `check` says); one cheap call per GPU. */
function computeModes(nvml: Nvml, found: DiscoveredGpus): (ComputeMode | { error: string })[] {
  return found.gpus.map((g, i): ComputeMode | { error: string } => {
    const h = found.handles[i];
    if (h === undefined) return { error: 'no NVML handle' };
    try {
      return getComputeMode(nvml, h, { index: g.index, uuid: g.uuid });
    } catch (err) {
      return { error: errorText(err) };
    }
  });
}

/** What NVML says of the node, read once through the daemon's adapters; NVML is shut down after. */
export function inspectNode(driverRoot: string, sysfsRoot: string, log: Logger): InspectResult {
  let nvml: Nvml | undefined;
  try {
    const open = Nvml.open({ koffi: loadKoffi(), driverRoot, log });
    nvml = open;
    const driverVersion = open.driverVersion();
    const found = discoverGpus(open, sysfsRoot, log);
    const pairs = pairInfo(readLinks(open, found, log), found.gpus.length);
    const gpus = found.gpus.map((g, i) => {
      const h = found.handles[i];
      const code = h === undefined ? NVML.ERROR_GPU_IS_LOST : open.probe(h);
      return { ...g, health: (code === NVML.SUCCESS ? 'Healthy' : 'Unhealthy') as Health };
    });
    const mig = discoverMig(open, found.gpus, found.handles, log);
    const modes = computeModes(open, found);
    const facts = readNodeFacts(open, found.gpus, found.handles, log);
    return {
      ok: true,
      report: { library: open.libraryPath, driverVersion, gpus, pairs, mig, facts, computeModes: modes },
    };
  } catch (err) {
    return { ok: false, error: errorText(err) };
  } finally {
    nvml?.shutdown();
  }
}
