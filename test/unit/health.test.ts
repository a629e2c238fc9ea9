import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  DEFAULT_IGNORED_XIDS,
  NON_RECOVERABLE_XIDS,
  describeHealthSettings,
  isCritical,
  parseHealthSettings,
  watchesDoubleBitEcc,
  watchesLostGpus,
  watchesAnything,
} from '../../src/core/health-policy.ts';
import { HealthTracker } from '../../src/core/health-tracker.ts';
import { UNKNOWN_XID_MEANING, xidMeaning } from '../../src/core/xid-meanings.ts';
import type { HealthChange } from '../../src/core/health-tracker.ts';
import type { HealthSettings } from '../../src/core/health-policy.ts';

const defaults = parseHealthSettings(undefined, undefined);
const off = { enabled: false, quietMs: 0 };
const QUIET = 60_000;
const on = { enabled: true, quietMs: QUIET };

function tracker(n: number, settings: HealthSettings = defaults, recovery = off): HealthTracker {
  return new HealthTracker(n, settings, recovery);
}

function critical(settings: HealthSettings, xids: readonly number[]): number[] {
  return xids.filter((x) => isCritical(settings, x));
}

const SAMPLE = [1, 13, 31, 32, 43, 45, 48, 63, 68, 74, 79, 94, 95, 109, 119, 999];

// ---- settings ----

test('unset/unset: the six application XIDs are ignored, everything else is critical', () => {
  assert.deepEqual([...DEFAULT_IGNORED_XIDS], [13, 31, 43, 45, 68, 109]);
  for (const xid of DEFAULT_IGNORED_XIDS) assert.equal(isCritical(defaults, xid), false, `XID ${xid}`);
  for (const xid of [8, 32, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 0, 99999])
    assert.equal(isCritical(defaults, xid), true, `XID ${xid}`);
  assert.equal(watchesDoubleBitEcc(defaults), true);
  assert.equal(watchesLostGpus(defaults), true);
  assert.deepEqual(parseHealthSettings('', ''), defaults);
  assert.deepEqual(parseHealthSettings(' , ,', ' '), defaults);
});

test('disable=all or an item "xids" turns every check off, ECC and lost GPUs included', () => {
  for (const value of ['all', 'ALL', ' all ', 'xids', '13,xids', 'Xids , 31', 'all,48']) {
    const s = parseHealthSettings(value, undefined);
    assert.deepEqual(critical(s, SAMPLE), [], value);
    assert.equal(watchesDoubleBitEcc(s), false, value);
    assert.equal(watchesLostGpus(s), false, value);
  }
  // "xids" counts as an item, not as a substring
  assert.throws(() => parseHealthSettings('noxids', undefined), /"noxids" is not an XID/);
});

test('disable=13,... extends the default ignore list', () => {
  const s = parseHealthSettings('74, 119', undefined);
  assert.deepEqual(critical(s, SAMPLE), [1, 32, 48, 63, 79, 94, 95, 999]);
  assert.equal(watchesDoubleBitEcc(s), true);
  assert.equal(watchesLostGpus(s), true);
  // listing a default one again changes nothing
  assert.deepEqual(critical(parseHealthSettings('13', undefined), SAMPLE), critical(defaults, SAMPLE));
});

test('enable=31 makes a default-ignored XID critical; enable wins over disable', () => {
  const s = parseHealthSettings(undefined, '31');
  assert.equal(isCritical(s, 31), true);
  assert.equal(isCritical(s, 13), false);
  const both = parseHealthSettings('74,31', '31,74');
  assert.equal(isCritical(both, 31), true);
  assert.equal(isCritical(both, 74), true);
});

test('disable=all with enable=n watches only n', () => {
  const s = parseHealthSettings('all', '74');
  assert.deepEqual(critical(s, SAMPLE), [74]);
  assert.equal(watchesDoubleBitEcc(s), false);
  assert.equal(watchesLostGpus(s), false);
  // the ECC and lost checks follow XIDs 48 and 79 when everything else is off
  const memory = parseHealthSettings('all', '48,79');
  assert.deepEqual(critical(memory, SAMPLE), [48, 79]);
  assert.equal(watchesDoubleBitEcc(memory), true);
  assert.equal(watchesLostGpus(memory), true);
});

