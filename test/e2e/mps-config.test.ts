// End-to-end: MPS sharing's configuration through the built executable on a simulated node (fake NVML
// + kubelet stand-in, real gRPC): NVIDIA's documented MPS config accepted and served, each of NVIDIA's
// refusals stopping the daemon with exit 2 and the same words from `check`, and Allocate's variable
// and mounts for every device-list strategy. No MPS control daemon runs here: the plugin's
// daemon watch keeps the replicas Unhealthy (test/e2e/mps-health.test.ts tests that watch), and nothing below
// needs them healthy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { SimNode, TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';
import type * as M from '../../src/api/messages.ts';

const ROOT = '/run/nvidia/mps';

/** The example of NVIDIA's README, "With CUDA MPS", unchanged. */
const NVIDIA_MPS_EXAMPLE = `version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
`;

/** A one-GPU node of a pre-Volta board (compute capability 6.0 in the fake NVML): MPS takes 16 clients. */
const P100_NODE = {
  description: 'One Tesla P100 (compute capability 6.0).',
  driverVersion: '550.54.15',
  linkCount: 0,
  gpus: [
    {
      uuid: 'GPU-6a100000-0000-4000-8000-000000000001',
      name: 'Tesla P100-PCIE-16GB',
      minor: 0,
      busId: '00000000:3B:00.0',
      memoryMiB: 16280,
      numaNode: 0,
    },
  ],
};

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** `gpu-device-plugin check …` against a topology (fixture name or path), as the operator runs it. */
async function check(
  args: string[],
  dir: string,
  topology: string,
  extraEnv: Record<string, string> = {},
): Promise<Run> {
  const libs = await buildFakeNvml();
  const sys = join(dir, 'sys');
  writeSysfs(sys, loadTopology(topology));
  const env: Record<string, string> = {
    PATH: '/nonexistent',
    TMPDIR: dir,
    SYSFS_ROOT: sys,
    LD_LIBRARY_PATH: libs.current,
    FAKE_NVML_CONFIG: topology.includes('/') ? topology : join(TOPOLOGIES, `${topology}.json`),
    SYSTEMD_UNIT_ROOT: join(dir, 'root'),
    CDI_SPEC_DIRS: join(dir, 'cdi'),
    GPU_DEVICE_PLUGIN_STATE_FILE: join(dir, 'state.json'),
    ...extraEnv,
  };
  return new Promise((resolve) => {
    execFile(executable(), ['check', ...args], { env, encoding: 'utf8', timeout: 30000 }, (err, stdout, stderr) => {
      const status =
        err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : null;
      resolve({ status, stdout, stderr });
    });
  });
}

function line(out: string, name: string): string {
  return (
    out.split('\n').find((l) => new RegExp(`^(PASS|WARN|FAIL|SKIP)  ${name} `).test(l)) ??
    `(no "${name}" line in:\n${out})`
  );
}

/** Starts the daemon expecting it to refuse: its exit code and every line it wrote. */
async function refusedStart(
  topology: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number | null; log: string }> {
  const node = await SimNode.start({ topology, waitRegistered: false, args, env });
  try {
    const exit = await node.plugin.exited;
    assert.equal(node.kubelet!.registrations.length, 0, 'nothing registered');
    return { code: exit.code, log: node.plugin.lines.join('\n') };
  } finally {
    await node.stop();
  }
}

