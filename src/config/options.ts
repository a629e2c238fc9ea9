// Options from the command line, the environment and the config file, with NVIDIA's plugin's names,
// env vars, config keys and defaults where it has the option. Precedence: command line, then
// environment, then config file, then default. Options of NVIDIA's plugin that this one does not
// support are refused by name with the reason, unless their value asks for nothing (e.g.
// --gds-enabled=false), so they are never silently ignored.
import { DEVICE_LIST_STRATEGIES, DEFAULT_CDI_ANNOTATION_PREFIX } from '../core/allocate.ts';
import type { DeviceListStrategy } from '../core/allocate.ts';
import { DEVICE_ID_STRATEGIES } from '../core/devices.ts';
import { IMEX_ALLOWED_CHANNEL_IDS } from '../core/imex.ts';
import { mpsOptionsProblem } from '../core/mps.ts';
import type { DeviceIdStrategy } from '../core/devices.ts';
import { NO_SHARING, SHARED_ALLOCATION_POLICIES } from '../core/sharing.ts';
import type { SharedAllocationPolicy, Sharing } from '../core/sharing.ts';
import { LOG_LEVELS } from '../system/log.ts';
import type { LogLevel } from '../system/log.ts';
import { ConfigError, OptionError, readConfigFile } from './config.ts';
import type { ConfigFileValues, ConfigSchema, ConfigShape } from './config.ts';
import { DURATION_GRAMMAR, describeRange, parseSeconds } from './duration.ts';
import { hostname } from 'node:os';

export { OptionError } from './config.ts';
export { DURATION_GRAMMAR, describeRange, parseSeconds } from './duration.ts';

export type { MigStrategy } from '../core/mig.ts';
import { MIG_STRATEGIES } from '../core/mig.ts';
import type { MigStrategy } from '../core/mig.ts';

export interface Options {
  kubeletSocket: string;
  driverRoot: string;
  /** Root of the device nodes on the host; defaults to the driver root, as in NVIDIA's plugin. */
  devRoot: string;
  deviceIdStrategy: DeviceIdStrategy;
  /** One or more; default ['envvar']. */
  deviceListStrategy: readonly DeviceListStrategy[];
  passDeviceSpecs: boolean;
  cdiAnnotationPrefix: string;
  /** none: MIG ignored; single: MIG devices as nvidia.com/gpu; mixed: nvidia.com/mig-<profile>. */
  migStrategy: MigStrategy;
  /** How replicas are picked for GetPreferredAllocation. */
  sharedDevicesAllocationPolicy: SharedAllocationPolicy;
  failOnInitError: boolean;
  /** The config file read, or null. */
  configFile: string | null;
  logLevel: LogLevel;
  /** Seconds between checks that our socket is still ours (inotify can miss events). */
  socketCheckInterval: number;
  /** Seconds between the per-GPU NVML probes that find GPUs fallen off the bus. */
  healthProbeInterval: number;
  /** Let a GPU marked unhealthy by an XID become healthy again after a quiet period (NVIDIA: never). */
  healthRecovery: boolean;
  /** Seconds a GPU must answer NVML normally, with no new critical XID, before it recovers. */
  healthRecoveryQuietPeriod: number;
  /** IMEX channels given to every container: none or [0] (NVIDIA's --imex-channel-ids). */
  imexChannelIds: readonly number[];
  /** A configured IMEX channel that is missing stops the start instead of being skipped. */
  imexRequired: boolean;
  /** NFD local feature file the node labels are written to, or null (off). */
  nfdFeaturesFile: string | null;
  /** Remove the feature file on a clean stop (default: keep it, so a restart does not make labels flap). */
  nfdRemoveOnStop: boolean;
  /** node_exporter textfile the metrics are written to, or null (off). */
  metricsFile: string | null;
  /** Seconds between metrics file writes (a health change writes at once). */
  metricsInterval: number;
  /** The kubelet's PodResources socket, asked by `info` which pod holds which device. */
  podResourcesSocket: string;
  /** Seconds between cheap checks whether the node's GPUs changed (a full scan when they did); 0: off. */
  rediscoverInterval: number;
  /** Host directory of the MPS control daemons (core/mps.ts layout); '' when not set (MPS then refused). */
  mpsRoot: string;
  // ---- DRA (issue 21): which kubelet API serves the GPUs, and what the DRA mode needs ----
  /** device-plugin (the kubelet's device-plugin API) or dra (Dynamic Resource Allocation); one per node. */
  kubeletApi: KubeletApi;
  /** Kubeconfig the DRA mode talks to the API server with, or null (none: the DRA mode refuses to start). */
  kubeconfig: string | null;
  /** This node's name in the cluster (ResourceSlices' spec.nodeName); default the host name, lower case. */
  nodeName: string;
  /** The DRA driver name (DeviceClasses select it; ResourceSlices' spec.driver). */
  draDriverName: string;
  /** The kubelet's plugin watcher directory: <driver>-reg.sock goes there. */
  kubeletPluginsRegistry: string;
  /** The kubelet's plugins directory: <driver>/dra.sock and the checkpoint go under it. */
  kubeletPluginsDir: string;
}

/** The kubelet APIs a node may be served through (issue 21); one per node, never both. */
export type KubeletApi = 'device-plugin' | 'dra';
export const KUBELET_APIS: readonly KubeletApi[] = ['device-plugin', 'dra'];
export const DEFAULT_DRA_DRIVER_NAME = 'gpu.nvidia.com';

