// Dynamic MIG as `check` and `info` show it: which GPUs it covers (in MIG mode, with placements from this
// driver), how many placements each has free beside the instances already there, and whether the settings let it
// run (DRA mode, a MIG strategy so that MIG is read at all).
import { freePartitions } from '../core/dynamic-mig.ts';
import type { NodeReport } from './inspect.ts';
import type { CheckLine } from './check-report.ts';
import type { Options } from '../config/options.ts';

export interface DynamicMigGpuView {
  readonly gpu: number;
  readonly uuid: string;
  readonly profiles: number;
  readonly free: number;
  readonly instances: number;
}

/** Each GPU dynamic MIG covers: its profiles, free placements and existing GPU instances. */
export function dynamicMigView(r: NodeReport): DynamicMigGpuView[] {
  const p = r.mig?.partitionable;
  if (p === undefined) return [];
  return r.gpus.flatMap((g, i) => {
    const x = p.get(g.uuid);
    if (x === undefined || r.mig?.modes[i]?.current !== true) return [];
    const free = freePartitions({ minor: g.minor, ...x }).length;
    return [{ gpu: g.index, uuid: g.uuid, profiles: x.profiles.length, free, instances: x.instances.length }];
  });
}

/** `check`'s dynamic MIG line, when the config file turns it on. */
export function dynamicMigCheck(r: NodeReport, o: Options, on: boolean): CheckLine[] {
  if (!on) return [];
  const name = 'dynamic mig';
  if (o.kubeletApi !== 'dra')
    return [{ status: 'WARN', name, detail: 'dra.dynamicMig is set, but --kubelet-api is not dra: it is not used' }];
  if (o.migStrategy === 'none')
    return [
      {
        status: 'FAIL',
        name,
        detail: 'dra.dynamicMig needs MIG read, and --mig-strategy=none reads none',
        fix: 'set --mig-strategy=mixed (MIG_STRATEGY=mixed)',
      },
    ];
  const view = dynamicMigView(r);
  if (view.length === 0)
    return [
      {
        status: 'WARN',
        name,
        detail: 'no GPU is in MIG mode with placements from this driver: nothing to partition',
        fix: 'put the GPUs in MIG mode (nvidia-smi -mig 1; a reset on Ampere); the package never changes MIG mode',
      },
    ];
  const gpus = view.map((v) => `GPU ${v.gpu} (${v.free} free placements, ${v.instances} instances)`).join(', ');
  return [{ status: 'PASS', name, detail: `covers ${view.length} GPU${view.length === 1 ? '' : 's'}: ${gpus}` }];
}
