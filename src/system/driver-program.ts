// The NVIDIA driver's programs (nvidia-cuda-mps-control, nvidia-smi): looked for under the driver root's usual
// binary folders first, then on PATH, each time they are needed, so one installed later is found.
import { access, constants } from 'node:fs/promises';
import { delimiter, join } from 'node:path';

/** The program's path, or the places looked at (for an error that names them). */
export async function findDriverProgram(
  program: string,
  driverRoot: string,
  path: string | undefined = process.env.PATH,
): Promise<{ path: string } | { looked: string[] }> {
  const dirs = [
    join(driverRoot, 'usr/bin'),
    join(driverRoot, 'usr/local/bin'),
    join(driverRoot, 'bin'),
    ...(path ?? '').split(delimiter).filter((d) => d.length > 0),
  ];
  const looked: string[] = [];
  for (const dir of [...new Set(dirs)]) {
    const candidate = join(dir, program);
    looked.push(candidate);
    try {
      await access(candidate, constants.X_OK);
      return { path: candidate };
    } catch {
      // not here
    }
  }
  return { looked };
}
