// gpu-device-plugin(8) as build/docs.ts generates it: every environment variable the program's
// source reads is documented (the list is found in the source here, not copied), every key the
// config-file reader accepts, the commands, exit statuses, files; and man renders it without a warning.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { manPage } from '../../build/docs.ts';
import { CONFIG_SCHEMA } from '../../src/config/parse-options.ts';
import { OPTION_SPECS } from '../../src/config/option-table.ts';
import { UNSUPPORTED_OPTIONS } from '../../src/config/unsupported-options.ts';
import { extractionCandidates } from '../../src/system/native.ts';

const ROOT = join(import.meta.dirname, '..', '..');
const SRC = join(ROOT, 'src');

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const abs = join(dir, name);
    if (statSync(abs).isDirectory()) return sources(abs);
    return /\.(ts|c|h)$/.test(name) ? [abs] : [];
  });
}

/** Where the source reads a variable through a computed key; each such place needs its own derivation below. */
const INDIRECT_READERS: Record<string, () => string[]> = {
  // env[spec.env], env[fileSpec.env]: the option table's variables.
  'src/config/parse-options.ts': () => OPTION_SPECS.map((s) => s.env),
  // env[e]: NVIDIA's refused options' variables.
  'src/config/unsupported-options.ts': () => UNSUPPORTED_OPTIONS.flatMap((u) => u.envs),
  // env[key] over the directories tried for the native modules: ask the function which it reads.
  'src/system/native.ts': () => {
    const read: string[] = [];
    extractionCandidates(
      new Proxy(
        {},
        {
          get: (_t, key) => {
            if (typeof key === 'string') read.push(key);
            return undefined;
          },
        },
      ),
    );
    return read;
  },
};

