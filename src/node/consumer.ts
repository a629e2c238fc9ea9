// What the live node hands every consumer of the node model: each applied snapshot, with its diff
// against the one before, why it was made, and the configuration in force. The device-plugin mode
// (src/plugin/mode.ts), the observer (observe/), the systemd STATUS (system/service-status.ts) and a
// state publisher are consumers; in DRA mode the DRA kubelet plugin and the slice publisher take the
// device-plugin mode's place (src/dra/mode.ts). See README.md. `Registrations` is what the STATUS
// line, the state file and the metrics hear of the kubelet's registrations, whichever API serves, and
// what that mode advertises per resource.
import type { SignalPolicy } from '../core/health-signals.ts';
import type { AdvertisedView } from '../core/resource-plan.ts';
import type { NodeSnapshot, PlanSettings } from '../core/snapshot.ts';
import type { SnapshotDiff } from '../core/snapshot-diff.ts';

/** The configuration in force, as every mode reads it: the sharing, MIG strategy and device naming (plan). */
export interface NodeSettings {
  readonly plan: PlanSettings;
  /**
   * The health signals' policy (config file `health` section and environment); default every signal at its default
   * class.
   */
  readonly signalPolicy?: SignalPolicy;
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

/**
 * The kubelet's registrations of whatever serves the GPUs (the device-plugin resource manager, or in
 * DRA mode the DRA kubelet plugin), as the STATUS line, the state file and the observer hear them.
 */
export interface Registrations {
  /** Every registration stands now (none lost since it was made). */
  allRegisteredNow(): boolean;
  /** One entry per registration (a resource, or the DRA driver), for the state file. */
  registrationStates(): readonly { readonly name: string; readonly registered: boolean }[];
  /** After each registration; `all`: every one has registered at least once. */
  onRegistered(fn: (all: boolean) => void): void;
  /** A registration stopped counting. */
  onRegistrationLost(fn: () => void): void;
  /**
   * The STATUS line's first words (default "registered" / "waiting for the kubelet"): what is
   * registered and what is published, in the serving API's words.
   */
  statusWords?(registeredNow: boolean): string;
  /**
   * What is advertised per resource now (the device-plugin mode's plan: counts, the plan's problem,
   * the MPS daemons); absent: no device-plugin resources (DRA mode).
   */
  advertised?(): AdvertisedView;
}
