// `gpu-device-plugin check`: the daemon's own validation, run up to the point of serving, for
// operators. The same option parse, the same plan against the node (core/config-fit.ts: time-slicing
// device lists, overlaps, MIG strategy fit, capability nodes) that the daemon's first snapshot makes,
// so a config `check` passes never fails the start and one the daemon refuses fails here naming the
// key. It reads the environment files the unit reads, judges writability as the unit's sandbox lets
// the service write, and looks for what the device-list strategy needs (CDI specs, device nodes).
// One line per check: PASS, WARN, FAIL or SKIP (could not be checked), with the fix; then the
// effective options and where each came from. Exit 0 when nothing FAILs, 2 when the configuration is
// at fault (an option, the environment, the config file, or the config against this node), else 1.
import * as grpc from '@grpc/grpc-js';
import { access, constants as fsc, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { CONTROL_DEVICE_NODES, hostPath, CDI_KIND } from '../core/allocate.ts';
import { CDI_IMEX_KIND } from '../core/imex.ts';
import { fitAtStart } from '../core/config-fit.ts';
import { parseHealthSettings } from '../core/health.ts';
import { NO_MIG } from '../core/mig.ts';
import { describePlan } from '../core/sharing.ts';
import type { MigPlan } from '../core/mig.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { readMigCapabilities } from '../nvml/mig.ts';
import { findImexChannels } from '../system/imex.ts';
import { readEnvironmentFiles } from '../config/env-file.ts';
import type { EnvFileRead, UnitEnvironment } from '../config/env-file.ts';
import { otherSockets, readCdiSpecs, readInstalledUnit } from './host-view.ts';
import type { UnitRead } from './host-view.ts';
import { inspectNode, migResources } from './inspect.ts';
import type { InspectResult, NodeReport } from './inspect.ts';
import { OPTION_SPECS } from '../config/option-table.ts';
import { parseOptions } from '../config/parse-options.ts';
import { showOption } from '../config/describe-options.ts';
import type { OptionKey, Options, ParsedOptions } from '../config/options.ts';
import { planSettings } from '../config/plan-settings.ts';
import { writableInSandbox } from './sandbox.ts';
import { mpsChecks } from './check-mps.ts';
import { defaultStateFile } from '../observe/state-file.ts';
import { draChecks, otherModeLine } from './check-dra.ts';

/** INFO: not a check, a note (what the other kubelet API mode would need). */
export type CheckStatus = 'PASS' | 'WARN' | 'FAIL' | 'SKIP' | 'INFO';

export interface CheckLine {
  status: CheckStatus;
  name: string;
  detail: string;
  fix?: string;
  /** A failure of the configuration (exit 2), not of the node. */
  config?: boolean;
}

export interface CheckReport {
  lines: CheckLine[];
  parsed: ParsedOptions;
  /** Where each option's value came from, environment files named. */
  origins: Record<OptionKey, string>;
  envFiles: readonly EnvFileRead[];
  unit: { source: string; files: readonly string[] };
}

/** `check`'s own arguments (--json, --env-file F …) taken out of argv; the rest are the daemon's options. */
export function splitCheckArgs(argv: readonly string[]): { json: boolean; envFiles: string[]; rest: string[] } {
  const rest: string[] = [];
  const envFiles: string[] = [];
  let json = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--json') json = true;
    // --environment-file is the same option: Node's own --env-file handling, which a single executable
    // still runs, stops the program (exit 9) before it starts when the file is missing.
    else if (a === '--env-file' || a === '--environment-file') {
      const v = argv[i + 1];
      if (v === undefined || v.startsWith('--'))
        throw new Error(`${a} needs a file name, e.g. ${a} /etc/default/gpu-device-plugin`);
      envFiles.push(v);
      i++;
    } else if (a.startsWith('--env-file=') || a.startsWith('--environment-file='))
      envFiles.push(a.slice(a.indexOf('=') + 1));
    else rest.push(a);
  }
  return { json, envFiles, rest };
}

