// Dynamic MIG through the packaged units under a real systemd: the .deb in a Debian 12 container with systemd as
// PID 1 (packaged-node.ts), the fake NVML simulating three A100-40GB (the first three of the mig-dynamic-16
// fixture: GPU 0 in MIG mode with a 3g.20gb instance made by someone else, GPU 1 not in MIG mode, GPU 2 in MIG
// mode and empty), the node switched to DRA as systemd-dra.test.ts does, with --mig-strategy=mixed. Then
// dynamic MIG is turned on the way README's "Dynamic MIG" tells an operator (`dra.dynamicMig: true` in the config
// file; `check` says which GPUs it covers) and the plugin restarted: its counter sets and partitions reach the
// API server stand-in; a claim allocated a partition, prepared through the kubelet's DRA client, makes the GPU
// and compute instance in the MPS unit (root, the only side with the MIG config capability) and gives the claim
// a CDI spec with the instance's capability nodes; unprepare destroys them. The fake NVML keeps the GPUs' MIG
// state in one file for both units (FAKE_NVML_MIG_STATE), so the instance the MPS unit makes is on "the GPU" the
// plugin scans.
//
// The driver's /proc entries (the nvidia-caps major in `devices`, `driver/nvidia-caps/mig-minors`) are laid out
// as the driver writes them, under a directory both units are told with PROC_ROOT: the plugin's unit has
// ProtectProc=, which gives it a procfs instance of its own, where no test can add a driver's entries.
// Needs root, debootstrap and systemd-nspawn (build/install-tools.sh); never skipped.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ENV_FILE, PACKAGE } from '../../build/package.ts';
import { byIndex, cdiSpec } from '../support/dra-fixtures.ts';
import { migMinorsText } from '../support/mig.ts';
import { TOPOLOGIES } from '../support/sim.ts';
import type { Container } from './container.ts';
import { API_CTL, API_STATE, DRIVER, DraCluster, NODE, WATCHER_CTL } from './dra-cluster.ts';
import type { Prepared, Unprepared } from './dra-cluster.ts';
import type { ApiServerState } from './dra-standins-main.ts';
import { journalOnFailure } from './journal-on-failure.ts';
import { type PackagedNode, UNIT, bootWithPackage } from './packaged-node.ts';
import { LiveUnit, timer } from './unit.ts';

const GPUS = 3;
const CONFIG = '/etc/gpu-device-plugin/config.yaml';
const MPS_UNIT = `${PACKAGE}-mps.service`;
const MPS_ROOT = '/run/nvidia/mps';
const CDI_DIR = '/var/run/cdi';
/** Where the driver's /proc entries are laid out (PROC_ROOT of both units). */
const PROC_ROOT = '/etc/fake-nvml/proc';
/** The GPUs' MIG layouts, kept by the fake NVML for every process (the MPS unit writes it: it runs as root). */
const MIG_STATE = '/var/lib/fake-nvml/mig-state';
/** The nvidia-caps major in the driver's /proc/devices. */
const CAPS_MAJOR = 236;
/** A partition of the empty MIG GPU: 3g.20gb (GPU-instance profile 9) at memory slice 4. */
const PARTITION = 'gpu-2-mig-3g20gb-9-4';

const fixture = JSON.parse(readFileSync(join(TOPOLOGIES, 'mig-dynamic-16.json'), 'utf8')) as {
  gpus: { uuid: string }[];
};
const TOPOLOGY = {
  ...fixture,
  description: 'the first three A100-40GB of mig-dynamic-16: GPU 0 MIG with a 3g.20gb instance, 1 not MIG, 2 MIG',
  gpus: fixture.gpus.slice(0, GPUS),
};

let node: PackagedNode | undefined;
const timings: string[] = [];

function box(): Container {
  if (node === undefined) throw new Error('the container did not boot (see the first failure)');
  return node.container;
}

const plugin = new LiveUnit(box, UNIT, PACKAGE, ['dra-*', MPS_UNIT]);
const mpsUnit = new LiveUnit(box, MPS_UNIT, PACKAGE, [UNIT]);
const timed = timer(timings, 2);

const cluster = new DraCluster(box, plugin.until);

interface SliceSpec {
  sharedCounters?: { name: string }[];
  devices?: { name: string; consumesCounters?: { counterSet: string }[] }[];
}

function specs(s: ApiServerState): SliceSpec[] {
  return s.slices.map((x) => x.spec as unknown as SliceSpec);
}