export type OptionKey = keyof Options;
/** Where a value came from: `config file /etc/...` names the file. */
export type Origin = 'command line' | 'environment' | 'default' | `config file ${string}`;

type Kind =
  /** With `empty`, an empty value is allowed and means "not set" (NVIDIA's default for the option). */
  | { type: 'string'; path?: boolean; empty?: boolean; name?: NameRule }
  | { type: 'bool' }
  /**
   * One of `values`; with `multiple`, a comma-separated list of them (the flag may also be repeated).
   * Values in `unsupported` are NVIDIA's but refused here, with the reason given.
   */
  | { type: 'enum'; values: readonly string[]; multiple?: boolean; unsupported?: Readonly<Record<string, string>> }
  /** A duration (see parseSeconds), in seconds from min to max; fractions allowed. */
  | { type: 'seconds'; min: number; max: number; zeroMeansOff?: boolean }
  /** A comma-separated list of integers, each one of `allowed`; empty for none. */
  | { type: 'ids'; allowed: readonly number[] };

/** A Kubernetes object name rule for a string option: a DNS subdomain of at most `max` characters. */
export interface NameRule {
  readonly max: number;
  readonly what: string;
}

export interface OptionSpec {
  key: OptionKey;
  flag: string;
  /** Other names of the flag (NVIDIA's older names). */
  aliases?: readonly string[];
  env: string;
  /** Key path in the config file, or absent when the file cannot set it. */
  config?: string;
  /** The default as text, or null when it is derived from another option or there is none. */
  default: string | null;
  kind: Kind;
  help: string;
}

