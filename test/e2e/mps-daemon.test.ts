// `gpu-device-plugin mps-control-daemon` through the built executable, with the fake NVML (compute
// modes read back through its control FIFO's stats) and the fake nvidia-cuda-mps-control on PATH
// (limits read from its state JSON), sd_notify received by a socket stand-in. The tmpfs at
// <root>/shm is really mounted (the machine is root); every test unmounts whatever is left under
// its directory, so a failed test leaves no mount behind.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeMpsControl, buildFakeNvml } from '../fake-nvml/build.ts';
import { NotifySocket } from '../support/notify-socket.ts';
import { executable, fakeNvmlStats, nvmlCommand, PluginProcess, SimNode, TOPOLOGIES } from '../support/sim.ts';
import { mountsUnder, unmountUnder } from '../support/mounts.ts';

const TOPOLOGY = join(TOPOLOGIES, 'demo-8.json');
const GPUS = (JSON.parse(readFileSync(TOPOLOGY, 'utf8')) as { gpus: { uuid: string }[] }).gpus.map((g) => g.uuid);
const RESOURCE = 'nvidia.com/gpu';

let nvmlDir = '';
let mpsDir = '';
let base = '';

before(async () => {
  nvmlDir = (await buildFakeNvml()).current;
  mpsDir = await buildFakeMpsControl();
  base = mkdtempSync(join(tmpdir(), 'gdp-mps-daemon-'));
});

after(() => {
  unmountUnder(base);
  rmSync(base, { recursive: true, force: true });
});

interface Run {
  dir: string;
  root: string;
  config: string;
  control: string;
  sock: NotifySocket;
  proc: PluginProcess;
  cleanup(): Promise<void>;
}

let runs = 0;
function config(replicas: number, devices: number[]): string {
  return [
    'version: v1',
    'sharing:',
    '  mps:',
    '    resources:',
    `    - name: ${RESOURCE}`,
    `      replicas: ${replicas}`,
    `      devices: [${devices.join(', ')}]`,
    '',
  ].join('\n');
}

function start(configText: string | null, extraArgs: string[] = [], withRoot = true, topology = TOPOLOGY): Run {
  const dir = join(base, `r${++runs}`);
  mkdirSync(dir);
  const root = join(dir, 'run', 'nvidia', 'mps');
  const cfg = join(dir, 'config.yaml');
  if (configText !== null) writeFileSync(cfg, configText);
  const control = join(dir, 'nvml-control');
  const sock = new NotifySocket(`@gdp-mps-daemon-${process.pid}-${runs}`);
  const proc = new PluginProcess(
    executable(),
    [
      'mps-control-daemon',
      ...(withRoot ? ['--mps-root', root] : []),
      ...(configText === null ? [] : ['--config-file', cfg]),
      ...extraArgs,
    ],
    {
      PATH: `${mpsDir}:/usr/sbin:/usr/bin:/sbin:/bin`,
      LD_LIBRARY_PATH: nvmlDir,
      FAKE_NVML_CONFIG: topology,
      FAKE_NVML_CONTROL: control,
      NOTIFY_SOCKET: sock.path,
      TMPDIR: dir,
    },
  );
  return {
    dir,
    root,
    config: cfg,
    control,
    sock,
    proc,
    async cleanup() {
      sock.close();
      await proc.kill();
      // A control daemon left by a failed test (its pid is in .started or the fake's state).
      const state = join(root, RESOURCE, 'pipe', 'fake-mps-state.json');
      if (existsSync(state)) {
        const { pid, running } = JSON.parse(readFileSync(state, 'utf8')) as { pid: number; running: boolean };
        if (running && pid > 0)
          try {
            process.kill(pid, 'SIGKILL');
          } catch {
            /* gone */
          }
      }
      unmountUnder(dir);
    },
  };
}

/** The fake NVML's compute modes by UUID, once it has applied everything sent before. */
async function computeModes(r: Run): Promise<Record<string, number>> {
  return (await fakeNvmlStats((command) => nvmlCommand(r.control, command), r.dir)).computeModes;
}

