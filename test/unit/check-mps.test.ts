// `check`'s MPS lines (src/cli/check-mps.ts) against the fake nvidia-cuda-mps-control: the root and
// the pipe directories reachable by anyone, the control program found, each daemon's answer, and the
// compute modes NVML reported — each failure naming what to do.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmod, mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { buildFakeMpsControl, MPS_CONTROL_NAME } from '../fake-nvml/build.ts';
import { mpsChecks } from '../../src/cli/check-mps.ts';
import type { NodeReport } from '../../src/cli/inspect.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { mpsPaths } from '../../src/core/mps.ts';
import type { PlannedResource } from '../../src/core/sharing.ts';
import { mpsCommand, mpsEnvironment } from '../../src/mps/control-client.ts';

const gpu = (i: number): Gpu => ({
  index: i,
  uuid: `GPU-${i}`,
  name: 'Fake',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 16 * 2 ** 30,
  numaNode: 0,
});
const GPUS = [gpu(0), gpu(1)];
const plain: PlannedResource = {
  name: 'nvidia.com/gpu',
  failRequestsGreaterThanOne: true,
  shared: true,
  devices: [0, 1].flatMap((g) =>
    [0, 1].map((n) => ({ id: `GPU-${g}::${n}`, uuid: `GPU-${g}`, gpu: g, runtimeName: `GPU-${g}`, replica: n })),
  ),
};
const resource: PlannedResource = { ...plain, mps: true };
const report = (modes: NodeReport['computeModes']): NodeReport => ({
  library: 'fake',
  driverVersion: '550',
  gpus: GPUS.map((g) => ({ ...g, health: 'Healthy' })),
  pairs: [],
  mig: null,
  ...(modes === undefined ? {} : { computeModes: modes }),
});
const byName = (lines: { name: string; status: string; detail: string; fix?: string }[], name: string) => {
  const l = lines.find((x) => x.name === name);
  assert.ok(l !== undefined, `no ${name} line in ${JSON.stringify(lines)}`);
  return l;
};

test(
  "check: MPS root modes, the control program, the daemon's " +
    'answer and the compute modes, each failure with its fix',
  async () => {
    const bin = await buildFakeMpsControl();
    const base = await mkdtemp(path.join(tmpdir(), 'check-mps-'));
    await chmod(base, 0o755);
    const root = path.join(base, 'mps');
    const p = mpsPaths(root, 'nvidia.com/gpu');
    try {
      assert.deepEqual(
        await mpsChecks({ root, driverRoot: base, resources: [plain], report: null, path: bin }),
        [],
        'no MPS resource: no MPS line',
      );
      // Nothing there yet, no program on PATH, no NVML.
      let lines = await mpsChecks({
        root,
        driverRoot: base,
        resources: [resource],
        report: null,
        path: '/nonexistent',
      });
      assert.equal(byName(lines, 'mps root').status, 'FAIL');
      assert.match(byName(lines, 'mps root').detail, new RegExp(`${root} does not exist`));
      assert.match(byName(lines, 'mps root').fix ?? '', /systemctl start gpu-device-plugin-mps/);
      assert.equal(byName(lines, 'mps control').status, 'FAIL');
      assert.match(
        byName(lines, 'mps control').detail,
        /nvidia-cuda-mps-control not found \(looked at .*\/nonexistent\/nvidia-cuda-mps-control/,
      );
      assert.equal(byName(lines, 'mps daemons').status, 'SKIP');
      assert.equal(byName(lines, 'compute mode').status, 'SKIP');
      // A pipe directory others cannot reach.
      await mkdir(p.pipeDir, { recursive: true, mode: 0o755 });
      await mkdir(p.logDir, { recursive: true, mode: 0o755 });
      await chmod(p.dir, 0o700);
      lines = await mpsChecks({
        root,
        driverRoot: base,
        resources: [resource],
        report: report(['default', { error: 'NVML: Not Supported' }]),
        path: bin,
      });
      assert.equal(byName(lines, 'mps root').status, 'FAIL');
      assert.match(
        byName(lines, 'mps root').detail,
        /nvidia\.com\/gpu has mode 0700: a pod that does not run as root cannot reach the pipe/,
      );
      assert.equal(byName(lines, 'mps root').fix, `chmod 755 ${p.dir}`);
      assert.deepEqual(
        [byName(lines, 'mps control').status, byName(lines, 'mps control').detail],
        ['PASS', `found ${path.join(bin, MPS_CONTROL_NAME)}`],
      );
      assert.equal(byName(lines, 'mps daemons').status, 'FAIL');
      assert.match(byName(lines, 'mps daemons').detail, /nvidia\.com\/gpu .*Cannot find MPS control daemon process/);
      assert.equal(byName(lines, 'compute mode').status, 'FAIL');
      assert.match(
        byName(lines, 'compute mode').detail,
        /GPU 0 \(nvidia\.com\/gpu\) is DEFAULT; GPU 1 \(nvidia\.com\/gpu\) is unreadable: NVML: Not Supported/,
      );
      // All as the control daemon unit leaves them.
      await chmod(p.dir, 0o755);
      const started = spawnSync(path.join(bin, MPS_CONTROL_NAME), ['-d'], { env: mpsEnvironment(p, ['0', '1']) });
      assert.equal(started.status, 0, String(started.stderr));
      try {
        lines = await mpsChecks({
          root,
          driverRoot: base,
          resources: [resource],
          report: report(['exclusive-process', 'exclusive-process']),
          path: bin,
        });
        assert.deepEqual(
          lines.map((l) => [l.name, l.status]),
          [
            ['mps root', 'PASS'],
            ['mps control', 'PASS'],
            ['mps daemons', 'PASS'],
            ['compute mode', 'PASS'],
          ],
          JSON.stringify(lines),
        );
        assert.match(byName(lines, 'compute mode').detail, /all 2 GPUs MPS serves are in EXCLUSIVE_PROCESS/);
      } finally {
        await mpsCommand(path.join(bin, MPS_CONTROL_NAME), p, 'quit').catch(() => undefined);
      }
      const noRoot = await mpsChecks({ root: null, driverRoot: base, resources: [resource], report: null, path: bin });
      assert.deepEqual(
        noRoot.map((l) => [l.name, l.status]),
        [['mps root', 'FAIL']],
      );
    } finally {
      await rm(base, { recursive: true, force: true });
    }
  },
);
