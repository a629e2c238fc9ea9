// The DevicePlugin service: answers the kubelet from the current device state and pushes the full
// device list to every open ListAndWatch stream whenever it changes.
import * as grpc from '@grpc/grpc-js';
import type { ServerUnaryCall, ServerWritableStream, sendUnaryData, UntypedServiceImplementation } from '@grpc/grpc-js';
import type * as M from '../api/messages.ts';
import { apiCodecs } from '../api/proto.ts';
import { allocate, showId } from '../core/allocate.ts';
import type { AllocateSettings, DeviceIndex } from '../core/allocate.ts';
import { deviceList } from '../core/devices.ts';
import { NO_RECORDER, OUTCOME, RPC } from '../core/metrics.ts';
import type { RpcOutcomeId, RpcRecorder } from '../core/metrics.ts';
import type { AdvertisedDevice, Gpu, GpuHealth } from '../core/devices.ts';
import { preferredAllocation } from '../core/preferred.ts';
import type { GpuChooser } from '../core/preferred.ts';
import type { SharedAllocationPolicy } from '../core/sharing.ts';
import { RequestError } from '../core/request-error.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';

export interface PluginState {
  readonly gpus: readonly Gpu[];
  readonly devices: readonly AdvertisedDevice[];
  readonly index: DeviceIndex;
  readonly health: GpuHealth;
  /** Chooses whole GPUs (the topology policy). */
  readonly chooser: GpuChooser;
  /** Chooses replicas, for a resource with time-slicing (default distributed). */
  readonly sharedPolicy?: SharedAllocationPolicy;
  readonly allocateSettings: AllocateSettings;
  /** Device IDs this resource advertised until a recent re-discovery, with why they left. */
  readonly vanished?: ReadonlyMap<string, string>;
}

/**
 * What a ListAndWatch stream is written: the list, already encoded (server.ts passes bytes through
 * its serializer), so it is encoded once per change however many streams are open.
 */
export type EncodedList = Buffer;

interface OpenStream {
  readonly call: ServerWritableStream<M.Empty, EncodedList>;
  waitingDrain: boolean;
  pending: boolean;
}

export const PLUGIN_OPTIONS: M.DevicePluginOptions = {
  pre_start_required: false,
  get_preferred_allocation_available: true,
};

const UNDECODABLE: unique symbol = Symbol('undecodable request');

/** A request body that is not the message its method takes (see server.ts). */
export interface Undecodable {
  readonly [UNDECODABLE]: string;
}

const REQUEST_TYPE: Readonly<Record<string, string>> = {
  GetDevicePluginOptions: 'v1beta1.Empty',
  ListAndWatch: 'v1beta1.Empty',
  GetPreferredAllocation: 'v1beta1.PreferredAllocationRequest',
  Allocate: 'v1beta1.AllocateRequest',
  PreStartContainer: 'v1beta1.PreStartContainerRequest',
};

/** The marker a request decoder returns instead of throwing: the handler refuses it, naming why. */
export function undecodable(method: string, err: unknown): Undecodable {
  return {
    [UNDECODABLE]:
      `${method} request is not a valid ${REQUEST_TYPE[method] ?? 'request'} ` +
      `(protobuf decoding failed: ${errorText(err)})`,
  };
}

/** Throws RequestError when the request could not be decoded. */
function decoded<T extends object>(request: T | Undecodable): T {
  if (UNDECODABLE in request) throw new RequestError(request[UNDECODABLE]);
  return request;
}

function encodeList(state: PluginState): EncodedList {
  return apiCodecs().ListAndWatchResponse.encode({ devices: deviceList(state.devices, state.gpus, state.health) });
}

export class DevicePluginHandlers {
  private state: PluginState;
  private list: EncodedList;
  private readonly streams = new Set<OpenStream>();
  private readonly log: Logger;
  /** Counts every RPC answered (metrics); by default counts nothing. */
  private readonly recorder: RpcRecorder;
  private optionsAnswered = 0;
  /**
   * Called when the peer closed the last open ListAndWatch stream (not when endStreams() ends them):
   * the kubelet keeps one open while the registration stands, so its going means the registration is lost.
   */
  onLastStreamClosed: (() => void) | undefined;

  constructor(state: PluginState, log: Logger, recorder: RpcRecorder = NO_RECORDER) {
    this.state = state;
    this.list = encodeList(state);
    this.log = log;
    this.recorder = recorder;
  }

  get current(): PluginState {
    return this.state;
  }

  get openStreams(): number {
    return this.streams.size;
  }

  /**
   * GetDevicePluginOptions calls answered so far: a kubelet makes one as it connects during a
   * Register, so a registration can tell whether the kubelet reached the server it was sent for.
   */
  get optionsCalls(): number {
    return this.optionsAnswered;
  }

  /** Replaces the state and, if the device list changed, sends it to every open stream. */
  update(state: PluginState): void {
    this.state = state;
    const next = encodeList(state);
    if (next.equals(this.list)) return;
    this.list = next;
    for (const s of this.streams) this.send(s);
  }

  private send(s: OpenStream): void {
    if (s.waitingDrain) {
      // The peer is slow: keep only the newest list for it (full lists, so nothing is lost).
      s.pending = true;
      return;
    }
    s.pending = false;
    const flushed = s.call.write(this.list);
    if (!flushed) {
      s.waitingDrain = true;
      s.call.once('drain', () => {
        s.waitingDrain = false;
        if (s.pending) this.send(s);
      });
    }
  }

  /** Ends every open stream (on stop or when the socket is replaced). */
  endStreams(): void {
    for (const s of this.streams) s.call.end();
    this.streams.clear();
  }

