// The STATUS line (src/system/service-status.ts): its text, and NodeStatus leaving "registered" as
// soon as the resource manager says a registration is lost.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildSnapshot } from '../../src/core/snapshot.ts';
import { NodeStatus, statusLine } from '../../src/system/service-status.ts';

test('the STATUS text: registered or waiting, healthy of total GPUs, MIG devices only when there are some', () => {
  assert.equal(statusLine(null, false), 'STATUS=waiting for the kubelet; 0 of 0 GPUs healthy');
  const counts = { gpus: { healthy: 7, total: 8 }, mig: { healthy: 0, total: 0 }, resources: [] };
  assert.equal(statusLine(counts, true), 'STATUS=registered; 7 of 8 GPUs healthy');
  assert.equal(
    statusLine({ ...counts, mig: { healthy: 3, total: 4 } }, true),
    'STATUS=registered; 7 of 8 GPUs healthy, 3 of 4 MIG devices',
  );
});

test(
  'NodeStatus: READY with the first full registration, "waiting" ' +
    'again the moment a registration is lost, back when it returns',
  () => {
    const sent: { line: string; ready: boolean }[] = [];
    const waits: string[] = [];
    let now = false;
    const status = new NodeStatus(
      {
        status: (line, ready = false) => {
          sent.push({ line, ready });
        },
        waitFor: (what) => {
          waits.push(what);
        },
      },
      { allRegisteredNow: () => now },
    );
    const gpus = [0, 1].map((i) => ({
      index: i,
      uuid: `GPU-${i}`,
      name: 'x',
      minor: i,
      busId: `00000000:0${i}:00.0`,
      memoryBytes: 1,
      numaNode: 0,
    }));
    const snapshot = buildSnapshot(
      {
        driverVersion: '1',
        gpus,
        nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
        pcie: [
          [-1, -1],
          [-1, -1],
        ],
      },
      null,
      false,
    );
    status.apply({ snapshot });
    assert.deepEqual(sent.at(-1), { line: 'STATUS=waiting for the kubelet; 2 of 2 GPUs healthy', ready: false });
    assert.deepEqual(waits, ['the kubelet']);
    now = true;
    status.registered(true);
    assert.deepEqual(sent.at(-1), { line: 'STATUS=registered; 2 of 2 GPUs healthy', ready: true });
    now = false;
    status.registrationLost();
    assert.deepEqual(sent.at(-1), { line: 'STATUS=waiting for the kubelet; 2 of 2 GPUs healthy', ready: false });
    now = true;
    status.registered(true);
    assert.equal(sent.at(-1)?.line, 'STATUS=registered; 2 of 2 GPUs healthy');
  },
);

test(
  "NodeStatus with the serving side's own words (DRA mode): they replace " +
    '"registered"/"waiting for the kubelet", and refresh() says them again',
  () => {
    const sent: { line: string; ready: boolean }[] = [];
    let now = false;
    let published: number | null = null;
    const words = (registered: boolean): string =>
      `${registered ? 'registered with the kubelet' : "waiting for the kubelet's plugin watcher"} (DRA, driver ` +
      `gpu.nvidia.com); ${published === null ? 'no devices published yet' : `${published} devices published`}`;
    const status = new NodeStatus(
      {
        status: (line, ready = false) => {
          sent.push({ line, ready });
        },
        waitFor: () => undefined,
      },
      { allRegisteredNow: () => now, statusWords: words },
    );
    const gpus = [0, 1].map((i) => ({
      index: i,
      uuid: `GPU-${i}`,
      name: 'x',
      minor: i,
      busId: `00000000:0${i}:00.0`,
      memoryBytes: 1,
      numaNode: 0,
    }));
    const snapshot = buildSnapshot(
      {
        driverVersion: '1',
        gpus,
        nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
        pcie: [
          [-1, -1],
          [-1, -1],
        ],
      },
      null,
      false,
    );
    status.apply({ snapshot });
    assert.deepEqual(sent.at(-1), {
      line:
        "STATUS=waiting for the kubelet's plugin watcher (DRA, driver " +
        'gpu.nvidia.com); no devices published yet; 2 of 2 GPUs healthy',
      ready: false,
    });
    now = true;
    status.registered(true);
    assert.deepEqual(sent.at(-1), {
      line:
        'STATUS=registered with the kubelet (DRA, driver ' +
        'gpu.nvidia.com); no devices published yet; 2 of 2 GPUs healthy',
      ready: true,
    });
    published = 2;
    const before = sent.length;
    status.refresh();
    assert.equal(sent.length, before + 1);
    assert.deepEqual(sent.at(-1), {
      line: 'STATUS=registered with the kubelet (DRA, driver gpu.nvidia.com); 2 devices published; 2 of 2 GPUs healthy',
      ready: false,
    });
  },
);
