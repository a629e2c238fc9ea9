// `info` and `check`: what the plugin sees of the node, without a cluster. Both read the environment
// files the unit reads (service-environment.ts); `info` shows the running daemon's published
// state (what the kubelet was told) and looks at NVML itself only for what the daemon does not say.
import { errorText, stderrLogger } from '../system/log.ts';
import { runChecks } from './check.ts';
import { checkExitCode, checksJson, formatChecks } from './check-report.ts';
import { serviceEnvironment, splitCheckArgs } from './service-environment.ts';
import { findImexChannels } from '../system/imex.ts';
import { listPodResources } from '../kubelet/pod-resources.ts';
import { daemonJson, formatDaemon } from './daemon-view.ts';
import type { DaemonView } from './daemon-view.ts';
import { formatImex, formatInfo, infoJson } from './info-format.ts';
import type { PodView } from './info-format.ts';
import { inspectNode } from './inspect.ts';
import { formatSignals, readSignalRound, signalPolicyFor } from './signals-view.ts';
import type { SignalsShown } from './signals-view.ts';
import { OPTION_SPECS } from '../config/option-table.ts';
import { parseOptions } from '../config/parse-options.ts';
import { showOption } from '../config/describe-options.ts';
import { defaultStateFile, readDaemonState } from '../observe/state-file.ts';
import type { Options } from '../config/options.ts';
import { checkpointForBoot, parseCheckpoint } from '../core/dra-checkpoint.ts';
import { CHECKPOINT_FILE, readBootId } from '../dra/checkpoint.ts';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

/** `info --help` and `check --help`: what the subcommand does and which options it reads. */
function subcommandHelp(name: 'info' | 'check'): string {
  const lines =
    name === 'info'
      ? [
          'Usage: gpu-device-plugin info [--json] [options]',
          '',
          'Shows what the plugin sees of this node, without a cluster: the GPUs (UUID, name, memory, PCI bus,',
          'NUMA node, health), the topology matrix as nvidia-smi topo -m shows it with the pair scores, MIG',
          "devices, IMEX channels, which pod holds each GPU (asked from the kubelet's PodResources socket), and",
          "each GPU's health signals beyond XIDs with value, class and since when (the daemon's; when none runs,",
          'one probe round read just now).',
          '',
          '  --json   the same as JSON, for scripts',
          '',
          "It reads the daemon's options (command line, environment, config file), of which these matter:",
          '--driver-root, --dev-root, --mig-strategy, --imex-channel-ids, --imex-required, --pod-resources-socket',
          '(see gpu-device-plugin --help). Exit status: 0 shown, 1 NVML cannot be read, 2 an invalid option.',
        ]
      : [
          'Usage: gpu-device-plugin check [options]',
          '',
          'Checks, without a cluster, what the daemon needs with the options given: the options and the config',
          'file, NVML, the GPUs, the socket directory, the kubelet, and the labels and metrics directories when',
          'they are configured. With --kubelet-api=dra instead of the socket directory and the kubelet: the',
          "kubeconfig, the API server (reachable from the unit's sandbox, and over TCP), the kubelet's plugin",
          "directories and the NVIDIA Container Toolkit's CDI spec. In either mode, the health signals each GPU's",
          'driver supports. One line per check, PASS or FAIL with the fix, an INFO line on what the other mode',
          "would need, then every option's value and where it came from. Registers nothing.",
          '',
          "It takes the daemon's options (see gpu-device-plugin --help), so the same command line, environment",
          'and config file can be checked before they are used. Exit status: 0 every check passed, 1 one failed.',
        ];
  return `${lines.join('\n')}\n`;
}

export async function runSubcommand(name: 'info' | 'check', argv: readonly string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(subcommandHelp(name));
    return;
  }
  const log = stderrLogger('error');
  const json = argv.includes('--json');
  try {
    if (name === 'check') {
      try {
        const report = await runChecks(argv, process.env, log);
        process.stdout.write(json ? checksJson(report) : formatChecks(report));
        process.exitCode = checkExitCode(report.lines);
      } catch (err) {
        // `check` itself could not run (a bad --env-file argument, …): still one answer a script can read.
        if (!json) throw err;
        process.stdout.write(`${JSON.stringify({ checks: [], error: errorText(err), exitCode: 2 }, null, 2)}\n`);
        process.exitCode = 2;
      }
      return;
    }
    await info(argv, json, log);
  } catch (err) {
    if (json) process.stdout.write(`${JSON.stringify({ error: errorText(err) }, null, 2)}\n`);
    process.stderr.write(`gpu-device-plugin ${name}: ${errorText(err)}\n`);
    process.exitCode = 2;
  }
}