export const OPTION_SPECS: readonly OptionSpec[] = [
  {
    key: 'kubeletSocket',
    flag: 'kubelet-socket',
    env: 'KUBELET_SOCKET',
    config: 'flags.plugin.kubeletSocket',
    default: '/var/lib/kubelet/device-plugins/kubelet.sock',
    kind: { type: 'string', path: true },
    help: "the kubelet's registration socket; the plugin's own sockets go in the same directory",
  },
  {
    key: 'driverRoot',
    flag: 'driver-root',
    aliases: ['nvidia-driver-root'],
    env: 'NVIDIA_DRIVER_ROOT',
    config: 'flags.nvidiaDriverRoot',
    default: '/',
    kind: { type: 'string', path: true },
    help: 'root under which the NVIDIA driver is installed (its libnvidia-ml.so.1 is looked for there first)',
  },
  {
    key: 'devRoot',
    flag: 'dev-root',
    aliases: ['nvidia-dev-root'],
    env: 'NVIDIA_DEV_ROOT',
    config: 'flags.nvidiaDevRoot',
    default: null,
    kind: { type: 'string', path: true },
    help: 'root under which the NVIDIA device nodes live on the host (default: the driver root)',
  },
  {
    key: 'deviceIdStrategy',
    flag: 'device-id-strategy',
    env: 'DEVICE_ID_STRATEGY',
    config: 'flags.plugin.deviceIDStrategy',
    default: 'uuid',
    kind: { type: 'enum', values: DEVICE_ID_STRATEGIES },
    help: 'how GPUs are named to the kubelet and the container runtime',
  },
  {
    key: 'deviceListStrategy',
    flag: 'device-list-strategy',
    env: 'DEVICE_LIST_STRATEGY',
    config: 'flags.plugin.deviceListStrategy',
    default: 'envvar',
    kind: { type: 'enum', values: DEVICE_LIST_STRATEGIES, multiple: true },
    help: 'how the device list reaches the container runtime; several may be given, comma separated',
  },
  {
    key: 'passDeviceSpecs',
    flag: 'pass-device-specs',
    env: 'PASS_DEVICE_SPECS',
    config: 'flags.plugin.passDeviceSpecs',
    default: 'false',
    kind: { type: 'bool' },
    help: 'also return the NVIDIA device nodes as DeviceSpecs in Allocate',
  },
  {
    key: 'cdiAnnotationPrefix',
    flag: 'cdi-annotation-prefix',
    env: 'CDI_ANNOTATION_PREFIX',
    config: 'flags.plugin.cdiAnnotationPrefix',
    default: DEFAULT_CDI_ANNOTATION_PREFIX,
    kind: { type: 'string' },
    help: 'prefix of the CDI annotation key (device-list strategy cdi-annotations)',
  },
  {
    key: 'migStrategy',
    flag: 'mig-strategy',
    env: 'MIG_STRATEGY',
    config: 'flags.migStrategy',
    default: 'none',
    kind: { type: 'enum', values: MIG_STRATEGIES },
    help: 'how MIG devices are exposed: none (GPUs whole), single (MIG devices as nvidia.com/gpu), mixed (nvidia.com/mig-<profile>)',
  },
  {
    key: 'sharedDevicesAllocationPolicy',
    flag: 'shared-devices-allocation-policy',
    env: 'SHARED_DEVICES_ALLOCATION_POLICY',
    config: 'flags.plugin.sharedDevicesAllocationPolicy',
    default: 'distributed',
    kind: { type: 'enum', values: SHARED_ALLOCATION_POLICIES },
    help: 'how time-sliced replicas are preferred: distributed spreads them over the GPUs, packed fills one GPU before the next',
  },
  {
    key: 'failOnInitError',
    flag: 'fail-on-init-error',
    env: 'FAIL_ON_INIT_ERROR',
    config: 'flags.failOnInitError',
    default: 'true',
    kind: { type: 'bool' },
    help: 'exit when NVML cannot be loaded or initialised; false keeps running and retries',
  },
  {
    key: 'configFile',
    flag: 'config-file',
    env: 'CONFIG_FILE',
    default: null,
    kind: { type: 'string', path: true },
    help: "config file in NVIDIA's v1 format (YAML or JSON): flags, and sharing.timeSlicing or sharing.mps; none by default; SIGHUP re-reads it",
  },
  {
    key: 'logLevel',
    flag: 'log-level',
    env: 'LOG_LEVEL',
    config: 'flags.logLevel',
    default: 'info',
    kind: { type: 'enum', values: LOG_LEVELS },
    help: 'least severe log level written to stderr',
  },
  {
    key: 'socketCheckInterval',
    flag: 'socket-check-interval',
    env: 'SOCKET_CHECK_INTERVAL',
    config: 'flags.socketCheckInterval',
    default: '5',
    kind: { type: 'seconds', min: 0.1, max: 3600 },
    help: 'seconds between checks that the plugin socket still exists and is ours',
  },
  {
    key: 'healthProbeInterval',
    flag: 'health-probe-interval',
    env: 'HEALTH_PROBE_INTERVAL',
    config: 'flags.healthProbeInterval',
    default: '5',
    kind: { type: 'seconds', min: 0.05, max: 3600 },
    help: 'seconds between NVML probes of each GPU; a GPU that answers GPU_IS_LOST is marked unhealthy',
  },
  {
    key: 'healthRecovery',
    flag: 'health-recovery',
    env: 'HEALTH_RECOVERY',
    config: 'flags.healthRecovery',
    default: 'false',
    kind: { type: 'bool' },
    help: "let a GPU made unhealthy by an XID recover after the quiet period (NVIDIA's plugin never does; lost GPUs never recover)",
  },
  {
    key: 'healthRecoveryQuietPeriod',
    flag: 'health-recovery-quiet-period',
    env: 'HEALTH_RECOVERY_QUIET_PERIOD',
    config: 'flags.healthRecoveryQuietPeriod',
    default: '300',
    kind: { type: 'seconds', min: 0.05, max: 86400 },
    help: 'seconds of normal NVML answers with no new critical XID before a GPU recovers (with --health-recovery)',
  },
  {
    key: 'imexChannelIds',
    flag: 'imex-channel-ids',
    env: 'IMEX_CHANNEL_IDS',
    config: 'imex.channelIDs',
    default: '',
    kind: { type: 'ids', allowed: IMEX_ALLOWED_CHANNEL_IDS },
    help: 'IMEX channels given to every container (multi-node NVLink): none, or 0; a channel whose /dev/nvidia-caps-imex-channels/channel<N> is missing is skipped with a warning',
  },
  {
    key: 'imexRequired',
    flag: 'imex-required',
    env: 'IMEX_REQUIRED',
    config: 'imex.required',
    default: 'false',
    kind: { type: 'bool' },
    help: 'a missing channel of --imex-channel-ids stops the start instead of being skipped',
  },
  {
    key: 'nfdFeaturesFile',
    flag: 'nfd-features-file',
    env: 'NFD_FEATURES_FILE',
    config: 'flags.nfdFeaturesFile',
    default: null,
    kind: { type: 'string', path: true },
    help: "write GPU Feature Discovery's node labels to this Node Feature Discovery local feature file, usually /etc/kubernetes/node-feature-discovery/features.d/gpu-device-plugin (default: off)",
  },
  {
    key: 'nfdRemoveOnStop',
    flag: 'nfd-remove-on-stop',
    env: 'NFD_REMOVE_ON_STOP',
    config: 'flags.nfdRemoveOnStop',
    default: 'false',
    kind: { type: 'bool' },
    help: 'remove the feature file on a clean stop; by default it stays, so that a restart does not make the labels flap',
  },
  {
    key: 'metricsFile',
    flag: 'metrics-file',
    env: 'METRICS_FILE',
    config: 'flags.metricsFile',
    default: null,
    kind: { type: 'string', path: true },
    help: "write Prometheus metrics to this file for node_exporter's textfile collector, usually /var/lib/prometheus/node-exporter/gpu-device-plugin.prom (default: off)",
  },
  {
    key: 'metricsInterval',
    flag: 'metrics-interval',
    env: 'METRICS_INTERVAL',
    config: 'flags.metricsInterval',
    default: '15',
    kind: { type: 'seconds', min: 1, max: 3600 },
    help: 'seconds between writes of the metrics file; a change of GPU health writes it at once',
  },
  {
    key: 'podResourcesSocket',
    flag: 'pod-resources-socket',
    env: 'POD_RESOURCES_SOCKET',
    config: 'flags.podResourcesSocket',
    default: '/var/lib/kubelet/pod-resources/kubelet.sock',
    kind: { type: 'string', path: true },
    help: "the kubelet's PodResources socket, which `gpu-device-plugin info` asks which pod holds which GPU",
  },
  {
    key: 'rediscoverInterval',
    flag: 'rediscover-interval',
    env: 'REDISCOVER_INTERVAL',
    config: 'flags.rediscoverInterval',
    default: '60',
    kind: { type: 'seconds', min: 0, max: 86400, zeroMeansOff: true },
    help: 'seconds between cheap checks whether GPUs were added, removed or changed MIG mode (a full scan when they were); 0 turns the timer off (SIGHUP still re-discovers)',
  },
  // Empty by default as in NVIDIA's plugin, so that its flags and files carry over unchanged; the
  // package's env file sets MPS_ROOT=/run/nvidia/mps (core/mps.ts DEFAULT_MPS_ROOT, as NVIDIA's chart).
  {
    key: 'mpsRoot',
    flag: 'mps-root',
    env: 'MPS_ROOT',
    config: 'flags.mpsRoot',
    default: '',
    kind: { type: 'string', path: true, empty: true },
    help: "host directory of the MPS control daemons' pipes, logs and shm (sharing.mps needs it; the package's env file sets /run/nvidia/mps); empty: not set",
  },
  // ---- DRA (issue 21). NVIDIA's device plugin has no such options: the names follow its DRA driver's
  // where it has one (KUBECONFIG, NODE_NAME), the rest the style above; the config keys sit in flags.
  {
    key: 'kubeletApi',
    flag: 'kubelet-api',
    env: 'KUBELET_API',
    config: 'flags.kubeletApi',
    default: 'device-plugin',
    kind: { type: 'enum', values: KUBELET_APIS },
    help: "which kubelet API serves this node's GPUs: device-plugin (nvidia.com/gpu through the device-plugin API) or dra (Dynamic Resource Allocation: ResourceSlices and the kubelet's DRA plugin API; needs --kubeconfig, the DRA sandbox drop-in and RBAC, see README). One per node; switching is a restart",
  },
  {
    key: 'kubeconfig',
    flag: 'kubeconfig',
    env: 'KUBECONFIG',
    config: 'flags.kubeconfig',
    default: null,
    kind: { type: 'string', path: true },
    help: "kubeconfig file with this node's own credentials for the API server (--kubelet-api=dra only, where it is required; none by default; one file, not a list), usually /etc/gpu-device-plugin/kubeconfig",
  },
  {
    key: 'nodeName',
    flag: 'node-name',
    env: 'NODE_NAME',
    config: 'flags.nodeName',
    default: null,
    kind: {
      type: 'string',
      name: { max: 253, what: 'a node name (a DNS subdomain: lower-case letters, digits, "-" and ".")' },
    },
    help: "this node's name in the cluster, as the kubelet registered it (--kubelet-api=dra; default the host name in lower case, as the kubelet's)",
  },
  {
    key: 'draDriverName',
    flag: 'dra-driver-name',
    env: 'DRA_DRIVER_NAME',
    config: 'flags.draDriverName',
    default: DEFAULT_DRA_DRIVER_NAME,
    kind: { type: 'string', name: { max: 63, what: 'a driver name (a DNS subdomain of at most 63 characters)' } },
    help: "the DRA driver name DeviceClasses select (--kubelet-api=dra); the default is NVIDIA's DRA driver's, so its DeviceClasses and claims keep working",
  },
  {
    key: 'kubeletPluginsRegistry',
    flag: 'kubelet-plugins-registry',
    env: 'KUBELET_PLUGINS_REGISTRY',
    config: 'flags.kubeletPluginsRegistry',
    default: '/var/lib/kubelet/plugins_registry',
    kind: { type: 'string', path: true },
    help: "the kubelet's plugin watcher directory, where the registration socket <driver>-reg.sock goes (--kubelet-api=dra)",
  },
  {
    key: 'kubeletPluginsDir',
    flag: 'kubelet-plugins-dir',
    env: 'KUBELET_PLUGINS_DIR',
    config: 'flags.kubeletPluginsDir',
    default: '/var/lib/kubelet/plugins',
    kind: { type: 'string', path: true },
    help: "the kubelet's plugins directory: the DRA socket and the checkpoint go in <dir>/<driver> (--kubelet-api=dra)",
  },
];

