// `check`'s DeviceClass lines in DRA mode, against the API server stand-in: the classes the devices this node
// publishes need (whole GPUs, each MIG profile), which the cluster lacks or has without the extended resource, the
// sharing classes as a note, and an API server that is down or credentials that may not list classes as notes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { draClassesCheck, neededClasses } from '../../src/cli/check-dra-classes.ts';
import type { NodeReport } from '../../src/cli/inspect.ts';
import type { Gpu } from '../../src/core/devices.ts';
import type { MigDevice } from '../../src/core/mig.ts';
import { loadYaml } from '../../src/config/config.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject, TokenGrant } from '../support/apiserver.ts';
import { tokenKubeconfig } from '../support/dra-fixtures.ts';

const gpu = (i: number): Gpu => ({
  index: i,
  uuid: `GPU-${i}`,
  name: 'NVIDIA A100-SXM4-80GB',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 80 * 2 ** 30,
  numaNode: 0,
});
const mig = (parent: number, index: number, profile: string, giProfileId: number, slices: number): MigDevice => ({
  parent,
  index,
  uuid: `MIG-${parent}-${index}`,
  gi: index + 1,
  ci: 0,
  giProfileId,
  placementStart: index * slices,
  profile,
  giSlices: slices,
  ciSlices: slices,
  memoryBytes: 10 * 2 ** 30,
  multiprocessors: 14,
  engines: { copy: 1, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
});
/** GPU 0 whole, GPU 1 in MIG mode with a 1g.10gb, a 1g.10gb+me and a 3g.40gb. */
const REPORT: NodeReport = {
  library: 'fake',
  driverVersion: '580',
  gpus: [gpu(0), gpu(1)].map((g) => ({ ...g, health: 'Healthy' })),
  pairs: [],
  mig: {
    modes: [
      { current: false, pending: false },
      { current: true, pending: true },
    ],
    devices: [mig(1, 0, '1g.10gb', 19, 1), mig(1, 1, '1g.10gb+me', 20, 1), mig(1, 2, '3g.40gb', 9, 4)],
  },
};

function shipped(file: string): JsonObject[] {
  const path = join(import.meta.dirname, '..', '..', 'packaging', 'dra', file);
  return loadYaml()
    .parseAllDocuments(readFileSync(path, 'utf8'))
    .map((d) => d.toJS() as JsonObject);
}

async function setup(t: { after: (fn: () => unknown) => void }, tokens?: Record<string, TokenGrant>) {
  const api = await ApiServerStandIn.start(tokens === undefined ? {} : { tokens });
  const dir = mkdtempSync(join(tmpdir(), 'gdp-classes-'));
  t.after(async () => {
    await api.stop();
    rmSync(dir, { recursive: true, force: true });
  });
  const kubeconfig = join(dir, 'kubeconfig');
  writeFileSync(kubeconfig, tokenKubeconfig(api.url, 'tok'));
  return { api, kubeconfig };
}

test('the classes a node needs: whole GPUs once, each MIG profile present once (none for a MIG-enabled GPU)', () => {
  assert.deepEqual(
    neededClasses(REPORT, 'mixed').map((n) => [n.name, n.resource, n.what, n.file]),
    [
      ['gpu.nvidia.com', 'nvidia.com/gpu', '1 whole GPUs', 'deviceclass.yaml'],
      ['mig-1g.10gb.nvidia.com', 'nvidia.com/mig-1g.10gb', '1 MIG 1g.10gb', 'deviceclasses-mig.yaml'],
      ['mig-1g.10gb.me.nvidia.com', 'nvidia.com/mig-1g.10gb.me', '1 MIG 1g.10gb+me', 'deviceclasses-mig.yaml'],
      ['mig-3g.40gb.nvidia.com', 'nvidia.com/mig-3g.40gb', '1 MIG 3g.40gb', 'deviceclasses-mig.yaml'],
    ],
  );
  // --mig-strategy=none publishes every GPU whole.
  assert.deepEqual(
    neededClasses(REPORT, 'none').map((n) => [n.name, n.what]),
    [['gpu.nvidia.com', '2 whole GPUs']],
  );
});

test('check names the classes the cluster lacks (WARN, with the files to apply), passes once applied', async (t) => {
  const { api, kubeconfig } = await setup(t);
  const run = () => draClassesCheck(kubeconfig, true, REPORT, 'mixed', 'gpu.nvidia.com');
  // NVIDIA's chart's class without the extended resource, and one MIG class.
  api.putDeviceClass({ metadata: { name: 'gpu.nvidia.com' }, spec: { selectors: [{ cel: { expression: 'true' } }] } });
  api.putDeviceClass(
    shipped('deviceclasses-mig.yaml').find((d) => (d.metadata as JsonObject).name === 'mig-3g.40gb.nvidia.com')!,
  );
  let [classes, sharing] = await run();
  assert.equal(classes?.status, 'WARN', JSON.stringify(classes));
  assert.equal(
    classes?.detail,
    'the cluster lacks DeviceClass gpu.nvidia.com names no extended resource, not nvidia.com/gpu (for 1 whole GPUs), ' +
      'mig-1g.10gb.nvidia.com (for 1 MIG 1g.10gb), mig-1g.10gb.me.nvidia.com (for 1 MIG 1g.10gb+me): pods asking ' +
      'nvidia.com/gpu or nvidia.com/mig-1g.10gb or nvidia.com/mig-1g.10gb.me or nvidia.com/mig-3g.40gb are not ' +
      'served through DRA on this node',
  );
  assert.equal(
    classes?.fix,
    'kubectl apply -f /usr/share/doc/gpu-device-plugin/dra/deviceclass.yaml ' +
      '-f /usr/share/doc/gpu-device-plugin/dra/deviceclasses-mig.yaml',
  );
  assert.equal(sharing?.status, 'INFO');
  assert.match(String(sharing?.detail), /^the cluster lacks time-sliced\.gpu\.nvidia\.com and mps\.gpu\.nvidia\.com/);
  assert.equal(sharing?.fix, 'kubectl apply -f /usr/share/doc/gpu-device-plugin/dra/deviceclasses-sharing.yaml');

  // Applied as the fix says: every line passes.
  api.classes.clear();
  for (const f of ['deviceclass.yaml', 'deviceclasses-mig.yaml', 'deviceclasses-sharing.yaml'])
    for (const d of shipped(f)) api.putDeviceClass(d);
  [classes, sharing] = await run();
  assert.equal(classes?.status, 'PASS', JSON.stringify(classes));
  assert.equal(
    classes?.detail,
    'the cluster has gpu.nvidia.com, mig-1g.10gb.nvidia.com, mig-1g.10gb.me.nvidia.com, ' +
      'mig-3g.40gb.nvidia.com for the devices this node publishes',
  );
  assert.match(String(sharing?.detail), /^the cluster has time-sliced\.gpu\.nvidia\.com and mps\.gpu\.nvidia\.com/);
  assert.ok(api.requests.every((r) => r.path === '/apis/resource.k8s.io/v1/deviceclasses' && r.code === 200));

  // A profile no shipped class has: the fix says to write one.
  const odd: NodeReport = { ...REPORT, mig: { ...REPORT.mig!, devices: [mig(1, 0, '1g.11gb', 30, 1)] } };
  const [line] = await draClassesCheck(kubeconfig, true, odd, 'mixed', 'gpu.nvidia.com');
  assert.equal(line?.status, 'WARN');
  assert.equal(
    line?.fix,
    'write a class for 1g.11gb as those of /usr/share/doc/gpu-device-plugin/dra/deviceclasses-mig.yaml are',
  );
});

test('an API server that is down, or credentials that may not list classes: a note, never a failure', async (t) => {
  const { api, kubeconfig } = await setup(t, { tok: { user: 'gpu-device-plugin:node:n', allow: ['get nodes'] } });
  let [line] = await draClassesCheck(kubeconfig, true, REPORT, 'mixed', 'gpu.nvidia.com');
  assert.equal(line?.status, 'INFO');
  assert.match(String(line?.detail), /^not checked: these credentials may not list DeviceClasses \(403 Forbidden;/);
  assert.match(String(line?.fix), /^kubectl get deviceclasses/);
  await api.down();
  [line] = await draClassesCheck(kubeconfig, true, REPORT, 'mixed', 'gpu.nvidia.com');
  assert.equal(line?.status, 'INFO');
  assert.match(String(line?.detail), /^not checked: the API server did not answer: .*ECONNREFUSED/);
  // Nothing to compare without NVML or a kubeconfig.
  assert.equal((await draClassesCheck(kubeconfig, true, null, 'mixed', 'gpu.nvidia.com'))[0]?.status, 'SKIP');
  assert.equal((await draClassesCheck(null, false, REPORT, 'mixed', 'gpu.nvidia.com'))[0]?.status, 'SKIP');
});
