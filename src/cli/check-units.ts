// `check`'s lines on the units' sandboxes: for the plugin's unit (with the DRA drop-in when one is linked) and
// the MPS unit, whether the unit systemd uses, drop-ins included, confines the service as the package's files
// do. The package's files are the vendor unit (/usr/lib/systemd/system) and the DRA drop-in it installs under
// /usr/share; an operator's changes live in /etc (or /run): a drop-in, or a whole unit that masks the vendor's.
import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { CheckLine } from './check-report.ts';
import { DRA_DROPIN_SOURCE } from './dra-install.ts';
import { UNIT_NAME } from './sandbox.ts';
import { sandboxDrift } from './unit-drift.ts';

export const MPS_UNIT_NAME = 'gpu-device-plugin-mps.service';
const DRA_DROPIN_NAME = 'dra.conf';
/** Where systemd looks for units, highest priority first; the package installs into the third. */
const UNIT_DIRS = ['/etc/systemd/system', '/run/systemd/system', '/usr/lib/systemd/system', '/lib/systemd/system'];
const VENDOR_DIRS = ['/usr/lib/systemd/system', '/lib/systemd/system'];

async function readText(path: string): Promise<string | null> {
  return readFile(path, 'utf8').catch(() => null);
}

/** The first of `dirs` (under `root`) that has `name`: its path and text. */
async function firstUnit(
  root: string,
  dirs: readonly string[],
  name: string,
): Promise<{ path: string; text: string } | null> {
  for (const d of dirs) {
    const text = await readText(join(root, d, name));
    if (text !== null) return { path: join(d, name), text };
  }
  return null;
}

/** The unit's drop-ins (<unit>.d/ and service.d/ in every unit directory), by file name as systemd orders them. */
async function dropIns(root: string, name: string): Promise<{ name: string; path: string; text: string }[]> {
  const found = new Map<string, string>();
  // Lowest priority first, so that /etc's file of a name replaces /usr/lib's.
  for (const d of [...UNIT_DIRS].reverse()) {
    for (const sub of ['service.d', `${name}.d`]) {
      const names = await readdir(join(root, d, sub)).catch(() => [] as string[]);
      for (const n of names) if (n.endsWith('.conf')) found.set(n, join(d, sub, n));
    }
  }
  const out: { name: string; path: string; text: string }[] = [];
  for (const n of [...found.keys()].sort()) {
    const path = found.get(n) as string;
    const text = await readText(join(root, path));
    if (text !== null) out.push({ name: n, path, text });
  }
  return out;
}

const REVIEW = (unit: string): string =>
  `review the operator's changes (systemctl cat ${unit}); the package's sandbox is README's "Security model"`;

/** One unit's line: its effective sandbox against the package's files; `extraShipped` adds the package's drop-in. */
async function unitLine(root: string, name: string, withDraDropIn: boolean): Promise<CheckLine[]> {
  const label = `sandbox of ${name}`;
  const vendor = await firstUnit(root, VENDOR_DIRS, name);
  if (vendor === null)
    return [
      { status: 'SKIP', name: label, detail: `the package's ${name} is not installed (${VENDOR_DIRS.join(', ')})` },
    ];
  const main = (await firstUnit(root, UNIT_DIRS, name)) ?? vendor;
  const drops = await dropIns(root, name);
  const lines: CheckLine[] = [];
  const shipped = [vendor.text];
  const draDrop = withDraDropIn ? drops.find((d) => d.name === DRA_DROPIN_NAME) : undefined;
  if (draDrop !== undefined) {
    const packaged = await readText(join(root, DRA_DROPIN_SOURCE));
    if (packaged !== null) shipped.push(packaged);
    lines.push(draDropInLine(draDrop, packaged));
  }
  const drift = sandboxDrift(shipped, [main.text, ...drops.map((d) => d.text)]);
  const files = [main.path, ...drops.map((d) => d.path)].join(', ');
  lines.unshift(
    drift.length === 0
      ? { status: 'PASS', name: label, detail: `confines the service as the package's files do (read: ${files})` }
      : {
          status: 'WARN',
          name: label,
          detail: `looser than the package ships (read: ${files}): ${drift.join('; ')}`,
          fix: REVIEW(name),
        },
  );
  return lines;
}

/** Whether the linked DRA drop-in is the package's file (a link to it, or the same text). */
function draDropInLine(drop: { path: string; text: string }, packaged: string | null): CheckLine {
  const name = 'DRA drop-in';
  if (packaged === null)
    return { status: 'WARN', name, detail: `${drop.path} is linked but the package's ${DRA_DROPIN_SOURCE} is missing` };
  return drop.text === packaged
    ? { status: 'PASS', name, detail: `${drop.path} is the package's ${DRA_DROPIN_SOURCE}` }
    : {
        status: 'WARN',
        name,
        detail: `${drop.path} is not the package's ${DRA_DROPIN_SOURCE} (a copy that differs, or another file)`,
        fix: `link the package's file instead, so upgrades keep it current: ln -sf ${DRA_DROPIN_SOURCE} ${drop.path}`,
      };
}

/** The units' sandbox lines, reading the unit directories under `root` ("/" on a node). */
export async function unitSandboxChecks(root: string): Promise<CheckLine[]> {
  return [...(await unitLine(root, UNIT_NAME, true)), ...(await unitLine(root, MPS_UNIT_NAME, false))];
}
