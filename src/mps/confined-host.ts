// An MpsHost whose files, directories and shm mount stay inside one tree (a DRA claim's root under
// <MPS root>/dra/claims) whatever another process put there: the DRA sharing agent runs as root in a tree the
// plugin's requests reach, so each of these goes through system/safe-fs.ts — no symlink followed, a directory
// that is not a real one of ours refused, files replaced through O_EXCL|O_NOFOLLOW temp files, removal that
// never leaves the tree, the tmpfs mounted on the directory checked and unmounted by its exact path.
// Compute modes, the control daemon and its commands are the wrapped host's. The tmpfs has the size the
// operator gives each claim (--dra-mps-shm-size).
import { ensureDir, isMountedAt, mountTmpfs, removeTree, unmountAt, writeFileSafely } from '../system/safe-fs.ts';
import type { MpsHost } from './daemon.ts';

/**
 * `host` with every file-system operation confined below `base` (which must exist: a real directory of ours), its
 * shm tmpfs `shmBytes` large.
 */
export function confinedHost(host: MpsHost, base: string, shmBytes: number): MpsHost {
  return {
    setComputeMode: (gpu, mode) => host.setComputeMode(gpu, mode),
    makeDirs: (dir) => ensureDir(base, dir, 0o755),
    writeFile: (path, text) => writeFileSafely(base, path, text, 0o644),
    remove: (path) => removeTree(base, path),
    mountShm: async (dir) => {
      const size = `${Math.max(1, Math.floor(shmBytes / 1024))}k`;
      if (await isMountedAt(base, dir)) return { mounted: false, size };
      await mountTmpfs(base, dir, `rw,nosuid,nodev,noexec,relatime,mode=1777,size=${size}`);
      return { mounted: true, size };
    },
    unmountShm: (dir) => unmountAt(base, dir),
    startControl: (plan, paths) => host.startControl(plan, paths),
    command: (paths, command, timeoutMs) => host.command(paths, command, timeoutMs),
  };
}
