// Consumable capacity of whole GPUs under DRA (resource.k8s.io/v1 `allowMultipleAllocations` and a capacity's
// `requestPolicy`): the policy an operator sets for each whole GPU's memory, its rules, whether it fits the
// node's GPUs, and how it is written in a ResourceSlice. Pure.
//
// RULES, as Kubernetes' validation has them for a capacity's requestPolicy (pkg/apis/resource/validation),
// with byte counts:
// * exactly one of validValues and validRange; default required, and one of the valid values or inside the
//   range (at least min, at most max, min plus a whole number of steps);
// * validValues: 1 to 10 values, ascending, no duplicates;
// * validRange: min required; max, when given, at least min (and min plus a whole number of steps); step,
//   when given, above zero.
// Against each GPU's memory (the capacity's value): no valid value, min, max or min + step above it. The
// config file reader checks the first set (policyProblem); the second is the config's fit to the node
// (capacityFitProblem), checked against every whole GPU when the settings are put in force.
import { bytesQuantity } from './quantity.ts';
import type { Gpu } from './devices.ts';

/** A capacity's request policy, in bytes. */
export interface RequestPolicy {
  /** What a claim that asks for no amount consumes. */
  readonly default: number;
  readonly validValues?: readonly number[];
  readonly validRange?: { readonly min: number; readonly max?: number; readonly step?: number };
}

/** The consumable capacity of every whole GPU: its memory's request policy. */
export interface ConsumableCapacity {
  readonly memory: RequestPolicy;
}

/** The most valid values a policy may list (Kubernetes' CapacityRequestPolicyDiscreteMaxOptions). */
export const MAX_VALID_VALUES = 10;

/** A problem with a policy: the key under the policy (`default`, `validRange.min`, …) and what is wrong. */
export interface PolicyProblem {
  readonly field: string;
  readonly message: string;
}

const q = bytesQuantity;

function rangeProblem(p: RequestPolicy, r: NonNullable<RequestPolicy['validRange']>): PolicyProblem | null {
  const { min, max, step } = r;
  if (step !== undefined && step <= 0)
    return { field: 'validRange.step', message: `${q(step)} is not allowed; a step must be above zero` };
  if (max !== undefined && max < min)
    return { field: 'validRange.max', message: `${q(max)} is less than min (${q(min)}); expected at least ${q(min)}` };
  if (p.default < min) return { field: 'default', message: `${q(p.default)} is less than validRange.min (${q(min)})` };
  if (max !== undefined && p.default > max)
    return { field: 'default', message: `${q(p.default)} is more than validRange.max (${q(max)})` };
  if (step !== undefined) {
    const offStep = (field: string, v: number): PolicyProblem | null => {
      if ((v - min) % step === 0) return null;
      const [below, above] = [Math.floor, Math.ceil].map((round) => q(min + round((v - min) / step) * step));
      const what = `${q(v)} is not min (${q(min)}) plus a whole number of steps (${q(step)})`;
      return { field, message: `${what}; expected ${below} or ${above}` };
    };
    return offStep('default', p.default) ?? (max === undefined ? null : offStep('validRange.max', max));
  }
  return null;
}

function valuesProblem(p: RequestPolicy, values: readonly number[]): PolicyProblem | null {
  if (values.length === 0)
    return { field: 'validValues', message: 'an empty list is not allowed; expected at least one quantity' };
  if (values.length > MAX_VALID_VALUES)
    return { field: 'validValues', message: `${values.length} values; at most ${MAX_VALID_VALUES} are allowed` };
  for (let i = 1; i < values.length; i++) {
    const [a, b] = [values[i - 1] as number, values[i] as number];
    if (b === a) return { field: `validValues[${i}]`, message: `${q(b)} is listed twice; each value once` };
    if (b < a)
      return { field: `validValues[${i}]`, message: `${q(b)} is less than the value before it; list them ascending` };
  }
  if (!values.includes(p.default))
    return {
      field: 'default',
      message: `${q(p.default)} is not one of validValues (${values.map(q).join(', ')}); expected one of them`,
    };
  return null;
}

/** What is wrong with a policy whatever the GPUs, or null. */
export function policyProblem(p: RequestPolicy): PolicyProblem | null {
  if (p.validValues !== undefined && p.validRange !== undefined)
    return { field: '', message: 'validValues and validRange exclude each other; keep one' };
  if (p.validRange !== undefined) return rangeProblem(p, p.validRange);
  if (p.validValues !== undefined) return valuesProblem(p, p.validValues);
  return { field: '', message: 'expected validValues (a list of quantities) or validRange ({min, max?, step?})' };
}

/** The amounts a GPU's memory must hold for the policy to be valid on it, each with its field. */
function demands(p: RequestPolicy): { field: string; bytes: number }[] {
  const out = [{ field: 'default', bytes: p.default }];
  for (const [i, v] of (p.validValues ?? []).entries()) out.push({ field: `validValues[${i}]`, bytes: v });
  const r = p.validRange;
  if (r !== undefined) {
    out.push({ field: 'validRange.min', bytes: r.min });
    if (r.max !== undefined) out.push({ field: 'validRange.max', bytes: r.max });
    if (r.step !== undefined) out.push({ field: 'validRange.step', bytes: r.min + r.step });
  }
  return out;
}

/** Why a policy cannot be published for a GPU of `memoryBytes`: the field and the message; null when it fits. */
export function policyFitProblem(p: RequestPolicy, memoryBytes: number): PolicyProblem | null {
  for (const d of demands(p)) {
    if (d.bytes <= memoryBytes) continue;
    const what = d.field === 'validRange.step' ? `min plus one step (${q(d.bytes)})` : q(d.bytes);
    return { field: d.field, message: `${what} is more than the GPU's memory (${q(memoryBytes)})` };
  }
  return null;
}

/**
 * Why the consumable capacity does not fit these GPUs (the first whole GPU too small for it), naming the
 * key under `prefix` and the GPU; null when it fits every one (or there is no policy).
 */
export function capacityFitProblem(
  gpus: readonly Gpu[],
  capacity: ConsumableCapacity | undefined,
  prefix = 'dra.consumableCapacity.memory',
): { readonly path: string; readonly message: string } | null {
  if (capacity === undefined) return null;
  for (const g of gpus) {
    const p = policyFitProblem(capacity.memory, g.memoryBytes);
    if (p === null) continue;
    return {
      path: p.field === '' ? prefix : `${prefix}.${p.field}`,
      message:
        `${p.message.replace("the GPU's", `GPU ${g.index}'s (${g.uuid})`)}; every whole GPU is published with ` +
        `this policy, so it must fit the smallest: lower it, or leave validRange.max out (up to each GPU's memory)`,
    };
  }
  return null;
}

/** A request policy as a ResourceSlice writes it (resource.k8s.io/v1 CapacityRequestPolicy), quantities in bytes. */
export interface WireRequestPolicy {
  readonly default: string;
  readonly validValues?: readonly string[];
  readonly validRange?: { readonly min: string; readonly max?: string; readonly step?: string };
}

/** The policy with its quantities written as the API server writes them back (binary units where whole). */
export function wireRequestPolicy(p: RequestPolicy): WireRequestPolicy {
  const r = p.validRange;
  return {
    default: q(p.default),
    ...(p.validValues === undefined ? {} : { validValues: p.validValues.map(q) }),
    ...(r === undefined
      ? {}
      : {
          validRange: {
            min: q(r.min),
            ...(r.max === undefined ? {} : { max: q(r.max) }),
            ...(r.step === undefined ? {} : { step: q(r.step) }),
          },
        }),
  };
}
