// The example configuration file the packages install (packaging/config.example.yaml, in
// /usr/share/doc/gpu-device-plugin/examples/): the plugin's own parser accepts it, and it shows what
// it says it shows (time-slicing of whole GPUs and of a MIG profile, the MIG strategy). The daemon
// running it on a MIG node is test/e2e/example-config.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { parseOptions } from '../../src/config/parse-options.ts';
import { EXAMPLE_CONFIG } from '../../build/package.ts';

test(
  'the packaged example config is NVIDIA v1 and parses: MIG ' +
    'strategy mixed, time-slicing of GPUs and of a MIG profile',
  () => {
    const text = readFileSync(EXAMPLE_CONFIG.source, 'utf8');
    assert.match(text, /^version: v1$/m);
    const { options, origins, sharing, foreignConfigKeys } = parseOptions(['--config-file', EXAMPLE_CONFIG.source], {});
    assert.equal(options.migStrategy, 'mixed');
    assert.equal(origins.migStrategy, `config file ${EXAMPLE_CONFIG.source}`);
    assert.deepEqual(options.deviceListStrategy, ['envvar']);
    assert.equal(options.deviceIdStrategy, 'uuid');
    assert.equal(options.sharedDevicesAllocationPolicy, 'distributed');
    assert.deepEqual(foreignConfigKeys, []);
    const ts = sharing.timeSlicing;
    assert.ok(ts !== null, 'time-slicing is configured');
    assert.equal(ts.renameByDefault, false);
    assert.equal(ts.failRequestsGreaterThanOne, false);
    assert.deepEqual(
      ts.resources.map((r) => [r.name, r.replicas, r.rename, r.devices.kind]),
      [
        ['nvidia.com/gpu', 4, null, 'all'],
        ['nvidia.com/mig-1g.10gb', 2, null, 'all'],
      ],
    );
  },
);

test('the environment wins over the example file, as the comments in it say', () => {
  const { options, origins } = parseOptions(['--config-file', EXAMPLE_CONFIG.source], { MIG_STRATEGY: 'none' });
  assert.equal(options.migStrategy, 'none');
  assert.equal(origins.migStrategy, 'environment');
});
