// What an MPS control daemon's report (mps/health-watch.ts) does to the node: a change of answering
// is a new snapshot (its replicas go Unhealthy, or back to their GPU's health) and one log line; a
// report that changes nothing, or names a resource that is not an MPS resource of the snapshot in
// force (the config changed meanwhile), makes none.
import { withMpsDaemons } from '../core/snapshot.ts';
import type { MpsDaemonState, NodeSnapshot } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';

/** The snapshot after a daemon's report and why it was made, or null when it changes nothing. */
export function mpsDaemonReport(
  prev: NodeSnapshot | null,
  resource: string,
  report: { readonly answering: boolean; readonly reason: string | null },
  since: number,
  log: Logger,
): { next: NodeSnapshot; reason: string } | null {
  const was = prev?.mpsDaemons?.get(resource);
  if (prev === null || was === undefined) return null;
  if (was.answering === report.answering && was.since !== null) return null;
  const state: MpsDaemonState = {
    answering: report.answering,
    reason: report.answering ? null : (report.reason ?? 'no answer'),
    since,
  };
  if (state.answering)
    log.info('MPS control daemon answers; its replicas are served as healthy as their GPUs', { resource });
  else
    log.warn('MPS control daemon does not answer; its replicas are advertised Unhealthy', {
      resource,
      reason: state.reason,
    });
  return {
    next: withMpsDaemons(prev, new Map([[resource, state]])),
    reason: report.answering ? 'MPS daemon answers' : 'MPS daemon does not answer',
  };
}