async function kubeletAnswers(socket: string, timeoutMs: number): Promise<string | null> {
  const client = new grpc.Client(`unix://${socket}`, grpc.credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
  });
  try {
    await new Promise<void>((resolve, reject) =>
      client.waitForReady(Date.now() + timeoutMs, (err) => (err ? reject(err) : resolve())),
    );
    return null;
  } catch (err) {
    return errorText(err);
  } finally {
    client.close();
  }
}

/** A directory the service writes into, judged as the unit's sandbox lets it, then on disk. */
export async function writableForService(
  name: string,
  dir: string,
  unit: UnitRead,
  isRoot: boolean,
  fix: string,
): Promise<CheckLine> {
  const v = writableInSandbox(unit.sandbox, dir);
  const dropin = `add ReadWritePaths=${dir} with \`systemctl edit gpu-device-plugin\``;
  if (!v.writable)
    return { status: 'FAIL', name, detail: `${dir}: ${v.why} (unit: ${unit.source})`, fix: `${dropin}; ${fix}` };
  if (v.private === true)
    return {
      status: 'FAIL',
      name,
      detail: `${dir}: ${v.how} (unit: ${unit.source})`,
      fix: `use a directory outside /tmp and /var/tmp, and ${dropin}`,
    };
  try {
    const st = await stat(dir);
    if (!st.isDirectory()) throw new Error('is not a directory');
  } catch (err) {
    return { status: 'FAIL', name, detail: `${dir}: ${errorText(err)}`, fix };
  }
  if (!isRoot)
    return {
      status: 'SKIP',
      name,
      detail: `${dir} exists and the unit's sandbox allows writing (${v.how}); whether root may write there was not checked: not running as root`,
    };
  try {
    await access(dir, fsc.W_OK);
  } catch (err) {
    return { status: 'FAIL', name, detail: `${dir}: ${errorText(err)}`, fix };
  }
  return { status: 'PASS', name, detail: `${dir} is writable for the service (${v.how})` };
}

/** The environment the service runs with, as `check` and `info` use it. */
export interface ServiceEnvironment {
  readonly unit: UnitRead;
  readonly envPaths: readonly { path: string; explicit: boolean }[];
  readonly fromFiles: UnitEnvironment;
  /** The unit's Environment=, then its environment files in order, then this process's environment. */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** Option variables set in this process's environment (which the service does not have). */
  readonly shellSet: readonly string[];
}

/**
 * The unit (installed under $SYSTEMD_UNIT_ROOT, default /, else the one we ship) and the environment
 * files it reads — or the files given with --env-file — merged as the service sees them; this process's
 * own environment is applied last, so that a setting tried in the shell is seen (and reported).
 */
export async function serviceEnvironment(
  givenEnvFiles: readonly string[],
  processEnv: Readonly<Record<string, string | undefined>>,
): Promise<ServiceEnvironment> {
  const unitRoot = processEnv.SYSTEMD_UNIT_ROOT || '/';
  const unit = await readInstalledUnit(unitRoot);
  const envPaths =
    givenEnvFiles.length > 0
      ? givenEnvFiles.map((path) => ({ path, explicit: true }))
      : unit.sandbox.environmentFiles.map((f) => ({ path: join(unitRoot, f.path), explicit: !f.optional }));
  const fromFiles = await readEnvironmentFiles(envPaths);
  const env: Record<string, string | undefined> = {};
  for (const e of unit.sandbox.environment) env[e.key] = e.value;
  Object.assign(env, fromFiles.env);
  // The service's $RUNTIME_DIRECTORY (where it publishes its state for `info`) is the unit's RuntimeDirectory=.
  const runtime = unit.sandbox.serviceDirectories.find((d) => d.startsWith('/run/'));
  if (runtime !== undefined) env.RUNTIME_DIRECTORY = runtime;
  const shellSet: string[] = [];
  for (const [k, v] of Object.entries(processEnv)) {
    if (v === undefined) continue;
    env[k] = v;
    if (OPTION_SPECS.some((s) => s.env === k) && v !== '') shellSet.push(k);
  }
  return { unit, envPaths, fromFiles, env, shellSet };
}

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
      detail: `running as uid ${process.geteuid?.() ?? '?'}, not root as the service does: what only root may see or do is SKIP below`,
      fix: 'run `sudo gpu-device-plugin check`',
    });
  }

  const node = inspectNode(o.driverRoot, env.SYSFS_ROOT || '/sys', log);
  const gpus = nodeChecks(node, parsed, config.ok, env);
  lines.push(...gpus.lines);
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
  const envFile = fromFiles.files.find((f) => f.parsed !== null)?.path ?? envPaths[0]?.path ?? 'the environment file';
  lines.push(await otherModeLine(o, unit, envFile));
  return { lines, parsed, origins, envFiles: fromFiles.files, unit: { source: unit.source, files: unit.files } };
}

