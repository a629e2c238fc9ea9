// File operations for a root process working in a tree that a less trusted process may have touched (the MPS
// unit's DRA sharing agent under <MPS root>/dra, which the plugin's requests reach). None of them follows a
// symbolic link that could have been planted there, and none leaves the tree it is given:
//
// * every path is `base` plus components below it; each component is checked with lstat (or opened with
//   O_NOFOLLOW) on the way down, so a component swapped for a symlink is refused, never followed;
// * a file is written through a temp file created O_CREAT|O_EXCL|O_NOFOLLOW and renamed into place (rename
//   replaces a symlink at the destination, it does not follow it);
// * a directory is created, then opened O_DIRECTORY|O_NOFOLLOW: it must be a real directory owned by this
//   process's user, and its mode is set through that descriptor;
// * a tree is removed entry by entry through /proc/self/fd/<fd> of each directory opened O_NOFOLLOW, so a
//   directory swapped for a symlink during the walk is unlinked as a link, never descended into, and no other
//   file system (a mount inside the tree) is entered;
// * a tmpfs is mounted on a directory opened O_NOFOLLOW and handed to mount(8) as /proc/self/fd/3 (the kernel
//   resolves that to the very directory checked); unmounting looks for the exact path in /proc/self/mountinfo
//   (not a canonicalised one) and runs `umount --no-canonicalize` only on a real directory.
import { spawn } from 'node:child_process';
import { constants } from 'node:fs';
import { lstat, mkdir, open, readFile, readdir, rename, rmdir, unlink } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { isAbsolute, normalize, relative, sep } from 'node:path';

const { O_CREAT, O_DIRECTORY, O_EXCL, O_NOFOLLOW, O_NONBLOCK, O_RDONLY, O_WRONLY } = constants;

const codeOf = (err: unknown): string | undefined => (err as NodeJS.ErrnoException | null)?.code;

/** The components of `path` below `base`; throws when `path` is not `base` itself or under it. */
export function componentsBelow(base: string, path: string): string[] {
  if (!isAbsolute(base) || !isAbsolute(path)) throw new Error(`${path} and ${base} must be absolute paths`);
  const rel = relative(normalize(base), normalize(path));
  if (rel === '') return [];
  const parts = rel.split(sep);
  if (parts.some((p) => p === '..' || p === '' || p === '.') || isAbsolute(rel))
    throw new Error(`${path} is not under ${base}: refused`);
  return parts;
}

/**
 * Whether `name` can be one path component of ours: not empty, not `.` or `..`, no `/` or NUL, only
 * [A-Za-z0-9._-], at most `max` bytes (a name plus `.json.tmp` must stay under NAME_MAX).
 */
export function safeComponent(name: string, max = 128): boolean {
  return name.length > 0 && name.length <= max && name !== '.' && name !== '..' && /^[A-Za-z0-9._-]+$/.test(name);
}

/** Throws unless `path` is a real directory (not a symlink) owned by this process's user. */
async function checkDir(path: string, fh?: FileHandle): Promise<void> {
  const s = fh === undefined ? await lstat(path) : await fh.stat();
  if (s.isSymbolicLink()) throw new Error(`${path} is a symbolic link, not a directory: refused`);
  if (!s.isDirectory()) throw new Error(`${path} is not a directory: refused`);
  const uid = process.getuid?.() ?? 0;
  if (s.uid !== uid) throw new Error(`${path} is owned by uid ${s.uid}, not ${uid}: refused`);
}

/** Opens a directory without following a symlink at its last component; says which it was when it is one. */
async function openDir(path: string): Promise<FileHandle> {
  try {
    return await open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  } catch (err) {
    // O_DIRECTORY|O_NOFOLLOW on a symlink fails with ENOTDIR on Linux (ELOOP elsewhere): lstat says which it was.
    const code = codeOf(err);
    if (code !== 'ELOOP' && code !== 'ENOTDIR') throw err;
    const link = await lstat(path).then(
      (s) => s.isSymbolicLink(),
      () => false,
    );
    throw new Error(`${path} is ${link ? 'a symbolic link, not a directory' : 'not a directory'}: refused`);
  }
}