/** An option of NVIDIA's plugin that this plugin does not have. */
export interface UnsupportedOption {
  flag: string;
  aliases: readonly string[];
  envs: readonly string[];
  /** Its key path in NVIDIA's config file, if it has one. */
  config: string | null;
  bool: boolean;
  /** Values that ask for nothing this plugin lacks (NVIDIA's default or off): accepted. */
  inert: readonly string[];
  reason: string;
}

const NO_CDI_SPECS =
  'this plugin does not write CDI specs; generate them with `nvidia-ctk cdi generate` (vendor k8s.device-plugin.nvidia.com, class gpu)';

export const UNSUPPORTED_OPTIONS: readonly UnsupportedOption[] = [
  {
    flag: 'gds-enabled',
    aliases: [],
    envs: ['GDS_ENABLED'],
    config: 'flags.gdsEnabled',
    bool: true,
    inert: ['false'],
    reason:
      'GPUDirect Storage is not requested for containers by this plugin (set NVIDIA_GDS=enabled in the pod instead)',
  },
  {
    flag: 'mofed-enabled',
    aliases: [],
    envs: ['MOFED_ENABLED'],
    config: 'flags.mofedEnabled',
    bool: true,
    inert: ['false'],
    reason: 'MOFED is not requested for containers by this plugin (set NVIDIA_MOFED=enabled in the pod instead)',
  },
  {
    flag: 'gdrcopy-enabled',
    aliases: [],
    envs: ['GDRCOPY_ENABLED'],
    config: 'flags.gdrcopyEnabled',
    bool: true,
    inert: ['false'],
    reason: 'GDRCopy is not requested for containers by this plugin (set NVIDIA_GDRCOPY=enabled in the pod instead)',
  },
  {
    flag: 'device-discovery-strategy',
    aliases: [],
    envs: ['DEVICE_DISCOVERY_STRATEGY'],
    config: 'flags.deviceDiscoveryStrategy',
    bool: false,
    inert: ['auto', 'nvml'],
    reason: 'GPUs are always found through NVML here (auto and nvml are accepted; tegra is not)',
  },
  {
    flag: 'nvidia-cdi-hook-path',
    aliases: ['nvidia-ctk-path'],
    envs: ['NVIDIA_CDI_HOOK_PATH', 'NVIDIA_CTK_PATH'],
    config: 'flags.plugin.nvidiaCTKPath',
    bool: false,
    inert: ['/usr/bin/nvidia-ctk'],
    reason: NO_CDI_SPECS,
  },
  {
    flag: 'driver-root-ctr-path',
    aliases: ['container-driver-root'],
    envs: ['DRIVER_ROOT_CTR_PATH', 'CONTAINER_DRIVER_ROOT'],
    config: 'flags.plugin.containerDriverRoot',
    bool: false,
    inert: ['/driver-root'],
    reason: NO_CDI_SPECS,
  },
  {
    flag: 'cdi-feature-flags',
    aliases: [],
    envs: ['CDI_FEATURE_FLAGS'],
    config: 'flags.plugin.cdiFeatureFlags',
    bool: false,
    inert: [''],
    reason: NO_CDI_SPECS,
  },
];

