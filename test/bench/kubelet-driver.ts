// The kubelet stand-in (test/support/kubelet.ts) in a process of its own, for npm run bench: the
// bench driver forks this file (test/bench/remote-kubelet.ts) and sends it commands over the IPC
// channel; it times what a kubelet sees here, so the figures hold the plugin's work and one
// client's, not the bench driver's. Instants it reports are on the system-wide monotonic clock
// (monotonicMs in test/support/sim.ts), comparable with the plugin's spawn instant taken by the
// bench driver. Latencies are in milliseconds.
import * as grpc from '@grpc/grpc-js';
import { randomBytes, randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { apiCodecs, registrationService } from '../../src/api/proto.ts';
import type * as M from '../../src/api/messages.ts';
import { KubeletStandIn } from '../support/kubelet.ts';
import { monotonicMs, nvmlCommand } from '../support/sim.ts';

/** What a device list must look like (a predicate that can cross the IPC channel). */
export interface DeviceWant {
  length?: number;
  /** Indices that must be Unhealthy / Healthy. */
  unhealthy?: number[];
  healthy?: number[];
  allHealthy?: boolean;
}

export type HostileKind =
  | 'random-bytes-allocate'
  | 'random-bytes-preferred'
  | 'allocate-1mb-id'
  | 'allocate-10000-ids'
  | 'preferred-10000-ids';
export const HOSTILE_KINDS: readonly HostileKind[] = [
  'random-bytes-allocate',
  'random-bytes-preferred',
  'allocate-1mb-id',
  'allocate-10000-ids',
  'preferred-10000-ids',
];

export interface Commands {
  /** Serves Registration on <dir>/kubelet.sock (a stand-in already running is stopped first). */
  start: { args: { dir: string }; result: null };
  waitRegistered: { args: { n: number; timeoutMs: number }; result: { at: number; socketCreatedAt: number } };
  waitDevices: { args: { want: DeviceWant; resource?: string; timeoutMs: number }; result: { devices: number } };
  status: {
    args: Record<string, never>;
    result: { registrations: number; rejected: string[]; streamBreaks: number; updates: number; devices: number };
  };
  /** n sequential Allocate and n GetPreferredAllocation calls, alternating, through the kubelet's connection. */
  latency: { args: { n: number; uuids: string[] }; result: { allocate: number[]; preferred: number[] } };
  /** n more Allocate / GetPreferredAllocation calls (alternating), `concurrency` in flight, pre-encoded. */
  load: {
    args: { n: number; uuids: string[]; concurrency: number };
    result: { calls: number; failed: number; ms: number };
  };
  /** n kubelet restarts: kubelet.sock served again → Register received; then the full list again. */
  restarts: { args: { n: number; devices: number }; result: { reregistered: number[] } };
  /** n rounds: XID on a GPU (FIFO) → that GPU Unhealthy in ListAndWatch; then back Healthy (recovery on). */
  xid: { args: { rounds: number; control: string; gpus: number }; result: { unhealthy: number[] } };
  /** n hostile requests (kinds in turn), `concurrency` in flight; the status codes answered, by kind. */
  hostile: {
    args: { n: number; concurrency: number; uuids: string[] };
    result: { codes: Record<string, Record<string, number>>; latency: Record<string, number[]>; ms: number };
  };
  stop: { args: Record<string, never>; result: null };
}
export type Op = keyof Commands;
export interface Request<K extends Op = Op> {
  id: number;
  op: K;
  args: Commands[K]['args'];
}
export type Reply = { id: number; ok: true; result: unknown } | { id: number; ok: false; error: string };

// performance.now() (what the stand-in records) runs on the same clock as monotonicMs(), from another origin.
const offset = monotonicMs() - performance.now();
const mono = (perfNow: number): number => perfNow + offset;

const RESOURCE = 'nvidia.com/gpu';
const DEVICE_PLUGIN = '/v1beta1.DevicePlugin';
let kubelet: KubeletStandIn | undefined;
let raw: grpc.Client | undefined;
let streamBreaks = 0;

function standIn(): KubeletStandIn {
  if (kubelet === undefined) throw new Error('no stand-in: send start first');
  return kubelet;
}

function matches(d: M.Device[], w: DeviceWant): boolean {
  if (w.length !== undefined && d.length !== w.length) return false;
  if (w.unhealthy?.some((i) => d[i]?.health !== 'Unhealthy')) return false;
  if (w.healthy?.some((i) => d[i]?.health !== 'Healthy')) return false;
  if (w.allHealthy === true && !d.every((x) => x.health === 'Healthy')) return false;
  return true;
}

/** A connection of our own to the plugin for pre-encoded or hostile bodies (bytes in, bytes out). */
function rawClient(): grpc.Client {
  if (raw === undefined) {
    raw = new grpc.Client(
      `unix://${join(standIn().dir, 'gpu-device-plugin-gpu.sock')}`,
      grpc.credentials.createInsecure(),
      {
        'grpc.use_local_subchannel_pool': 1,
        'grpc.max_send_message_length': 64 << 20,
        'grpc.max_receive_message_length': 64 << 20,
      },
    );
  }
  return raw;
}

/** One unary call with a body as given; resolves with the status code (0 = OK). */
function rawCall(method: 'Allocate' | 'GetPreferredAllocation', body: Buffer): Promise<grpc.status> {
  const id = (b: Buffer): Buffer => b;
  return new Promise((resolve) => {
    rawClient().makeUnaryRequest(
      `${DEVICE_PLUGIN}/${method}`,
      id,
      id,
      body,
      new grpc.Metadata(),
      { deadline: Date.now() + 60000 },
      (err) => resolve(err ? (err.code ?? grpc.status.UNKNOWN) : grpc.status.OK),
    );
  });
}

/** Runs task(0..n-1) with `concurrency` in flight. */
async function pool(n: number, concurrency: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < n) await task(next++);
  };
  await Promise.all(Array.from({ length: Math.max(1, concurrency) }, worker));
}

