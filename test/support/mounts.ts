// Mount points a test left under its directory (an MPS shm tmpfs is a real mount: the machine is root), read
// from /proc/self/mountinfo, and their removal, so a failed test leaves no mount behind.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

/** Mount points under dir, deepest first. */
export function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length);
}

/** Lazily unmounts everything under dir, deepest first. */
export function unmountUnder(dir: string): void {
  for (const m of mountsUnder(dir)) spawnSync('umount', ['-l', m]);
}