/** Keys of NVIDIA's config file read by GPU feature discovery, not by a device plugin. */
const GFD_KEYS = ['flags.gfd', 'flags.useNodeFeatureAPI'];

function shapeOf(spec: OptionSpec): ConfigShape {
  switch (spec.kind.type) {
    case 'bool':
      return 'bool';
    case 'seconds':
      return 'number';
    case 'ids':
      return 'ints';
    case 'enum':
      return spec.kind.multiple === true ? 'strings' : 'string';
    case 'string':
      return 'string';
  }
}

function isInert(u: UnsupportedOption, raw: string): boolean {
  if (u.bool) return FALSE.has(raw.toLowerCase());
  return u.inert.includes(raw);
}

/** The config file's keys, from the tables above. */
export const CONFIG_SCHEMA: ConfigSchema<OptionKey> = {
  options: OPTION_SPECS.flatMap((s) =>
    s.config === undefined ? [] : [{ path: s.config, key: s.key, shape: shapeOf(s) }],
  ),
  unsupported: UNSUPPORTED_OPTIONS.flatMap((u) =>
    u.config === null
      ? []
      : [
          {
            path: u.config,
            shape: u.bool ? ('bool' as const) : ('string' as const),
            flag: u.flag,
            inert: (raw: string) => isInert(u, raw),
            reason: u.reason,
          },
        ],
  ),
  foreign: GFD_KEYS.map((path) => ({ path, reader: 'GPU feature discovery' })),
};

const TRUE = new Set(['true', '1', 'yes', 'on', 't']);
const FALSE = new Set(['false', '0', 'no', 'off', 'f']);

type Value = string | boolean | number | readonly string[] | readonly number[];

function convert(spec: OptionSpec, raw: string, where: string): Value {
  const k = spec.kind;
  switch (k.type) {
    case 'string':
      if (raw.length === 0 && k.empty === true) return raw;
      if (raw.length === 0)
        throw new OptionError(`${where}: an empty value is not allowed; expected ${k.path ? 'a path' : 'a value'}`);
      if (k.path && !raw.startsWith('/'))
        throw new OptionError(
          `${where}: ${JSON.stringify(raw)} is not an absolute path; expected a path starting with /`,
        );
      if (k.name !== undefined) {
        const why = dnsSubdomainProblem(raw, k.name.max);
        if (why !== null) throw new OptionError(`${where}: ${JSON.stringify(raw)} is not ${k.name.what}: ${why}`);
      }
      return raw;
    case 'bool': {
      const v = raw.toLowerCase();
      if (TRUE.has(v)) return true;
      if (FALSE.has(v)) return false;
      throw new OptionError(`${where}: ${JSON.stringify(raw)} is not a boolean; expected true or false`);
    }
    case 'enum': {
      const one = (v: string): string => {
        const why = k.unsupported?.[v];
        if (why !== undefined) throw new OptionError(`${where}: ${JSON.stringify(v)} is not supported: ${why}`);
        if (!k.values.includes(v)) {
          const shown =
            k.multiple === true && v !== raw ? `${JSON.stringify(v)} (in ${JSON.stringify(raw)})` : JSON.stringify(v);
          throw new OptionError(
            `${where}: ${shown} is not allowed; expected ${k.multiple === true ? 'one or more of' : 'one of'} ${k.values.join(', ')}`,
          );
        }
        return v;
      };
      if (k.multiple !== true) return one(raw);
      const parts = raw.split(',').map((p) => p.trim());
      if (parts.some((p) => p === ''))
        throw new OptionError(
          `${where}: ${JSON.stringify(raw)} has an empty entry; expected one or more of ${k.values.join(', ')}, comma separated`,
        );
      return [...new Set(parts.map(one))];
    }
    case 'seconds': {
      const n = parseSeconds(raw);
      if (n === null) {
        throw new OptionError(
          `${where}: ${JSON.stringify(raw)} is not a duration; expected ${DURATION_GRAMMAR}, ${describeRange(k)}`,
        );
      }
      if (n < k.min || n > k.max)
        throw new OptionError(
          `${where}: ${JSON.stringify(raw)}${String(n) === raw ? '' : ` (${n} seconds)`} is out of range; expected ${describeRange(k)}`,
        );
      return n;
    }
    case 'ids': {
      if (raw.trim() === '') return [];
      const ids = raw.split(',').map((p) => p.trim());
      const allowed = `only ${k.allowed.map((a) => `[${a}]`).join(', ')} or none (empty) ${k.allowed.length === 1 ? 'is' : 'are'} supported, as in NVIDIA's plugin`;
      for (const id of ids) {
        if (!/^\d+$/.test(id) || !k.allowed.includes(Number(id)))
          throw new OptionError(`${where}: ${JSON.stringify(raw)} is not allowed; ${allowed}`);
      }
      return [...new Set(ids.map(Number))];
    }
  }
}

