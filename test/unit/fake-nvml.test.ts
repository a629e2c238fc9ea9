// Tests of the fake NVML (test/fake-nvml/fake_nvml.c) through its real C ABI, loaded with koffi
// exactly as the plugin loads libnvidia-ml.so.1. Every test ends with the library shut down, so
// each one starts from an uninitialised library.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import koffi from 'koffi';
import type { LibraryHandle } from 'koffi';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { fakeNvmlStats } from '../support/sim.ts';
import type { FakeNvmlStats } from '../support/sim.ts';

type NativeFn = ReturnType<LibraryHandle['func']>;

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtureDir = path.join(repoRoot, 'test', 'fixtures', 'topologies');

const SUCCESS = 0;
const UNINITIALIZED = 1;
const INVALID_ARGUMENT = 2;
const NOT_SUPPORTED = 3;
const NO_PERMISSION = 4;
const NOT_FOUND = 6;
const INSUFFICIENT_SIZE = 7;
const DRIVER_NOT_LOADED = 9;
const TIMEOUT = 10;
const GPU_IS_LOST = 15;
const UNKNOWN = 999;

const EVENT_SBE = 0x1;
const EVENT_DBE = 0x2;
const EVENT_XID = 0x8;
const LINK_TYPE_GPU = 0;
const LINK_TYPE_SWITCH = 2;
const NO_INSTANCE = 0xffffffff;
// nvmlComputeMode_t
const COMPUTEMODE_DEFAULT = 0;
const COMPUTEMODE_EXCLUSIVE_THREAD = 1;
const COMPUTEMODE_PROHIBITED = 2;
const COMPUTEMODE_EXCLUSIVE_PROCESS = 3;

// ---------------------------------------------------------------------------------------------
// koffi declarations. Type names are global to a process and src/nvml declares the plain NVML
// names, so these carry a prefix of their own.
// ---------------------------------------------------------------------------------------------

koffi.pointer('FakeNvmlTest_device', koffi.opaque('FakeNvmlTest_device_st'));
koffi.pointer('FakeNvmlTest_set', koffi.opaque('FakeNvmlTest_set_st'));
koffi.struct('FakeNvmlTest_pci', {
  busIdLegacy: koffi.array('char', 16),
  domain: 'unsigned int',
  bus: 'unsigned int',
  device: 'unsigned int',
  pciDeviceId: 'unsigned int',
  pciSubSystemId: 'unsigned int',
  busId: koffi.array('char', 32),
});
koffi.struct('FakeNvmlTest_memory', {
  total: 'unsigned long long',
  free: 'unsigned long long',
  used: 'unsigned long long',
});
const EventDataType = koffi.struct('FakeNvmlTest_event', {
  device: 'FakeNvmlTest_device',
  eventType: 'unsigned long long',
  eventData: 'unsigned long long',
  gpuInstanceId: 'unsigned int',
  computeInstanceId: 'unsigned int',
});

type PciInfo = {
  busIdLegacy: string;
  domain: number;
  bus: number;
  device: number;
  pciDeviceId: number;
  pciSubSystemId: number;
  busId: string;
};
type Memory = { total: number; free: number; used: number };
type EventData = {
  device: bigint | null;
  eventType: number;
  eventData: number;
  gpuInstanceId: number;
  computeInstanceId: number;
};

function bindBase(lib: LibraryHandle) {
  const fn = (prototype: string): NativeFn => lib.func(prototype);
  return {
    init: fn('int nvmlInit_v2()'),
    initV1: fn('int nvmlInit()'),
    initWithFlags: fn('int nvmlInitWithFlags(unsigned int flags)'),
    shutdown: fn('int nvmlShutdown()'),
    errorString: fn('const char *nvmlErrorString(int result)'),
    driverVersion: fn('int nvmlSystemGetDriverVersion(char *version, unsigned int length)'),
    nvmlVersion: fn('int nvmlSystemGetNVMLVersion(char *version, unsigned int length)'),
    cudaDriverVersion: fn('int nvmlSystemGetCudaDriverVersion(_Out_ int *version)'),
    cudaDriverVersionV2: fn('int nvmlSystemGetCudaDriverVersion_v2(_Out_ int *version)'),
    computeCapability: fn(
      'int nvmlDeviceGetCudaComputeCapability(FakeNvmlTest_device device, _Out_ int *major, _Out_ int *minor)',
    ),
    count: fn('int nvmlDeviceGetCount_v2(_Out_ unsigned int *count)'),
    handleByIndex: fn('int nvmlDeviceGetHandleByIndex_v2(unsigned int index, _Out_ FakeNvmlTest_device *device)'),
    handleByUuid: fn('int nvmlDeviceGetHandleByUUID(const char *uuid, _Out_ FakeNvmlTest_device *device)'),
    index: fn('int nvmlDeviceGetIndex(FakeNvmlTest_device device, _Out_ unsigned int *index)'),
    uuid: fn('int nvmlDeviceGetUUID(FakeNvmlTest_device device, char *uuid, unsigned int length)'),
    name: fn('int nvmlDeviceGetName(FakeNvmlTest_device device, char *name, unsigned int length)'),
    minor: fn('int nvmlDeviceGetMinorNumber(FakeNvmlTest_device device, _Out_ unsigned int *minor)'),
    pciInfo: fn('int nvmlDeviceGetPciInfo_v3(FakeNvmlTest_device device, _Out_ FakeNvmlTest_pci *pci)'),
    memoryInfo: fn('int nvmlDeviceGetMemoryInfo(FakeNvmlTest_device device, _Out_ FakeNvmlTest_memory *memory)'),
    topology: fn(
      'int nvmlDeviceGetTopologyCommonAncestor(FakeNvmlTest_device a, FakeNvmlTest_device b, _Out_ int *level)',
    ),
    nvlinkState: fn('int nvmlDeviceGetNvLinkState(FakeNvmlTest_device device, unsigned int link, _Out_ int *active)'),
    nvlinkRemotePciV1: fn(
      'int nvmlDeviceGetNvLinkRemotePciInfo(FakeNvmlTest_device ' +
        'device, unsigned int link, _Out_ FakeNvmlTest_pci *pci)',
    ),
    eventSetCreate: fn('int nvmlEventSetCreate(_Out_ FakeNvmlTest_set *set)'),
    supportedEvents: fn(
      'int nvmlDeviceGetSupportedEventTypes(FakeNvmlTest_device device, _Out_ unsigned long long *types)',
    ),
    registerEvents: fn(
      'int nvmlDeviceRegisterEvents(FakeNvmlTest_device device, unsigned long long types, FakeNvmlTest_set set)',
    ),
    waitV1: fn('int nvmlEventSetWait(FakeNvmlTest_set set, _Inout_ FakeNvmlTest_event *data, unsigned int timeoutms)'),
    eventSetFree: fn('int nvmlEventSetFree(FakeNvmlTest_set set)'),
    getComputeMode: fn('int nvmlDeviceGetComputeMode(FakeNvmlTest_device device, _Out_ int *mode)'),
    setComputeMode: fn('int nvmlDeviceSetComputeMode(FakeNvmlTest_device device, int mode)'),
    // The same entry points with untyped arguments, to pass foreign pointers and NULLs.
    rawUuid: fn('int nvmlDeviceGetUUID(void *device, void *uuid, unsigned int length)'),
    rawIndex: fn('int nvmlDeviceGetIndex(void *device, void *index)'),
    rawCount: fn('int nvmlDeviceGetCount_v2(void *count)'),
    rawHandleByIndex: fn('int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void *device)'),
    rawHandleByUuid: fn('int nvmlDeviceGetHandleByUUID(const char *uuid, void *device)'),
    rawPciInfo: fn('int nvmlDeviceGetPciInfo_v3(void *device, void *pci)'),
    rawMemoryInfo: fn('int nvmlDeviceGetMemoryInfo(void *device, void *memory)'),
    rawMinor: fn('int nvmlDeviceGetMinorNumber(void *device, void *minor)'),
    rawTopology: fn('int nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, void *level)'),
    rawNvlinkState: fn('int nvmlDeviceGetNvLinkState(void *device, unsigned int link, void *active)'),
    rawSupportedEvents: fn('int nvmlDeviceGetSupportedEventTypes(void *device, void *types)'),
    rawRegisterEvents: fn('int nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set)'),
    rawEventSetCreate: fn('int nvmlEventSetCreate(void *set)'),
    rawWaitV1: fn('int nvmlEventSetWait(void *set, void *data, unsigned int timeoutms)'),
    rawEventSetFree: fn('int nvmlEventSetFree(void *set)'),
    rawGetComputeMode: fn('int nvmlDeviceGetComputeMode(void *device, void *mode)'),
    rawSetComputeMode: fn('int nvmlDeviceSetComputeMode(void *device, int mode)'),
  };
}

function bindNewer(lib: LibraryHandle) {
  const fn = (prototype: string): NativeFn => lib.func(prototype);
  return {
    numaNode: fn('int nvmlDeviceGetNumaNodeId(FakeNvmlTest_device device, _Out_ unsigned int *node)'),
    nvlinkRemotePci: fn(
      'int nvmlDeviceGetNvLinkRemotePciInfo_v2(FakeNvmlTest_device ' +
        'device, unsigned int link, _Out_ FakeNvmlTest_pci *pci)',
    ),
    nvlinkRemoteType: fn(
      'int nvmlDeviceGetNvLinkRemoteDeviceType(FakeNvmlTest_device device, unsigned int link, _Out_ int *type)',
    ),
    waitV2: fn('int nvmlEventSetWait_v2(FakeNvmlTest_set set, _Out_ FakeNvmlTest_event *data, unsigned int timeoutms)'),
    // MIG entry points (all absent from the old driver; exercised in test/unit/fake-nvml-mig.test.ts).
    migMode: fn(
      'int nvmlDeviceGetMigMode(FakeNvmlTest_device device, _Out_ unsigned int *current, _Out_ unsigned int *pending)',
    ),
    rawNumaNode: fn('int nvmlDeviceGetNumaNodeId(void *device, void *node)'),
    rawWaitV2: fn('int nvmlEventSetWait_v2(void *set, void *data, unsigned int timeoutms)'),
  };
}

type Api = ReturnType<typeof bindBase> & ReturnType<typeof bindNewer>;
type OldApi = ReturnType<typeof bindBase>;

// ---------------------------------------------------------------------------------------------
// Fixtures and helpers
// ---------------------------------------------------------------------------------------------

type FixtureGpu = {
  uuid: string;
  name: string;
  minor?: number;
  busId: string;
  memoryMiB?: number;
  numaNode?: number;
  events?: string[];
};
type Fixture = {
  driverVersion?: string;
  nvmlVersion?: string;
  initError?: number;
  linkCount?: number;
  gpus: FixtureGpu[];
  nvlinks?: [number, number, number][];
  nvswitches?: { busId: string; links: [number, number][] }[];
  pcie?: [number, number, number][];
};

const FIXTURES = [
  'dgx1-v100.json',
  'nvswitch-8.json',
  'nvswitch-16.json',
  'pcie-2socket-8.json',
  'bridged-pair-4.json',
  'single.json',
  'init-fails.json',
  'demo-8.json',
  'mig-mixed-4.json',
  'mig-uniform-2.json',
];

function fixturePath(name: string): string {
  return path.join(fixtureDir, name);
}

function readFixture(name: string): Fixture {
  return JSON.parse(fs.readFileSync(fixturePath(name), 'utf8')) as Fixture;
}

function at<T>(items: readonly T[], index: number): T {
  const item = items[index];
  assert.ok(item !== undefined, `no item at index ${index}`);
  return item;
}

