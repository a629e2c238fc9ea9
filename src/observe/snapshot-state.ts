// The state publisher: a consumer of the live node (src/node/consumer.ts) that turns each applied
// snapshot (core/snapshot.ts), the configuration in force and the serving mode's registrations (and
// what it advertises per resource) into the published state (core/daemon-state.ts) and writes it to the state file
// `info` reads (state-file.ts): what the kubelet was told of each device and why, since when. When the snapshot's shape
// changes, only this file follows it.
import type { Options } from '../config/options.ts';
import { OPTION_SPECS } from '../config/option-table.ts';
import { showOption } from '../config/describe-options.ts';
import type {
  ClaimState,
  DaemonState,
  DeviceState,
  GpuSignalsState,
  MpsResourceState,
  ResourceState,
  SignalStateView,
} from '../core/daemon-state.ts';
import { SIGNAL_NAMES } from '../core/health-signals.ts';
import { xidMeaning } from '../core/xid-meanings.ts';
import type { GpuHealthState } from '../core/health-tracker.ts';
import { NOTHING_ADVERTISED } from '../core/resource-plan.ts';
import type { AdvertisedView } from '../core/resource-plan.ts';
import type { NodeSnapshot, PlanSettings, UnitHealth } from '../core/snapshot.ts';
import { SinceTracker } from './state-file.ts';
import type { StateFile } from './state-file.ts';

export interface StateContext {
  readonly pid: number;
  readonly version: string;
  readonly startedAt: string;
  /** Now, ISO 8601. */
  readonly now: string;
  readonly options: Readonly<Record<string, string>>;
  readonly registrations: readonly { readonly name: string; readonly registered: boolean }[];
  /** What is advertised per resource (the device-plugin plan); default nothing. */
  readonly advertised?: AdvertisedView;
  /** For the resources' registrations (a device's health carries its own "since"). */
  readonly since: SinceTracker;
  /** Claims prepared on this node (DRA mode); absent otherwise. */
  readonly claims?: readonly ClaimState[];
}

/** Why a device is advertised unhealthy, when its transition left no reason (the driver down, a state carried over). */
export function unhealthyReason(state: GpuHealthState | undefined, driverUp: boolean): string {
  if (!driverUp) return 'the NVIDIA driver does not answer';
  if (state === undefined) return 'unknown';
  if (state.lost) return 'lost: NVML reports the GPU gone (GPU_IS_LOST; XID 79: fallen off the bus)';
  if (state.lastXid !== null)
    return (
      `XID ${state.lastXid}: ${xidMeaning(state.lastXid)}` +
      `${state.permanent ? ' (health recovery does not undo it)' : ''}`
    );
  if (state.permanent) return 'double-bit ECC error';
  return 'unhealthy';
}

function deviceHealth(
  s: NodeSnapshot,
  uuid: string,
  unit: UnitHealth | undefined,
  driverUp: boolean,
  startedAt: string,
): Pick<DeviceState, 'health' | 'reason' | 'since'> {
  const health = s.health.get(uuid) ?? 'Unhealthy';
  const why =
    health === 'Unhealthy'
      ? driverUp
        ? (unit?.reason ?? unhealthyReason(unit?.state, true))
        : unhealthyReason(unit?.state, false)
      : undefined;
  // A unit nothing has happened to has been what it is since the daemon started.
  const since = unit?.since === null || unit?.since === undefined ? startedAt : new Date(unit.since).toISOString();
  return { health, ...(why === undefined ? {} : { reason: why }), since };
}

export function daemonStateFromSnapshot(s: NodeSnapshot | null, ctx: StateContext): DaemonState {
  const devices: DeviceState[] = [];
  const driverUp = s !== null && s.driverVersion !== null;
  if (s !== null) {
    for (const gpu of s.gpus) {
      devices.push({
        kind: 'gpu',
        index: String(gpu.index),
        uuid: gpu.uuid,
        ...deviceHealth(s, gpu.uuid, s.gpuHealth.get(gpu.uuid), driverUp, ctx.startedAt),
      });
    }
    for (const d of s.mig.devices) {
      const parent = s.gpus[d.parent];
      devices.push({
        kind: 'mig',
        index: `${parent?.index ?? d.parent}:${d.index}`,
        uuid: d.uuid,
        ...(parent === undefined ? {} : { parentUuid: parent.uuid }),
        ...deviceHealth(s, d.uuid, s.migHealth.get(d.uuid), driverUp, ctx.startedAt),
      });
    }
  }
  const advertised = ctx.advertised ?? NOTHING_ADVERTISED;
  const counts = new Map((s === null ? [] : advertised.resources).map((r) => [r.name, r]));
  const resources: ResourceState[] = ctx.registrations.map((r) => ({
    name: r.name,
    registered: r.registered,
    since: ctx.since.since(`resource ${r.name}`, String(r.registered), ctx.now),
    devices: counts.get(r.name)?.devices ?? 0,
    healthy: counts.get(r.name)?.healthy ?? 0,
  }));
  const mps = s === null ? [] : mpsState(advertised);
  const signals = s === null ? [] : signalsState(s, ctx);
  return {
    pid: ctx.pid,
    version: ctx.version,
    startedAt: ctx.startedAt,
    publishedAt: ctx.now,
    driverVersion: s?.driverVersion ?? null,
    devices,
    resources,
    planProblem: s === null ? null : advertised.planProblem,
    options: ctx.options,
    ...(mps.length === 0 ? {} : { mps }),
    ...(signals.length === 0 ? {} : { signals }),
    ...(ctx.claims === undefined ? {} : { claims: ctx.claims }),
  };
}