export interface ParsedOptions {
  options: Options;
  origins: Record<OptionKey, Origin>;
  /** Time-slicing from the config file (none without one). */
  sharing: Sharing;
  /** Config file keys present but meant for another program (GPU feature discovery). */
  foreignConfigKeys: readonly string[];
}

export interface ParseDeps {
  /** Reads the config file (default: the file system). */
  readFile?: (path: string) => string;
  /** The host name, the default of --node-name (default: os.hostname()). */
  hostname?: () => string;
}

function refuseUnsupported(u: UnsupportedOption, raw: string, where: string): void {
  if (!isInert(u, raw)) {
    throw new OptionError(`${where}: not supported by this plugin (NVIDIA's --${u.flag}): ${u.reason}`);
  }
}

/** The options and refused options by every flag name and alias they answer to. */
type FlagIndex = { byFlag: Map<string, OptionSpec>; unsupportedByFlag: Map<string, UnsupportedOption> };

function indexFlags(): FlagIndex {
  const byFlag = new Map<string, OptionSpec>();
  for (const s of OPTION_SPECS) {
    byFlag.set(s.flag, s);
    for (const a of s.aliases ?? []) byFlag.set(a, s);
  }
  const unsupportedByFlag = new Map<string, UnsupportedOption>();
  for (const u of UNSUPPORTED_OPTIONS) for (const f of [u.flag, ...u.aliases]) unsupportedByFlag.set(f, u);
  return { byFlag, unsupportedByFlag };
}

/**
 * The command line's option values by key (`--name value`, `--name=value`, bare `--bool-flag`);
 * refused options are checked and skipped. A list flag may be repeated, adding to the list.
 */
function readFlags(argv: readonly string[], index: FlagIndex): Map<OptionKey, Value> {
  const fromFlags = new Map<OptionKey, Value>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? '';
    if (arg === 'info' || arg === 'check') {
      throw new OptionError(
        `the subcommand ${arg} goes first, before its options: gpu-device-plugin ${arg} ${argv.filter((_, j) => j !== i).join(' ')}`.trimEnd(),
      );
    }
    if (!arg.startsWith('--'))
      throw new OptionError(
        `unexpected argument ${JSON.stringify(arg)}; options are written --name=value (see --help)`,
      );
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    const spec = index.byFlag.get(name);
    const unsupported = index.unsupportedByFlag.get(name);
    if (spec === undefined && unsupported === undefined)
      throw new OptionError(`unknown option --${name}; see --help for the options this plugin has`);
    const isBool = spec === undefined ? unsupported?.bool === true : spec.kind.type === 'bool';
    let raw: string;
    if (eq >= 0) raw = arg.slice(eq + 1);
    else if (isBool && (argv[i + 1] === undefined || argv[i + 1]?.startsWith('--'))) raw = 'true';
    else {
      const next = argv[i + 1];
      if (next === undefined) throw new OptionError(`--${name} needs a value`);
      raw = next;
      i++;
    }
    if (spec === undefined) {
      if (unsupported !== undefined) refuseUnsupported(unsupported, raw, `--${name}`);
      continue;
    }
    addFlagValue(fromFlags, spec, convert(spec, raw, `--${name}`), name);
  }
  return fromFlags;
}

/** Records a flag's value; a list flag may be repeated (as NVIDIA's), adding to the list; any other only once. */
function addFlagValue(fromFlags: Map<OptionKey, Value>, spec: OptionSpec, value: Value, name: string): void {
  const earlier = fromFlags.get(spec.key);
  if (earlier !== undefined) {
    if (Array.isArray(earlier) && Array.isArray(value))
      fromFlags.set(spec.key, [...new Set([...(earlier as string[]), ...(value as string[])])]);
    else throw new OptionError(`--${name} is given more than once`);
  } else fromFlags.set(spec.key, value);
}

/** Refuses NVIDIA's options this plugin does not have when set (to anything not inert) in the environment. */
function refuseUnsupportedEnv(env: Readonly<Record<string, string | undefined>>): void {
  for (const u of UNSUPPORTED_OPTIONS) {
    for (const e of u.envs) {
      const v = env[e];
      if (v !== undefined && v !== '') refuseUnsupported(u, v, `environment variable ${e}`);
    }
  }
}