/** Whether the environment files could be read and every line in them taken, and what only this shell sets. */
function environmentChecks(
  fromFiles: UnitEnvironment,
  envPaths: ServiceEnvironment['envPaths'],
  shellSet: readonly string[],
): CheckLine[] {
  const lines: CheckLine[] = [];
  const read = fromFiles.files.filter((f) => f.parsed !== null);
  const envProblems = fromFiles.files.filter((f) => f.error !== null).map((f) => f.error as string);
  const ignoredLines = read.flatMap((f) => (f.parsed?.ignored ?? []).map((x) => `${f.path}:${x.line}: ${x.why}`));
  if (envProblems.length > 0) {
    lines.push({
      status: 'FAIL',
      name: 'environment files',
      detail: envProblems.join('; '),
      fix: 'name an existing file with --env-file, or create it',
      config: true,
    });
  } else if (ignoredLines.length > 0) {
    lines.push({
      status: 'WARN',
      name: 'environment files',
      detail: ignoredLines.join('; '),
      fix: 'write each setting as KEY=VALUE (see /etc/default/gpu-device-plugin)',
    });
  } else {
    const names = read.map((f) => f.path);
    lines.push({
      status: 'PASS',
      name: 'environment files',
      detail:
        names.length === 0
          ? `none of the unit's files exist (${envPaths.map((p) => p.path).join(', ') || 'none named'}); the service runs with the defaults`
          : `read ${names.join(', ')}`,
    });
  }
  if (shellSet.length > 0) {
    lines.push({
      status: 'WARN',
      name: 'shell environment',
      detail: `${shellSet.join(', ')} set in this shell: used by this check, but the service does not see them`,
      fix: 'put them in the environment file the unit reads (see "Effective options")',
    });
  }
  return lines;
}

/** The options as the daemon would parse them; when it would refuse them, the defaults, so the checks below still run. */
function parseForCheck(
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
      fix: 'correct the option named above (see --help); the daemon refuses to start (exit 2); the checks below use the defaults',
      config: true,
    };
    return { parsed: parseOptions([], {}), ok: false, line };
  }
}

/** Where each option came from, an environment variable told apart by this shell, an environment file or the unit. */
function optionOrigins(
  parsed: ParsedOptions,
  fromFiles: UnitEnvironment,
  processEnv: Readonly<Record<string, string | undefined>>,
): Record<OptionKey, string> {
  const origins = {} as Record<OptionKey, string>;
  for (const s of OPTION_SPECS) {
    const origin: string = parsed.origins[s.key];
    const file = fromFiles.source[s.env];
    origins[s.key] =
      origin === 'environment'
        ? processEnv[s.env] !== undefined && processEnv[s.env] !== ''
          ? 'environment of this shell; the service does not see it'
          : file !== undefined
            ? `environment file ${file}`
            : 'unit Environment='
        : origin;
  }
  return origins;
}

/** NVML, the GPUs, MIG and the config's fit on them; the plan when it fits (null otherwise). */
function nodeChecks(
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
          fix: `install the NVIDIA driver, or point --driver-root (NVIDIA_DRIVER_ROOT) at where it is installed${o.failOnInitError ? '' : ' (with --fail-on-init-error=false the daemon starts without devices)'}`,
        },
        { status: 'SKIP', name: 'gpus', detail: 'not checked: NVML is not available' },
        {
          status: 'SKIP',
          name: 'config fit',
          detail: `not checked against the GPUs: NVML is not available${configOk ? '' : '; the config is refused anyway (above)'}`,
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
async function imexCheck(o: Options): Promise<{ lines: CheckLine[]; channels: readonly number[] }> {
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
        detail: `${imex.missing.join('; ')}: ${imex.fatal !== null ? 'the plugin will not start (--imex-required)' : 'skipped, containers get no IMEX channel'}`,
        fix: 'start the IMEX daemon (nvidia-imex) so it creates the channel, check --dev-root, or drop --imex-channel-ids',
      },
    ],
  };
}