/** Each read GPU's health signals, each with its status since when (as far as this daemon saw it change). */
function signalsState(s: NodeSnapshot, ctx: StateContext): GpuSignalsState[] {
  const out: GpuSignalsState[] = [];
  for (const gpu of s.gpus) {
    const g = s.signals?.get(gpu.uuid);
    if (g === undefined) continue;
    const signals: SignalStateView[] = SIGNAL_NAMES.map((name) => {
      const st = g.states[name];
      const key = `signal ${gpu.uuid} ${name}`;
      return {
        signal: name,
        status: st.status,
        class: st.class,
        value: st.value,
        ...(st.bad ? { action: st.reason } : {}),
        since: ctx.since.since(key, `${st.status} ${st.taint?.value ?? ''}`, ctx.now),
      };
    });
    out.push({ index: gpu.index, uuid: gpu.uuid, signals });
  }
  return out;
}

/** Each MPS resource: its daemon's state and the limits planned for it (core/mps.ts). */
function mpsState(advertised: AdvertisedView): MpsResourceState[] {
  return advertised.mps.map(({ plan: p, state: d }) => {
    return {
      resource: p.resource,
      answering: d.answering,
      ...(d.answering ? {} : { reason: d.reason ?? 'not asked yet' }),
      ...(d.since === null ? {} : { since: new Date(d.since).toISOString() }),
      replicas: p.replicas,
      activeThreadPercentage: p.activeThreadPercentage,
      gpus: p.gpus.map((g) => ({ index: g.index, uuid: g.uuid, pinnedMemLimitMiB: g.pinnedMemLimitMiB })),
    };
  });
}

/** What the publisher needs of the configuration in force: the options (the live node's RunningConfig has them). */
export interface PublishedSettings {
  readonly plan: PlanSettings;
  readonly options: Options;
}

/**
 * Publishes the state on every applied snapshot (a NodeConsumer) and on every registration change
 * (registrationChanged); removes the file when the daemon stops. Never throws: a write that fails is
 * the state file's to log.
 */
export class StatePublisher {
  readonly name = 'state file';
  private readonly file: StateFile;
  private readonly registrations: {
    registrationStates(): readonly { readonly name: string; readonly registered: boolean }[];
    advertised?(): AdvertisedView;
  };
  private readonly claims: (() => readonly ClaimState[]) | undefined;
  private readonly version: string;
  private readonly startedAt = new Date().toISOString();
  private readonly since = new SinceTracker();
  private snapshot: NodeSnapshot | null = null;
  private options: Readonly<Record<string, string>> = {};

  /** claims: the prepared claims, where something prepares them (DRA mode). */
  constructor(
    file: StateFile,
    registrations: StatePublisher['registrations'],
    version: string,
    claims?: () => readonly ClaimState[],
  ) {
    this.file = file;
    this.claims = claims;
    this.registrations = registrations;
    this.version = version;
  }

  apply(applied: { readonly snapshot: NodeSnapshot; readonly settings: PublishedSettings }): void {
    this.snapshot = applied.snapshot;
    const o = applied.settings.options;
    this.options = Object.fromEntries(OPTION_SPECS.map((spec) => [spec.flag, showOption(o[spec.key])]));
    this.publish();
  }

  registrationChanged(): void {
    this.publish();
  }

  /** Something else the state shows changed (a claim prepared or unprepared). */
  changed(): void {
    this.publish();
  }

  private publish(): void {
    void this.file.publish(
      daemonStateFromSnapshot(this.snapshot, {
        pid: process.pid,
        version: this.version,
        startedAt: this.startedAt,
        now: new Date().toISOString(),
        options: this.options,
        registrations: this.registrations.registrationStates(),
        ...(this.registrations.advertised === undefined ? {} : { advertised: this.registrations.advertised() }),
        since: this.since,
        ...(this.claims === undefined ? {} : { claims: this.claims() }),
      }),
    );
  }

  stop(): Promise<void> {
    return this.file.remove();
  }
}
