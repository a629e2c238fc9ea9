// The health thread's signals record (struct gdp_signals_record in src/native/nvml_watch.h: 40 bytes,
// the size of every record) decoded into one GPU's reading in the core's shape
// (core/health-signals.ts), and the signals asked of the thread as its bit mask.
import { SIGNAL_NAMES } from '../core/health-signals.ts';
import type { SignalName, SignalReading, SignalValues, Unread } from '../core/health-signals.ts';

/** Record types of the signals, as in nvml_watch.h. */
export const SIGNALS_RECORD = 14;
export const SIGNALS_END_RECORD = 15;

const FLAG_REMAP_PENDING = 1;
const FLAG_REMAP_FAILURE = 2;
const FLAG_RETIRED_PENDING = 4;

/** GDP_SIG_* of a signal: its position in SIGNAL_NAMES. */
export function signalBit(signal: SignalName): number {
  return 1 << SIGNAL_NAMES.indexOf(signal);
}

/** The mask the thread is started with for these signals (0: it reads none). */
export function signalsMask(signals: readonly SignalName[]): number {
  return signals.reduce((m, s) => m | signalBit(s), 0);
}

function links(mask: number): number[] {
  const out: number[] = [];
  for (let l = 0; l < 32; l++) if ((mask >>> l) & 1) out.push(l);
  return out;
}

/** The signals record at `at` in `b`: the GPU's position in the thread's list, and its reading at atMs. */
export function decodeSignalsRecord(b: Buffer, at: number, atMs: number): { position: number; reading: SignalReading } {
  const unavailable = b.readUInt8(at + 8);
  const failed = b.readUInt8(at + 9);
  const flags = b.readUInt8(at + 11);
  const raw: SignalValues = {
    'recovery-action': b.readUInt8(at + 10),
    'row-remap': {
      corrected: b.readUInt16LE(at + 16),
      uncorrected: b.readUInt16LE(at + 18),
      pending: (flags & FLAG_REMAP_PENDING) !== 0,
      failure: (flags & FLAG_REMAP_FAILURE) !== 0,
    },
    'retired-pages': {
      singleBit: b.readUInt16LE(at + 20),
      doubleBit: b.readUInt16LE(at + 22),
      pending: (flags & FLAG_RETIRED_PENDING) !== 0,
    },
    'ecc-uncorrectable': b.readUInt32LE(at + 24),
    nvlink: links(b.readUInt32LE(at + 32)),
    'pcie-width': { current: b.readUInt8(at + 12), max: b.readUInt8(at + 13) },
    'pcie-replay': b.readUInt32LE(at + 28),
    clocks: b.readUInt16LE(at + 14),
  };
  const values = {} as { [K in SignalName]: SignalValues[K] | Unread };
  for (const s of SIGNAL_NAMES) {
    const bit = signalBit(s);
    (values as Record<SignalName, unknown>)[s] =
      (unavailable & bit) !== 0 ? 'unavailable' : (failed & bit) !== 0 ? 'failed' : raw[s];
  }
  return { position: b.readInt32LE(at + 4), reading: { atMs, values } };
}
