// The kubelet's PodResources API v1 (proto/podresources.proto): its List messages as plain data
// (field names as on the wire) and the codecs and method definition for @grpc/grpc-js.
import type { MethodDefinition, ServiceDefinition } from '@grpc/grpc-js';
import { codec, method, protoRoot } from './proto.ts';
import type { Codec } from './proto.ts';

export type ListPodResourcesRequest = Record<never, never>;

export interface ContainerDevices {
  resource_name: string;
  device_ids: string[];
  topology?: { nodes: { ID: number }[] } | null;
}

export interface ContainerResources {
  name: string;
  devices: ContainerDevices[];
}

export interface PodResources {
  name: string;
  namespace: string;
  containers: ContainerResources[];
}

export interface ListPodResourcesResponse {
  pod_resources: PodResources[];
}

export interface PodResourcesCodecs {
  ListPodResourcesRequest: Codec<ListPodResourcesRequest>;
  ListPodResourcesResponse: Codec<ListPodResourcesResponse>;
}

let codecs: PodResourcesCodecs | undefined;

export function podResourcesCodecs(): PodResourcesCodecs {
  if (codecs === undefined) {
    const root = protoRoot('podresources.proto');
    codecs = {
      ListPodResourcesRequest: codec(root, 'ListPodResourcesRequest', 'v1'),
      ListPodResourcesResponse: codec(root, 'ListPodResourcesResponse', 'v1'),
    };
  }
  return codecs;
}

export interface PodResourcesListerService extends ServiceDefinition {
  List: MethodDefinition<ListPodResourcesRequest, ListPodResourcesResponse>;
}

export function podResourcesService(): PodResourcesListerService {
  const c = podResourcesCodecs();
  return { List: method('v1.PodResourcesLister', 'List', c.ListPodResourcesRequest, c.ListPodResourcesResponse) };
}
