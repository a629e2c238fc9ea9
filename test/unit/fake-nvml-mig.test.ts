// Tests of the fake NVML's MIG model (test/fake-nvml/fake_mig.h) through its real C ABI, loaded
// with koffi as the plugin loads libnvidia-ml.so.1: MIG mode, MIG handles and what they answer,
// the profile tables, XIDs naming MIG devices, and the `mig` control command.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import koffi from 'koffi';
import type { LibraryHandle } from 'koffi';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { ROOT, TOPOLOGIES, fakeNvmlStats } from '../support/sim.ts';

const SUCCESS = 0;
const INVALID_ARGUMENT = 2;
const NOT_SUPPORTED = 3;
const NOT_FOUND = 6;
const GPU_IS_LOST = 15;
const WHOLE = 0xffffffff;

koffi.pointer('FakeMigTest_device', koffi.opaque('FakeMigTest_device_st'));
koffi.pointer('FakeMigTest_gi', koffi.opaque('FakeMigTest_gi_st'));
koffi.pointer('FakeMigTest_ci', koffi.opaque('FakeMigTest_ci_st'));
koffi.pointer('FakeMigTest_set', koffi.opaque('FakeMigTest_set_st'));
koffi.struct('FakeMigTest_memory', {
  total: 'unsigned long long',
  free: 'unsigned long long',
  used: 'unsigned long long',
});
koffi.struct('FakeMigTest_event', {
  device: 'FakeMigTest_device',
  eventType: 'unsigned long long',
  eventData: 'unsigned long long',
  gpuInstanceId: 'unsigned int',
  computeInstanceId: 'unsigned int',
});
koffi.struct('FakeMigTest_attrs', {
  multiprocessorCount: 'unsigned int',
  sharedCopyEngineCount: 'unsigned int',
  sharedDecoderCount: 'unsigned int',
  sharedEncoderCount: 'unsigned int',
  sharedJpegCount: 'unsigned int',
  sharedOfaCount: 'unsigned int',
  gpuInstanceSliceCount: 'unsigned int',
  computeInstanceSliceCount: 'unsigned int',
  memorySizeMB: 'unsigned long long',
});
koffi.struct('FakeMigTest_giProfile', {
  id: 'unsigned int',
  isP2pSupported: 'unsigned int',
  sliceCount: 'unsigned int',
  instanceCount: 'unsigned int',
  multiprocessorCount: 'unsigned int',
  copyEngineCount: 'unsigned int',
  decoderCount: 'unsigned int',
  encoderCount: 'unsigned int',
  jpegCount: 'unsigned int',
  ofaCount: 'unsigned int',
  memorySizeMB: 'unsigned long long',
});
const GiProfileV2 = koffi.struct('FakeMigTest_giProfileV2', {
  version: 'unsigned int',
  id: 'unsigned int',
  isP2pSupported: 'unsigned int',
  sliceCount: 'unsigned int',
  instanceCount: 'unsigned int',
  multiprocessorCount: 'unsigned int',
  copyEngineCount: 'unsigned int',
  decoderCount: 'unsigned int',
  encoderCount: 'unsigned int',
  jpegCount: 'unsigned int',
  ofaCount: 'unsigned int',
  memorySizeMB: 'unsigned long long',
  name: koffi.array('char', 96, 'String'),
});
koffi.struct('FakeMigTest_giInfo', {
  device: 'FakeMigTest_device',
  id: 'unsigned int',
  profileId: 'unsigned int',
  start: 'unsigned int',
  size: 'unsigned int',
});
koffi.struct('FakeMigTest_ciInfo', {
  device: 'FakeMigTest_device',
  gpuInstance: 'FakeMigTest_gi',
  id: 'unsigned int',
  profileId: 'unsigned int',
  start: 'unsigned int',
  size: 'unsigned int',
});
koffi.struct('FakeMigTest_ciProfile', {
  id: 'unsigned int',
  sliceCount: 'unsigned int',
  instanceCount: 'unsigned int',
  multiprocessorCount: 'unsigned int',
  sharedCopyEngineCount: 'unsigned int',
  sharedDecoderCount: 'unsigned int',
  sharedEncoderCount: 'unsigned int',
  sharedJpegCount: 'unsigned int',
  sharedOfaCount: 'unsigned int',
});