/** The directories the service writes into: the kubelet's socket directory, the labels and metrics files' (when configured), the state file's. */
async function writabilityChecks(
  o: Options,
  unit: UnitRead,
  env: Readonly<Record<string, string | undefined>>,
  isRoot: boolean,
): Promise<CheckLine[]> {
  const lines: CheckLine[] = [];
  // The device-plugin API's socket directory; DRA mode's directories are draChecks'.
  if (o.kubeletApi !== 'dra')
    lines.push(
      await writableForService(
        'socket directory',
        dirname(o.kubeletSocket),
        unit,
        isRoot,
        'is the kubelet installed and its device plugins enabled? or set --kubelet-socket',
      ),
    );
  // The labels and metrics files, when configured: their directory must exist and be writable.
  for (const [name, file, reader] of [
    ['labels file', o.nfdFeaturesFile, 'Node Feature Discovery'],
    ['metrics file', o.metricsFile, 'node_exporter'],
  ] as const) {
    if (file === null) continue;
    lines.push(
      await writableForService(name, dirname(file), unit, isRoot, `is ${reader} installed? create the directory`),
    );
  }
  const stateFile = defaultStateFile(env);
  const stateDir = dirname(stateFile);
  // The runtime directory exists only while the service runs: systemd creates it at start.
  const madeAtStart =
    unit.sandbox.serviceDirectories.includes(stateDir) &&
    !(await stat(stateDir).then(
      () => true,
      () => false,
    ));
  lines.push(
    madeAtStart
      ? {
          status: 'SKIP',
          name: 'state file',
          detail: `${stateDir} is created by systemd when the service starts (RuntimeDirectory=); not there now`,
        }
      : await writableForService(
          'state file',
          stateDir,
          unit,
          isRoot,
          `the service publishes its state to ${stateFile} for \`info\`; under the unit RuntimeDirectory= creates its directory at start`,
        ),
  );
  return lines;
}

