// A file that other programs read while we replace it (NFD's feature file, node_exporter's .prom
// file): every write goes to a hidden temporary file in the same directory, is flushed, and is
// renamed over the target, so a reader sees the old content or the new, never a part. Nothing is
// written when the content is what the file holds on disk now (read before every write, never taken
// from memory: a file someone edited or removed is written again, and a write after a failed one
// starts from what is there), so a restart or a no-op reload leaves the file (and its inode and
// mtime) alone. The temporary name starts with a dot: NFD skips hidden
// files, and node_exporter reads only *.prom. No fsync: a power loss may leave the file empty or
// old, and the next start rewrites it (the content differs); an fsync would instead hold one of
// libuv's few pool threads for as long as a busy disk takes. A file whose loss would lose a promise
// made to someone else (DRA's checkpoint: the kubelet was told a claim is prepared) is `durable`: the
// temporary file is flushed to disk before the rename, and the directory after it.
import { open, readFile, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

export class AtomicFile {
  readonly path: string;
  private readonly mode: number;
  private readonly durable: boolean;
  /** Writes run one after the other; the newest content wins. */
  private chain: Promise<unknown> = Promise.resolve();
  writes = 0;

  constructor(path: string, mode = 0o644, opts: { durable?: boolean } = {}) {
    this.path = path;
    this.mode = mode;
    this.durable = opts.durable === true;
  }

  private get tempPath(): string {
    return join(dirname(this.path), `.${basename(this.path)}.${process.pid}.tmp`);
  }

  /** Replaces the file with `content` unless it already holds exactly that; resolves with whether it wrote. */
  write(content: string): Promise<boolean> {
    const next = this.chain.then(() => this.doWrite(content));
    this.chain = next.catch(() => undefined);
    return next;
  }

  private async doWrite(content: string): Promise<boolean> {
    // Same content on disk: nothing to do. Unreadable (gone, say) counts as different.
    const onDisk = await readFile(this.path, 'utf8').catch(() => null);
    if (onDisk === content) return false;
    const tmp = this.tempPath;
    try {
      const fh = await open(tmp, 'w', this.mode);
      try {
        await fh.writeFile(content, 'utf8');
        await fh.chmod(this.mode);
        if (this.durable) await fh.datasync();
      } finally {
        await fh.close();
      }
      await rename(tmp, this.path);
      if (this.durable) await syncDirectory(dirname(this.path));
    } catch (err) {
      await unlink(tmp).catch(() => undefined);
      throw new Error(`cannot write ${this.path}: ${(err as Error).message}${hint(err, this.path)}`, { cause: err });
    }
    this.writes++;
    return true;
  }

  /** Removes the file (if it exists). */
  async remove(): Promise<void> {
    await this.chain;
    try {
      await unlink(this.path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
        throw new Error(`cannot remove ${this.path}: ${(err as Error).message}`, { cause: err });
    }
  }
}

/** Flushes a directory's entries (a rename in it) to disk. */
async function syncDirectory(dir: string): Promise<void> {
  const fh = await open(dir, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** What to do about the usual causes, for the error message. */
function hint(err: unknown, path: string): string {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'EROFS' || code === 'EACCES' || code === 'EPERM') {
    return (
      `; under systemd the service may write only where its sandbox allows: add ReadWritePaths=${dirname(path)} ` +
      `with \`systemctl edit gpu-device-plugin\` (see the README, "Node labels and metrics")`
    );
  }
  if (code === 'ENOENT')
    return `; the directory ${dirname(path)} does not exist (is the reader — NFD or node_exporter — installed?)`;
  return '';
}