function bind(lib: LibraryHandle) {
  const fn = (p: string) => lib.func(p);
  return {
    init: fn('int nvmlInit_v2()'),
    shutdown: fn('int nvmlShutdown()'),
    handleByIndex: fn('int nvmlDeviceGetHandleByIndex_v2(unsigned int i, _Out_ FakeMigTest_device *d)'),
    uuid: fn('int nvmlDeviceGetUUID(FakeMigTest_device d, char *b, unsigned int n)'),
    name: fn('int nvmlDeviceGetName(FakeMigTest_device d, char *b, unsigned int n)'),
    minor: fn('int nvmlDeviceGetMinorNumber(FakeMigTest_device d, _Out_ unsigned int *m)'),
    memory: fn('int nvmlDeviceGetMemoryInfo(FakeMigTest_device d, _Out_ FakeMigTest_memory *m)'),
    pci: fn('int nvmlDeviceGetPciInfo_v3(FakeMigTest_device d, void *p)'),
    supportedEvents: fn('int nvmlDeviceGetSupportedEventTypes(FakeMigTest_device d, _Out_ unsigned long long *t)'),
    eventSetCreate: fn('int nvmlEventSetCreate(_Out_ FakeMigTest_set *s)'),
    registerEvents: fn('int nvmlDeviceRegisterEvents(FakeMigTest_device d, unsigned long long t, FakeMigTest_set s)'),
    waitV2: fn('int nvmlEventSetWait_v2(FakeMigTest_set s, _Out_ FakeMigTest_event *e, unsigned int ms)'),
    eventSetFree: fn('int nvmlEventSetFree(FakeMigTest_set s)'),
    migMode: fn('int nvmlDeviceGetMigMode(FakeMigTest_device d, _Out_ unsigned int *c, _Out_ unsigned int *p)'),
    maxMig: fn('int nvmlDeviceGetMaxMigDeviceCount(FakeMigTest_device d, _Out_ unsigned int *n)'),
    migByIndex: fn(
      'int nvmlDeviceGetMigDeviceHandleByIndex(FakeMigTest_device d, unsigned int i, _Out_ FakeMigTest_device *m)',
    ),
    isMig: fn('int nvmlDeviceIsMigDeviceHandle(FakeMigTest_device d, _Out_ unsigned int *is)'),
    giId: fn('int nvmlDeviceGetGpuInstanceId(FakeMigTest_device d, _Out_ unsigned int *id)'),
    ciId: fn('int nvmlDeviceGetComputeInstanceId(FakeMigTest_device d, _Out_ unsigned int *id)'),
    parent: fn('int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(FakeMigTest_device m, _Out_ FakeMigTest_device *d)'),
    attrs: fn('int nvmlDeviceGetAttributes_v2(FakeMigTest_device d, _Out_ FakeMigTest_attrs *a)'),
    giProfile: fn(
      'int nvmlDeviceGetGpuInstanceProfileInfo(FakeMigTest_device d, unsigned int p, _Out_ FakeMigTest_giProfile *i)',
    ),
    giProfileV: fn(
      'int nvmlDeviceGetGpuInstanceProfileInfoV(FakeMigTest_device ' +
        'd, unsigned int p, _Inout_ FakeMigTest_giProfileV2 *i)',
    ),
    giById: fn('int nvmlDeviceGetGpuInstanceById(FakeMigTest_device d, unsigned int id, _Out_ FakeMigTest_gi *gi)'),
    giInfo: fn('int nvmlGpuInstanceGetInfo(FakeMigTest_gi gi, _Out_ FakeMigTest_giInfo *i)'),
    ciById: fn(
      'int nvmlGpuInstanceGetComputeInstanceById(FakeMigTest_gi gi, unsigned int id, _Out_ FakeMigTest_ci *ci)',
    ),
    ciInfo: fn('int nvmlComputeInstanceGetInfo_v2(FakeMigTest_ci ci, _Out_ FakeMigTest_ciInfo *i)'),
    ciProfile: fn(
      'int nvmlGpuInstanceGetComputeInstanceProfileInfo(FakeMigTest_gi ' +
        'gi, unsigned int p, unsigned int e, _Out_ FakeMigTest_ciProfile *i)',
    ),
  };
}
type Api = ReturnType<typeof bind>;

let api: Api;
let oldLib: LibraryHandle;
let tmp = '';
let sessions = 0;

before(async () => {
  const dirs = await buildFakeNvml();
  api = bind(koffi.load(path.join(dirs.current, LIBRARY_NAME)));
  oldLib = koffi.load(path.join(dirs.old, LIBRARY_NAME));
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fake-mig-test-'));
});
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function send(fifo: string, text: string): void {
  const fd = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
  try {
    fs.writeSync(fd, `${text}\n`);
  } finally {
    fs.closeSync(fd);
  }
}

