// Options from the command line and the environment, with NVIDIA's plugin's names, env vars and
// defaults where it has the option. Precedence: command line, then environment, then default.
import { DEVICE_ID_STRATEGIES } from '../core/devices.ts';
import type { DeviceIdStrategy } from '../core/devices.ts';
import { LOG_LEVELS } from '../system/log.ts';
import type { LogLevel } from '../system/log.ts';

export interface Options {
  kubeletSocket: string;
  driverRoot: string;
  /** Root of the device nodes on the host; defaults to the driver root, as in NVIDIA's plugin. */
  devRoot: string;
  deviceIdStrategy: DeviceIdStrategy;
  passDeviceSpecs: boolean;
  failOnInitError: boolean;
  logLevel: LogLevel;
  /** Seconds between checks that our socket is still ours (inotify can miss events). */
  socketCheckInterval: number;
  /** Seconds between the per-GPU NVML probes that find GPUs fallen off the bus. */
  healthProbeInterval: number;
  /** Let a GPU marked unhealthy by an XID become healthy again after a quiet period (NVIDIA: never). */
  healthRecovery: boolean;
  /** Seconds a GPU must answer NVML normally, with no new critical XID, before it recovers. */
  healthRecoveryQuietPeriod: number;
}

export type OptionKey = keyof Options;
export type Origin = 'command line' | 'environment' | 'default';

type Kind =
  | { type: 'string'; path?: boolean }
  | { type: 'bool' }
  | { type: 'enum'; values: readonly string[] }
  | { type: 'seconds'; min: number; max: number };

export interface OptionSpec {
  key: OptionKey;
  flag: string;
  env: string;
  /** The default as text, or null when it is derived from another option. */
  default: string | null;
  kind: Kind;
  help: string;
}

export const OPTION_SPECS: readonly OptionSpec[] = [
  { key: 'kubeletSocket', flag: 'kubelet-socket', env: 'KUBELET_SOCKET', default: '/var/lib/kubelet/device-plugins/kubelet.sock', kind: { type: 'string', path: true },
    help: "the kubelet's registration socket; the plugin's own socket goes in the same directory" },
  { key: 'driverRoot', flag: 'driver-root', env: 'NVIDIA_DRIVER_ROOT', default: '/', kind: { type: 'string', path: true },
    help: 'root under which the NVIDIA driver is installed (its libnvidia-ml.so.1 is looked for there first)' },
  { key: 'devRoot', flag: 'dev-root', env: 'NVIDIA_DEV_ROOT', default: null, kind: { type: 'string', path: true },
    help: 'root under which the NVIDIA device nodes live on the host (default: the driver root)' },
  { key: 'deviceIdStrategy', flag: 'device-id-strategy', env: 'DEVICE_ID_STRATEGY', default: 'uuid', kind: { type: 'enum', values: DEVICE_ID_STRATEGIES },
    help: 'how GPUs are named to the kubelet and the container runtime' },
  { key: 'passDeviceSpecs', flag: 'pass-device-specs', env: 'PASS_DEVICE_SPECS', default: 'false', kind: { type: 'bool' },
    help: 'also return the NVIDIA device nodes as DeviceSpecs in Allocate' },
  { key: 'failOnInitError', flag: 'fail-on-init-error', env: 'FAIL_ON_INIT_ERROR', default: 'true', kind: { type: 'bool' },
    help: 'exit when NVML cannot be loaded or initialised; false keeps running and retries' },
  { key: 'logLevel', flag: 'log-level', env: 'LOG_LEVEL', default: 'info', kind: { type: 'enum', values: LOG_LEVELS },
    help: 'least severe log level written to stderr' },
  { key: 'socketCheckInterval', flag: 'socket-check-interval', env: 'SOCKET_CHECK_INTERVAL', default: '5', kind: { type: 'seconds', min: 0.1, max: 3600 },
    help: 'seconds between checks that the plugin socket still exists and is ours' },
  { key: 'healthProbeInterval', flag: 'health-probe-interval', env: 'HEALTH_PROBE_INTERVAL', default: '5', kind: { type: 'seconds', min: 0.05, max: 3600 },
    help: 'seconds between NVML probes of each GPU; a GPU that answers GPU_IS_LOST is marked unhealthy' },
  { key: 'healthRecovery', flag: 'health-recovery', env: 'HEALTH_RECOVERY', default: 'false', kind: { type: 'bool' },
    help: "let a GPU made unhealthy by an XID recover after the quiet period (NVIDIA's plugin never does; lost GPUs never recover)" },
  { key: 'healthRecoveryQuietPeriod', flag: 'health-recovery-quiet-period', env: 'HEALTH_RECOVERY_QUIET_PERIOD', default: '300', kind: { type: 'seconds', min: 0.05, max: 86400 },
    help: 'seconds of normal NVML answers with no new critical XID before a GPU recovers (with --health-recovery)' },
];

export class OptionError extends Error {
  override name = 'OptionError';
}