test(
  "NVIDIA's MPS example config is accepted unchanged: 10 " +
    'MPS replicas per GPU under nvidia.com/gpu, check passes it',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-mps-ok-'));
    const file = join(dir, 'config.yaml');
    writeFileSync(file, NVIDIA_MPS_EXAMPLE);
    try {
      const node = await SimNode.start({ topology: 'demo-8', args: ['--config-file', file], env: { MPS_ROOT: ROOT } });
      try {
        const k = node.kubelet!;
        assert.deepEqual(
          k.registrations.map((r) => r.request.resource_name),
          ['nvidia.com/gpu'],
        );
        const devices = await k.waitForDevices((d) => d.length === 80);
        assert.deepEqual(
          devices.slice(0, 11).map((d) => d.ID),
          [
            ...Array.from({ length: 10 }, (_, n) => `${node.topology.gpus[0]!.uuid}::${n}`),
            `${node.topology.gpus[1]!.uuid}::0`,
          ],
        );
        // No control daemon runs here: the replicas wait Unhealthy until one answers (test/e2e/mps-health.test.ts).
        assert.ok(devices.every((d) => d.health === 'Unhealthy'));
        assert.equal(
          node.plugin.matching(/nvidia\.com\/gpu=80 \(MPS replicas of 8 GPUs\)/).length > 0,
          true,
          node.plugin.lines.join('\n'),
        );
      } finally {
        await node.stop();
      }
      const r = await check(['--config-file', file], dir, 'demo-8', { MPS_ROOT: ROOT });
      assert.match(line(r.stdout, 'config'), /^PASS {2}config +options, environment and config file are valid/);
      assert.match(
        line(r.stdout, 'config fit'),
        /^PASS {2}config fit +the daemon would advertise nvidia\.com\/gpu=80 \(MPS replicas of 8 GPUs\)$/,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'each refusal stops the daemon with exit 2 and the key and ' +
    'what to change, and check fails it (exit 2) with the same words',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-mps-refused-'));
    const write = (name: string, text: string): string => {
      const p = join(dir, name);
      writeFileSync(p, text);
      return p;
    };
    const example = write('example.yaml', NVIDIA_MPS_EXAMPLE);
    const p100 = write('p100.json', JSON.stringify(P100_NODE));
    const cases: { what: string; topology: string; args: string[]; env: Record<string, string>; message: string }[] = [
      {
        what: 'no root',
        topology: 'single',
        args: ['--config-file', example],
        env: {},
        message:
          '--mps-root: using MPS requires --mps-root (MPS_ROOT, flags.mpsRoot): the host directory of the MPS ' +
          "control daemons' pipes and shm; set it, e.g. --mps-root=/run/nvidia/mps (the package's env file does)",
      },
      {
        what: 'mixed MIG strategy',
        topology: 'single',
        args: ['--config-file', example, '--mig-strategy=mixed'],
        env: { MPS_ROOT: ROOT },
        message:
          '--mig-strategy: using --mig-strategy=mixed is not supported with MPS (sharing using MPS is ' +
          'not supported for MIG devices); use --mig-strategy=none, or share with sharing.timeSlicing',
      },
      {
        what: 'with time-slicing',
        topology: 'single',
        env: { MPS_ROOT: ROOT },
        args: [
          '--config-file',
          write(
            'both.yaml',
            'sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: ' +
              '2}]\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n',
          ),
        ],
        message:
          'sharing.mps: MPS and time-slicing exclude each other; keep sharing.mps or sharing.timeSlicing, not both',
      },
      {
        what: 'more than 48 replicas',
        topology: 'single',
        env: { MPS_ROOT: ROOT },
        args: ['--config-file', write('49.yaml', 'sharing:\n  mps:\n    resources: [{name: gpu, replicas: 49}]\n')],
        message:
          'sharing.mps.resources[0].replicas: 49 is not allowed; expected an integer ' +
          'from 2 to 48 (an MPS server takes at most 48 clients per GPU; 16 before Volta)',
      },
      {
        what: 'MIG devices (single strategy)',
        topology: 'mig-uniform-2',
        args: ['--config-file', example, '--mig-strategy=single'],
        env: { MPS_ROOT: ROOT },
        message:
          'sharing.mps: sharing using MPS is not supported for MIG devices (nvidia.com/gpu would hold MIG device ',
      },
      {
        what: 'the client limit of a pre-Volta GPU',
        topology: p100,
        env: { MPS_ROOT: ROOT },
        args: ['--config-file', write('20.yaml', 'sharing:\n  mps:\n    resources: [{name: gpu, replicas: 20}]\n')],
        message:
          'sharing.mps.resources[0].replicas: 20 replicas of GPU 0 (GPU-6a100000-0000-4000-8000-000000000001) ' +
          'are more MPS clients than it takes: compute capability 6.0 serves at most ' +
          '16 (48 from Volta, compute capability 7.0, 16 before); ask for at most 16',
      },
    ];
    try {
      for (const c of cases) {
        const started = await refusedStart(c.topology, c.args, c.env);
        assert.equal(started.code, 2, `${c.what}: exit 2\n${started.log}`);
        assert.ok(started.log.includes(c.message), `${c.what}: the daemon says ${c.message}\n${started.log}`);
        const r = await check(c.args, dir, c.topology, c.env);
        assert.equal(r.status, 2, `${c.what}: check exits 2\n${r.stdout}${r.stderr}`);
        assert.ok(
          r.stdout.split('\n').some((l) => /^FAIL {2}config/.test(l) && l.includes(c.message)),
          `${c.what}: check says ${c.message}\n${r.stdout}`,
        );
      }
      // 16 on the same P100 is served.
      const sixteen = write('16.yaml', 'sharing:\n  mps:\n    resources: [{name: gpu, replicas: 16}]\n');
      const node = await SimNode.start({ topology: p100, args: ['--config-file', sixteen], env: { MPS_ROOT: ROOT } });
      try {
        await node.kubelet!.waitForDevices((d) => d.length === 16);
      } finally {
        await node.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'Allocate gives an MPS replica CUDA_MPS_PIPE_DIRECTORY and the pipe and shm ' +
    "mounts with every device-list strategy; two replicas are refused in NVIDIA's words",
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-mps-alloc-'));
    const file = join(dir, 'config.yaml');
    writeFileSync(file, 'sharing:\n  mps:\n    renameByDefault: true\n    resources: [{name: gpu, replicas: 4}]\n');
    const mounts = [
      {
        container_path: '/mps/nvidia.com/gpu.shared/pipe',
        host_path: '/var/mps/nvidia.com/gpu.shared/pipe',
        read_only: false,
      },
      { container_path: '/dev/shm', host_path: '/var/mps/shm', read_only: false },
    ];
    const env = { CUDA_MPS_PIPE_DIRECTORY: '/mps/nvidia.com/gpu.shared/pipe' };
    try {
      for (const strategy of ['envvar', 'volume-mounts', 'cdi-annotations', 'cdi-cri'] as const) {
        const node = await SimNode.start({
          topology: 'single',
          args: ['--config-file', file, `--device-list-strategy=${strategy}`, '--mps-root=/var/mps'],
        });
        try {
          const k = node.kubelet!;
          assert.deepEqual(
            k.registrations.map((r) => r.request.resource_name),
            ['nvidia.com/gpu.shared'],
          );
          await k.waitForDevices((d) => d.length === 4, 'nvidia.com/gpu.shared');
          const uuid = node.topology.gpus[0]!.uuid;
          const res = await k.allocate(
            { container_requests: [{ devices_ids: [`${uuid}::2`] }] },
            'nvidia.com/gpu.shared',
          );
          const [c] = res.container_responses as [M.ContainerAllocateResponse];
          const cdiName = `k8s.device-plugin.nvidia.com/gpu=${uuid}`;
          switch (strategy) {
            case 'envvar':
              assert.deepEqual(c, {
                envs: { NVIDIA_VISIBLE_DEVICES: uuid, ...env },
                mounts,
                devices: [],
                annotations: {},
                cdi_devices: [],
              });
              break;
            case 'volume-mounts':
              assert.deepEqual(c, {
                envs: { NVIDIA_VISIBLE_DEVICES: '/var/run/nvidia-container-devices', ...env },
                mounts: [
                  {
                    container_path: `/var/run/nvidia-container-devices/${uuid}`,
                    host_path: '/dev/null',
                    read_only: true,
                  },
                  ...mounts,
                ],
                devices: [],
                annotations: {},
                cdi_devices: [],
              });
              break;
            case 'cdi-annotations':
              assert.deepEqual(
                { ...c, annotations: Object.values(c.annotations) },
                { envs: env, mounts, devices: [], annotations: [cdiName], cdi_devices: [] },
              );
              break;
            case 'cdi-cri':
              assert.deepEqual(c, {
                envs: env,
                mounts,
                devices: [],
                annotations: {},
                cdi_devices: [{ name: cdiName }],
              });
              break;
          }
          if (strategy === 'envvar') {
            await assert.rejects(
              k.allocate(
                { container_requests: [{ devices_ids: [`${uuid}::0`, `${uuid}::1`] }] },
                'nvidia.com/gpu.shared',
              ),
              (err: Error) =>
                err.message.includes(
                  'container request 0 asks for 2 shared GPU replicas of ' +
                    'nvidia.com/gpu.shared; failRequestsGreaterThanOne allows 1 per ' +
                    'container (maximum request size for shared resources is 1; found 2',
                ),
            );
          }
        } finally {
          await node.stop();
        }
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