/** A barrier: commands run in order, so once the stats file exists every earlier one was applied. */
async function settle(fifo: string): Promise<void> {
  await fakeNvmlStats((command) => send(fifo, command), tmp);
}

async function session(fixture: string | object, body: (fifo: string) => Promise<void> | void): Promise<void> {
  const file =
    typeof fixture === 'string' ? path.join(TOPOLOGIES, fixture) : path.join(tmp, `fixture-${++sessions}.json`);
  if (typeof fixture !== 'string') fs.writeFileSync(file, JSON.stringify(fixture));
  const fifo = path.join(tmp, `control-${++sessions}`);
  process.env.FAKE_NVML_CONFIG = file;
  process.env.FAKE_NVML_CONTROL = fifo;
  assert.equal(api.init(), SUCCESS);
  try {
    await body(fifo);
  } finally {
    assert.equal(api.shutdown(), SUCCESS);
    delete process.env.FAKE_NVML_CONTROL;
  }
}

function gpu(i: number): unknown {
  const out: unknown[] = [null];
  assert.equal(api.handleByIndex(i, out), SUCCESS);
  return out[0];
}

function str(f: (h: unknown, b: Buffer, n: number) => number, h: unknown): string {
  const b = Buffer.alloc(96);
  assert.equal(f(h, b, 96), SUCCESS);
  return b.toString('utf8', 0, b.indexOf(0));
}

function migs(parent: unknown): unknown[] {
  const n = [0];
  assert.equal(api.maxMig(parent, n), SUCCESS);
  const out: unknown[] = [];
  for (let i = 0; i < (n[0] ?? 0); i++) {
    const h: unknown[] = [null];
    const rc = api.migByIndex(parent, i, h);
    if (rc === NOT_FOUND) continue;
    assert.equal(rc, SUCCESS);
    out.push(h[0]);
  }
  return out;
}

const num = (f: (h: unknown, o: number[]) => number, h: unknown): number => {
  const o = [0];
  assert.equal(f(h, o), SUCCESS);
  return o[0] ?? -1;
};

test('MIG mode: current and pending per GPU; a GPU without "mig" is not MIG-capable', async () => {
  await session('mig-mixed-4.json', () => {
    const modes = [0, 1, 2, 3].map((i) => {
      const c = [9];
      const p = [9];
      assert.equal(api.migMode(gpu(i), c, p), SUCCESS);
      return [c[0], p[0]];
    });
    assert.deepEqual(modes, [
      [1, 1],
      [1, 1],
      [0, 0],
      [1, 1],
    ]);
  });
  await session('single.json', () => {
    assert.equal(api.migMode(gpu(0), [0], [0]), NOT_SUPPORTED);
    assert.equal(api.maxMig(gpu(0), [0]), NOT_SUPPORTED);
    assert.equal(api.migByIndex(gpu(0), 0, [null]), NOT_SUPPORTED);
  });
});

