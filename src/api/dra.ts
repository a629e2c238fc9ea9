// The kubelet's plugin registration API (proto/pluginregistration.proto) and DRA plugin API v1 and
// v1beta1 (proto/dra-v1.proto, proto/dra-v1beta1.proto), plus the optional resource health stream
// v1alpha1 and v1 (proto/dra-health-v1alpha1.proto, proto/dra-health-v1.proto; the same messages): their
// messages as plain data (field names as on the wire) and the codecs and service definitions for
// @grpc/grpc-js. No behaviour.
import type { MethodDefinition, ServiceDefinition } from '@grpc/grpc-js';
import { codec, method, protoRoot } from './proto.ts';
import type { Codec } from './proto.ts';

// ---- pluginregistration (package `pluginregistration`) ----

export type InfoRequest = Record<never, never>;

export interface PluginInfo {
  type: string;
  name: string;
  endpoint: string;
  supported_versions: string[];
}

export interface RegistrationStatus {
  plugin_registered: boolean;
  error: string;
}

export type RegistrationStatusResponse = Record<never, never>;

/** PluginInfo.type of a DRA driver. */
export const DRA_PLUGIN_TYPE = 'DRAPlugin';

export interface PluginRegistrationService extends ServiceDefinition {
  GetInfo: MethodDefinition<InfoRequest, PluginInfo>;
  NotifyRegistrationStatus: MethodDefinition<RegistrationStatus, RegistrationStatusResponse>;
}

let registration: PluginRegistrationService | undefined;

export function pluginRegistrationService(): PluginRegistrationService {
  if (registration === undefined) {
    const root = protoRoot('pluginregistration.proto');
    const pkg = 'pluginregistration';
    const c = {
      InfoRequest: codec<InfoRequest>(root, 'InfoRequest', pkg),
      PluginInfo: codec<PluginInfo>(root, 'PluginInfo', pkg),
      RegistrationStatus: codec<RegistrationStatus>(root, 'RegistrationStatus', pkg),
      RegistrationStatusResponse: codec<RegistrationStatusResponse>(root, 'RegistrationStatusResponse', pkg),
    };
    registration = {
      GetInfo: method(`${pkg}.Registration`, 'GetInfo', c.InfoRequest, c.PluginInfo),
      NotifyRegistrationStatus: method(
        `${pkg}.Registration`,
        'NotifyRegistrationStatus',
        c.RegistrationStatus,
        c.RegistrationStatusResponse,
      ),
    };
  }
  return registration;
}

// ---- DRAPlugin (packages k8s.io.kubelet.pkg.apis.dra.v1 and .v1beta1) ----

export type DraVersion = 'v1' | 'v1beta1';

/** The service name a driver announces in PluginInfo.supported_versions for each version. */
export const DRA_SERVICE_NAMES: Readonly<Record<DraVersion, string>> = {
  v1: 'v1.DRAPlugin',
  v1beta1: 'v1beta1.DRAPlugin',
};

/** The proto package of each version: the gRPC method paths carry it. */
export const DRA_PACKAGES: Readonly<Record<DraVersion, string>> = {
  v1: 'k8s.io.kubelet.pkg.apis.dra.v1',
  v1beta1: 'k8s.io.kubelet.pkg.apis.dra.v1beta1',
};

export interface Claim {
  namespace: string;
  uid: string;
  name: string;
}

export interface DraDevice {
  request_names: string[];
  pool_name: string;
  device_name: string;
  cdi_device_ids: string[];
  /** v1 only (1.35+); absent when the device is not shared. */
  share_id?: string;
}

export interface NodePrepareResourcesRequest {
  claims: Claim[];
}

export interface NodePrepareResourceResponse {
  devices: DraDevice[];
  error: string;
}

export interface NodePrepareResourcesResponse {
  /** Keyed by claim UID. */
  claims: Record<string, NodePrepareResourceResponse>;
}

export interface NodeUnprepareResourcesRequest {
  claims: Claim[];
}

export interface NodeUnprepareResourceResponse {
  error: string;
}

export interface NodeUnprepareResourcesResponse {
  /** Keyed by claim UID. */
  claims: Record<string, NodeUnprepareResourceResponse>;
}

