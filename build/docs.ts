// Operator documentation generated from OPTION_SPECS, the table the program parses its options
// with, so that the packaged environment file and man page list exactly the options the executable
// has: the environment file (/etc/default or /etc/sysconfig) and gpu-device-plugin(8).
import { describeBytes } from '../src/config/option-value.ts';
import { CONFIG_SCHEMA } from '../src/config/parse-options.ts';
import { DURATION_GRAMMAR, describeRange } from '../src/config/duration.ts';
import { OPTION_SPECS } from '../src/config/option-table.ts';
import { UNSUPPORTED_OPTIONS } from '../src/config/unsupported-options.ts';
import type { OptionKey, OptionSpec } from '../src/config/options.ts';

export const UNIT_NAME = 'gpu-device-plugin.service';
export const KUBELET_DEVICE_PLUGIN_DIR = '/var/lib/kubelet/device-plugins';

/** Extra advice for the environment file, where an option interacts with the packaging. */
const ENV_NOTES: Partial<Record<OptionKey, string>> = {
  kubeletSocket:
    `the service may write only in ${KUBELET_DEVICE_PLUGIN_DIR}; for another ` +
    `directory add it to ReadWritePaths= (systemctl edit gpu-device-plugin)`,
  configFile:
    'the service cannot see /home or /root: keep the file under /etc; systemctl reload gpu-device-plugin re-reads it',
  nfdFeaturesFile:
    'the service may write the file only after its directory is added to the ' +
    'sandbox: systemctl edit gpu-device-plugin, then [Service] ' +
    'ReadWritePaths=/etc/kubernetes/node-feature-discovery/features.d (or your directory)',
  metricsFile:
    'the service may write the file only after its directory is added to the sandbox: systemctl edit ' +
    'gpu-device-plugin, then [Service] ReadWritePaths=/var/lib/prometheus/node-exporter (or your directory)',
  kubeletApi:
    'dra also needs KUBECONFIG and the DRA drop-in linked into the unit (network, ' +
    "the kubelet's plugin directories): mkdir -p /etc/systemd/system/gpu-device-plugin.service.d " +
    '&& ln -s /usr/share/gpu-device-plugin/dra.conf ' +
    '/etc/systemd/system/gpu-device-plugin.service.d/dra.conf && systemctl daemon-reload; ' +
    'see /usr/share/doc/gpu-device-plugin/dra/README.md, and run gpu-device-plugin check',
  kubeconfig: 'keep it under /etc, mode 0600: the service cannot see /home or /root',
};

/**
 * Options the packaged service sets to another value than the program's default, in the environment
 * file (uncommented, with the reason). FAIL_ON_INIT_ERROR=false: a service that starts before the
 * driver is loaded (boot order, driver install after the package, a driver upgrade) waits for NVML
 * in one process, retrying with capped backoff and STATUS= saying so, instead of exiting and being
 * restarted by systemd every RestartSec= (about 1 800 failed starts an hour).
 */
export const PACKAGE_SETTINGS: Partial<Record<OptionKey, { value: string; why: string }>> = {
  failOnInitError: {
    value: 'false',
    why:
      'set to false for the service: without a driver yet (boot order, a driver being ' +
      'installed or upgraded) the plugin keeps running and retries NVML with growing pauses ' +
      '(STATUS= says it waits for NVML), instead of exiting and being restarted over and over. ' +
      'With true, a missing driver makes the plugin exit and systemd restart it every 2 s.',
  },
  // NVIDIA's default is empty ("MPS requires a root"), kept by the program for drop-in flags and
  // files; the package runs the MPS control daemon unit, so it names the root both units use.
  mpsRoot: {
    value: '/run/nvidia/mps',
    why:
      'set for the service and the gpu-device-plugin-mps unit, which both read this file: the MPS ' +
      "control daemons' pipes, logs and shm live there (NVIDIA's chart uses the same). Only used when " +
      'the config file has sharing.mps. It wins over flags.mpsRoot in the config file; change it here.',
  },
};

/**
 * What the value looks like, for help texts: `path`, `true|false`, `uuid|index`, `duration, from 1 to 3600 seconds`.
 */
