// Health signals beyond XIDs end to end: the built executable with the fake NVML, states set and
// cleared through its control FIFO (`health <i> key=value…`), seen where the kubelet sees them — the
// device list of ListAndWatch (whole GPUs, time-sliced replicas, MIG devices) and in DRA mode the
// ResourceSlice's taints and the health stream. A state with an event behind it (recovery action,
// row remap, retired pages) is read at once; one without (ECC, NVLink, PCIe, clocks) at the next
// probe (here every second). The time each took to arrive is printed as a test diagnostic: the
// tests wait on what arrives, never on a clock window.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import type { TestContext } from 'node:test';
import type { DeviceHealth } from '../../src/api/dra.ts';
import { HealthStatus } from '../../src/api/dra.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { PluginWatcherStandIn } from '../support/plugin-watcher.ts';
import { DRIVER, NODE, RBAC, TOKEN } from '../support/dra-node.ts';
import { SimNode, executable } from '../support/sim.ts';

const TOPOLOGIES = join(import.meta.dirname, '..', 'fixtures', 'topologies');
const ALL_EVENTS = ['xid', 'dbe', 'sbe', 'retirement', 'retirement-failure', 'recovery-action'];
const PROBE = ['--health-probe-interval=1'];

/** A topology fixture made from one of test/fixtures/topologies, each GPU changed by `patch`, in `dir`. */
function fixture(dir: string, base: string, patch: (g: Record<string, unknown>, i: number) => void): string {
  const topo = JSON.parse(readFileSync(join(TOPOLOGIES, `${base}.json`), 'utf8')) as {
    gpus: Record<string, unknown>[];
  };
  for (const [i, g] of topo.gpus.entries()) patch(g, i);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `${base}-signals.json`);
  writeFileSync(path, JSON.stringify(topo));
  return path;
}

let fixtures = 0;
function fixtureDir(): string {
  return join(import.meta.dirname, '..', '..', '.cache', 'health-signals-fixtures', `${process.pid}-${fixtures++}`);
}

const withEvents = (g: Record<string, unknown>): void => {
  g.events = ALL_EVENTS;
};

/** Health as one letter a device, in list order. */
const letters = (devices: readonly { health: string }[]): string =>
  devices.map((d) => (d.health === 'Healthy' ? 'H' : 'U')).join('');

/** Sends a FIFO command, waits until `pred` holds for the device list; returns the milliseconds it took. */
async function until(
  node: SimNode,
  command: string,
  pred: (d: { ID: string; health: string }[]) => boolean,
  resource = 'nvidia.com/gpu',
): Promise<number> {
  const t0 = performance.now();
  node.nvml(command);
  await node.kubelet!.waitForDevices(pred, resource, 10_000);
  return performance.now() - t0;
}

const ms = (x: number): string => `${x.toFixed(0)} ms`;

type SignalView = { signal: string; status: string; class: string };

/**
 * A GPU's signals in the daemon's state file, once they satisfy pred (the file is written after the kubelet is told).
 */