const TRUE = new Set(['true', '1', 'yes', 'on']);
const FALSE = new Set(['false', '0', 'no', 'off']);

function convert(spec: OptionSpec, raw: string, where: string): string | boolean | number {
  const k = spec.kind;
  switch (k.type) {
    case 'string':
      if (raw.length === 0) throw new OptionError(`${where}: an empty value is not allowed; expected ${k.path ? 'a path' : 'a value'}`);
      if (k.path && !raw.startsWith('/')) throw new OptionError(`${where}: ${JSON.stringify(raw)} is not an absolute path; expected a path starting with /`);
      return raw;
    case 'bool': {
      const v = raw.toLowerCase();
      if (TRUE.has(v)) return true;
      if (FALSE.has(v)) return false;
      throw new OptionError(`${where}: ${JSON.stringify(raw)} is not a boolean; expected true or false`);
    }
    case 'enum':
      if (!k.values.includes(raw)) throw new OptionError(`${where}: ${JSON.stringify(raw)} is not allowed; expected one of ${k.values.join(', ')}`);
      return raw;
    case 'seconds': {
      const n = Number(raw.endsWith('s') ? raw.slice(0, -1) : raw);
      if (!Number.isFinite(n) || n < k.min || n > k.max) {
        throw new OptionError(`${where}: ${JSON.stringify(raw)} is not a number of seconds from ${k.min} to ${k.max}`);
      }
      return n;
    }
  }
}

export interface ParsedOptions {
  options: Options;
  origins: Record<OptionKey, Origin>;
}

/** Parses flags (`--name value`, `--name=value`, bare `--bool-flag`) and env vars. */
export function parseOptions(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): ParsedOptions {
  const byFlag = new Map(OPTION_SPECS.map((s) => [s.flag, s]));
  const fromFlags = new Map<OptionKey, string | boolean | number>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? '';
    if (!arg.startsWith('--')) throw new OptionError(`unexpected argument ${JSON.stringify(arg)}; options are written --name=value (see --help)`);
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    const spec = byFlag.get(name);
    if (spec === undefined) throw new OptionError(`unknown option --${name}; see --help for the options this plugin has`);
    let raw: string;
    if (eq >= 0) raw = arg.slice(eq + 1);
    else if (spec.kind.type === 'bool' && (argv[i + 1] === undefined || argv[i + 1]?.startsWith('--'))) raw = 'true';
    else {
      const next = argv[i + 1];
      if (next === undefined) throw new OptionError(`--${name} needs a value`);
      raw = next;
      i++;
    }
    if (fromFlags.has(spec.key)) throw new OptionError(`--${name} is given more than once`);
    fromFlags.set(spec.key, convert(spec, raw, `--${name}`));
  }
  const values: Partial<Record<OptionKey, string | boolean | number>> = {};
  const origins = {} as Record<OptionKey, Origin>;
  for (const spec of OPTION_SPECS) {
    const flagValue = fromFlags.get(spec.key);
    const envValue = env[spec.env];
    if (flagValue !== undefined) {
      values[spec.key] = flagValue;
      origins[spec.key] = 'command line';
    } else if (envValue !== undefined && envValue !== '') {
      values[spec.key] = convert(spec, envValue, `environment variable ${spec.env}`);
      origins[spec.key] = 'environment';
    } else if (spec.default !== null) {
      values[spec.key] = convert(spec, spec.default, `default of --${spec.flag}`);
      origins[spec.key] = 'default';
    } else {
      origins[spec.key] = 'default';
    }
  }
  if (values.devRoot === undefined) values.devRoot = values.driverRoot ?? '/';
  return { options: values as Options, origins };
}

export function helpText(version: string): string {
  const lines = [
    `gpu-device-plugin ${version} — Kubernetes device plugin for NVIDIA GPUs (resource nvidia.com/gpu)`,
    '',
    'Usage: gpu-device-plugin [options]',
    '       gpu-device-plugin --version | --help',
    '',
    'Options (command line beats environment, which beats the default):',
  ];
  for (const s of OPTION_SPECS) {
    const values = s.kind.type === 'enum' ? ` (${s.kind.values.join('|')})` : s.kind.type === 'bool' ? ' (true|false)' : '';
    lines.push(`  --${s.flag}${values}`);
    lines.push(`      ${s.help}`);
    lines.push(`      env ${s.env}; default ${s.default ?? 'see above'}`);
  }
  lines.push('', 'Environment only (NVIDIA\'s names and meanings):',
    '  DP_DISABLE_HEALTHCHECKS  "all" (or "xids") turns health checks off; otherwise extra XIDs to ignore, e.g. 74,79',
    '  DP_ENABLE_HEALTHCHECKS   XIDs to treat as critical even when ignored, e.g. 31; wins over DP_DISABLE_HEALTHCHECKS',
    '  SYSFS_ROOT               root of sysfs, for NUMA nodes the driver does not report (default /sys)');
  return lines.join('\n') + '\n';
}
