// Operator documentation generated from OPTION_SPECS, the table the program parses its options
// with, so that the packaged environment file and man page list exactly the options the executable
// has: the environment file (/etc/default or /etc/sysconfig) and gpu-device-plugin(8).
import { DURATION_GRAMMAR, OPTION_SPECS, describeRange } from '../src/cli/options.ts';
import type { OptionKey, OptionSpec } from '../src/cli/options.ts';

export const UNIT_NAME = 'gpu-device-plugin.service';
export const KUBELET_DEVICE_PLUGIN_DIR = '/var/lib/kubelet/device-plugins';

/** Extra advice for the environment file, where an option interacts with the packaging. */
const ENV_NOTES: Partial<Record<OptionKey, string>> = {
  kubeletSocket: `the service may write only in ${KUBELET_DEVICE_PLUGIN_DIR}; for another directory add it to ReadWritePaths= (systemctl edit gpu-device-plugin)`,
  configFile: 'the service cannot see /home or /root: keep the file under /etc; systemctl reload gpu-device-plugin re-reads it',
  nfdFeaturesFile: 'the service may write the file only after its directory is added to the sandbox: systemctl edit gpu-device-plugin, then [Service] ReadWritePaths=/etc/kubernetes/node-feature-discovery/features.d (or your directory)',
  metricsFile: 'the service may write the file only after its directory is added to the sandbox: systemctl edit gpu-device-plugin, then [Service] ReadWritePaths=/var/lib/prometheus/node-exporter (or your directory)',
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
    why: 'set to false for the service: without a driver yet (boot order, a driver being installed or upgraded) the plugin keeps running and retries NVML with growing pauses (STATUS= says it waits for NVML), instead of exiting and being restarted over and over. With true, a missing driver makes the plugin exit and systemd restart it every 2 s.',
  },
};

/** What the value looks like, for help texts: `path`, `true|false`, `uuid|index`, `duration, from 1 to 3600 seconds`. */
export function valueHint(spec: OptionSpec): string {
  switch (spec.kind.type) {
    case 'string': return spec.kind.path ? 'path' : 'value';
    case 'bool': return 'true|false';
    case 'enum': return spec.kind.values.join('|');
    case 'seconds': return `duration, ${describeRange(spec.kind)}`;
    case 'ids': return `${spec.kind.allowed.join('|')} (comma separated)`;
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
    '# below with its default value, commented out, except FAIL_ON_INIT_ERROR, which the service sets',
    '# (the reason is given there). To change one, remove the "#" before its variable, set the value,',
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
    else out.push(`# The program's default is ${spec.default ?? 'none'}; ${oneLine(set.why)}`, `${spec.env}=${set.value}`);
  }
  return out.join('\n') + '\n';
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
    '.SH SYNOPSIS',
    '.B gpu\\-device\\-plugin',
    '.RI [ options ]',
    '.br',
    '.B gpu\\-device\\-plugin',
    '.BR \\-\\-version " | " \\-\\-help',
    '.SH DESCRIPTION',
    '.B gpu\\-device\\-plugin',
    'finds the node\'s NVIDIA GPUs through NVML (libnvidia\\-ml.so.1), advertises them to the',
    'kubelet as the extended resource',
    '.B nvidia.com/gpu',
    'with their health and NUMA topology, and answers the kubelet\'s Allocate calls with what the',
    'NVIDIA container runtime needs.',
    'It serves its own socket next to the kubelet\'s registration socket, registers, and registers',
    'again whenever the kubelet restarts.',
    '.PP',
    'It normally runs as the systemd service',
    `.BR ${UNIT_NAME} ,`,
    'which reads its options from the environment file (see',
    '.BR FILES ).',
    'The service tells systemd when it has registered (Type=notify), sends watchdog keep\\-alives,',
    'and is restarted when it exits or stops answering.',
    '.SH OPTIONS',
    'Each option can be given on the command line or through its environment variable;',
    'the command line beats the environment, which beats the default.',
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
    const def = spec.default === null ? 'as described above' : `\\fI${roff(spec.default)}\\fR`;
    l.push(`Environment variable \\fB${roff(spec.env)}\\fR; default ${def}.`);
  }
  l.push(
    '.TP',
    '.B \\-\\-version',
    'Print the version, the git commit and the Node.js version, and exit.',
    '.TP',
    '.B \\-\\-help',
    'List the options and exit.',
    '.SH ENVIRONMENT',
    'Besides the variables named under',
    '.BR OPTIONS :',
    '.TP',
    '.B RUNTIME_DIRECTORY\\fR, \\fBSTATE_DIRECTORY',
    'Set by systemd; the program extracts its native module there (first one that works).',
    '.TP',
    '.B NOTIFY_SOCKET',
    'Set by systemd; readiness, status and watchdog messages go there.',
    '.SH FILES',
  );
  for (const f of input.environmentFiles) {
    l.push('.TP', `.I ${roff(f)}`, 'Options for the service, as',
      '.IB VARIABLE = value',
      'lines (the package ships every variable commented out, with its default).');
  }
  l.push(
    '.TP',
    `.I /usr/lib/systemd/system/${UNIT_NAME}`,
    'The unit. Change it with',
    '.BR "systemctl edit gpu\\-device\\-plugin" ;',
    'for example to add a directory to',
    '.B ReadWritePaths=',
    'when the kubelet\'s socket is elsewhere.',
    '.TP',
    `.I ${roff(KUBELET_DEVICE_PLUGIN_DIR)}/`,
    'The kubelet\'s socket directory, the only one the service may write in.',
    '.TP',
    '.IR /run/gpu\\-device\\-plugin/ ", " /var/lib/gpu\\-device\\-plugin/',
    'Runtime and state directories of the service (mode 0700).',
    '.SH SIGNALS',
    '.B SIGTERM',
    'and',
    '.B SIGINT',
    'stop serving, end the kubelet\'s streams, remove the plugin\'s sockets and exit within two seconds.',
    '.PP',
    '.B SIGQUIT',
    'does the same.',
    '.PP',
    '.B SIGHUP',
    're\-reads the config file',
    '.RB ( "systemctl reload gpu\-device\-plugin" ).',
    '.PP',
    'Any other signal whose default action would end or stop the process (SIGUSR1, SIGUSR2, SIGALRM,',
    'SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT, SIGXCPU, SIGXFSZ, SIGTSTP, SIGTTIN, SIGTTOU) is ignored',
    'with a log line; the realtime signals are ignored. SIGUSR1 opens no debugger: the program is built',
    'without that (Node.js\\(aqs \\-\\-disable\\-sigusr1).',
    '.SH EXIT STATUS',
    '.TP',
    '.B 0',
    'a clean stop (and',
    '.BR \\-\\-version ,',
    '.BR \\-\\-help ).',
    '.TP',
    '.B 1',
    'the plugin could not start or stop cleanly (the unit restarts it).',
    '.TP',
    '.B 2',
    'a configuration error: an invalid option, environment variable or config file entry, or a config',
    'file that does not fit the node (a GPU it names is not there). The unit does not restart it',
    '(RestartPreventExitStatus=2); its status line names the problem.',
    '.TP',
    '.B 3',
    'another gpu\\-device\\-plugin already serves the socket directory (the line names its PID). One',
    'plugin per directory is enforced with',
    '.BR flock (2)',
    'on the directory itself, which the kernel releases when the holder exits.',
    '.SH SEE ALSO',
    '.BR systemctl (1),',
    '.BR journalctl (1),',
    '.BR systemd.exec (5),',
    '.BR nvidia\\-smi (1)',
  );
  return l.join('\n') + '\n';
}
