// The config file's `dra` section, this project's own (NVIDIA's device plugin has none):
//   dra:
//     consumableCapacity:
//       memory:                              the request policy of each whole GPU's memory
//         default: 8Gi                       what a claim asking for no amount gets
//         validRange: {min: 1Gi, max: 40Gi, step: 1Gi}     or: validValues: [4Gi, 8Gi, 16Gi]
//     dynamicMig: true                       dynamic MIG (partitionable devices), off by default
// consumableCapacity's presence is the opt-in: with it, DRA mode publishes every whole GPU for several
// allocations at once, each consuming a share of its memory. Quantities are Kubernetes quantities (a string
// such as 8Gi, or a whole number of bytes). Checked whole, each refusal naming its key path and what would
// be right; the rules are Kubernetes' own for a capacity's requestPolicy (core/dra-capacity.ts), so that the
// API server never refuses a slice for them. Whether the policy fits the GPUs is checked against the node
// (core/config-fit.ts).
import { policyProblem } from '../core/dra-capacity.ts';
import type { ConsumableCapacity, RequestPolicy } from '../core/dra-capacity.ts';
import { parseQuantity } from '../core/quantity.ts';
import { showValue } from './config-reader.ts';
import type { Reader } from './config-reader.ts';

const QUANTITY = 'a quantity such as 8Gi, 512Mi or 40G (or a whole number of bytes)';

function quantity(r: Reader, v: unknown, path: string): number {
  if (v === undefined || v === null) return r.fail(path, `missing; expected ${QUANTITY}`);
  const text = typeof v === 'number' && Number.isInteger(v) ? String(v) : typeof v === 'string' ? v.trim() : null;
  const bytes = text === null ? null : parseQuantity(text);
  if (bytes === null) return r.fail(path, `${showValue(v)} is not allowed; expected ${QUANTITY}`);
  return bytes;
}

function validValues(r: Reader, v: unknown, path: string): number[] {
  if (!Array.isArray(v)) return r.fail(path, `${showValue(v)} is not allowed; expected a list of quantities`);
  return v.map((item: unknown, i) => quantity(r, item, `${path}[${i}]`));
}

function validRange(r: Reader, v: unknown, path: string): NonNullable<RequestPolicy['validRange']> {
  const m = r.mapping(v, path);
  if (m === null) return r.fail(path, 'null is not allowed; expected {min, max?, step?}');
  r.keys(m, path, ['min', 'max', 'step']);
  const min = quantity(r, m.min, `${path}.min`);
  const max = m.max === undefined || m.max === null ? undefined : quantity(r, m.max, `${path}.max`);
  const step = m.step === undefined || m.step === null ? undefined : quantity(r, m.step, `${path}.step`);
  return { min, ...(max === undefined ? {} : { max }), ...(step === undefined ? {} : { step }) };
}

function requestPolicy(r: Reader, v: unknown, path: string): RequestPolicy {
  const m = r.mapping(v, path);
  if (m === null) return r.fail(path, 'missing; expected {default, validRange} or {default, validValues}');
  r.keys(m, path, ['default', 'validValues', 'validRange']);
  const present = (k: string): boolean => m[k] !== undefined && m[k] !== null;
  const policy: RequestPolicy = {
    default: quantity(r, m.default, `${path}.default`),
    ...(present('validValues') ? { validValues: validValues(r, m.validValues, `${path}.validValues`) } : {}),
    ...(present('validRange') ? { validRange: validRange(r, m.validRange, `${path}.validRange`) } : {}),
  };
  const problem = policyProblem(policy);
  if (problem !== null) r.fail(problem.field === '' ? path : `${path}.${problem.field}`, problem.message);
  return policy;
}

/** What the `dra` section sets (DRA mode only): whole GPUs' consumable capacity, dynamic MIG. */
export interface DraSettings {
  readonly consumableCapacity?: ConsumableCapacity;
  readonly dynamicMig?: boolean;
}

/** The `dra` settings of parsed options. */
export function draOf(p: {
  readonly consumableCapacity?: ConsumableCapacity;
  readonly dynamicMig?: boolean;
}): DraSettings {
  return {
    ...(p.consumableCapacity === undefined ? {} : { consumableCapacity: p.consumableCapacity }),
    ...(p.dynamicMig === undefined ? {} : { dynamicMig: p.dynamicMig }),
  };
}

/** The `dra` section; an empty object when the file has none. */
export function draSection(r: Reader, v: unknown): DraSettings {
  const dra = r.mapping(v, 'dra');
  if (dra === null) return {};
  r.keys(dra, 'dra', ['consumableCapacity', 'dynamicMig']);
  const m = dra.dynamicMig;
  if (m !== undefined && m !== null && typeof m !== 'boolean')
    r.fail('dra.dynamicMig', `${showValue(m)} is not allowed; expected true or false`);
  const dynamicMig = typeof m === 'boolean' ? { dynamicMig: m } : {};
  const cc = r.mapping(dra.consumableCapacity, 'dra.consumableCapacity');
  if (cc === null) return dynamicMig;
  r.keys(cc, 'dra.consumableCapacity', ['memory']);
  return {
    consumableCapacity: { memory: requestPolicy(r, cc.memory, 'dra.consumableCapacity.memory') },
    ...dynamicMig,
  };
}
