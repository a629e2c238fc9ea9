// The DRAResourceHealth stream served on dra.sock, in both versions the kubelets speak: v1alpha1 (1.34–1.36)
// and v1 (1.37, which opens it when the registration lists it; the same messages). Every stream, of either
// version, gets the complete health list of this node's devices when it opens, and again whenever the list
// says something new (a device turned unhealthy, recovered, came or went). The list itself is
// core/dra-health.ts's, from the snapshot's health model.
import type * as grpc from '@grpc/grpc-js';
import { HealthStatus, draHealthService } from '../api/dra.ts';
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

export class HealthStream {
  /** The pool every device of ours is in (the node's name). */
  private readonly pool: string;
  private readonly streams = new Set<HealthCall>();
  private readonly timers = new TimerOwner();
  private health: DraDeviceHealth[] = [];
  private closed = false;

  constructor(pool: string) {
    this.pool = pool;
  }

  /** The health of `devices` in `snapshot` (startedSec: when a device never changed); sent if it differs. */
  update(snapshot: NodeSnapshot, devices: readonly DraNodeDevice[], startedSec: number): void {
    const next = deviceHealthList(snapshot, devices, startedSec);
    if (sameHealth(next, this.health)) return;
    this.health = next;
    const msg = this.message();
    for (const s of this.streams) s.write(msg);
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

  private message(): NodeWatchResourcesResponse {
    return {
      devices: this.health.map((h) => ({
        device: { pool_name: this.pool, device_name: h.device },
        health: HEALTH_ON_WIRE[h.health],
        last_updated_time: h.lastUpdated,
        health_check_timeout_seconds: 0,
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
