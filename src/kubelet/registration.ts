// One Register call to the kubelet over its unix socket. A fresh channel per attempt, closed after,
// so thousands of kubelet restarts leave nothing behind. (A channel kept across attempts would not
// be cheaper: after a kubelet restart its connection is dead and it would reconnect with backoff.)
import * as grpc from '@grpc/grpc-js';
import { registrationService } from '../api/proto.ts';
import type * as M from '../api/messages.ts';
import type { Logger } from '../system/log.ts';

/**
 * grpc-js prints some errors itself on stderr ("E No address added out of total 1 resolved", once
 * per failed listen). The same errors reach us as rejected calls, which are logged once per change
 * of state; grpc's own lines go to the debug level instead.
 */
export function routeGrpcLogs(log: Logger): void {
  grpc.setLogger({ error: (...args: unknown[]) => log.debug('grpc', { message: args.map(String).join(' ') }) });
}

export class RegistrationError extends Error {
  override name = 'RegistrationError';
  readonly code: grpc.status;
  constructor(message: string, code: grpc.status) {
    super(message);
    this.code = code;
  }
}

/**
 * A connection to the kubelet's Registration service for one attempt: made when asked (it starts
 * connecting at once, so the connection set-up can overlap other work such as serving our socket
 * again), used for one Register call, then closed. A private subchannel pool: close() then really
 * closes the connection (with the global pool a closed client's connection lingers, one more per
 * kubelet restart).
 */
export class KubeletConnection {
  readonly kubeletSocket: string;
  private readonly client: grpc.Client;

  private constructor(kubeletSocket: string) {
    this.kubeletSocket = kubeletSocket;
    this.client = new grpc.Client(`unix://${kubeletSocket}`, grpc.credentials.createInsecure(), {
      'grpc.enable_retries': 0,
      'grpc.use_local_subchannel_pool': 1,
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.enable_channelz': 0,
    });
  }

  /** A new connection, connecting from now on. */
  static open(kubeletSocket: string): KubeletConnection {
    const c = new KubeletConnection(kubeletSocket);
    c.client.getChannel().getConnectivityState(true);
    return c;
  }

  register(request: M.RegisterRequest, timeoutMs: number): Promise<void> {
    const method = registrationService().Register;
    return new Promise<void>((resolve, reject) => {
      this.client.makeUnaryRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        request,
        new grpc.Metadata(),
        { deadline: Date.now() + timeoutMs },
        (err) => {
          if (err) reject(new RegistrationError(`Register at ${this.kubeletSocket} failed: ${err.details || err.message}`, err.code));
          else resolve();
        },
      );
    });
  }

  close(): void {
    this.client.close();
  }
}
