// Which GPU of the last scan an NVML index that cannot be read now is. NVML still counts a GPU that
// fell off the bus but answers nothing about it, not even its UUID; and when a GPU leaves the bus the
// indices after it move down. So an unreadable index is never matched by its number (after a removal
// it is another GPU's old place) but by what does not move with the enumeration: the UUIDs around it.
//
// RULE. NVML enumerates in a fixed order, and a GPU leaving or arriving keeps the others' order. An
// unreadable index between the readable GPUs A and B (the nearest ones on each side that the last scan
// also had) is one of the last scan's GPUs between A and B that cannot be read now. Where there are as
// many of those as unreadable indices, they pair in order. Where there are more (a GPU left the bus
// beside one that is lost), only those still at their PCI address count (NVML answers GPU_IS_LOST
// for a GPU fallen off the bus there, NOT_FOUND for one that left); where NVML cannot say, those
// already unreadable in the last scan (NVML counted them then). Anything else cannot be told, and
// those indices are not matched.
import type { Gpu } from '../core/devices.ts';

export interface UnreadablePlacement {
  /** Unreadable indices matched to a GPU of the last scan: that GPU as last seen, under its index now. */
  readonly placed: readonly Gpu[];
  /** Unreadable indices that match no GPU of the last scan for sure. */
  readonly unplaced: readonly number[];
}

/**
 * Matches unreadable NVML indices to GPUs of the last scan by the rule above. `readable`: the GPUs
 * read now (with their indices now); `wasUnreadable`: UUIDs the last scan kept as unreadable;
 * `atAddress`: whether NVML still has a GPU at that GPU's PCI address (null: it cannot say).
 */
export function placeUnreadable(
  last: readonly Gpu[],
  readable: readonly Gpu[],
  unreadable: readonly number[],
  wasUnreadable: ReadonlySet<string>,
  atAddress: (gpu: Gpu) => boolean | null,
): UnreadablePlacement {
  const lastAt = new Map(last.map((g, i) => [g.uuid, i]));
  const readNow = new Set(readable.map((g) => g.uuid));
  // The readable GPUs the last scan had, by index now, with their place in the last scan.
  const anchors = readable
    .filter((g) => lastAt.has(g.uuid))
    .map((g) => ({ index: g.index, was: lastAt.get(g.uuid) ?? -1 }))
    .sort((a, b) => a.index - b.index);
  const gaps = new Map<string, { lo: number; hi: number; slots: number[] }>();
  for (const slot of [...unreadable].sort((a, b) => a - b)) {
    const lo = anchors.filter((a) => a.index < slot).at(-1)?.was ?? -1;
    const hi = anchors.find((a) => a.index > slot)?.was ?? last.length;
    const key = `${lo}:${hi}`;
    const gap = gaps.get(key) ?? { lo, hi, slots: [] };
    gap.slots.push(slot);
    gaps.set(key, gap);
  }
  const placed: Gpu[] = [];
  const unplaced: number[] = [];
  for (const { lo, hi, slots } of gaps.values()) {
    const missing = last.filter((g, i) => i > lo && i < hi && !readNow.has(g.uuid));
    const counted =
      missing.length === slots.length ? missing : missing.filter((g) => atAddress(g) ?? wasUnreadable.has(g.uuid));
    if (counted.length !== slots.length) {
      unplaced.push(...slots);
      continue;
    }
    slots.forEach((index, k) => {
      placed.push({ ...(counted[k] as Gpu), index });
    });
  }
  return { placed, unplaced };
}
