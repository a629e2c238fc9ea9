// core/dra-capacity.ts: the consumable capacity's request policy — Kubernetes' rules for it, whether it fits
// the node's GPUs (core/config-fit.ts refuses a start that it does not, naming the key and the GPU, as `check`
// does), and its ResourceSlice form.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fitAtStart } from '../../src/core/config-fit.ts';
import { capacityFitProblem, policyFitProblem, policyProblem, wireRequestPolicy } from '../../src/core/dra-capacity.ts';
import type { ConsumableCapacity } from '../../src/core/dra-capacity.ts';
import { NO_MIG } from '../../src/core/mig.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { fixtureSnapshot } from '../support/node-scan.ts';

const GI = 2 ** 30;

test('a policy with a default inside its range or values has no problem', () => {
  assert.equal(policyProblem({ default: 8 * GI, validRange: { min: GI, max: 40 * GI, step: GI } }), null);
  assert.equal(policyProblem({ default: 8 * GI, validRange: { min: GI } }), null);
  assert.equal(policyProblem({ default: 8 * GI, validValues: [4 * GI, 8 * GI] }), null);
  assert.deepEqual(policyProblem({ default: 8 * GI, validRange: { min: 0, step: 3 * GI } }), {
    field: 'default',
    message: '8Gi is not min (0) plus a whole number of steps (3Gi); expected 6Gi or 9Gi',
  });
});

test('fit: no value, min, max or min + step above a GPU memory; the first GPU too small is named', async () => {
  assert.equal(policyFitProblem({ default: 8 * GI, validRange: { min: GI, max: 80 * GI, step: GI } }, 80 * GI), null);
  assert.deepEqual(policyFitProblem({ default: 8 * GI, validRange: { min: GI, max: 96 * GI } }, 80 * GI), {
    field: 'validRange.max',
    message: "96Gi is more than the GPU's memory (80Gi)",
  });
  assert.deepEqual(policyFitProblem({ default: 0, validRange: { min: 0, step: 81 * GI } }, 80 * GI), {
    field: 'validRange.step',
    message: "min plus one step (81Gi) is more than the GPU's memory (80Gi)",
  });
  assert.deepEqual(
    policyFitProblem({ default: 8 * GI, validValues: [8 * GI, 100 * GI] }, 80 * GI)?.field,
    'validValues[1]',
  );

  const s = await fixtureSnapshot('nvswitch-8.json');
  const gpus = s.gpus.map((g, i) => (i === 6 ? { ...g, memoryBytes: 40 * GI } : g));
  const cc: ConsumableCapacity = { memory: { default: 48 * GI, validRange: { min: GI } } };
  const problem = capacityFitProblem(gpus, cc);
  assert.equal(problem?.path, 'dra.consumableCapacity.memory.default');
  assert.match(
    problem?.message ?? '',
    new RegExp(`^48Gi is more than GPU 6's \\(${gpus[6]?.uuid}\\) memory \\(40Gi\\); `),
  );
  assert.equal(capacityFitProblem(s.gpus, cc), null);
  assert.equal(capacityFitProblem(gpus, undefined), null);

  // The start's fit (the daemon's and `check`'s): refused with the key to change.
  const settings = { deviceIdStrategy: 'uuid' as const, sharing: NO_SHARING, consumableCapacity: cc };
  const fit = fitAtStart(gpus, NO_MIG, settings, new Map());
  assert.equal(fit.ok, false);
  assert.equal(fit.ok ? null : fit.key, 'dra.consumableCapacity.memory.default');
  assert.equal(fitAtStart(s.gpus, NO_MIG, settings, new Map()).ok, true);
});

test('the slice form: quantities in binary units where whole, only the fields set', () => {
  assert.deepEqual(wireRequestPolicy({ default: 8 * GI, validRange: { min: 512 * 2 ** 20, step: 512 * 2 ** 20 } }), {
    default: '8Gi',
    validRange: { min: '512Mi', step: '512Mi' },
  });
  assert.deepEqual(wireRequestPolicy({ default: 1e9, validValues: [1e9, 2 * GI] }), {
    default: '1000000000',
    validValues: ['1000000000', '2Gi'],
  });
});