/** Whether the kubelet's socket exists, is a socket, and answers gRPC within 2 s. */
async function kubeletCheck(socket: string): Promise<CheckLine> {
  try {
    const st = await stat(socket);
    if (!st.isSocket()) throw new Error('exists but is not a socket');
    const problem = await kubeletAnswers(socket, 2000);
    if (problem !== null) throw new Error(`does not answer: ${problem}`);
    return { status: 'PASS', name: 'kubelet', detail: `${socket} answers` };
  } catch (err) {
    const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
    return {
      status: 'FAIL',
      name: 'kubelet',
      detail: `${socket} ${missing ? 'does not exist' : errorText(err)}`,
      fix: missing
        ? 'is the kubelet running? (systemctl status kubelet); or set --kubelet-socket'
        : 'restart the kubelet; check its log',
    };
  }
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
  const fit = fitAtStart(r.gpus, mig, planSettings(o, parsed.sharing), caps, r.facts?.gpus);
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
      : `${flag}: ${enabled} GPU${enabled === 1 ? '' : 's'} in MIG mode; ${[...resources].map(([n, c]) => `${n}=${c}`).join(', ') || 'no MIG device advertised'}${view.notes.length > 0 ? `; ${view.notes.join('; ')}` : ''}`;
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

/** What the device-list strategy and --pass-device-specs need on the host: CDI specs naming our devices, the device nodes. */
async function strategyChecks(
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
    const dirs = (env.CDI_SPEC_DIRS || '/etc/cdi:/var/run/cdi').split(':').filter((d) => d !== '');
    const specs = await readCdiSpecs(dirs);
    const ours = specs.flatMap((s) => ('kind' in s && s.kind === CDI_KIND ? [s] : []));
    const generate = `\`nvidia-ctk cdi generate --vendor k8s.device-plugin.nvidia.com --class gpu --device-name-strategy ${o.deviceIdStrategy} --output /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml\``;
    const name = `cdi spec`;
    const broken = specs.flatMap((s) => ('error' in s ? [`${s.path}: ${s.error}`] : []));
    if (ours.length === 0) {
      const other = specs.flatMap((s) =>
        'kind' in s && s.kind.endsWith('/gpu') ? [`${s.path} (kind ${s.kind})`] : [],
      );
      out.push({
        status: 'FAIL',
        name,
        detail: `--device-list-strategy=${cdi.join(',')} asks the runtime for ${CDI_KIND}=<id>, but no CDI spec in ${dirs.join(' or ')} has kind ${CDI_KIND}${other.length > 0 ? `; found ${other.join(', ')}, which the runtime does not match to these names` : ''}${broken.length > 0 ? `; unreadable: ${broken.join('; ')}` : ''}`,
        fix: `generate one: ${generate}`,
      });
    } else if (plan === null || r === null) {
      out.push({
        status: 'SKIP',
        name,
        detail: `${ours.map((s) => s.path).join(', ')} has kind ${CDI_KIND}; whether it names the node's devices was not checked: ${r === null ? 'NVML is not available' : 'the config does not fit the node'}`,
      });
    } else {
      const have = new Set(ours.flatMap((s) => s.devices));
      const want = [...new Set(plan.resources.flatMap((res) => res.devices.map((d) => d.runtimeName)))];
      const missing = want.filter((n) => !have.has(n));
      if (missing.length > 0) {
        out.push({
          status: 'FAIL',
          name,
          detail: `${ours.map((s) => s.path).join(', ')} (${CDI_KIND}) does not name ${missing.length} of the ${want.length} devices the daemon passes (--device-id-strategy=${o.deviceIdStrategy}): ${missing.slice(0, 4).join(', ')}${missing.length > 4 ? ', …' : ''}; containers given them fail to start`,
          fix: `regenerate it: ${generate}`,
        });
      } else {
        out.push({
          status: 'PASS',
          name,
          detail: `${ours.map((s) => s.path).join(', ')} names all ${want.length} devices as ${CDI_KIND}=<${o.deviceIdStrategy}>`,
        });
      }
    }
  }
  if (cdi.length > 0 && imexChannels.length > 0) {
    // Allocate names the channels to the runtime as CDI devices too (FACTS §3).
    const specs = await readCdiSpecs((env.CDI_SPEC_DIRS || '/etc/cdi:/var/run/cdi').split(':').filter((d) => d !== ''));
    const have = new Set(specs.flatMap((s) => ('kind' in s && s.kind === CDI_IMEX_KIND ? s.devices : [])));
    const missing = imexChannels.filter((id) => !have.has(String(id)));
    out.push(
      missing.length === 0
        ? {
            status: 'PASS',
            name: 'cdi imex spec',
            detail: `a CDI spec names ${imexChannels.map((id) => `${CDI_IMEX_KIND}=${id}`).join(', ')}`,
          }
        : {
            status: 'FAIL',
            name: 'cdi imex spec',
            detail: `containers are given ${missing.map((id) => `${CDI_IMEX_KIND}=${id}`).join(', ')}, which no CDI spec names`,
            fix: 'generate the IMEX channel spec with `nvidia-ctk cdi generate --vendor k8s.device-plugin.nvidia.com --class imex-channel` (or one naming channel<N> as device <N>)',
          },
    );
  }
  if (o.passDeviceSpecs) {
    const name = 'device nodes';
    if (r === null)
      out.push({
        status: 'SKIP',
        name,
        detail: 'not checked: NVML is not available to say which /dev/nvidia<minor> the GPUs have',
      });
    else {
      const want = [CONTROL_DEVICE_NODES[0] as string, ...r.gpus.map((g) => `/dev/nvidia${g.minor}`)];
      const missing: string[] = [];
      for (const p of want)
        if (
          !(await access(hostPath(o.devRoot, p), fsc.F_OK).then(
            () => true,
            () => false,
          ))
        )
          missing.push(hostPath(o.devRoot, p));
      if (missing.length > 0)
        out.push({
          status: 'FAIL',
          name,
          detail: `--pass-device-specs passes ${want.length} nodes under --dev-root=${o.devRoot}; missing: ${missing.join(', ')}`,
          fix: "check --dev-root (NVIDIA_DEV_ROOT); the driver's udev rules or nvidia-persistenced create the nodes (nvidia-modprobe -c <minor>)",
        });
      else
        out.push({
          status: 'PASS',
          name,
          detail: `${want.length} nodes passed with --pass-device-specs exist under ${o.devRoot} (${want.join(', ')})`,
        });
    }
  }
  return out;
}

