// Options of NVIDIA's plugin that this one does not have: refused by name with the reason, on the
// command line, in the environment and in the config file, unless their value asks for nothing (e.g.
// --gds-enabled=false), so that they are never silently ignored.
import { OptionError } from './errors.ts';
import { FALSE_WORDS } from './option-value.ts';
import type { UnsupportedOption } from './options.ts';

const NO_CDI_SPECS =
  'this plugin does not write CDI specs; generate them with `nvidia-ctk ' +
  'cdi generate` (vendor k8s.device-plugin.nvidia.com, class gpu)';

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

/** Whether a value of a refused option asks for nothing this plugin lacks (off, or NVIDIA's default). */
export function isInert(u: UnsupportedOption, raw: string): boolean {
  if (u.bool) return FALSE_WORDS.has(raw.toLowerCase());
  return u.inert.includes(raw);
}

/** Refuses a refused option's value unless it is inert; `where` names the flag, variable or key. */
export function refuseUnsupported(u: UnsupportedOption, raw: string, where: string): void {
  if (!isInert(u, raw)) {
    throw new OptionError(`${where}: not supported by this plugin (NVIDIA's --${u.flag}): ${u.reason}`);
  }
}

/** Refuses NVIDIA's options this plugin does not have when set (to anything not inert) in the environment. */
export function refuseUnsupportedEnv(env: Readonly<Record<string, string | undefined>>): void {
  for (const u of UNSUPPORTED_OPTIONS) {
    for (const e of u.envs) {
      const v = env[e];
      if (v !== undefined && v !== '') refuseUnsupported(u, v, `environment variable ${e}`);
    }
  }
}