function cString(buffer: Buffer): string {
  const end = buffer.indexOf(0);
  return buffer.subarray(0, end < 0 ? buffer.length : end).toString('utf8');
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function callAsync(fn: NativeFn, ...args: unknown[]): Promise<number> {
  return new Promise((resolve, reject) => {
    fn.async(...args, (error: unknown, result: number) => {
      if (error) reject(error instanceof Error ? error : new Error(String(error)));
      else resolve(result);
    });
  });
}

/** Expected level between two GPUs of a fixture: pcie override, else NODE/SYSTEM by NUMA node. */
function expectedLevel(fixture: Fixture, a: number, b: number): number {
  for (const [x, y, level] of fixture.pcie ?? []) {
    if ((x === a && y === b) || (x === b && y === a)) return level;
  }
  const na = at(fixture.gpus, a).numaNode ?? -1;
  const nb = at(fixture.gpus, b).numaNode ?? -1;
  return na === -1 || nb === -1 || na === nb ? 40 : 50;
}

let tmpDir = '';
let libDirs = { current: '', old: '' };
let api: Api;
let oldApi: OldApi;
let oldLib: LibraryHandle;
let sessionCounter = 0;

before(async () => {
  libDirs = await buildFakeNvml();
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'fake-nvml-test-'));
  const lib = koffi.load(path.join(libDirs.current, LIBRARY_NAME));
  api = { ...bindBase(lib), ...bindNewer(lib) };
  oldLib = koffi.load(path.join(libDirs.old, LIBRARY_NAME));
  oldApi = bindBase(oldLib);
});

after(() => {
  if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
});

function writeConfig(name: string, config: unknown): string {
  const file = path.join(tmpDir, name);
  fs.writeFileSync(file, typeof config === 'string' ? config : JSON.stringify(config));
  return file;
}

/** Writes text to the control FIFO (non-blocking open: fails at once if nobody reads it). */
function sendControl(fifo: string, text: string): void {
  const fd = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
  try {
    const data = Buffer.from(text);
    let offset = 0;
    while (offset < data.length) {
      try {
        offset += fs.writeSync(fd, data, offset);
      } catch (error: unknown) {
        if ((error as NodeJS.ErrnoException).code !== 'EAGAIN') throw error;
        sleepSync(1);
      }
    }
  } finally {
    fs.closeSync(fd);
  }
}

type Stats = FakeNvmlStats;

/** Asks for a stats file and waits for it. Commands run in order, so this is also a barrier:
 * when it returns, every command written before it has been applied. */
async function readStats(fifo: string): Promise<Stats> {
  return fakeNvmlStats((command) => sendControl(fifo, `${command}\n`), tmpDir);
}

type Session = { fifo: string; fixture: Fixture };

/** Initialises `nvml` on a fixture (file name in fixtures/ or an absolute path) with a fresh
 * control FIFO, runs body, and always shuts down. */
async function withSession(
  nvml: OldApi,
  config: string,
  body: (session: Session) => Promise<void> | void,
): Promise<void> {
  const file = path.isAbsolute(config) ? config : fixturePath(config);
  const fifo = path.join(tmpDir, `control-${++sessionCounter}.fifo`);
  process.env.FAKE_NVML_CONFIG = file;
  process.env.FAKE_NVML_CONTROL = fifo;
  assert.equal(nvml.init(), SUCCESS, `nvmlInit_v2 with ${config}`);
  try {
    assert.ok(fs.statSync(fifo).isFIFO(), 'the control FIFO was created');
    await body({ fifo, fixture: JSON.parse(fs.readFileSync(file, 'utf8')) as Fixture });
  } finally {
    assert.equal(nvml.shutdown(), SUCCESS, 'nvmlShutdown');
    delete process.env.FAKE_NVML_CONTROL;
  }
}

function handle(nvml: OldApi, index: number): bigint {
  const out: unknown[] = [null];
  assert.equal(nvml.handleByIndex(index, out), SUCCESS, `handle of GPU ${index}`);
  assert.equal(typeof out[0], 'bigint');
  return out[0] as bigint;
}

function deviceCount(nvml: OldApi): number {
  const out = [0];
  assert.equal(nvml.count(out), SUCCESS);
  return at(out, 0);
}

function pciInfo(nvml: OldApi, device: bigint): PciInfo {
  const out = {};
  assert.equal(nvml.pciInfo(device, out), SUCCESS);
  return out as PciInfo;
}

function createSet(nvml: OldApi): bigint {
  const out: unknown[] = [null];
  assert.equal(nvml.eventSetCreate(out), SUCCESS);
  assert.equal(typeof out[0], 'bigint');
  return out[0] as bigint;
}

function emptyEvent(): EventData {
  return { device: null, eventType: 0, eventData: 0, gpuInstanceId: 0, computeInstanceId: 0 };
}

// ---------------------------------------------------------------------------------------------
// Build
// ---------------------------------------------------------------------------------------------

const BASE_SYMBOLS = [
  'nvmlDeviceGetComputeMode',
  'nvmlDeviceGetCount_v2',
  // Health beyond XIDs (test/fake-nvml/fake_health.h)
  'nvmlDeviceGetCurrPcieLinkWidth',
  'nvmlDeviceGetCurrentClocksThrottleReasons',
  'nvmlDeviceGetFieldValues',
  'nvmlDeviceGetMaxPcieLinkWidth',
  'nvmlDeviceGetPcieReplayCounter',
  'nvmlDeviceGetRetiredPagesPendingStatus',
  'nvmlDeviceGetTotalEccErrors',
  'nvmlDeviceGetCudaComputeCapability',
  'nvmlDeviceGetHandleByIndex_v2',
  'nvmlDeviceGetHandleByPciBusId_v2',
  'nvmlDeviceGetHandleByUUID',
  'nvmlDeviceGetIndex',
  'nvmlDeviceGetMemoryInfo',
  'nvmlDeviceGetMinorNumber',
  'nvmlDeviceGetName',
  'nvmlDeviceGetNvLinkRemotePciInfo',
  'nvmlDeviceGetNvLinkState',
  'nvmlDeviceGetPciInfo_v3',
  'nvmlDeviceGetSupportedEventTypes',
  'nvmlDeviceGetTopologyCommonAncestor',
  'nvmlDeviceGetUUID',
  'nvmlDeviceRegisterEvents',
  'nvmlDeviceSetComputeMode',
  'nvmlErrorString',
  'nvmlEventSetCreate',
  'nvmlEventSetFree',
  'nvmlEventSetWait',
  'nvmlInit',
  'nvmlInitWithFlags',
  'nvmlInit_v2',
  'nvmlShutdown',
  'nvmlSystemGetCudaDriverVersion',
  'nvmlSystemGetCudaDriverVersion_v2',
  'nvmlSystemGetDriverVersion',
  'nvmlSystemGetNVMLVersion',
];
const NEWER_SYMBOLS = [
  'nvmlDeviceGetNumaNodeId',
  'nvmlDeviceGetNvLinkRemoteDeviceType',
  'nvmlDeviceGetNvLinkRemotePciInfo_v2',
  'nvmlEventSetWait_v2',
  'nvmlDeviceGetCurrentClocksEventReasons',
  'nvmlDeviceGetRemappedRows',
  'nvmlDeviceGetRetiredPages_v2',
  // MIG (test/fake-nvml/fake_mig.h)
  'nvmlComputeInstanceGetInfo_v2',
  'nvmlDeviceGetAttributes_v2',
  'nvmlDeviceGetComputeInstanceId',
  'nvmlDeviceGetDeviceHandleFromMigDeviceHandle',
  'nvmlDeviceGetGpuInstanceById',
  'nvmlDeviceGetGpuInstanceId',
  'nvmlDeviceGetGpuInstanceProfileInfo',
  'nvmlDeviceGetGpuInstanceProfileInfoV',
  'nvmlDeviceGetMaxMigDeviceCount',
  'nvmlDeviceGetMigDeviceHandleByIndex',
  'nvmlDeviceGetMigMode',
  'nvmlDeviceIsMigDeviceHandle',
  'nvmlGpuInstanceGetComputeInstanceById',
  'nvmlGpuInstanceGetComputeInstanceProfileInfo',
  'nvmlGpuInstanceGetComputeInstanceProfileInfoV',
  'nvmlGpuInstanceGetInfo',
  // dynamic MIG
  'nvmlComputeInstanceDestroy',
  'nvmlDeviceCreateGpuInstanceWithPlacement',
  'nvmlDeviceGetGpuInstancePossiblePlacements_v2',
  'nvmlDeviceGetGpuInstanceRemainingCapacity',
  'nvmlDeviceGetGpuInstances',
  'nvmlGpuInstanceCreateComputeInstance',
  'nvmlGpuInstanceDestroy',
  'nvmlGpuInstanceGetComputeInstances',
];

function exportedSymbols(file: string): string[] {
  const out = execFileSync('nm', ['-D', '--defined-only', file], { encoding: 'utf8' });
  return out
    .split('\n')
    .map((line) => line.trim().split(/\s+/))
    .filter((fields) => fields.length === 3)
    .map((fields) => at(fields, 2))
    .sort();
}

test('build: both variants carry the NVML soname and export exactly the NVML symbols', () => {
  for (const dir of [libDirs.current, libDirs.old]) {
    const file = path.join(dir, LIBRARY_NAME);
    assert.ok(fs.statSync(file).isFile());
    const dynamic = execFileSync('readelf', ['-d', file], { encoding: 'utf8' });
    assert.match(dynamic, /\(SONAME\)\s+Library soname: \[libnvidia-ml\.so\.1\]/);
  }
  assert.deepEqual(
    exportedSymbols(path.join(libDirs.current, LIBRARY_NAME)),
    [...BASE_SYMBOLS, ...NEWER_SYMBOLS].sort(),
  );
  assert.deepEqual(exportedSymbols(path.join(libDirs.old, LIBRARY_NAME)), [...BASE_SYMBOLS].sort());
  assert.equal(libDirs.current, path.join(repoRoot, '.cache', 'fake-nvml', 'current'));
  assert.equal(libDirs.old, path.join(repoRoot, '.cache', 'fake-nvml', 'old'));
});

test('build: an up-to-date library is not rebuilt by the CLI', () => {
  const file = path.join(libDirs.current, LIBRARY_NAME);
  const before = fs.statSync(file).mtimeMs;
  const output = execFileSync(process.execPath, [path.join(repoRoot, 'test', 'fake-nvml', 'build.ts')], {
    encoding: 'utf8',
  });
  assert.match(output, /libnvidia-ml\.so\.1/);
  assert.equal(fs.statSync(file).mtimeMs, before);
});

test('old driver variant: the newer entry points are absent, so lookups fail', () => {
  for (const name of NEWER_SYMBOLS) {
    assert.throws(() => oldLib.func(`int ${name}(void *a, unsigned int b, void *c)`), /Cannot find function/, name);
  }
});

// ---------------------------------------------------------------------------------------------
// Init, shutdown, error strings
// ---------------------------------------------------------------------------------------------

test('every call before init answers UNINITIALIZED', () => {
  const buffer = Buffer.alloc(96);
  assert.equal(api.count([0]), UNINITIALIZED);
  assert.equal(api.handleByIndex(0, [null]), UNINITIALIZED);
  assert.equal(api.handleByUuid('GPU-x', [null]), UNINITIALIZED);
  assert.equal(api.rawUuid(null, buffer, 96), UNINITIALIZED);
  assert.equal(api.driverVersion(buffer, 96), UNINITIALIZED);
  assert.equal(api.nvmlVersion(buffer, 96), UNINITIALIZED);
  assert.equal(api.eventSetCreate([null]), UNINITIALIZED);
  assert.equal(api.rawWaitV2(null, null, 0), UNINITIALIZED);
  assert.equal(api.rawNumaNode(null, null), UNINITIALIZED);
  assert.equal(api.shutdown(), UNINITIALIZED);
});

test('init fails with DRIVER_NOT_LOADED without a config, and with the configured initError', () => {
  delete process.env.FAKE_NVML_CONFIG;
  delete process.env.FAKE_NVML_CONTROL;
  assert.equal(api.init(), DRIVER_NOT_LOADED);
  assert.equal(api.count([0]), UNINITIALIZED);

  process.env.FAKE_NVML_CONFIG = fixturePath('init-fails.json');
  assert.equal(api.init(), DRIVER_NOT_LOADED);
  assert.equal(api.initV1(), DRIVER_NOT_LOADED);
  assert.equal(api.count([0]), UNINITIALIZED);
  assert.equal(api.shutdown(), UNINITIALIZED);

  const code = writeConfig('init-error-3.json', { initError: 4, gpus: [] });
  process.env.FAKE_NVML_CONFIG = code;
  assert.equal(api.init(), 4);
  assert.equal(api.shutdown(), UNINITIALIZED);
});

