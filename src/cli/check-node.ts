// `check`'s lines on the node and the plan: the options as the daemon parses them, NVML, the GPUs, the
// MIG strategy's fit, the IMEX channels, and the daemon's first snapshot's plan (core/config-fit.ts),
// so that a config `check` passes never fails the start.
import { dynamicMigCheck } from './dynamic-mig-view.ts';
import { draOf } from '../config/dra-section.ts';
import { fitAtStart } from '../core/config-fit.ts';
import { parseHealthSettings } from '../core/health-policy.ts';
import { NO_MIG } from '../core/mig.ts';
import type { MigPlan } from '../core/mig-strategies.ts';
import { describePlan } from '../core/sharing.ts';
import { parseOptions } from '../config/parse-options.ts';
import type { Options, ParsedOptions } from '../config/options.ts';
import { planSettings } from '../config/plan-settings.ts';
import { readMigCapabilities } from '../nvml/mig.ts';
import { findImexChannels } from '../system/imex.ts';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';
import { migResources } from './inspect.ts';
import type { InspectResult, NodeReport } from './inspect.ts';

/**
 * The options as the daemon would parse them; when it would refuse them, the defaults, so the checks below still run.
 */
export function parseForCheck(
  rest: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): { parsed: ParsedOptions; ok: boolean; line: CheckLine } {
  try {
    const parsed = parseOptions(rest, env);
    parseHealthSettings(env.DP_DISABLE_HEALTHCHECKS, env.DP_ENABLE_HEALTHCHECKS);
    return {
      parsed,
      ok: true,
      line: { status: 'PASS', name: 'config', detail: 'options, environment and config file are valid' },
    };
  } catch (err) {
    const line: CheckLine = {
      status: 'FAIL',
      name: 'config',
      detail: errorText(err),
      fix:
        'correct the option named above (see --help); the daemon ' +
        'refuses to start (exit 2); the checks below use the defaults',
      config: true,
    };
    return { parsed: parseOptions([], {}), ok: false, line };
  }
}

/** NVML, the GPUs, MIG and the config's fit on them; the plan when it fits (null otherwise). */
export function nodeChecks(
  node: InspectResult,
  parsed: ParsedOptions,
  configOk: boolean,
  env: Readonly<Record<string, string | undefined>>,
): { lines: CheckLine[]; plan: MigPlan | null } {
  const o = parsed.options;
  if (!node.ok) {
    return {
      plan: null,
      lines: [
        {
          status: 'FAIL',
          name: 'nvml',
          detail: node.error,
          fix:
            `install the NVIDIA driver, or point --driver-root (NVIDIA_DRIVER_ROOT) at where it is installed` +
            `${o.failOnInitError ? '' : ' (with --fail-on-init-error=false the daemon starts without devices)'}`,
        },
        { status: 'SKIP', name: 'gpus', detail: 'not checked: NVML is not available' },
        {
          status: 'SKIP',
          name: 'config fit',
          detail:
            `not checked against the GPUs: NVML is not ` +
            `available${configOk ? '' : '; the config is refused anyway (above)'}`,
        },
      ],
    };
  }
  const lines: CheckLine[] = [
    { status: 'PASS', name: 'nvml', detail: `loaded ${node.report.library}, driver ${node.report.driverVersion}` },
  ];
  const n = node.report.gpus.length;
  const sick = node.report.gpus.filter((g) => g.health !== 'Healthy').map((g) => `GPU ${g.index}`);
  if (n === 0)
    lines.push({
      status: 'FAIL',
      name: 'gpus',
      detail: 'NVML sees no GPUs',
      fix: 'check `nvidia-smi`; GPUs bound to vfio-pci or hidden by the BIOS are not visible',
    });
  else if (sick.length > 0)
    lines.push({
      status: 'FAIL',
      name: 'gpus',
      detail: `${n} found; not answering NVML: ${sick.join(', ')}`,
      fix: 'see `nvidia-smi -q` and the kernel log (XID 79: fallen off the bus)',
    });
  else lines.push({ status: 'PASS', name: 'gpus', detail: `${n} found, all answering NVML` });
  lines.push(...migChecks(node.report, parsed, env));
  lines.push(...dynamicMigCheck(node.report, o, parsed.dynamicMig === true));
  if (!configOk) {
    lines.push({
      status: 'SKIP',
      name: 'config fit',
      detail: 'not checked against the GPUs: the configuration is refused (above)',
    });
    return { lines, plan: null };
  }
  const fit = configFit(node.report, parsed, env);
  lines.push(fit.line);
  return { lines, plan: fit.plan };
}

