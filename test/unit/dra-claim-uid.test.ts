// A claim's uid names the claim's files on the host: its request to the MPS unit, its CDI spec in the runtime's
// directory, its daemon's directory. A uid that is not one path component, from a kubelet or an API server that
// is not what it should be, must not reach any path: prepare and unprepare refuse it before touching anything.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { test } from 'node:test';
import { claimUidProblem } from '../../src/core/dra-claims.ts';
import type { HostDevice } from '../../src/core/dra-sharing.ts';
import { DraClaims } from '../../src/dra/claims.ts';
import { HostSharing } from '../../src/dra/sharing.ts';
import { createLogger } from '../../src/system/log.ts';
import { byIndex, cdiSpec } from '../support/dra-fixtures.ts';

const GiB = 2 ** 30;
const NODE: HostDevice[] = [0, 1].map((i) => ({
  name: `gpu-${i}`,
  gpuUuid: `GPU-${i}`,
  gpuIndex: i,
  minor: i,
  memoryBytes: 80 * GiB,
}));
// The toolkit's spec, which a uid of "../../nvidia" would name as its own CDI spec file.
const TOOLKIT_SPEC = 'nvidia.json';
const EVIL = '../../nvidia';

/** Every file under `dir`, relative to it. */
function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => relative(dir, join(e.parentPath, e.name)))
    .sort();
}

function node(t: { after: (fn: () => void) => void }, uidAtApiServer: string) {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-claim-uid-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'boot_id'), 'boot-1\n');
  mkdirSync(join(dir, 'cdi'));
  writeFileSync(join(dir, 'cdi', TOOLKIT_SPEC), cdiSpec(byIndex(['0', '1'])));
  mkdirSync(join(dir, 'mps', 'dra', 'requests'), { recursive: true });
  const log = createLogger({ level: 'error', journal: false, write: () => undefined });
  // Today's code would wait this long for an answer to a request it should never have written.
  const sharing = new HostSharing({ mpsRoot: join(dir, 'mps'), cdiDir: join(dir, 'cdi'), log, answerTimeoutMs: 50 });
  const claimJson = {
    metadata: { uid: uidAtApiServer },
    status: {
      allocation: {
        devices: {
          results: [{ request: 'gpu', driver: 'gpu.nvidia.com', pool: 'node-1', device: 'gpu-1' }],
          config: [
            {
              source: 'FromClaim',
              opaque: {
                driver: 'gpu.nvidia.com',
                parameters: {
                  apiVersion: 'resource.nvidia.com/v1beta1',
                  kind: 'GpuConfig',
                  sharing: { strategy: 'MPS' },
                },
              },
            },
          ],
        },
      },
    },
  };
  const claims = new DraClaims({
    driver: 'gpu.nvidia.com',
    nodeName: 'node-1',
    claims: { getResourceClaim: async () => claimJson },
    devices: () => NODE,
    sharing,
    checkpointPath: join(dir, 'checkpoint.json'),
    bootIdPath: join(dir, 'boot_id'),
    cdiDirs: [join(dir, 'cdi')],
    now: Date.now,
    log,
  });
  return { dir, claims };
}

test('claimUidProblem: UUIDs and DNS labels pass; dots, slashes, upper case, empty and long names do not', () => {
  for (const ok of ['0c2b6f7e-1d2a-4c8e-9a51-3f0d2e8b7c11', 'uid-1', 'a']) assert.equal(claimUidProblem(ok), null, ok);
  for (const bad of ['', '..', '.', '../x', 'a/b', 'a.b', 'A', '-a', 'a-', 'x'.repeat(64), 'a\nb', 'a b']) {
    const why = claimUidProblem(bad);
    assert.ok(why !== null, `${JSON.stringify(bad)} is refused`);
    assert.match(why, /is not a Kubernetes UID .*it would name the claim's files on the host/);
  }
  assert.match(claimUidProblem('y'.repeat(300)) ?? '', /"y{80}…"/, 'a long uid is shortened in the message');
});

test("unprepare of a uid that climbs out of the runtime's CDI directory removes nothing there", async (t) => {
  const { dir, claims } = node(t, 'unused');
  await claims.open();
  const before = filesUnder(dir);
  const r = await claims.unprepare([{ namespace: 'team-a', name: 'c', uid: EVIL }]);
  assert.ok(existsSync(join(dir, 'cdi', TOOLKIT_SPEC)), "the toolkit's CDI spec is still there");
  assert.deepEqual(filesUnder(dir), before, 'no file removed or written');
  assert.match(
    r.claims[EVIL]?.error ?? '',
    /claim team-a\/c: the claim uid "\.\.\/\.\.\/nvidia" is not a Kubernetes UID/,
  );
});

test('prepare of such a uid, even when the API server says the same, writes no request and no CDI spec', async (t) => {
  const { dir, claims } = node(t, EVIL);
  await claims.open();
  const before = filesUnder(dir).filter((f) => f !== 'checkpoint.json');
  const r = await claims.prepare([{ namespace: 'team-a', name: 'c', uid: EVIL }]);
  assert.deepEqual(
    filesUnder(dir).filter((f) => f !== 'checkpoint.json'),
    before,
    'nothing written for the claim anywhere (no request, no spec)',
  );
  assert.match(r.claims[EVIL]?.error ?? '', /the claim uid "\.\.\/\.\.\/nvidia" is not a Kubernetes UID/);
  assert.deepEqual(r.claims[EVIL]?.devices, []);
  assert.deepEqual(claims.preparedClaims(), [], 'not recorded as prepared or being prepared');
});
