// The topology policy's public face (see README.md in this folder): pair scores from NVML's facts
// and the preferred-allocation policy built on them.
export { buildScoreMatrix, normalizeBusId, NVLINK_POINTS, PcieLevel, pciePoints } from './scores.ts';
export type { GpuLinkInfo, NvLinkEnd, ScoreMatrix } from './scores.ts';
export { MAX_EXACT_GPUS, PreferredPolicy } from './policy.ts';