test('init is reference-counted across nvmlInit_v2, nvmlInit and nvmlInitWithFlags', () => {
  delete process.env.FAKE_NVML_CONTROL;
  process.env.FAKE_NVML_CONFIG = fixturePath('dgx1-v100.json');
  assert.equal(api.init(), SUCCESS);
  assert.equal(api.initV1(), SUCCESS);
  assert.equal(api.initWithFlags(0), SUCCESS);
  assert.equal(api.shutdown(), SUCCESS);
  assert.equal(api.shutdown(), SUCCESS);
  assert.equal(deviceCount(api), 8, 'still initialised after 2 of 3 shutdowns');
  assert.equal(api.shutdown(), SUCCESS);
  assert.equal(api.count([0]), UNINITIALIZED);
  assert.equal(api.shutdown(), UNINITIALIZED);

  // The config is read again at the next first init.
  process.env.FAKE_NVML_CONFIG = fixturePath('nvswitch-16.json');
  assert.equal(api.init(), SUCCESS);
  assert.equal(deviceCount(api), 16);
  assert.equal(api.shutdown(), SUCCESS);
});

test('nvmlErrorString gives the real texts', () => {
  const expected: [number, string][] = [
    [0, 'Success'],
    [1, 'Uninitialized'],
    [2, 'Invalid Argument'],
    [3, 'Not Supported'],
    [4, 'Insufficient Permissions'],
    [6, 'Not Found'],
    [7, 'Insufficient Size'],
    [9, 'Driver Not Loaded'],
    [10, 'Timeout'],
    [13, 'Function Not Found'],
    [15, 'GPU is lost'],
    [999, 'Unknown Error'],
    [12345, 'Unknown Error'],
  ];
  for (const [code, text] of expected) assert.equal(api.errorString(code), text, `code ${code}`);
});

// ---------------------------------------------------------------------------------------------
// Device queries
// ---------------------------------------------------------------------------------------------

test('system and device queries match the fixture (dgx1-v100)', async () => {
  await withSession(api, 'dgx1-v100.json', ({ fixture }) => {
    const buffer = Buffer.alloc(96);
    assert.equal(api.driverVersion(buffer, 80), SUCCESS);
    assert.equal(cString(buffer), '550.54.15');
    assert.equal(api.nvmlVersion(buffer, 80), SUCCESS);
    assert.equal(cString(buffer), '12.550.54.15');
    assert.equal(api.driverVersion(buffer, 9), INSUFFICIENT_SIZE, 'no room for the NUL');
    assert.equal(api.driverVersion(buffer, 10), SUCCESS);
    assert.equal(api.nvmlVersion(buffer, 5), INSUFFICIENT_SIZE);
    for (const get of [api.cudaDriverVersion, api.cudaDriverVersionV2]) {
      const cuda = [0];
      assert.equal(get(cuda), SUCCESS);
      assert.equal(cuda[0], 12040, 'CUDA 12.4 by default');
    }

    assert.equal(deviceCount(api), 8);
    const handles = fixture.gpus.map((_, i) => handle(api, i));
    assert.equal(new Set(handles).size, 8, 'distinct handles');
    fixture.gpus.forEach((gpu, i) => {
      const h = at(handles, i);
      assert.equal(handle(api, i), h, 'handles are stable');

      const index = [0];
      assert.equal(api.index(h, index), SUCCESS);
      assert.equal(index[0], i);

      const uuid = Buffer.alloc(96);
      assert.equal(api.uuid(h, uuid, 96), SUCCESS);
      assert.equal(cString(uuid), gpu.uuid);
      assert.equal(api.uuid(h, Buffer.alloc(96), gpu.uuid.length), INSUFFICIENT_SIZE);
      assert.equal(api.uuid(h, Buffer.alloc(96), gpu.uuid.length + 1), SUCCESS);

      const name = Buffer.alloc(96);
      assert.equal(api.name(h, name, 96), SUCCESS);
      assert.equal(cString(name), 'Tesla V100-SXM2-32GB');
      assert.equal(api.name(h, name, 4), INSUFFICIENT_SIZE);

      const minor = [99];
      assert.equal(api.minor(h, minor), SUCCESS);
      assert.equal(minor[0], gpu.minor);

      const pci = pciInfo(api, h);
      assert.equal(pci.busId, gpu.busId);
      const [domain, bus, rest] = gpu.busId.split(':') as [string, string, string];
      assert.equal(pci.domain, Number.parseInt(domain, 16));
      assert.equal(pci.bus, Number.parseInt(bus, 16));
      assert.equal(pci.device, Number.parseInt(at(rest.split('.'), 0), 16));
      assert.equal(pci.busIdLegacy, `${domain.slice(4)}:${bus}:${rest}`);
      assert.equal(pci.pciDeviceId, 0x1db510de, 'V100-SXM2-32GB device id, NVIDIA vendor');
      assert.equal(pci.pciSubSystemId & 0xffff, 0x10de);

      const memory = {};
      assert.equal(api.memoryInfo(h, memory), SUCCESS);
      assert.deepEqual(memory as Memory, { total: 32768 * 1024 * 1024, free: 32768 * 1024 * 1024, used: 0 });

      const node = [99];
      assert.equal(api.numaNode(h, node), SUCCESS);
      assert.equal(node[0], i < 4 ? 0 : 1);

      const mig = [7];
      const pending = [7];
      assert.equal(api.migMode(h, mig, pending), NOT_SUPPORTED);

      const major = [0];
      const minorCc = [9];
      assert.equal(api.computeCapability(h, major, minorCc), SUCCESS);
      assert.deepEqual([major[0], minorCc[0]], [7, 0], 'V100: compute capability 7.0');

      const byUuid: unknown[] = [null];
      assert.equal(api.handleByUuid(gpu.uuid, byUuid), SUCCESS);
      assert.equal(byUuid[0], h);
    });
    assert.equal(api.handleByUuid('GPU-00000000-0000-0000-0000-000000000000', [null]), NOT_FOUND);
    assert.equal(api.handleByIndex(8, [null]), INVALID_ARGUMENT);
  });
});

test('memory used, pci ids and NUMA absence come from the config', async () => {
  const config = writeConfig('memory.json', {
    cudaDriverVersion: 12080,
    gpus: [
      {
        uuid: 'GPU-aaaaaaaa-0000-0000-0000-000000000001',
        name: 'NVIDIA A100-SXM4-80GB',
        busId: '00000001:c1:1f.7',
        memoryMiB: 81920,
        memoryUsedMiB: 512,
        numaNode: -1,
        pciDeviceId: '0x20b510de',
        pciSubSystemId: 0x153310de,
      },
    ],
  });
  await withSession(api, config, () => {
    const h = handle(api, 0);
    const memory = {};
    assert.equal(api.memoryInfo(h, memory), SUCCESS);
    assert.deepEqual(memory as Memory, {
      total: 81920 * 1048576,
      free: (81920 - 512) * 1048576,
      used: 512 * 1048576,
    });
    const pci = pciInfo(api, h);
    assert.deepEqual(pci, {
      busIdLegacy: '0001:C1:1F.7',
      domain: 1,
      bus: 0xc1,
      device: 0x1f,
      pciDeviceId: 0x20b510de,
      pciSubSystemId: 0x153310de,
      busId: '00000001:C1:1F.7',
    });
    assert.equal(api.numaNode(h, [0]), NOT_SUPPORTED);
    const minor = [99];
    assert.equal(api.minor(h, minor), SUCCESS);
    assert.equal(minor[0], 0, 'minor defaults to the index');
    const cuda = [0];
    assert.equal(api.cudaDriverVersionV2(cuda), SUCCESS);
    assert.equal(cuda[0], 12080);
    const cc = [[0], [0]] as const;
    assert.equal(api.computeCapability(h, cc[0], cc[1]), SUCCESS);
    assert.deepEqual([cc[0][0], cc[1][0]], [8, 0], 'A100: 8.0');
  });
});

test('NULL and foreign handles and NULL out-pointers answer INVALID_ARGUMENT', async () => {
  await withSession(api, 'dgx1-v100.json', () => {
    const h0 = handle(api, 0);
    const h1 = handle(api, 1);
    const stride = h1 - h0;
    const foreign = [null, Buffer.alloc(4096), h0 + 1n, h0 + 8n * stride, h0 - stride, 0x1000n];
    const buffer = Buffer.alloc(96);
    for (const bad of foreign) {
      const label = `handle ${String(bad instanceof Buffer ? 'buffer' : bad)}`;
      assert.equal(api.rawUuid(bad, buffer, 96), INVALID_ARGUMENT, label);
      assert.equal(api.rawIndex(bad, Buffer.alloc(4)), INVALID_ARGUMENT, label);
      assert.equal(api.rawPciInfo(bad, Buffer.alloc(68)), INVALID_ARGUMENT, label);
      assert.equal(api.rawMemoryInfo(bad, Buffer.alloc(24)), INVALID_ARGUMENT, label);
      assert.equal(api.rawTopology(bad, h0, Buffer.alloc(4)), INVALID_ARGUMENT, label);
      assert.equal(api.rawTopology(h0, bad, Buffer.alloc(4)), INVALID_ARGUMENT, label);
      assert.equal(api.rawNvlinkState(bad, 0, Buffer.alloc(4)), INVALID_ARGUMENT, label);
      assert.equal(api.rawNumaNode(bad, Buffer.alloc(4)), INVALID_ARGUMENT, label);
      assert.equal(api.rawSupportedEvents(bad, Buffer.alloc(8)), INVALID_ARGUMENT, label);
    }
    assert.equal(api.rawCount(null), INVALID_ARGUMENT);
    assert.equal(api.rawHandleByIndex(0, null), INVALID_ARGUMENT);
    assert.equal(api.rawHandleByUuid(null, Buffer.alloc(8)), INVALID_ARGUMENT);
    assert.equal(api.rawHandleByUuid('GPU-x', null), INVALID_ARGUMENT);
    assert.equal(api.rawUuid(h0, null, 96), INVALID_ARGUMENT);
    assert.equal(api.rawIndex(h0, null), INVALID_ARGUMENT);
    assert.equal(api.rawMinor(h0, null), INVALID_ARGUMENT);
    assert.equal(api.rawPciInfo(h0, null), INVALID_ARGUMENT);
    assert.equal(api.rawMemoryInfo(h0, null), INVALID_ARGUMENT);
    assert.equal(api.rawNumaNode(h0, null), INVALID_ARGUMENT);
    assert.equal(api.rawTopology(h0, h1, null), INVALID_ARGUMENT);
    assert.equal(api.rawNvlinkState(h0, 0, null), INVALID_ARGUMENT);
    assert.equal(api.rawSupportedEvents(h0, null), INVALID_ARGUMENT);
    assert.equal(api.rawEventSetCreate(null), INVALID_ARGUMENT);
    assert.equal(api.driverVersion(null, 80), INVALID_ARGUMENT);
    assert.equal(api.migMode(h0, null, [0]), INVALID_ARGUMENT);

    const set = createSet(api);
    assert.equal(api.rawRegisterEvents(h0, EVENT_XID, null), INVALID_ARGUMENT);
    assert.equal(api.rawRegisterEvents(h0, EVENT_XID, Buffer.alloc(64)), INVALID_ARGUMENT);
    assert.equal(api.rawRegisterEvents(null, EVENT_XID, set), INVALID_ARGUMENT);
    assert.equal(api.rawWaitV2(set, null, 0), INVALID_ARGUMENT);
    assert.equal(api.rawWaitV2(Buffer.alloc(64), Buffer.alloc(32), 0), INVALID_ARGUMENT);
    assert.equal(api.rawEventSetFree(set + 8n), INVALID_ARGUMENT);
    assert.equal(api.eventSetFree(set), SUCCESS);
    assert.equal(api.eventSetFree(set), INVALID_ARGUMENT, 'double free');
  });

  // A handle kept across shutdown is refused once its index no longer exists.
  let stale = 0n;
  await withSession(api, 'dgx1-v100.json', () => {
    stale = handle(api, 5);
  });
  assert.equal(api.rawUuid(stale, Buffer.alloc(96), 96), UNINITIALIZED);
  await withSession(api, 'single.json', () => {
    assert.equal(api.rawUuid(stale, Buffer.alloc(96), 96), INVALID_ARGUMENT);
  });
});

