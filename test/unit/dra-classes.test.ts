// The DeviceClasses the packages ship (packaging/dra/): the per-MIG-profile file is what its table makes,
// every class is accepted by the API server stand-in as a create through the API, and the classes select and
// name what the device plugin's resources were (nvidia.com/gpu, nvidia.com/mig-<profile>), or carry NVIDIA's
// GpuConfig for time-slicing and MPS.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadYaml } from '../../src/config/config.ts';
import { migResourceName } from '../../src/core/mig.ts';
import {
  MIG_FILE,
  MIG_PROFILES,
  MPS_CLASS,
  SHARING_FILE,
  TIME_SLICED_CLASS,
  WHOLE_GPU_CLASS,
  WHOLE_GPU_FILE,
  migClassName,
  shippedMigProfiles,
} from '../../src/cli/check-dra-class-table.ts';
import { DRA_DOCS } from '../../build/package.ts';
import { MIG_CLASSES_PATH, migClassesYaml } from '../../build/deviceclasses.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject } from '../support/apiserver.ts';

const DIR = join(import.meta.dirname, '..', '..', 'packaging', 'dra');
const FILES = [WHOLE_GPU_FILE, MIG_FILE, SHARING_FILE];

function documents(name: string): JsonObject[] {
  const docs = loadYaml().parseAllDocuments(readFileSync(join(DIR, name), 'utf8'));
  assert.ok(Array.isArray(docs), `${name}: documents`);
  return docs.map((d, i) => {
    assert.deepEqual(d.errors, [], `${name} document ${i}: YAML errors`);
    return d.toJS() as JsonObject;
  });
}

const nameOf = (o: JsonObject): string => String((o.metadata as JsonObject).name);
const specOf = (o: JsonObject): JsonObject => o.spec as JsonObject;
const expression = (o: JsonObject): string =>
  String(((specOf(o).selectors as JsonObject[])[0]?.cel as JsonObject | undefined)?.expression);

test(`${MIG_FILE} is what build/deviceclasses.ts makes of the profile table (run it after changing the table)`, () => {
  assert.equal(readFileSync(MIG_CLASSES_PATH, 'utf8'), migClassesYaml());
});

test('the packages ship every class file', () => {
  const shipped = DRA_DOCS.sources.map((f) => f.source);
  for (const f of FILES) assert.ok(shipped.includes(join(DIR, f)), `${f} is packaged`);
});

test('every shipped DeviceClass is accepted by the API server stand-in, stored as written', async (t) => {
  const api = await ApiServerStandIn.start();
  t.after(() => api.stop());
  const all = FILES.flatMap((f) => documents(f).map((d) => ({ f, d })));
  for (const { f, d } of all) {
    const res = await fetch(`${api.url}/apis/resource.k8s.io/v1/deviceclasses?fieldValidation=Strict`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(d),
    });
    const body = (await res.json()) as JsonObject;
    assert.equal(res.status, 201, `${f} ${nameOf(d)}: ${JSON.stringify(body)}`);
    assert.deepEqual(body.spec, d.spec, `${f} ${nameOf(d)} stored as written`);
  }
  const names = all.map(({ d }) => nameOf(d));
  assert.equal(new Set(names).size, names.length, 'no class name twice');
  assert.equal(api.classes.size, 1 + shippedMigProfiles().length + 2);
});

test('whole GPUs and each MIG profile: selected by type (and profile), named as the device plugin names them', () => {
  const [whole] = documents(WHOLE_GPU_FILE);
  assert.equal(nameOf(whole!), WHOLE_GPU_CLASS);
  assert.equal(specOf(whole!).extendedResourceName, 'nvidia.com/gpu');
  const mig = documents(MIG_FILE);
  const profiles = [...new Set(MIG_PROFILES.flatMap((r) => r.profiles))];
  assert.deepEqual(
    mig.map((d) => nameOf(d)),
    profiles.map(migClassName),
  );
  for (const [i, d] of mig.entries()) {
    const profile = profiles[i] ?? '';
    assert.equal(specOf(d).extendedResourceName, migResourceName(profile));
    assert.equal(
      expression(d).replace(/\s+/g, ' '),
      `device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && ` +
        `device.attributes['gpu.nvidia.com'].profile == '${profile}'`,
    );
  }
  // The mixed strategy's names, + as . (a class name is a DNS subdomain: no + and no /).
  assert.equal(migClassName('1g.10gb+me'), 'mig-1g.10gb.me.nvidia.com');
  assert.ok(profiles.includes('7g.141gb') && profiles.includes('7g.186gb') && profiles.includes('4g.24gb'));
});

test("the time-sliced and MPS classes carry NVIDIA's GpuConfig for whole GPUs, and name no extended resource", () => {
  const docs = documents(SHARING_FILE);
  assert.deepEqual(
    docs.map((d) => nameOf(d)),
    [TIME_SLICED_CLASS, MPS_CLASS],
  );
  const sharing = docs.map((d) => {
    assert.equal(specOf(d).extendedResourceName, undefined);
    assert.match(expression(d), /\.type == 'gpu'/);
    const [cfg, ...rest] = specOf(d).config as JsonObject[];
    assert.equal(rest.length, 0);
    const opaque = cfg?.opaque as JsonObject;
    assert.equal(opaque.driver, 'gpu.nvidia.com');
    const p = opaque.parameters as JsonObject;
    assert.equal(p.apiVersion, 'resource.nvidia.com/v1beta1');
    assert.equal(p.kind, 'GpuConfig');
    return p.sharing;
  });
  assert.deepEqual(sharing, [
    { strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Default' } },
    { strategy: 'MPS' },
  ]);
});
