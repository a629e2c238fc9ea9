// "Is this socket still the one we know?": the identity of a file in the kubelet's socket directory.
// Asked by the directory watcher, by the registration loop (is the kubelet socket the one we
// registered through?) and by whoever serves a plugin socket (is it still ours to remove?).
import { lstat } from 'node:fs/promises';

/**
 * Identity of a file: inode plus change time, so a recycled inode number is not mistaken for ours; null when absent.
 */
export async function fileIdentity(path: string): Promise<string | null> {
  try {
    const st = await lstat(path, { bigint: true });
    return `${st.ino}:${st.ctimeNs}`;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}