/** Throws unless `base` and every directory between it and `path` (`path` excluded) is a real directory of ours. */
export async function checkParents(base: string, path: string): Promise<void> {
  const parts = componentsBelow(base, path);
  let dir = normalize(base);
  await checkDir(dir);
  for (const p of parts.slice(0, -1)) {
    dir = `${dir}/${p}`;
    await checkDir(dir);
  }
}

/**
 * Creates `path` and each missing directory between `base` (which must exist) and it, with `mode` whatever the
 * umask. Each must be a real directory owned by this process's user, checked through a descriptor opened
 * O_NOFOLLOW, whose mode is set through that descriptor.
 */
export async function ensureDir(base: string, path: string, mode = 0o755): Promise<void> {
  let dir = normalize(base);
  await checkDir(dir);
  for (const p of componentsBelow(base, path)) {
    dir = `${dir}/${p}`;
    await mkdir(dir, { mode }).catch((err: unknown) => {
      if (codeOf(err) !== 'EEXIST') throw err;
    });
    const fh = await openDir(dir);
    try {
      await checkDir(dir, fh);
      await fh.chmod(mode);
    } finally {
      await fh.close();
    }
  }
}

/**
 * Replaces `path` (under `base`) with `text`: a temp file `<path>.tmp` (one left behind, or planted, is removed
 * first: unlink removes a symlink itself) created O_CREAT|O_EXCL|O_NOFOLLOW with `mode`, then renamed over
 * `path`, which replaces whatever `path` was (a symlink too) without following it.
 */
export async function writeFileSafely(base: string, path: string, text: string, mode = 0o644): Promise<void> {
  await checkParents(base, path);
  const tmp = `${path}.tmp`;
  await unlink(tmp).catch((err: unknown) => {
    if (codeOf(err) !== 'ENOENT') throw new Error(`cannot remove ${tmp}: ${(err as Error).message}`);
  });
  let fh: FileHandle;
  try {
    fh = await open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
  } catch (err) {
    throw new Error(`cannot create ${tmp} (a new file, links not followed): ${(err as Error).message}`);
  }
  try {
    await fh.writeFile(text);
    await fh.chmod(mode);
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
}

/**
 * The text of `path` (under `base`) if it is a regular file of at most `maxBytes`: opened O_NONBLOCK|O_NOFOLLOW,
 * so a FIFO never blocks the reader and a symlink is refused, then checked through its descriptor.
 */
export async function readRegularFile(base: string, path: string, maxBytes: number): Promise<string> {
  await checkParents(base, path);
  let fh: FileHandle;
  try {
    fh = await open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW);
  } catch (err) {
    if (codeOf(err) === 'ELOOP') throw new Error(`${path} is a symbolic link, not a regular file: refused`);
    throw err;
  }
  try {
    const s = await fh.stat();
    if (!s.isFile()) throw new Error(`${path} is not a regular file: refused`);
    if (s.size > maxBytes) throw new Error(`${path} is ${s.size} bytes, more than the ${maxBytes} allowed: refused`);
    const buf = Buffer.alloc(maxBytes + 1);
    const { bytesRead } = await fh.read(buf, 0, maxBytes + 1, 0);
    if (bytesRead > maxBytes) throw new Error(`${path} is more than the ${maxBytes} bytes allowed: refused`);
    return buf.subarray(0, bytesRead).toString('utf8');
  } finally {
    await fh.close();
  }
}

/** Removes `path` (under `base`) if it is not a directory: a symlink is removed itself; gone already is fine. */
export async function removeFile(base: string, path: string): Promise<void> {
  await checkParents(base, path);
  await unlink(path).catch((err: unknown) => {
    if (codeOf(err) !== 'ENOENT') throw new Error(`cannot remove ${path}: ${(err as Error).message}`);
  });
}

/** Empties the directory open as `fh` (reached as `shown` in messages), staying on the device `dev`. */
async function emptyDir(fh: FileHandle, shown: string, dev: number): Promise<void> {
  const self = `/proc/self/fd/${fh.fd}`;
  for (const name of await readdir(self)) {
    const entry = `${self}/${name}`;
    const s = await lstat(entry).catch((err: unknown) => (codeOf(err) === 'ENOENT' ? null : Promise.reject(err)));
    if (s === null) continue;
    if (!s.isDirectory()) {
      await unlink(entry).catch((err: unknown) => {
        if (codeOf(err) !== 'ENOENT') throw err;
      });
      continue;
    }
    if (s.dev !== dev) throw new Error(`${shown}/${name} is another file system (a mount): not removed`);
    const child = await openDir(entry).catch((err: unknown) => {
      throw new Error(`${shown}/${name}: ${(err as Error).message}`);
    });
    try {
      const cs = await child.stat();
      if (cs.dev !== dev || cs.ino !== s.ino) throw new Error(`${shown}/${name} changed while it was being removed`);
      await emptyDir(child, `${shown}/${name}`, dev);
    } finally {
      await child.close();
    }
    await rmdir(entry);
  }
}

