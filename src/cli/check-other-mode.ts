// `check`'s line on the kubelet API mode this node does not run: what switching to it would need, from what check
// sees of the unit's sandbox now.
import { dirname } from 'node:path';
import type { CheckLine } from './check-report.ts';
import type { UnitRead } from './host-view.ts';
import { DRA_DOCS, LINK_DROPIN } from './dra-install.ts';
import type { Options } from '../config/options.ts';
import { writableInSandbox } from './sandbox.ts';
import { networkInSandbox } from './sandbox-network.ts';

/** One line: what the mode this node does not run would need, from what check sees now. */
export async function otherModeLine(o: Options, unit: UnitRead, envFile: string): Promise<CheckLine> {
  if (o.kubeletApi === 'dra') {
    const dir = dirname(o.kubeletSocket);
    const ok = writableInSandbox(unit.sandbox, dir).writable;
    return {
      status: 'INFO',
      name: 'device-plugin mode',
      detail:
        `device-plugin mode would need: KUBELET_API=device-plugin (or unset) in ${envFile} ` +
        `and a restart; ${dir} writable (${ok ? 'the unit allows it' : 'the unit does NOT allow it'}); ` +
        `the kubelet removes this node's ResourceSlices 30 s after the DRA plugin ` +
        `stops, and pods asking nvidia.com/gpu are then served by the device plugin`,
    };
  }
  const network = networkInSandbox(unit.sandbox, '192.0.2.1').reachable !== false;
  const registry = writableInSandbox(unit.sandbox, o.kubeletPluginsRegistry).writable;
  const ready =
    network && registry
      ? "the unit's sandbox already allows it"
      : `the unit's sandbox does not allow it yet (` +
        [network ? '' : 'no network', registry ? '' : `${o.kubeletPluginsRegistry} read-only`]
          .filter((x) => x !== '')
          .join(', ') +
        `): ${LINK_DROPIN}`;
  return {
    status: 'INFO',
    name: 'DRA mode',
    detail:
      `to switch this node to DRA: KUBELET_API=dra and KUBECONFIG=<a node-scoped ` +
      `kubeconfig> in ${envFile}; ${ready}; the RBAC, admission policy and ` +
      `DeviceClass of ${dirname(DRA_DOCS)}; then systemctl restart gpu-device-plugin ` +
      `(try it first: gpu-device-plugin check --kubelet-api=dra --kubeconfig=FILE)`,
  };
}