/** A Register the stand-in refuses (bad version): warms its gRPC server path before a timed start. */
async function warmUp(k: KubeletStandIn): Promise<void> {
  const svc = registrationService();
  const client = new grpc.Client(`unix://${k.socketPath}`, grpc.credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
  });
  await new Promise<void>((resolve) => {
    client.makeUnaryRequest(
      svc.Register.path,
      svc.Register.requestSerialize,
      svc.Register.responseDeserialize,
      { version: 'warm-up', endpoint: 'none.sock', resource_name: 'example.com/warm-up' },
      new grpc.Metadata(),
      { deadline: Date.now() + 5000 },
      () => resolve(),
    );
  });
  client.close();
  k.rejected.length = 0;
}

const handlers: { [K in Op]: (a: Commands[K]['args']) => Promise<Commands[K]['result']> } = {
  async start({ dir }) {
    raw?.close();
    raw = undefined;
    await kubelet?.stop();
    kubelet = await KubeletStandIn.start(dir);
    streamBreaks = 0;
    kubelet.on('stream-broken', () => {
      streamBreaks++;
    });
    await warmUp(kubelet);
    return null;
  },
  async waitRegistered({ n, timeoutMs }) {
    const r = await standIn().waitForRegistrations(n, timeoutMs);
    return { at: mono(r.at), socketCreatedAt: mono(r.socketCreatedAt) };
  },
  async waitDevices({ want, resource, timeoutMs }) {
    const d = await standIn().waitForDevices((x) => matches(x, want), resource ?? RESOURCE, timeoutMs);
    return { devices: d.length };
  },
  async status() {
    const k = standIn();
    return {
      registrations: k.registrations.length,
      rejected: k.rejected.map((r) => r.reason),
      streamBreaks,
      updates: k.updates(),
      devices: k.devices()?.length ?? 0,
    };
  },
  async latency({ n, uuids }) {
    const k = standIn();
    const allocate: number[] = [];
    const preferred: number[] = [];
    const g = uuids.length;
    for (let i = 0; i < n; i++) {
      let t = performance.now();
      await k.allocate({ container_requests: [{ devices_ids: [uuids[i % g]!, uuids[(i + 3) % g]!] }] });
      allocate.push(performance.now() - t);
      t = performance.now();
      await k.preferred({
        container_requests: [{ available_deviceIDs: uuids, must_include_deviceIDs: [], allocation_size: 1 + (i % g) }],
      });
      preferred.push(performance.now() - t);
    }
    return { allocate, preferred };
  },
  async load({ n, uuids, concurrency }) {
    const c = apiCodecs();
    const g = uuids.length;
    const allocs = uuids.map((_, i) =>
      c.AllocateRequest.encode({ container_requests: [{ devices_ids: [uuids[i]!, uuids[(i + 3) % g]!] }] }),
    );
    const prefs = uuids.map((_, i) =>
      c.PreferredAllocationRequest.encode({
        container_requests: [{ available_deviceIDs: uuids, must_include_deviceIDs: [], allocation_size: 1 + i }],
      }),
    );
    let failed = 0;
    const t0 = performance.now();
    await pool(n, concurrency, async (i) => {
      const j = i >> 1;
      const code =
        i % 2 === 0
          ? await rawCall('Allocate', allocs[j % g]!)
          : await rawCall('GetPreferredAllocation', prefs[j % g]!);
      if (code !== grpc.status.OK) failed++;
    });
    return { calls: n, failed, ms: performance.now() - t0 };
  },
  async restarts({ n, devices }) {
    const k = standIn();
    const reregistered: number[] = [];
    for (let i = 0; i < n; i++) {
      const before = k.registrations.length;
      await k.restart();
      const reg = await k.waitForRegistrations(before + 1);
      reregistered.push(reg.at - reg.socketCreatedAt);
      await k.waitForDevices((d) => d.length === devices);
    }
    return { reregistered };
  },
  async xid({ rounds, control, gpus }) {
    const k = standIn();
    const unhealthy: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const g = i % gpus;
      const t0 = performance.now();
      nvmlCommand(control, `xid ${g} 94`);
      await k.waitForDevices((d) => d[g]?.health === 'Unhealthy');
      unhealthy.push(performance.now() - t0);
      await k.waitForDevices((d) => d[g]?.health === 'Healthy');
    }
    return { unhealthy };
  },
  async hostile({ n, concurrency, uuids }) {
    const c = apiCodecs();
    const unknown = Array.from({ length: 10000 }, () => `GPU-${randomUUID()}`);
    const bodies: Partial<Record<HostileKind, Buffer>> = {
      'allocate-1mb-id': c.AllocateRequest.encode({
        container_requests: [{ devices_ids: [`GPU-${'f'.repeat((1 << 20) - 4)}`] }],
      }),
      // Unknown IDs with the node's real ones among them.
      'allocate-10000-ids': c.AllocateRequest.encode({
        container_requests: [{ devices_ids: [...uuids, ...unknown.slice(uuids.length)] }],
      }),
      'preferred-10000-ids': c.PreferredAllocationRequest.encode({
        container_requests: [
          {
            available_deviceIDs: [...uuids, ...unknown.slice(uuids.length)],
            must_include_deviceIDs: unknown.slice(uuids.length, uuids.length + 2),
            allocation_size: 4,
          },
        ],
      }),
    };
    const codes: Record<string, Record<string, number>> = {};
    const latency: Record<string, number[]> = {};
    const t0 = performance.now();
    await pool(n, concurrency, async (i) => {
      const kind = HOSTILE_KINDS[i % HOSTILE_KINDS.length]!;
      const body = bodies[kind] ?? randomBytes(1 + ((i * 7919) % 4096));
      const t = performance.now();
      const code = await rawCall(kind.includes('preferred') ? 'GetPreferredAllocation' : 'Allocate', body);
      latency[kind] ??= [];
      latency[kind].push(performance.now() - t);
      codes[kind] ??= {};
      const byKind = codes[kind];
      const name = grpc.status[code] ?? String(code);
      byKind[name] = (byKind[name] ?? 0) + 1;
    });
    return { codes, latency, ms: performance.now() - t0 };
  },
  async stop() {
    raw?.close();
    raw = undefined;
    await kubelet?.stop();
    kubelet = undefined;
    return null;
  },
};

process.on('message', (msg: Request) => {
  const handler = handlers[msg.op] as (a: unknown) => Promise<unknown>;
  handler(msg.args).then(
    (result) => process.send?.({ id: msg.id, ok: true, result } satisfies Reply),
    (err: unknown) =>
      process.send?.({
        id: msg.id,
        ok: false,
        error: err instanceof Error ? (err.stack ?? err.message) : String(err),
      } satisfies Reply),
  );
});
process.on('disconnect', () => process.exit(0));
process.send?.({ id: 0, ok: true, result: 'ready' } satisfies Reply);
