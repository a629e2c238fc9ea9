// IMEX channels (GB200/GB300 NVL72 multi-node NVLink; NVIDIA's --imex-channel-ids): which
// configured channels a container gets, and what Allocate adds for them. Pure: which channel device
// nodes exist is an input.

/** The only channel lists NVIDIA's plugin accepts: none, or channel 0. */
export const IMEX_ALLOWED_CHANNEL_IDS: readonly number[] = [0];
export const IMEX_CHANNELS_ENV = 'NVIDIA_IMEX_CHANNELS';
/** Fully qualified CDI kind of an IMEX channel (NVIDIA's vendor and class). */
export const CDI_IMEX_KIND = 'k8s.device-plugin.nvidia.com/imex-channel';
export const IMEX_CHANNEL_DIR = '/dev/nvidia-caps-imex-channels';

/** Container path of a channel's character device (the host path is the same under the dev root). */
export function imexChannelPath(id: number): string {
  return `${IMEX_CHANNEL_DIR}/channel${id}`;
}

export interface ImexChoice {
  /** Channels passed to every container, in the configured order. */
  channels: number[];
  /** One line per configured channel whose device node is missing (skipped). */
  missing: string[];
  /** Set when a channel is missing and channels are required: the start must stop with it. */
  fatal: string | null;
}

/**
 * The channels to pass, from the configured IDs and the channel device nodes present (container
 * paths, see imexChannelPath). A missing channel is skipped, or fatal with `required`.
 */
export function chooseImexChannels(
  ids: readonly number[],
  present: ReadonlySet<string>,
  required: boolean,
  devRoot: string,
): ImexChoice {
  const channels: number[] = [];
  const missing: string[] = [];
  for (const id of ids) {
    const path = imexChannelPath(id);
    if (present.has(path)) channels.push(id);
    else missing.push(`IMEX channel ${id}: ${devRoot.replace(/\/+$/, '')}${path} does not exist`);
  }
  const fatal =
    required && missing.length > 0
      ? `${missing.join('; ')}, and --imex-required is set; is the IMEX daemon (nvidia-imex) ` +
        `running and channel ${ids.join(',')} created? (or drop --imex-required to start without it)`
      : null;
  return { channels, missing, fatal };
}