/** The node's stored slices once `ready` holds of them (every slice of the pool written). */
async function published(what: string, ready: (s: SliceSpec[]) => boolean): Promise<SliceSpec[]> {
  return plugin.until(`the node's ResourceSlices: ${what}`, async () => {
    const s = await cluster.readState<ApiServerState>(API_STATE);
    if (s === null || s.slices.length === 0) return undefined;
    const count = (x: ApiServerState['slices'][number]): unknown =>
      (x.spec as { pool?: { resourceSliceCount?: number } }).pool?.resourceSliceCount;
    if (!s.slices.every((x) => count(x) === s.slices.length)) return undefined;
    return ready(specs(s)) ? specs(s) : undefined;
  });
}

const deviceNames = (s: SliceSpec[]): string[] => s.flatMap((x) => (x.devices ?? []).map((d) => d.name)).sort();

/** The GPU-instance lines of the fake NVML's state for a GPU: `gi <slot> <id> <profile> <start> <busy>`. */
async function gpuInstances(uuid: string): Promise<string[]> {
  const text = await box().run(`cat ${MIG_STATE}`);
  const lines = text.split('\n');
  const from = lines.findIndex((l) => l.startsWith(`gpu ${uuid} `));
  assert.ok(from >= 0, `${MIG_STATE} names GPU ${uuid}:\n${text}`);
  const end = lines.findIndex((l, i) => i > from && l.startsWith('gpu '));
  return lines.slice(from + 1, end === -1 ? undefined : end).filter((l) => l.startsWith('gi '));
}

