// The DRAResourceHealth stream's sending (src/dra/health.ts), in process with mocked timers: every report
// states its timeout, the whole list is sent again every third of it (so the kubelet, which shows a device
// as Unknown once its last report is older than the stated timeout, never sees one go stale), and the
// timeout read from DRA_HEALTH_TIMEOUT_SECONDS is checked.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { HealthStatus } from '../../src/api/dra.ts';
import type { NodeWatchResourcesResponse } from '../../src/api/dra.ts';
import { OptionError } from '../../src/config/errors.ts';
import type { DraNodeDevice } from '../../src/core/dra-claims.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import type { NodeSnapshot, UnitHealth } from '../../src/core/snapshot.ts';
import { HealthStream, healthTimeoutFromEnv, resendPeriodMs } from '../../src/dra/health.ts';

const devices: DraNodeDevice[] = [
  { name: 'gpu-0', gpuUuid: 'GPU-a', gpuIndex: 0, minor: 0 },
  { name: 'gpu-1', gpuUuid: 'GPU-b', gpuIndex: 1, minor: 1 },
];

function snapshot(bHealthy: boolean): NodeSnapshot {
  const fresh: UnitHealth = { state: freshHealthState(), reason: null, since: null };
  const sick: UnitHealth = {
    state: { ...freshHealthState(), health: 'Unhealthy' },
    reason: 'critical XID 79',
    since: 1_700_000_100_000,
  };
  const snap = {
    driverVersion: '550.54.15',
    gpuHealth: new Map([
      ['GPU-a', fresh],
      ['GPU-b', bHealthy ? fresh : sick],
    ]),
    migHealth: new Map(),
    health: new Map([
      ['GPU-a', 'Healthy' as const],
      ['GPU-b', bHealthy ? ('Healthy' as const) : ('Unhealthy' as const)],
    ]),
  };
  return snap as unknown as NodeSnapshot;
}

/** A server stream as gRPC hands it to the handler: what was written, and the events the stream drops on. */
class FakeCall extends EventEmitter {
  readonly written: NodeWatchResourcesResponse[] = [];
  ended = false;
  write(msg: NodeWatchResourcesResponse): boolean {
    this.written.push(msg);
    return true;
  }
  end(): void {
    this.ended = true;
    this.emit('finish');
  }
}

function open(stream: HealthStream): FakeCall {
  const call = new FakeCall();
  const binding = stream.bindings()[0];
  assert.ok(binding !== undefined);
  const handler = (binding.implementation as { NodeWatchResources: (c: unknown) => void }).NodeWatchResources;
  handler(call);
  return call;
}

test('the resend period is a third of the stated timeout: 10 s for the kubelet default 30 s', () => {
  assert.equal(resendPeriodMs(30), 10_000);
  assert.equal(resendPeriodMs(3), 1000);
  assert.equal(resendPeriodMs(1), 333);
});

test('each report states its timeout, and the whole list is sent again every third of it', (t) => {
  t.mock.timers.enable({ apis: ['setInterval', 'setTimeout'] });
  const stream = new HealthStream('node-a');
  t.after(() => void stream.close());
  stream.update(snapshot(false), devices, 1_700_000_000);
  const call = open(stream);
  assert.equal(call.written.length, 1, 'the whole list when the stream opens');
  t.mock.timers.tick(9_999);
  assert.equal(call.written.length, 1, 'nothing new before the resend period');
  t.mock.timers.tick(1);
  assert.equal(call.written.length, 2, 'the list again after 10 s, though nothing changed');
  t.mock.timers.tick(20_000);
  assert.equal(call.written.length, 4, 'and every 10 s after');
  for (const msg of call.written) {
    assert.deepEqual(
      msg.devices.map((d) => [d.device?.device_name, d.health, d.health_check_timeout_seconds, d.message]),
      [
        ['gpu-0', HealthStatus.HEALTHY, 30, ''],
        ['gpu-1', HealthStatus.UNHEALTHY, 30, 'critical XID 79'],
      ],
      'each message the whole list, the Unhealthy device still Unhealthy, the timeout stated',
    );
  }
  // The time of the last change stays the device's own: a resend is not a change.
  assert.equal(call.written[3]?.devices[1]?.last_updated_time, 1_700_000_100);
});

test('a change is sent at once; the resends go on with the new list; a closed stream gets none', async (t) => {
  t.mock.timers.enable({ apis: ['setInterval', 'setTimeout'] });
  const stream = new HealthStream('node-a', 3);
  stream.update(snapshot(true), devices, 1_700_000_000);
  const call = open(stream);
  stream.update(snapshot(true), devices, 1_700_000_000);
  assert.equal(call.written.length, 1, 'the same list is not sent again on an update');
  stream.update(snapshot(false), devices, 1_700_000_000);
  assert.equal(call.written.length, 2, 'a change is sent at once');
  t.mock.timers.tick(1000);
  assert.equal(call.written.length, 3);
  assert.equal(call.written[2]?.devices[1]?.health, HealthStatus.UNHEALTHY);
  assert.equal(call.written[2]?.devices[1]?.health_check_timeout_seconds, 3);
  call.emit('cancelled');
  t.mock.timers.tick(1000);
  assert.equal(call.written.length, 3, 'a stream the kubelet cancelled gets no resend');
  const other = open(stream);
  await stream.close();
  const before = other.written.length;
  t.mock.timers.tick(5000);
  assert.equal(other.written.length, before, 'nothing is sent after close');
  assert.ok(other.ended, 'close ends the open stream');
});

test('a stated timeout outside whole seconds 1–3600 is refused', () => {
  assert.throws(() => new HealthStream('node-a', 0), /timeout 0 s is not whole seconds in 1–3600/);
  assert.throws(() => new HealthStream('node-a', 1.5), RangeError);
});

test('DRA_HEALTH_TIMEOUT_SECONDS: unset or empty is 30; whole seconds 1–3600; anything else named', () => {
  assert.equal(healthTimeoutFromEnv({}), 30);
  assert.equal(healthTimeoutFromEnv({ DRA_HEALTH_TIMEOUT_SECONDS: '' }), 30);
  assert.equal(healthTimeoutFromEnv({ DRA_HEALTH_TIMEOUT_SECONDS: '2' }), 2);
  assert.equal(healthTimeoutFromEnv({ DRA_HEALTH_TIMEOUT_SECONDS: '3600' }), 3600);
  for (const bad of ['0', '3601', '1.5', '10s', '-2', 'x']) {
    assert.throws(
      () => healthTimeoutFromEnv({ DRA_HEALTH_TIMEOUT_SECONDS: bad }),
      (err: unknown) =>
        err instanceof OptionError &&
        err.message.includes(`DRA_HEALTH_TIMEOUT_SECONDS=${JSON.stringify(bad)}`) &&
        err.message.includes('whole seconds from 1 to 3600'),
      bad,
    );
  }
});
