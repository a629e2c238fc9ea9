// What `check` reads of the host besides NVML and the kubelet: the installed unit and its drop-ins, and
// the other sockets in the kubelet's device-plugin directory (CDI specs are read by src/dra/cdi.ts, as
// the daemon reads them). Reading only; the judging is in sandbox.ts and the check-*.ts files.
import { connect } from 'node:net';
import { readFile, readdir, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { SHIPPED_UNIT, UNIT_NAME, parseUnitSandbox } from './sandbox.ts';
import type { UnitSandbox } from './sandbox.ts';

export interface UnitRead {
  readonly sandbox: UnitSandbox;
  /** The unit file and drop-ins read, in order; empty when the shipped unit's lines were used. */
  readonly files: readonly string[];
  /** How to say where the sandbox came from. */
  readonly source: string;
}

const UNIT_DIRS = ['/etc/systemd/system', '/run/systemd/system', '/usr/lib/systemd/system', '/lib/systemd/system'];

async function readText(path: string): Promise<string | null> {
  try {
    return await readFile(path, 'utf8');
  } catch {
    return null;
  }
}

/**
 * The installed unit (the first of systemd's unit directories that has it, under `root`) with its
 * drop-ins (*.conf in <dir>/gpu-device-plugin.service.d, by file name, /etc winning over /usr/lib),
 * or the unit this version ships when none is installed.
 */
export async function readInstalledUnit(root: string): Promise<UnitRead> {
  let main: { path: string; text: string } | null = null;
  for (const d of UNIT_DIRS) {
    const path = join(root, d, UNIT_NAME);
    const text = await readText(path);
    if (text !== null) {
      main = { path, text };
      break;
    }
  }
  const dropins = new Map<string, string>();
  for (const d of [...UNIT_DIRS].reverse()) {
    const dir = join(root, d, `${UNIT_NAME}.d`);
    const names = await readdir(dir).catch(() => [] as string[]);
    for (const n of names) if (n.endsWith('.conf')) dropins.set(n, join(dir, n));
  }
  const dropinPaths = [...dropins.keys()].sort().map((n) => dropins.get(n) as string);
  const texts: string[] = [];
  const files: string[] = [];
  if (main !== null) {
    texts.push(main.text);
    files.push(main.path);
  }
  for (const p of dropinPaths) {
    const t = await readText(p);
    if (t !== null) {
      texts.push(t);
      files.push(p);
    }
  }
  if (main === null) {
    return {
      sandbox: parseUnitSandbox([SHIPPED_UNIT, ...texts]),
      files,
      source:
        `the unit shipped with this version (${UNIT_NAME} is not ` +
        `installed)${files.length > 0 ? ` and ${files.join(', ')}` : ''}`,
    };
  }
  return { sandbox: parseUnitSandbox(texts), files, source: files.join(', ') };
}

/** Sockets in `dir` other than the kubelet's and ours, with whether something answers on them. */
export async function otherSockets(dir: string, kubeletSocket: string): Promise<{ name: string; live: boolean }[]> {
  const names = await readdir(dir).catch(() => [] as string[]);
  const out: { name: string; live: boolean }[] = [];
  for (const n of names.sort()) {
    if (n === basename(kubeletSocket) || n.startsWith('gpu-device-plugin-')) continue;
    const path = join(dir, n);
    const st = await stat(path).catch(() => null);
    if (st === null || !st.isSocket()) continue;
    out.push({ name: n, live: await answers(path) });
  }
  return out;
}

function answers(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(path);
    const done = (ok: boolean): void => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(1000, () => done(false));
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
  });
}
