import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseOptions } from '../../src/config/parse-options.ts';
import { planReload } from '../../src/config/reload.ts';

test('a reload applies reloadable options, keeps restart-only ones at their running value, and names both', () => {
  const running = parseOptions(['--device-list-strategy=envvar', '--log-level=info', '--rediscover-interval=60'], {});
  const next = parseOptions(['--device-list-strategy=cdi-cri', '--log-level=debug', '--rediscover-interval=5'], {});
  const r = planReload(running.options, running.sharing, next);
  assert.deepEqual([...r.changed].sort(), ['--device-list-strategy', '--rediscover-interval']);
  assert.deepEqual(r.restartOnly, ['--log-level']);
  assert.equal(r.options.logLevel, 'info', 'restart-only: the running value is kept');
  assert.deepEqual(r.options.deviceListStrategy, ['cdi-cri']);
  assert.equal(r.options.rediscoverInterval, 5);
  assert.equal(r.sharingChanged, false);
});

test('an unchanged reload changes nothing', () => {
  const running = parseOptions([], {});
  const r = planReload(running.options, running.sharing, parseOptions([], {}));
  assert.deepEqual(r.changed, []);
  assert.deepEqual(r.restartOnly, []);
  assert.equal(r.sharingChanged, false);
});
