// The MPS control daemons' supervisor (src/mps/daemon.ts) in-process, against a fake host that
// records what was done to it, with mocked timers for the restart backoff.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { comparePlans, FIRST_RESTART_MS, limitCommands, MpsSupervisor, QUIT_MS } from '../../src/mps/daemon.ts';
import type { MpsDaemonPlan } from '../../src/core/mps.ts';
import { createLogger } from '../../src/system/log.ts';
import { type FakeChild, FakeHost } from '../support/fake-mps-host.ts';

const ROOT = '/run/nvidia/mps';

function plan(resource: string, replicas: number, uuids: string[]): MpsDaemonPlan {
  return {
    resource,
    replicas,
    activeThreadPercentage: Math.floor(100 / replicas),
    gpus: uuids.map((uuid, k) => ({ uuid, index: k, mpsDevice: k, pinnedMemLimitMiB: Math.floor(40960 / replicas) })),
  };
}

function setup(): { host: FakeHost; sup: MpsSupervisor; lines: string[]; status: { line: string; ready: boolean }[] } {
  const host = new FakeHost();
  const lines: string[] = [];
  const status: { line: string; ready: boolean }[] = [];
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
  const sup = new MpsSupervisor({
    root: ROOT,
    host,
    log,
    status: (line, ready = false) => status.push({ line, ready }),
  });
  return { host, sup, lines, status };
}

/** Lets the fake host's promise chains run (no timers involved). */
async function drain(): Promise<void> {
  for (let i = 0; i < 50; i++) await Promise.resolve();
}

test('limitCommands: a pinned-memory limit per GPU by MPS device number, then the thread percentage', () => {
  assert.deepEqual(limitCommands(plan('nvidia.com/gpu', 4, ['GPU-a', 'GPU-b'])), [
    'set_default_device_pinned_mem_limit 0 10240M',
    'set_default_device_pinned_mem_limit 1 10240M',
    'set_default_active_thread_percentage 25',
  ]);
});

test('comparePlans: same GPUs with other replicas re-apply limits; other GPUs or resources need a restart', () => {
  const a = [plan('nvidia.com/gpu', 2, ['GPU-a'])];
  assert.deepEqual(comparePlans(a, [plan('nvidia.com/gpu', 2, ['GPU-a'])]), {
    kind: 'same-gpus',
    limitsChanged: false,
  });
  assert.deepEqual(comparePlans(a, [plan('nvidia.com/gpu', 4, ['GPU-a'])]), { kind: 'same-gpus', limitsChanged: true });
  const gpus = comparePlans(a, [plan('nvidia.com/gpu', 2, ['GPU-a', 'GPU-b'])]);
  assert.equal(gpus.kind, 'restart-needed');
  assert.match(
    gpus.kind === 'restart-needed' ? gpus.why : '',
    /nvidia\.com\/gpu changes GPUs from \[GPU-a\] to \[GPU-a,GPU-b\]/,
  );
  assert.equal(comparePlans(a, [...a, plan('nvidia.com/other', 2, ['GPU-b'])]).kind, 'restart-needed');
  assert.equal(comparePlans(a, []).kind, 'restart-needed');
});

test(
  'start: compute mode, dirs, daemon, limits, .started per ' +
    'resource, .ready and READY=1 once all are up; stop undoes it',
  async () => {
    const { host, sup, status } = setup();
    await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a', 'GPU-b'])]);
    assert.deepEqual(host.actions, [
      `mkdir ${ROOT}`,
      `mkdir ${ROOT}/shm`,
      `mount ${ROOT}/shm`,
      'mode GPU-a exclusive-process',
      'mode GPU-b exclusive-process',
      `mkdir ${ROOT}/nvidia.com/gpu/pipe`,
      `mkdir ${ROOT}/nvidia.com/gpu/log`,
      'start nvidia.com/gpu 101',
      `cmd ${ROOT}/nvidia.com/gpu/pipe set_default_device_pinned_mem_limit 0 20480M`,
      `cmd ${ROOT}/nvidia.com/gpu/pipe set_default_device_pinned_mem_limit 1 20480M`,
      `cmd ${ROOT}/nvidia.com/gpu/pipe set_default_active_thread_percentage 50`,
    ]);
    assert.equal(host.files.get(`${ROOT}/nvidia.com/gpu/.started`), '101\n');
    assert.equal(host.files.get(`${ROOT}/.ready`), '');
    assert.deepEqual(status, [{ line: 'STATUS=1 MPS control daemon up: nvidia.com/gpu', ready: true }]);

    host.actions.length = 0;
    await sup.stop();
    assert.deepEqual(host.actions, [
      `cmd ${ROOT}/nvidia.com/gpu/pipe quit`,
      'mode GPU-a default',
      'mode GPU-b default',
      `rm ${ROOT}/nvidia.com/gpu/.started`,
      `rm ${ROOT}/nvidia.com/gpu/log`,
      `rm ${ROOT}/.ready`,
      `umount ${ROOT}/shm`,
    ]);
    assert.equal(host.files.size, 0);
  },
);

