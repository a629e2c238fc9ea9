// The code's shape, which the formatter cannot keep by itself: no line of TypeScript wider than the
// formatter's 120 columns (comments and long strings included), and no source file over 400 lines.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { test } from 'node:test';

const ROOT = join(import.meta.dirname, '..', '..');
const MAX_COLUMNS = 120;
const MAX_SOURCE_LINES = 400;

function typescript(folder: string): string[] {
  return readdirSync(join(ROOT, folder), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => relative(ROOT, join(e.parentPath, e.name)));
}

test(`no line of src/, test/ or build/ is wider than ${MAX_COLUMNS} columns`, () => {
  const files = ['src', 'test', 'build'].flatMap(typescript);
  assert.ok(files.length > 100, 'the scan found the sources');
  const wide = files.flatMap((file) =>
    readFileSync(join(ROOT, file), 'utf8')
      .split('\n')
      .flatMap((line, i) => ([...line].length > MAX_COLUMNS ? [`${file}:${i + 1} (${[...line].length})`] : [])),
  );
  assert.deepEqual(wide, []);
});

test(`no file of src/ is longer than ${MAX_SOURCE_LINES} lines`, () => {
  const long = typescript('src').flatMap((file) => {
    const lines = readFileSync(join(ROOT, file), 'utf8').trimEnd().split('\n').length;
    return lines > MAX_SOURCE_LINES ? [`${file} (${lines})`] : [];
  });
  assert.deepEqual(long, []);
});
