// Small helpers shared by the bench files: percentiles over samples, rounding, waiting, progress lines.

export interface Stats {
  p50: number;
  p99: number;
  n: number;
}

/** The p-quantile (0..1) of xs: the sample at floor(p·n) of the sorted samples. */
export const q = (xs: readonly number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? NaN;
};
export const r2 = (x: number): number => Math.round(x * 100) / 100;
export const stats = (xs: readonly number[]): Stats => ({ p50: r2(q(xs, 0.5)), p99: r2(q(xs, 0.99)), n: xs.length });
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
export const log = (s: string): void => {
  process.stderr.write(`bench: ${s}\n`);
};
