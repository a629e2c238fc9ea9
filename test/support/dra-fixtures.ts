// What a DRA node has beside the plugin, one copy for the unit, e2e and real-systemd tests: the
// NVIDIA Container Toolkit's CDI spec and a kubeconfig with a bearer token.

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