// ---------------------------------------------------------------------------------------------
// Topology and NVLink
// ---------------------------------------------------------------------------------------------

test('topology common ancestor follows pcie overrides and NUMA defaults in every fixture', async () => {
  for (const name of FIXTURES.filter((f) => f !== 'init-fails.json')) {
    await withSession(api, name, ({ fixture }) => {
      const n = fixture.gpus.length;
      assert.equal(deviceCount(api), n, name);
      const handles = fixture.gpus.map((_, i) => handle(api, i));
      for (let a = 0; a < n; a++) {
        const level = [-1];
        assert.equal(api.topology(at(handles, a), at(handles, a), level), INVALID_ARGUMENT, 'same GPU twice');
        for (let b = 0; b < n; b++) {
          if (a === b) continue;
          assert.equal(api.topology(at(handles, a), at(handles, b), level), SUCCESS);
          assert.equal(level[0], expectedLevel(fixture, a, b), `${name}: GPUs ${a} and ${b}`);
        }
      }
    });
  }
});

test('topology levels of the fixtures are the documented ones', async () => {
  const level = (a: bigint, b: bigint) => {
    const out = [-1];
    assert.equal(api.topology(a, b, out), SUCCESS);
    return at(out, 0);
  };
  await withSession(api, 'dgx1-v100.json', () => {
    const h = [0, 1, 2, 3, 4, 5, 6, 7].map((i) => handle(api, i));
    const g = (i: number) => at(h, i);
    assert.equal(level(g(0), g(1)), 10);
    assert.equal(level(g(6), g(7)), 10);
    assert.equal(level(g(0), g(2)), 40);
    assert.equal(level(g(5), g(7)), 40);
    assert.equal(level(g(0), g(4)), 50);
    assert.equal(level(g(3), g(6)), 50);
  });
  await withSession(api, 'pcie-2socket-8.json', () => {
    const h = [0, 1, 2, 3, 4, 5, 6, 7].map((i) => handle(api, i));
    const g = (i: number) => at(h, i);
    assert.equal(level(g(0), g(1)), 10);
    assert.equal(level(g(1), g(3)), 20);
    assert.equal(level(g(4), g(7)), 20);
    assert.equal(level(g(2), g(5)), 50);
  });
  await withSession(api, 'bridged-pair-4.json', () => {
    assert.equal(level(handle(api, 0), handle(api, 3)), 30);
    assert.equal(level(handle(api, 1), handle(api, 2)), 30);
  });
});

/** Enumerates a GPU's links the way the plugin will: until INVALID_ARGUMENT. */
function enumerateLinks(device: bigint): { active: boolean; remoteBusId?: string; remoteType?: number }[] {
  const links: { active: boolean; remoteBusId?: string; remoteType?: number }[] = [];
  for (let link = 0; ; link++) {
    const active = [-1];
    const r = api.nvlinkState(device, link, active);
    if (r === INVALID_ARGUMENT) break;
    assert.equal(r, SUCCESS, `link ${link}`);
    if (active[0] === 0) {
      assert.equal(api.nvlinkRemotePci(device, link, {}), NOT_SUPPORTED, `inactive link ${link}: remote pci`);
      assert.equal(api.nvlinkRemoteType(device, link, [0]), NOT_SUPPORTED, `inactive link ${link}: remote type`);
      links.push({ active: false });
      continue;
    }
    assert.equal(active[0], 1);
    const pci = {};
    assert.equal(api.nvlinkRemotePci(device, link, pci), SUCCESS);
    const pciV1 = {};
    assert.equal(api.nvlinkRemotePciV1(device, link, pciV1), SUCCESS);
    assert.deepEqual(pciV1, pci, 'v1 and v2 agree');
    const type = [-1];
    assert.equal(api.nvlinkRemoteType(device, link, type), SUCCESS);
    links.push({ active: true, remoteBusId: (pci as PciInfo).busId, remoteType: at(type, 0) });
  }
  return links;
}

test('NVLink enumeration gives the fixture links (GPU peers and NVSwitches)', async () => {
  for (const name of ['dgx1-v100.json', 'nvswitch-8.json', 'nvswitch-16.json', 'bridged-pair-4.json', 'demo-8.json']) {
    await withSession(api, name, ({ fixture }) => {
      const n = fixture.gpus.length;
      const linkCount = fixture.linkCount ?? 12;
      for (let g = 0; g < n; g++) {
        const device = handle(api, g);
        const links = enumerateLinks(device);
        assert.equal(links.length, linkCount, `${name}: GPU ${g} has linkCount slots`);

        // Expected remote bus ids, in slot order: GPU peers first, then switches.
        const expected: { busId: string; type: number }[] = [];
        for (const [a, b, count] of fixture.nvlinks ?? []) {
          const peer = a === g ? b : b === g ? a : -1;
          for (let k = 0; peer >= 0 && k < count; k++) {
            expected.push({ busId: at(fixture.gpus, peer).busId, type: LINK_TYPE_GPU });
          }
        }
        for (const sw of fixture.nvswitches ?? []) {
          for (const [gpu, count] of sw.links) {
            for (let k = 0; gpu === g && k < count; k++) expected.push({ busId: sw.busId, type: LINK_TYPE_SWITCH });
          }
        }
        const active = links.filter((l) => l.active);
        assert.deepEqual(
          active.map((l) => ({ busId: l.remoteBusId, type: l.remoteType })),
          expected,
          `${name}: GPU ${g} links`,
        );
        assert.ok(
          links.slice(0, active.length).every((l) => l.active),
          'used slots come first',
        );
      }
    });
  }
});

test('NVLink counts per pair on the DGX-1 hybrid cube-mesh', async () => {
  await withSession(api, 'dgx1-v100.json', ({ fixture }) => {
    const busToIndex = new Map(fixture.gpus.map((gpu, i) => [gpu.busId, i]));
    const counts = new Map<string, number>();
    for (let g = 0; g < 8; g++) {
      for (const link of enumerateLinks(handle(api, g))) {
        assert.ok(link.active, 'every DGX-1 V100 link is used');
        const peer = busToIndex.get(link.remoteBusId ?? '');
        assert.ok(peer !== undefined);
        if (g < peer) counts.set(`${g}-${peer}`, (counts.get(`${g}-${peer}`) ?? 0) + 1);
      }
    }
    assert.deepEqual(Object.fromEntries([...counts].sort()), {
      '0-1': 1,
      '0-2': 1,
      '0-3': 2,
      '0-4': 2,
      '1-2': 2,
      '1-3': 1,
      '1-5': 2,
      '2-3': 2,
      '2-6': 1,
      '3-7': 1,
      '4-5': 1,
      '4-6': 1,
      '4-7': 2,
      '5-6': 2,
      '5-7': 1,
      '6-7': 2,
    });
  });
});

test('NVLink edge cases: inactive slots, link index past linkCount, GPUs without NVLink', async () => {
  await withSession(api, 'bridged-pair-4.json', () => {
    const g0 = handle(api, 0);
    const g1 = handle(api, 1);
    const active = [-1];
    assert.equal(api.nvlinkState(g0, 0, active), SUCCESS);
    assert.equal(active[0], 0, 'GPU 0 has no bridge: slot inactive');
    assert.equal(api.nvlinkRemotePci(g0, 0, {}), NOT_SUPPORTED);
    assert.equal(api.nvlinkRemotePciV1(g0, 0, {}), NOT_SUPPORTED);
    assert.equal(api.nvlinkRemoteType(g0, 3, [0]), NOT_SUPPORTED);
    assert.equal(api.nvlinkState(g0, 4, active), INVALID_ARGUMENT);
    assert.equal(api.nvlinkState(g1, 3, active), SUCCESS);
    assert.equal(active[0], 1);
    assert.equal(api.nvlinkState(g1, 4, active), INVALID_ARGUMENT);
    assert.equal(api.nvlinkState(g1, 0xffffffff, active), INVALID_ARGUMENT);
  });
  await withSession(api, 'pcie-2socket-8.json', () => {
    const g = handle(api, 0);
    assert.equal(api.nvlinkState(g, 0, [0]), NOT_SUPPORTED, 'a board without NVLink');
    assert.equal(api.nvlinkRemotePci(g, 0, {}), NOT_SUPPORTED);
    assert.equal(api.nvlinkRemoteType(g, 0, [0]), NOT_SUPPORTED);
  });
});

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

test('supported event types and registration', async () => {
  await withSession(api, 'dgx1-v100.json', () => {
    const h = handle(api, 0);
    const types = [0];
    assert.equal(api.supportedEvents(h, types), SUCCESS);
    assert.equal(types[0], EVENT_SBE | EVENT_DBE | EVENT_XID);
    const set = createSet(api);
    assert.equal(api.registerEvents(h, EVENT_XID | EVENT_DBE, set), SUCCESS);
    assert.equal(api.registerEvents(h, EVENT_SBE, set), SUCCESS);
    assert.equal(api.registerEvents(h, 0x4, set), NOT_SUPPORTED, 'PState is not supported');
    assert.equal(api.registerEvents(h, EVENT_XID | 0x10, set), NOT_SUPPORTED);
    assert.equal(api.eventSetFree(set), SUCCESS);
  });
  await withSession(api, 'single.json', () => {
    const h = handle(api, 0);
    const types = [99];
    assert.equal(api.supportedEvents(h, types), SUCCESS);
    assert.equal(types[0], 0);
    const set = createSet(api);
    assert.equal(api.registerEvents(h, EVENT_XID, set), NOT_SUPPORTED);
    assert.equal(api.registerEvents(h, 0, set), NOT_SUPPORTED, 'a GPU without events refuses any registration');
    assert.equal(api.eventSetFree(set), SUCCESS);
  });
  const partial = writeConfig('partial-events.json', {
    gpus: [
      {
        uuid: 'GPU-bbbbbbbb-0000-0000-0000-000000000001',
        name: 'NVIDIA L40S',
        busId: '00000000:17:00.0',
        events: ['xid'],
      },
    ],
  });
  await withSession(api, partial, () => {
    const h = handle(api, 0);
    const types = [0];
    assert.equal(api.supportedEvents(h, types), SUCCESS);
    assert.equal(types[0], EVENT_XID);
    const set = createSet(api);
    assert.equal(api.registerEvents(h, EVENT_XID, set), SUCCESS);
    assert.equal(api.registerEvents(h, EVENT_XID | EVENT_DBE, set), NOT_SUPPORTED);
    assert.equal(api.eventSetFree(set), SUCCESS);
  });
});

