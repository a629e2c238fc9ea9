// The Node floor for npm run bench: the runtime the executable embeds, run as plain Node. It is a
// copy of the built executable itself with its single-executable fuse set back to "not a SEA", so
// every byte of the runtime (stripped, the blob still inside) is the one the plugin runs on; copied
// the way test/support/sim.ts copies the plugin (copy_file_range), because how a file's pages got
// into the page cache changes how much of it a process maps at a fault (file-backed RSS): the same
// runtime written with write() (as the build does) peaks near twice as high at `node -e 0`.
import { spawn, spawnSync } from 'node:child_process';
import { closeSync, copyFileSync, existsSync, mkdtempSync, openSync, readFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BUILT_EXECUTABLE, monotonicMs } from '../support/sim.ts';

const GNU_TIME = '/usr/bin/time';

/** The built executable's runtime as plain Node (see above); checks it is Node and not the plugin. */
export function floorRuntime(): { path: string; version: string } {
  if (!existsSync(BUILT_EXECUTABLE)) throw new Error(`${BUILT_EXECUTABLE} is missing; run npm run build first`);
  const path = join(mkdtempSync(join(tmpdir(), 'gdp-floor-')), 'node');
  copyFileSync(BUILT_EXECUTABLE, path);
  // NODE_SEA_FUSE_<32 hex>:1 in an injected executable; :0 makes Node ignore the blob.
  const bytes = readFileSync(path);
  const at = bytes.indexOf('NODE_SEA_FUSE_');
  const fuse = at < 0 ? '' : bytes.toString('latin1', at, at + 48);
  if (!/^NODE_SEA_FUSE_[0-9a-f]{32}:1$/.test(fuse))
    throw new Error(
      `no set single-executable fuse in ${BUILT_EXECUTABLE} (${JSON.stringify(fuse)}); is it a Node SEA?`,
    );
  const fd = openSync(path, 'r+');
  try {
    writeSync(fd, '0', at + fuse.length - 1, 'latin1');
  } finally {
    closeSync(fd);
  }
  const probe = spawnSync(path, ['-p', `require('node:sea').isSea() + ' ' + process.version`], { encoding: 'utf8' });
  const [sea, version] = probe.stdout.trim().split(' ');
  if (probe.status !== 0 || sea !== 'false' || version === undefined) {
    throw new Error(
      `the floor runtime ${path} did not run as plain Node: ` +
        `status ${probe.status}, ${JSON.stringify(probe.stdout + probe.stderr)}`,
    );
  }
  return { path, version };
}

/** Milliseconds from just before the spawn to the exit event (the plugin's start is timed from the same instant). */
export function timeToExit(cmd: string, args: readonly string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = monotonicMs();
    const child = spawn(cmd, args, { stdio: 'ignore' });
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      const ms = monotonicMs() - t0;
      if (code === 0) resolve(ms);
      else reject(new Error(`${cmd} ${args.join(' ')} exited with ${code ?? signal}`));
    });
  });
}

/** Peak resident set (VmHWM, as wait4's ru_maxrss) of one run, in KiB, through GNU time. */
export function peakRssKiB(cmd: string, args: readonly string[]): number {
  if (!existsSync(GNU_TIME))
    throw new Error(`${GNU_TIME} is missing (Debian package time); bash build/install-tools.sh installs it`);
  const r = spawnSync(GNU_TIME, ['-f', 'maxrss=%M', cmd, ...args], {
    encoding: 'utf8',
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const kib = /maxrss=(\d+)\s*$/.exec(r.stderr)?.[1];
  if (r.status !== 0 || kib === undefined)
    throw new Error(`${GNU_TIME} ${cmd} ${args.join(' ')}: status ${r.status}, ${r.stderr}`);
  return Number(kib);
}
