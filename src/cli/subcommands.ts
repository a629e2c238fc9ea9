// `info` and `check`: what the plugin sees of the node, without a cluster.
import { errorText, stderrLogger } from '../system/log.ts';
import { checkExitCode, checksJson, formatChecks, runChecks } from './check.ts';
import { findImexChannels } from '../system/imex.ts';
import { listPodResources } from '../kubelet/pod-resources.ts';
import { formatImex, formatInfo, infoJson, inspectNode } from './inspect.ts';
import type { PodView } from './inspect.ts';
import { parseOptions } from './options.ts';

export async function runSubcommand(name: 'info' | 'check', argv: readonly string[]): Promise<void> {
  const log = stderrLogger('error');
  try {
    if (name === 'check') {
      const json = argv.includes('--json');
      try {
        const report = await runChecks(argv, process.env, log);
        process.stdout.write(json ? checksJson(report) : formatChecks(report));
        process.exitCode = checkExitCode(report.lines);
      } catch (err) {
        // `check` itself could not run (a bad --env-file argument, …): still one answer a script can read.
        if (!json) throw err;
        process.stdout.write(JSON.stringify({ checks: [], error: errorText(err), exitCode: 2 }, null, 2) + '\n');
        process.exitCode = 2;
      }
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
