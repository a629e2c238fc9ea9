// What the program's options are: the values in force (Options), where each came from, what parsing
// them gives (ParsedOptions), and the kinds of entry the option table (option-table.ts) is made of.
// NVIDIA's plugin's names, env vars, config keys and defaults are kept where it has the option.
import type { DeviceListStrategy } from '../core/allocate.ts';
import type { DeviceIdStrategy } from '../core/devices.ts';
import type { MigStrategy } from '../core/mig.ts';
import type { ConsumableCapacity } from '../core/dra-capacity.ts';
import type { SignalPolicy } from '../core/health-signals.ts';
import type { SharedAllocationPolicy, Sharing } from '../core/sharing.ts';
import type { LogLevel } from '../system/log.ts';

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
  // ---- DRA: which kubelet API serves the GPUs, and what the DRA mode needs ----
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
  /** Claims the DRA sharing agent lets hold one GPU at once. */
  draMaxClaimsPerGpu: number;
  /** Each DRA MPS claim's shm tmpfs size, in bytes. */
  draMpsShmSize: number;
  /** The sum of every DRA MPS claim's shm tmpfs size, in bytes; null: the host's memory (MemTotal). */
  draMpsShmTotal: number | null;
}

/** The kubelet APIs a node may be served through; one per node, never both. */
export type KubeletApi = 'device-plugin' | 'dra';
export const KUBELET_APIS: readonly KubeletApi[] = ['device-plugin', 'dra'];
export const DEFAULT_DRA_DRIVER_NAME = 'gpu.nvidia.com';

export type OptionKey = keyof Options;
/** Where a value came from: `config file /etc/...` names the file. */
export type Origin = 'command line' | 'environment' | 'default' | `config file ${string}`;

export type Kind =
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
  | { type: 'ids'; allowed: readonly number[] }
  /** A whole number from min to max. */
  | { type: 'count'; min: number; max: number }
  /** A size in bytes written as a Kubernetes quantity (8Gi, 512Mi, 1e9), from min to max bytes. */
  | { type: 'bytes'; min: number; max: number };

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

export interface ParsedOptions {
  options: Options;
  origins: Record<OptionKey, Origin>;
  /** Time-slicing from the config file (none without one). */
  sharing: Sharing;
  /** Config file keys present but meant for another program (GPU feature discovery). */
  foreignConfigKeys: readonly string[];
  /** The config file's `health` section (health-signals.ts); absent: the defaults. */
  signalPolicy?: SignalPolicy;
  /** The config file's `dra.consumableCapacity` (dra-section.ts); absent: off. */
  consumableCapacity?: ConsumableCapacity;
  /** The config file's `dra.dynamicMig` (dra-section.ts); absent: off. */
  dynamicMig?: boolean;
}

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