test(
  'nvmlEventSetWait_v2 blocks its thread until an ' + 'injected event arrives, while other threads call NVML',
  async () => {
    await withSession(api, 'dgx1-v100.json', async ({ fifo }) => {
      const h3 = handle(api, 3);
      const set = createSet(api);
      assert.equal(api.registerEvents(h3, EVENT_XID, set), SUCCESS);

      const immediate = emptyEvent();
      const t0 = performance.now();
      assert.equal(api.waitV2(set, immediate, 0), TIMEOUT, 'timeout 0 returns at once');
      assert.ok(performance.now() - t0 < 200);

      const data = emptyEvent();
      let settled = false;
      const started = performance.now();
      const waiting = callAsync(api.waitV2, set, data, 20_000).finally(() => {
        settled = true;
      });
      await sleep(300);
      assert.equal(settled, false, 'the wait is still blocked after 300 ms');
      // Other NVML calls proceed while that thread is blocked inside the library.
      for (let i = 0; i < 50; i++) {
        const uuid = Buffer.alloc(96);
        assert.equal(api.uuid(h3, uuid, 96), SUCCESS);
        assert.equal(deviceCount(api), 8);
      }
      assert.equal(settled, false);
      sendControl(fifo, 'xid 3 79\n');
      assert.equal(await waiting, SUCCESS);
      const elapsed = performance.now() - started;
      assert.ok(elapsed >= 290 && elapsed < 10_000, `woken by the event after ${elapsed} ms`);
      assert.deepEqual(data, {
        device: h3,
        eventType: EVENT_XID,
        eventData: 79,
        gpuInstanceId: NO_INSTANCE,
        computeInstanceId: NO_INSTANCE,
      });
      assert.equal(api.eventSetFree(set), SUCCESS);
    });
  },
);

test('nvmlEventSetWait_v2 times out after the requested time', async () => {
  await withSession(api, 'dgx1-v100.json', async () => {
    const set = createSet(api);
    assert.equal(api.registerEvents(handle(api, 0), EVENT_XID, set), SUCCESS);
    const started = performance.now();
    const data = emptyEvent();
    assert.equal(await callAsync(api.waitV2, set, data, 400), TIMEOUT);
    const elapsed = performance.now() - started;
    assert.ok(elapsed >= 390, `waited ${elapsed} ms`);
    assert.ok(elapsed < 5000, `waited ${elapsed} ms`);
    assert.equal(api.eventSetFree(set), SUCCESS);
  });
});

test('events reach exactly the sets registered for that GPU and type; device NULL means every GPU', async () => {
  await withSession(api, 'dgx1-v100.json', async ({ fifo }) => {
    const h0 = handle(api, 0);
    const h1 = handle(api, 1);
    const setA = createSet(api);
    const setB = createSet(api);
    assert.equal(api.registerEvents(h0, EVENT_XID, setA), SUCCESS);
    assert.equal(api.registerEvents(h1, EVENT_XID | EVENT_DBE, setB), SUCCESS);
    assert.equal(api.registerEvents(h1, EVENT_SBE, setB), SUCCESS);

    sendControl(
      fifo,
      `${['xid 1 13', 'dbe 0', 'sbe 1', 'dbe 1', 'xid 2 48', 'xid all 31', 'xid 0 0x5E'].join('\n')}\n`,
    );
    await readStats(fifo);

    const drain = (set: bigint) => {
      const events: EventData[] = [];
      for (;;) {
        const data = emptyEvent();
        const r = api.waitV2(set, data, 0);
        if (r === TIMEOUT) return events;
        assert.equal(r, SUCCESS);
        events.push(data);
      }
    };
    const ffff = { gpuInstanceId: NO_INSTANCE, computeInstanceId: NO_INSTANCE };
    assert.deepEqual(drain(setA), [
      { device: null, eventType: EVENT_XID, eventData: 31, ...ffff },
      { device: h0, eventType: EVENT_XID, eventData: 0x5e, ...ffff },
    ]);
    assert.deepEqual(drain(setB), [
      { device: h1, eventType: EVENT_XID, eventData: 13, ...ffff },
      { device: h1, eventType: EVENT_SBE, eventData: 0, ...ffff },
      { device: h1, eventType: EVENT_DBE, eventData: 0, ...ffff },
      { device: null, eventType: EVENT_XID, eventData: 31, ...ffff },
    ]);
    assert.equal(api.eventSetFree(setA), SUCCESS);
    assert.equal(api.eventSetFree(setB), SUCCESS);
  });
});

test('a lost GPU answers GPU_IS_LOST to every per-device call until it is back', async () => {
  await withSession(api, 'dgx1-v100.json', async ({ fifo, fixture }) => {
    const h0 = handle(api, 0);
    const h2 = handle(api, 2);
    const set = createSet(api);
    sendControl(fifo, 'lost 2\n');
    await readStats(fifo);

    const buffer = Buffer.alloc(96);
    assert.equal(deviceCount(api), 8, 'a lost GPU still counts');
    assert.equal(api.handleByIndex(2, [null]), GPU_IS_LOST);
    assert.equal(api.handleByUuid(at(fixture.gpus, 2).uuid, [null]), GPU_IS_LOST);
    assert.equal(api.uuid(h2, buffer, 96), GPU_IS_LOST);
    assert.equal(api.name(h2, buffer, 96), GPU_IS_LOST);
    assert.equal(api.index(h2, [0]), GPU_IS_LOST);
    assert.equal(api.minor(h2, [0]), GPU_IS_LOST);
    assert.equal(api.pciInfo(h2, {}), GPU_IS_LOST);
    assert.equal(api.memoryInfo(h2, {}), GPU_IS_LOST);
    assert.equal(api.numaNode(h2, [0]), GPU_IS_LOST);
    assert.equal(api.topology(h0, h2, [0]), GPU_IS_LOST);
    assert.equal(api.topology(h2, h0, [0]), GPU_IS_LOST);
    assert.equal(api.nvlinkState(h2, 0, [0]), GPU_IS_LOST);
    assert.equal(api.nvlinkRemotePci(h2, 0, {}), GPU_IS_LOST);
    assert.equal(api.nvlinkRemoteType(h2, 0, [0]), GPU_IS_LOST);
    assert.equal(api.supportedEvents(h2, [0]), GPU_IS_LOST);
    assert.equal(api.registerEvents(h2, EVENT_XID, set), GPU_IS_LOST);
    assert.equal(api.migMode(h2, [0], [0]), GPU_IS_LOST);
    // The other GPUs are unaffected.
    assert.equal(api.uuid(h0, buffer, 96), SUCCESS);
    assert.equal(cString(buffer), at(fixture.gpus, 0).uuid);

    sendControl(fifo, 'back 2\n');
    await readStats(fifo);
    assert.equal(handle(api, 2), h2);
    assert.equal(api.uuid(h2, buffer, 96), SUCCESS);
    assert.equal(cString(buffer), at(fixture.gpus, 2).uuid);
    assert.equal(api.registerEvents(h2, EVENT_XID, set), SUCCESS);
    assert.equal(api.eventSetFree(set), SUCCESS);
  });
});

// ---------------------------------------------------------------------------------------------
// Compute mode (MPS sets EXCLUSIVE_PROCESS and puts DEFAULT back)
// ---------------------------------------------------------------------------------------------

function computeMode(nvml: OldApi, h: bigint): number {
  const out = [-1];
  assert.equal(nvml.getComputeMode(h, out), SUCCESS);
  return at(out, 0);
}

test('compute mode: DEFAULT or the configured mode; set, read back and shown in stats by UUID', async () => {
  const config = writeConfig('compute-modes.json', {
    gpus: [
      { uuid: 'GPU-00000000-0000-0000-0000-00000000cm00', name: 'NVIDIA A100-SXM4-40GB', busId: '00000000:07:00.0' },
      {
        uuid: 'GPU-00000000-0000-0000-0000-00000000cm01',
        name: 'NVIDIA A100-SXM4-40GB',
        busId: '00000000:0F:00.0',
        computeMode: 2,
      },
      {
        uuid: 'GPU-00000000-0000-0000-0000-00000000cm02',
        name: 'NVIDIA A100-SXM4-40GB',
        busId: '00000000:47:00.0',
        computeMode: 3,
      },
    ],
  });
  await withSession(api, config, async ({ fifo, fixture }) => {
    const uuids = fixture.gpus.map((g) => g.uuid);
    const [h0, h1, h2] = [handle(api, 0), handle(api, 1), handle(api, 2)];
    assert.deepEqual(
      [computeMode(api, h0), computeMode(api, h1), computeMode(api, h2)],
      [COMPUTEMODE_DEFAULT, COMPUTEMODE_PROHIBITED, COMPUTEMODE_EXCLUSIVE_PROCESS],
    );

    assert.equal(api.setComputeMode(h0, COMPUTEMODE_EXCLUSIVE_PROCESS), SUCCESS);
    assert.equal(computeMode(api, h0), COMPUTEMODE_EXCLUSIVE_PROCESS);
    assert.equal(api.setComputeMode(h2, COMPUTEMODE_DEFAULT), SUCCESS);
    assert.equal(computeMode(api, h2), COMPUTEMODE_DEFAULT);
    const stats = await readStats(fifo);
    assert.deepEqual(stats.computeModes, {
      [at(uuids, 0)]: COMPUTEMODE_EXCLUSIVE_PROCESS,
      [at(uuids, 1)]: COMPUTEMODE_PROHIBITED,
      [at(uuids, 2)]: COMPUTEMODE_DEFAULT,
    });
    assert.equal(stats.calls.nvmlDeviceSetComputeMode, 2);
    assert.equal(stats.calls.nvmlDeviceGetComputeMode, 5);

    // An administrator's nvidia-smi -c, through the FIFO.
    sendControl(fifo, 'compute-mode 1 0\n');
    await readStats(fifo);
    assert.equal(computeMode(api, h1), COMPUTEMODE_DEFAULT);
  });
});

test(
  'compute mode: bad handles, NULL, modes outside the enum, ' +
    'EXCLUSIVE_THREAD, lost GPUs and MIG devices are refused',
  async () => {
    await withSession(api, 'dgx1-v100.json', async ({ fifo }) => {
      const h = handle(api, 0);
      assert.equal(api.rawGetComputeMode(null, Buffer.alloc(4)), INVALID_ARGUMENT);
      assert.equal(api.rawGetComputeMode(h, null), INVALID_ARGUMENT);
      assert.equal(api.rawSetComputeMode(null, COMPUTEMODE_EXCLUSIVE_PROCESS), INVALID_ARGUMENT);
      assert.equal(api.setComputeMode(h, 4), INVALID_ARGUMENT, 'NVML_COMPUTEMODE_COUNT is not a mode');
      assert.equal(api.setComputeMode(h, -1), INVALID_ARGUMENT);
      assert.equal(api.setComputeMode(h, COMPUTEMODE_EXCLUSIVE_THREAD), NOT_SUPPORTED, 'support removed in nvml.h');
      assert.equal(computeMode(api, h), COMPUTEMODE_DEFAULT, 'a refused call changes nothing');

      sendControl(fifo, 'lost 0\n');
      await readStats(fifo);
      assert.equal(api.getComputeMode(h, [0]), GPU_IS_LOST);
      assert.equal(api.setComputeMode(h, COMPUTEMODE_EXCLUSIVE_PROCESS), GPU_IS_LOST);
      sendControl(fifo, 'back 0\n');
      await readStats(fifo);
      assert.equal(computeMode(api, h), COMPUTEMODE_DEFAULT);
    });
    // A MIG device has no compute mode of its own: like other whole-GPU calls, NOT_SUPPORTED.
    await withSession(api, 'mig-uniform-2.json', () => {
      const lib = koffi.load(path.join(libDirs.current, LIBRARY_NAME));
      const migHandle = lib.func(
        'int nvmlDeviceGetMigDeviceHandleByIndex(FakeNvmlTest_device ' +
          'device, unsigned int index, _Out_ FakeNvmlTest_device *mig)',
      );
      const out: unknown[] = [null];
      assert.equal(migHandle(handle(api, 0), 0, out), SUCCESS);
      assert.equal(api.getComputeMode(out[0], [0]), NOT_SUPPORTED);
      assert.equal(api.setComputeMode(out[0], COMPUTEMODE_EXCLUSIVE_PROCESS), NOT_SUPPORTED);
    });
  },
);

