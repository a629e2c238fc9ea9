import assert from 'node:assert/strict';
import { test } from 'node:test';
import { bytesQuantity, parseQuantity } from '../../src/core/quantity.ts';

test('parseQuantity reads binary, decimal, exponent and fractional quantities exactly', () => {
  assert.equal(parseQuantity('10Gi'), 10 * 2 ** 30);
  assert.equal(parseQuantity('512Mi'), 512 * 2 ** 20);
  assert.equal(parseQuantity('1.5Gi'), 1.5 * 2 ** 30);
  assert.equal(parseQuantity('80G'), 80e9);
  assert.equal(parseQuantity('1k'), 1000);
  assert.equal(parseQuantity('1e9'), 1e9);
  assert.equal(parseQuantity('0.1k'), 100);
  assert.equal(parseQuantity('1.1'), 2, 'a fraction of a byte rounds up');
  assert.equal(parseQuantity('4096'), 4096);
  assert.equal(parseQuantity('0'), 0);
  assert.equal(parseQuantity('+1Ki'), 1024);
});

test('parseQuantity refuses what is not a byte count', () => {
  for (const bad of ['', 'Gi', '10 Gi', ' 10Gi', '10gi', '10GB', '-1Gi', '1e99', '16Ei', 'ten'])
    assert.equal(parseQuantity(bad), null, bad);
});

test('bytesQuantity writes the largest whole binary unit, as the API server reads back', () => {
  assert.equal(bytesQuantity(81920 * 2 ** 20), '80Gi');
  assert.equal(bytesQuantity(19968 * 2 ** 20), '19968Mi');
  assert.equal(bytesQuantity(1536), '1536');
  assert.equal(bytesQuantity(1000), '1000');
  assert.equal(parseQuantity(bytesQuantity(19968 * 2 ** 20)), 19968 * 2 ** 20);
});
