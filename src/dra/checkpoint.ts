// The checkpoint of prepared claims: one JSON file (core/dra-checkpoint.ts's format), replaced atomically
// (system/atomic-file.ts) before the kubelet gets its answer, read once at start. Records of another
// boot (the node's boot ID, /proc/sys/kernel/random/boot_id) are void: after a reboot no container
// holds anything. A file that cannot be read is moved aside (named in the log), never silently lost.
import { readFile, rename } from 'node:fs/promises';
import { AtomicFile } from '../system/atomic-file.ts';
import { checkpointForBoot, claimedPartitions, parseCheckpoint, serializeCheckpoint } from '../core/dra-checkpoint.ts';
import type { Checkpoint, ClaimRecord } from '../core/dra-checkpoint.ts';
import type { Logger } from '../system/log.ts';

export const BOOT_ID_FILE = '/proc/sys/kernel/random/boot_id';

/**
 * The file's name in <pluginsDir>/<driver>/: not NVIDIA's DRA driver's checkpoint.json beside it, so
 * a node moved between the two drivers keeps each one's file.
 */
export const CHECKPOINT_FILE = 'gpu-device-plugin-checkpoint.json';

export async function readBootId(path: string = BOOT_ID_FILE): Promise<string> {
  try {
    const id = (await readFile(path, 'utf8')).trim();
    if (id === '') throw new Error('it is empty');
    return id;
  } catch (err) {
    throw new Error(`cannot read the node's boot ID from ${path}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * The dynamic MIG partitions the checkpoint's claims of this boot hold, read without changing anything (the store's
 * open() says what is wrong with a file it cannot read); none when there is no readable checkpoint.
 */
export async function claimedPartitionsAt(path: string, bootIdPath: string = BOOT_ID_FILE): Promise<Set<string>> {
  try {
    const parsed = parseCheckpoint(await readFile(path, 'utf8'));
    const { checkpoint } = checkpointForBoot(parsed, await readBootId(bootIdPath));
    return claimedPartitions(Object.values(checkpoint.claims));
  } catch {
    return new Set();
  }
}

export class CheckpointStore {
  readonly path: string;
  private readonly file: AtomicFile;
  private readonly log: Logger;
  private current: Checkpoint;
  private chain: Promise<unknown> = Promise.resolve();

  private constructor(path: string, checkpoint: Checkpoint, log: Logger) {
    this.path = path;
    // Durable: once the kubelet was told a claim is prepared, a power loss must not forget it.
    this.file = new AtomicFile(path, 0o600, { durable: true });
    this.current = checkpoint;
    this.log = log;
  }

  /** Reads the checkpoint at `path` (absent: empty) for a node booted as `bootId`. */
  static async open(path: string, bootId: string, log: Logger): Promise<CheckpointStore> {
    let text: string | null = null;
    try {
      text = await readFile(path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
        throw new Error(`cannot read the DRA checkpoint ${path}: ${(err as Error).message}`, { cause: err });
    }
    let parsed: Checkpoint | null = null;
    if (text !== null) {
      try {
        parsed = parseCheckpoint(text);
      } catch (err) {
        const aside = `${path}.unreadable-${Date.now()}`;
        await rename(path, aside).catch(() => undefined);
        log.error(
          'the DRA checkpoint cannot be read; moved aside, starting with no prepared ' +
            'claims (claims prepared before will be prepared again when the kubelet asks)',
          { checkpoint: path, movedTo: aside, error: (err as Error).message },
        );
      }
    }
    const { checkpoint, voided } = checkpointForBoot(parsed, bootId);
    if (voided > 0)
      log.info('the node rebooted since the DRA checkpoint was written: its prepared claims are void', {
        checkpoint: path,
        voided,
      });
    const store = new CheckpointStore(path, checkpoint, log);
    if (voided > 0) await store.save();
    return store;
  }

  get(uid: string): ClaimRecord | undefined {
    return this.current.claims[uid];
  }

  get size(): number {
    return Object.keys(this.current.claims).length;
  }

  uids(): string[] {
    return Object.keys(this.current.claims);
  }

  /** Records (or replaces) a claim and writes the file; resolves once it is on disk (on failure nothing changed). */
  put(uid: string, record: ClaimRecord): Promise<void> {
    return this.mutate((c) => ({ bootId: c.bootId, claims: { ...c.claims, [uid]: record } })).then(() => undefined);
  }

  /**
   * Records a claim unless `refusal` (given the checkpoint as it is then) says why not: looked at and
   * written as one change, so two claims prepared at once cannot both pass. Resolves with the refusal,
   * or null once the record is on disk.
   */
  async putUnless(uid: string, record: ClaimRecord, refusal: (c: Checkpoint) => string | null): Promise<string | null> {
    let refused: string | null = null;
    await this.mutate((c) => {
      refused = refusal(c);
      return refused === null ? { bootId: c.bootId, claims: { ...c.claims, [uid]: record } } : null;
    });
    return refused;
  }

  /** Forgets a claim and writes the file; resolves with whether it was there (nothing written if not). */
  remove(uid: string): Promise<boolean> {
    return this.mutate((c) => {
      if (!(uid in c.claims)) return null;
      const claims = { ...c.claims };
      delete claims[uid];
      return { bootId: c.bootId, claims };
    });
  }

  /**
   * Writes the checkpoint again if the file on disk is gone or differs (its directory was wiped, someone
   * edited it); resolves with whether it wrote.
   */
  persist(): Promise<boolean> {
    const next = this.chain.then(() => this.file.write(serializeCheckpoint(this.current)));
    this.chain = next.catch(() => undefined);
    return next;
  }

  /** One change at a time: the next state is written, and only then is it the current one. */
  private mutate(change: (c: Checkpoint) => Checkpoint | null): Promise<boolean> {
    const next = this.chain.then(async () => {
      const after = change(this.current);
      if (after === null) return false;
      await this.file.write(serializeCheckpoint(after));
      this.current = after;
      this.log.debug('DRA checkpoint written', { checkpoint: this.path, claims: this.size });
      return true;
    });
    this.chain = next.catch(() => undefined);
    return next;
  }

  private async save(): Promise<void> {
    await this.file.write(serializeCheckpoint(this.current));
  }
}