test('enable=all makes every XID critical, default-ignored and disabled ones included', () => {
  for (const disable of [undefined, '74', 'all']) {
    const s = parseHealthSettings(disable, 'all');
    assert.deepEqual(critical(s, SAMPLE), SAMPLE, String(disable));
    assert.equal(watchesDoubleBitEcc(s), true);
    assert.equal(watchesLostGpus(s), true);
  }
});

test('enable lists tolerate spaces and empty items', () => {
  const s = parseHealthSettings(undefined, ' 13 ,, 31 ,\t43 , ');
  assert.deepEqual([...s.enabledXids], [13, 31, 43]);
  assert.deepEqual(critical(s, DEFAULT_IGNORED_XIDS), [13, 31, 43]);
});

test('bad values are refused with the variable, the item and what would be right', () => {
  assert.throws(() => parseHealthSettings('13,abc', undefined), {
    message:
      'DP_DISABLE_HEALTHCHECKS: "abc" is not an XID; expected "all", "xids", or a comma list of XID numbers like 13,31',
  });
  assert.throws(() => parseHealthSettings(undefined, '48,x79'), {
    message:
      'DP_ENABLE_HEALTHCHECKS: "x79" is not an XID; expected "all", "xids", or a comma list of XID numbers like 48,79',
  });
  for (const bad of ['-1', '1.5', '0x10', '1e3', '+13', '1 3', '99999999999999999999', 'none']) {
    assert.throws(
      () => parseHealthSettings(bad, undefined),
      {
        message: new RegExp(`^DP_DISABLE_HEALTHCHECKS: ${JSON.stringify(bad).replace(/[.+]/g, '\\$&')} is not an XID`),
      },
      bad,
    );
  }
  assert.deepEqual([...parseHealthSettings(undefined, '013').enabledXids], [13]);
});

test('the settings describe themselves in one line', () => {
  assert.equal(
    describeHealthSettings(defaults),
    'every XID is critical except 13,31,43,45,68,109; double-bit ECC watched; lost GPUs watched',
  );
  assert.equal(
    describeHealthSettings(parseHealthSettings('74', '31')),
    'every XID is critical except 13,43,45,68,74,109; double-bit ECC watched; lost GPUs watched',
  );
  assert.equal(
    describeHealthSettings(parseHealthSettings('all', undefined)),
    'no XID is critical (health checks disabled); double-bit ECC ignored; lost GPUs ignored',
  );
  assert.equal(
    describeHealthSettings(parseHealthSettings('all', '79,74')),
    'only XIDs 74,79 are critical; double-bit ECC ignored; lost GPUs watched',
  );
  assert.equal(
    describeHealthSettings(parseHealthSettings(undefined, 'all')),
    'every XID is critical; double-bit ECC watched; lost GPUs watched',
  );
});

// ---- XID meanings ----

test('common XIDs have their catalog meaning; unknown ones point to the catalog', () => {
  assert.equal(xidMeaning(13), 'Graphics Engine Exception');
  assert.equal(xidMeaning(31), 'GPU memory page fault');
  assert.equal(xidMeaning(43), 'GPU stopped processing');
  assert.equal(xidMeaning(48), 'Double Bit ECC Error');
  assert.equal(xidMeaning(63), 'ECC page retirement or row remapping recording event');
  assert.equal(xidMeaning(74), 'NVLink error');
  assert.equal(xidMeaning(79), 'GPU has fallen off the bus');
  assert.equal(xidMeaning(94), 'Contained ECC error');
  assert.equal(xidMeaning(95), 'Uncontained ECC error');
  assert.equal(xidMeaning(109), 'Context switch timeout');
  assert.equal(xidMeaning(119), 'GSP RPC timeout');
  for (const xid of [32, 38, 45, 61, 62, 64, 68, 69, 92, 120, 121, 140])
    assert.notEqual(xidMeaning(xid), UNKNOWN_XID_MEANING, `XID ${xid}`);
  assert.equal(xidMeaning(4242), "unknown XID (see NVIDIA's XID catalog)");
  assert.equal(xidMeaning(Number.NaN), UNKNOWN_XID_MEANING);
});

// ---- tracker: marking unhealthy ----

test('each default-ignored XID leaves the GPU healthy', () => {
  const t = tracker(2);
  const before = t.health();
  for (const xid of DEFAULT_IGNORED_XIDS) {
    assert.deepEqual(t.apply({ kind: 'xid', gpu: 0, xid }, 1), [], `XID ${xid}`);
    assert.deepEqual(t.apply({ kind: 'xid', gpu: null, xid }, 1), [], `XID ${xid} on every GPU`);
  }
  assert.equal(t.health(), before);
  assert.deepEqual(t.health(), ['Healthy', 'Healthy']);
  assert.equal(t.nextDueMs(), null);
});

