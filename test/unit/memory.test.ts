// The idle-compaction decision (src/system/memory.ts): only after the heap grew, and only in a quiet interval.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DEFAULT_POLICY, shouldCompact } from '../../src/system/memory.ts';

const MiB = 1024 * 1024;

test(
  'memory: compacts after the resident set grew past the threshold ' +
    'and an interval was quiet; never while busy, never without growth',
  () => {
    const base = 10 * MiB;
    assert.equal(shouldCompact({ busyFraction: 0.001, rssBytes: base + 5 * MiB }, base), true);
    assert.equal(shouldCompact({ busyFraction: 0.001, rssBytes: base + DEFAULT_POLICY.growthBytes }, base), true);
    // Busy: an interval in which the loop worked more than the quiet fraction.
    assert.equal(shouldCompact({ busyFraction: 0.2, rssBytes: base + 30 * MiB }, base), false);
    // V8's clean-up collection right after a burst (about 2 % busy) still counts as quiet.
    assert.equal(shouldCompact({ busyFraction: 0.022, rssBytes: base + 30 * MiB }, base), true);
    assert.equal(
      shouldCompact({ busyFraction: DEFAULT_POLICY.quietBusyFraction + 0.001, rssBytes: base + 30 * MiB }, base),
      false,
    );
    // Quiet but not grown (an idle daemon's churn stays under the threshold).
    assert.equal(shouldCompact({ busyFraction: 0, rssBytes: base + 3 * MiB }, base), false);
    assert.equal(shouldCompact({ busyFraction: 0, rssBytes: base - 5 * MiB }, base), false);
    // Another policy.
    assert.equal(
      shouldCompact({ busyFraction: 0.04, rssBytes: base + MiB }, base, { growthBytes: MiB, quietBusyFraction: 0.05 }),
      true,
    );
  },
);
