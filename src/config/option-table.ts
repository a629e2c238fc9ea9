// The option table: every option's flag, aliases, environment variable, config file key, default,
// kind and help, with NVIDIA's plugin's names where it has the option. Precedence: command line, then
// environment, then config file, then default. The help text, the man page and the packaged
// environment file are generated from it.
import { DEVICE_LIST_STRATEGIES, DEFAULT_CDI_ANNOTATION_PREFIX } from '../core/allocate.ts';
import { DEVICE_ID_STRATEGIES } from '../core/devices.ts';
import { IMEX_ALLOWED_CHANNEL_IDS } from '../core/imex.ts';
import { MIG_STRATEGIES } from '../core/mig.ts';
import { SHARED_ALLOCATION_POLICIES } from '../core/sharing.ts';
import { LOG_LEVELS } from '../system/log.ts';
import { DEFAULT_DRA_DRIVER_NAME, KUBELET_APIS } from './options.ts';
import type { OptionSpec } from './options.ts';

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
    help:
      'how MIG devices are exposed: none (GPUs whole), single (MIG ' +
      'devices as nvidia.com/gpu), mixed (nvidia.com/mig-<profile>)',
  },
  {
    key: 'sharedDevicesAllocationPolicy',
    flag: 'shared-devices-allocation-policy',
    env: 'SHARED_DEVICES_ALLOCATION_POLICY',
    config: 'flags.plugin.sharedDevicesAllocationPolicy',
    default: 'distributed',
    kind: { type: 'enum', values: SHARED_ALLOCATION_POLICIES },
    help:
      'how time-sliced replicas are preferred: distributed spreads ' +
      'them over the GPUs, packed fills one GPU before the next',
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
    help:
      "config file in NVIDIA's v1 format (YAML or JSON): flags, and " +
      'sharing.timeSlicing or sharing.mps; none by default; SIGHUP re-reads it',
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
    help:
      'let a GPU made unhealthy by an XID recover after the quiet ' +
      "period (NVIDIA's plugin never does; lost GPUs never recover)",
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
    help:
      'IMEX channels given to every container (multi-node NVLink): none, or 0; a channel ' +
      'whose /dev/nvidia-caps-imex-channels/channel<N> is missing is skipped with a warning',
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
    help:
      "write GPU Feature Discovery's node labels to this Node Feature Discovery local feature file, " +
      'usually /etc/kubernetes/node-feature-discovery/features.d/gpu-device-plugin (default: off)',
  },
  {
    key: 'nfdRemoveOnStop',
    flag: 'nfd-remove-on-stop',
    env: 'NFD_REMOVE_ON_STOP',
    config: 'flags.nfdRemoveOnStop',
    default: 'false',
    kind: { type: 'bool' },
    help:
      'remove the feature file on a clean stop; by default it ' +
      'stays, so that a restart does not make the labels flap',
  },
  {
    key: 'metricsFile',
    flag: 'metrics-file',
    env: 'METRICS_FILE',
    config: 'flags.metricsFile',
    default: null,
    kind: { type: 'string', path: true },
    help:
      "write Prometheus metrics to this file for node_exporter's textfile collector, " +
      'usually /var/lib/prometheus/node-exporter/gpu-device-plugin.prom (default: off)',
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
    help:
      'seconds between cheap checks whether GPUs were added, removed or changed MIG mode ' +
      '(a full scan when they were); 0 turns the timer off (SIGHUP still re-discovers)',
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
    help:
      "host directory of the MPS control daemons' pipes, logs and shm (sharing.mps " +
      "needs it; the package's env file sets /run/nvidia/mps); empty: not set",
  },
  // ---- DRA. NVIDIA's device plugin has no such options: the names follow its DRA driver's
  // where it has one (KUBECONFIG, NODE_NAME), the rest the style above; the config keys sit in flags.
  {
    key: 'kubeletApi',
    flag: 'kubelet-api',
    env: 'KUBELET_API',
    config: 'flags.kubeletApi',
    default: 'device-plugin',
    kind: { type: 'enum', values: KUBELET_APIS },
    help:
      "which kubelet API serves this node's GPUs: device-plugin (nvidia.com/gpu through the device-plugin " +
      "API) or dra (Dynamic Resource Allocation: ResourceSlices and the kubelet's DRA plugin API; needs " +
      '--kubeconfig, the DRA sandbox drop-in and RBAC, see README). One per node; switching is a restart',
  },
  {
    key: 'kubeconfig',
    flag: 'kubeconfig',
    env: 'KUBECONFIG',
    config: 'flags.kubeconfig',
    default: null,
    kind: { type: 'string', path: true },
    help:
      "kubeconfig file with this node's own credentials for the API server (--kubelet-api=dra only, where " +
      'it is required; none by default; one file, not a list), usually /etc/gpu-device-plugin/kubeconfig',
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
    help:
      "this node's name in the cluster, as the kubelet registered it " +
      "(--kubelet-api=dra; default the host name in lower case, as the kubelet's)",
  },
  {
    key: 'draDriverName',
    flag: 'dra-driver-name',
    env: 'DRA_DRIVER_NAME',
    config: 'flags.draDriverName',
    default: DEFAULT_DRA_DRIVER_NAME,
    kind: { type: 'string', name: { max: 63, what: 'a driver name (a DNS subdomain of at most 63 characters)' } },
    help:
      'the DRA driver name DeviceClasses select (--kubelet-api=dra); the default ' +
      "is NVIDIA's DRA driver's, so its DeviceClasses and claims keep working",
  },
  {
    key: 'kubeletPluginsRegistry',
    flag: 'kubelet-plugins-registry',
    env: 'KUBELET_PLUGINS_REGISTRY',
    config: 'flags.kubeletPluginsRegistry',
    default: '/var/lib/kubelet/plugins_registry',
    kind: { type: 'string', path: true },
    help:
      "the kubelet's plugin watcher directory, where the " +
      'registration socket <driver>-reg.sock goes (--kubelet-api=dra)',
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
  // ---- DRA sharing: what the MPS unit's agent serves at most (README: Security model) ----
  {
    key: 'draMaxClaimsPerGpu',
    flag: 'dra-max-claims-per-gpu',
    env: 'DRA_MAX_CLAIMS_PER_GPU',
    config: 'flags.draMaxClaimsPerGpu',
    default: '48',
    kind: { type: 'count', min: 1, max: 1024 },
    help:
      'claims that may share one GPU at once through the MPS unit (time-slices, MPS daemons, its MIG devices); ' +
      "one more is refused naming this option (--kubelet-api=dra; 48 is MPS's own client limit per GPU)",
  },
  {
    key: 'draMpsShmSize',
    flag: 'dra-mps-shm-size',
    env: 'DRA_MPS_SHM_SIZE',
    config: 'flags.draMpsShmSize',
    default: '8Gi',
    kind: { type: 'bytes', min: 1024 * 1024, max: 2 ** 50 },
    help:
      "the size of each DRA MPS claim's shm tmpfs, its containers' /dev/shm (--kubelet-api=dra); a limit, not " +
      "memory set aside: what is written there counts against the writing pod's memory",
  },
  {
    key: 'draMpsShmTotal',
    flag: 'dra-mps-shm-total',
    env: 'DRA_MPS_SHM_TOTAL',
    config: 'flags.draMpsShmTotal',
    default: null,
    kind: { type: 'bytes', min: 1024 * 1024, max: 2 ** 52 },
    help:
      "the most every DRA MPS claim's shm tmpfs may add up to; a claim past it is refused naming this option " +
      "(--kubelet-api=dra; default the host's memory, MemTotal)",
  },
];