export function valueHint(spec: OptionSpec): string {
  switch (spec.kind.type) {
    case 'string':
      return spec.kind.path ? 'path' : 'value';
    case 'bool':
      return 'true|false';
    case 'enum':
      return spec.kind.values.join('|');
    case 'seconds':
      return `duration, ${describeRange(spec.kind)}`;
    case 'ids':
      return `${spec.kind.allowed.join('|')} (comma separated)`;
    case 'count':
      return `number, from ${spec.kind.min} to ${spec.kind.max}`;
    case 'bytes':
      return `size, ${describeBytes(spec.kind)}`;
  }
}

function oneLine(text: string): string {
  return text.replace(/\s+/g, ' ').trim();
}

/**
 * The environment file read by the unit (EnvironmentFile=): every option's variable, commented out,
 * with its default and one line of help. `path` is where it is installed, named in its header.
 */
export function environmentFile(path: string): string {
  const out: string[] = [
    `# ${path}: options for ${UNIT_NAME}, the Kubernetes device plugin for NVIDIA GPUs.`,
    '#',
    '# systemd reads this file each time the service starts. Every option of the plugin is listed',
    '# below with its default value, commented out, except FAIL_ON_INIT_ERROR and MPS_ROOT, which the',
    '# service sets (the reason is given there). To change one, remove the "#" before its variable, set the value,',
    '# and run: systemctl restart gpu-device-plugin',
    '# Values are taken literally (no shell expansion, no quotes needed); an empty value means the',
    '# default. Package upgrades keep your changes to this file. See gpu-device-plugin(8).',
    `# A duration is ${DURATION_GRAMMAR}.`,
  ];
  for (const spec of OPTION_SPECS) {
    out.push('');
    out.push(`# --${spec.flag} (${valueHint(spec)}): ${oneLine(spec.help)}`);
    const note = ENV_NOTES[spec.key];
    if (note !== undefined) out.push(`# Note: ${oneLine(note)}`);
    const set = PACKAGE_SETTINGS[spec.key];
    if (set === undefined) out.push(`#${spec.env}=${spec.default ?? ''}`);
    else
      out.push(
        `# The program's default ` +
          `is ${spec.default === null || spec.default === '' ? 'none' : spec.default}; ${oneLine(set.why)}`,
        `${spec.env}=${set.value}`,
      );
  }
  return `${out.join('\n')}\n`;
}

