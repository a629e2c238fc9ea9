// The plugin's koffi declarations of NVML (src/nvml/bindings.ts, mig-symbols.ts) against the C prototypes of the
// fake NVML, which are nvml.h's: each declared entry point exists there under the same name, with as many
// parameters, each one a pointer where C has a pointer or an opaque handle and a scalar of C's width where C has
// a scalar. A declaration that drifts (a missing count pointer, an int where the structure goes) would pass
// garbage to the real driver; this catches it without a GPU.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { BASIC_SYMBOLS, LAZY_SYMBOLS } from '../../src/nvml/bindings.ts';
import { MIG_SYMBOLS } from '../../src/nvml/mig-symbols.ts';

const FAKE_DIR = join(import.meta.dirname, '..', 'fake-nvml');
/** nvml.h's opaque handles: each a pointer to a driver structure. */
const HANDLES = new Set(['nvmlDevice_t', 'nvmlEventSet_t', 'nvmlGpuInstance_t', 'nvmlComputeInstance_t']);

interface Prototype {
  readonly name: string;
  readonly params: readonly string[];
}

/** `ret name(a, b)` → its name and parameters; `(void)` and `()` have none. */
function parse(declaration: string): Prototype {
  const m = /([A-Za-z_0-9]+)\s*\(([^)]*)\)\s*;?\s*$/.exec(declaration.replace(/\s+/g, ' ').trim());
  assert.ok(m !== null, `not a C prototype: ${declaration}`);
  const list = (m[2] ?? '').trim();
  const params = list === '' || list === 'void' ? [] : list.split(',').map((p) => p.trim());
  return { name: m[1] ?? '', params };
}

/** What crosses the ABI for one parameter: a pointer, or a scalar of 32 or 64 bits. */
function abiClass(param: string): 'pointer' | 'u64' | 'i32' {
  const words = param.replace(/\b(_Out_|_Inout_|const)\b/g, ' ').trim();
  if (words.includes('*') || words.includes('[')) return 'pointer';
  const type = words.split(/\s+/).slice(0, -1).join(' ');
  if (HANDLES.has(type)) return 'pointer';
  if (/\blong long\b/.test(type)) return 'u64';
  if (/^(unsigned )?int$/.test(type) || /_t$/.test(type)) return 'i32';
  assert.fail(`a parameter of a type this check does not know: ${param}`);
}

/** Every `EXPORT <ret> name(...)` of the fake's C sources, by name (the first, its prototype). */
function fakePrototypes(): Map<string, Prototype> {
  const out = new Map<string, Prototype>();
  for (const file of readdirSync(FAKE_DIR).filter((f) => /\.[ch]$/.test(f))) {
    const text = readFileSync(join(FAKE_DIR, file), 'utf8');
    for (const m of text.matchAll(/^EXPORT [^(;{]*?\b(nvml[A-Za-z_0-9]+)\s*\(([^)]*)\)/gm)) {
      const p = parse(`${m[1]}(${m[2]})`);
      if (!out.has(p.name)) out.set(p.name, p);
    }
  }
  return out;
}

const DECLARED: Readonly<Record<string, string>> = { ...BASIC_SYMBOLS, ...LAZY_SYMBOLS };

test('the check knows its ground: the fake has C prototypes and every MIG declaration is checked', () => {
  const fake = fakePrototypes();
  assert.ok(fake.size > 50, `prototypes found in ${FAKE_DIR}: ${fake.size}`);
  assert.deepEqual(
    parse(
      'nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int p, ' +
        'const nvmlGpuInstancePlacement_t *pl, nvmlGpuInstance_t *gi)',
    ).params.map(abiClass),
    ['pointer', 'i32', 'pointer', 'pointer'],
  );
  for (const name of Object.keys(MIG_SYMBOLS)) assert.ok(name in DECLARED, `${name} is bound`);
});

test('every declared NVML entry point matches its C prototype: name, parameter count, pointer or scalar width', () => {
  const fake = fakePrototypes();
  const problems: string[] = [];
  for (const [key, declaration] of Object.entries(DECLARED)) {
    const ours = parse(declaration);
    if (ours.name !== key) problems.push(`${key}: declared as ${ours.name}`);
    const c = fake.get(ours.name);
    if (c === undefined) {
      problems.push(`${key}: no such entry point in nvml.h's prototypes`);
      continue;
    }
    if (ours.params.length !== c.params.length) {
      problems.push(`${key}: ${ours.params.length} parameters declared, C has ${c.params.length}`);
      continue;
    }
    ours.params.forEach((p, i) => {
      const [mine, theirs] = [abiClass(p), abiClass(c.params[i] ?? '')];
      if (mine !== theirs)
        problems.push(`${key} parameter ${i + 1}: ${p} (${mine}) but C has ${c.params[i]} (${theirs})`);
    });
  }
  assert.deepEqual(problems, []);
});