interface FakeState {
  pid: number;
  running: boolean;
  commands: number;
  cudaVisibleDevices: string | null;
  defaultActiveThreadPercentage: number;
  pinnedMemLimitMiB: Record<string, number>;
}
function mpsState(r: Run): FakeState {
  return JSON.parse(readFileSync(join(r.root, RESOURCE, 'pipe', 'fake-mps-state.json'), 'utf8')) as FakeState;
}

const mode = (p: string): string => (statSync(p).mode & 0o7777).toString(8);

test(
  'mps-control-daemon: layout 0755, EXCLUSIVE_PROCESS, limits, .started/.ready, shm, READY=1; ' +
    'SIGHUP re-applies limits or warns once; a killed control daemon is restarted; stop undoes it all',
  async () => {
    const r = start(config(4, [0, 1]));
    try {
      const ready = await r.sock.waitFor(/READY=1/, 15000);
      assert.equal(ready, `READY=1\nSTATUS=1 MPS control daemon up: ${RESOURCE}`);
      const dirs = [
        join(r.dir, 'run'),
        join(r.dir, 'run', 'nvidia'),
        r.root,
        join(r.root, 'nvidia.com'),
        join(r.root, RESOURCE),
        join(r.root, RESOURCE, 'pipe'),
        join(r.root, RESOURCE, 'log'),
      ];
      assert.deepEqual(
        dirs.map(mode),
        dirs.map(() => '755'),
        'every directory a client traverses is 0755',
      );
      assert.ok(existsSync(join(r.root, '.ready')));
      const state = mpsState(r);
      assert.equal(readFileSync(join(r.root, RESOURCE, '.started'), 'utf8'), `${state.pid}\n`);
      assert.equal(state.running, true);
      assert.equal(state.cudaVisibleDevices, `${GPUS[0]},${GPUS[1]}`);
      // 32 GiB V100s, 4 replicas: 8192 MiB each, 25 % of the threads.
      assert.deepEqual(state.pinnedMemLimitMiB, { 0: 8192, 1: 8192 });
      assert.equal(state.defaultActiveThreadPercentage, 25);
      const modes = await computeModes(r);
      assert.deepEqual(
        GPUS.map((u) => modes[u]),
        [3, 3, 0, 0, 0, 0, 0, 0],
        'EXCLUSIVE_PROCESS on the two MPS GPUs only',
      );
      const shm = join(r.root, 'shm');
      assert.deepEqual(mountsUnder(r.dir), [shm]);
      // The control daemon runs in a mount namespace of its own whose /dev/shm is <root>/shm (its clients').
      const shmDev = spawnSync('nsenter', ['-t', String(state.pid), '-m', 'stat', '-c', '%d', '/dev/shm'], {
        encoding: 'utf8',
      });
      assert.equal(shmDev.stdout.trim(), String(statSync(shm).dev), shmDev.stderr);
      assert.notEqual(statSync('/dev/shm').dev, statSync(shm).dev);
      const memTotal = Number(/^MemTotal:\s+(\d+)/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1]);
      assert.match(
        await r.proc.waitForLine(/mounted the MPS shm tmpfs/),
        new RegExp(`size=${Math.floor(memTotal / 2)}k`),
      );

      // SIGHUP, 2 replicas on the same GPUs: the limits again, through the client.
      writeFileSync(r.config, config(2, [0, 1]));
      let from = r.proc.lines.length;
      r.proc.signal('SIGHUP');
      await r.proc.waitForLine(/SIGHUP: default limits applied again \(changed\)/, 10000, from);
      assert.deepEqual(mpsState(r).pinnedMemLimitMiB, { 0: 16384, 1: 16384 });
      assert.equal(mpsState(r).defaultActiveThreadPercentage, 50);
      assert.equal(mpsState(r).pid, state.pid, 'the control daemon was not restarted');

      // SIGHUP, another GPU set: one WARN line, nothing touched.
      writeFileSync(r.config, config(2, [0, 1, 2]));
      from = r.proc.lines.length;
      const commands = mpsState(r).commands;
      r.proc.signal('SIGHUP');
      const warn = await r.proc.waitForLine(/WARN SIGHUP/, 10000, from);
      assert.match(warn, /changes GPUs from .* restart the unit to apply it \(systemctl restart gpu-device-plugin-mps/);
      assert.equal(r.proc.matching(/ WARN | ERROR /, from).length, 1);
      assert.equal(mpsState(r).commands, commands, 'no command sent to the daemon');
      assert.equal((await computeModes(r))[GPUS[2] as string], 0);

      // The control daemon killed: one ERROR line, STATUS says so, started again.
      from = r.proc.lines.length;
      const notes = r.sock.messages.length;
      process.kill(state.pid, 'SIGKILL');
      const error = await r.proc.waitForLine(
        /ERROR MPS control daemon was killed by SIGKILL; every client's CUDA context went with it/,
        10000,
        from,
      );
      assert.match(error, new RegExp(`pid=${state.pid}`));
      await r.sock.waitFor(
        /STATUS=0 of 1 MPS control daemons up; nvidia\.com\/gpu down \(its control daemon was killed by SIGKILL\)/,
        10000,
        notes,
      );
      const up = await r.proc.waitForLine(/MPS control daemon up/, 15000, from);
      await r.sock.waitFor(/^STATUS=1 MPS control daemon up/, 10000, notes);
      const again = mpsState(r);
      assert.notEqual(again.pid, state.pid);
      assert.match(up, new RegExp(`pid=${again.pid}`));
      assert.equal(readFileSync(join(r.root, RESOURCE, '.started'), 'utf8'), `${again.pid}\n`);
      assert.equal(again.defaultActiveThreadPercentage, 50, 'restarted with the limits in force');
      assert.equal(r.proc.matching(/ ERROR /, from).length, 1);

      // Stop: quit, compute modes back (read back from NVML by the daemon), files and shm gone.
      from = r.proc.lines.length;
      r.proc.signal('SIGTERM');
      assert.deepEqual(await r.proc.exited, { code: 0, signal: null });
      assert.equal(mpsState(r).running, false, 'the control daemon took quit');
      for (const u of [GPUS[0], GPUS[1]])
        assert.equal(r.proc.matching(new RegExp(`compute mode set gpu=${u} mode=default`), from).length, 1);
      for (const p of ['.ready', `${RESOURCE}/.started`, `${RESOURCE}/log`])
        assert.equal(existsSync(join(r.root, p)), false, p);
      assert.deepEqual(mountsUnder(r.dir), [], 'shm unmounted');
      await r.sock.waitFor(/STOPPING=1/);
    } finally {
      await r.cleanup();
    }
  },
);

