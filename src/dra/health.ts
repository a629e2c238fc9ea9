// The DRAResourceHealth stream served on dra.sock, in both versions the kubelets speak: v1alpha1 (1.34–1.36)
// and v1 (1.37, which opens it when the registration lists it; the same messages). Every stream, of either
// version, gets the complete health list of this node's devices when it opens, again whenever the list
// says something new (a device turned unhealthy, recovered, came or went), and again every third of the
// timeout each report states: the kubelet shows a device as Unknown once the last report it received of
// it is older than that timeout, whatever the report said. The list itself is core/dra-health.ts's,
// from the snapshot's health model.
import type * as grpc from '@grpc/grpc-js';
import { HealthStatus, draHealthService } from '../api/dra.ts';
import { OptionError } from '../config/errors.ts';
import type { DraHealthVersion, NodeWatchResourcesRequest, NodeWatchResourcesResponse } from '../api/dra.ts';
import type { DraNodeDevice } from '../core/dra-claims.ts';
import { deviceHealthList, sameHealth } from '../core/dra-health.ts';
import type { DraDeviceHealth } from '../core/dra-health.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import type { ServiceBinding } from '../kubelet/socket-server.ts';
import { TimerOwner } from '../system/timers.ts';

type HealthCall = grpc.ServerWritableStream<NodeWatchResourcesRequest, NodeWatchResourcesResponse>;

const HEALTH_ON_WIRE = { Healthy: HealthStatus.HEALTHY, Unhealthy: HealthStatus.UNHEALTHY } as const;

/** The versions served (registration.ts announces each). */
export const HEALTH_VERSIONS: readonly DraHealthVersion[] = ['v1', 'v1alpha1'];

/** How long close() waits for a stream's end to reach a peer that does not read. */
const END_WAIT_MS = 1000;

/** The timeout each report states unless told otherwise: the kubelet's own default (what 0 means). */
export const DEFAULT_HEALTH_TIMEOUT_SEC = 30;
/** The bounds of a stated timeout: whole seconds on the wire; above an hour a lost device would go unnoticed. */
export const HEALTH_TIMEOUT_BOUNDS_SEC = { min: 1, max: 3600 } as const;
/** The environment variable that sets the stated timeout (tests use a short one; nodes leave it unset). */
export const HEALTH_TIMEOUT_ENV = 'DRA_HEALTH_TIMEOUT_SECONDS';

/**
 * How often the whole list is sent again for a stated timeout: a third of it (10 s for 30 s). The kubelet
 * compares the time it received a device's last report with the timeout, so a resend must land inside it;
 * at a third, one resend lost or late (a busy event loop, a kubelet slow to read) still does.
 */
export function resendPeriodMs(timeoutSec: number): number {
  return Math.floor((timeoutSec * 1000) / 3);
}

/**
 * The timeout to state from the environment: DRA_HEALTH_TIMEOUT_SECONDS, whole seconds within the bounds,
 * else the default. A value that is not one is an OptionError (exit 2) naming the variable and what it takes.
 */
export function healthTimeoutFromEnv(env: Readonly<Record<string, string | undefined>>): number {
  const raw = env.DRA_HEALTH_TIMEOUT_SECONDS;
  if (raw === undefined || raw === '') return DEFAULT_HEALTH_TIMEOUT_SEC;
  const { min, max } = HEALTH_TIMEOUT_BOUNDS_SEC;
  const n = /^[0-9]+$/.test(raw.trim()) ? Number(raw.trim()) : Number.NaN;
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new OptionError(
      `environment variable ${HEALTH_TIMEOUT_ENV}=${JSON.stringify(raw)}: not a health-report timeout; ` +
        `it takes whole seconds from ${min} to ${max} (default ${DEFAULT_HEALTH_TIMEOUT_SEC})`,
    );
  }
  return n;
}

export class HealthStream {
  /** The pool every device of ours is in (the node's name). */
  private readonly pool: string;
  private readonly streams = new Set<HealthCall>();
  private readonly timers = new TimerOwner();
  private health: DraDeviceHealth[] = [];
  private closed = false;
  /** The health_check_timeout_seconds each report states. */
  readonly timeoutSec: number;

  /** timeoutSec: the timeout each report states (default 30 s); the list is sent again every third of it. */
  constructor(pool: string, timeoutSec: number = DEFAULT_HEALTH_TIMEOUT_SEC) {
    const { min, max } = HEALTH_TIMEOUT_BOUNDS_SEC;
    if (!Number.isInteger(timeoutSec) || timeoutSec < min || timeoutSec > max)
      throw new RangeError(`health stream of ${pool}: timeout ${timeoutSec} s is not whole seconds in ${min}–${max}`);
    this.pool = pool;
    this.timeoutSec = timeoutSec;
    this.timers.every('resend', resendPeriodMs(timeoutSec), () => this.send());
  }

  /** The health of `devices` in `snapshot` (startedSec: when a device never changed); sent if it differs. */
  update(snapshot: NodeSnapshot, devices: readonly DraNodeDevice[], startedSec: number): void {
    const next = deviceHealthList(snapshot, devices, startedSec);
    if (sameHealth(next, this.health)) return;
    this.health = next;
    this.send();
  }

  /** The DRAResourceHealth services, v1 and v1alpha1, for dra.sock. */
  bindings(): ServiceBinding[] {
    return HEALTH_VERSIONS.map((v) => ({
      definition: draHealthService(v),
      implementation: { NodeWatchResources: (call: HealthCall) => this.watch(call) },
    }));
  }

  /**
   * Ends each stream with an OK status and lets that reach the kubelet before the server goes (a
   * forced shutdown would cut it); a stream whose peer does not read is not waited on past 1 s.
   */
  async close(): Promise<void> {
    this.closed = true;
    this.timers.clear('resend');
    await Promise.all(
      [...this.streams].map((s, i) => {
        const ended = new Promise<void>((resolve) => {
          s.once('finish', resolve);
          s.once('close', resolve);
        });
        s.end();
        return Promise.race([ended, this.timers.sleep(`end-${i}`, END_WAIT_MS)]);
      }),
    );
    this.timers.dispose();
    this.streams.clear();
  }

  /** The whole list to every open stream (on a change, and every resend period so no report goes stale). */
  private send(): void {
    if (this.closed || this.streams.size === 0) return;
    const msg = this.message();
    for (const s of this.streams) s.write(msg);
  }

  private message(): NodeWatchResourcesResponse {
    return {
      devices: this.health.map((h) => ({
        device: { pool_name: this.pool, device_name: h.device },
        health: HEALTH_ON_WIRE[h.health],
        last_updated_time: h.lastUpdated,
        health_check_timeout_seconds: this.timeoutSec,
        message: h.message,
      })),
    };
  }

  private watch(call: HealthCall): void {
    if (this.closed) {
      call.end();
      return;
    }
    this.streams.add(call);
    const drop = (): void => {
      this.streams.delete(call);
    };
    call.on('cancelled', drop);
    call.on('close', drop);
    call.on('error', drop);
    call.write(this.message());
  }
}
