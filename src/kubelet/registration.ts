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

/** The errno name in a connection error's text (grpc-js passes libuv's on: "connect ENOENT /path"). */
function errnoIn(text: string): string | undefined {
  return /\b(E[A-Z]{2,})\b/.exec(text)?.[1];
}

/**
 * What went wrong with a Register, said once: grpc-js's own text ("No connection established. Last
 * error: Error: connect ENOENT /path. Resolution note: ") repeats the path and says little, so a
 * failure to reach the kubelet is named by its errno, and only the kubelet's own refusal is quoted.
 */
export function registerProblem(kubeletSocket: string, code: grpc.status, details: string, timeoutMs: number): string {
  switch (code) {
    case grpc.status.UNAVAILABLE: {
      const errno = errnoIn(details);
      if (errno === 'ENOENT') return `no kubelet socket at ${kubeletSocket} (is the kubelet running?)`;
      if (errno === 'ECONNREFUSED')
        return (
          `nothing answers on the kubelet socket ${kubeletSocket} ` +
          `(ECONNREFUSED; the kubelet is stopping or starting)`
        );
      if (errno !== undefined) return `cannot connect to the kubelet socket ${kubeletSocket} (${errno})`;
      return `the kubelet at ${kubeletSocket} is unavailable`;
    }
    case grpc.status.CANCELLED:
      return `the kubelet at ${kubeletSocket} went away during the Register call`;
    case grpc.status.DEADLINE_EXCEEDED:
      return `the kubelet at ${kubeletSocket} did not answer the Register call within ${timeoutMs} ms`;
    default:
      return `the kubelet at ${kubeletSocket} refused the registration: ${details} (gRPC ${grpc.status[code] ?? code})`;
  }
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
          if (err)
            reject(
              new RegistrationError(
                registerProblem(this.kubeletSocket, err.code, err.details || err.message, timeoutMs),
                err.code,
              ),
            );
          else resolve();
        },
      );
    });
  }

  close(): void {
    this.client.close();
  }
}