test(
  'compute mode outlives shutdown/init and the removal ' + 'of its GPU, as on a real node; an unload resets it',
  async () => {
    const fixture = readFixture('dgx1-v100.json');
    const uuid3 = at(fixture.gpus, 3).uuid;
    await withSession(api, 'dgx1-v100.json', () => {
      assert.equal(api.setComputeMode(handle(api, 3), COMPUTEMODE_EXCLUSIVE_PROCESS), SUCCESS);
    });
    await withSession(api, 'dgx1-v100.json', async ({ fifo }) => {
      assert.equal(
        computeMode(api, handle(api, 3)),
        COMPUTEMODE_EXCLUSIVE_PROCESS,
        'kept across nvmlShutdown/nvmlInit',
      );
      assert.equal(computeMode(api, handle(api, 2)), COMPUTEMODE_DEFAULT);
      sendControl(fifo, 'remove 2\n');
      await readStats(fifo);
      const moved = handle(api, 2);
      assert.equal(uuidOf(api, moved), uuid3, 'GPU 3 moved down to index 2');
      assert.equal(computeMode(api, moved), COMPUTEMODE_EXCLUSIVE_PROCESS, 'the mode moves with its GPU');
      sendControl(fifo, 'add all\n');
      await readStats(fifo);
      assert.equal(computeMode(api, handle(api, 3)), COMPUTEMODE_EXCLUSIVE_PROCESS);
      sendControl(fifo, 'unload\n');
      sendControl(fifo, 'load\n');
      await readStats(fifo);
    });
    await withSession(api, 'dgx1-v100.json', () => {
      assert.equal(
        computeMode(api, handle(api, 3)),
        COMPUTEMODE_DEFAULT,
        'a reloaded driver starts in the configured mode',
      );
    });
  },
);

test('compute mode: a caller that is not root gets NO_PERMISSION, as from the real library', {
  skip: process.getuid?.() !== 0 ? 'needs root to run a child as another user' : false,
}, () => {
  // The fake checks geteuid(), so the check is made from a child running as nobody (65534).
  const script = `
    const koffi = require('koffi');
    const lib = koffi.load(process.argv[1]);
    koffi.pointer('D', koffi.opaque('D_st'));
    const init = lib.func('int nvmlInit_v2()');
    const handle = lib.func('int nvmlDeviceGetHandleByIndex_v2(unsigned int i, _Out_ D *d)');
    const get = lib.func('int nvmlDeviceGetComputeMode(D d, _Out_ int *m)');
    const set = lib.func('int nvmlDeviceSetComputeMode(D d, int m)');
    const out = [null], mode = [-1], after = [-1];
    const result = { init: init(), handle: handle(0, out), get: get(out[0], mode) };
    result.mode = mode[0];
    result.set = set(out[0], 3);
    result.getAfter = get(out[0], after);
    result.modeAfter = after[0];
    process.stdout.write(JSON.stringify(result));
  `;
  const child = spawnSync(process.execPath, ['-e', script, path.join(libDirs.current, LIBRARY_NAME)], {
    cwd: repoRoot,
    uid: 65534,
    gid: 65534,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', FAKE_NVML_CONFIG: fixturePath('single.json') },
    encoding: 'utf8',
    timeout: 30_000,
  });
  assert.equal(child.status, 0, `child failed: ${child.stderr}`);
  assert.deepEqual(JSON.parse(child.stdout), {
    init: SUCCESS,
    handle: SUCCESS,
    get: SUCCESS,
    mode: COMPUTEMODE_DEFAULT,
    set: NO_PERMISSION,
    getAfter: SUCCESS,
    modeAfter: COMPUTEMODE_DEFAULT,
  });
});

// ---------------------------------------------------------------------------------------------
// Stats
// ---------------------------------------------------------------------------------------------

test('stats count every exported call since init (failures included, nvmlErrorString excluded)', async () => {
  await withSession(api, 'dgx1-v100.json', async ({ fifo }) => {
    const first = await readStats(fifo);
    assert.equal(first.total, 1);
    assert.equal(first.calls.nvmlInit_v2, 1);
    assert.equal(first.droppedEvents, 0);
    assert.deepEqual(
      Object.keys(first.calls).sort(),
      [...BASE_SYMBOLS, ...NEWER_SYMBOLS].filter((s) => s !== 'nvmlErrorString').sort(),
    );

    sendControl(fifo, 'reset-stats\n');
    const zero = await readStats(fifo);
    assert.equal(zero.total, 0);
    assert.ok(Object.values(zero.calls).every((n) => n === 0));

    const h = handle(api, 0);
    api.uuid(h, Buffer.alloc(96), 96);
    api.uuid(h, Buffer.alloc(96), 3); // INSUFFICIENT_SIZE, still counted
    api.rawUuid(null, Buffer.alloc(96), 96); // INVALID_ARGUMENT, still counted
    api.errorString(2);
    api.errorString(0);
    deviceCount(api);
    api.waitV2(createSet(api), emptyEvent(), 0);
    const stats = await readStats(fifo);
    assert.equal(stats.calls.nvmlDeviceGetHandleByIndex_v2, 1);
    assert.equal(stats.calls.nvmlDeviceGetUUID, 3);
    assert.equal(stats.calls.nvmlDeviceGetCount_v2, 1);
    assert.equal(stats.calls.nvmlEventSetCreate, 1);
    assert.equal(stats.calls.nvmlEventSetWait_v2, 1);
    assert.equal(stats.calls.nvmlErrorString, undefined);
    assert.equal(stats.total, 7);
    assert.equal(
      Object.values(stats.calls).reduce((a, b) => a + b, 0),
      stats.total,
    );

    // Nothing is counted between two stats requests without calls.
    assert.equal((await readStats(fifo)).total, 7);
  });
});

// ---------------------------------------------------------------------------------------------
// Node changes: GPUs removed and added, the driver unloaded and loaded
// ---------------------------------------------------------------------------------------------

function uuidOf(nvml: OldApi, h: bigint): string {
  const buffer = Buffer.alloc(96);
  assert.equal(nvml.uuid(h, buffer, 96), SUCCESS);
  return cString(buffer);
}

function driverVersion(nvml: OldApi): string {
  const buffer = Buffer.alloc(80);
  assert.equal(nvml.driverVersion(buffer, 80), SUCCESS);
  return cString(buffer);
}

test(
  'remove and add a GPU: the count, indices, links, ' + 'topology and events follow; the UUID and handle stay',
  async () => {
    await withSession(api, 'dgx1-v100.json', async ({ fifo, fixture }) => {
      const uuids = fixture.gpus.map((g) => g.uuid);
      const h2before = handle(api, 2);
      const h3before = handle(api, 3);
      const h7before = handle(api, 7);
      const set = createSet(api);
      assert.equal(api.registerEvents(h3before, EVENT_XID, set), SUCCESS);

      sendControl(fifo, 'remove 2\n');
      await readStats(fifo);
      assert.equal(deviceCount(api), 7);
      // The removed GPU's handle answers GPU_IS_LOST, as NVML does for a GPU removed since; the others
      // keep their handles under their new indices.
      const idx = [0];
      assert.equal(api.index(h2before, idx), GPU_IS_LOST);
      assert.equal(api.index(h7before, idx), SUCCESS);
      assert.equal(idx[0], 6);
      assert.deepEqual(
        Array.from({ length: 7 }, (_, i) => uuidOf(api, handle(api, i))),
        uuids.filter((_, i) => i !== 2),
      );
      const h2 = handle(api, 2);
      assert.equal(h2, h3before, 'a GPU keeps its handle when its index moves');
      const index = [0];
      assert.equal(api.index(h2, index), SUCCESS);
      assert.equal(index[0], 2);
      assert.equal(api.handleByUuid(at(fixture.gpus, 2).uuid, [null]), NOT_FOUND);
      assert.equal(api.handleByIndex(7, [null]), INVALID_ARGUMENT);
      // Topology: configured GPUs 0 and 3 are now indices 0 and 2.
      const level = [0];
      assert.equal(api.topology(handle(api, 0), h2, level), SUCCESS);
      assert.equal(level[0], expectedLevel(fixture, 0, 3));
      // GPU 0's second NVLink slot went to the removed GPU 2: inactive now; its third reaches GPU 3.
      const active = [1];
      assert.equal(api.nvlinkState(handle(api, 0), 1, active), SUCCESS);
      assert.equal(active[0], 0);
      const remote = {} as PciInfo;
      assert.equal(api.nvlinkRemotePci(handle(api, 0), 2, remote), SUCCESS);
      assert.equal(remote.busId, pciInfo(api, h2).busId);
      // The event registration moved with GPU 3.
      sendControl(fifo, 'xid 2 31\n');
      const data = emptyEvent();
      assert.equal(await callAsync(api.waitV2, set, data, 5000), SUCCESS);
      assert.equal(data.device, h2);
      assert.equal(data.eventData, 31);

      sendControl(fifo, `add ${uuids[2]}\n`);
      await readStats(fifo);
      assert.equal(deviceCount(api), 8);
      assert.deepEqual(
        Array.from({ length: 8 }, (_, i) => uuidOf(api, handle(api, i))),
        uuids,
      );
      assert.equal(handle(api, 3), h3before);
      assert.equal(api.nvlinkState(handle(api, 0), 1, active), SUCCESS);
      assert.equal(active[0], 1);
      assert.equal(api.eventSetFree(set), SUCCESS);

      sendControl(fifo, 'add GPU-not-removed\nremove 8\nload\n');
      await readStats(fifo);
    });
  },
);

test('a removed GPU stays removed across shutdown and init; the FIFO is read meanwhile', async () => {
  const fifo = path.join(tmpDir, `control-${++sessionCounter}.fifo`);
  process.env.FAKE_NVML_CONFIG = fixturePath('dgx1-v100.json');
  process.env.FAKE_NVML_CONTROL = fifo;
  try {
    assert.equal(api.init(), SUCCESS);
    sendControl(fifo, 'remove 0\n');
    await readStats(fifo);
    assert.equal(api.shutdown(), SUCCESS);
    // Nothing initialised, but a node change is in effect: the control thread still reads.
    await readStats(fifo);
    assert.equal(api.init(), SUCCESS);
    assert.equal(deviceCount(api), 7);
    sendControl(fifo, 'add all\n');
    await readStats(fifo);
    assert.equal(deviceCount(api), 8);
    assert.equal(api.shutdown(), SUCCESS);
    assert.throws(
      () => sendControl(fifo, 'stats /dev/null\n'),
      (e: NodeJS.ErrnoException) => e.code === 'ENXIO',
      'with no change in effect the control thread stops as before',
    );
  } finally {
    delete process.env.FAKE_NVML_CONTROL;
  }
});

test(
  'unload and load the driver: DRIVER_NOT_LOADED everywhere, init ' +
    'fails, then the new version; old sessions answer UNINITIALIZED',
  async () => {
    const fifo = path.join(tmpDir, `control-${++sessionCounter}.fifo`);
    process.env.FAKE_NVML_CONFIG = fixturePath('dgx1-v100.json');
    process.env.FAKE_NVML_CONTROL = fifo;
    try {
      assert.equal(api.init(), SUCCESS);
      const h0 = handle(api, 0);
      const set = createSet(api);
      assert.equal(api.registerEvents(h0, EVENT_XID, set), SUCCESS);
      const waiting = callAsync(api.waitV2, set, emptyEvent(), 30_000);
      await sleep(100);
      sendControl(fifo, 'unload\n');
      assert.equal(await waiting, DRIVER_NOT_LOADED, 'a blocked wait is woken');
      assert.equal(api.count([0]), DRIVER_NOT_LOADED);
      assert.equal(api.uuid(h0, Buffer.alloc(96), 96), DRIVER_NOT_LOADED);
      assert.equal(api.driverVersion(Buffer.alloc(80), 80), DRIVER_NOT_LOADED);
      assert.equal(api.init(), DRIVER_NOT_LOADED, 'init fails while unloaded');
      assert.equal(api.shutdown(), SUCCESS, 'the one open session ends');
      assert.equal(api.shutdown(), UNINITIALIZED);
      assert.equal(api.init(), DRIVER_NOT_LOADED);
      await readStats(fifo);

      sendControl(fifo, 'load 560.28.03\n');
      await readStats(fifo);
      assert.equal(api.init(), SUCCESS);
      assert.equal(driverVersion(api), '560.28.03');
      assert.equal(deviceCount(api), 8);

      // A session that lived through an unload and load answers UNINITIALIZED until it ends.
      sendControl(fifo, 'unload\nload 570.86.10\n');
      await readStats(fifo);
      assert.equal(api.count([0]), UNINITIALIZED);
      assert.equal(api.init(), SUCCESS, 'joins the stale session');
      assert.equal(api.count([0]), UNINITIALIZED);
      assert.equal(api.shutdown(), SUCCESS);
      assert.equal(api.shutdown(), SUCCESS);
      assert.equal(api.init(), SUCCESS);
      assert.equal(driverVersion(api), '570.86.10');
      assert.equal(deviceCount(api), 8);

      sendControl(fifo, 'load 1\nunload\nload\n');
      await readStats(fifo);
      assert.equal(api.count([0]), UNINITIALIZED);
      assert.equal(api.shutdown(), SUCCESS);
      assert.equal(api.init(), SUCCESS);
      assert.equal(driverVersion(api), '550.54.15', "load without a version: the config's");
      assert.equal(api.shutdown(), SUCCESS);
    } finally {
      delete process.env.FAKE_NVML_CONTROL;
    }
  },
);

