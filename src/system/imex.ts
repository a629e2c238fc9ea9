// Which IMEX channel device nodes exist under the dev root. What follows from that — which
// channels are passed, which are skipped, whether the start must stop — is core/imex.ts's decision;
// this file only looks at the file system and logs the outcome.
import { chooseImexChannels, imexChannelPath } from '../core/imex.ts';
import type { ImexChoice } from '../core/imex.ts';
import { presentDeviceNodes } from './control-devices.ts';
import type { Logger } from './log.ts';

/** Looks for each configured channel's device node under devRoot. */
export async function findImexChannels(
  ids: readonly number[],
  required: boolean,
  devRoot: string,
): Promise<ImexChoice> {
  // A missing channel is skipped, or fatal when required: decided in core/imex.ts.
  const present = new Set(await presentDeviceNodes(devRoot, ids.map(imexChannelPath)));
  return chooseImexChannels(ids, present, required, devRoot);
}

/**
 * The channels to pass to every container, for the daemon's start: missing ones are logged as
 * skipped; with --imex-required a missing one throws, which stops the start.
 */
export async function imexChannelsAtStart(
  opts: { imexChannelIds: readonly number[]; imexRequired: boolean; devRoot: string },
  log: Logger,
): Promise<number[]> {
  if (opts.imexChannelIds.length === 0) return [];
  const choice = await findImexChannels(opts.imexChannelIds, opts.imexRequired, opts.devRoot);
  if (choice.fatal !== null) throw new Error(choice.fatal);
  for (const m of choice.missing) log.warn('IMEX channel skipped', { reason: m });
  if (choice.channels.length > 0)
    log.info('IMEX channels passed to every container', { channels: choice.channels.join(',') });
  return choice.channels;
}