test(
  'MIG handles: UUID, name, memory, GI/CI ids, parent, ' + 'attributes; whole-GPU calls answer NOT_SUPPORTED',
  async () => {
    await session('mig-mixed-4.json', () => {
      const parent = gpu(0);
      const devices = migs(parent);
      assert.equal(devices.length, 5);
      const seen = devices.map((m) => ({
        uuid: str(api.uuid, m),
        name: str(api.name, m),
        gi: num(api.giId, m),
        ci: num(api.ciId, m),
      }));
      assert.deepEqual(seen, [
        { uuid: 'MIG-5f3b1c2e-7a41-4c8e-9d6b-0e2f4a130100', name: 'NVIDIA A100-SXM4-80GB MIG 1g.10gb', gi: 1, ci: 0 },
        { uuid: 'MIG-5f3b1c2e-7a41-4c8e-9d6b-0e2f4a130200', name: 'NVIDIA A100-SXM4-80GB MIG 1g.10gb', gi: 2, ci: 0 },
        {
          uuid: 'MIG-5f3b1c2e-7a41-4c8e-9d6b-0e2f4a140300',
          name: 'NVIDIA A100-SXM4-80GB MIG 1g.10gb+me',
          gi: 3,
          ci: 0,
        },
        { uuid: 'MIG-5f3b1c2e-7a41-4c8e-9d6b-0e2f4a0e0400', name: 'NVIDIA A100-SXM4-80GB MIG 2g.20gb', gi: 4, ci: 0 },
        {
          uuid: 'MIG-5f3b1c2e-7a41-4c8e-9d6b-0e2f4a0e0500',
          name: 'NVIDIA A100-SXM4-80GB MIG 1c.2g.20gb',
          gi: 5,
          ci: 0,
        },
      ]);
      const m = devices[4];
      assert.equal(num(api.isMig, m), 1);
      assert.equal(num(api.isMig, parent), 0);
      const p: unknown[] = [null];
      assert.equal(api.parent(m, p), SUCCESS);
      assert.equal(p[0], parent);
      const mem = {} as { total: number };
      assert.equal(api.memory(m, mem), SUCCESS);
      assert.equal(mem.total, 19968 * 1048576);
      const a = {} as Record<string, number>;
      assert.equal(api.attrs(m, a), SUCCESS);
      assert.deepEqual(a, {
        multiprocessorCount: 14,
        sharedCopyEngineCount: 2,
        sharedDecoderCount: 1,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
        gpuInstanceSliceCount: 2,
        computeInstanceSliceCount: 1,
        memorySizeMB: 19968,
      });
      assert.equal(api.minor(m, [0]), NOT_SUPPORTED);
      assert.equal(api.pci(m, Buffer.alloc(68)), NOT_SUPPORTED);
      assert.equal(api.supportedEvents(m, [0n]), NOT_SUPPORTED);
      assert.equal(api.migMode(m, [0], [0]), NOT_SUPPORTED);
      const set: unknown[] = [null];
      assert.equal(api.eventSetCreate(set), SUCCESS);
      assert.equal(api.registerEvents(m, 8n, set[0]), NOT_SUPPORTED);
      assert.equal(api.eventSetFree(set[0]), SUCCESS);
      // GPU-only calls on a whole GPU handle.
      assert.equal(api.giId(parent, [0]), NOT_SUPPORTED);
      assert.equal(api.parent(parent, [null]), NOT_SUPPORTED);
      // MIG disabled: no MIG devices; enabled without instances: none either.
      assert.equal(migs(gpu(2)).length, 0);
      assert.equal(migs(gpu(3)).length, 0);
    });
  },
);

test(
  'profile tables: GI profile info by NVML index (REV1 ' + '= +me, REV2 = 1g.20gb), GI/CI info and CI profiles',
  async () => {
    await session('mig-mixed-4.json', () => {
      const a100 = gpu(0);
      const h100 = gpu(1);
      const info = {} as Record<string, number>;
      assert.equal(api.giProfile(a100, 0, info), SUCCESS);
      assert.deepEqual([info.id, info.sliceCount, info.instanceCount, info.memorySizeMB], [19, 1, 7, 9728]);
      assert.equal(api.giProfile(a100, 7, info), SUCCESS);
      assert.deepEqual([info.id, info.sliceCount, info.instanceCount, info.jpegCount], [20, 1, 1, 1]);
      assert.equal(api.giProfile(h100, 9, info), SUCCESS);
      assert.deepEqual([info.id, info.sliceCount, info.memorySizeMB], [15, 1, 20096]);
      assert.equal(api.giProfile(a100, 5, info), NOT_SUPPORTED, '8-slice profiles do not exist on A100');
      assert.equal(api.giProfile(a100, 10, info), INVALID_ARGUMENT);
      const v2: Record<string, unknown> = { version: koffi.sizeof(GiProfileV2) | (2 << 24) };
      assert.equal(api.giProfileV(h100, 9, v2), SUCCESS);
      assert.equal(v2.name, 'MIG 1g.20gb');
      assert.equal(api.giProfileV(h100, 9, { version: 1 }), INVALID_ARGUMENT);

      // The sub-instance 1c.2g.20gb: GI 5 (profile id 14 = 2g), CI 0 of profile 0 (1 slice).
      const gi: unknown[] = [null];
      assert.equal(api.giById(a100, 5, gi), SUCCESS);
      const gii = {} as Record<string, unknown>;
      assert.equal(api.giInfo(gi[0], gii), SUCCESS);
      assert.deepEqual([gii.id, gii.profileId, gii.size, gii.device], [5, 14, 2, a100]);
      const ci: unknown[] = [null];
      assert.equal(api.ciById(gi[0], 0, ci), SUCCESS);
      assert.equal(api.ciById(gi[0], 1, [null]), NOT_FOUND);
      const cii = {} as Record<string, unknown>;
      assert.equal(api.ciInfo(ci[0], cii), SUCCESS);
      assert.deepEqual([cii.id, cii.profileId, cii.size, cii.gpuInstance], [0, 0, 1, gi[0]]);
      const cip = {} as Record<string, number>;
      assert.equal(api.ciProfile(gi[0], 1, 0, cip), SUCCESS);
      assert.deepEqual([cip.sliceCount, cip.instanceCount], [2, 1]);
      assert.equal(api.ciProfile(gi[0], 2, 0, cip), NOT_SUPPORTED, 'no 3c in a 2g instance');
      assert.equal(api.giById(a100, 9, gi), NOT_FOUND);
    });
  },
);

