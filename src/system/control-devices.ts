// Which of the NVIDIA control device nodes exist under the dev root (passed with --pass-device-specs).
import { access, constants as fsConstants } from 'node:fs/promises';
import { CONTROL_DEVICE_NODES, hostPath } from '../core/allocate.ts';

export async function presentControlDevices(devRoot: string): Promise<string[]> {
  const present: string[] = [];
  for (const p of CONTROL_DEVICE_NODES) {
    try {
      await access(hostPath(devRoot, p), fsConstants.F_OK);
      present.push(p);
    } catch {
      // absent: not passed
    }
  }
  return present;
}
