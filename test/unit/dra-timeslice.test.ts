import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  changesToApply,
  TIME_SLICE_INTERVALS,
  type TimeSliceClaimDevice,
  type TimeSliceInterval,
  timeSliceArgs,
  timeSliceConflict,
  timeSliceNumber,
  wantedTimeSlices,
} from '../../src/core/dra-timeslice.ts';

const GPU0 = 'GPU-00000000-0000-0000-0000-000000000000';
const GPU1 = 'GPU-11111111-1111-1111-1111-111111111111';
const GPU2 = 'GPU-22222222-2222-2222-2222-222222222222';

function device(claim: string, gpuUuid: string, interval: TimeSliceInterval): TimeSliceClaimDevice {
  return { claimUid: `uid-${claim}`, namespace: 'team-a', name: claim, gpuUuid, interval };
}

test("intervals map to nvidia-smi's numbers as NVIDIA's driver maps them (0=DEFAULT … 3=LONG)", () => {
  assert.deepEqual(TIME_SLICE_INTERVALS.map(timeSliceNumber), [0, 1, 2, 3]);
  assert.deepEqual(TIME_SLICE_INTERVALS, ['Default', 'Short', 'Medium', 'Long']);
  assert.deepEqual(timeSliceArgs(GPU1, 'Medium'), ['compute-policy', '-i', GPU1, '--set-timeslice', '2']);
});

test('wanted: each GPU at the interval its claims ask; every other GPU named at Default', () => {
  const prepared = [device('a', GPU0, 'Long'), device('b', GPU0, 'Long'), device('c', GPU1, 'Short')];
  assert.deepEqual(
    wantedTimeSlices(prepared, [GPU0, GPU1, GPU2]),
    new Map<string, TimeSliceInterval>([
      [GPU0, 'Long'],
      [GPU1, 'Short'],
      [GPU2, 'Default'],
    ]),
  );
  assert.deepEqual(wantedTimeSlices([], [GPU2]), new Map([[GPU2, 'Default']]));
  assert.deepEqual(
    wantedTimeSlices(prepared),
    new Map([
      [GPU0, 'Long'],
      [GPU1, 'Short'],
    ]),
    'no GPU list',
  );
  // A list that disagrees (never made by prepare) keeps its first claim's interval.
  assert.equal(wantedTimeSlices([device('a', GPU0, 'Long'), device('b', GPU0, 'Short')]).get(GPU0), 'Long');
});

test('a claim asking the interval a GPU already has, or a free GPU, is no conflict', () => {
  const prepared = [device('a', GPU0, 'Medium')];
  assert.equal(timeSliceConflict(prepared, [device('b', GPU0, 'Medium')]), null);
  assert.equal(timeSliceConflict(prepared, [device('b', GPU1, 'Long')]), null);
  assert.equal(timeSliceConflict([], [device('b', GPU0, 'Long'), device('b', GPU1, 'Short')]), null);
  assert.equal(timeSliceConflict(prepared, []), null);
});

test('another interval on a GPU another claim holds: refused, naming the holder, the GPU, both intervals', () => {
  const prepared = [device('a', GPU1, 'Short'), device('holder', GPU0, 'Medium')];
  const candidate = [device('b', GPU1, 'Short'), device('b', GPU0, 'Long')];
  const conflict = timeSliceConflict(prepared, candidate);
  assert.ok(conflict);
  assert.equal(conflict.gpuUuid, GPU0);
  assert.deepEqual(conflict.holder, prepared[1]);
  assert.deepEqual(conflict.asking, candidate[1]);
  assert.equal(
    conflict.message,
    `claim team-a/b (uid uid-b) asks time-slice interval Long on GPU ${GPU0}, which claim team-a/holder ` +
      '(uid uid-holder) holds at Medium; a GPU has one interval for all its processes: ask Medium for this ' +
      'GPU, or prepare this claim once team-a/holder is unprepared',
  );
  // Default is an interval a claim asks like any other: it holds the GPU at Default.
  const atDefault = timeSliceConflict([device('a', GPU2, 'Default')], [device('b', GPU2, 'Short')]);
  assert.equal(atDefault?.holder.name, 'a');
});

test('a claim asking two intervals on one GPU is refused naming itself', () => {
  const conflict = timeSliceConflict([], [device('b', GPU0, 'Short'), device('b', GPU0, 'Long')]);
  assert.ok(conflict);
  assert.equal(conflict.holder.claimUid, 'uid-b');
  assert.equal(
    conflict.message,
    `claim team-a/b (uid uid-b) asks time-slice intervals Short and Long on GPU ${GPU0}; a GPU has one ` +
      'interval for all its processes: give the requests that share this GPU the same timeSlicingConfig.interval',
  );
});

test("a prepare repeated is not in its own way: the claim's earlier entries are left out", () => {
  const prepared = [device('b', GPU0, 'Long')];
  assert.equal(timeSliceConflict(prepared, [device('b', GPU0, 'Long')]), null);
  assert.equal(timeSliceConflict(prepared, [device('b', GPU0, 'Short')]), null, 'the claim replaces its own');
});

test('changes: one nvidia-smi run per GPU whose interval differs, in UUID order; absent means Default', () => {
  const current = new Map<string, TimeSliceInterval>([
    [GPU2, 'Long'],
    [GPU0, 'Short'],
  ]);
  const wanted = new Map<string, TimeSliceInterval>([
    [GPU0, 'Short'],
    [GPU1, 'Medium'],
  ]);
  assert.deepEqual(changesToApply(current, wanted), [
    { gpuUuid: GPU1, from: 'Default', to: 'Medium', args: timeSliceArgs(GPU1, 'Medium') },
    { gpuUuid: GPU2, from: 'Long', to: 'Default', args: timeSliceArgs(GPU2, 'Default') },
  ]);
  assert.deepEqual(changesToApply(wanted, wanted), [], 'nothing to do');
  assert.deepEqual(changesToApply(new Map(), new Map([[GPU0, 'Default']])), [], 'a GPU starts at Default');
});

test('the last claim on a GPU unprepared: it goes back to Default; while one remains it keeps its interval', () => {
  const a = device('a', GPU0, 'Long');
  const b = device('b', GPU0, 'Long');
  const applied = wantedTimeSlices([a, b], [GPU0]);
  assert.deepEqual(changesToApply(applied, wantedTimeSlices([b], [GPU0])), [], 'b still holds it');
  assert.deepEqual(changesToApply(applied, wantedTimeSlices([], [GPU0])), [
    { gpuUuid: GPU0, from: 'Long', to: 'Default', args: ['compute-policy', '-i', GPU0, '--set-timeslice', '0'] },
  ]);
});
