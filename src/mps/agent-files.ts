// The DRA sharing agent's files, read and written as root in trees another process may have touched
// (system/safe-fs.ts: no symlink followed, regular files only, size-capped): the plugin's request files, each
// read into a request or the reason it is none, and the agent's own record of the time-slices it set, kept in
// its private state directory.
import { createHash } from 'node:crypto';
import { mkdir, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { parseRequest, requestDir } from '../core/dra-sharing.ts';
import type { RequestFile } from '../core/dra-sharing.ts';
import { TIME_SLICE_INTERVALS } from '../core/dra-timeslice.ts';
import type { TimeSliceInterval } from '../core/dra-gpu-config.ts';
import { isObject } from '../core/json.ts';
import { errorText } from '../system/log.ts';
import { readRegularFile, removeFile, writeFileSafely } from '../system/safe-fs.ts';

/** A request names a claim, its GPUs and limits: a few hundred bytes; anything past 64 KiB is no request of ours. */
export const MAX_REQUEST_BYTES = 64 * 1024;
const GPU_UUID = /^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * A request file read: the request, or why it is none — with its id when that much could be read (so the
 * refusal can answer it) and `key`, what the refusal is remembered by (its id, or a digest of what it holds).
 */
export type RequestRead =
  | { readonly file: RequestFile }
  | { readonly id: string | null; readonly key: string; readonly error: string };

function unreadable(text: string, err: unknown): RequestRead {
  let id: string | null = null;
  try {
    const doc: unknown = JSON.parse(text);
    if (isObject(doc) && typeof doc.id === 'string' && doc.id.length <= 256) id = doc.id;
  } catch {
    // Not even JSON: nothing in it can be answered.
  }
  const digest = createHash('sha256').update(text).digest('hex').slice(0, 16);
  return { id, key: id ?? `sha256:${digest}`, error: `its request is not valid: ${errorText(err)}` };
}

/**
 * The request files under <mps root>/dra/requests by claim uid (the file's name). A file gone meanwhile is
 * left out; one that is no regular file, too large, or no valid request is read as what is wrong with it.
 */
export async function readRequestFiles(mpsRoot: string): Promise<Map<string, RequestRead>> {
  const dir = requestDir(mpsRoot);
  const out = new Map<string, RequestRead>();
  const names = (await readdir(dir).catch(() => [] as string[])).sort();
  for (const name of names) {
    if (!name.endsWith('.json')) continue;
    const uid = name.slice(0, -'.json'.length);
    let text: string;
    try {
      text = await readRegularFile(mpsRoot, join(dir, name), MAX_REQUEST_BYTES);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
      out.set(uid, {
        id: null,
        key: `unreadable:${errorText(err)}`,
        error: `its request cannot be read: ${errorText(err)}`,
      });
      continue;
    }
    try {
      const file = parseRequest(text);
      if (file.request.claim.uid !== uid)
        throw new Error(`its file is named for claim ${uid} but it names ${file.request.claim.uid}`);
      out.set(uid, { file });
    } catch (err) {
      out.set(uid, unreadable(text, err));
    }
  }
  return out;
}

export const TIME_SLICE_RECORD = 'timeslices.json';

/** Entries that can be the agent's: a GPU's UUID and an interval nvidia-smi knows. */
function recordEntries(text: string): Map<string, TimeSliceInterval> {
  const doc: unknown = JSON.parse(text);
  return new Map(
    Object.entries(isObject(doc) ? doc : {}).filter(
      (e): e is [string, TimeSliceInterval] =>
        GPU_UUID.test(e[0]) && (TIME_SLICE_INTERVALS as readonly unknown[]).includes(e[1]),
    ),
  );
}

/**
 * The time-slices the agent set, from its state directory; none when it has no record (or one that is not a
 * regular file of its own). An agent of an earlier version kept its record under <mps root>/dra, where the plugin
 * could write: that one is never read (a stopped agent put every GPU back to Default anyway), only removed.
 */
export async function readTimeSliceRecord(stateDir: string, mpsRoot: string): Promise<Map<string, TimeSliceInterval>> {
  await removeFile(mpsRoot, join(mpsRoot, 'dra', TIME_SLICE_RECORD)).catch(() => undefined);
  try {
    return recordEntries(await readRegularFile(stateDir, join(stateDir, TIME_SLICE_RECORD), MAX_REQUEST_BYTES));
  } catch {
    return new Map();
  }
}

/** The record written in the state directory (made 0700 when missing). */
export async function writeTimeSliceRecord(
  stateDir: string,
  applied: ReadonlyMap<string, TimeSliceInterval>,
): Promise<void> {
  // Made by systemd (StateDirectory=, 0700) under the unit; by hand otherwise. writeFileSafely then checks it is a
  // real directory of root's.
  await mkdir(stateDir, { recursive: true, mode: 0o700 });
  const text = `${JSON.stringify(Object.fromEntries(applied))}\n`;
  await writeFileSafely(stateDir, join(stateDir, TIME_SLICE_RECORD), text, 0o600);
}
