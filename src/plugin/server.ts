// The DevicePlugin service served on a resource's unix socket, by the kubelet-facing layer's one
// socket server (kubelet/socket-server.ts): a request body that is not the message its method takes
// reaches the handlers as service.ts's undecodable marker, refused INVALID_ARGUMENT naming why.
import { devicePluginService } from '../api/proto.ts';
import type * as grpc from '@grpc/grpc-js';
import { UnixSocketServer } from '../kubelet/socket-server.ts';
import { undecodable } from './service.ts';
import type { DevicePluginHandlers } from './service.ts';

/** Serves a resource's handlers on `socketPath` (stop(removeSocket) removes the file only while it is ours). */
export function serveDevicePlugin(socketPath: string, handlers: DevicePluginHandlers): Promise<UnixSocketServer> {
  return UnixSocketServer.start(
    socketPath,
    [
      {
        definition: devicePluginService() as grpc.ServiceDefinition,
        implementation: handlers.implementation(),
        undecodable,
      },
    ],
    { missingDirHint: 'is the kubelet installed? --kubelet-socket names it' },
  );
}
