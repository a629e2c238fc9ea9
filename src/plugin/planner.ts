// The device-plugin mode's plan: a consumer of the node model that plans the resources to advertise
// (core/resource-plan.ts) from every applied snapshot and the configuration in force, and hands the
// planned node, with what changed of the resources, to its listeners in order (the resource manager,
// the MPS daemon watch). It takes part in the live node's transaction: a start whose configuration
// does not fit the GPUs fails, a reload whose configuration cannot be planned against the GPUs now
// present is refused (the live node then gives every consumer the node in force back), and a listener
// that refuses a plan refuses the snapshot. A later scan that the configuration no longer fits keeps
// the previous resources (planProblem says why). What the shared consumers show per resource (STATUS,
// the state file, the metrics) they read from advertised(), never from the snapshot.
import { advertisedView, checkReload, planSnapshot, samePlanInputs } from '../core/resource-plan.ts';
import type { AdvertisedView, PlannedNode, ResourcePlan } from '../core/resource-plan.ts';
import { diffResources } from '../core/resource-diff.ts';
import type { ResourceDiff } from '../core/resource-diff.ts';
import { describePlan } from '../core/sharing.ts';
import type { AppliedSnapshot, NodeConsumer, NodeSettings } from '../node/consumer.ts';
import type { Logger } from '../system/log.ts';
import { describeResources } from './describe.ts';

/** One applied snapshot with the plan made for it and what changed of the resources. */
export interface AppliedPlan<C extends NodeSettings = NodeSettings> extends AppliedSnapshot<C> {
  readonly plan: ResourcePlan;
  /** diffResources(the planned node before, this one). */
  readonly resourceChange: ResourceDiff;
}

/** Hears every plan, in order; one that throws refuses the snapshot (as a node consumer does). */
export interface PlanListener<C extends NodeSettings = NodeSettings> {
  readonly name: string;
  apply(applied: AppliedPlan<C>): Promise<void> | void;
  stop?(): Promise<void> | void;
}

interface InForce<C> {
  readonly node: PlannedNode;
  readonly settings: C;
}

export class ResourcePlanner<C extends NodeSettings = NodeSettings> implements NodeConsumer<C> {
  readonly name = 'device plugin resources';
  private readonly listeners: readonly PlanListener<C>[];
  private readonly log: Logger;
  private current: InForce<C> | null = null;
  /** The plan before the current one: a snapshot given back after a refused change gets it again as it was. */
  private before: InForce<C> | null = null;
  /** What the listeners were given last (a listener that refused it may have left others holding it). */
  private offered: InForce<C> | null = null;

  constructor(listeners: readonly PlanListener<C>[], log: Logger) {
    this.listeners = listeners;
    this.log = log;
  }

  /** The node and its plan in force (null before the first). */
  get planned(): PlannedNode | null {
    return this.current?.node ?? null;
  }

  /** What is advertised per resource now, for the STATUS line, the state file and the metrics. */
  advertised(): AdvertisedView {
    return advertisedView(this.planned);
  }

  async apply(applied: AppliedSnapshot<C>): Promise<void> {
    const was = this.current;
    // The same snapshot with the same settings is one given back after a refused change: the plan it
    // had, and nothing to do when the listeners were last given just that (this refused the change).
    const same = (f: InForce<C> | null): InForce<C> | null =>
      f !== null && f.node.snapshot === applied.snapshot && f.settings === applied.settings ? f : null;
    if (same(this.offered) !== null) return;
    const kept = same(was) ?? same(this.before);
    const plan = kept?.node.plan ?? this.planFor(applied, was);
    const node: PlannedNode = { snapshot: applied.snapshot, plan };
    const told = this.offered?.node ?? null;
    const resourceChange = diffResources(told, node);
    describeResources(this.log, told, node, resourceChange, applied.reason);
    if (applied.reregister !== null && kept === null)
      this.log.info('advertising', { resources: describePlan(plan.resources), reason: applied.reason });
    const offer = { node, settings: applied.settings };
    this.offered = offer;
    for (const l of this.listeners) await l.apply({ ...applied, plan, resourceChange });
    if (kept !== was) this.before = was;
    this.current = offer;
  }

  /** The plan for a snapshot; throws at start, or for new settings that cannot be planned against the GPUs. */
  private planFor(applied: AppliedSnapshot<C>, was: InForce<C> | null): ResourcePlan {
    const settings = applied.settings.plan;
    // A health change plans nothing again: the plan in force is this snapshot's too.
    if (was !== null && was.settings === applied.settings && samePlanInputs(was.node.snapshot, applied.snapshot))
      return was.node.plan;
    if (was !== null && was.settings !== applied.settings) checkReload(applied.snapshot, settings);
    return planSnapshot(applied.snapshot, settings, was?.node ?? null);
  }

  async stop(): Promise<void> {
    for (const l of this.listeners) await l.stop?.();
  }
}