/** With --imex-channel-ids: whether the channels are there (their device nodes), and the ones that are. */
export async function imexCheck(o: Options): Promise<{ lines: CheckLine[]; channels: readonly number[] }> {
  if (o.imexChannelIds.length === 0) return { lines: [], channels: [] };
  const imex = await findImexChannels(o.imexChannelIds, o.imexRequired, o.devRoot);
  if (imex.missing.length === 0) {
    return {
      channels: imex.channels,
      lines: [
        {
          status: 'PASS',
          name: 'imex',
          detail: `channel ${imex.channels.join(',')} present under ${o.devRoot}; passed to every container`,
        },
      ],
    };
  }
  return {
    channels: imex.channels,
    lines: [
      {
        status: imex.fatal !== null ? 'FAIL' : 'WARN',
        name: 'imex',
        detail:
          `${imex.missing.join('; ')}: ` +
          (imex.fatal !== null
            ? 'the plugin will not start (--imex-required)'
            : 'skipped, containers get no IMEX channel'),
        fix:
          'start the IMEX daemon (nvidia-imex) so it creates the ' +
          'channel, check --dev-root, or drop --imex-channel-ids',
      },
    ],
  };
}

/** The daemon's first snapshot's plan (core/config-fit.ts) on the node as the scanner would read it. */
function configFit(
  r: NodeReport,
  parsed: ParsedOptions,
  env: Readonly<Record<string, string | undefined>>,
): { line: CheckLine; plan: MigPlan | null } {
  const o = parsed.options;
  // As the scanner: MIG is read only with a MIG strategy, and capability nodes only when there are MIG devices.
  const mig = o.migStrategy === 'none' || r.mig === null ? NO_MIG : r.mig;
  const caps = readMigCapabilities(r.gpus, mig, env);
  const settings = planSettings(o, parsed.sharing, draOf(parsed));
  const fit = fitAtStart(r.gpus, mig, settings, caps, r.facts?.gpus);
  if (fit.ok)
    return {
      line: {
        status: 'PASS',
        name: 'config fit',
        detail: `the daemon would advertise ${describePlan(fit.plan.resources) || 'nothing'}`,
      },
      plan: fit.plan,
    };
  const where = o.configFile === null ? '' : ` in ${o.configFile}`;
  const fix =
    fit.key === null
      ? 'the daemon cannot advertise these GPUs as they are; see the detail'
      : fit.key.startsWith('--')
        ? `change ${fit.key}, or the GPUs (see the detail)`
        : `change ${fit.key}${where} to fit this node's GPUs`;
  // The time-slicing keys and the MIG strategy are the configuration's to change (exit 2); device IDs the
  // kubelet refuses and missing capability nodes are the node's (exit 1).
  const config = fit.key !== null && fit.key !== '--pass-device-specs';
  return {
    line: { status: 'FAIL', name: 'config fit', detail: `the daemon refuses to start: ${fit.problem}`, fix, config },
    plan: null,
  };
}

/** Whether the node fits --mig-strategy, and (with device specs) whether mig-minors can be read. */
function migChecks(
  r: NodeReport,
  parsed: ParsedOptions,
  env: Readonly<Record<string, string | undefined>>,
): CheckLine[] {
  const o = parsed.options;
  if (o.migStrategy === 'none') return [];
  const flag = `--mig-strategy=${o.migStrategy}`;
  if (r.mig === null) {
    return [
      {
        status: 'WARN',
        name: 'mig',
        detail: `${flag}, but this driver has no MIG functions: every GPU is advertised whole`,
        fix: 'upgrade the NVIDIA driver (R470 or later), or use --mig-strategy=none',
      },
    ];
  }
  const view = migResources(r, o.migStrategy);
  // A node that does not fit the strategy is the config fit's failure (below), with the daemon's words.
  if (view.problem !== null) return [];
  const enabled = r.mig.modes.filter((m) => m?.current === true).length;
  const resources = new Map<string, number>();
  for (const d of view.devices)
    if (d.resource !== null) resources.set(d.resource, (resources.get(d.resource) ?? 0) + 1);
  const summary =
    enabled === 0
      ? `${flag}: no GPU is in MIG mode, so every GPU is advertised whole`
      : `${flag}: ${enabled} GPU${enabled === 1 ? '' : 's'} in MIG mode; ` +
        `${[...resources].map(([n, c]) => `${n}=${c}`).join(', ') || 'no MIG device advertised'}` +
        `${view.notes.length > 0 ? `; ${view.notes.join('; ')}` : ''}`;
  const out: CheckLine[] = [{ status: 'PASS', name: 'mig', detail: summary }];
  if (o.passDeviceSpecs && view.devices.some((d) => d.resource !== null)) {
    const caps = readMigCapabilities(r.gpus, r.mig, env);
    if ('problem' in caps)
      out.push({
        status: 'FAIL',
        name: 'mig-minors',
        detail: caps.problem,
        fix: 'load the NVIDIA driver with MIG support (nvidia-caps); or set PROC_ROOT if /proc is elsewhere',
      });
    else
      out.push({
        status: 'PASS',
        name: 'mig-minors',
        detail: `capability nodes found for all ${caps.size} MIG devices`,
      });
  }
  return out;
}
