// The one-mode-per-node rules of --kubelet-api=dra, checked once every option is resolved.
import { dnsSubdomainProblem } from './option-value.ts';
import { OPTION_SPECS } from './option-table.ts';
import type { OptionKey, OptionSpec, ParsedOptions } from './options.ts';
import { OptionError } from './errors.ts';

/**
 * Options of the device-plugin mode that change what containers get, refused in DRA mode when set
 * (not at their default): DRA hands the runtime CDI device IDs, always, so they would silently do
 * nothing. The ones that only name things (--kubelet-socket, --cdi-annotation-prefix) or only matter
 * with what is refused anyway (--shared-devices-allocation-policy) are left alone, so one environment
 * file can hold both modes' settings and a switch is one line.
 */
const DEVICE_PLUGIN_ONLY_OPTIONS: readonly OptionKey[] = ['deviceListStrategy', 'passDeviceSpecs'];

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
      `${mode} needs --kubeconfig (KUBECONFIG): a kubeconfig with this node's credentials for the API server, ` +
        `which the service has no other way to reach; /usr/share/doc/gpu-device-plugin/dra/README.md says how to ` +
        `make one; or keep this node on --kubelet-api=device-plugin`,
    );
  }
  if (parsed.origins.nodeName === 'default') {
    const why = dnsSubdomainProblem(o.nodeName, 253);
    if (why !== null)
      throw new OptionError(
        `${mode}: the host name ${JSON.stringify(o.nodeName)} is not a valid node name (${why}); set ` +
          `--node-name (NODE_NAME) to the name the kubelet registered this node under (kubectl get nodes)`,
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
      `${mode} does not serve shared GPUs: ${shared} in ${o.configFile ?? 'the config file'} ` +
        `gives replicas of nvidia.com/gpu, which this release offers only through the ` +
        `device-plugin API; remove the sharing section (DRA claims may share one GPU among the ` +
        `containers of a pod through one claim) or keep this node on --kubelet-api=device-plugin`,
    );
  }
  const set = DEVICE_PLUGIN_ONLY_OPTIONS.filter((k) => parsed.origins[k] !== 'default');
  if (set.length > 0) {
    throw new OptionError(
      `${mode}: ${set.map((k) => whereSet(parsed, k)).join(', ')} ${set.length === 1 ? 'is' : 'are'} ` +
        `set, but only the device-plugin API uses ${set.length === 1 ? 'it' : 'them'}: in DRA mode ` +
        `containers get their GPUs as the CDI devices of the NVIDIA Container Toolkit's spec, always; ` +
        `remove ${set.length === 1 ? 'that setting' : 'those settings'}, or keep --kubelet-api=device-plugin`,
    );
  }
}