  /** A request naming a device that has just left the node is refused naming it and why. */
  private refuseVanished(ids: (gone: ReadonlyMap<string, string>) => Iterable<string>): void {
    const gone = this.state.vanished;
    if (gone === undefined || gone.size === 0) return;
    for (const id of ids(gone)) {
      const why = gone.get(id);
      if (why !== undefined && !this.state.index.byId.has(id))
        throw new RequestError(`device ID ${showId(id)} is no longer on this node: ${why}`);
    }
  }

  private fail<T>(method: string, err: unknown, cb: sendUnaryData<T>): RpcOutcomeId {
    if (err instanceof RequestError) {
      this.log.warn(`${method} refused`, { reason: err.message });
      cb({ code: grpc.status.INVALID_ARGUMENT, details: err.message });
      return OUTCOME.refused;
    }
    this.log.error(`${method} failed`, { error: errorText(err) });
    cb({ code: grpc.status.INTERNAL, details: `${method} failed: ${errorText(err)}` });
    return OUTCOME.error;
  }

  /**
   * The five DevicePlugin RPCs. Each unary one goes through unary(): decode, answer, map a thrown
   * error to a gRPC status, record the outcome.
   */
  implementation(): UntypedServiceImplementation {
    return {
      GetDevicePluginOptions: this.unary<M.Empty, M.DevicePluginOptions>('GetDevicePluginOptions', false, () => {
        this.optionsAnswered++;
        return PLUGIN_OPTIONS;
      }),
      ListAndWatch: (call: ServerWritableStream<M.Empty | Undecodable, EncodedList>) => this.listAndWatch(call),
      GetPreferredAllocation: this.unary('GetPreferredAllocation', true, (request: M.PreferredAllocationRequest) =>
        this.preferredAnswer(request),
      ),
      Allocate: this.unary('Allocate', true, (request: M.AllocateRequest) => this.allocateAnswer(request)),
      PreStartContainer: this.unary<M.PreStartContainerRequest, M.PreStartContainerResponse>(
        'PreStartContainer',
        false,
        () => ({}),
      ),
    };
  }

  /**
   * The shape every unary RPC shares: decodes the request (refusing one that is not its message),
   * answers it, maps a thrown error to INVALID_ARGUMENT (RequestError) or INTERNAL, and records the
   * outcome — with the seconds taken when `timed`, else 0.
   */
  private unary<Req extends object, Res>(
    method: Exclude<keyof typeof RPC, 'ListAndWatch'>,
    timed: boolean,
    answer: (request: Req) => Res,
  ): (call: ServerUnaryCall<Req | Undecodable, Res>, cb: sendUnaryData<Res>) => void {
    return (call, cb) => {
      const t0 = timed ? performance.now() : 0;
      let outcome: RpcOutcomeId = OUTCOME.ok;
      try {
        cb(null, answer(decoded(call.request)));
      } catch (err) {
        outcome = this.fail(method, err, cb);
      }
      this.recorder.rpc(RPC[method], outcome, timed ? (performance.now() - t0) / 1000 : 0);
    };
  }

  /** ListAndWatch: refuses an undecodable request on the stream, else opens it and sends the list. */
  private listAndWatch(call: ServerWritableStream<M.Empty | Undecodable, EncodedList>): void {
    try {
      decoded(call.request);
    } catch (err) {
      const outcome = this.fail('ListAndWatch', err, (status) => {
        if (status !== null) call.emit('error', status);
        call.end();
      });
      this.recorder.rpc(RPC.ListAndWatch, outcome, 0);
      return;
    }
    this.openStream(call);
    this.recorder.rpc(RPC.ListAndWatch, OUTCOME.ok, 0);
  }

  /** Keeps the stream until the peer closes it, and writes it the current list. */
  private openStream(call: ServerWritableStream<M.Empty | Undecodable, EncodedList>): void {
    const s: OpenStream = { call, waitingDrain: false, pending: false };
    this.streams.add(s);
    const release = (): void => {
      if (this.streams.delete(s) && this.streams.size === 0) this.onLastStreamClosed?.();
    };
    call.on('cancelled', release);
    call.on('close', release);
    call.on('error', release);
    this.log.debug('ListAndWatch stream opened', { streams: this.streams.size });
    this.send(s);
  }

  /** GetPreferredAllocation's answer from the current state. */
  private preferredAnswer(request: M.PreferredAllocationRequest): M.PreferredAllocationResponse {
    const st = this.state;
    const containers = request.container_requests;
    this.refuseVanished(() => containers.flatMap((c) => [...c.available_deviceIDs, ...c.must_include_deviceIDs]));
    const answers = preferredAllocation(containers, st.index, st.chooser, st.sharedPolicy);
    if (this.log.enabled('debug'))
      this.log.debug('GetPreferredAllocation', { answers: answers.map((a) => a.join('+')) });
    return { container_responses: answers.map((deviceIDs) => ({ deviceIDs })) };
  }

  /** Allocate's answer from the current state. */
  private allocateAnswer(request: M.AllocateRequest): M.AllocateResponse {
    const st = this.state;
    const containers = request.container_requests;
    this.refuseVanished(() => containers.flatMap((c) => c.devices_ids));
    const responses = allocate(containers, st.index, st.allocateSettings);
    if (this.log.enabled('debug')) {
      this.log.debug('Allocate', {
        visible: responses.map((r) => r.envs.NVIDIA_VISIBLE_DEVICES ?? ''),
        cdi: responses.map((r) => [...Object.values(r.annotations), ...r.cdi_devices.map((d) => d.name)].join(' ')),
      });
    }
    return { container_responses: responses };
  }
}