async function stateOfGpu(node: SimNode, gpu: number, pred: (s: SignalView[]) => boolean): Promise<SignalView[]> {
  const deadline = performance.now() + 5000;
  for (;;) {
    let signals: SignalView[] | undefined;
    try {
      const state = JSON.parse(readFileSync(node.stateFile, 'utf8')) as {
        signals?: { index: number; signals: SignalView[] }[];
      };
      signals = state.signals?.find((g) => g.index === gpu)?.signals;
    } catch {
      // Not written yet, or being replaced.
    }
    if (signals !== undefined && pred(signals)) return signals;
    if (performance.now() > deadline)
      throw new Error(`state file: GPU ${gpu}'s signals are ${JSON.stringify(signals)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('health signals through the device-plugin API', () => {
  test(
    'whole GPUs: each critical signal makes its GPU ' + 'Unhealthy and clears; warnings change no health',
    async (t: TestContext) => {
      const topo = fixture(fixtureDir(), 'demo-8', withEvents);
      const node = await SimNode.start({ topology: topo, args: PROBE });
      try {
        const k = node.kubelet!;
        await node.plugin.waitForLine(/watching GPU health/, 10_000);
        await k.waitForDevices((d) => d.length === 8 && letters(d) === 'HHHHHHHH');
        // Every device list the kubelet gets from here on: GPU 6 (warnings only) must stay Healthy in each.
        const gpu6Changes: string[] = [];
        k.on('devices', (resource: string, d: { health: string }[] | undefined) => {
          if (resource === 'nvidia.com/gpu' && d?.[6]?.health !== 'Healthy') gpu6Changes.push(letters(d ?? []));
        });
        const times: string[] = [];
        const cases: [string, number, string, string, string][] = [
          // [signal, gpu, set, clear, taken with]
          ['recovery-action', 1, 'recovery-action=1', 'recovery-action=0', 'event'],
          ['retired-pages', 2, 'retired-pending=1', 'retired-pending=0', 'event'],
          ['ecc-uncorrectable', 3, 'ecc-volatile=2', 'ecc-volatile=0', 'probe'],
          ['nvlink', 4, 'nvlink-down=0', 'nvlink-down=none', 'probe'],
        ];
        for (const [signal, gpu, set, clear, how] of cases) {
          const bad = await until(node, `health ${gpu} ${set}`, (d) => d[gpu]?.health === 'Unhealthy');
          assert.equal(letters(k.devices() ?? []), `${'H'.repeat(gpu)}U${'H'.repeat(7 - gpu)}`);
          const line = await node.plugin.waitForLine(new RegExp(`GPU health signal bad gpu=${gpu} .*signal=${signal}`));
          assert.match(line, new RegExp(`uuid=${node.topology.gpus[gpu]!.uuid}`));
          assert.match(line, /action=/);
          const back = await until(node, `health ${gpu} ${clear}`, (d) => letters(d) === 'HHHHHHHH');
          await node.plugin.waitForLine(new RegExp(`GPU health signal cleared gpu=${gpu} .*signal=${signal}`));
          times.push(`${signal} (${how}): bad ${ms(bad)}, cleared ${ms(back)}`);
        }
        // The retired-page limit needs a repair: its reason says so.
        await until(node, 'health 5 retired-sbe=40 retired-dbe=30', (d) => d[5]?.health === 'Unhealthy');
        const limit = await node.plugin.waitForLine(/GPU health signal bad gpu=5 .*signal=retired-pages/);
        assert.match(limit, /repair/);
        assert.match(limit, /does not clear by itself/);
        // Warnings: logged, no health change. A critical signal sent after them on GPU 7 (read with the
        // same probe or after it) shows the warnings were read too.
        const warnings = ['pcie-width', 'clocks', 'pcie-replay'];
        let t0 = performance.now();
        node.nvml('health 6 pcie-width=8');
        node.nvml('health 6 clocks=0x40');
        node.nvml('health 6 pcie-replays=100');
        const warned = new Map<string, number>();
        for (const signal of warnings) {
          const line = await node.plugin.waitForLine(
            new RegExp(`WARN GPU health signal bad gpu=6 .*signal=${signal} `),
          );
          warned.set(signal, node.plugin.lines.indexOf(line));
        }
        times.push(`warnings (probe): logged ${ms(performance.now() - t0)}`);
        await until(node, 'health 7 ecc-volatile=1', (d) => d[7]?.health === 'Unhealthy');
        assert.equal(letters(k.devices() ?? []), 'HHHHHUHU', 'warnings on GPU 6 leave it Healthy');
        // The state file (what `info` shows) carries each GPU's signals: wait for the plugin to write it.
        const g6 = await stateOfGpu(node, 6, (s) => s.filter((x) => x.status === 'bad').length === 3);
        assert.deepEqual(
          g6?.filter((s) => s.status === 'bad').map((s) => [s.signal, s.class]),
          [
            ['pcie-width', 'warn'],
            ['pcie-replay', 'warn'],
            ['clocks', 'warn'],
          ],
        );
        // The warnings clear: each WARN line is followed by its "cleared" line.
        t0 = performance.now();
        node.nvml('health 6 pcie-width=16 clocks=0 pcie-replays=0');
        for (const signal of warnings)
          await node.plugin.waitForLine(
            new RegExp(`INFO GPU health signal cleared gpu=6 .*signal=${signal} `),
            10_000,
            (warned.get(signal) ?? 0) + 1,
          );
        times.push(`warnings (probe): cleared ${ms(performance.now() - t0)}`);
        await stateOfGpu(node, 6, (s) => s.every((x) => x.status !== 'bad'));
        // GPU 7's ECC cleared after them: its update comes after anything the clearing on GPU 6 sent.
        await until(node, 'health 7 ecc-volatile=0', (d) => letters(d) === 'HHHHHUHH');
        assert.deepEqual(gpu6Changes, [], 'GPU 6 stayed Healthy in every device list while its warnings came and went');
        t.diagnostic(`signal → kubelet (probe every 1 s): ${times.join('; ')}`);
      } finally {
        await node.stop();
      }
    },
  );

  test('a time-sliced GPU: every replica follows its GPU (row remap pending, then failed)', async (t: TestContext) => {
    const dir = fixtureDir();
    const topo = fixture(dir, 'demo-8', (g) => {
      withEvents(g);
      g.name = 'NVIDIA A100-SXM4-80GB';
    });
    const config = join(dir, 'config.yaml');
    writeFileSync(
      config,
      'version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n',
    );
    const node = await SimNode.start({ topology: topo, args: [...PROBE, `--config-file=${config}`] });
    try {
      const k = node.kubelet!;
      await node.plugin.waitForLine(/watching GPU health/, 10_000);
      await k.waitForDevices((d) => d.length === 16 && d.every((x) => x.health === 'Healthy'));
      const uuid = node.topology.gpus[2]!.uuid;
      const ofGpu = <T extends { ID: string }>(d: T[]) => d.filter((x) => x.ID.startsWith(uuid));
      const bad = await until(node, 'health 2 remap-pending=1', (d) => ofGpu(d).every((x) => x.health === 'Unhealthy'));
      const devices = k.devices() ?? [];
      assert.equal(ofGpu(devices).length, 2);
      assert.equal(devices.filter((x) => x.health === 'Unhealthy').length, 2, 'only the replicas of GPU 2');
      const back = await until(node, 'health 2 remap-pending=0', (d) => d.every((x) => x.health === 'Healthy'));
      await until(node, 'health 2 remap-failure=1', (d) => ofGpu(d).every((x) => x.health === 'Unhealthy'));
      const failed = await node.plugin.waitForLine(/GPU health signal bad gpu=2 .*signal=row-remap .*value="?failed/);
      assert.match(failed, /repair/);
      t.diagnostic(`row remap (event) → replicas Unhealthy ${ms(bad)}; cleared → Healthy ${ms(back)}`);
    } finally {
      await node.stop();
    }
  });

  test('a MIG GPU: its MIG devices follow it (recovery action by event, ECC by probe)', async (t: TestContext) => {
    const topo = fixture(fixtureDir(), 'mig-uniform-2', withEvents);
    const node = await SimNode.start({ topology: topo, args: [...PROBE, '--mig-strategy=single'] });
    try {
      const k = node.kubelet!;
      await node.plugin.waitForLine(/watching GPU health/, 10_000);
      await k.waitForDevices((d) => d.length === 4 && d.every((x) => x.health === 'Healthy'));
      const two = (d: { health: string }[]) => d.filter((x) => x.health === 'Unhealthy').length === 2;
      const bad = await until(node, 'health 0 recovery-action=4', two);
      const back = await until(node, 'health 0 recovery-action=0', (d) => d.every((x) => x.health === 'Healthy'));
      const badProbe = await until(node, 'health 1 ecc-volatile=3', two);
      const backProbe = await until(node, 'health 1 reset', (d) => d.every((x) => x.health === 'Healthy'));
      t.diagnostic(
        `MIG: recovery action (event) bad ${ms(bad)}, cleared ${ms(back)}; ` +
          `ECC (probe) bad ${ms(badProbe)}, reset ${ms(backProbe)}`,
      );
    } finally {
      await node.stop();
    }
  });

  test('an old driver without the calls raises no alarm and says "not available" once, at INFO', async () => {
    const node = await SimNode.start({ topology: 'demo-8', nvml: 'old', args: PROBE });
    try {
      await node.plugin.waitForLine(/watching GPU health/, 10_000);
      const first = await node.plugin.waitForLine(/INFO GPU health signal not available on this GPU gpu=0 /);
      assert.match(first, /signal=/);
      // Two more probe rounds: each signal of GPU 0 was said to be not available once, never again.
      const probes = async (): Promise<number> => (await node.nvmlStats()).calls.nvmlDeviceGetMemoryInfo ?? 0;
      const target = (await probes()) + 2 * node.topology.gpus.length;
      while ((await probes()) < target);
      const said = node.plugin.lines
        .filter((l) => /not available on this GPU gpu=0 /.test(l))
        .map((l) => /signal=(\S+)/.exec(l)?.[1]);
      assert.ok(said.length > 0);
      assert.deepEqual(said, [...new Set(said)], 'each signal once');
      assert.ok(!node.plugin.lines.some((l) => /GPU health signal bad/.test(l)));
      assert.equal(letters(node.kubelet!.devices() ?? []), 'HHHHHHHH');
    } finally {
      await node.stop();
    }
  });
});

describe('the health section and the environment', () => {
  const run = (args: string[], env: Record<string, string> = {}): Promise<{ code: number; out: string }> =>
    new Promise((resolve) => {
      execFile(executable(), args, { env: { PATH: '/nonexistent', ...env }, timeout: 30_000 }, (err, stdout, stderr) =>
        resolve({ code: err === null ? 0 : Number((err as { code?: number }).code ?? -1), out: `${stdout}${stderr}` }),
      );
    });

  test('a bad health section is refused naming the key, by the daemon and by check', async () => {
    const dir = fixtureDir();
    mkdirSync(dir, { recursive: true });
    const cases: [string, RegExp][] = [
      ['health:\n  signals:\n    nvlinks: critical\n', /health\.signals\.nvlinks: unknown signal/],
      ['health:\n  signals:\n    clocks: loud\n', /health\.signals\.clocks: "loud" is not allowed/],
      ['health:\n  pcieReplaysPerMinute: -1\n', /health\.pcieReplaysPerMinute: -1 is not allowed/],
      ['health:\n  sginals: {}\n', /health\.sginals: unknown key/],
    ];
    for (const [text, why] of cases) {
      const file = join(dir, 'config.yaml');
      writeFileSync(file, `version: v1\n${text}`);
      const daemon = await run([`--config-file=${file}`, '--kubelet-socket', join(dir, 'none.sock')]);
      assert.notEqual(daemon.code, 0);
      assert.match(daemon.out, why);
      const check = await run(['check', `--config-file=${file}`]);
      assert.notEqual(check.code, 0);
      assert.match(check.out, why);
    }
  });

  test('bad signal names in DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS are refused naming them', async () => {
    const off = await run([], { DP_DISABLE_HEALTHCHECKS: 'nvlink,pcie-widht' });
    assert.notEqual(off.code, 0);
    assert.match(off.out, /DP_DISABLE_HEALTHCHECKS: "pcie-widht"/);
    const on = await run([], { DP_ENABLE_HEALTHCHECKS: 'recovery' });
    assert.notEqual(on.code, 0);
    assert.match(on.out, /DP_ENABLE_HEALTHCHECKS: "recovery"/);
  });

  test(
    'the config file turns a signal off, the environment ' + 'turns one off, and SIGHUP refuses a bad section',
    async () => {
      const dir = fixtureDir();
      const topo = fixture(dir, 'demo-8', withEvents);
      const config = join(dir, 'config.yaml');
      writeFileSync(config, 'version: v1\nhealth:\n  signals:\n    ecc-uncorrectable: "off"\n');
      const node = await SimNode.start({
        topology: topo,
        args: [...PROBE, `--config-file=${config}`],
        env: { DP_DISABLE_HEALTHCHECKS: 'recovery-action' },
      });
      try {
        const k = node.kubelet!;
        await node.plugin.waitForLine(/watching GPU health/, 10_000);
        await node.plugin.waitForLine(
          /health checks .*ecc-uncorrectable=off.*recovery-action=off|recovery-action=off.*ecc-uncorrectable=off/,
        );
        node.nvml('health 0 ecc-volatile=5');
        node.nvml('health 1 recovery-action=1');
        // A signal still on, read by the probe after them: once it is seen, the two before were read
        // (the event's at once, the ECC by that probe round or an earlier one) and changed nothing.
        await until(node, 'health 2 nvlink-down=0', (d) => d[2]?.health === 'Unhealthy');
        assert.equal(letters(k.devices() ?? []), 'HHUHHHHH');
        writeFileSync(config, 'version: v1\nhealth:\n  signals:\n    ecc: "off"\n');
        const from = node.plugin.lines.length;
        node.plugin.signal('SIGHUP');
        const refused = await node.plugin.waitForLine(/config reload refused/, 10_000, from);
        assert.match(refused, /health\.signals\.ecc: unknown signal/);
      } finally {
        await node.stop();
      }
    },
  );
});

// ---- DRA -----------------------------------------------------------------------------------------

interface SliceDevice {
  name: string;
  attributes?: Record<string, { int?: number; string?: string }>;
  taints?: { key: string; value?: string; effect: string }[];
}

function devicesOf(api: ApiServerStandIn): SliceDevice[] {
  return [...api.slices.values()]
    .filter((s) => (s.spec as JsonObject).nodeName === NODE)
    .flatMap((s) => ((s.spec as JsonObject).devices as unknown as SliceDevice[]) ?? []);
}

function waitForSlices(
  api: ApiServerStandIn,
  pred: (d: SliceDevice[]) => boolean,
  what: string,
): Promise<SliceDevice[]> {
  return new Promise((resolve, reject) => {
    const probe = (): boolean => {
      const d = devicesOf(api);
      if (d.length === 0 || !pred(d)) return false;
      clearTimeout(timer);
      api.off('request', probe);
      resolve(d);
      return true;
    };
    const timer = setTimeout(() => {
      api.off('request', probe);
      reject(new Error(`no slices ${what} within 15 s: ${JSON.stringify(devicesOf(api))}`));
    }, 15_000);
    if (!probe()) api.on('request', probe);
  });
}

const taintsOf = (d: SliceDevice[], name: string): Taint[] =>
  (d.find((x) => x.name === name)?.taints ?? []).map((x) => [x.key, x.value ?? '', x.effect]);

/** A DRA taint as [key, value, effect]. */
type Taint = [string, string, string];
const critical = (name: string, value: string): Taint => [`${DRIVER}/${name}`, value, 'NoSchedule'];
const warning = (name: string, value: string): Taint => [`${DRIVER}/${name}`, value, 'None'];
const sorted = (x: Taint[]): string => JSON.stringify([...x].sort((a, b) => a.join().localeCompare(b.join())));
const sameTaints = (a: Taint[], b: Taint[]): boolean => sorted(a) === sorted(b);

/** One signal shown in DRA mode on one GPU: set, then cleared (or reset, for those that need a repair). */
interface DraCase {
  signal: string;
  gpu: number;
  /** How the bad state is read: at once on its event, or by the next probe. */
  how: 'event' | 'probe';
  /** The FIFO settings that make it bad, and the GPU's taints then. */
  set: string;
  taints: Taint[];
  /** Critical: the health stream's message for the device while it is UNHEALTHY. */
  reason?: RegExp;
  /** The FIFO settings (or `reset`) that clear it. */
  clear: string;
  /** A state that does not clear by itself: what is left after the reset, and what the message no longer says. */
  stays?: { taints: Taint[]; reason: RegExp; not: RegExp };
}

const REPAIR = /the GPU needs a repair.*\(it does not clear by itself\)/;

/**
 * Every signal, each GPU's cases one after the other (a GPU is reused only once its case cleared).
 * GPUs 4 and 5 are Ampere boards (rows are remapped there), the others V100s (pages are retired).
 * GPUs 2, 3 and 6 only ever have warnings. The states that need a repair (5, 7) come with a second,
 * critical state a reset clears: once that one's taint is gone, the reset was read and the other stayed.
 */
const DRA_CHAINS: DraCase[][] = [
  [
    {
      signal: 'nvlink',
      gpu: 0,
      how: 'probe',
      set: 'nvlink-down=0.1.2.3.4.5',
      taints: [critical('nvlink-down', '0.1.2.3.4.5')],
      reason: /nvlink: NVLink 0,1,2,3,4,5 down .*nvidia-smi -r -i 0/,
      clear: 'nvlink-down=none',
    },
  ],
  [
    {
      signal: 'recovery-action',
      gpu: 1,
      how: 'event',
      set: 'recovery-action=1',
      taints: [critical('recovery-action', 'GPU_RESET')],
      reason: /recovery-action: the driver asks for a GPU reset: .*nvidia-smi -r -i 1/,
      clear: 'recovery-action=0',
    },
    {
      signal: 'retired-pages pending',
      gpu: 1,
      how: 'event',
      set: 'retired-pending=1',
      taints: [critical('retired-pages', 'pending')],
      reason: /retired-pages: a page retirement waits for a GPU reset: .*nvidia-smi -r -i 1/,
      clear: 'reset',
    },
  ],
  [
    {
      signal: 'pcie-width',
      gpu: 2,
      how: 'probe',
      set: 'pcie-width=8',
      taints: [warning('pcie-width', 'x8-of-x16')],
      clear: 'pcie-width=16',
    },
  ],
  [
    {
      signal: 'pcie-replay',
      gpu: 3,
      how: 'probe',
      set: 'pcie-replays=100',
      taints: [warning('pcie-replay', 'above-limit')],
      clear: 'pcie-replays=0',
    },
  ],
  [
    {
      signal: 'row-remap pending',
      gpu: 4,
      how: 'event',
      set: 'remap-pending=1',
      taints: [critical('row-remap', 'pending')],
      reason: /row-remap: a row remap waits for a GPU reset: .*nvidia-smi -r -i 4/,
      clear: 'reset',
    },
    {
      signal: 'ecc-uncorrectable',
      gpu: 4,
      how: 'probe',
      set: 'ecc-volatile=2',
      taints: [critical('ecc-uncorrectable', 'volatile')],
      reason: /ecc-uncorrectable: 2 uncorrectable ECC errors since the last reset: .*nvidia-smi -r -i 4/,
      clear: 'ecc-volatile=0',
    },
  ],
  [
    {
      signal: 'row-remap failed',
      gpu: 5,
      how: 'event',
      set: 'remap-failure=1 recovery-action=1',
      taints: [critical('row-remap', 'failed'), critical('recovery-action', 'GPU_RESET')],
      reason: new RegExp(`row-remap: a row remap failed: ${REPAIR.source}`),
      clear: 'reset',
      stays: {
        taints: [critical('row-remap', 'failed')],
        reason: new RegExp(`row-remap: a row remap failed: ${REPAIR.source}`),
        not: /recovery-action:/,
      },
    },
  ],
  [
    {
      signal: 'clocks',
      gpu: 6,
      how: 'probe',
      set: 'clocks=0x48',
      taints: [warning('clocks', 'hw-slowdown.hw-thermal-slowdown')],
      clear: 'clocks=0',
    },
  ],
  [
    {
      signal: 'retired-pages limit',
      gpu: 7,
      how: 'event',
      set: 'retired-sbe=40 retired-dbe=30 ecc-volatile=1',
      taints: [critical('retired-pages', 'limit'), critical('ecc-uncorrectable', 'volatile')],
      reason: new RegExp(`retired-pages: retired pages reached the limit of 63: ${REPAIR.source}`),
      clear: 'reset',
      stays: {
        taints: [critical('retired-pages', 'limit')],
        reason: new RegExp(`retired-pages: retired pages reached the limit of 63: ${REPAIR.source}`),
        not: /ecc-uncorrectable:/,
      },
    },
  ],
];

describe('health signals in DRA mode', () => {
  test(
    'every signal: a taint per bad signal (NoSchedule critical, None warning), UNHEALTHY with the reason, ' +
      'removed when cleared; a repair taint stays through a reset',
    async (t: TestContext) => {
      const topo = fixture(fixtureDir(), 'demo-8', (g, i) => {
        withEvents(g);
        if (i === 4 || i === 5) g.name = 'NVIDIA A100-SXM4-80GB';
      });
      const api = await ApiServerStandIn.start({
        tokens: { [TOKEN]: RBAC },
      });
      api.putNode(NODE);
      let watcher: PluginWatcherStandIn | undefined;
      const args: string[] = [...PROBE];
      const env: Record<string, string> = {};
      let node: SimNode | undefined;
      try {
        node = await SimNode.start({
          topology: topo,
          kubelet: false,
          waitRegistered: false,
          args,
          env,
          beforePlugin: async (n) => {
            const registry = join(n.dir, 'plugins_registry');
            const plugins = join(n.dir, 'plugins');
            const cdi = join(n.dir, 'cdi');
            for (const d of [registry, plugins, cdi]) mkdirSync(d, { recursive: true });
            const kubeconfig = join(n.dir, 'kubeconfig');
            writeFileSync(
              kubeconfig,
              `apiVersion: v1\nkind: Config\ncurrent-context: node\nclusters:\n- name: c\n` +
                `  cluster:\n    server: ${api.url}\nusers:\n- name: u\n  user:\n    ` +
                `token: ${TOKEN}\ncontexts:\n- name: node\n  context:\n    cluster: c\n    user: u\n`,
              { mode: 0o600 },
            );
            writeFileSync(join(cdi, 'nvidia.yaml'), 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n');
            watcher = await PluginWatcherStandIn.start(registry, {
              slices: { janitor: api, nodeName: NODE, wipeDelayMs: 60_000 },
            });
            args.push(
              '--kubelet-api=dra',
              `--kubeconfig=${kubeconfig}`,
              `--node-name=${NODE}`,
              `--kubelet-plugins-registry=${registry}`,
              `--kubelet-plugins-dir=${plugins}`,
            );
            env.CDI_SPEC_DIRS = cdi;
          },
        });
        const w = watcher as PluginWatcherStandIn;
        await w.waitForRegistrations(1, 15_000);
        await waitForSlices(api, (d) => d.length === 8 && d.every((x) => x.taints === undefined), 'untainted');
        await node.plugin.waitForLine(/watching GPU health/, 10_000);
        const healthOf = (h: DeviceHealth[], name: string) => h.find((x) => x.device?.device_name === name);
        await w.waitForHealth(DRIVER, (h) => h.length === 8 && h.every((x) => x.health === HealthStatus.HEALTHY));
        // From here on, a GPU that only ever has warnings is never UNHEALTHY on the health stream.
        const warnedOnly = new Set(
          DRA_CHAINS.flat()
            .filter((c) => c.reason === undefined)
            .map((c) => `gpu-${c.gpu}`),
        );
        const warnedUnhealthy: string[] = [];
        w.on('health', (driver: string, h: DeviceHealth[]) => {
          for (const x of h)
            if (driver === DRIVER && warnedOnly.has(x.device?.device_name ?? '') && x.health !== HealthStatus.HEALTHY)
              warnedUnhealthy.push(`${x.device?.device_name}: ${x.health} ${x.message}`);
        });
        const domainOf = (d: SliceDevice[], name: string) =>
          d.find((x) => x.name === name)?.attributes?.nvlinkDomain?.int;
        const gpu0Domain = domainOf(devicesOf(api), 'gpu-0');
        assert.notEqual(gpu0Domain, undefined, 'GPU 0 starts in an NVLink domain');
        const times: string[] = [];

        /** One case: set, the taints and health it makes, cleared (or reset), what is left. */
        const runCase = async (c: DraCase): Promise<void> => {
          const dev = `gpu-${c.gpu}`;
          const took: string[] = [];
          let t0 = performance.now();
          node!.nvml(`health ${c.gpu} ${c.set}`);
          await waitForSlices(
            api,
            (x) => sameTaints(taintsOf(x, dev), c.taints) && (c.signal !== 'nvlink' || domainOf(x, dev) === undefined),
            `with ${dev} tainted ${JSON.stringify(c.taints)}` +
              (c.signal === 'nvlink' ? ' and in no NVLink domain (every link down)' : ''),
          );
          took.push(`taint ${ms(performance.now() - t0)}`);
          if (c.reason !== undefined) {
            const reason = c.reason;
            await w.waitForHealth(DRIVER, (h) => {
              const x = healthOf(h, dev);
              return x?.health === HealthStatus.UNHEALTHY && reason.test(x.message);
            });
            took.push(`UNHEALTHY ${ms(performance.now() - t0)}`);
          }
          t0 = performance.now();
          node!.nvml(`health ${c.gpu} ${c.clear}`);
          const left = c.stays?.taints ?? [];
          await waitForSlices(
            api,
            (x) => sameTaints(taintsOf(x, dev), left) && (c.signal !== 'nvlink' || domainOf(x, dev) === gpu0Domain),
            `with ${dev} tainted ${JSON.stringify(left)} after "${c.clear}"` +
              (c.signal === 'nvlink' ? ' and back in its NVLink domain' : ''),
          );
          took.push(
            `${c.stays === undefined ? 'taint removed' : 'only the repair taint left'} ${ms(performance.now() - t0)}`,
          );
          const stays = c.stays;
          await w.waitForHealth(DRIVER, (h) => {
            const x = healthOf(h, dev);
            if (stays === undefined) return x?.health === HealthStatus.HEALTHY;
            return x?.health === HealthStatus.UNHEALTHY && stays.reason.test(x.message) && !stays.not.test(x.message);
          });
          times.push(`${c.signal} on ${dev} (${c.how}): ${took.join(', ')}`);
        };
        // The GPUs' cases run side by side, each GPU's one after the other.
        await Promise.all(
          DRA_CHAINS.map(async (chain) => {
            for (const c of chain) await runCase(c);
          }),
        );
        assert.deepEqual(warnedUnhealthy, [], 'warnings leave their GPU HEALTHY on the health stream');
        // Every taint that clears by itself is gone; the two that need a repair stay.
        const end = devicesOf(api);
        assert.deepEqual(
          end.filter((x) => (x.taints ?? []).length > 0).map((x) => [x.name, taintsOf(end, x.name)]),
          [
            ['gpu-5', [[`${DRIVER}/row-remap`, 'failed', 'NoSchedule']]],
            ['gpu-7', [[`${DRIVER}/retired-pages`, 'limit', 'NoSchedule']]],
          ],
        );
        t.diagnostic(`DRA (probe every 1 s): ${times.join('; ')}`);
      } finally {
        await watcher?.stop();
        await api.stop();
        await node?.stop();
      }
    },
  );
});
