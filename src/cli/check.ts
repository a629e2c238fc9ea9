// `gpu-device-plugin check`: the daemon's own validation, run up to the point of serving, for
// operators. The same option parse, the same plan against the node (core/config-fit.ts: time-slicing
// device lists, overlaps, MIG strategy fit, capability nodes) that the daemon's first snapshot makes,
// so a config `check` passes never fails the start and one the daemon refuses fails here naming the
// key. It reads the environment files the unit reads, judges writability as the unit's sandbox lets
// the service write, and looks for what the device-list strategy needs (CDI specs, device nodes).
// One line per check: PASS, WARN, FAIL or SKIP (could not be checked), with the fix; then the
// effective options and where each came from. Exit 0 when nothing FAILs, 2 when the configuration is
// at fault (an option, the environment, the config file, or the config against this node), else 1.
import { dirname } from 'node:path';
import type { Logger } from '../system/log.ts';
import { draChecks } from './check-dra.ts';
import { otherModeLine } from './check-other-mode.ts';
import { kubeletCheck, socketDirectoryNeighbours } from './check-kubelet.ts';
import { kubeletVersionCheck } from './check-kubelet-version.ts';
import { mpsChecks } from './check-mps.ts';
import { imexCheck, nodeChecks, parseForCheck } from './check-node.ts';
import type { CheckLine, CheckReport } from './check-report.ts';
import { strategyChecks } from './check-runtime.ts';
import { writabilityChecks, writableForService } from './check-writable.ts';
import { unitSandboxChecks } from './check-units.ts';
import { inspectNode } from './inspect.ts';
import { signalsCheck } from './check-signals.ts';
import { readSignalRound, signalPolicyFor } from './signals-view.ts';
import { environmentChecks, optionOrigins, serviceEnvironment, splitCheckArgs } from './service-environment.ts';

export interface CheckDeps {
  /** Whether this process runs as root (default: its effective uid). */
  isRoot?: boolean;
  /** DRA mode: whether the API server accepts a TCP connection (default: net.connect, 2 s); the problem or null. */
  tcpProbe?: (host: string, port: number) => Promise<string | null>;
}

export async function runChecks(
  argv: readonly string[],
  processEnv: Readonly<Record<string, string | undefined>>,
  log: Logger,
  deps: CheckDeps = {},
): Promise<CheckReport> {
  const isRoot = deps.isRoot ?? process.geteuid?.() === 0;
  const { envFiles: givenEnvFiles, rest } = splitCheckArgs(argv);
  const { unit, envPaths, fromFiles, env, shellSet } = await serviceEnvironment(givenEnvFiles, processEnv);
  const lines: CheckLine[] = environmentChecks(fromFiles, envPaths, shellSet);

  const config = parseForCheck(rest, env);
  lines.push(config.line);
  const { parsed } = config;
  const o = parsed.options;
  const origins = optionOrigins(parsed, fromFiles, processEnv);

  if (!isRoot) {
    lines.push({
      status: 'WARN',
      name: 'privileges',
      detail:
        `running as uid ${process.geteuid?.() ?? '?'}, not root as ` +
        `the service does: what only root may see or do is SKIP below`,
      fix: 'run `sudo gpu-device-plugin check`',
    });
  }

  const node = inspectNode(o.driverRoot, env.SYSFS_ROOT || '/sys', log);
  const gpus = nodeChecks(node, parsed, config.ok, env);
  lines.push(...gpus.lines);
  lines.push(
    signalsCheck(
      node.ok
        ? await readSignalRound(o.driverRoot, node.report.gpus, signalPolicyFor(env), log)
        : { skipped: 'NVML is not available' },
    ),
  );
  const imex = await imexCheck(o);
  lines.push(...imex.lines);
  lines.push(...(await strategyChecks(parsed, node.ok ? node.report : null, gpus.plan, imex.channels, env)));
  lines.push(
    ...(await mpsChecks({
      root: o.mpsRoot || null,
      driverRoot: o.driverRoot,
      resources: gpus.plan?.resources ?? null,
      report: node.ok ? node.report : null,
      path: env.PATH,
    })),
  );
  lines.push(...(await writabilityChecks(o, unit, env, isRoot)));
  lines.push(...(await unitSandboxChecks(processEnv.SYSTEMD_UNIT_ROOT || '/')));
  if (o.kubeletApi === 'dra') {
    lines.push(
      ...(await draChecks(o, unit, isRoot, env, node.ok ? node.report : null, {
        writable: writableForService,
        ...(deps.tcpProbe === undefined ? {} : { tcpProbe: deps.tcpProbe }),
      })),
    );
  } else {
    lines.push(...(await socketDirectoryNeighbours(dirname(o.kubeletSocket), o.kubeletSocket)));
    lines.push(await kubeletCheck(o.kubeletSocket));
  }
  lines.push(await kubeletVersionCheck(o.kubeletApi, env.PATH));
  const envFile = fromFiles.files.find((f) => f.parsed !== null)?.path ?? envPaths[0]?.path ?? 'the environment file';
  lines.push(await otherModeLine(o, unit, envFile));
  return { lines, parsed, origins, envFiles: fromFiles.files, unit: { source: unit.source, files: unit.files } };
}
