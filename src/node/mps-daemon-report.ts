// What an MPS control daemon's report (mps/health-watch.ts) does to the node: a change of answering
// is a new snapshot (its replicas go Unhealthy, or back to their GPU's health) and one log line; a
// daemon no longer watched (null: its resource stopped being MPS) is forgotten, so that watched again
// it starts not asked; a report that changes nothing makes no snapshot.
import { MPS_DAEMON_NOT_ASKED, withMpsDaemons } from '../core/snapshot.ts';
import type { MpsDaemonState, NodeSnapshot } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';

/** The snapshot after a daemon's report and why it was made, or null when it changes nothing. */
export function mpsDaemonReport(
  prev: NodeSnapshot | null,
  resource: string,
  report: { readonly answering: boolean; readonly reason: string | null; readonly units?: readonly string[] } | null,
  since: number,
  log: Logger,
): { next: NodeSnapshot; reason: string } | null {
  if (prev === null) return null;
  if (report === null) {
    if (!prev.mpsDaemons.has(resource)) return null;
    return { next: withMpsDaemons(prev, new Map([[resource, null]])), reason: 'MPS daemon not watched' };
  }
  const was = prev.mpsDaemons.get(resource) ?? MPS_DAEMON_NOT_ASKED;
  if (was.answering === report.answering && was.since !== null) return null;
  const state: MpsDaemonState = {
    answering: report.answering,
    reason: report.answering ? null : (report.reason ?? 'no answer'),
    since,
    ...(report.units === undefined ? {} : { units: report.units }),
  };
  // A DRA claim's daemon (it names its units) serves devices, not device-plugin replicas.
  const served = state.units === undefined ? 'its replicas' : 'its devices';
  if (state.answering)
    log.info(`MPS control daemon answers; ${served} are served as healthy as their GPUs`, { resource });
  else
    log.warn(
      `MPS control daemon does not answer; ${served} are advertised Unhealthy` +
        `${state.units === undefined ? '' : ' and tainted'}`,
      { resource, reason: state.reason },
    );
  return {
    next: withMpsDaemons(prev, new Map([[resource, state]])),
    reason: report.answering ? 'MPS daemon answers' : 'MPS daemon does not answer',
  };
}
