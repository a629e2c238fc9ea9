// README.md is the operator's manual the packages install: the two commands a fresh machine starts
// with stay on its first screen, and its options table says what src/config/options.ts does (flag,
// aliases, variable, config key, default, range), with one row per option and none for options
// that do not exist. The developer material lives in CONTRIBUTING.md.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { OPTION_SPECS } from '../../src/config/option-table.ts';

const ROOT = join(import.meta.dirname, '..', '..');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const CONTRIBUTING = readFileSync(join(ROOT, 'CONTRIBUTING.md'), 'utf8');

const FIRST_SCREEN_LINES = 30;
const COMMANDS = ['npm ci && npm run demo', 'bash build/install-tools.sh && npm ci && npm test'];

test('the two commands for a fresh machine are on the first screen, in a shell block', () => {
  const first = README.split('\n').slice(0, FIRST_SCREEN_LINES);
  const open = first.indexOf('```sh');
  assert.ok(open >= 0, 'a ```sh block in the first screen');
  const block = first.slice(open + 1, first.indexOf('```', open + 1));
  for (const cmd of COMMANDS)
    assert.ok(
      block.some((l) => l.startsWith(`${cmd} `) || l === cmd),
      `${cmd} in\n${block.join('\n')}`,
    );
  // They stay true: the scripts they name exist.
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  assert.ok(pkg.scripts.demo && pkg.scripts.test);
  assert.ok(readFileSync(join(ROOT, 'build', 'install-tools.sh'), 'utf8').length > 0);
});

interface Row {
  flags: string[];
  env: string;
  config: string;
  def: string;
  meaning: string;
}

/** The rows of README's options table (the one whose header starts `| flag | env |`). */
function optionRows(): Row[] {
  const lines = README.split('\n');
  const start = lines.findIndex((l) => l.startsWith('| flag | env | config file key | default | meaning |'));
  assert.ok(start >= 0, 'the options table');
  const rows: Row[] = [];
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break;
    const cells = line
      .slice(1, -1)
      .split(' | ')
      .map((c) => c.trim());
    const [flagCell = '', env = '', config = '', def = '', ...rest] = cells;
    if (flagCell === '') continue; // environment-only rows
    rows.push({
      flags: [...flagCell.matchAll(/`--([a-z0-9-]+)`/g)].map((m) => m[1]!),
      env,
      config,
      def,
      meaning: rest.join(' | '),
    });
  }
  return rows;
}

test(
  'the options table has exactly the options of src/config/options.ts, ' +
    'with their names, variables, keys, defaults and ranges',
  () => {
    const rows = optionRows();
    assert.deepEqual(
      rows.map((r) => r.flags[0]),
      OPTION_SPECS.map((s) => s.flag),
      "one row per option, in the table's order",
    );
    for (const spec of OPTION_SPECS) {
      const row = rows.find((r) => r.flags[0] === spec.flag)!;
      assert.deepEqual(row.flags.slice(1), [...(spec.aliases ?? [])], `--${spec.flag}: aliases`);
      assert.equal(row.env, `\`${spec.env}\``, `--${spec.flag}: variable`);
      assert.equal(row.config, spec.config === undefined ? '—' : `\`${spec.config}\``, `--${spec.flag}: config key`);
      if (spec.default !== null && spec.default !== '')
        assert.equal(row.def, `\`${spec.default}\``, `--${spec.flag}: default`);
      else
        assert.doesNotMatch(row.def, /`/, `--${spec.flag} has no default value: the table says what happens instead`);
      if (spec.kind.type === 'seconds')
        assert.ok(
          row.meaning.includes(`(${spec.kind.min} to ${spec.kind.max})`),
          `--${spec.flag}: range ${spec.kind.min} to ${spec.kind.max} in "${row.meaning}"`,
        );
      if (spec.kind.type === 'enum')
        for (const v of spec.kind.values) assert.ok(row.meaning.includes(`\`${v}\``), `--${spec.flag}: value ${v}`);
    }
  },
);

test('the operator sections are in order, and the developer material is in CONTRIBUTING.md', () => {
  const h2 = [...README.matchAll(/^## (.+)$/gm)].map((m) => m[1]);
  assert.deepEqual(h2, [
    'Install',
    "Migrate from NVIDIA's device plugin DaemonSet",
    'Container runtime prerequisites',
    'Configure',
    'Operate',
    'Troubleshoot',
    'Upgrade and uninstall',
    'Security model',
    'Supported distributions and Kubernetes versions',
    'Reference',
  ]);
  for (const h of ['Layout', 'Tests', 'Building the packages'])
    assert.match(CONTRIBUTING, new RegExp(`^## ${h}$`, 'm'));
  for (const cmd of COMMANDS) assert.ok(CONTRIBUTING.includes(cmd), cmd);
  assert.match(README, /\(CONTRIBUTING\.md\)/);
});

test('every in-page link of README points at a heading it has', () => {
  const slug = (h: string): string =>
    h
      .toLowerCase()
      .replace(/`/g, '')
      .replace(/[^a-z0-9 _-]/g, '')
      .replace(/ /g, '-');
  const anchors = new Set([...README.matchAll(/^#{1,4} (.+)$/gm)].map((m) => slug(m[1]!)));
  const links = [...README.matchAll(/\]\(#([^)]+)\)/g)].map((m) => m[1]!);
  assert.ok(links.length > 10);
  assert.deepEqual(
    links.filter((l) => !anchors.has(l)),
    [],
  );
});
