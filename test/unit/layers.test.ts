// How src/ is layered, checked on the import statements themselves: each folder imports only folders
// below it, and no set of files imports itself round. The order, lowest first, is the one the folder
// READMEs describe; a new folder has to be placed in it before its first import passes.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { test } from 'node:test';

const SRC = join(import.meta.dirname, '..', '..', 'src');

/** Folders of src/, lowest first; folders in one inner list are peers and never import each other. */
const LAYERS: readonly (readonly string[])[] = [
  ['core'],
  ['system'],
  ['api'],
  ['config'],
  ['nvml', 'k8s'],
  ['node'],
  ['kubelet', 'mps'],
  ['plugin', 'dra'],
  ['observe'],
  ['cli'],
  ['.'],
];

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => relative(SRC, join(e.parentPath, e.name)));
}

/** Every relative import of one file (static, dynamic and type-only), as paths under src/. */
function importsOf(file: string): string[] {
  const text = readFileSync(join(SRC, file), 'utf8');
  const found = text.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*|^import\s+)'(\.{1,2}\/[^']+)'/gm);
  return [...found].map((m) => normalize(join(dirname(file), m[1] as string)));
}

const folderOf = (file: string): string => (file.includes('/') ? (file.split('/')[0] as string) : '.');
const rankOf = (folder: string): number => LAYERS.findIndex((layer) => layer.includes(folder));

test('every folder of src/ has its place in the layer order', () => {
  const folders = new Set(sources(SRC).map(folderOf));
  assert.ok(folders.size > 5, 'the scan found the folders');
  for (const folder of folders) assert.notEqual(rankOf(folder), -1, `src/${folder} is not in LAYERS`);
});

test('no folder imports a folder at its own level or above it', () => {
  const wrong: string[] = [];
  let crossing = 0;
  for (const file of sources(SRC)) {
    for (const target of importsOf(file)) {
      const [from, to] = [folderOf(file), folderOf(target)];
      if (from === to) continue;
      crossing++;
      if (rankOf(to) >= rankOf(from)) wrong.push(`${file} imports ${target} (${from} → ${to})`);
    }
  }
  assert.ok(crossing > 100, 'the scan found the imports between folders');
  assert.deepEqual(wrong, []);
});

test('no cycle of files', () => {
  const graph = new Map(sources(SRC).map((f) => [f, importsOf(f)]));
  const cycles: string[][] = [];
  // Tarjan's strongly connected components; a component of more than one file is a cycle.
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v) as number, low.get(w) as number));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v) as number, index.get(w) as number));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    for (let w = stack.pop(); w !== undefined; w = w === v ? undefined : stack.pop()) {
      onStack.delete(w);
      component.push(w);
    }
    if (component.length > 1) cycles.push(component.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  assert.deepEqual(cycles, []);
});
