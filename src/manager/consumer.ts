// What the live node hands every consumer of the node model: each applied snapshot, with its diff
// against the one before, why it was made, and the configuration in force. The device-plugin
// resource manager (manager.ts), the observer (observe/), the systemd STATUS (system/service-status.ts)
// and a state publisher are consumers; a DRA kubelet plugin would be one more, added to the list in
// main.ts without touching the others. See README.md.
import type { NodeSnapshot, PlanSettings, SnapshotDiff } from '../core/snapshot.ts';
import type { ServeSettings } from './manager.ts';

/** The configuration in force: what decides the resources (plan) and how answers are given (serve). */
export interface NodeSettings {
  readonly plan: PlanSettings;
  readonly serve: ServeSettings;
}

/** One applied snapshot, as every consumer gets it (C: the live node's configuration type). */
export interface AppliedSnapshot<C extends NodeSettings = NodeSettings> {
  readonly snapshot: NodeSnapshot;
  /** diff(previous snapshot, snapshot); the first snapshot's diff adds everything. */
  readonly change: SnapshotDiff;
  /** Why it was made: 'start', 'health changed', 'config reloaded', 're-discovery: …'. */
  readonly reason: string;
  /** A config reload asks resources whose device set changed to register again, with this reason; else null. */
  readonly reregister: string | null;
  readonly settings: C;
}

/**
 * A consumer of the node model. apply() is called for every applied snapshot, in order, one at a
 * time (the next waits for the promise); a consumer that throws fails that change (at start: the
 * start), so one that must never stop the node catches its own errors.
 */
export interface NodeConsumer<C extends NodeSettings = NodeSettings> {
  /** For the log. */
  readonly name: string;
  apply(applied: AppliedSnapshot<C>): Promise<void> | void;
  /** The daemon stops. */
  stop?(): Promise<void> | void;
}
