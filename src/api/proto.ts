// Codecs for the v1beta1 messages (protobufjs, from proto/deviceplugin.proto) and the gRPC service
// definitions built on them for @grpc/grpc-js. Nothing else in the program touches protobufjs.
import protobuf from 'protobufjs';
import type { MethodDefinition, ServiceDefinition } from '@grpc/grpc-js';
import { readAsset } from '../system/assets.ts';
import type * as M from './messages.ts';

export interface Codec<T> {
  encode(msg: T): Buffer;
  decode(buf: Buffer): T;
}

/** The codec of one message type, `<pkg>.<name>` in the parsed proto. */
export function codec<T>(root: protobuf.Root, name: string, pkg = 'v1beta1'): Codec<T> {
  const type = root.lookupType(`${pkg}.${name}`);
  return {
    encode(msg: T): Buffer {
      const err = type.verify(msg as Record<string, unknown>);
      if (err !== null) throw new TypeError(`cannot encode ${pkg}.${name}: ${err}`);
      // A verified plain object encodes as its Message would (fromObject only made a copy first).
      const bytes = type.encode(msg as Record<string, unknown>).finish();
      return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    },
    decode(buf: Buffer): T {
      return type.toObject(type.decode(buf), { longs: Number, defaults: true, arrays: true, objects: true }) as T;
    },
  };
}

export interface ApiCodecs {
  Empty: Codec<M.Empty>;
  DevicePluginOptions: Codec<M.DevicePluginOptions>;
  RegisterRequest: Codec<M.RegisterRequest>;
  ListAndWatchResponse: Codec<M.ListAndWatchResponse>;
  PreferredAllocationRequest: Codec<M.PreferredAllocationRequest>;
  PreferredAllocationResponse: Codec<M.PreferredAllocationResponse>;
  AllocateRequest: Codec<M.AllocateRequest>;
  AllocateResponse: Codec<M.AllocateResponse>;
  PreStartContainerRequest: Codec<M.PreStartContainerRequest>;
  PreStartContainerResponse: Codec<M.PreStartContainerResponse>;
}

export type ProtoFile =
  | 'deviceplugin.proto'
  | 'podresources.proto'
  | 'pluginregistration.proto'
  | 'dra-v1.proto'
  | 'dra-v1beta1.proto'
  | 'dra-health-v1alpha1.proto'
  | 'dra-health-v1.proto';

/** Every .proto file the program carries (the build makes a descriptor of each). */
export const PROTO_FILES: readonly ProtoFile[] = [
  'deviceplugin.proto',
  'podresources.proto',
  'pluginregistration.proto',
  'dra-v1.proto',
  'dra-v1beta1.proto',
  'dra-health-v1alpha1.proto',
  'dra-health-v1.proto',
];
export type ProtoDescriptors = Readonly<Record<ProtoFile, protobuf.INamespace>>;

/** A .proto file's text as protobufjs reads it (field names kept as written: they are the wire's). */
export function parseProto(text: string): protobuf.Root {
  return protobuf.parse(text, { keepCase: true }).root;
}

// Replaced by the build with each file's descriptor (parseProto(text).toJSON(), see build/build.ts),
// so that the executable does not parse the .proto text at every start.
declare const __PROTO_DESCRIPTORS__: ProtoDescriptors;
function builtDescriptors(): ProtoDescriptors | undefined {
  try {
    return __PROTO_DESCRIPTORS__;
  } catch {
    return undefined; // a source run: nothing was built in
  }
}

/** The resolved types of one of the program's .proto files. */
export function protoRoot(file: ProtoFile): protobuf.Root {
  const built = builtDescriptors()?.[file];
  const root = built === undefined ? parseProto(readAsset(file).toString('utf8')) : protobuf.Root.fromJSON(built);
  root.resolveAll();
  return root;
}

let codecs: ApiCodecs | undefined;

export function apiCodecs(): ApiCodecs {
  if (codecs === undefined) {
    const root = protoRoot('deviceplugin.proto');
    codecs = {
      Empty: codec(root, 'Empty'),
      DevicePluginOptions: codec(root, 'DevicePluginOptions'),
      RegisterRequest: codec(root, 'RegisterRequest'),
      ListAndWatchResponse: codec(root, 'ListAndWatchResponse'),
      PreferredAllocationRequest: codec(root, 'PreferredAllocationRequest'),
      PreferredAllocationResponse: codec(root, 'PreferredAllocationResponse'),
      AllocateRequest: codec(root, 'AllocateRequest'),
      AllocateResponse: codec(root, 'AllocateResponse'),
      PreStartContainerRequest: codec(root, 'PreStartContainerRequest'),
      PreStartContainerResponse: codec(root, 'PreStartContainerResponse'),
    };
  }
  return codecs;
}

/** A gRPC method definition for @grpc/grpc-js; `service` is `<Service>` in v1beta1 or `<pkg>.<Service>`. */
export function method<Req, Res>(
  service: string,
  name: string,
  req: Codec<Req>,
  res: Codec<Res>,
  responseStream = false,
): MethodDefinition<Req, Res> {
  return {
    path: `/${service.includes('.') ? service : `v1beta1.${service}`}/${name}`,
    requestStream: false,
    responseStream,
    requestSerialize: (m: Req) => req.encode(m),
    requestDeserialize: (b: Buffer) => req.decode(b),
    responseSerialize: (m: Res) => res.encode(m),
    responseDeserialize: (b: Buffer) => res.decode(b),
    originalName: name,
  };
}

export interface RegistrationService extends ServiceDefinition {
  Register: MethodDefinition<M.RegisterRequest, M.Empty>;
}

export interface DevicePluginService extends ServiceDefinition {
  GetDevicePluginOptions: MethodDefinition<M.Empty, M.DevicePluginOptions>;
  ListAndWatch: MethodDefinition<M.Empty, M.ListAndWatchResponse>;
  GetPreferredAllocation: MethodDefinition<M.PreferredAllocationRequest, M.PreferredAllocationResponse>;
  Allocate: MethodDefinition<M.AllocateRequest, M.AllocateResponse>;
  PreStartContainer: MethodDefinition<M.PreStartContainerRequest, M.PreStartContainerResponse>;
}

export function registrationService(): RegistrationService {
  const c = apiCodecs();
  return { Register: method('Registration', 'Register', c.RegisterRequest, c.Empty) };
}

export function devicePluginService(): DevicePluginService {
  const c = apiCodecs();
  return {
    GetDevicePluginOptions: method('DevicePlugin', 'GetDevicePluginOptions', c.Empty, c.DevicePluginOptions),
    ListAndWatch: method('DevicePlugin', 'ListAndWatch', c.Empty, c.ListAndWatchResponse, true),
    GetPreferredAllocation: method(
      'DevicePlugin',
      'GetPreferredAllocation',
      c.PreferredAllocationRequest,
      c.PreferredAllocationResponse,
    ),
    Allocate: method('DevicePlugin', 'Allocate', c.AllocateRequest, c.AllocateResponse),
    PreStartContainer: method(
      'DevicePlugin',
      'PreStartContainer',
      c.PreStartContainerRequest,
      c.PreStartContainerResponse,
    ),
  };
}