test(
  'mps-control-daemon without sharing.mps: READY=1 with a STATUS ' +
    'saying so, then exit 0 (the unit goes inactive, costing nothing)',
  async () => {
    const r = start('version: v1\n');
    try {
      assert.deepEqual(await r.proc.exited, { code: 0, signal: null });
      assert.equal(await r.sock.waitFor(/READY=1/), 'READY=1\nSTATUS=no MPS resources configured');
      assert.equal(r.proc.matching(/no MPS resources configured/).length, 1);
      assert.equal(existsSync(r.root), false, 'nothing created');
    } finally {
      await r.cleanup();
    }
  },
);

test(
  'mps-control-daemon: sharing.mps with sharing.timeSlicing, or without ' +
    '--mps-root, is a configuration error (exit 2) naming what to change',
  async () => {
    const r = start(`${config(2, [0])}  timeSlicing:\n    resources:\n    - name: ${RESOURCE}\n      replicas: 2\n`);
    try {
      assert.deepEqual(await r.proc.exited, { code: 2, signal: null });
      assert.match(
        r.proc.lines.join('\n'),
        /sharing\.mps: MPS and time-slicing exclude each other; keep sharing\.mps or sharing\.timeSlicing, not both/,
      );
    } finally {
      await r.cleanup();
    }
    const noRoot = start(config(2, [0]), [], false);
    try {
      assert.deepEqual(await noRoot.proc.exited, { code: 2, signal: null });
      assert.match(noRoot.proc.lines.join('\n'), /using MPS requires --mps-root/);
      assert.equal(existsSync(noRoot.root), false);
    } finally {
      await noRoot.cleanup();
    }
  },
);