test('no MPS resources: READY=1 with a STATUS saying so, nothing touched', async () => {
  const { host, sup, status, lines } = setup();
  await sup.start([]);
  assert.deepEqual(host.actions, []);
  assert.deepEqual(status, [{ line: 'STATUS=no MPS resources configured', ready: true }]);
  assert.ok(lines.some((l) => /no MPS resources configured/.test(l)));
  await sup.stop();
  assert.deepEqual(host.actions, [`rm ${ROOT}/.ready`]);
});

test(
  'a control daemon that dies: one ERROR line, .started and ' +
    '.ready removed, STATUS says so, started again with backoff',
  async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const { host, sup, status, lines } = setup();
    await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a'])]);
    const first = host.children[0] as FakeChild;
    host.failStarts = 1; // the first restart fails too: the second waits twice as long
    first.end({ code: null, signal: 'SIGKILL' });
    await drain();
    const errors = lines.filter((l) => l.split(' ')[1] === 'ERROR');
    assert.equal(errors.length, 1, lines.join('\n'));
    assert.match(errors[0] ?? '', /MPS control daemon was killed by SIGKILL; every client's CUDA context went with it/);
    assert.equal(host.files.has(`${ROOT}/nvidia.com/gpu/.started`), false);
    assert.equal(host.files.has(`${ROOT}/.ready`), false);
    assert.match(
      status.at(-1)?.line ?? '',
      /0 of 1 MPS control daemons up; nvidia\.com\/gpu down \(its control daemon was killed by SIGKILL\)/,
    );
    assert.equal(status.at(-1)?.ready, false);

    assert.equal(host.children.length, 1);
    t.mock.timers.tick(FIRST_RESTART_MS - 1);
    await drain();
    assert.equal(host.actions.filter((a) => a.startsWith('start')).length, 1, 'not before the backoff');
    t.mock.timers.tick(1);
    await drain();
    assert.match(lines.at(-1) ?? '', /cannot start the MPS control daemon; trying again.*retryInMs=2000/);
    t.mock.timers.tick(2 * FIRST_RESTART_MS);
    await drain();
    assert.equal(host.children.length, 2, 'started again after 1 s + 2 s');
    assert.equal(host.files.get(`${ROOT}/nvidia.com/gpu/.started`), '102\n');
    assert.equal(host.files.get(`${ROOT}/.ready`), '');
    assert.equal(status.at(-1)?.line, 'STATUS=1 MPS control daemon up: nvidia.com/gpu');
    await sup.stop();
  },
);

test('a start that fails is retried, and READY=1 still goes out after the first attempt', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const { host, sup, status } = setup();
  host.failStarts = 1;
  await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a'])]);
  assert.equal(status.length, 1);
  assert.equal(status[0]?.ready, true);
  assert.match(
    status[0]?.line ?? '',
    new RegExp(
      String.raw`0 of 1 MPS control daemons up; nvidia\.com\/gpu down ` +
        String.raw`\(nvidia-cuda-mps-control for nvidia\.com\/gpu did not answer\)`,
    ),
  );
  t.mock.timers.tick(FIRST_RESTART_MS);
  await drain();
  assert.equal(host.children.length, 1);
  assert.deepEqual(status.at(-1), { line: 'STATUS=1 MPS control daemon up: nvidia.com/gpu', ready: false });
  await sup.stop();
});

test(
  'reload: a new replica count re-applies the limits; ' + 'a changed GPU set is one WARN line and nothing else',
  async () => {
    const { host, sup, lines } = setup();
    await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a'])]);
    host.actions.length = 0;
    await sup.reload([plan('nvidia.com/gpu', 4, ['GPU-a'])]);
    assert.deepEqual(host.actions, [
      `cmd ${ROOT}/nvidia.com/gpu/pipe set_default_device_pinned_mem_limit 0 10240M`,
      `cmd ${ROOT}/nvidia.com/gpu/pipe set_default_active_thread_percentage 25`,
    ]);
    assert.match(lines.at(-1) ?? '', /SIGHUP: default limits applied again \(changed\)/);
    assert.equal(sup.plans[0]?.replicas, 4);

    host.actions.length = 0;
    const before = lines.length;
    await sup.reload([plan('nvidia.com/gpu', 4, ['GPU-a', 'GPU-b'])]);
    assert.deepEqual(host.actions, []);
    assert.equal(lines.length, before + 1);
    assert.match(
      lines.at(-1) ?? '',
      /changes GPUs from \[GPU-a\] to \[GPU-a,GPU-b\].*systemctl restart gpu-device-plugin-mps/,
    );
    assert.equal(sup.plans[0]?.gpus.length, 1, 'keeps running as is');
    await sup.stop();
  },
);