/** Reads the config file, named on the command line or in the environment (never in itself); undefined without one. */
function readNamedConfigFile(
  fromFlags: ReadonlyMap<OptionKey, Value>,
  env: Readonly<Record<string, string | undefined>>,
  deps: ParseDeps,
): ConfigFileValues<OptionKey> | undefined {
  const fileSpec = OPTION_SPECS.find((s) => s.key === 'configFile') as OptionSpec;
  let configFile: string | null = null;
  const flagFile = fromFlags.get('configFile');
  const envFile = env[fileSpec.env];
  if (typeof flagFile === 'string') configFile = flagFile;
  else if (envFile !== undefined && envFile !== '')
    configFile = convert(fileSpec, envFile, `environment variable ${fileSpec.env}`) as string;
  return configFile === null ? undefined : readConfigFile(configFile, CONFIG_SCHEMA, deps.readFile);
}

/** One option's value (undefined: none, no default) and where it came from: command line, environment, config file, default. */
function resolveOne(
  spec: OptionSpec,
  fromFlags: ReadonlyMap<OptionKey, Value>,
  env: Readonly<Record<string, string | undefined>>,
  file: ConfigFileValues<OptionKey> | undefined,
): { value: Value | undefined; origin: Origin } {
  const flagValue = fromFlags.get(spec.key);
  const envValue = env[spec.env];
  const fileValue = file?.values.get(spec.key);
  if (flagValue !== undefined) return { value: flagValue, origin: 'command line' };
  if (envValue !== undefined && envValue !== '') {
    return { value: convert(spec, envValue, `environment variable ${spec.env}`), origin: 'environment' };
  }
  if (file !== undefined && fileValue !== undefined) {
    try {
      return {
        value: convert(spec, fileValue.raw, `config file ${file.file}: ${fileValue.path}`),
        origin: `config file ${file.file}`,
      };
    } catch (err) {
      throw err instanceof OptionError ? new ConfigError(err.message) : err;
    }
  }
  if (spec.default !== null)
    return { value: convert(spec, spec.default, `default of --${spec.flag}`), origin: 'default' };
  return { value: undefined, origin: 'default' };
}

/**
 * Resolves every option: flags (`--name value`, `--name=value`, bare `--bool-flag`), then env vars,
 * then the config file named by --config-file or CONFIG_FILE (read here), then defaults.
 * Throws OptionError (ConfigError for the file) naming the flag, variable or key path at fault.
 */
export function parseOptions(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
  deps: ParseDeps = {},
): ParsedOptions {
  const fromFlags = readFlags(argv, indexFlags());
  refuseUnsupportedEnv(env);
  const file = readNamedConfigFile(fromFlags, env, deps);

  const values: Partial<Record<OptionKey, Value | null>> = {};
  const origins = {} as Record<OptionKey, Origin>;
  for (const spec of OPTION_SPECS) {
    const { value, origin } = resolveOne(spec, fromFlags, env, file);
    if (value !== undefined) values[spec.key] = value;
    origins[spec.key] = origin;
  }
  if (values.devRoot === undefined) values.devRoot = values.driverRoot ?? '/';
  if (values.configFile === undefined) values.configFile = null;
  if (values.nfdFeaturesFile === undefined) values.nfdFeaturesFile = null;
  if (values.metricsFile === undefined) values.metricsFile = null;
  if (values.kubeconfig === undefined) values.kubeconfig = null;
  if (values.nodeName === undefined) values.nodeName = (deps.hostname ?? hostname)().toLowerCase();
  const options = values as Options;
  const sharing = file?.sharing ?? NO_SHARING;
  // MPS's refusals that need no GPU (NVIDIA's validateFlags): checked here, before NVML, exit 2.
  const mps = mpsOptionsProblem(sharing, options);
  if (mps !== null) {
    if (mps.key.startsWith('sharing.') && file !== undefined)
      throw new ConfigError(`config file ${file.file}: ${mps.key}: ${mps.message}`);
    throw new OptionError(`${mps.key}: ${mps.message}`);
  }
  const parsed: ParsedOptions = {
    options,
    origins,
    sharing,
    foreignConfigKeys: file?.foreign ?? [],
  };
  checkKubeletApi(parsed);
  return parsed;
}

// ---- DRA (issue 21): names and the one-mode-per-node rules ----

/** Why `name` is not a DNS subdomain (RFC 1123) of at most `max` characters, or null when it is one. */
export function dnsSubdomainProblem(name: string, max: number): string | null {
  if (name.length > max) return `${name.length} characters, at most ${max} allowed`;
  for (const label of name.split('.')) {
    if (label === '') return 'an empty part between dots (or a leading or trailing dot)';
    if (label.length > 63) return `the part ${JSON.stringify(label)} is longer than 63 characters`;
    if (!/^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/.test(label))
      return `the part ${JSON.stringify(label)} has characters other than lower-case letters, digits and "-" inside, or does not start and end with a letter or digit`;
  }
  return null;
}

/**
 * Options of the device-plugin mode that change what containers get, refused in DRA mode when set
 * (not at their default): DRA hands the runtime CDI device IDs, always, so they would silently do
 * nothing. The ones that only name things (--kubelet-socket, --cdi-annotation-prefix) or only matter
 * with what is refused anyway (--shared-devices-allocation-policy) are left alone, so one environment
 * file can hold both modes' settings and a switch is one line.
 */
export const DEVICE_PLUGIN_ONLY_OPTIONS: readonly OptionKey[] = ['deviceListStrategy', 'passDeviceSpecs'];

