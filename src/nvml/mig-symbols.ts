// koffi declarations of NVML's MIG entry points. All are bound lazily (they join
// LAZY_SYMBOLS in bindings.ts): a driver without them loses MIG, nothing else. Structures are passed
// as caller Buffers and decoded in mig.ts with their real layouts; GPU- and compute-instance
// handles travel as addresses.
export const MIG_SYMBOLS = {
  nvmlDeviceGetMigMode:
    'int nvmlDeviceGetMigMode(nvmlDevice_t device, _Out_ unsigned int *current, _Out_ unsigned int *pending)',
  nvmlDeviceGetMaxMigDeviceCount: 'int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, _Out_ unsigned int *count)',
  nvmlDeviceGetMigDeviceHandleByIndex:
    'int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, _Out_ nvmlDevice_t *mig)',
  nvmlDeviceGetGpuInstanceId: 'int nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, _Out_ unsigned int *id)',
  nvmlDeviceGetComputeInstanceId: 'int nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, _Out_ unsigned int *id)',
  /** nvmlDeviceAttributes_t, 40 bytes: 8 unsigned ints, then unsigned long long memorySizeMB. */
  nvmlDeviceGetAttributes_v2: 'int nvmlDeviceGetAttributes_v2(nvmlDevice_t device, void *attributes)',
  nvmlDeviceGetGpuInstanceById:
    'int nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, _Out_ void **gpuInstance)',
  /** nvmlGpuInstanceInfo_t, 24 bytes: device pointer, id, profileId, placement. */
  nvmlGpuInstanceGetInfo: 'int nvmlGpuInstanceGetInfo(void *gpuInstance, void *info)',
  /** nvmlGpuInstanceProfileInfo_t, 48 bytes: id first. */
  nvmlDeviceGetGpuInstanceProfileInfo:
    'int nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile, void *info)',
  // Dynamic MIG (mig-instances.ts): placements (nvmlGpuInstancePlacement_t, 8 bytes: start, size), creating
  // and destroying GPU and compute instances. Creating and destroying need the mig/config capability.
  nvmlDeviceGetGpuInstancePossiblePlacements_v2:
    'int nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId, ' +
    'void *placements, _Inout_ unsigned int *count)',
  nvmlDeviceCreateGpuInstanceWithPlacement:
    'int nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId, ' +
    'const void *placement, _Out_ void **gpuInstance)',
  nvmlGpuInstanceCreateComputeInstance:
    'int nvmlGpuInstanceCreateComputeInstance(void *gpuInstance, unsigned int profileId, _Out_ void **ci)',
  nvmlGpuInstanceGetComputeInstanceById:
    'int nvmlGpuInstanceGetComputeInstanceById(void *gpuInstance, unsigned int id, _Out_ void **ci)',
  nvmlComputeInstanceDestroy: 'int nvmlComputeInstanceDestroy(void *computeInstance)',
  nvmlGpuInstanceDestroy: 'int nvmlGpuInstanceDestroy(void *gpuInstance)',
} as const;

/** Without these there is no MIG discovery at all. */
export const REQUIRED_MIG_SYMBOLS = [
  'nvmlDeviceGetMigMode',
  'nvmlDeviceGetMaxMigDeviceCount',
  'nvmlDeviceGetMigDeviceHandleByIndex',
  'nvmlDeviceGetGpuInstanceId',
  'nvmlDeviceGetComputeInstanceId',
  'nvmlDeviceGetAttributes_v2',
] as const;

/**
 * For media-extension and similar attributes in profile names
 * (`1g.10gb+me`), and the GI profile id and placement of DRA device names.
 */
export const PROFILE_MIG_SYMBOLS = [
  'nvmlDeviceGetGpuInstanceById',
  'nvmlGpuInstanceGetInfo',
  'nvmlDeviceGetGpuInstanceProfileInfo',
] as const;