test('stop: a daemon that does not take quit gets SIGTERM', async () => {
  const { host, sup } = setup();
  await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a'])]);
  host.command = async (_p, command) => {
    if (command === 'quit') throw new Error('no answer within 1000 ms');
    return '';
  };
  await sup.stop();
  assert.equal(host.children[0]?.killed, true);
  assert.ok(host.actions.includes('mode GPU-a default'));
});

test("shmSize: half of MemTotal in KiB (NVIDIA's), 65536k when /proc/meminfo cannot be read or lacks it", async () => {
  const { shmSize } = await import('../../src/mps/daemon-host.ts');
  assert.equal(shmSize('MemTotal:       32791044 kB\nMemFree:         1 kB\n'), '16395522k');
  assert.equal(shmSize(null), '65536k');
  assert.equal(shmSize('MemFree: 1 kB\n'), '65536k');
});

test('isMountPoint: the mount point field of mountinfo, with its octal escapes', async () => {
  const { isMountPoint } = await import('../../src/mps/daemon-host.ts');
  const info =
    '42 26 0:39 / /run/nvidia/mps/shm rw,nosuid - tmpfs tmpfs rw\n43 26 0:40 / /tmp/a\\040b/shm rw - tmpfs tmpfs rw\n';
  assert.equal(isMountPoint(info, '/run/nvidia/mps/shm'), true);
  assert.equal(isMountPoint(info, '/run/nvidia/mps'), false);
  assert.equal(isMountPoint(info, '/tmp/a b/shm'), true);
});

test(
  'stop: a daemon that takes quit but does not exit (clients still ' +
    'running) gets SIGTERM after QUIT_MS, and the compute modes still go back',
  async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const { host, sup, lines } = setup();
    await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a'])]);
    host.command = async () => '';
    const stopping = sup.stop();
    await drain();
    assert.equal(host.children[0]?.killed, false, 'not before QUIT_MS');
    t.mock.timers.tick(QUIT_MS);
    await drain();
    assert.equal(host.children[0]?.killed, true);
    await stopping;
    assert.match(
      lines.find((l) => / WARN /.test(l)) ?? '',
      /still running 600 ms after quit \(its clients have not finished\); sending it SIGTERM/,
    );
    assert.ok(host.actions.includes('mode GPU-a default'));
  },
);

test('a control daemon that exits while its limits are set is a failed start: retried, never marked up', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const { host, sup, status, lines } = setup();
  const command = host.command.bind(host);
  let dieOnce = true;
  host.command = async (paths, c) => {
    if (dieOnce && c.startsWith('set_default_active_thread_percentage')) {
      dieOnce = false;
      host.children[0]?.end({ code: 1, signal: null });
      await drain();
    }
    return command(paths, c);
  };
  await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a'])]);
  assert.equal(host.files.has(`${ROOT}/nvidia.com/gpu/.started`), false);
  assert.match(
    status[0]?.line ?? '',
    new RegExp(
      String.raw`0 of 1 MPS control daemons up; nvidia\.com\/gpu down \(its ` +
        String.raw`control daemon exited while its limits were being set\)`,
    ),
  );
  assert.equal(lines.filter((l) => l.split(' ')[1] === 'ERROR').length, 1, 'one line for one failure');
  t.mock.timers.tick(FIRST_RESTART_MS);
  await drain();
  assert.equal(host.files.get(`${ROOT}/nvidia.com/gpu/.started`), '102\n');
  await sup.stop();
});

test('a stop while a restart is under way quits the daemon that restart brings up: none is left running', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const { host, sup } = setup();
  await sup.start([plan('nvidia.com/gpu', 2, ['GPU-a'])]);
  let answer!: () => void;
  host.startGate = new Promise((r) => {
    answer = r;
  });
  (host.children[0] as FakeChild).end({ code: null, signal: 'SIGKILL' });
  await drain();
  t.mock.timers.tick(FIRST_RESTART_MS);
  await drain();
  const stopped = sup.stop();
  await drain();
  answer(); // the restarted daemon answers only now, while the stop waits
  await stopped;
  assert.equal(host.children.length, 2, 'the restart brought one up');
  const second = host.children[1] as FakeChild;
  assert.ok(second.quit || second.killed, 'and the stop ended it');
  assert.equal(
    host.actions.filter((a) => a.includes('set_default')).length,
    2,
    'limits set once, by the first start: the restart saw the stop and set none',
  );
});
