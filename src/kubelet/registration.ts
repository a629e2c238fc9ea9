// One Register call to the kubelet over its unix socket. A fresh channel per attempt, closed after,
// so thousands of kubelet restarts leave nothing behind.
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

export async function registerWithKubelet(kubeletSocket: string, request: M.RegisterRequest, timeoutMs: number): Promise<void> {
  const method = registrationService().Register;
  const client = new grpc.Client(`unix://${kubeletSocket}`, grpc.credentials.createInsecure(), {
    'grpc.enable_retries': 0,
    // A private subchannel pool: close() then really closes the connection. With the global pool a
    // closed client's connection lingers, one more per kubelet restart.
    'grpc.use_local_subchannel_pool': 1,
    'grpc.initial_reconnect_backoff_ms': 100,
  });
  try {
    await new Promise<void>((resolve, reject) => {
      client.makeUnaryRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        request,
        new grpc.Metadata(),
        { deadline: Date.now() + timeoutMs },
        (err) => {
          if (err) reject(new RegistrationError(`Register at ${kubeletSocket} failed: ${err.details || err.message}`, err.code));
          else resolve();
        },
      );
    });
  } finally {
    client.close();
  }
}
