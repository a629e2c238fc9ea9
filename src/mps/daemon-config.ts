// What `mps-control-daemon` reads: the plugin's own options (parseOptions: command line, environment
// file, config file, with `--mps-root` and `sharing.mps` and their refusals), turned into the control
// daemons' plan through the plugin's own planning (core/config-fit.ts planForNode — planResources and
// mpsPlanProblem: no MPS on MIG, at most 16 clients per GPU before compute capability 7.0 — then
// core/mps.ts planMpsDaemons), on the same scan of the node (nvml/node-reader.ts), so the two units
// cannot disagree on which GPUs a resource has, on its limits, or on what they refuse.
import { planForNode } from '../core/config-fit.ts';
import { planMpsDaemons } from '../core/mps.ts';
import type { MpsDaemonPlan } from '../core/mps.ts';
import { NO_MIG } from '../core/mig.ts';
import type { Sharing } from '../core/sharing.ts';
import type { NodeScan } from '../core/snapshot.ts';
import { parseOptions } from '../config/parse-options.ts';
import type { Options } from '../config/options.ts';
import { planSettings } from '../config/plan-settings.ts';

export interface MpsSettings {
  readonly options: Options;
  /** The MPS root (--mps-root); '' when not set, which parseOptions refuses when sharing.mps is configured. */
  readonly mpsRoot: string;
  readonly sharing: Sharing;
}

/** The options and sharing for the subcommand; throws OptionError/ConfigError naming what is wrong. */
export function readMpsSettings(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): MpsSettings {
  const parsed = parseOptions(argv, env);
  return { options: parsed.options, mpsRoot: parsed.options.mpsRoot, sharing: parsed.sharing };
}

/**
 * What the plan needs of a scan: the GPUs, their MIG layout (read
 * with --mig-strategy single/mixed) and facts (compute capability).
 */
export type MpsScan = Pick<NodeScan, 'gpus' | 'mig' | 'facts'>;

/**
 * The control daemons for this node: one per resource of sharing.mps, none without it. Throws what
 * the plugin's start throws for the same config on the same node (SharingError naming the key: MPS on
 * MIG, more replicas than a GPU's MPS client limit), with the same words.
 */
export function mpsDaemonPlans(settings: Pick<MpsSettings, 'options' | 'sharing'>, scan: MpsScan): MpsDaemonPlan[] {
  if (settings.sharing.mps === undefined || settings.sharing.mps === null) return [];
  const plan = planForNode(
    scan.gpus,
    scan.mig ?? NO_MIG,
    planSettings(settings.options, settings.sharing),
    scan.facts?.gpus,
  );
  return planMpsDaemons(plan.resources, scan.gpus);
}
