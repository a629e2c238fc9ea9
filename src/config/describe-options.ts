// The options described for people: one value as text, every value in force for the start log line,
// and the --help text.
import { describeRange } from './duration.ts';
import { describeBytes } from './option-value.ts';
import { OPTION_SPECS } from './option-table.ts';
import type { OptionKey, Options, ParsedOptions } from './options.ts';
import { UNSUPPORTED_OPTIONS } from './unsupported-options.ts';

/** Shows an option's value: lists comma-joined, null as "none". */
export function showOption(v: Options[OptionKey]): string {
  if (v === null) return 'none';
  if (Array.isArray(v)) return v.join(',');
  return String(v);
}

/**
 * Every option's value in force, for the start log line: one field per option (named after its flag,
 * `kubelet_socket=/var/lib/...`), then `set_by` naming where each value that is not the default came
 * from (`log-level=environment, pass-device-specs=config file /etc/...`).
 */
export function describeOptions(parsed: Pick<ParsedOptions, 'options' | 'origins'>): Record<string, string> {
  const out: Record<string, string> = {};
  const setBy: string[] = [];
  for (const s of OPTION_SPECS) {
    out[s.flag.replace(/-/g, '_')] = showOption(parsed.options[s.key]);
    const origin = parsed.origins[s.key];
    if (origin !== 'default') setBy.push(`${s.flag}=${origin}`);
  }
  out.set_by = setBy.length === 0 ? 'all defaults' : setBy.join(', ');
  return out;
}

/** Each option in --help: its flags with the values it takes, its help, its variable, default and config key. */
function optionLines(): string[] {
  const lines: string[] = [];
  for (const s of OPTION_SPECS) {
    const k = s.kind;
    const values =
      k.type === 'enum'
        ? ` (${k.values.filter((v) => k.unsupported?.[v] === undefined).join('|')}` +
          `${k.multiple === true ? ', comma separated' : ''})`
        : k.type === 'bool'
          ? ' (true|false)'
          : k.type === 'ids'
            ? ` (${k.allowed.join('|')}, or empty for none)`
            : k.type === 'seconds'
              ? ` (duration ${describeRange(k)}; 5, 0.5, 500ms, 30s, 5m, 1h)`
              : k.type === 'count'
                ? ` (a whole number from ${k.min} to ${k.max})`
                : k.type === 'bytes'
                  ? ` (size ${describeBytes(k)})`
                  : '';
    const names = [s.flag, ...(s.aliases ?? [])].map((n) => `--${n}`).join(', ');
    lines.push(`  ${names}${values}`);
    lines.push(`      ${s.help}`);
    lines.push(
      `      env ${s.env}; default ${s.default === '' ? 'empty' : (s.default ?? 'see above')}` +
        `${s.config === undefined ? '' : `; config file ${s.config}`}`,
    );
  }
  return lines;
}

export function helpText(version: string): string {
  const lines = [
    `gpu-device-plugin ${version} — Kubernetes device plugin for NVIDIA GPUs (resource nvidia.com/gpu)`,
    '',
    'Usage: gpu-device-plugin [options]                the daemon',
    '       gpu-device-plugin info [--json] [options]  what the plugin sees of this node (info --help)',
    '       gpu-device-plugin check [options]          preflight checks of the options, NVML, kubelet (check --help)',
    '       gpu-device-plugin mps-control-daemon [options] the MPS control daemons (mps-control-daemon --help)',
    '       gpu-device-plugin --version | --help',
    '',
    'Exit status: 0 a clean stop; 1 the plugin could not start (or stop) cleanly; 2 a configuration error',
    '(an invalid option, variable or config file entry, or a config file that does not fit the node);',
    '3 another gpu-device-plugin already serves the socket directory (its PID is named).',
    '',
    'Signals: SIGTERM, SIGINT, SIGQUIT stop (sockets removed); SIGHUP re-reads the config file and looks',
    'at the GPUs again; any other signal that would end or stop the process is ignored with a log line.',
    '',
    'Options (command line beats environment, which beats the config file, which beats the default):',
  ];
  lines.push(...optionLines());
  lines.push(
    '',
    "Config file (--config-file): NVIDIA's v1 format, YAML or JSON, e.g.",
    '  version: v1',
    '  flags: { migStrategy: none, plugin: { deviceListStrategy: [envvar], deviceIDStrategy: uuid } }',
    '  sharing: { timeSlicing: { renameByDefault: false, resources: [{ name: nvidia.com/gpu, replicas: 4 }] } }',
    'or, for MPS (one or the other; needs --mps-root and the gpu-device-plugin-mps unit):',
    '  sharing: { mps: { resources: [{ name: nvidia.com/gpu, replicas: 10 }] } }',
    'SIGHUP re-reads it: a valid change is applied and the resources registered again; an invalid one',
    'is logged and the running configuration kept.',
  );
  lines.push('', "Options of NVIDIA's plugin refused here (unless off or at NVIDIA's default):");
  for (const u of UNSUPPORTED_OPTIONS) {
    lines.push(`  ${[u.flag, ...u.aliases].map((n) => `--${n}`).join(', ')} (env ${u.envs.join(', ')}): ${u.reason}`);
  }
  lines.push(
    '',
    "Environment only (NVIDIA's names and meanings):",
    '  DP_DISABLE_HEALTHCHECKS  "all" (or "xids") turns health checks off; otherwise extra XIDs to ignore, e.g. 74,79',
    '  DP_ENABLE_HEALTHCHECKS   XIDs to treat as critical even ' +
      'when ignored, e.g. 31; wins over DP_DISABLE_HEALTHCHECKS',
    '  SYSFS_ROOT               root of sysfs, for NUMA nodes the driver does not report (default /sys)',
  );
  return `${lines.join('\n')}\n`;
}
