// The device plugin API v1beta1 messages as plain data. Field names are the proto's own
// (protobufjs runs with keepCase), so what is written here is what travels on the wire.

export type Health = 'Healthy' | 'Unhealthy';

export type Empty = Record<never, never>;

export interface DevicePluginOptions {
  pre_start_required: boolean;
  get_preferred_allocation_available: boolean;
}

export interface RegisterRequest {
  version: string;
  endpoint: string;
  resource_name: string;
  options?: DevicePluginOptions | null;
}

export interface NUMANode {
  ID: number;
}

export interface TopologyInfo {
  nodes: NUMANode[];
}

export interface Device {
  ID: string;
  health: string;
  topology?: TopologyInfo | null;
}

export interface ListAndWatchResponse {
  devices: Device[];
}

export interface PreStartContainerRequest {
  devices_ids: string[];
}

export type PreStartContainerResponse = Record<never, never>;

export interface ContainerPreferredAllocationRequest {
  available_deviceIDs: string[];
  must_include_deviceIDs: string[];
  allocation_size: number;
}

export interface PreferredAllocationRequest {
  container_requests: ContainerPreferredAllocationRequest[];
}

export interface ContainerPreferredAllocationResponse {
  deviceIDs: string[];
}

export interface PreferredAllocationResponse {
  container_responses: ContainerPreferredAllocationResponse[];
}

export interface ContainerAllocateRequest {
  devices_ids: string[];
}

export interface AllocateRequest {
  container_requests: ContainerAllocateRequest[];
}

export interface Mount {
  container_path: string;
  host_path: string;
  read_only: boolean;
}

export interface DeviceSpec {
  container_path: string;
  host_path: string;
  permissions: string;
}

export interface CDIDevice {
  name: string;
}

export interface ContainerAllocateResponse {
  envs: Record<string, string>;
  mounts: Mount[];
  devices: DeviceSpec[];
  annotations: Record<string, string>;
  cdi_devices: CDIDevice[];
}

export interface AllocateResponse {
  container_responses: ContainerAllocateResponse[];
}

export const API_VERSION = 'v1beta1';
