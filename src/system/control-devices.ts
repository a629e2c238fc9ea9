// Which device nodes exist under the dev root: the NVIDIA control nodes (passed with
// --pass-device-specs) and any other list of nodes a caller asks about (IMEX channels, system/imex.ts).
import { access, constants as fsConstants } from 'node:fs/promises';
import { CONTROL_DEVICE_NODES, hostPath } from '../core/allocate.ts';

/** The container paths of `paths` whose node exists under devRoot, in the order given. */
export async function presentDeviceNodes(devRoot: string, paths: readonly string[]): Promise<string[]> {
  const present: string[] = [];
  for (const p of paths) {
    try {
      await access(hostPath(devRoot, p), fsConstants.F_OK);
      present.push(p);
    } catch {
      // absent: the caller decides what that means
    }
  }
  return present;
}

export function presentControlDevices(devRoot: string): Promise<string[]> {
  return presentDeviceNodes(devRoot, CONTROL_DEVICE_NODES);
}
