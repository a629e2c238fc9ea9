// The health signals' metrics (metrics.ts renders them into the .prom file): each GPU's raw values as
// its last reading gave them, and whether each signal is bad. A value the driver does not give (or
// the last read of which failed) has no sample. The aggregate uncorrected ECC counter is not read
// by the health thread, so it is not here. Pure.
import { SIGNAL_NAMES } from './health-signals.ts';
import type { SignalReading, SignalState } from './health-signal-types.ts';

/** One GPU's signals as the metrics show them. */
export interface GpuSignalMetrics {
  readonly index: number;
  readonly uuid: string;
  readonly values: SignalReading['values'];
  /** Each signal's state (its status and class), by name. */
  readonly states: Readonly<Record<string, Pick<SignalState, 'status' | 'bad' | 'class'>>>;
  /** The NVLink links expected up (those active when first read); null until read. */
  readonly expectedLinks: readonly number[] | null;
}

type Pairs = readonly (readonly [string, string])[];
type Sample = (name: string, pairs: Pairs, v: number) => void;
type Family = (name: string, type: 'gauge', help: string) => void;
/** One sample of a GPU: its labels beyond the GPU's, and its value. */
type Row = readonly [Pairs, number];

const known = <T>(v: T | 'unavailable' | 'failed'): T | undefined =>
  v === 'unavailable' || v === 'failed' ? undefined : v;
const one = (v: number | undefined): Row[] => (v === undefined ? [] : [[[], v]]);
const flag = (v: boolean | undefined): Row[] => one(v === undefined ? undefined : v ? 1 : 0);
const kinds = (label: string, pairs: readonly (readonly [string, number])[] | undefined): Row[] =>
  (pairs ?? []).map(([k, v]) => [[[label, k]], v]);

/** The families of the signals, each with what it shows of a GPU. */
const FAMILIES: readonly (readonly [string, string, (g: GpuSignalMetrics) => Row[]])[] = [
  [
    'gpu_signal_bad',
    'Health signal beyond XIDs: 1 while bad, 0 when not, by signal and class (absent: not read, not available, off).',
    (g) =>
      SIGNAL_NAMES.filter((s) => g.states[s]?.status === 'ok' || g.states[s]?.status === 'bad').map((s) => [
        [
          ['signal', s],
          ['class', g.states[s]?.class ?? ''],
        ],
        g.states[s]?.bad === true ? 1 : 0,
      ]),
  ],
  [
    'gpu_recovery_action',
    "The driver's recovery action (0 NONE, 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P, 4 DRAIN_AND_RESET, " +
      '5 RECOVER_IMEX_DOMAIN).',
    (g) => one(known(g.values['recovery-action'])),
  ],
  [
    'gpu_remapped_rows',
    'Remapped DRAM rows, by kind (corrected, uncorrected).',
    (g) => {
      const r = known(g.values['row-remap']);
      return kinds(
        'kind',
        r && [
          ['corrected', r.corrected],
          ['uncorrected', r.uncorrected],
        ],
      );
    },
  ],
  [
    'gpu_row_remap_pending',
    '1 while a row remap waits for a GPU reset.',
    (g) => flag(known(g.values['row-remap'])?.pending),
  ],
  [
    'gpu_row_remap_failed',
    '1 when a row remap failed (the GPU needs a repair).',
    (g) => flag(known(g.values['row-remap'])?.failure),
  ],
  [
    'gpu_retired_pages',
    'Retired memory pages, by cause (single-bit, double-bit).',
    (g) => {
      const p = known(g.values['retired-pages']);
      return kinds(
        'cause',
        p && [
          ['single-bit', p.singleBit],
          ['double-bit', p.doubleBit],
        ],
      );
    },
  ],
  [
    'gpu_retired_pages_pending',
    '1 while a page retirement waits for a GPU reset.',
    (g) => flag(known(g.values['retired-pages'])?.pending),
  ],
  [
    'gpu_ecc_uncorrected_volatile',
    'Uncorrected ECC errors since the last driver load or GPU reset.',
    (g) => one(known(g.values['ecc-uncorrectable'])),
  ],
  [
    'gpu_nvlink_links_up',
    'NVLink links up now of those expected (active when the GPU was first read).',
    (g) => {
      const up = known(g.values.nvlink);
      const expected = g.expectedLinks;
      return one(up === undefined || expected === null ? undefined : expected.filter((l) => up.includes(l)).length);
    },
  ],
  [
    'gpu_nvlink_links_expected',
    'NVLink links expected up (active when the GPU was first read).',
    (g) => one(g.expectedLinks?.length),
  ],
  [
    'gpu_pcie_link_width',
    'PCIe link width in lanes, current and max.',
    (g) => {
      const w = known(g.values['pcie-width']);
      return kinds(
        'kind',
        w && [
          ['current', w.current],
          ['max', w.max],
        ],
      );
    },
  ],
  [
    'gpu_pcie_replays',
    "The GPU's PCIe replay counter (replays since the last driver load or GPU reset).",
    (g) => one(known(g.values['pcie-replay'])),
  ],
  [
    'gpu_clocks_event_reasons',
    'Clocks-event reason bits (nvmlClocksEventReason*: 0x8 HW slowdown, 0x40 HW thermal, 0x80 HW power brake).',
    (g) => one(known(g.values.clocks)),
  ],
];

/** The families and samples of the signals, through the renderer's own family and sample functions. */
export function renderSignalMetrics(gpus: readonly GpuSignalMetrics[], family: Family, sample: Sample): void {
  if (gpus.length === 0) return;
  for (const [name, help, rows] of FAMILIES) {
    family(name, 'gauge', help);
    for (const g of gpus)
      for (const [pairs, v] of rows(g)) sample(name, [['uuid', g.uuid], ['index', String(g.index)], ...pairs], v);
  }
}
