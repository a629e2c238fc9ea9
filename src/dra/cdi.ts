// Reads the CDI spec files the NVIDIA Container Toolkit writes (/etc/cdi, /var/run/cdi: every *.json,
// *.yaml, *.yml), for the kind, the device names and their device nodes. Read on every prepare (a
// prepare is rare, and a spec the toolkit refreshed must count at once). The mapping from a GPU to
// its CDI ID is core/dra-cdi.ts's.
import { createRequire } from 'node:module';
import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type * as Yaml from 'yaml';
import type { CdiSpec } from '../core/dra-cdi.ts';

/** Where the container runtime looks for CDI specs (the CDI defaults). */
export const CDI_SPEC_DIRS: readonly string[] = ['/etc/cdi', '/var/run/cdi'];
/** Where the plugin writes the CDI specs of its MPS claims: the runtime's directory for generated specs. */
export const CDI_WRITE_DIR = '/var/run/cdi';

/**
 * The CDI spec directories to read: $CDI_SPEC_DIRS (colon-separated; `check` reads the same) when
 * set, as for a runtime configured with other cdi_spec_dirs (and the tests); else the CDI defaults.
 */
export function cdiSpecDirs(env: NodeJS.ProcessEnv): readonly string[] {
  const v = env.CDI_SPEC_DIRS;
  const dirs = v === undefined ? [] : v.split(':').filter((d) => d !== '');
  return dirs.length > 0 ? dirs : CDI_SPEC_DIRS;
}

// Loaded on first use (see config/config.ts for why: the bundle runs it lazily).
let yaml: typeof Yaml | undefined;
function loadYaml(): typeof Yaml {
  yaml ??=
    typeof require === 'function'
      ? (require('yaml') as typeof Yaml)
      : (createRequire(import.meta.url)('yaml') as typeof Yaml);
  return yaml;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Parses one spec's text (YAML or JSON). Throws naming what is wrong. */
export function parseCdiSpec(path: string, text: string): CdiSpec {
  const doc = loadYaml().parse(text) as unknown;
  if (!isObject(doc)) throw new Error('not a mapping');
  if (typeof doc.kind !== 'string') throw new Error('has no kind');
  const devices = Array.isArray(doc.devices) ? doc.devices : [];
  return {
    path,
    kind: doc.kind,
    devices: devices.flatMap((d: unknown) => {
      if (!isObject(d) || typeof d.name !== 'string') return [];
      const edits = d.containerEdits;
      const nodes = isObject(edits) && Array.isArray(edits.deviceNodes) ? edits.deviceNodes : [];
      return [
        {
          name: d.name,
          deviceNodes: nodes.flatMap((n: unknown) => (isObject(n) && typeof n.path === 'string' ? [n.path] : [])),
        },
      ];
    }),
  };
}

/** Every spec file in `dirs` (absent directories are skipped); unreadable ones say why. */
export async function readCdiSpecs(dirs: readonly string[]): Promise<CdiSpec[]> {
  const out: CdiSpec[] = [];
  for (const dir of dirs) {
    const names = await readdir(dir).catch(() => [] as string[]);
    for (const n of names.sort()) {
      if (!/\.(json|ya?ml)$/.test(n)) continue;
      const path = join(dir, n);
      try {
        out.push(parseCdiSpec(path, await readFile(path, 'utf8')));
      } catch (err) {
        out.push({ path, error: (err as Error).message.split('\n')[0] ?? 'cannot be read' });
      }
    }
  }
  return out;
}