/** Text for roff: backslashes and hyphens escaped, no line starting with a control character. */
function roff(text: string): string {
  const escaped = oneLine(text).replace(/\\/g, '\\e').replace(/-/g, '\\-');
  return /^[.']/.test(escaped) ? `\\&${escaped}` : escaped;
}

export interface ManPageInput {
  version: string;
  /** The date printed in the page footer (from SOURCE_DATE_EPOCH, for reproducible builds). */
  date: Date;
  /** Environment files the unit reads, in the order the unit lists them. */
  environmentFiles: readonly string[];
}

/** gpu-device-plugin(8), in man(7) roff. */
export function manPage(input: ManPageInput): string {
  const day = input.date.toISOString().slice(0, 10);
  const l: string[] = [
    `.\\" gpu-device-plugin(8), generated by build/docs.ts from the program's option table.`,
    `.TH GPU\\-DEVICE\\-PLUGIN 8 "${day}" "gpu\\-device\\-plugin ${roff(input.version)}" "System Administration"`,
    '.SH NAME',
    'gpu\\-device\\-plugin \\- Kubernetes device plugin for NVIDIA GPUs',
    ...manSynopsis(),
    '.SH DESCRIPTION',
    '.B gpu\\-device\\-plugin',
    "finds the node's NVIDIA GPUs through NVML (libnvidia\\-ml.so.1), advertises them to the",
    'kubelet as the extended resource',
    '.B nvidia.com/gpu',
    "with their health and NUMA topology, and answers the kubelet's Allocate calls with what the",
    'NVIDIA container runtime needs.',
    "It serves its own socket next to the kubelet's registration socket, registers, and registers",
    'again whenever the kubelet restarts.',
    '.PP',
    'It normally runs as the systemd service',
    `.BR ${UNIT_NAME} ,`,
    'which reads its options from the environment file (see',
    '.BR FILES ).',
    'The service tells systemd when it has registered (Type=notify), sends watchdog keep\\-alives,',
    'and is restarted when it exits or stops answering.',
    '.SH OPTIONS',
    'Each option can be given on the command line, through its environment variable, or (all but',
    '.BR \\-\\-config\\-file )',
    'as a key of the configuration file (see',
    '.BR "CONFIGURATION FILE" );',
    'the command line beats the environment, which beats the file, which beats the default.',
    'Write options as',
    '.BI \\-\\- name = value',
    'or',
    '.BI \\-\\- name " value" \\fR;\\fP',
    'a boolean option given alone means true.',
    `A duration is ${DURATION_GRAMMAR};`,
    'each duration option takes the range given with it.',
  ];
  for (const spec of OPTION_SPECS) {
    l.push('.TP');
    l.push(`.BI \\-\\-${roff(spec.flag)} " ${roff(valueHint(spec))}"`);
    l.push(`${roff(spec.help)}.`);
    l.push('.br');
    const def =
      spec.default === null ? 'as described above' : spec.default === '' ? 'empty' : `\\fI${roff(spec.default)}\\fR`;
    l.push(`Environment variable \\fB${roff(spec.env)}\\fR; default ${def}.`);
  }
  l.push(
    '.TP',
    '.B \\-\\-version',
    'Print the version, the git commit and the Node.js version, and exit.',
    '.TP',
    '.B \\-\\-help',
    'List the options and exit.',
  );
  l.push(
    ...manCommands(),
    ...manConfigFile(),
    ...manEnvironment(),
    ...manSignals(),
    ...manExitStatus(),
    ...manFiles(input),
    ...manSeeAlso(),
  );
  return `${l.join('\n')}\n`;
}

// ---------------------------------------------------------------------------------------------
// The man page's other sections, each in a function of its own (the options loop above and the
// environment file are generated from OPTION_SPECS; these describe the rest of the program).

/** A bold term followed by its paragraph, as a man(7) tagged paragraph. */
function tagged(term: string, ...body: string[]): string[] {
  return ['.TP', term, ...body.map(roff)];
}

/** A name in bold, inline. */
function b(name: string): string {
  return `\\fB${roff(name)}\\fR`;
}

function manSynopsis(): string[] {
  return [
    '.SH SYNOPSIS',
    '.B gpu\\-device\\-plugin',
    '.RI [ options ]',
    '.br',
    '.B gpu\\-device\\-plugin info',
    '.RB [ \\-\\-json ]',
    '.RI [ options ]',
    '.br',
    '.B gpu\\-device\\-plugin check',
    '.RB [ \\-\\-json ]',
    '.RB [ \\-\\-env\\-file',
    '.IR file ]...',
    '.RI [ options ]',
    '.br',
    '.B gpu\\-device\\-plugin',
    '.RB [ info | check ]',
    '.B \\-\\-help',
    '.br',
    '.B gpu\\-device\\-plugin \\-\\-version',
  ];
}

function manCommands(): string[] {
  return [
    '.SH COMMANDS',
    'Without a command the program is the daemon. Two commands look at the node without serving;',
    "both take the daemon's options (so that they judge the configuration the daemon would run) and",
    '.BR \\-\\-help .',
    ...tagged(
      '.B info',
      'What the plugin sees: each GPU (index, UUID, name, memory, ' +
        'bus id, NUMA node, health), its MIG mode and MIG devices,',
      "which namespace/pod/container holds each device (from the kubelet's " +
        'PodResources API on --pod-resources-socket; run it as root),',
      'the configured IMEX channels, the topology matrix and the pair scores the allocator uses.',
      'When the daemon runs, health and registrations are what the ' +
        'daemon reports (its state file in /run/gpu-device-plugin/),',
      'so they are what the kubelet was told; when no daemon runs, ' +
        'info looks at the GPUs through NVML itself and says so.',
    ),
    ...tagged(
      '.B check',
      "Preflight: runs the daemon's own validation of the options, " +
        'the environment and the config file against this node',
      '(the same checks that would stop the start), loads NVML, ' +
        'counts the GPUs, and judges the socket directory and every file',
      'the daemon writes as the service would see them under its ' +
        'sandbox (ReadWritePaths= of the installed unit and its drop-ins).',
      'It reads the environment files the unit reads, so that its ' +
        '"Effective options" are the service\'s, and prints one line',
      'per check (PASS, WARN, FAIL or SKIP) with the fix for each ' +
        'failure, then every option with where its value came from.',
    ),
    ...tagged('.B \\-\\-json', '(info and check) Machine-readable output instead of text; always valid JSON.'),
    ...tagged(
      '.BI \\-\\-env\\-file " file"',
      '(check, repeatable) Read options from this environment file ' +
        "(KEY=value lines, systemd's EnvironmentFile= syntax) as the unit would;",
      "by default the unit's own files (/etc/default/gpu-device-plugin, /etc/sysconfig/gpu-device-plugin) that exist.",
    ),
  ];
}

function manConfigFile(): string[] {
  const l: string[] = [
    '.SH CONFIGURATION FILE',
    '.B \\-\\-config\\-file',
    '(or',
    '.BR CONFIG_FILE )',
    "names a file in NVIDIA's v1 format, YAML (read as YAML 1.1, as NVIDIA's parser does) or JSON, so one",
    "file serves NVIDIA's device plugin and this one.",
    'Keep it under /etc: the service cannot see /home or /root.',
    'An unknown key, a value of the wrong type or out of range, stops the start (exit status 2) naming the key path,',
    'the value and what is allowed;',
    '.B systemctl reload gpu\\-device\\-plugin',
    're\\-reads the file and keeps the running configuration when the new one is refused.',
    'An annotated example is installed as',
    '.IR /usr/share/doc/gpu\\-device\\-plugin/examples/config.yaml .',
    '.PP',
    'Keys read:',
    ...tagged('.B version', 'v1 (may be left out).'),
  ];
  for (const o of CONFIG_SCHEMA.options) {
    const spec = OPTION_SPECS.find((s) => s.key === o.key);
    if (spec === undefined) continue;
    l.push('.TP', `.B ${roff(o.path)}`, `As \\fB\\-\\-${roff(spec.flag)}\\fR.`);
  }
  l.push(
    ...tagged(
      '.B sharing.timeSlicing.renameByDefault',
      'true: advertise the replicas as <resource>.shared (e.g. ' +
        "nvidia.com/gpu.shared) instead of under the resource's own name. Default false.",
    ),
    ...tagged(
      '.B sharing.timeSlicing.failRequestsGreaterThanOne',
      'true: a container asking for more than one replica is refused, with a message saying so. Default false.',
    ),
    ...tagged(
      '.B sharing.timeSlicing.resources[].name',
      'The resource to share: nvidia.com/gpu (or gpu), or a MIG ' +
        'resource of the mixed strategy such as nvidia.com/mig-1g.10gb.',
    ),
    ...tagged(
      '.B sharing.timeSlicing.resources[].replicas',
      'How many containers share each device: an integer from 1 to 1024. ' +
        'Each device is advertised that many times, as <id>::0 ... <id>::N-1.',
    ),
    ...tagged(
      '.B sharing.timeSlicing.resources[].rename',
      "Advertise this entry's replicas under another name (e.g. gpu.small for nvidia.com/gpu.small).",
    ),
    ...tagged(
      '.B sharing.timeSlicing.resources[].devices',
      'Which GPUs are shared: "all" (the default), a count (the first N ' +
        'by index), or a list of GPU indices or UUIDs. Not for MIG resources.',
    ),
    ...tagged(
      '.B sharing.mps',
      "MPS sharing, NVIDIA's way: the keys of sharing.timeSlicing, with " +
        'failRequestsGreaterThanOne true by default, replicas from 2 to 48 (16 on GPUs ' +
        'before Volta, compute capability 7.0), and nvidia.com/gpu (whole GPUs) only.',
      "Needs --mps-root and the gpu-device-plugin-mps unit's control daemons; containers " +
        'get CUDA_MPS_PIPE_DIRECTORY=/mps/<resource>/pipe and the mounts <root>/<resource>/pipe ' +
        'and <root>/shm (as /dev/shm), whatever the device-list strategy.',
      'Refused: together with sharing.timeSlicing, without --mps-root, with --mig-strategy=mixed, ' +
        'on MIG devices or GPUs in MIG mode, and more replicas than a GPU takes MPS clients.',
    ),
    ...tagged(
      '.B dra.consumableCapacity.memory',
      'With --kubelet-api=dra: every whole GPU is published for several claims at once ' +
        '(allowMultipleAllocations), each consuming a share of its memory by this request policy: ' +
        'default (what a claim asking for no amount gets) and either validRange {min, max, step} or ' +
        'validValues (at most 10, ascending), quantities such as 8Gi. Off when absent; ignored in device-plugin mode.',
      'Refused as Kubernetes refuses a requestPolicy (the default outside the range or values, a step of 0, ' +
        "max below min), and when a value, min, max or min + step is more than a GPU's memory.",
    ),
    ...tagged(
      '.B dra.dynamicMig',
      'true: with --kubelet-api=dra and a MIG strategy, every GPU in MIG mode is also published as ' +
        "NVIDIA's DRA driver publishes partitionable devices: a counter set per GPU and one device per profile " +
        'and free placement, made at prepare by the gpu-device-plugin-mps unit and destroyed at unprepare. ' +
        'MIG instances the package did not make are never touched. Default false; a boolean, or refused.',
    ),
    '.PP',
    'Accepted and not used (they belong to GPU feature discovery):',
    `${CONFIG_SCHEMA.foreign.map((f) => b(f.path)).join(', ')}.`,
    '.PP',
    "Refused with the reason, unless the value asks for nothing (off, or NVIDIA's default):",
  );
  for (const u of CONFIG_SCHEMA.unsupported) l.push(...tagged(`.B ${roff(u.path)}`, u.reason));
  l.push(
    ...tagged(
      '.BR resources.gpus ", " resources.mig',
      'Renaming resources by pattern is not supported (empty lists are ' +
        'accepted); rename shared GPUs with sharing.timeSlicing.resources[].rename.',
    ),
  );
  return l;
}

/**
 * Every environment variable the program reads besides the options' own (OPTIONS) and NVIDIA's
 * refused ones (listed below them). test/unit/docs.test.ts finds the variables the source reads and
 * fails when one is missing from the page.
 */
const ENVIRONMENT: readonly { names: readonly string[]; text: string }[] = [
  {
    names: ['DP_DISABLE_HEALTHCHECKS'],
    text:
      'NVIDIA\'s: "all" (or "xids") turns the XID health checks off; ' +
      'otherwise a comma-separated list of further XIDs to ignore, e.g. 74,79.',
  },
  {
    names: ['DP_ENABLE_HEALTHCHECKS'],
    text:
      "NVIDIA's: XIDs treated as critical even where they would " +
      'be ignored, e.g. 31; wins over DP_DISABLE_HEALTHCHECKS.',
  },
  {
    names: ['SYSFS_ROOT'],
    text:
      'Where sysfs is read (default /sys): NUMA nodes the driver does not report, ' +
      'and the DMI product name of the gpu.machine label. For tests (a simulated node) ' +
      'and for a host whose sysfs is mounted elsewhere; leave it unset on a node.',
  },
  {
    names: ['PROC_ROOT'],
    text:
      'Where /proc is read (default /proc): driver/nvidia-caps/mig-minors, for the MIG capability ' +
      'device nodes with --pass-device-specs. For tests and unusual mounts only, like SYSFS_ROOT.',
  },
  {
    names: ['GPU_DEVICE_PLUGIN_STATE_FILE'],
    text:
      'The state file the daemon publishes what it reports to the kubelet in, and info ' +
      'reads (default state.json in RUNTIME_DIRECTORY, else in /run/gpu-device-plugin/).',
  },
  {
    names: ['CDI_SPEC_DIRS'],
    text:
      'Colon-separated directories check looks in for the CDI spec ' +
      'the cdi-* strategies need (default /etc/cdi:/var/run/cdi).',
  },
  {
    names: ['DRA_HEALTH_TIMEOUT_SECONDS'],
    text:
      'The timeout, in whole seconds from 1 to 3600, each report on the DRA health stream states ' +
      "(--kubelet-api=dra; default 30, the kubelet's); the list is sent again every third of it. " +
      'For tests: leave it unset on a node.',
  },
  {
    names: ['NOTIFY_SOCKET', 'WATCHDOG_USEC', 'WATCHDOG_PID'],
    text:
      'Set by systemd (Type=notify, WatchdogSec=): readiness, STATUS= and watchdog messages go to ' +
      'NOTIFY_SOCKET; keep-alives are sent at half the watchdog interval when WATCHDOG_PID is this process.',
  },
  {
    names: ['JOURNAL_STREAM'],
    text:
      'Set by systemd when standard error goes to the journal: log lines then carry ' +
      'a syslog priority prefix (for journalctl -p) and no timestamp of their own.',
  },
  {
    names: ['RUNTIME_DIRECTORY', 'STATE_DIRECTORY', 'CACHE_DIRECTORY'],
    text:
      'Set by systemd (RuntimeDirectory= and StateDirectory= in the unit): directories, ' +
      'tried in this order after GPU_DEVICE_PLUGIN_NATIVE_DIR, where the program ' +
      'extracts its embedded native modules (they must allow executable mappings).',
  },
  {
    names: ['GPU_DEVICE_PLUGIN_NATIVE_DIR'],
    text:
      'Colon-separated directories tried first for the embedded native modules, for a ' +
      'host run by hand where the defaults (then TMPDIR, then /var/tmp) are mounted noexec.',
  },
  {
    names: ['TMPDIR'],
    text: 'The temporary directory (default /tmp), tried for the native modules after the systemd directories.',
  },
  {
    names: ['PATH'],
    text:
      'nvidia-cuda-mps-control (MPS sharing) is looked for under ' +
      '--driver-root (usr/bin, usr/local/bin, bin) first, then on PATH.',
  },
  {
    names: ['LD_LIBRARY_PATH'],
    text:
      'libnvidia-ml.so.1 is looked for under --driver-root first, then by its ' +
      "soname, so the dynamic loader's LD_LIBRARY_PATH and ldconfig cache apply.",
  },
];

function manEnvironment(): string[] {
  const l: string[] = [
    '.SH ENVIRONMENT',
    "Each option's variable is listed under",
    '.BR OPTIONS ;',
    'an empty value means the option is not set there. Besides those:',
  ];
  for (const e of ENVIRONMENT) l.push('.TP', `.B ${e.names.map(roff).join('\\fR, \\fB')}`, roff(e.text));
  l.push(
    '.PP',
    "NVIDIA's variables for options this plugin does not have are refused " +
      'by name, with the reason, unless their value asks for nothing:',
    `${UNSUPPORTED_OPTIONS.flatMap((u) => u.envs)
      .map(b)
      .join(', ')}.`,
    '.PP',
    "The tests' fake NVML reads FAKE_NVML_CONFIG and FAKE_NVML_CONTROL; the program itself does not.",
  );
  return l;
}

function manSignals(): string[] {
  return [
    '.SH SIGNALS',
    ...tagged(
      '.BR SIGTERM ", " SIGINT ", " SIGQUIT',
      "Stop serving, end the kubelet's streams, remove the plugin's " +
        'sockets, shut NVML down and exit 0 within two seconds.',
    ),
    ...tagged(
      '.B SIGHUP',
      'Re-read the config file (systemctl reload gpu-device-plugin) and look at the GPUs again. A ' +
        'valid change is applied at once; an invalid file is logged and the running configuration kept.',
      'systemctl reload returns success either way: read journalctl -u gpu-device-plugin, ' +
        'or run gpu-device-plugin check, to know whether the new file was taken.',
    ),
    ...tagged(
      '.B SIGUSR1',
      'Opens nothing: the executable is built with Node.js\\(aqs --disable-sigusr1, ' +
        'so no inspector is started; the signal is logged and ignored.',
    ),
    ...tagged(
      'other signals',
      'Any other signal whose default action would end or stop the process (SIGUSR2, SIGALRM, SIGVTALRM, ' +
        'SIGPROF, SIGIO, SIGPWR, SIGSTKFLT, SIGXCPU, SIGXFSZ, SIGTSTP, SIGTTIN, SIGTTOU) is logged ' +
        'and ignored; the realtime signals are ignored. SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, ' +
        'SIGSEGV and SIGSYS keep their default: they mean the process is broken, and systemd restarts it.',
    ),
  ];
}

function manExitStatus(): string[] {
  return [
    '.SH EXIT STATUS',
    ...tagged('.B 0', 'A clean stop; --version and --help; check when every check passed.'),
    ...tagged(
      '.B 1',
      'The plugin could not start or had to stop: NVML cannot be loaded with --fail-on-init-error=true, ' +
        'a required IMEX channel missing, or the socket directory lost (the service is then restarted).',
      'For check: a check failed.',
    ),
    ...tagged(
      '.B 2',
      'A configuration error, from the daemon and from check alike: an unknown ' +
        'or invalid option, variable or config-file key, a config file that does ' +
        'not fit the node, or a MIG layout that does not fit --mig-strategy=single.',
      'The unit sets RestartPreventExitStatus=2, so the service stops ' +
        'instead of restarting with the same mistake; STATUS= names the problem.',
    ),
    ...tagged(
      '.B 3',
      'Another gpu-device-plugin already serves the socket directory; the line ' +
        'names its PID. One plugin per directory is enforced with flock(2) on ' +
        'the directory itself, which the kernel releases when the holder exits.',
    ),
  ];
}

function manFiles(input: ManPageInput): string[] {
  const l: string[] = ['.SH FILES'];
  for (const f of input.environmentFiles) {
    l.push(
      '.TP',
      `.I ${roff(f)}`,
      'Options for the service, as',
      '.IB VARIABLE = value',
      'lines (the package ships every variable commented out, with its default, and ' +
        'sets FAIL_ON_INIT_ERROR=false so that the service waits for the driver with ' +
        'backoff instead of restarting, and MPS_ROOT=/run/nvidia/mps for MPS sharing).',
    );
  }
  l.push(
    '.TP',
    `.I /usr/lib/systemd/system/${UNIT_NAME}`,
    'The unit. Change it with',
    '.BR "systemctl edit gpu\\-device\\-plugin" ;',
    'for example to add a directory to',
    '.B ReadWritePaths=',
    "when the kubelet's socket is elsewhere.",
    '.TP',
    `.I ${roff(KUBELET_DEVICE_PLUGIN_DIR)}/`,
    "The kubelet's socket directory, the only one the service may write in; the plugin serves",
    '.I gpu\\-device\\-plugin\\-<resource>.sock',
    'there. One instance runs per socket directory.',
    '.TP',
    '.I /etc/gpu\\-device\\-plugin/config.yaml',
    'The usual place for the configuration file (see',
    '.BR "CONFIGURATION FILE" ).',
    '.TP',
    '.IR /run/gpu\\-device\\-plugin/ ", " /var/lib/gpu\\-device\\-plugin/',
    'Runtime and state directories of the service (mode 0700): the extracted native modules, and the state file',
    '.B info',
    'reads.',
    '.TP',
    '.I /usr/share/doc/gpu\\-device\\-plugin/',
    "README.md (install, migration from NVIDIA's DaemonSet, operation, troubleshooting),",
    '.IR examples/config.yaml ,',
    'and in',
    '.I dra/',
    'the RBAC, admission policy, DeviceClass and node kubeconfig steps for',
    '.BR \\-\\-kubelet\\-api=dra .',
    '.TP',
    '.I /usr/share/gpu\\-device\\-plugin/dra.conf',
    'The unit drop-in a node in DRA mode links into',
    '.IR /etc/systemd/system/gpu\\-device\\-plugin.service.d/ :',
    "the host's network for the API server, and write access to the kubelet's plugin watcher directory",
    '.RI ( /var/lib/kubelet/plugins_registry )',
    "and the driver's directory",
    '.RI ( /var/lib/kubelet/plugins/gpu.nvidia.com ).',
  );
  return l;
}

function manSeeAlso(): string[] {
  return [
    '.SH SEE ALSO',
    '.BR systemctl (1),',
    '.BR journalctl (1),',
    '.BR systemd.exec (5),',
    '.BR systemd.service (5),',
    '.BR nvidia\\-smi (1)',
  ];
}