function whereSet(parsed: ParsedOptions, key: OptionKey): string {
  const s = OPTION_SPECS.find((x) => x.key === key) as OptionSpec;
  const origin = parsed.origins[key];
  return origin === 'command line'
    ? `--${s.flag}`
    : origin === 'environment'
      ? `${s.env} (environment)`
      : s.config !== undefined
        ? `${s.config} (${origin})`
        : `--${s.flag}`;
}

/**
 * The rules of --kubelet-api=dra, checked once every option is resolved: a kubeconfig, a valid node
 * name, no sharing (time-slicing and MPS replicas are the device-plugin API's; this release does not
 * serve them through DRA), no device-plugin-only option set. Throws OptionError naming what to change.
 */
export function checkKubeletApi(parsed: ParsedOptions): void {
  const o = parsed.options;
  if (o.kubeletApi !== 'dra') return;
  const origin = parsed.origins.kubeletApi;
  const mode =
    origin === 'command line'
      ? '--kubelet-api=dra'
      : origin === 'environment'
        ? 'KUBELET_API=dra'
        : `flags.kubeletApi: dra (${origin})`;
  if (o.kubeconfig === null) {
    throw new OptionError(
      `${mode} needs --kubeconfig (KUBECONFIG): a kubeconfig with this node's credentials for the API server, which the service has no other way to reach; /usr/share/doc/gpu-device-plugin/dra/README.md says how to make one; or keep this node on --kubelet-api=device-plugin`,
    );
  }
  if (parsed.origins.nodeName === 'default') {
    const why = dnsSubdomainProblem(o.nodeName, 253);
    if (why !== null)
      throw new OptionError(
        `${mode}: the host name ${JSON.stringify(o.nodeName)} is not a valid node name (${why}); set --node-name (NODE_NAME) to the name the kubelet registered this node under (kubectl get nodes)`,
      );
  }
  const sharing = parsed.sharing;
  const shared =
    sharing.timeSlicing !== null
      ? 'sharing.timeSlicing'
      : sharing.mps !== undefined && sharing.mps !== null
        ? 'sharing.mps'
        : null;
  if (shared !== null) {
    throw new OptionError(
      `${mode} does not serve shared GPUs: ${shared} in ${o.configFile ?? 'the config file'} gives replicas of nvidia.com/gpu, which this release offers only through the device-plugin API; remove the sharing section (DRA claims may share one GPU among the containers of a pod through one claim) or keep this node on --kubelet-api=device-plugin`,
    );
  }
  const set = DEVICE_PLUGIN_ONLY_OPTIONS.filter((k) => parsed.origins[k] !== 'default');
  if (set.length > 0) {
    throw new OptionError(
      `${mode}: ${set.map((k) => whereSet(parsed, k)).join(', ')} ${set.length === 1 ? 'is' : 'are'} set, but only the device-plugin API uses ${set.length === 1 ? 'it' : 'them'}: in DRA mode containers get their GPUs as the CDI devices of the NVIDIA Container Toolkit's spec, always; remove ${set.length === 1 ? 'that setting' : 'those settings'}, or keep --kubelet-api=device-plugin`,
    );
  }
}

/** parseOptions under the name the issue gave it: options, origins and sharing, config file read. */
export const resolveOptions = parseOptions;

/** Options that a config reload cannot change in a running plugin (they need a restart). */
export const RESTART_ONLY_OPTIONS: readonly OptionKey[] = [
  'kubeletSocket',
  'driverRoot',
  'failOnInitError',
  'configFile',
  'logLevel',
  'socketCheckInterval',
  'healthProbeInterval',
  'healthRecovery',
  'healthRecoveryQuietPeriod',
  'migStrategy',
  // Channels are looked for once, at start.
  'imexChannelIds',
  'imexRequired',
  'nfdFeaturesFile',
  'nfdRemoveOnStop',
  'metricsFile',
  'metricsInterval',
  // The control daemons (a unit of their own) were started under it; containers must get their pipes.
  'mpsRoot',
  // The mode and where it talks: a switch is a restart (issue 21).
  'kubeletApi',
  'kubeconfig',
  'nodeName',
  'draDriverName',
  'kubeletPluginsRegistry',
  'kubeletPluginsDir',
];

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
  for (const s of OPTION_SPECS) {
    const k = s.kind;
    const values =
      k.type === 'enum'
        ? ` (${k.values.filter((v) => k.unsupported?.[v] === undefined).join('|')}${k.multiple === true ? ', comma separated' : ''})`
        : k.type === 'bool'
          ? ' (true|false)'
          : k.type === 'ids'
            ? ` (${k.allowed.join('|')}, or empty for none)`
            : k.type === 'seconds'
              ? ` (duration ${describeRange(k)}; 5, 0.5, 500ms, 30s, 5m, 1h)`
              : '';
    const names = [s.flag, ...(s.aliases ?? [])].map((n) => `--${n}`).join(', ');
    lines.push(`  ${names}${values}`);
    lines.push(`      ${s.help}`);
    lines.push(
      `      env ${s.env}; default ${s.default === '' ? 'empty' : (s.default ?? 'see above')}${s.config === undefined ? '' : `; config file ${s.config}`}`,
    );
  }
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
    '  DP_ENABLE_HEALTHCHECKS   XIDs to treat as critical even when ignored, e.g. 31; wins over DP_DISABLE_HEALTHCHECKS',
    '  SYSFS_ROOT               root of sysfs, for NUMA nodes the driver does not report (default /sys)',
  );
  return `${lines.join('\n')}\n`;
}
