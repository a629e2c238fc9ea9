// `info` and `check`: what the plugin sees of the node, without a cluster.
import { errorText, stderrLogger } from '../system/log.ts';
import { formatChecks, runChecks } from './check.ts';
import { findImexChannels } from '../system/imex.ts';
import { formatImex, formatInfo, infoJson, inspectNode } from './inspect.ts';
import { parseOptions } from './options.ts';

export async function runSubcommand(name: 'info' | 'check', argv: readonly string[]): Promise<void> {
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
    const imex = { configured: opts.imexChannelIds, required: opts.imexRequired, choice: await findImexChannels(opts.imexChannelIds, opts.imexRequired, opts.devRoot) };
    process.stdout.write(json ? infoJson(r.report, imex, strategy) : `${formatInfo(r.report, strategy)}\n${formatImex(imex)}`);
  } catch (err) {
    process.stderr.write(`gpu-device-plugin ${name}: ${errorText(err)}\n`);
    process.exitCode = 2;
  }
}