describe('dynamic MIG through the packaged units under a real systemd (Debian 12)', { concurrency: false }, () => {
  /** The partition claim, once its prepare passed every check. */
  let claim: { namespace: string; name: string; uid: string } | undefined;
  /** The journal's cursor when dynamic MIG was turned on: the units' lines after it are checked at the end. */
  let mark = '';

  journalOnFailure(() => node?.container, ['dra-apiserver.service', 'dra-watcher']);

  before(async () => {
    node = await bootWithPackage({
      name: 'dra-mig',
      bundles: { 'dra-standins': 'dra-standins-main.ts' },
      files: {
        // Where `nvidia-ctk cdi generate` writes the spec by default.
        '/etc/cdi/nvidia.yaml': cdiSpec(byIndex(Array.from({ length: GPUS }, (_, i) => String(i)))),
        // The driver's entries: its character devices, and a capability minor for every possible instance.
        [`${PROC_ROOT}/devices`]: `Character devices:\n195 nvidia\n${CAPS_MAJOR} nvidia-caps\n`,
        [`${PROC_ROOT}/driver/nvidia-caps/mig-minors`]: migMinorsText(GPUS),
      },
      fakeMpsControl: true,
      fakeNvmlUnits: [UNIT, MPS_UNIT],
      topology: { name: 'mig-a100-3', json: JSON.stringify(TOPOLOGY) },
      fakeNvmlEnv: { FAKE_NVML_MIG_STATE: MIG_STATE, PROC_ROOT },
      beforeInstall: async (n) => {
        await n.container.run(`mkdir -p ${MIG_STATE.slice(0, MIG_STATE.lastIndexOf('/'))}`);
      },
      timings,
    });
  });

  after(async () => {
    await node?.teardown();
    if (timings.length > 0) process.stderr.write(`real-systemd dynamic MIG test timings:\n  ${timings.join('\n  ')}\n`);
  });

  test('in DRA mode with --mig-strategy=mixed and no dynamicMig: MIG devices and GPUs, no partitions', async () => {
    const url = await cluster.startApiServer();
    await cluster.startWatcher('dra-watcher', url);
    // README, "Dynamic Resource Allocation", and a MIG strategy.
    await cluster.switchToDra(url, ['MIG_STRATEGY=mixed']);
    await box().run(`systemctl restart ${UNIT}`, { timeoutMs: 120000 });
    const s = await published('the MIG device of GPU 0 and GPU 1', (x) => deviceNames(x).includes('gpu-1'));
    assert.deepEqual(
      s.filter((x) => x.sharedCounters !== undefined),
      [],
      'no counter sets without dynamicMig',
    );
    // GPU 0's instance as a MIG device, GPU 1 whole, the empty MIG GPU nothing.
    assert.deepEqual(deviceNames(s), ['gpu-0-mig-3g20gb-9-0', 'gpu-1']);
  });

  test("turned on as README's Dynamic MIG says (config file), restarted: counter sets and partitions", async (t) => {
    await box().run(
      [
        `printf 'version: v1\\ndra:\\n  dynamicMig: true\\n' > ${CONFIG}`,
        `printf 'CONFIG_FILE=${CONFIG}\\n' >> ${ENV_FILE.deb}`,
      ].join(' && '),
    );
    // check, as the operator runs it before the restart, says which GPUs it covers (the environment is the fake
    // NVML's, which the units get from their drop-ins).
    const check = await box().sh(
      `FAKE_NVML_CONFIG=/etc/fake-nvml/mig-a100-3.json FAKE_NVML_MIG_STATE=${MIG_STATE} PROC_ROOT=${PROC_ROOT} ` +
        '/usr/bin/gpu-device-plugin check 2>&1',
      { timeoutMs: 60000 },
    );
    t.diagnostic(`gpu-device-plugin check (exit ${check.code}):\n${check.stdout}`);
    assert.equal(check.code, 0, check.stdout);
    const gpu = (index: number, instances: number): string =>
      `GPU ${index} \\(\\d+ free placements, ${instances} instances\\)`;
    assert.match(check.stdout, new RegExp(`dynamic mig.*covers 2 GPUs: ${gpu(0, 1)}, ${gpu(2, 0)}`));
    mark = await plugin.journalCursor();
    const t0 = performance.now();
    await box().run(`systemctl restart ${UNIT}`, { timeoutMs: 120000 });
    const s = await published(`the counter set of GPU 2 and ${PARTITION}`, (x) => deviceNames(x).includes(PARTITION));
    timed(t, 'systemctl restart with dynamicMig → partitions published', performance.now() - t0);
    const counterSets = s.flatMap((x) => (x.sharedCounters ?? []).map((c) => c.name)).sort();
    assert.deepEqual(counterSets, ['gpu-0-counter-set', 'gpu-2-counter-set']);
    assert.ok(
      s.every((x) => x.sharedCounters === undefined || (x.devices ?? []).length === 0),
      'the counter sets in slices of their own',
    );
    const partition = s.flatMap((x) => x.devices ?? []).find((d) => d.name === PARTITION);
    assert.deepEqual(
      partition?.consumesCounters?.map((c) => c.counterSet),
      ['gpu-2-counter-set'],
    );
    // Placements overlapping the instance on GPU 0 (memory slices 0-3) are not offered; the instance stays a
    // MIG device of its own.
    const names = deviceNames(s).join(' ');
    assert.ok(!deviceNames(s).includes('gpu-0-mig-4g20gb-5-0'), names);
    assert.ok(deviceNames(s).includes('gpu-0-mig-3g20gb-9-0'), names);
    assert.ok(deviceNames(s).includes('gpu-0-mig-3g20gb-9-4'), names);
    assert.ok(deviceNames(s).includes('gpu-1'));
    // The MPS unit is the DRA sharing agent, and it shares the GPUs' state with the plugin.
    assert.equal((await box().sh(`systemctl is-active ${MPS_UNIT}`)).stdout.trim(), 'active');
    await mpsUnit.until('the DRA sharing agent started', async () =>
      (await mpsUnit.journal()).find((l) => /DRA sharing agent started/.test(l)),
    );
  });

  test("a partition claim prepared through the kubelet's DRA client: the MPS unit makes the instance", async (t) => {
    const stored = await cluster.ctl<{ metadata: { uid: string } }>(API_CTL, '/claims', {
      namespace: 'team-a',
      name: 'mig-3g',
      results: [{ request: 'mig', driver: DRIVER, pool: NODE, device: PARTITION }],
    });
    const prepared = { namespace: 'team-a', name: 'mig-3g', uid: stored.metadata.uid };
    const uid = prepared.uid;
    const t0 = performance.now();
    const r = await cluster.ctl<Prepared>(WATCHER_CTL, '/prepare', { driver: DRIVER, claims: [prepared] });
    timed(t, 'NodePrepareResources of a dynamic MIG partition', performance.now() - t0);
    assert.deepEqual(r.claims[uid], {
      devices: [
        {
          request_names: ['mig'],
          pool_name: NODE,
          device_name: PARTITION,
          cdi_device_ids: ['nvidia.com/gpu=2', `k8s.gpu-device-plugin/claim=${uid}-${PARTITION}`],
        },
      ],
      error: '',
    });
    // What the plugin wrote through its sandbox for the agent: the partition to make.
    const request = JSON.parse(await box().run(`cat ${MPS_ROOT}/dra/requests/${uid}.json`)) as {
      request: { partitions?: { device: string }[] };
    };
    assert.deepEqual(
      request.request.partitions?.map((p) => p.device),
      [PARTITION],
    );
    const created = await mpsUnit.until('the MPS unit made the GPU instance', async () =>
      (await mpsUnit.journal(mark)).find((l) => /MIG GPU instance created/.test(l) && l.includes(uid)),
    );
    assert.match(created, new RegExp(PARTITION));
    // On "the GPU": one 3g.20gb GPU instance (profile 9) at memory slice 4 of GPU 2.
    const parent = TOPOLOGY.gpus[2]!.uuid;
    assert.deepEqual(
      (await gpuInstances(parent)).map((l) => l.split(' ').slice(3, 5)),
      [['9', '4']],
    );
    // The claim's spec: its MIG UUID, and the instance's two capability nodes with the driver's minors.
    const spec = JSON.parse(await box().run(`cat ${CDI_DIR}/gpu-device-plugin-claim-${uid}-mig.json`)) as {
      devices: { containerEdits: { env: string[]; deviceNodes: { path: string; major: number; minor: number }[] } }[];
    };
    const edits = spec.devices[0]?.containerEdits;
    const visible = /^CUDA_VISIBLE_DEVICES=(MIG-[0-9a-f-]+)$/.exec(edits?.env[0] ?? '');
    assert.ok(visible?.[1] !== undefined, JSON.stringify(edits));
    const mig = visible[1];
    // The fake NVML's MIG UUID ends in the GPU-instance profile, GI and CI, two hex digits each.
    const [profile, gi, ci] = (mig.slice(-6).match(/../g) ?? []).map((h) => Number.parseInt(h, 16));
    assert.equal(profile, 9, mig);
    assert.equal(mig.slice(4, -6), parent.slice(4, -6), 'a MIG device of GPU 2');
    // mig-minors (test/support/mig.ts): gpu<m>/gi<g>/access is 3 + 135 m + 9 g, its ci<c> one after plus c.
    const giMinor = 3 + 135 * 2 + 9 * gi!;
    assert.deepEqual(
      edits?.deviceNodes.map((n) => [n.path, n.major, n.minor]),
      [
        [`/dev/nvidia-caps/nvidia-cap${giMinor}`, CAPS_MAJOR, giMinor],
        [`/dev/nvidia-caps/nvidia-cap${giMinor + 1 + ci!}`, CAPS_MAJOR, giMinor + 1 + ci!],
      ],
    );
    claim = prepared;
  });

  test('unprepared: the MPS unit destroys the instance, the spec is gone, the foreign instance stays', async () => {
    assert.ok(claim !== undefined, 'the claim of the test before was prepared');
    const uid = claim.uid;
    const u = await cluster.ctl<Unprepared>(WATCHER_CTL, '/unprepare', {
      driver: DRIVER,
      claims: [claim],
    });
    assert.deepEqual(u.claims[uid], { error: '' });
    await mpsUnit.until('the MPS unit destroyed the GPU instance', async () =>
      (await mpsUnit.journal(mark)).find((l) => /MIG GPU instance destroyed/.test(l) && l.includes(uid)),
    );
    for (const path of [
      `${CDI_DIR}/gpu-device-plugin-claim-${uid}-mig.json`,
      `${MPS_ROOT}/dra/requests/${uid}.json`,
      `${MPS_ROOT}/dra/answers/${uid}.json`,
    ])
      assert.equal((await box().sh(`test -e ${path}`)).code, 1, `${path} removed`);
    assert.deepEqual(await gpuInstances(TOPOLOGY.gpus[2]!.uuid), [], 'no instance left on GPU 2');
    assert.equal((await gpuInstances(TOPOLOGY.gpus[0]!.uuid)).length, 1, 'the instance on GPU 0 untouched');
  });

  test('no warning or error in either unit since dynamic MIG was turned on', async () => {
    assert.notEqual(mark, '', 'the tests before ran');
    const lines = [...(await plugin.journal(mark)), ...(await mpsUnit.journal(mark))];
    assert.deepEqual(
      lines.filter((l) => /EROFS|EACCES|read-only file system|permission denied|^(WARN|ERROR) /i.test(l)),
      [],
    );
    assert.ok(
      lines.some((l) => /MIG GPU instance destroyed/.test(l)),
      `the journals read cover the claim's life:\n${lines.join('\n')}`,
    );
  });
});
