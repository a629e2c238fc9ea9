// `check`'s MPS lines, for a configuration with MPS resources: the MPS root
// exists and every directory on the way to each pipe is world-readable and searchable (0755: a
// non-root pod must reach the pipe), nvidia-cuda-mps-control is found (under the driver root, then
// PATH, as the plugin and the control daemon unit look for it), each resource's control daemon
// answers the plugin's health question, and each GPU an MPS daemon serves is in EXCLUSIVE_PROCESS
// compute mode (read through the NVML session `check` opens: NodeReport.computeModes). Each
// failure says what to do. Paths and the GPUs of each daemon come from core/mps.ts, as the daemons'.
import { stat } from 'node:fs/promises';
import { dirname } from 'node:path';
import { mpsPaths, planMpsDaemons } from '../core/mps.ts';
import type { PlannedResource } from '../core/sharing.ts';
import { findMpsControl, MpsControlError, mpsCommand } from '../mps/control-client.ts';
import { ASK_TIMEOUT_MS, HEALTH_COMMAND } from '../mps/health-watch.ts';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';
import type { NodeReport } from './inspect.ts';

/** The unit that runs the control daemons (the package's second unit). */
export const MPS_UNIT = 'gpu-device-plugin-mps';

/** The directories from / down to `dir`, outermost first. */
function pathDirs(dir: string): string[] {
  const out: string[] = [];
  for (let d = dir; ; d = dirname(d)) {
    out.unshift(d);
    if (dirname(d) === d) break;
  }
  return out;
}

/**
 * The first directory on the way to `dir` that others cannot read and search (mode without o+rx), or what is missing.
 */
async function reachable(dir: string): Promise<{ ok: true } | { ok: false; dir: string; why: string; fix: string }> {
  for (const d of pathDirs(dir)) {
    let mode: number;
    try {
      const st = await stat(d);
      if (!st.isDirectory())
        return {
          ok: false,
          dir: d,
          why: 'is not a directory',
          fix: `remove ${d}, then restart ${MPS_UNIT}, which creates the layout`,
        };
      mode = st.mode & 0o7777;
    } catch (err) {
      const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
      return {
        ok: false,
        dir: d,
        why: missing ? 'does not exist' : errorText(err),
        fix: missing ? `start ${MPS_UNIT} (systemctl start ${MPS_UNIT}), which creates it` : `check ${d}`,
      };
    }
    if ((mode & 0o005) !== 0o005) {
      return {
        ok: false,
        dir: d,
        why:
          `has mode ${mode.toString(8).padStart(4, '0')}: a pod ` +
          `that does not run as root cannot reach the pipe through it`,
        fix: `chmod 755 ${d}`,
      };
    }
  }
  return { ok: true };
}

export interface MpsCheckInput {
  /** The MPS root in force (--mps-root); null: not set. */
  readonly root: string | null;
  readonly driverRoot: string;
  /** The resources the daemon would advertise (null: the config does not fit, or no NVML). */
  readonly resources: readonly PlannedResource[] | null;
  /** The node as `check` read it (null: NVML is not available). */
  readonly report: NodeReport | null;
  /** PATH, for the control program. */
  readonly path?: string | undefined;
  /** Base environment of the control client (default process.env). */
  readonly env?: NodeJS.ProcessEnv;
}

/** The MPS root, then each resource's pipe directory, reachable by anyone. */
async function rootLine(root: string, mps: readonly PlannedResource[]): Promise<CheckLine> {
  const rootSeen = await reachable(root);
  if (!rootSeen.ok)
    return { status: 'FAIL', name: 'mps root', detail: `${rootSeen.dir} ${rootSeen.why}`, fix: rootSeen.fix };
  const problems: string[] = [];
  const fixes: string[] = [];
  for (const r of mps) {
    const seen = await reachable(mpsPaths(root, r.name).pipeDir);
    if (!seen.ok) {
      problems.push(`${seen.dir} ${seen.why}`);
      fixes.push(seen.fix);
    }
  }
  return problems.length === 0
    ? {
        status: 'PASS',
        name: 'mps root',
        detail:
          `${root} and the pipe directories of ${mps.map((r) => r.name).join(', ')} ` +
          `are reachable by every user (0755 all the way)`,
      }
    : { status: 'FAIL', name: 'mps root', detail: problems.join('; '), fix: [...new Set(fixes)].join('; ') };
}

