// `info` and `check`: what the plugin sees of the node, without a cluster.
import { errorText, stderrLogger } from '../system/log.ts';
import { formatChecks, runChecks } from './check.ts';
import { findImexChannels } from '../system/imex.ts';
import { listPodResources } from '../kubelet/pod-resources.ts';
import { formatImex, formatInfo, infoJson, inspectNode } from './inspect.ts';
import type { PodView } from './inspect.ts';
import { parseOptions } from './options.ts';

/** `info --help` and `check --help`: what the subcommand does and which options it reads. */
export function subcommandHelp(name: 'info' | 'check'): string {
  const lines = name === 'info'
    ? [
      'Usage: gpu-device-plugin info [--json] [options]',
      '',
      'Shows what the plugin sees of this node, without a cluster: the GPUs (UUID, name, memory, PCI bus,',
      'NUMA node, health), the topology matrix as nvidia-smi topo -m shows it with the pair scores, MIG',
      'devices, IMEX channels, and which pod holds each GPU (asked from the kubelet\'s PodResources socket).',
      '',
      '  --json   the same as JSON, for scripts',
      '',
      'It reads the daemon\'s options (command line, environment, config file), of which these matter:',
      '--driver-root, --dev-root, --mig-strategy, --imex-channel-ids, --imex-required, --pod-resources-socket',
      '(see gpu-device-plugin --help). Exit status: 0 shown, 1 NVML cannot be read, 2 an invalid option.',
    ]
    : [
      'Usage: gpu-device-plugin check [options]',
      '',
      'Checks, without a cluster, what the daemon needs with the options given: the options and the config',
      'file, NVML, the GPUs, the socket directory, the kubelet, and the labels and metrics directories when',
      'they are configured. One line per check, PASS or FAIL with the fix, then every option\'s value and',
      'where it came from. Registers nothing.',
      '',
      'It takes the daemon\'s options (see gpu-device-plugin --help), so the same command line, environment',
      'and config file can be checked before they are used. Exit status: 0 every check passed, 1 one failed.',
    ];
  return lines.join('\n') + '\n';
}

export async function runSubcommand(name: 'info' | 'check', argv: readonly string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(subcommandHelp(name));
    return;
  }
  const log = stderrLogger('error');
  try {
    if (name === 'check') {
      const { lines, parsed } = await runChecks(argv, process.env, log);
      process.stdout.write(formatChecks(lines, parsed));
      process.exitCode = lines.every((l) => l.ok) ? 0 : 1;
      return;
    }
    const json = argv.includes('--json');
    const opts = parseOptions(argv.filter((a) => a !== '--json'), process.env).options;
    const r = inspectNode(opts.driverRoot, process.env['SYSFS_ROOT'] || '/sys', log);
    if (!r.ok) {
      process.stderr.write(`gpu-device-plugin info: ${r.error}\n`);
      process.exitCode = 1;
      return;
    }
    // MIG resources are shown as --mig-strategy would advertise them (mixed when it is none, to show them at all).
    const strategy = opts.migStrategy === 'none' ? 'mixed' : opts.migStrategy;
    const socket = opts.podResourcesSocket;
    const pods: PodView = await listPodResources(socket, 5000).then(
      (list): PodView => ({ ok: true, socket, pods: list.map((p) => ({ namespace: p.namespace, pod: p.name, containers: p.containers.map((c) => ({ name: c.name, devices: c.devices.map((d) => ({ resource: d.resource_name, ids: d.device_ids })) })) })) }),
      (err: unknown): PodView => ({ ok: false, socket, error: errorText(err) }),
    );
    const imex = { configured: opts.imexChannelIds, required: opts.imexRequired, choice: await findImexChannels(opts.imexChannelIds, opts.imexRequired, opts.devRoot) };
    process.stdout.write(json ? infoJson(r.report, pods, imex, strategy) : `${formatInfo(r.report, pods, strategy)}\n${formatImex(imex)}`);
  } catch (err) {
    process.stderr.write(`gpu-device-plugin ${name}: ${errorText(err)}\n`);
    process.exitCode = 2;
  }
}