/**
 * Removes `path` (under `base`) and everything in it, never following a symlink (one is removed itself) and
 * never entering another file system; gone already is fine.
 */
export async function removeTree(base: string, path: string): Promise<void> {
  await checkParents(base, path);
  const s = await lstat(path).catch((err: unknown) => (codeOf(err) === 'ENOENT' ? null : Promise.reject(err)));
  if (s === null) return;
  if (!s.isDirectory()) {
    await removeFile(base, path);
    return;
  }
  const fh = await openDir(path);
  try {
    const fs = await fh.stat();
    if (fs.ino !== s.ino || fs.dev !== s.dev) throw new Error(`${path} changed while it was being removed`);
    await emptyDir(fh, path, fs.dev);
  } finally {
    await fh.close();
  }
  await rmdir(path);
}

/** The mountinfo line's mount point (octal escapes decoded) and device, or null. */
function mountEntry(line: string): { dir: string; dev: string } | null {
  const f = line.split(' ');
  if (f.length < 5) return null;
  const dir = (f[4] ?? '').replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
  return { dir, dev: f[2] ?? '' };
}

/** The device (major:minor) mounted exactly at `dir` in /proc/self/mountinfo's text, the last one; or null. */
export function mountedDevice(mountinfo: string, dir: string): string | null {
  let found: string | null = null;
  for (const line of mountinfo.split('\n')) {
    const e = mountEntry(line);
    if (e !== null && e.dir === dir) found = e.dev;
  }
  return found;
}

/** Runs a program and resolves when it exits 0; rejects with its words otherwise. `fd` becomes its fd 3. */
function run(program: string, args: readonly string[], fd?: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const stdio: ('ignore' | 'pipe' | number)[] = ['ignore', 'ignore', 'pipe'];
    if (fd !== undefined) stdio.push(fd);
    const child = spawn(program, args, { stdio });
    let err = '';
    child.stderr?.setEncoding('utf8').on('data', (d: string) => {
      err += d;
    });
    child.on('error', (e) => reject(new Error(`cannot run ${program}: ${e.message}`)));
    child.on('close', (code, signal) => {
      if (code === 0) resolve();
      else {
        const how = signal !== null ? `was killed by ${signal}` : `exited with status ${code}`;
        reject(new Error(`${program} ${args.join(' ')} ${how}${err.trim() ? `: ${err.trim()}` : ''}`));
      }
    });
  });
}

/** Whether a file system is mounted exactly at `dir` (under `base`), a real directory of ours. */
export async function isMountedAt(base: string, dir: string): Promise<boolean> {
  await checkParents(base, dir);
  const s = await lstat(dir);
  if (!s.isDirectory()) throw new Error(`${dir} is not a directory: refused`);
  return mountedDevice(await readFile('/proc/self/mountinfo', 'utf8'), dir) !== null;
}

/**
 * Mounts a tmpfs with `options` on `dir` (under `base`): the directory is opened O_NOFOLLOW, checked, and
 * given to mount(8) as /proc/self/fd/3, so what is mounted on is the directory checked, wherever a symlink
 * may have appeared since.
 */
export async function mountTmpfs(base: string, dir: string, options: string): Promise<void> {
  await checkParents(base, dir);
  const fh = await openDir(dir);
  try {
    await checkDir(dir, fh);
    await run('mount', ['--no-canonicalize', '-t', 'tmpfs', '-o', options, 'tmpfs', '/proc/self/fd/3'], fh.fd);
  } finally {
    await fh.close();
  }
}

/** Unmounts what is mounted exactly at `dir` (under `base`, a real directory), without canonicalising it. */
export async function unmountAt(base: string, dir: string): Promise<void> {
  if (!(await isMountedAt(base, dir))) return;
  await run('umount', ['--no-canonicalize', dir]);
}
