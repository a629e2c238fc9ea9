// `gpu-device-plugin check`: preflight for operators. One line per check, pass or fail with the fix,
// then the effective options and where each came from. Exit 0 only when every check passes.
import * as grpc from '@grpc/grpc-js';
import { access, constants as fsc, stat } from 'node:fs/promises';
import { dirname } from 'node:path';
import { parseHealthSettings } from '../core/health.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { readMigCapabilities } from '../nvml/mig.ts';
import { findImexChannels } from '../system/imex.ts';
import { inspectNode, migResources } from './inspect.ts';
import type { NodeReport } from './inspect.ts';
import { OPTION_SPECS, parseOptions, showOption } from './options.ts';
import type { ParsedOptions } from './options.ts';

export interface CheckLine {
  ok: boolean;
  name: string;
  detail: string;
  fix?: string;
}

async function kubeletAnswers(socket: string, timeoutMs: number): Promise<string | null> {
  const client = new grpc.Client(`unix://${socket}`, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
  try {
    await new Promise<void>((resolve, reject) => client.waitForReady(Date.now() + timeoutMs, (err) => (err ? reject(err) : resolve())));
    return null;
  } catch (err) {
    return errorText(err);
  } finally {
    client.close();
  }
}

/** A directory the plugin writes into: it must exist and be writable. */
async function writableDirectory(name: string, dir: string, fix: string): Promise<CheckLine> {
  try {
    const st = await stat(dir);
    if (!st.isDirectory()) throw new Error('is not a directory');
    await access(dir, fsc.W_OK);
    return { ok: true, name, detail: `${dir} exists and is writable` };
  } catch (err) {
    return { ok: false, name, detail: `${dir}: ${errorText(err)}`, fix };
  }
}

export async function runChecks(argv: readonly string[], env: Readonly<Record<string, string | undefined>>, log: Logger): Promise<{ lines: CheckLine[]; parsed: ParsedOptions }> {
  const lines: CheckLine[] = [];
  let parsed: ParsedOptions;
  try {
    parsed = parseOptions(argv, env);
    parseHealthSettings(env['DP_DISABLE_HEALTHCHECKS'], env['DP_ENABLE_HEALTHCHECKS']);
    lines.push({ ok: true, name: 'config', detail: 'options and environment are valid' });
  } catch (err) {
    lines.push({ ok: false, name: 'config', detail: errorText(err), fix: 'correct the option named above (see --help); the checks below use the defaults' });
    parsed = parseOptions([], {});
  }
  const o = parsed.options;

  const node = inspectNode(o.driverRoot, env['SYSFS_ROOT'] || '/sys', log);
  if (node.ok) {
    lines.push({ ok: true, name: 'nvml', detail: `loaded ${node.report.library}, driver ${node.report.driverVersion}` });
    const n = node.report.gpus.length;
    const sick = node.report.gpus.filter((g) => g.health !== 'Healthy').map((g) => `GPU ${g.index}`);
    if (n === 0) lines.push({ ok: false, name: 'gpus', detail: 'NVML sees no GPUs', fix: 'check `nvidia-smi`; GPUs bound to vfio-pci or hidden by the BIOS are not visible' });
    else if (sick.length > 0) lines.push({ ok: false, name: 'gpus', detail: `${n} found; not answering NVML: ${sick.join(', ')}`, fix: 'see `nvidia-smi -q` and the kernel log (XID 79: fallen off the bus)' });
    else lines.push({ ok: true, name: 'gpus', detail: `${n} found, all answering NVML` });
    lines.push(...migChecks(node.report, parsed, env));
  } else {
    lines.push({ ok: false, name: 'nvml', detail: node.error, fix: 'install the NVIDIA driver, or point --driver-root (NVIDIA_DRIVER_ROOT) at where it is installed' });
    lines.push({ ok: false, name: 'gpus', detail: 'not checked: NVML is not available', fix: 'fix NVML first' });
  }

  if (o.imexChannelIds.length > 0) {
    const imex = await findImexChannels(o.imexChannelIds, o.imexRequired, o.devRoot);
    if (imex.missing.length === 0) lines.push({ ok: true, name: 'imex', detail: `channel ${imex.channels.join(',')} present under ${o.devRoot}; passed to every container` });
    else {
      lines.push({ ok: false, name: 'imex', detail: `${imex.missing.join('; ')}: ${o.imexRequired ? 'the plugin will not start (--imex-required)' : 'skipped, containers get no IMEX channel'}`,
        fix: 'start the IMEX daemon (nvidia-imex) so it creates the channel, check --dev-root, or drop --imex-channel-ids' });
    }
  }

  lines.push(await writableDirectory('socket directory', dirname(o.kubeletSocket), 'is the kubelet installed and its device plugins enabled? run the plugin as root, or set --kubelet-socket'));
  // The labels and metrics files, when configured: their directory must exist and be writable.
  for (const [name, file, reader] of [['labels file', o.nfdFeaturesFile, 'Node Feature Discovery'], ['metrics file', o.metricsFile, 'node_exporter']] as const) {
    if (file === null) continue;
    const fdir = dirname(file);
    lines.push(await writableDirectory(name, fdir, `is ${reader} installed? create the directory; under systemd also add ReadWritePaths=${fdir} with \`systemctl edit gpu-device-plugin\``));
  }

  try {
    const st = await stat(o.kubeletSocket);
    if (!st.isSocket()) throw new Error('exists but is not a socket');
    const problem = await kubeletAnswers(o.kubeletSocket, 2000);
    if (problem !== null) throw new Error(`does not answer: ${problem}`);
    lines.push({ ok: true, name: 'kubelet', detail: `${o.kubeletSocket} answers` });
  } catch (err) {
    const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
    lines.push({ ok: false, name: 'kubelet', detail: `${o.kubeletSocket} ${missing ? 'does not exist' : errorText(err)}`,
      fix: missing ? 'is the kubelet running? (systemctl status kubelet); or set --kubelet-socket' : 'restart the kubelet; check its log' });
  }
  return { lines, parsed };
}

/** Whether the node fits --mig-strategy, and (with device specs) whether mig-minors can be read. */
function migChecks(r: NodeReport, parsed: ParsedOptions, env: Readonly<Record<string, string | undefined>>): CheckLine[] {
  const o = parsed.options;
  if (o.migStrategy === 'none') return [];
  const flag = `--mig-strategy=${o.migStrategy}`;
  if (r.mig === null) {
    return [{ ok: false, name: 'mig', detail: `${flag}, but this driver has no MIG functions: every GPU is advertised whole`, fix: 'upgrade the NVIDIA driver (R470 or later), or use --mig-strategy=none' }];
  }
  const view = migResources(r, o.migStrategy);
  if (view.problem !== null) {
    return [{ ok: false, name: 'mig', detail: view.problem, fix: 'partition every GPU alike (nvidia-mig-parted), or use --mig-strategy=mixed' }];
  }
  const enabled = r.mig.modes.filter((m) => m?.current === true).length;
  const resources = new Map<string, number>();
  for (const d of view.devices) if (d.resource !== null) resources.set(d.resource, (resources.get(d.resource) ?? 0) + 1);
  const summary = enabled === 0
    ? `${flag}: no GPU is in MIG mode, so every GPU is advertised whole`
    : `${flag}: ${enabled} GPU${enabled === 1 ? '' : 's'} in MIG mode; ${[...resources].map(([n, c]) => `${n}=${c}`).join(', ') || 'no MIG device advertised'}${view.notes.length > 0 ? `; ${view.notes.join('; ')}` : ''}`;
  const out: CheckLine[] = [{ ok: true, name: 'mig', detail: summary }];
  if (o.passDeviceSpecs && view.devices.some((d) => d.resource !== null)) {
    const caps = readMigCapabilities(r.gpus, r.mig, env);
    if ('problem' in caps) out.push({ ok: false, name: 'mig-minors', detail: caps.problem, fix: 'load the NVIDIA driver with MIG support (nvidia-caps); or set PROC_ROOT if /proc is elsewhere' });
    else out.push({ ok: true, name: 'mig-minors', detail: `capability nodes found for all ${caps.size} MIG devices` });
  }
  return out;
}

export function formatChecks(lines: readonly CheckLine[], parsed: ParsedOptions): string {
  const width = Math.max(...lines.map((l) => l.name.length));
  const out = lines.map((l) => `${l.ok ? 'PASS' : 'FAIL'}  ${l.name.padEnd(width)}  ${l.detail}${l.fix ? ` — fix: ${l.fix}` : ''}`);
  out.push('', 'Effective options:');
  for (const s of OPTION_SPECS) {
    const v = parsed.options[s.key];
    out.push(`  --${s.flag}=${showOption(v)}  (${parsed.origins[s.key]})`);
  }
  const failed = lines.filter((l) => !l.ok).length;
  out.push('', failed === 0 ? 'All checks passed.' : `${failed} of ${lines.length} checks failed.`);
  return out.join('\n') + '\n';
}
