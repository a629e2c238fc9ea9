// What a DRA node has beside the plugin, one copy for the unit, e2e and real-systemd tests: the
// NVIDIA Container Toolkit's CDI spec and a kubeconfig with a bearer token; and the small node, claim and MPS
// setting the unit tests of DRA sharing (the plugin's side and the agent's) share.
import type { GpuSharing } from '../../src/core/dra-gpu-config.ts';
import type { HostDevice } from '../../src/core/dra-sharing.ts';

/** A device of the spec: its CDI name and the device node its containerEdits hold. */
export interface CdiDevice {
  name: string;
  node: string;
}

/** Devices as `nvidia-ctk cdi generate` names them by index: "<gpu>" or MIG "<gpu>:<mig>", with /dev/nvidia<gpu>. */
export function byIndex(names: readonly string[]): CdiDevice[] {
  return names.map((name) => ({ name, node: `/dev/nvidia${name.split(':')[0]}` }));
}

/**
 * The toolkit's spec as `nvidia-ctk cdi generate` writes it (to /etc/cdi/nvidia.yaml by default): the
 * devices, "all" with every device node, and the control devices every container gets.
 */
export function cdiSpec(devices: readonly CdiDevice[]): string {
  const lines = ['cdiVersion: 0.5.0', 'kind: nvidia.com/gpu', 'devices:'];
  for (const d of devices)
    lines.push(`- name: "${d.name}"`, '  containerEdits:', '    deviceNodes:', `    - path: ${d.node}`);
  const all = [...new Set(devices.map((d) => d.node))];
  lines.push('- name: all', '  containerEdits:', '    deviceNodes:', ...all.map((n) => `    - path: ${n}`));
  lines.push('containerEdits:', '  deviceNodes:', '  - path: /dev/nvidiactl', '  - path: /dev/nvidia-uvm');
  return `${lines.join('\n')}\n`;
}

/** A kubeconfig with a bearer token (a ServiceAccount token works as well as a client certificate). */
export function tokenKubeconfig(server: string, token: string): string {
  return `${[
    'apiVersion: v1',
    'kind: Config',
    'current-context: node',
    'clusters:',
    '- name: cluster',
    '  cluster:',
    `    server: ${server}`,
    'users:',
    '- name: node',
    '  user:',
    `    token: ${token}`,
    'contexts:',
    '- name: node',
    '  context:',
    '    cluster: cluster',
    '    user: node',
  ].join('\n')}\n`;
}

/** The host side of DRA sharing in unit tests: two whole GPUs and one MIG device of a third, 80 GB each. */
export const GiB = 2 ** 30;
export const SHARING_NODE: HostDevice[] = [
  { name: 'gpu-0', gpuUuid: 'GPU-0', gpuIndex: 0, minor: 0, memoryBytes: 80 * GiB },
  { name: 'gpu-1', gpuUuid: 'GPU-1', gpuIndex: 1, minor: 1, memoryBytes: 80 * GiB },
  {
    name: 'gpu-2-mig-1g10gb-19-0',
    gpuUuid: 'GPU-2',
    gpuIndex: 2,
    minor: 2,
    memoryBytes: 10 * GiB,
    mig: { uuid: 'MIG-2a', index: 0 },
  },
];
/** The claim those tests share a GPU for. */
export const SHARING_CLAIM = { namespace: 'team-a', name: 'c1', uid: 'uid-1' };
/** GpuConfig's MPS sharing with these settings. */
export const mpsSharing = (extra: object = {}): GpuSharing => ({ strategy: 'MPS', ...extra });