test('a critical XID marks the GPU unhealthy once, naming the XID and its meaning', () => {
  for (const xid of [79, 48, 63]) {
    const t = tracker(3);
    const changes = t.apply({ kind: 'xid', gpu: 1, xid }, 5);
    assert.deepEqual(changes, [
      {
        gpu: 1,
        health: 'Unhealthy',
        reason: `critical XID ${xid} (${xidMeaning(xid)})`,
        xid,
        meaning: xidMeaning(xid),
      },
    ]);
    assert.deepEqual(t.health(), ['Healthy', 'Unhealthy', 'Healthy']);
    const snapshot = t.health();
    assert.deepEqual(t.apply({ kind: 'xid', gpu: 1, xid: 74 }, 6), [], 'already unhealthy: no second transition');
    assert.equal(t.health(), snapshot);
  }
});

test('the settings decide: disable=all ignores XIDs, ECC and lost; enable=n watches n', () => {
  const t = tracker(1, parseHealthSettings('all', undefined));
  assert.deepEqual(t.apply({ kind: 'xid', gpu: 0, xid: 79 }, 1), []);
  assert.deepEqual(t.apply({ kind: 'ecc-double', gpu: 0 }, 2), []);
  assert.deepEqual(t.apply({ kind: 'probe', gpu: 0, result: 'lost' }, 3), []);
  assert.deepEqual(t.health(), ['Healthy']);

  const only = tracker(1, parseHealthSettings('all', '31'));
  assert.deepEqual(only.apply({ kind: 'xid', gpu: 0, xid: 79 }, 1), []);
  assert.equal(only.apply({ kind: 'xid', gpu: 0, xid: 31 }, 2)[0]?.xid, 31);
  assert.deepEqual(only.health(), ['Unhealthy']);
});

test('double-bit ECC marks unhealthy; single-bit ECC is only counted', () => {
  const t = tracker(2);
  for (let i = 0; i < 5; i++) assert.deepEqual(t.apply({ kind: 'ecc-single', gpu: 1 }, i), []);
  assert.equal(t.singleBitCount(1), 5);
  assert.equal(t.singleBitCount(0), 0);
  assert.equal(t.singleBitCount(7), 0);
  assert.deepEqual(t.health(), ['Healthy', 'Healthy']);
  assert.deepEqual(t.apply({ kind: 'ecc-double', gpu: 1 }, 10), [
    { gpu: 1, health: 'Unhealthy', reason: 'double-bit ECC error (uncorrectable memory error)' },
  ]);
  assert.deepEqual(t.apply({ kind: 'ecc-double', gpu: 1 }, 11), []);
  assert.deepEqual(t.health(), ['Healthy', 'Unhealthy']);
  // counted even when every check is off
  const quiet = tracker(1, parseHealthSettings('all', undefined));
  quiet.apply({ kind: 'ecc-single', gpu: 0 }, 1);
  assert.equal(quiet.singleBitCount(0), 1);
});

test('an event with no device concerns every GPU', () => {
  const t = tracker(3);
  const changes = t.apply({ kind: 'xid', gpu: null, xid: 79 }, 1);
  assert.deepEqual(
    changes.map((c) => c.gpu),
    [0, 1, 2],
  );
  assert.ok(changes.every((c) => c.health === 'Unhealthy' && c.xid === 79 && c.reason.includes('every GPU')));
  assert.deepEqual(t.health(), ['Unhealthy', 'Unhealthy', 'Unhealthy']);

  const e = tracker(2);
  assert.deepEqual(
    e.apply({ kind: 'ecc-double', gpu: null }, 1).map((c) => c.gpu),
    [0, 1],
  );
  const s = tracker(2);
  s.apply({ kind: 'ecc-single', gpu: null }, 1);
  assert.deepEqual([s.singleBitCount(0), s.singleBitCount(1)], [1, 1]);
  // a partly unhealthy node: only the healthy GPUs change
  const p = tracker(3);
  p.apply({ kind: 'xid', gpu: 1, xid: 74 }, 1);
  assert.deepEqual(
    p.apply({ kind: 'xid', gpu: null, xid: 74 }, 2).map((c) => c.gpu),
    [0, 2],
  );
});