test('XIDs name MIG devices by GI/CI; 0xFFFFFFFF when the event is for the whole GPU', async () => {
  await session('mig-mixed-4.json', async (fifo) => {
    const set: unknown[] = [null];
    assert.equal(api.eventSetCreate(set), SUCCESS);
    assert.equal(api.registerEvents(gpu(1), 8n, set[0]), SUCCESS);
    send(fifo, 'xid 1 94 3 0');
    send(fifo, 'xid 1 79');
    send(fifo, 'xid 1 31 0x2 0');
    const got = [];
    for (let i = 0; i < 3; i++) {
      const e = {} as Record<string, unknown>;
      assert.equal(api.waitV2(set[0], e, 2000), SUCCESS);
      got.push([e.device === gpu(1), e.eventData, e.gpuInstanceId, e.computeInstanceId]);
    }
    assert.deepEqual(got, [
      [true, 94, 3, 0],
      [true, 79, WHOLE, WHOLE],
      [true, 31, 2, 0],
    ]);
    assert.equal(api.eventSetFree(set[0]), SUCCESS);
  });
});

test('the mig command changes a layout or mode at run time; bad layouts are refused and change nothing', async () => {
  await session('mig-mixed-4.json', async (fifo) => {
    send(fifo, 'mig 3 on 7g.80gb');
    send(fifo, 'mig 2 on 4g.40gb 3g.40gb');
    send(fifo, 'mig 0 on 3g.40gb 4g.40gb 1g.10gb'); // 8 slices: refused
    send(fifo, 'mig 1 on 2g.20gb:1,1 1c.3g.40gb');
    await settle(fifo);
    assert.deepEqual(
      migs(gpu(3)).map((m) => str(api.name, m)),
      ['NVIDIA A100-SXM4-80GB MIG 7g.80gb'],
    );
    assert.deepEqual(
      migs(gpu(2)).map((m) => str(api.name, m)),
      ['NVIDIA A100-SXM4-80GB MIG 4g.40gb', 'NVIDIA A100-SXM4-80GB MIG 3g.40gb'],
    );
    assert.equal(migs(gpu(0)).length, 5, 'the refused layout left GPU 0 alone');
    assert.deepEqual(
      migs(gpu(1)).map((m) => [str(api.name, m), num(api.giId, m), num(api.ciId, m)]),
      [
        ['NVIDIA H100 80GB HBM3 MIG 1c.2g.20gb', 1, 0],
        ['NVIDIA H100 80GB HBM3 MIG 1c.2g.20gb', 1, 1],
        ['NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb', 2, 0],
      ],
    );
    send(fifo, 'mig 2 pending 0');
    send(fifo, 'mig 3 off');
    await settle(fifo);
    const c = [9];
    const p = [9];
    assert.equal(api.migMode(gpu(2), c, p), SUCCESS);
    assert.deepEqual([c[0], p[0]], [1, 0]);
    assert.equal(migs(gpu(2)).length, 2, 'a pending change alone changes no device');
    assert.equal(api.migMode(gpu(3), c, p), SUCCESS);
    assert.deepEqual([c[0], p[0]], [0, 0]);
    assert.equal(migs(gpu(3)).length, 0);
  });
});

test('a lost parent makes its MIG devices answer GPU_IS_LOST', async () => {
  await session('mig-uniform-2.json', async (fifo) => {
    const [m] = migs(gpu(1));
    send(fifo, 'lost 1');
    await settle(fifo);
    assert.equal(api.uuid(m, Buffer.alloc(96), 96), GPU_IS_LOST);
    assert.equal(api.giId(m, [0]), GPU_IS_LOST);
  });
});