/** DRA mode, no daemon: the claims its checkpoint holds for this boot (a checkpoint of another boot holds none). */
async function checkpointClaims(opts: Options): Promise<NonNullable<DaemonView['checkpoint']>> {
  const path = join(opts.kubeletPluginsDir, opts.draDriverName, CHECKPOINT_FILE);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { path, claims: [] };
    return { path, error: errorText(err) };
  }
  try {
    const { checkpoint } = checkpointForBoot(parseCheckpoint(text), await readBootId());
    return {
      path,
      claims: Object.entries(checkpoint.claims).map(([uid, c]) => ({
        namespace: c.namespace,
        name: c.name,
        uid,
        state: c.state,
        devices: c.devices.map((d) => d.device),
        ...(c.preparedAt === undefined ? {} : { since: c.preparedAt }),
      })),
    };
  } catch (err) {
    return { path, error: errorText(err) };
  }
}

async function info(argv: readonly string[], json: boolean, log: ReturnType<typeof stderrLogger>): Promise<void> {
  const { envFiles, rest } = splitCheckArgs(argv);
  const svc = await serviceEnvironment(envFiles, process.env);
  const opts = parseOptions(rest, svc.env).options;
  // The daemon's state when it runs; a stale file (its pid is gone) is not believed.
  const read = await readDaemonState(defaultStateFile(svc.env));
  const daemon: DaemonView = {
    read,
    ...(read.kind !== 'running' && opts.kubeletApi === 'dra' ? { checkpoint: await checkpointClaims(opts) } : {}),
  };
  const running = daemon.read.kind === 'running' ? daemon.read.state : undefined;
  const r = inspectNode(opts.driverRoot, svc.env.SYSFS_ROOT || '/sys', log);
  if (!r.ok) {
    if (json)
      process.stdout.write(`${JSON.stringify({ daemon: daemonJson(daemon), error: `NVML: ${r.error}` }, null, 2)}\n`);
    else {
      if (running !== undefined) process.stdout.write(formatDaemon(daemon));
      process.stderr.write(`gpu-device-plugin info: ${r.error}\n`);
    }
    process.exitCode = 1;
    return;
  }
  // MIG resources are shown as --mig-strategy would advertise them (mixed when it is none, to show them at all).
  const strategy = opts.migStrategy === 'none' ? 'mixed' : opts.migStrategy;
  const socket = opts.podResourcesSocket;
  const pods: PodView = await listPodResources(socket, 5000).then(
    (list): PodView => ({
      ok: true,
      socket,
      pods: list.map((p) => ({
        namespace: p.namespace,
        pod: p.name,
        containers: p.containers.map((c) => ({
          name: c.name,
          devices: c.devices.map((d) => ({ resource: d.resource_name, ids: d.device_ids })),
        })),
      })),
    }),
    (err: unknown): PodView => ({ ok: false, socket, error: errorText(err) }),
  );
  const imex = {
    configured: opts.imexChannelIds,
    required: opts.imexRequired,
    choice: await findImexChannels(opts.imexChannelIds, opts.imexRequired, opts.devRoot),
  };
  const signals: SignalsShown =
    running !== undefined
      ? { from: 'daemon', publishedAt: running.publishedAt, gpus: running.signals }
      : { from: 'probe', round: await readSignalRound(opts.driverRoot, r.report.gpus, signalPolicyFor(svc.env), log) };
  const configured = Object.fromEntries(OPTION_SPECS.map((spec) => [spec.flag, showOption(opts[spec.key])]));
  const text = [
    formatDaemon(daemon, configured),
    formatInfo(r.report, pods, strategy, running),
    formatSignals(signals),
  ];
  process.stdout.write(
    json ? infoJson(r.report, pods, imex, strategy, daemon, signals) : [...text, formatImex(imex)].join('\n'),
  );
}