// ---------------------------------------------------------------------------------------------
// Storm, concurrency, shutdown
// ---------------------------------------------------------------------------------------------

test('a storm of 10 000 commands from 4 concurrent writers: bounded queue drops the oldest', async () => {
  await withSession(api, 'dgx1-v100.json', async ({ fifo }) => {
    const set = createSet(api);
    assert.equal(api.registerEvents(handle(api, 0), EVENT_XID, set), SUCCESS);
    sendControl(fifo, 'reset-stats\n');
    await readStats(fifo);

    const writers = 4;
    const perWriter = 2500;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: writers }, async (_, w) => {
        const fh = await fs.promises.open(fifo, 'w');
        try {
          // Chunks of whole lines below PIPE_BUF (4096), so each write is atomic.
          let chunk = '';
          for (let k = 0; k < perWriter; k++) {
            const line = `xid 0 ${w * 100_000 + k}\n`;
            if (chunk.length + line.length > 4000) {
              await fh.write(chunk);
              chunk = '';
            }
            chunk += line;
          }
          if (chunk) await fh.write(chunk);
        } finally {
          await fh.close();
        }
      }),
    );
    const stats = await readStats(fifo);
    const seconds = (performance.now() - started) / 1000;
    assert.equal(stats.droppedEvents, writers * perWriter - 4096, 'only the newest 4096 events are kept');
    assert.ok(seconds < 20, `10 000 commands took ${seconds} s`);

    const received: number[] = [];
    for (;;) {
      const data = emptyEvent();
      const r = api.waitV2(set, data, 0);
      if (r === TIMEOUT) break;
      assert.equal(r, SUCCESS);
      received.push(data.eventData);
    }
    assert.equal(received.length, 4096);
    // Per writer, order is kept and what survived is the newest part of its sequence.
    let survivors = 0;
    for (let w = 0; w < writers; w++) {
      const mine = received.filter((v) => Math.floor(v / 100_000) === w).map((v) => v % 100_000);
      survivors += mine.length;
      for (const [i, v] of mine.entries()) {
        assert.equal(v, perWriter - mine.length + i, `writer ${w} keeps its newest events in order`);
      }
    }
    assert.equal(survivors, 4096);
    assert.equal(api.eventSetFree(set), SUCCESS);
  });
});

test('thread safety: two blocked waiters, async calls on worker threads and injected events at once', async () => {
  await withSession(api, 'dgx1-v100.json', async ({ fifo, fixture }) => {
    const handles = fixture.gpus.map((_, i) => handle(api, i));
    const sets = [createSet(api), createSet(api)];
    for (const set of sets) {
      for (const h of handles) assert.equal(api.registerEvents(h, EVENT_XID, set), SUCCESS);
    }
    const total = 300;
    const consume = async (set: bigint) => {
      const values: number[] = [];
      while (values.length < total) {
        const data = emptyEvent();
        const r = await callAsync(api.waitV2, set, data, 10_000);
        assert.equal(r, SUCCESS);
        assert.equal(data.device, null);
        values.push(data.eventData);
      }
      return values;
    };
    const consumers = sets.map((set) => consume(set));

    const checks: Promise<void>[] = [];
    for (let batch = 0; batch < total / 50; batch++) {
      let text = '';
      for (let k = 0; k < 50; k++) text += `xid all ${batch * 50 + k + 1}\n`;
      sendControl(fifo, text);
      for (let i = 0; i < 20; i++) {
        const g = (batch * 20 + i) % 8;
        const uuid = Buffer.alloc(96);
        checks.push(
          callAsync(api.uuid, at(handles, g), uuid, 96).then((r) => {
            assert.equal(r, SUCCESS);
            assert.equal(cString(uuid), at(fixture.gpus, g).uuid);
          }),
        );
        const pci = {};
        assert.equal(api.pciInfo(at(handles, g), pci), SUCCESS);
        assert.equal((pci as PciInfo).busId, at(fixture.gpus, g).busId);
      }
      await sleep(5);
    }
    await Promise.all(checks);
    const expected = Array.from({ length: total }, (_, i) => i + 1);
    for (const values of await Promise.all(consumers)) assert.deepEqual(values, expected);
    for (const set of sets) assert.equal(api.eventSetFree(set), SUCCESS);
  });
});

test('nvmlEventSetFree wakes a thread blocked on that set', async () => {
  await withSession(api, 'dgx1-v100.json', async () => {
    const set = createSet(api);
    assert.equal(api.registerEvents(handle(api, 0), EVENT_XID, set), SUCCESS);
    const waiting = callAsync(api.waitV2, set, emptyEvent(), 20_000);
    await sleep(150);
    const started = performance.now();
    assert.equal(api.eventSetFree(set), SUCCESS);
    assert.equal(await waiting, INVALID_ARGUMENT);
    assert.ok(performance.now() - started < 2000);
    assert.equal(api.waitV2(set, emptyEvent(), 0), INVALID_ARGUMENT, 'the set is gone');
  });
});

test('the last nvmlShutdown wakes waiters, stops the control thread promptly and keeps the FIFO', async () => {
  const fifoPath = path.join(tmpDir, 'shutdown.fifo');
  process.env.FAKE_NVML_CONFIG = fixturePath('dgx1-v100.json');
  process.env.FAKE_NVML_CONTROL = fifoPath;
  assert.equal(api.init(), SUCCESS);
  assert.equal(api.init(), SUCCESS);
  const set = createSet(api);
  assert.equal(api.registerEvents(handle(api, 0), EVENT_XID, set), SUCCESS);
  const waiting = callAsync(api.waitV2, set, emptyEvent(), 30_000);
  await sleep(150);
  assert.equal(api.shutdown(), SUCCESS, 'first of two shutdowns');
  // Not the last one: the control thread still answers, and the waiter still waits.
  const stats = await readStats(fifoPath);
  assert.equal(stats.calls.nvmlShutdown, 1);
  assert.equal(stats.calls.nvmlEventSetWait_v2, 1);
  const started = performance.now();
  assert.equal(api.shutdown(), SUCCESS);
  const shutdownMs = performance.now() - started;
  delete process.env.FAKE_NVML_CONTROL;

  assert.equal(await waiting, UNINITIALIZED, 'the blocked waiter is woken by the last shutdown');
  assert.equal(api.waitV2(set, emptyEvent(), 0), UNINITIALIZED);
  assert.ok(shutdownMs < 1000, `shutdown took ${shutdownMs} ms`);
  assert.ok(fs.statSync(fifoPath).isFIFO(), 'the FIFO is left in place');
  assert.throws(
    () => fs.openSync(fifoPath, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK),
    (error: NodeJS.ErrnoException) => error.code === 'ENXIO',
    'nobody reads the FIFO any more',
  );

  // An existing FIFO is reused at the next init.
  process.env.FAKE_NVML_CONTROL = fifoPath;
  assert.equal(api.init(), SUCCESS);
  try {
    const stats = await readStats(fifoPath);
    assert.equal(stats.calls.nvmlInit_v2, 1);
  } finally {
    assert.equal(api.shutdown(), SUCCESS);
    delete process.env.FAKE_NVML_CONTROL;
  }
});

test('a shutdown while a wait is blocked answers that wait UNINITIALIZED', async () => {
  delete process.env.FAKE_NVML_CONTROL;
  process.env.FAKE_NVML_CONFIG = fixturePath('dgx1-v100.json');
  assert.equal(api.init(), SUCCESS);
  const set = createSet(api);
  assert.equal(api.registerEvents(handle(api, 0), EVENT_XID, set), SUCCESS);
  const waiting = callAsync(api.waitV2, set, emptyEvent(), 30_000);
  await sleep(150);
  const started = performance.now();
  assert.equal(api.shutdown(), SUCCESS);
  assert.equal(await waiting, UNINITIALIZED);
  assert.ok(performance.now() - started < 1000);
});

// ---------------------------------------------------------------------------------------------
// Old driver variant
// ---------------------------------------------------------------------------------------------

test('old driver variant: v1 wait and v1 remote PCI info work; v1 wait writes only the pre-MIG fields', async () => {
  await withSession(oldApi, 'dgx1-v100.json', async ({ fifo, fixture }) => {
    const h0 = handle(oldApi, 0);
    const h1 = handle(oldApi, 1);
    const set = createSet(oldApi);
    assert.equal(oldApi.registerEvents(h1, EVENT_XID, set), SUCCESS);
    sendControl(fifo, 'xid 1 94\n');
    const stats = await readStats(fifo);
    assert.equal(stats.calls.nvmlEventSetWait_v2, undefined);
    assert.equal(stats.calls.nvmlEventSetWait, 0);

    const data: EventData = { device: null, eventType: 0, eventData: 0, gpuInstanceId: 7, computeInstanceId: 9 };
    assert.equal(oldApi.waitV1(set, data, 1000), SUCCESS);
    assert.deepEqual(data, { device: h1, eventType: EVENT_XID, eventData: 94, gpuInstanceId: 7, computeInstanceId: 9 });
    assert.equal(oldApi.waitV1(set, data, 0), TIMEOUT);

    // dgx1 nvlinks[0] is [0, 1, 1]: GPU 0's first slot reaches GPU 1.
    const pci = {};
    assert.equal(oldApi.nvlinkRemotePciV1(h0, 0, pci), SUCCESS);
    assert.equal((pci as PciInfo).busId, at(fixture.gpus, 1).busId);
    assert.equal(oldApi.eventSetFree(set), SUCCESS);
  });
});

test('the two variants keep separate state in one process', async () => {
  await withSession(api, 'nvswitch-16.json', async () => {
    await withSession(oldApi, 'single.json', () => {
      assert.equal(deviceCount(api), 16);
      assert.equal(deviceCount(oldApi), 1);
    });
    assert.equal(deviceCount(api), 16);
    assert.equal(oldApi.count([0]), UNINITIALIZED);
  });
});

test('loads by soname through LD_LIBRARY_PATH, as the plugin loads the real library', () => {
  const script = `
    import koffi from 'koffi';
    const lib = koffi.load('libnvidia-ml.so.1');
    const count = [0];
    const out = { init: lib.func('int nvmlInit_v2()')() };
    out.count = lib.func('int nvmlDeviceGetCount_v2(_Out_ unsigned int *n)')(count);
    out.devices = count[0];
    try {
      lib.func('int nvmlEventSetWait_v2(void *s, void *d, unsigned int t)');
      out.waitV2 = true;
    } catch {
      out.waitV2 = false;
    }
    out.shutdown = lib.func('int nvmlShutdown()')();
    process.stdout.write(JSON.stringify(out));
  `;
  for (const [dir, waitV2] of [
    [libDirs.current, true],
    [libDirs.old, false],
  ] as const) {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      LD_LIBRARY_PATH: dir,
      FAKE_NVML_CONFIG: fixturePath('nvswitch-8.json'),
    };
    delete env.FAKE_NVML_CONTROL;
    const output = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
      cwd: repoRoot,
      env,
      encoding: 'utf8',
    });
    assert.deepEqual(JSON.parse(output), { init: SUCCESS, count: SUCCESS, devices: 8, waitV2, shutdown: SUCCESS });
  }
});