/** nvidia-cuda-mps-control found, and each resource's control daemon answering the health question. */
async function controlLines(input: MpsCheckInput, root: string, mps: readonly PlannedResource[]): Promise<CheckLine[]> {
  const found = await findMpsControl(input.driverRoot, input.path);
  if ('looked' in found) {
    return [
      {
        status: 'FAIL',
        name: 'mps control',
        detail: `nvidia-cuda-mps-control not found (looked at ${found.looked.join(', ')})`,
        fix:
          "install the NVIDIA driver's utilities (nvidia-cuda-mps-control " +
          "ships with them), or point --driver-root at the driver's root",
      },
      { status: 'SKIP', name: 'mps daemons', detail: 'not asked: nvidia-cuda-mps-control is not found' },
    ];
  }
  const silent: string[] = [];
  for (const r of mps) {
    const p = mpsPaths(root, r.name);
    try {
      await mpsCommand(found.path, { pipeDir: p.pipeDir, logDir: p.logDir }, HEALTH_COMMAND, {
        timeoutMs: ASK_TIMEOUT_MS,
        ...(input.env === undefined ? {} : { env: input.env }),
      });
    } catch (err) {
      silent.push(`${r.name} (${p.pipeDir}): ${err instanceof MpsControlError ? err.reason : errorText(err)}`);
    }
  }
  return [
    { status: 'PASS', name: 'mps control', detail: `found ${found.path}` },
    silent.length === 0
      ? {
          status: 'PASS',
          name: 'mps daemons',
          detail: `the control daemon of ${mps.map((r) => r.name).join(', ')} answers ${HEALTH_COMMAND}`,
        }
      : {
          status: 'FAIL',
          name: 'mps daemons',
          detail: `not answering: ${silent.join('; ')}; their replicas are advertised Unhealthy`,
          fix:
            `start the control daemons: systemctl start ${MPS_UNIT}; see \`journalctl ` +
            `-u ${MPS_UNIT}\` and control.log under ${root}/<resource>/log`,
        },
  ];
}

/** Each GPU an MPS daemon serves in EXCLUSIVE_PROCESS compute mode. */
function computeModeLine(report: NodeReport | null, mps: readonly PlannedResource[]): CheckLine {
  if (report === null || report.computeModes === undefined)
    return { status: 'SKIP', name: 'compute mode', detail: 'not checked: NVML is not available' };
  const modes = report.computeModes;
  const wrong: string[] = [];
  const daemons = planMpsDaemons(mps, report.gpus);
  for (const d of daemons) {
    for (const g of d.gpus) {
      const pos = report.gpus.findIndex((x) => x.uuid === g.uuid);
      const mode = modes[pos];
      if (mode === 'exclusive-process') continue;
      wrong.push(
        `GPU ${g.index} (${d.resource}) is ` +
          (mode === undefined
            ? 'unknown'
            : typeof mode === 'string'
              ? mode.toUpperCase().replace('-', '_')
              : `unreadable: ${mode.error}`),
      );
    }
  }
  const count = daemons.reduce((n, d) => n + d.gpus.length, 0);
  return wrong.length === 0
    ? {
        status: 'PASS',
        name: 'compute mode',
        detail: `all ${count} GPU${count === 1 ? '' : 's'} MPS serves are in EXCLUSIVE_PROCESS mode`,
      }
    : {
        status: 'FAIL',
        name: 'compute mode',
        detail: `${wrong.join('; ')}; MPS needs EXCLUSIVE_PROCESS`,
        fix:
          `restart ${MPS_UNIT}, which sets EXCLUSIVE_PROCESS before it starts the daemons ` +
          `(systemctl restart ${MPS_UNIT}; this ends the MPS clients' CUDA contexts)`,
      };
}

/** The MPS lines; none when the configuration has no MPS resource. */
export async function mpsChecks(input: MpsCheckInput): Promise<CheckLine[]> {
  const mps = (input.resources ?? []).filter((r) => r.mps === true);
  if (mps.length === 0) return [];
  const root = input.root;
  if (root === null || root === '') {
    return [
      {
        status: 'FAIL',
        name: 'mps root',
        detail: 'the config shares GPUs through MPS but no MPS root is set',
        fix: 'set --mps-root (MPS_ROOT), e.g. /run/nvidia/mps',
        config: true,
      },
    ];
  }
  return [await rootLine(root, mps), ...(await controlLines(input, root, mps)), computeModeLine(input.report, mps)];
}
