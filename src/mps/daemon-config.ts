// What `mps-control-daemon` reads: the daemon's own options (parseOptions: command line, environment
// file, config file) plus the MPS root and `sharing.mps`, turned into the control daemons' plan
// through the plugin's own planning (core/sharing.ts planResources → core/mps.ts planMpsDaemons), so
// the two units cannot disagree on which GPUs a resource has.
//
// PROVISIONAL (issue 20, until the config-parsing branch lands): parseOptions still refuses
// `sharing.mps`, `--mps-root`, `MPS_ROOT` and `flags.mpsRoot`. readMpsSettings therefore takes the
// MPS root itself and hands parseOptions the config file with `sharing.mps` read as the
// time-slicing section of the same shape (so it is validated by the same code). Once
// parseOptions knows MPS, readMpsSettings becomes `parseOptions(argv, env)` with
// `options.mpsRoot` and `sharing.mps`, and mpsDaemonPlans plans with `sharing.mps`; the subcommand
// (daemon-main.ts) and the supervisor do not change.
import { DEFAULT_MPS_ROOT, planMpsDaemons } from '../core/mps.ts';
import type { MpsDaemonPlan } from '../core/mps.ts';
import type { Gpu } from '../core/devices.ts';
import { planResources } from '../core/sharing.ts';
import type { TimeSlicing } from '../core/sharing.ts';
import { loadYaml, OptionError } from '../cli/config.ts';
import { parseOptions } from '../cli/options.ts';
import type { Options } from '../cli/options.ts';
import { readFileSync } from 'node:fs';

export interface MpsSettings {
  readonly options: Options;
  readonly mpsRoot: string;
  /** sharing.mps, or null when the config file has none. */
  readonly mps: TimeSlicing | null;
}

function takeFlag(argv: readonly string[], name: string): { value: string | undefined; rest: string[] } {
  const rest: string[] = [];
  let value: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === `--${name}`) {
      value = argv[i + 1];
      if (value === undefined) throw new OptionError(`--${name} needs a value (a directory, e.g. ${DEFAULT_MPS_ROOT})`);
      i++;
    } else if (a.startsWith(`--${name}=`)) value = a.slice(name.length + 3);
    else rest.push(a);
  }
  return { value, rest };
}

/** The options, MPS root and sharing.mps for the subcommand (PROVISIONAL: see the top of this file). */
export function readMpsSettings(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): MpsSettings {
  const { value: flagRoot, rest } = takeFlag(argv, 'mps-root');
  const { MPS_ROOT: envRoot, ...otherEnv } = env;
  let fileRoot: string | undefined;
  let mpsSection = false;
  const readFile = (path: string): string => {
    const doc = loadYaml().parse(readFileSync(path, 'utf8')) as unknown;
    if (typeof doc !== 'object' || doc === null) return JSON.stringify(doc);
    const d = doc as { flags?: { mpsRoot?: unknown }; sharing?: { mps?: unknown; timeSlicing?: unknown } };
    if (d.flags !== undefined && d.flags !== null && typeof d.flags === 'object' && 'mpsRoot' in d.flags) {
      if (typeof d.flags.mpsRoot === 'string') fileRoot = d.flags.mpsRoot;
      delete d.flags.mpsRoot;
    }
    if (d.sharing !== undefined && d.sharing !== null && typeof d.sharing === 'object' && d.sharing.mps !== undefined && d.sharing.mps !== null) {
      if (d.sharing.timeSlicing !== undefined && d.sharing.timeSlicing !== null) {
        throw new OptionError(`config file ${path}: sharing.mps and sharing.timeSlicing exclude each other; keep one`);
      }
      d.sharing = { timeSlicing: d.sharing.mps };
      mpsSection = true;
    }
    return JSON.stringify(doc);
  };
  const parsed = parseOptions(rest, otherEnv, { readFile });
  const root = flagRoot ?? (envRoot !== undefined && envRoot !== '' ? envRoot : undefined) ?? fileRoot ?? DEFAULT_MPS_ROOT;
  if (!root.startsWith('/')) throw new OptionError(`--mps-root (MPS_ROOT) ${JSON.stringify(root)} is not an absolute path; expected e.g. ${DEFAULT_MPS_ROOT}`);
  return { options: parsed.options, mpsRoot: root, mps: mpsSection ? parsed.sharing.timeSlicing : null };
}

/** The control daemons for these GPUs: one per resource of sharing.mps, none without it. */
export function mpsDaemonPlans(settings: Pick<MpsSettings, 'options' | 'mps'>, gpus: readonly Gpu[]): MpsDaemonPlan[] {
  if (settings.mps === null) return [];
  const planned = planResources(gpus, settings.options.deviceIdStrategy, { timeSlicing: settings.mps })
    .filter((r) => r.shared)
    .map((r) => ({ ...r, devices: r.devices.filter((d) => d.replica !== undefined), mps: true as const }));
  return planMpsDaemons(planned, gpus);
}