/**
 * The `cannot start` line's error and the STATUS of a refused start
 * (plugin or control daemon unit), without the config file's path.
 */
function refusal(lines: readonly string[], status: string, cfg: string): { log: string; status: string } {
  const said = lines.find((l) => / cannot start error=/.test(l)) ?? `(no "cannot start" line in:\n${lines.join('\n')})`;
  return { log: said.slice(said.indexOf('error=')).replace(cfg, '<config>'), status: status.replace(cfg, '<config>') };
}

test(
  'the control daemon unit refuses what the plugin refuses, in the same words (exit 2, ' +
    'STATUS): 20 MPS replicas of a P100 (16 before compute capability 7.0), MPS on MIG devices',
  async () => {
    const p100 = join(base, 'p100.json');
    writeFileSync(
      p100,
      JSON.stringify({
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
      }),
    );
    const cases = [
      {
        what: '20 replicas of a P100',
        topology: p100,
        configText: config(20, [0]),
        args: [] as string[],
        message:
          'sharing.mps.resources[0].replicas: 20 replicas of GPU 0 (GPU-6a100000-0000-4000-8000-000000000001) ' +
          'are more MPS clients than it takes: compute capability 6.0 serves at most ' +
          '16 (48 from Volta, compute capability 7.0, 16 before); ask for at most 16',
      },
      {
        what: 'MIG devices (--mig-strategy=single)',
        topology: join(TOPOLOGIES, 'mig-uniform-2.json'),
        configText: [
          'version: v1',
          'sharing:',
          '  mps:',
          '    resources:',
          `    - name: ${RESOURCE}`,
          '      replicas: 2',
          '',
        ].join('\n'),
        args: ['--mig-strategy=single'],
        message:
          'sharing.mps: sharing using MPS is not supported for MIG devices (nvidia.com/gpu would hold MIG device ',
      },
    ];
    for (const c of cases) {
      const d = start(c.configText, c.args, true, c.topology);
      let daemon: { log: string; status: string };
      try {
        assert.deepEqual(
          await d.proc.exited,
          { code: 2, signal: null },
          `${c.what}: the control daemon exits 2\n${d.proc.lines.join('\n')}`,
        );
        daemon = refusal(d.proc.lines, await d.sock.waitFor(/^STATUS=configuration error/), d.config);
        assert.equal(existsSync(d.root), false, `${c.what}: nothing set up under the root`);
      } finally {
        await d.cleanup();
      }
      const sock = new NotifySocket(`@gdp-mps-refusal-${process.pid}-${++runs}`);
      const node = await SimNode.start({
        topology: c.topology,
        waitRegistered: false,
        args: ['--config-file', d.config, '--mps-root', d.root, ...c.args],
        env: { NOTIFY_SOCKET: sock.path },
      });
      let plugin: { log: string; status: string };
      try {
        assert.equal(
          (await node.plugin.exited).code,
          2,
          `${c.what}: the plugin exits 2\n${node.plugin.lines.join('\n')}`,
        );
        plugin = refusal(node.plugin.lines, await sock.waitFor(/^STATUS=configuration error/), d.config);
      } finally {
        sock.close();
        await node.stop();
      }
      assert.ok(daemon.log.includes(c.message), `${c.what}: the control daemon says ${c.message}: ${daemon.log}`);
      assert.deepEqual(daemon, plugin, `${c.what}: the same words from both`);
    }
  },
);

test('--help lists mps-control-daemon, which has a --help of its own', () => {
  const main = spawnSync(executable(), ['--help'], { encoding: 'utf8' });
  assert.match(main.stdout, /gpu-device-plugin mps-control-daemon \[options\]/);
  const own = spawnSync(executable(), ['mps-control-daemon', '--help'], { encoding: 'utf8' });
  assert.equal(own.status, 0);
  assert.match(own.stdout, /^Usage: gpu-device-plugin mps-control-daemon \[options\]/);
  assert.match(own.stdout, /--mps-root DIR/);
});