test('GPU positions out of range are ignored without throwing', () => {
  const t = tracker(2, defaults, on);
  const before = t.health();
  for (const gpu of [2, 99, -1, 0.5, Number.NaN, Number.POSITIVE_INFINITY]) {
    assert.deepEqual(t.apply({ kind: 'xid', gpu, xid: 79 }, 1), []);
    assert.deepEqual(t.apply({ kind: 'ecc-double', gpu }, 1), []);
    assert.deepEqual(t.apply({ kind: 'ecc-single', gpu }, 1), []);
    assert.deepEqual(t.apply({ kind: 'probe', gpu, result: 'lost' }, 1), []);
    assert.deepEqual(t.apply({ kind: 'probe', gpu, result: 'ok' }, 1), []);
  }
  assert.equal(t.health(), before);
  assert.equal(t.singleBitCount(2), 0);
  // a tracker for a node with no GPUs takes events too
  assert.deepEqual(tracker(0).apply({ kind: 'xid', gpu: null, xid: 79 }, 1), []);
  assert.deepEqual(tracker(0).health(), []);
});

test('a lost GPU is unhealthy for good, even when later probes answer ok', () => {
  for (const recovery of [off, on]) {
    const t = tracker(2, defaults, recovery);
    assert.deepEqual(t.apply({ kind: 'probe', gpu: 0, result: 'lost' }, 0), [
      { gpu: 0, health: 'Unhealthy', reason: 'GPU is lost: NVML answered GPU_IS_LOST (fallen off the bus)' },
    ]);
    assert.deepEqual(t.apply({ kind: 'probe', gpu: 0, result: 'lost' }, 1), []);
    for (let now = 1000; now <= 10 * QUIET; now += 1000) {
      assert.deepEqual(t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, now), []);
      assert.deepEqual(t.tick(now), []);
    }
    assert.equal(t.nextDueMs(), null);
    assert.deepEqual(t.health(), ['Unhealthy', 'Healthy']);
  }
});

test('a GPU lost while unhealthy from a recoverable XID never recovers either', () => {
  const t = tracker(1, defaults, on);
  t.apply({ kind: 'xid', gpu: 0, xid: 74 }, 0);
  assert.deepEqual(t.apply({ kind: 'probe', gpu: 0, result: 'lost' }, 10), []);
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 20);
  assert.deepEqual(t.tick(10 * QUIET), []);
  assert.equal(t.nextDueMs(), null);
  // also when lost GPUs are not watched (every check off but XID 74)
  const u = tracker(1, parseHealthSettings('all', '74'), on);
  u.apply({ kind: 'xid', gpu: 0, xid: 74 }, 0);
  assert.deepEqual(u.apply({ kind: 'probe', gpu: 0, result: 'lost' }, 10), []);
  u.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 20);
  assert.deepEqual(u.tick(10 * QUIET), []);
  assert.deepEqual(u.health(), ['Unhealthy']);
});

// ---- tracker: recovery ----

test('with recovery off an unhealthy GPU never recovers (NVIDIA behaviour)', () => {
  const t = tracker(1);
  t.apply({ kind: 'xid', gpu: 0, xid: 74 }, 0);
  for (let now = 1000; now <= 100 * QUIET; now += 30_000) {
    assert.deepEqual(t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, now), []);
    assert.deepEqual(t.tick(now), []);
    assert.equal(t.nextDueMs(), null);
  }
  assert.deepEqual(t.health(), ['Unhealthy']);
});

test('with recovery on, a GPU recovers once the quiet period has passed with an ok probe in it', () => {
  const t = tracker(2, defaults, on);
  t.apply({ kind: 'xid', gpu: 1, xid: 74 }, 1000);
  assert.equal(t.nextDueMs(), null, 'nothing pending before an ok probe');
  assert.deepEqual(t.tick(1000 + QUIET), [], 'the quiet period alone is not enough');
  assert.deepEqual(t.apply({ kind: 'probe', gpu: 1, result: 'ok' }, 2000), [], 'an ok probe alone is not enough');
  assert.equal(t.nextDueMs(), 1000 + QUIET);
  assert.deepEqual(t.tick(1000 + QUIET - 1), []);
  const unhealthy = t.health();
  const changes = t.tick(1000 + QUIET);
  assert.deepEqual(changes, [
    {
      gpu: 1,
      health: 'Healthy',
      reason: `recovered from XID 74 (NVLink error): probes answered ok and no critical XID for ${QUIET} ms`,
      xid: 74,
      meaning: 'NVLink error',
    },
  ]);
  assert.notEqual(t.health(), unhealthy);
  assert.deepEqual(t.health(), ['Healthy', 'Healthy']);
  assert.equal(t.nextDueMs(), null);
  assert.deepEqual(t.tick(1000 + 2 * QUIET), [], 'reported once');
  // and it can fail again
  assert.equal(t.apply({ kind: 'xid', gpu: 1, xid: 74 }, 1000 + 3 * QUIET).length, 1);
});