// ---------------------------------------------------------------------------------------------
// Config validation and control-command errors (stderr is checked in a child process)
// ---------------------------------------------------------------------------------------------

const CHILD_SCRIPT = `
import koffi from 'koffi';
import fs from 'node:fs';
const plan = JSON.parse(process.env.FAKE_TEST_PLAN);
const lib = koffi.load(plan.lib);
const init = lib.func('int nvmlInit_v2()');
const shutdown = lib.func('int nvmlShutdown()');
const pause = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
const results = [];
for (const c of plan.cases) {
  if (c.config === null) delete process.env.FAKE_NVML_CONFIG; else process.env.FAKE_NVML_CONFIG = c.config;
  if (c.control) process.env.FAKE_NVML_CONTROL = c.control; else delete process.env.FAKE_NVML_CONTROL;
  const result = { init: init() };
  if (result.init === 0 && c.commands) {
    const done = c.control + '.done';
    const fd = fs.openSync(c.control, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
    fs.writeSync(fd, c.commands.map((line) => line + '\\n').join('') + 'stats ' + done + '\\n');
    fs.closeSync(fd);
    const deadline = Date.now() + 10000;
    while (!fs.existsSync(done) && Date.now() < deadline) pause(5);
    result.done = fs.existsSync(done);
  }
  if (result.init === 0) result.shutdown = shutdown();
  results.push(result);
  process.stderr.write('=== end of case\\n');
}
process.stdout.write(JSON.stringify(results));
`;

test(
  'invalid configs fail init with UNKNOWN and one stderr ' +
    'line naming the key; bad commands are reported and ignored',
  () => {
    const gpu = (i: number, extra: Record<string, unknown> = {}) => ({
      uuid: `GPU-cccccccc-0000-0000-0000-00000000000${i}`,
      name: 'NVIDIA A100-SXM4-80GB',
      busId: `00000000:0${i}:00.0`,
      ...extra,
    });
    const regularFile = writeConfig('not-a-fifo', 'plain file');
    type Case = {
      config: string | null;
      control?: string;
      commands?: string[];
      init: number;
      stderr: string[];
    };
    const cases: Case[] = [
      { config: null, init: DRIVER_NOT_LOADED, stderr: [] },
      { config: path.join(tmpDir, 'missing.json'), init: DRIVER_NOT_LOADED, stderr: ['cannot read FAKE_NVML_CONFIG'] },
      {
        config: writeConfig('bad1.json', '{"gpus": [}'),
        init: UNKNOWN,
        stderr: ['malformed JSON at line 1 column 11'],
      },
      {
        config: writeConfig('bad2.json', '{"gpus": []} x'),
        init: UNKNOWN,
        stderr: ['unexpected data after the JSON value'],
      },
      { config: writeConfig('bad3.json', '{"gpus": [], "gpus": []}'), init: UNKNOWN, stderr: ['duplicate key "gpus"'] },
      {
        config: writeConfig('bad4.json', '{\n  "gpus": [\n    {"uuid": "GPU-\\q"}]}'),
        init: UNKNOWN,
        stderr: ['line 3 column'],
      },
      { config: writeConfig('bad5.json', '[]'), init: UNKNOWN, stderr: ['(top level): expected an object'] },
      {
        config: writeConfig('dup-uuid.json', { gpus: [gpu(1), gpu(2, { uuid: gpu(1).uuid })] }),
        init: UNKNOWN,
        stderr: ['gpus[1].uuid: duplicate UUID'],
      },
      {
        config: writeConfig('dup-bus.json', {
          gpus: [gpu(1, { busId: '00000000:0a:00.0' }), gpu(2, { busId: '00000000:0A:00.0' })],
        }),
        init: UNKNOWN,
        stderr: ['gpus[1].busId: duplicate bus id'],
      },
      {
        config: writeConfig('bad-bus.json', { gpus: [gpu(1, { busId: '0000:07:00.0' })] }),
        init: UNKNOWN,
        stderr: ['gpus[0].busId: bad bus id "0000:07:00.0"'],
      },
      {
        config: writeConfig('bad-bus2.json', { gpus: [gpu(1), gpu(2, { busId: '00000000:07:00.9' })] }),
        init: UNKNOWN,
        stderr: ['gpus[1].busId: bad bus id'],
      },
      {
        config: writeConfig('nvlink-range.json', { gpus: [gpu(1), gpu(2)], nvlinks: [[0, 5, 1]] }),
        init: UNKNOWN,
        stderr: ['nvlinks[0]: GPU index out of range'],
      },
      {
        config: writeConfig('pcie-range.json', {
          gpus: [gpu(1), gpu(2)],
          pcie: [
            [0, 1, 10],
            [2, 0, 10],
          ],
        }),
        init: UNKNOWN,
        stderr: ['pcie[1]: GPU index out of range'],
      },
      {
        config: writeConfig('pcie-level.json', { gpus: [gpu(1), gpu(2)], pcie: [[0, 1, 25]] }),
        init: UNKNOWN,
        stderr: ['pcie[0]: level 25'],
      },
      {
        config: writeConfig('switch-range.json', {
          gpus: [gpu(1)],
          nvswitches: [
            {
              busId: '00000000:C1:00.0',
              links: [
                [0, 2],
                [3, 2],
              ],
            },
          ],
        }),
        init: UNKNOWN,
        stderr: ['nvswitches[0].links[1]: GPU index out of range'],
      },
      {
        config: writeConfig('switch-bus.json', { gpus: [gpu(1)], nvswitches: [{ busId: gpu(1).busId, links: [] }] }),
        init: UNKNOWN,
        stderr: ['nvswitches[0].busId: duplicate bus id'],
      },
      {
        config: writeConfig('too-many-links.json', { linkCount: 2, gpus: [gpu(1), gpu(2)], nvlinks: [[0, 1, 3]] }),
        init: UNKNOWN,
        stderr: ['nvlinks[0]: GPU 0 would have 3 NVLinks, more than linkCount (2)'],
      },
      {
        config: writeConfig('unknown-key.json', { gpus: [gpu(1, { numa: 0 })] }),
        init: UNKNOWN,
        stderr: ['gpus[0]: unknown key "numa"'],
      },
      {
        config: writeConfig('bad-type.json', { gpus: [gpu(1, { memoryMiB: '80GB' })] }),
        init: UNKNOWN,
        stderr: ['gpus[0].memoryMiB: expected an integer, got string'],
      },
      {
        config: writeConfig('bad-event.json', { gpus: [gpu(1, { events: ['xid', 'pstate'] })] }),
        init: UNKNOWN,
        stderr: ['gpus[0].events[1]'],
      },
      {
        config: writeConfig('newline-key.json', '{"gpus": [], "a\\nb\\u0007": 1}'),
        init: UNKNOWN,
        stderr: ['(top level): unknown key "a?b?"'],
      },
      {
        config: writeConfig('compute-mode-thread.json', { gpus: [gpu(1, { computeMode: 1 })] }),
        init: UNKNOWN,
        stderr: ['gpus[0].computeMode: 1 (EXCLUSIVE_THREAD) is no longer supported'],
      },
      {
        config: writeConfig('compute-mode-range.json', { gpus: [gpu(1), gpu(2, { computeMode: 4 })] }),
        init: UNKNOWN,
        stderr: ['gpus[1].computeMode: 4 is out of range [0, 3]'],
      },
      {
        config: writeConfig('no-gpus.json', { driverVersion: '550.54.15' }),
        init: UNKNOWN,
        stderr: ['gpus: missing'],
      },
      {
        config: fixturePath('dgx1-v100.json'),
        control: regularFile,
        init: UNKNOWN,
        stderr: ['is not a FIFO'],
      },
      {
        config: fixturePath('dgx1-v100.json'),
        control: path.join(tmpDir, 'child-control.fifo'),
        commands: [
          'xid 0',
          'xid 9 43',
          'xid 0 abc',
          'frobnicate 1',
          'lost all',
          'stats',
          'reset-stats now',
          '',
          '# a comment',
          '  sbe 0  ',
          'back 0',
          'compute-mode 0 1',
          'compute-mode 0',
        ],
        init: SUCCESS,
        stderr: [
          'control: usage: xid <index|all> <n> [<gi> <ci>]: "xid 0"',
          'control: GPU index out of range: "xid 9 43"',
          'control: XID must be a number: "xid 0 abc"',
          'control: unknown command: "frobnicate 1"',
          'control: GPU index must be a number: "lost all"',
          'control: missing stats path: "stats"',
          'control: reset-stats takes no argument: "reset-stats now"',
          'control: compute mode must be 0 (DEFAULT), 2 (PROHIBITED) or 3 (EXCLUSIVE_PROCESS): "compute-mode 0 1"',
          'control: usage: compute-mode <index> <0|2|3>: "compute-mode 0"',
        ],
      },
    ];
    const plan = {
      lib: path.join(libDirs.current, LIBRARY_NAME),
      cases: cases.map(({ config, control, commands }) => ({ config, control, commands })),
    };
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', CHILD_SCRIPT], {
      cwd: repoRoot,
      env: { ...process.env, FAKE_TEST_PLAN: JSON.stringify(plan) },
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(child.status, 0, `child failed: ${child.stderr}`);
    const results = JSON.parse(child.stdout) as { init: number; done?: boolean; shutdown?: number }[];
    const stderrBlocks = child.stderr.split('=== end of case\n');
    assert.equal(stderrBlocks.pop(), '', 'nothing after the last case');
    assert.equal(results.length, cases.length);
    cases.forEach((c, i) => {
      const result = at(results, i);
      const lines = at(stderrBlocks, i)
        .split('\n')
        .filter((line) => line !== '');
      const label = `case ${i} (${c.config === null ? 'no config' : path.basename(c.config)})`;
      assert.equal(result.init, c.init, label);
      assert.equal(lines.length, c.stderr.length, `${label}: stderr was ${JSON.stringify(lines)}`);
      c.stderr.forEach((expected, k) => {
        const line = at(lines, k);
        assert.ok(line.startsWith('fake-nvml: '), line);
        assert.ok(
          line.includes(expected),
          `${label}: ${JSON.stringify(line)} should include ${JSON.stringify(expected)}`,
        );
      });
      if (c.commands) {
        assert.equal(result.done, true, 'commands after the bad ones still ran');
        assert.equal(result.shutdown, SUCCESS);
      }
    });
  },
);

test('every fixture is well formed and loads (init-fails.json fails as designed)', async () => {
  for (const name of FIXTURES) {
    const fixture = readFixture(name);
    process.env.FAKE_NVML_CONFIG = fixturePath(name);
    delete process.env.FAKE_NVML_CONTROL;
    const r = api.init();
    if (name === 'init-fails.json') {
      assert.equal(r, DRIVER_NOT_LOADED);
      continue;
    }
    assert.equal(r, SUCCESS, name);
    try {
      assert.equal(deviceCount(api), fixture.gpus.length, name);
      for (const [i, gpu] of fixture.gpus.entries()) {
        assert.match(gpu.uuid, /^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
        const buffer = Buffer.alloc(96);
        assert.equal(api.name(handle(api, i), buffer, 96), SUCCESS);
        assert.equal(cString(buffer), gpu.name);
      }
    } finally {
      assert.equal(api.shutdown(), SUCCESS);
    }
  }
  // The documented shapes.
  assert.equal(readFixture('nvswitch-16.json').gpus.length, 16);
  assert.equal(readFixture('single.json').gpus[0]?.numaNode, undefined);
  assert.deepEqual(readFixture('single.json').gpus[0]?.events, []);
  assert.equal(readFixture('init-fails.json').initError, 9);
  assert.deepEqual(readFixture('demo-8.json').nvlinks, readFixture('dgx1-v100.json').nvlinks);
  assert.equal(EventDataType.size, 32, 'nvmlEventData_t is 32 bytes');
});