/** Every environment variable the program reads, found in src/ (TypeScript and C). */
function variablesReadBySource(): { names: Set<string>; indirect: Set<string> } {
  const names = new Set<string>();
  const indirect = new Set<string>();
  for (const file of sources(SRC)) {
    const text = readFileSync(file, 'utf8');
    const rel = relative(ROOT, file);
    for (const m of text.matchAll(/\benv\??\.?\[\s*['"]([A-Za-z_][A-Za-z0-9_]*)['"]\s*\]/g)) names.add(m[1]!);
    for (const m of text.matchAll(/\benv\??\.([A-Z_][A-Z0-9_]*)\b/g)) names.add(m[1]!);
    for (const m of text.matchAll(/\bgetenv\(\s*"([A-Za-z_][A-Za-z0-9_]*)"\s*\)/g)) names.add(m[1]!);
    // os.tmpdir() reads TMPDIR.
    if (/\btmpdir\(\)/.test(text) && /from 'node:os'/.test(text)) names.add('TMPDIR');
    // env[expr] with a computed key, read (an assignment env[k] = v is not a read).
    if (/\benv\??\.?\[\s*[^\s'"\]][^\]]*\](?!\s*=[^=])/.test(text)) indirect.add(rel);
  }
  for (const rel of indirect) {
    const derive = INDIRECT_READERS[rel];
    assert.ok(
      derive,
      `${rel} reads an environment variable through a computed key: add a way to ` +
        `list them to INDIRECT_READERS in this test, and document them in build/docs.ts`,
    );
    for (const n of derive()) names.add(n);
  }
  return { names, indirect };
}

function render(): string {
  return manPage({
    version: '0.1.0',
    date: new Date(0),
    environmentFiles: ['/etc/default/gpu-device-plugin', '/etc/sysconfig/gpu-device-plugin'],
  });
}

/** The page's sections by .SH name, with roff's escapes undone so names can be searched as written. */
function sections(page: string): Map<string, string> {
  const out = new Map<string, string>();
  let name = '';
  for (const line of page.split('\n')) {
    const h = /^\.SH "?([^"]+)"?$/.exec(line);
    if (h) {
      name = h[1]!;
      out.set(name, '');
      continue;
    }
    if (name !== '')
      out.set(
        name,
        `${out.get(name)!}${line
          .replace(/\\-/g, '-')
          .replace(/\\f[BIRP]/g, '')
          .replace(/\\e/g, '\\')}\n`,
      );
  }
  return out;
}

test('the source scan finds what it should (so that an empty scan cannot pass the next test)', () => {
  const { names, indirect } = variablesReadBySource();
  for (const known of [
    'SYSFS_ROOT',
    'PROC_ROOT',
    'DP_DISABLE_HEALTHCHECKS',
    'NOTIFY_SOCKET',
    'WATCHDOG_USEC',
    'JOURNAL_STREAM',
    'RUNTIME_DIRECTORY',
    'KUBELET_SOCKET',
    'GDS_ENABLED',
    'TMPDIR',
  ]) {
    assert.ok(names.has(known), `${known} found in ${[...names].join(' ')}`);
  }
  assert.deepEqual(
    [...indirect].sort(),
    Object.keys(INDIRECT_READERS).sort(),
    'every computed-key reader has a derivation, and none is stale',
  );
});

test(
  'every environment variable the source reads is in the man ' +
    'page: options under OPTIONS, the rest under ENVIRONMENT',
  () => {
    const s = sections(render());
    const options = s.get('OPTIONS') ?? '';
    const environment = s.get('ENVIRONMENT') ?? '';
    const optionEnvs = new Set(OPTION_SPECS.map((o) => o.env));
    const missing: string[] = [];
    for (const name of variablesReadBySource().names) {
      const where = optionEnvs.has(name) ? options : environment;
      if (!new RegExp(`(^|[^A-Z0-9_])${name}([^A-Z0-9_]|$)`, 'm').test(where)) missing.push(name);
    }
    assert.deepEqual(missing, [], 'variables read by src/ but not documented in build/docs.ts');
  },
);

test('the sections an operator looks for are there, in man(7) order', () => {
  const names = [...sections(render()).keys()];
  assert.deepEqual(names, [
    'NAME',
    'SYNOPSIS',
    'DESCRIPTION',
    'OPTIONS',
    'COMMANDS',
    'CONFIGURATION FILE',
    'ENVIRONMENT',
    'SIGNALS',
    'EXIT STATUS',
    'FILES',
    'SEE ALSO',
  ]);
});

test('COMMANDS and SYNOPSIS: info and check with their options', () => {
  const s = sections(render());
  for (const text of [s.get('SYNOPSIS')!, s.get('COMMANDS')!]) {
    for (const w of ['info', 'check', '--json', '--env-file', '--help'])
      assert.ok(text.includes(w), `${w} in\n${text}`);
  }
  assert.match(s.get('COMMANDS')!, /state file in \/run\/gpu-device-plugin\//);
  assert.match(s.get('COMMANDS')!, /ReadWritePaths=/);
});

test('CONFIGURATION FILE: every key the reader accepts, what it refuses, and the example', () => {
  const text = sections(render()).get('CONFIGURATION FILE')!;
  // The keys the config file's reader accepts at each level, read from the r.keys(...) calls of config.ts (the
  // file's structure), config-sharing.ts (the sharing section) and dra-section.ts (the dra section).
  const reader = ['config.ts', 'config-sharing.ts', 'dra-section.ts']
    .map((f) => readFileSync(join(SRC, 'config', f), 'utf8'))
    .join('\n');
  const levels = [...reader.matchAll(/r\.keys\([^,]+,[^,]+,\s*\[([^\]]*)\]\)/g)].map((m) =>
    [...m[1]!.matchAll(/'([A-Za-z]+)'/g)].map((k) => k[1]!),
  );
  assert.ok(levels.length >= 4, `r.keys calls found: ${JSON.stringify(levels)}`);
  for (const key of levels.flat()) assert.match(text, new RegExp(`\\b${key}\\b`), `key ${key}`);
  for (const o of CONFIG_SCHEMA.options) assert.ok(text.includes(o.path), o.path);
  for (const u of CONFIG_SCHEMA.unsupported) assert.ok(text.includes(u.path), u.path);
  for (const f of CONFIG_SCHEMA.foreign) assert.ok(text.includes(f.path), f.path);
  assert.ok(text.includes('/usr/share/doc/gpu-device-plugin/examples/config.yaml'));
});

test('EXIT STATUS, SIGNALS and FILES say what an operator needs', () => {
  const s = sections(render());
  const exit = s.get('EXIT STATUS')!;
  for (const code of ['0', '1', '2']) assert.match(exit, new RegExp(`^\\.B ${code}$`, 'm'));
  assert.match(exit, /configuration error/);
  assert.match(exit, /RestartPreventExitStatus=2/);
  assert.match(s.get('SIGNALS')!, /SIGHUP[\s\S]*returns success either way/);
  const files = s.get('FILES')!;
  for (const f of [
    '/etc/default/gpu-device-plugin',
    '/etc/sysconfig/gpu-device-plugin',
    '/usr/lib/systemd/system/gpu-device-plugin.service',
    '/var/lib/kubelet/device-plugins/',
    '/usr/share/doc/gpu-device-plugin/',
  ]) {
    assert.ok(files.includes(f), f);
  }
  assert.match(s.get('SEE ALSO')!, /journalctl/);
});

test('man renders the page without a warning', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-man-'));
  try {
    const file = join(dir, 'gpu-device-plugin.8');
    writeFileSync(file, render());
    const r = spawnSync('man', ['--warnings', '-E', 'UTF-8', '-l', '-Tutf8', '-Z', file], {
      encoding: 'utf8',
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C.UTF-8' },
    });
    assert.equal(r.stderr, '');
    assert.equal(r.status, 0);
    const text = spawnSync('man', ['-E', 'UTF-8', '-l', file], {
      encoding: 'utf8',
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C.UTF-8', MANWIDTH: '100' },
    }).stdout;
    assert.match(text, /CONFIGURATION FILE/);
    assert.match(text, /DP_DISABLE_HEALTHCHECKS/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