test('fixture errors name the key: unknown profile, too many slices, no table, MIG UUIDs that collide', async () => {
  const base = { uuid: 'GPU-00000000-0000-4000-8000-000000000001', busId: '00000000:07:00.0' };
  for (const [gpuEntry, message] of [
    [
      { ...base, name: 'NVIDIA A100-SXM4-40GB', mig: { current: true, instances: ['1g.10gb+me'] } },
      /gpus\[0\]\.mig\.instances: instance 0: "1g\.10gb\+me" is not a GPU instance profile/,
    ],
    [
      { ...base, name: 'NVIDIA A100-SXM4-40GB', mig: { current: true, instances: ['7g.40gb', '1g.5gb'] } },
      /instance 1: the layout needs more than the GPU's 7 slices/,
    ],
    [
      { ...base, name: 'Tesla V100-SXM2-32GB', mig: { current: false } },
      /gpus\[0\]\.mig: "Tesla V100-SXM2-32GB" has no MIG profile table/,
    ],
    [
      { ...base, name: 'NVIDIA A100-SXM4-40GB', mig: { current: false, instances: ['1g.5gb'] } },
      /instances need MIG mode enabled/,
    ],
    [
      [
        { ...base, name: 'NVIDIA A100-SXM4-40GB', mig: { current: true } },
        {
          uuid: 'GPU-00000000-0000-4000-8000-000000000002',
          busId: '00000000:08:00.0',
          name: 'NVIDIA A100-SXM4-40GB',
          mig: { current: true },
        },
      ],
      /gpus\[1\]\.mig: .*differs from GPU 0's .* only in its last six hex digits/,
    ],
  ] as const) {
    const file = path.join(tmp, `bad-${++sessions}.json`);
    const gpus = 'uuid' in gpuEntry ? [gpuEntry] : gpuEntry;
    fs.writeFileSync(file, JSON.stringify({ gpus }));
    const script =
      `import koffi from 'koffi'; const l = koffi.load(process.env.LIB); ` +
      `process.stdout.write(String(l.func('int nvmlInit_v2()')()));`;
    const dirs = await buildFakeNvml();
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
      cwd: ROOT,
      encoding: 'utf8',
      env: {
        ...process.env,
        LIB: path.join(dirs.current, LIBRARY_NAME),
        FAKE_NVML_CONFIG: file,
        FAKE_NVML_CONTROL: '',
      },
    });
    assert.equal(child.stdout, '999');
    assert.match(child.stderr, message);
  }
});

test('old driver variant: no MIG entry point at all', () => {
  for (const name of [
    'nvmlDeviceGetMigMode',
    'nvmlDeviceGetMigDeviceHandleByIndex',
    'nvmlDeviceGetAttributes_v2',
    'nvmlDeviceGetGpuInstanceProfileInfo',
  ]) {
    assert.throws(() => oldLib.func(`int ${name}(void *a, unsigned int b, void *c)`), /Cannot find function/, name);
  }
});

test(
  'a layout set through the FIFO outlives nvmlShutdown/nvmlInit, ' + 'and follows its GPU through remove and add',
  async () => {
    const file = path.join(TOPOLOGIES, 'mig-uniform-2.json');
    const fifo = path.join(tmp, `control-persist-${++sessions}`);
    process.env.FAKE_NVML_CONFIG = file;
    process.env.FAKE_NVML_CONTROL = fifo;
    assert.equal(api.init(), SUCCESS);
    try {
      send(fifo, 'mig 1 on 7g.80gb');
      await settle(fifo);
      assert.equal(api.shutdown(), SUCCESS);
      assert.equal(api.init(), SUCCESS);
      assert.deepEqual(
        migs(gpu(1)).map((m) => str(api.name, m)),
        ['NVIDIA H100 80GB HBM3 MIG 7g.80gb'],
      );
      assert.equal(migs(gpu(0)).length, 2, 'the other GPU keeps its fixture layout');
      send(fifo, 'remove 0');
      await settle(fifo);
      assert.deepEqual(
        migs(gpu(0)).map((m) => str(api.name, m)),
        ['NVIDIA H100 80GB HBM3 MIG 7g.80gb'],
        'GPU 1 is index 0 now, its layout with it',
      );
      send(fifo, 'add all');
      await settle(fifo);
      assert.equal(migs(gpu(0)).length, 2);
      assert.equal(migs(gpu(1)).length, 1);
    } finally {
      assert.equal(api.shutdown(), SUCCESS);
      delete process.env.FAKE_NVML_CONTROL;
    }
  },
);