test('an ok probe that arrives after the quiet period recovers the GPU at once', () => {
  const t = tracker(1, defaults, on);
  t.apply({ kind: 'xid', gpu: 0, xid: 119 }, 0);
  const changes = t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 2 * QUIET);
  assert.deepEqual(
    changes.map((c: HealthChange) => [c.gpu, c.health, c.xid]),
    [[0, 'Healthy', 119]],
  );
  // the probe counts from the very start of the quiet period (same millisecond)
  const same = tracker(1, defaults, on);
  same.apply({ kind: 'xid', gpu: 0, xid: 119 }, 500);
  same.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 500);
  assert.equal(same.nextDueMs(), 500 + QUIET);
  // but not a probe from before the XID, even if applied late
  const stale = tracker(1, defaults, on);
  stale.apply({ kind: 'xid', gpu: 0, xid: 119 }, 500);
  stale.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 499);
  assert.equal(stale.nextDueMs(), null);
});

test('a new critical XID during the quiet period delays recovery; an ignored one does not', () => {
  const t = tracker(1, defaults, on);
  t.apply({ kind: 'xid', gpu: 0, xid: 74 }, 0);
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 10_000);
  assert.equal(t.nextDueMs(), QUIET);
  assert.deepEqual(t.apply({ kind: 'xid', gpu: 0, xid: 13 }, 20_000), [], 'ignored XID');
  assert.equal(t.nextDueMs(), QUIET);
  assert.deepEqual(t.apply({ kind: 'xid', gpu: 0, xid: 119 }, 30_000), [], 'still unhealthy, quiet period restarts');
  assert.equal(t.nextDueMs(), null, 'the ok probes before the new XID no longer count');
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 40_000);
  assert.equal(t.nextDueMs(), 30_000 + QUIET);
  assert.deepEqual(t.tick(QUIET), []);
  const changes = t.tick(30_000 + QUIET);
  assert.deepEqual(
    changes.map((c) => [c.health, c.xid]),
    [['Healthy', 119]],
  );
});

test('a probe that is not ok resets the quiet period for good', () => {
  const t = tracker(1, defaults, on);
  t.apply({ kind: 'xid', gpu: 0, xid: 74 }, 0);
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 10_000);
  assert.equal(t.nextDueMs(), QUIET);
  t.apply({ kind: 'probe', gpu: 0, result: 'lost' }, 20_000);
  assert.equal(t.nextDueMs(), null);
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 30_000);
  assert.equal(t.nextDueMs(), null);
  assert.deepEqual(t.tick(QUIET * 5), []);
});

test('double-bit ECC and the non-recoverable XIDs never recover', () => {
  assert.deepEqual(
    [...NON_RECOVERABLE_XIDS].sort((a, b) => a - b),
    [48, 64, 79, 95, 140],
  );
  const t = tracker(1, defaults, on);
  t.apply({ kind: 'ecc-double', gpu: 0 }, 0);
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 1);
  assert.equal(t.nextDueMs(), null);
  assert.deepEqual(t.tick(10 * QUIET), []);
  for (const xid of NON_RECOVERABLE_XIDS) {
    const x = tracker(1, defaults, on);
    x.apply({ kind: 'xid', gpu: 0, xid }, 0);
    x.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 1);
    assert.equal(x.nextDueMs(), null, `XID ${xid}`);
    assert.deepEqual(x.tick(10 * QUIET), [], `XID ${xid}`);
  }
  // a recoverable XID followed by a double-bit error: permanent too
  const y = tracker(1, defaults, on);
  y.apply({ kind: 'xid', gpu: 0, xid: 74 }, 0);
  assert.deepEqual(y.apply({ kind: 'ecc-double', gpu: 0 }, 1), []);
  y.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 2);
  assert.deepEqual(y.tick(10 * QUIET), []);
});