export interface DraPluginService extends ServiceDefinition {
  NodePrepareResources: MethodDefinition<NodePrepareResourcesRequest, NodePrepareResourcesResponse>;
  NodeUnprepareResources: MethodDefinition<NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse>;
}

const draServices = new Map<DraVersion, DraPluginService>();

/** The DRAPlugin service of one version; v1beta1's Device has no share_id (one given is not sent). */
export function draPluginService(version: DraVersion): DraPluginService {
  let svc = draServices.get(version);
  if (svc === undefined) {
    const root = protoRoot(version === 'v1' ? 'dra-v1.proto' : 'dra-v1beta1.proto');
    const pkg = DRA_PACKAGES[version];
    const c = {
      NodePrepareResourcesRequest: codec<NodePrepareResourcesRequest>(root, 'NodePrepareResourcesRequest', pkg),
      NodePrepareResourcesResponse: codec<NodePrepareResourcesResponse>(root, 'NodePrepareResourcesResponse', pkg),
      NodeUnprepareResourcesRequest: codec<NodeUnprepareResourcesRequest>(root, 'NodeUnprepareResourcesRequest', pkg),
      NodeUnprepareResourcesResponse: codec<NodeUnprepareResourcesResponse>(
        root,
        'NodeUnprepareResourcesResponse',
        pkg,
      ),
    };
    svc = {
      NodePrepareResources: method(
        `${pkg}.DRAPlugin`,
        'NodePrepareResources',
        c.NodePrepareResourcesRequest,
        c.NodePrepareResourcesResponse,
      ),
      NodeUnprepareResources: method(
        `${pkg}.DRAPlugin`,
        'NodeUnprepareResources',
        c.NodeUnprepareResourcesRequest,
        c.NodeUnprepareResourcesResponse,
      ),
    };
    draServices.set(version, svc);
  }
  return svc;
}

// ---- DRAResourceHealth (packages `v1alpha1` and `v1`, the same messages) ----

/** v1alpha1: Kubernetes 1.34–1.36 (deprecated in 1.37); v1: 1.37, which prefers it when a plugin lists it. */
export type DraHealthVersion = 'v1' | 'v1alpha1';

/** The service name a driver announces for each version it serves; it is also the proto package's service. */
export const DRA_HEALTH_SERVICE_NAMES: Readonly<Record<DraHealthVersion, string>> = {
  v1: 'v1.DRAResourceHealth',
  v1alpha1: 'v1alpha1.DRAResourceHealth',
};

export type NodeWatchResourcesRequest = Record<never, never>;

/** HealthStatus as numbers on the wire: UNKNOWN 0, HEALTHY 1, UNHEALTHY 2. */
export const HealthStatus = { UNKNOWN: 0, HEALTHY: 1, UNHEALTHY: 2 } as const;
export type HealthStatus = (typeof HealthStatus)[keyof typeof HealthStatus];

export interface DeviceIdentifier {
  pool_name: string;
  device_name: string;
}

export interface DeviceHealth {
  device: DeviceIdentifier | null;
  health: HealthStatus;
  /** Unix seconds. */
  last_updated_time: number;
  health_check_timeout_seconds: number;
  message: string;
}

export interface NodeWatchResourcesResponse {
  devices: DeviceHealth[];
}

export interface DraHealthService extends ServiceDefinition {
  NodeWatchResources: MethodDefinition<NodeWatchResourcesRequest, NodeWatchResourcesResponse>;
}

const healthServices = new Map<DraHealthVersion, DraHealthService>();

/** The DRAResourceHealth service of one version: /<version>.DRAResourceHealth/NodeWatchResources. */
export function draHealthService(version: DraHealthVersion): DraHealthService {
  let svc = healthServices.get(version);
  if (svc === undefined) {
    const root = protoRoot(version === 'v1' ? 'dra-health-v1.proto' : 'dra-health-v1alpha1.proto');
    const req: Codec<NodeWatchResourcesRequest> = codec(root, 'NodeWatchResourcesRequest', version);
    const res: Codec<NodeWatchResourcesResponse> = codec(root, 'NodeWatchResourcesResponse', version);
    svc = { NodeWatchResources: method(DRA_HEALTH_SERVICE_NAMES[version], 'NodeWatchResources', req, res, true) };
    healthServices.set(version, svc);
  }
  return svc;
}