/** Another device plugin in the kubelet's directory registering nvidia.com/gpu (NVIDIA's: nvidia-gpu.sock and friends). */
async function socketDirectoryNeighbours(dir: string, kubeletSocket: string): Promise<CheckLine[]> {
  const others = (await otherSockets(dir, kubeletSocket)).filter((s) => /^nvidia-.*\.sock$/.test(s.name));
  return others.map(
    (s): CheckLine =>
      s.live
        ? {
            status: 'FAIL',
            name: 'other plugin',
            detail: `${join(dir, s.name)} answers: NVIDIA's device plugin runs here and registers nvidia.com/${s.name.slice('nvidia-'.length, -'.sock'.length)} too; the kubelet keeps whichever registered last`,
            fix: "run one of the two: remove NVIDIA's plugin DaemonSet from this node (e.g. a nodeSelector), or stop this service",
          }
        : {
            status: 'WARN',
            name: 'other plugin',
            detail: `${join(dir, s.name)} is left over from NVIDIA's device plugin (nothing answers on it)`,
            fix: `remove it: rm ${join(dir, s.name)}`,
          },
  );
}

/** The exit code of a report: 0 nothing failed, 2 the configuration is at fault, 1 otherwise. */
export function checkExitCode(lines: readonly CheckLine[]): number {
  if (lines.some((l) => l.status === 'FAIL' && l.config === true)) return 2;
  return lines.some((l) => l.status === 'FAIL') ? 1 : 0;
}

export function formatChecks(report: CheckReport): string {
  const { lines } = report;
  const width = Math.max(...lines.map((l) => l.name.length));
  const out = lines.map((l) => `${l.status}  ${l.name.padEnd(width)}  ${l.detail}${l.fix ? ` — fix: ${l.fix}` : ''}`);
  out.push('', `Effective options (as the service would run; unit: ${report.unit.source}):`);
  for (const s of OPTION_SPECS) {
    const v = report.parsed.options[s.key];
    out.push(`  --${s.flag}=${showOption(v)}  (${report.origins[s.key]})`);
  }
  const failed = lines.filter((l) => l.status === 'FAIL').length;
  const skipped = lines.filter((l) => l.status === 'SKIP').length;
  const warned = lines.filter((l) => l.status === 'WARN').length;
  const tail = [
    warned > 0 ? `${warned} warning${warned === 1 ? '' : 's'}` : '',
    skipped > 0 ? `${skipped} not checked (SKIP)` : '',
  ]
    .filter((x) => x !== '')
    .join(', ');
  out.push(
    '',
    failed === 0
      ? `All checks passed${tail === '' ? '' : ` (${tail})`}.`
      : `${failed} of ${lines.filter((l) => l.status !== 'INFO').length} checks failed${tail === '' ? '' : `; ${tail}`}.`,
  );
  return `${out.join('\n')}\n`;
}

/** `check --json`: every check (name, status, detail, fix), the effective options with their origins, and the exit code. */
export function checksJson(report: CheckReport): string {
  return `${JSON.stringify(
    {
      checks: report.lines.map((l) => ({
        name: l.name,
        status: l.status,
        detail: l.detail,
        ...(l.fix === undefined ? {} : { fix: l.fix }),
        ...(l.config === true ? { configError: true } : {}),
      })),
      options: OPTION_SPECS.map((s) => ({
        flag: s.flag,
        value: report.parsed.options[s.key],
        origin: report.origins[s.key],
      })),
      environmentFiles: report.envFiles.map((f) => ({
        path: f.path,
        read: f.parsed !== null,
        ...(f.error === null ? {} : { error: f.error }),
      })),
      unit: report.unit,
      exitCode: checkExitCode(report.lines),
    },
    null,
    2,
  )}\n`;
}