test('nextDueMs is the earliest pending recovery across GPUs', () => {
  const t = tracker(3, defaults, on);
  t.apply({ kind: 'xid', gpu: 0, xid: 74 }, 5000);
  t.apply({ kind: 'xid', gpu: 2, xid: 74 }, 1000);
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 6000);
  assert.equal(t.nextDueMs(), 5000 + QUIET);
  t.apply({ kind: 'probe', gpu: 2, result: 'ok' }, 6000);
  assert.equal(t.nextDueMs(), 1000 + QUIET);
  assert.deepEqual(
    t.tick(1000 + QUIET).map((c) => c.gpu),
    [2],
  );
  assert.equal(t.nextDueMs(), 5000 + QUIET);
  assert.deepEqual(
    t.tick(5000 + QUIET).map((c) => c.gpu),
    [0],
  );
  assert.equal(t.nextDueMs(), null);
});

test('an overdue recovery is reported before the event that follows it', () => {
  const t = tracker(1, defaults, on);
  t.apply({ kind: 'xid', gpu: 0, xid: 74 }, 0);
  t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 1000);
  // nobody called tick() at QUIET; the next XID comes later
  const changes = t.apply({ kind: 'xid', gpu: 0, xid: 119 }, QUIET + 5000);
  assert.deepEqual(
    changes.map((c) => [c.health, c.xid]),
    [
      ['Healthy', 74],
      ['Unhealthy', 119],
    ],
  );
  assert.deepEqual(t.health(), ['Unhealthy']);
});

test('a zero quiet period recovers at the first ok probe after the XID', () => {
  const t = tracker(1, defaults, { enabled: true, quietMs: 0 });
  t.apply({ kind: 'xid', gpu: 0, xid: 74 }, 100);
  assert.deepEqual(
    t.apply({ kind: 'probe', gpu: 0, result: 'ok' }, 100).map((c) => c.health),
    ['Healthy'],
  );
});

test('bad tracker configuration is refused at construction', () => {
  assert.throws(() => new HealthTracker(-1, defaults, off), RangeError);
  assert.throws(() => new HealthTracker(1.5, defaults, off), RangeError);
  assert.throws(() => new HealthTracker(1, defaults, { enabled: true, quietMs: Number.NaN }), RangeError);
  assert.throws(() => new HealthTracker(1, defaults, { enabled: true, quietMs: -1 }), RangeError);
});

// ---- storms ----

test('a storm of 100 000 critical XIDs on one GPU makes exactly one change', () => {
  for (const recovery of [off, on]) {
    const t = tracker(8, defaults, recovery);
    let changes = 0;
    for (let i = 0; i < 100_000; i++) changes += t.apply({ kind: 'xid', gpu: 3, xid: 74 }, i / 10).length;
    assert.equal(changes, 1);
    const after = t.health();
    for (let i = 0; i < 100_000; i++) t.apply({ kind: 'xid', gpu: 3, xid: 119 }, 10_000 + i / 10);
    assert.equal(t.health(), after, 'health() keeps its identity through the storm');
    assert.deepEqual(after, ['Healthy', 'Healthy', 'Healthy', 'Unhealthy', 'Healthy', 'Healthy', 'Healthy', 'Healthy']);
  }
  // a storm of ignored XIDs and single-bit errors: no change, counts kept as numbers
  const t = tracker(2);
  const before = t.health();
  for (let i = 0; i < 100_000; i++) {
    t.apply({ kind: 'xid', gpu: null, xid: 13 }, i);
    t.apply({ kind: 'ecc-single', gpu: 0 }, i);
  }
  assert.equal(t.health(), before);
  assert.equal(t.singleBitCount(0), 100_000);
});

test('watchesAnything: false only when every check is off and nothing is enabled', () => {
  assert.equal(watchesAnything(parseHealthSettings(undefined, undefined)), true);
  assert.equal(watchesAnything(parseHealthSettings('79', undefined)), true);
  assert.equal(watchesAnything(parseHealthSettings('all', undefined)), false);
  assert.equal(watchesAnything(parseHealthSettings('xids', undefined)), false);
  assert.equal(watchesAnything(parseHealthSettings('all', '74')), true);
  assert.equal(watchesAnything(parseHealthSettings('all', 'all')), true);
});
