// check's kubelet version line: the kubelet on the PATH asked for its version, held to what the
// chosen kubelet API needs (DRA 1.34, the device-plugin API 1.10); no kubelet found is said (INFO), not failed.
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { kubeletVersionCheck, parseKubeletVersion } from '../../src/cli/check-kubelet-version.ts';

function fakeKubelet(says: string, exit = 0): { path: string; done: () => void } {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-kubelet-'));
  writeFileSync(join(dir, 'kubelet'), `#!/bin/sh\necho '${says}'\nexit ${exit}\n`);
  chmodSync(join(dir, 'kubelet'), 0o755);
  return { path: dir, done: () => rmSync(dir, { recursive: true, force: true }) };
}

test('kubelet --version is read as major.minor', () => {
  assert.deepEqual(parseKubeletVersion('Kubernetes v1.34.2'), [1, 34]);
  assert.deepEqual(parseKubeletVersion('Kubernetes v1.37.0-rc.1'), [1, 37]);
  assert.equal(parseKubeletVersion('kubelet: unknown flag --version'), null);
});

test('DRA mode needs a kubelet 1.34 or later; the device-plugin API 1.10', async () => {
  const old = fakeKubelet('Kubernetes v1.33.5');
  const current = fakeKubelet('Kubernetes v1.34.1');
  try {
    const tooOld = await kubeletVersionCheck('dra', old.path);
    assert.equal(tooOld.status, 'FAIL');
    assert.match(tooOld.detail, /kubelet is 1\.33; DRA mode needs a kubelet 1\.34 or later/);
    assert.match(tooOld.fix ?? '', /upgrade the kubelet/);
    assert.equal((await kubeletVersionCheck('device-plugin', old.path)).status, 'PASS');
    const fine = await kubeletVersionCheck('dra', current.path);
    assert.equal(fine.status, 'PASS');
    assert.match(fine.detail, /kubelet is 1\.34/);
  } finally {
    old.done();
    current.done();
  }
});

test('a kubelet that answers no version is a warning; none on the PATH is said (INFO), not counted', async () => {
  const odd = fakeKubelet('no idea', 0);
  try {
    const line = await kubeletVersionCheck('dra', odd.path);
    assert.equal(line.status, 'WARN');
    assert.match(line.detail, /--version said "no idea"/);
  } finally {
    odd.done();
  }
  const empty = mkdtempSync(join(tmpdir(), 'gdp-nokubelet-'));
  try {
    const none = await kubeletVersionCheck('dra', empty);
    // /usr/bin/kubelet is looked at too: this machine has none.
    assert.equal(none.status, 'INFO', 'said, not counted: the kubelet may run where this cannot see it');
    assert.match(none.detail, /no kubelet program on the PATH or in \/usr\/bin; DRA mode needs a kubelet 1\.34/);
  } finally {
    rmSync(empty, { recursive: true, force: true });
  }
});
