/*
 * fake_mig.h: the MIG (Multi-Instance GPU) part of the fake NVML. Not a header of its own: it is
 * included once, at the end of fake_nvml.c, and is part of that translation unit (it uses its
 * state, lock and helpers). Kept in a file of its own so that MIG stays in one place.
 *
 * What it models, for boards whose name contains "A100-SXM4-40GB", "A100-SXM4-80GB",
 * "H100 80GB HBM3" or "H200" (profile tables below, as `nvidia-smi mig -lgip` shows them):
 *   - MIG mode, current and pending, of a GPU whose fixture entry has a "mig" object; a GPU
 *     without one answers NOT_SUPPORTED to every MIG call (not MIG-capable);
 *   - GPU instances (GI) with compute instances (CI) in them; each CI is one MIG device with its
 *     own handle, answering nvmlDeviceGetUUID ("MIG-..."), nvmlDeviceGetName ("<board> MIG
 *     <profile>"), nvmlDeviceGetMemoryInfo (the GI's memory), nvmlDeviceGetGpuInstanceId,
 *     nvmlDeviceGetComputeInstanceId, nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
 *     nvmlDeviceGetAttributes_v2 and nvmlDeviceIsMigDeviceHandle; every other per-GPU call on a
 *     MIG handle answers NOT_SUPPORTED (minor number, PCI info, events, topology, NVLink);
 *   - the profile-info calls: nvmlDeviceGetGpuInstanceProfileInfo(V) by NVML profile index
 *     (0 1_SLICE .. 7 1_SLICE_REV1 (+me), 9 1_SLICE_REV2 (1g.20gb on 80 GB boards)),
 *     nvmlDeviceGetGpuInstanceById + nvmlGpuInstanceGetInfo, nvmlGpuInstanceGetComputeInstanceById
 *     + nvmlComputeInstanceGetInfo_v2, nvmlGpuInstanceGetComputeInstanceProfileInfo(V);
 *   - placements in MEMORY slices (8 per GPU), as the MIG user guide's tables give them for A100 and
 *     H100 (H200 alike): 1g and 1g+me size 1 at 0-6, 1g.20gb (1_SLICE_REV2) size 2 at 0,2,4,6, 2g size 2
 *     at 0,2,4, 3g size 4 at 0,4, 4g size 4 at 0, 7g size 8 at 0. A fixture layout is placed where
 *     its entries fit (the first such assignment, entries in order);
 *   - dynamic MIG: nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlDeviceGetGpuInstanceRemainingCapacity,
 *     nvmlDeviceCreateGpuInstanceWithPlacement (an overlap or a profile's instance count reached:
 *     INSUFFICIENT_RESOURCES), nvmlGpuInstanceCreateComputeInstance, nvmlComputeInstanceDestroy,
 *     nvmlGpuInstanceDestroy (IN_USE while it has a compute instance), nvmlDeviceGetGpuInstances,
 *     nvmlGpuInstanceGetComputeInstances. GI ids: the smallest free from 1; CI ids the smallest free
 *     in the GI. FAKE_NVML_CRASH_AFTER=create-gpu-instance|create-compute-instance makes the process
 *     _exit(137) right after that call succeeded (a kill between two steps, for crash tests). An
 *     instance made or destroyed outlives nvmlShutdown/nvmlInit, as a FIFO re-layout does; with
 *     FAKE_NVML_MIG_STATE=<file> layouts also outlive the process (see mig_state_save).
 *
 * Fixture ("gpus[i].mig"):
 *   { "current": true|false, "pending": true|false (default: current), "instances": [entry...] }
 * and the control FIFO:
 *   mig <index> on [entry...]      MIG enabled (current and pending) with this layout
 *   mig <index> off                MIG disabled, no instances
 *   mig <index> pending <0|1>      only the pending mode changes (a reset would apply it)
 *   mig <index> busy <gi> <0|1>    processes run on GPU instance <gi> (by id): destroying its compute
 *                                  instances answers IN_USE, as with a CUDA process on them
 *   xid <index> <n> <gi> <ci>      an XID naming one MIG device (0xFFFFFFFF: the whole GPU)
 * An entry is one GPU instance: "<profile>" with one full compute instance ("1g.10gb",
 * "1g.10gb+me"), "<C>c.<profile>" with one C-slice compute instance ("1c.2g.20gb"), or
 * "<profile>:<C>,<C>..." with several ("2g.20gb:1,1"). Profiles come from the board's table; the
 * slices of all instances must fit the board's 7, and each profile's instance count holds.
 *
 * Identities: GI ids are 1, 2, ... in entry order; CI ids 0, 1, ... within their GI; MIG device
 * indices (nvmlDeviceGetMigDeviceHandleByIndex) 0, 1, ... in entry order; the MIG UUID is the
 * parent's UUID with "GPU-" replaced by "MIG-" and its last six hex digits replaced by the GPU
 * instance's profile id, the GI id and the CI id, two hex digits each (GPU-...-bd53058e4ee4, a
 * 1g.10gb (profile id 19) as GI 3 CI 0 → MIG-...-bd5305130300), so tests can name them and an
 * instance re-created with another profile gets another UUID. MIG-capable GPUs whose UUIDs differ only in those
 * six digits are refused at load: their MIG devices would share UUIDs. A re-layout rewrites the GPU's MIG
 * devices in place: old MIG handles then name whatever is at their slot, or answer
 * INVALID_ARGUMENT/NOT_FOUND, as stale handles of the real driver may.
 */

/* ---- ABI ---------------------------------------------------------------------------------- */

typedef struct fake_gi_handle *nvmlGpuInstance_t;
typedef struct fake_ci_handle *nvmlComputeInstance_t;

typedef struct nvmlGpuInstanceProfileInfo_st {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct nvmlGpuInstanceProfileInfo_v2_st {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct nvmlGpuInstancePlacement_st {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct nvmlGpuInstanceInfo_st {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct nvmlComputeInstanceProfileInfo_st {
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct nvmlComputeInstanceProfileInfo_v2_st {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct nvmlComputeInstanceInfo_st {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct nvmlDeviceAttributes_st {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_t) == 48, "nvmlGpuInstanceProfileInfo_t layout");
_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_v2_t) == 152, "nvmlGpuInstanceProfileInfo_v2_t layout");
_Static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24, "nvmlGpuInstanceInfo_t layout");
_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_t) == 36, "nvmlComputeInstanceProfileInfo_t layout");
_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_v2_t) == 136, "nvmlComputeInstanceProfileInfo_v2_t layout");
_Static_assert(sizeof(nvmlComputeInstanceInfo_t) == 32, "nvmlComputeInstanceInfo_t layout");
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "nvmlDeviceAttributes_t layout");

#define FAKE_STRUCT_VERSION(size, v) ((unsigned int)(size) | ((unsigned int)(v) << 24U))
#define FAKE_GI_PROFILE_INFO_V2 FAKE_STRUCT_VERSION(sizeof(nvmlGpuInstanceProfileInfo_v2_t), 2)
#define FAKE_CI_PROFILE_INFO_V2 FAKE_STRUCT_VERSION(sizeof(nvmlComputeInstanceProfileInfo_v2_t), 2)
#define FAKE_GI_PROFILE_COUNT 10 /* NVML_GPU_INSTANCE_PROFILE_COUNT of the drivers modelled */
#define FAKE_CI_PROFILE_COUNT 8  /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define FAKE_NO_INSTANCE 0xFFFFFFFFu

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode);
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count);
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig);
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig);
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id);
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id);
EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *device);
EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes);
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                       nvmlGpuInstanceProfileInfo_t *info);
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_v2_t *info);
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gi);
EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info);
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id,
                                                         nvmlComputeInstance_t *ci);
EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info);
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned int profile,
                                                                unsigned int engProfile,
                                                                nvmlComputeInstanceProfileInfo_t *info);
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gi, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_v2_t *info);
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                   nvmlGpuInstancePlacement_t *placements,
                                                                   unsigned int *count);
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                             unsigned int *count);
EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                            const nvmlGpuInstancePlacement_t *placement,
                                                            nvmlGpuInstance_t *gi);
EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned int profileId,
                                                        nvmlComputeInstance_t *ci);
EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci);
EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi);
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gis,
                                             unsigned int *count);
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gi, unsigned int profileId,
                                                      nvmlComputeInstance_t *cis, unsigned int *count);
#endif

/* ---- Profile tables ------------------------------------------------------------------------ */

struct fake_gi_profile {
    unsigned int index; /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int id;    /* the profile id nvidia-smi shows */
    unsigned int slices;
    unsigned int instances;
    unsigned int sms;
    unsigned int ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mb;
    const char *name;
};

struct fake_board {
    const char *fragment; /* matched against the GPU name */
    unsigned int sms_per_slice;
    const struct fake_gi_profile *profiles;
    size_t count;
};

static const struct fake_gi_profile g_a100_40[] = {
    { 0, 19, 1, 7, 14, 1, 0, 0, 0, 0, 4864, "1g.5gb" },
    { 1, 14, 2, 3, 28, 2, 1, 0, 0, 0, 9856, "2g.10gb" },
    { 2, 9, 3, 2, 42, 3, 2, 0, 0, 0, 20096, "3g.20gb" },
    { 3, 5, 4, 1, 56, 4, 2, 0, 0, 0, 20096, "4g.20gb" },
    { 4, 0, 7, 1, 98, 7, 5, 0, 1, 1, 40448, "7g.40gb" },
    { 7, 20, 1, 1, 14, 1, 1, 0, 1, 1, 4864, "1g.5gb+me" },
    { 9, 15, 1, 4, 14, 1, 1, 0, 0, 0, 9856, "1g.10gb" },
};
static const struct fake_gi_profile g_a100_80[] = {
    { 0, 19, 1, 7, 14, 1, 0, 0, 0, 0, 9728, "1g.10gb" },
    { 1, 14, 2, 3, 28, 2, 1, 0, 0, 0, 19968, "2g.20gb" },
    { 2, 9, 3, 2, 42, 3, 2, 0, 0, 0, 40192, "3g.40gb" },
    { 3, 5, 4, 1, 56, 4, 2, 0, 0, 0, 40192, "4g.40gb" },
    { 4, 0, 7, 1, 98, 7, 5, 0, 1, 1, 81152, "7g.80gb" },
    { 7, 20, 1, 1, 14, 1, 1, 0, 1, 1, 9728, "1g.10gb+me" },
    { 9, 15, 1, 4, 14, 1, 1, 0, 0, 0, 19968, "1g.20gb" },
};
static const struct fake_gi_profile g_h100_80[] = {
    { 0, 19, 1, 7, 16, 1, 1, 0, 1, 0, 9984, "1g.10gb" },
    { 1, 14, 2, 3, 32, 2, 2, 0, 2, 0, 20096, "2g.20gb" },
    { 2, 9, 3, 2, 60, 3, 3, 0, 3, 0, 40448, "3g.40gb" },
    { 3, 5, 4, 1, 64, 4, 4, 0, 4, 0, 40448, "4g.40gb" },
    { 4, 0, 7, 1, 132, 8, 7, 0, 7, 1, 81152, "7g.80gb" },
    { 7, 20, 1, 1, 16, 1, 1, 0, 1, 1, 9984, "1g.10gb+me" },
    { 9, 15, 1, 4, 26, 1, 1, 0, 1, 0, 20096, "1g.20gb" },
};
static const struct fake_gi_profile g_h200[] = {
    { 0, 19, 1, 7, 16, 1, 1, 0, 1, 0, 16384, "1g.18gb" },
    { 1, 14, 2, 3, 32, 2, 2, 0, 2, 0, 33152, "2g.35gb" },
    { 2, 9, 3, 2, 60, 3, 3, 0, 3, 0, 71680, "3g.71gb" },
    { 3, 5, 4, 1, 64, 4, 4, 0, 4, 0, 71680, "4g.71gb" },
    { 4, 0, 7, 1, 132, 8, 7, 0, 7, 1, 143488, "7g.141gb" },
    { 7, 20, 1, 1, 16, 1, 1, 0, 1, 1, 16384, "1g.18gb+me" },
    { 9, 15, 1, 4, 26, 1, 1, 0, 1, 0, 33152, "1g.35gb" },
};

static const struct fake_board g_boards[] = {
    { "A100-SXM4-40GB", 14, g_a100_40, sizeof g_a100_40 / sizeof g_a100_40[0] },
    { "A100-SXM4-80GB", 14, g_a100_80, sizeof g_a100_80 / sizeof g_a100_80[0] },
    { "H100 80GB HBM3", 16, g_h100_80, sizeof g_h100_80 / sizeof g_h100_80[0] },
    { "H200", 16, g_h200, sizeof g_h200 / sizeof g_h200[0] },
};

#define FAKE_BOARD_SLICES 7
#define FAKE_MAX_GIS 7
#define FAKE_MAX_MIGS 7 /* nvmlDeviceGetMaxMigDeviceCount */

static const struct fake_board *board_for(const char *name)
{
    size_t i;

    for (i = 0; i < sizeof g_boards / sizeof g_boards[0]; i++) {
        if (strstr(name, g_boards[i].fragment))
            return &g_boards[i];
    }
    return NULL;
}

/* CI profile index of a C-slice compute instance, or -1 (NVML_COMPUTE_INSTANCE_PROFILE_*). */
static int ci_profile_index(unsigned int c)
{
    switch (c) {
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return 3;
    case 7: return 4;
    }
    return -1;
}

/* Whether a C-slice compute instance fits a G-slice GPU instance profile. */
static int ci_fits(unsigned int c, unsigned int g)
{
    return ci_profile_index(c) >= 0 && c <= g && (c != 3 || g == 3 || g == 7);
}

/* A profile's placement geometry in memory slices, by its NVML profile index: its size and a mask of
 * the starts allowed. */
static void geometry(unsigned int index, unsigned int *size, unsigned int *starts)
{
    switch (index) {
    case 1: *size = 2; *starts = 0x15; return; /* 2g: 0, 2, 4 */
    case 2: *size = 4; *starts = 0x11; return; /* 3g: 0, 4 */
    case 3: *size = 4; *starts = 0x01; return; /* 4g: 0 */
    case 4: *size = 8; *starts = 0x01; return; /* 7g: 0 */
    case 9: *size = 2; *starts = 0x55; return; /* 1g, double memory: 0, 2, 4, 6 */
    default: *size = 1; *starts = 0x7F; return; /* 1g, 1g+me: 0 to 6 */
    }
}

#define FAKE_MEMORY_SLICES 8

/* The memory slices a placement covers, as a mask. */
static unsigned int span(unsigned int start, unsigned int size)
{
    return ((1u << size) - 1u) << start;
}

/* ---- State --------------------------------------------------------------------------------- */

/* Handles are addresses of elements of the handle arrays below: only where they point matters (the
 * configured GPU and slot), nothing is stored in them. */
struct fake_gi_handle {
    unsigned char unused;
};

struct fake_ci_handle {
    unsigned char unused;
};

struct fake_mig_device {
    int used;
    unsigned int gi_slot;
    unsigned int ci_id;
    unsigned int ci_slices;
    char uuid[FAKE_UUID_SIZE];
};

struct fake_gi {
    int used;
    unsigned int id;
    const struct fake_gi_profile *profile;
    unsigned int start; /* placement */
    unsigned int busy;  /* processes run on it: its compute instances cannot be destroyed (IN_USE) */
};

struct fake_mig_gpu {
    const struct fake_board *board; /* NULL: not MIG-capable */
    unsigned int current, pending;
    struct fake_gi gis[FAKE_MAX_GIS];
    struct fake_mig_device migs[FAKE_MAX_MIGS];
};

/* MIG state is kept per configured GPU (g_conf, by configured index), so it follows a GPU that is
 * removed and added back, and a layout changed through the FIFO outlives nvmlShutdown/nvmlInit as
 * on a real node (for the GPU with that UUID). g_mig_stage is filled while loading. Handles point
 * into the handle arrays (stable addresses), by configured index and slot. */
static struct fake_mig_gpu g_mig[FAKE_MAX_GPUS];
static struct fake_mig_gpu g_mig_stage[FAKE_MAX_GPUS];
static char g_mig_changed[FAKE_MAX_GPUS][FAKE_UUID_SIZE]; /* a GPU whose layout the FIFO or an NVML call changed */
static const struct fake_mig_gpu g_mig_none;              /* a GPU that is not MIG-capable */
static struct fake_mig_device_handle {
    unsigned char unused;
} g_mig_handles[FAKE_MAX_GPUS][FAKE_MAX_MIGS]; /* MIG device handles (nvmlDevice_t), by configured GPU and slot */
static struct fake_gi_handle g_gi_handles[FAKE_MAX_GPUS][FAKE_MAX_GIS];
static struct fake_ci_handle g_ci_handles[FAKE_MAX_GPUS][FAKE_MAX_MIGS];

static void mig_state_load(void);
static void mig_state_save(void);

static void mig_commit_stage(void)
{
    unsigned int c;

    for (c = 0; c < FAKE_MAX_GPUS; c++) {
        if (c < g_conf_count && g_mig_changed[c][0] && strcmp(g_mig_changed[c], g_conf[c].uuid) == 0 &&
            g_mig[c].board == g_mig_stage[c].board)
            continue; /* the layout set through the FIFO stays */
        g_mig[c] = g_mig_stage[c];
        g_mig_changed[c][0] = '\0';
    }
    mig_state_load();
}

/* Configured index of a live GPU (g_devs), and the live index of a configured one (-1: removed). */
static int conf_of(unsigned int live)
{
    unsigned int c;

    for (c = 0; live < g_gpu_count && c < g_conf_count; c++)
        if (strcmp(g_conf[c].uuid, g_devs[live].uuid) == 0)
            return (int)c;
    return -1;
}

static int live_of(unsigned int conf)
{
    unsigned int j;

    for (j = 0; conf < g_conf_count && j < g_gpu_count; j++)
        if (strcmp(g_devs[j].uuid, g_conf[conf].uuid) == 0)
            return (int)j;
    return -1;
}

/* The MIG state of a live GPU (a GPU that is not MIG-capable has g_mig_none's). */
static struct fake_mig_gpu *mig_gpu(unsigned int live)
{
    int c = conf_of(live);

    return c < 0 ? (struct fake_mig_gpu *)&g_mig_none : &g_mig[c];
}

#define MIG(live) (*mig_gpu(live))
#define CONF(live) ((unsigned int)conf_of(live))

/* Position of a handle in an array of `count` elements of `size` bytes at `base`, or -1 for any
 * other pointer: nothing is read through a handle before this check, so foreign pointers are safe. */
static long handle_slot(const void *handle, const void *base, size_t size, size_t count)
{
    uintptr_t p = (uintptr_t)handle, b = (uintptr_t)base;

    if (p < b || (p - b) % size != 0 || (p - b) / size >= count)
        return -1;
    return (long)((p - b) / size);
}

/* The live GPU and the slot a MIG-level handle names, if its GPU is present. Call with g_mu held. */
static int live_slot(long slot, unsigned int per_gpu, unsigned int *gpu, unsigned int *index)
{
    int live;

    if (slot < 0 || (live = live_of((unsigned int)(slot / per_gpu))) < 0 || !MIG((unsigned int)live).board)
        return 0;
    *gpu = (unsigned int)live;
    *index = (unsigned int)(slot % per_gpu);
    return 1;
}

/* The MIG device a handle names, or NULL (foreign pointer, stale slot). Call with g_mu held. */
static struct fake_mig_device *mig_from_handle(nvmlDevice_t handle, unsigned int *gpu)
{
    unsigned int s;

    if (!live_slot(handle_slot(handle, g_mig_handles, sizeof g_mig_handles[0][0], FAKE_MAX_GPUS * FAKE_MAX_MIGS),
                   FAKE_MAX_MIGS, gpu, &s) || !MIG(*gpu).migs[s].used)
        return NULL;
    return &MIG(*gpu).migs[s];
}

static int is_mig_handle(nvmlDevice_t handle)
{
    unsigned int gpu;

    return mig_from_handle(handle, &gpu) != NULL;
}

static __attribute__((unused)) struct fake_gi *gi_from_handle(nvmlGpuInstance_t handle, unsigned int *gpu)
{
    unsigned int s;

    if (!live_slot(handle_slot(handle, g_gi_handles, sizeof g_gi_handles[0][0], FAKE_MAX_GPUS * FAKE_MAX_GIS),
                   FAKE_MAX_GIS, gpu, &s) || !MIG(*gpu).gis[s].used)
        return NULL;
    return &MIG(*gpu).gis[s];
}

static __attribute__((unused)) struct fake_mig_device *ci_from_handle(nvmlComputeInstance_t handle, unsigned int *gpu,
                                                                      unsigned int *slot)
{
    if (!live_slot(handle_slot(handle, g_ci_handles, sizeof g_ci_handles[0][0], FAKE_MAX_GPUS * FAKE_MAX_MIGS),
                   FAKE_MAX_MIGS, gpu, slot) || !MIG(*gpu).migs[*slot].used)
        return NULL;
    return &MIG(*gpu).migs[*slot];
}

/* ---- Layouts ------------------------------------------------------------------------------- */

static const struct fake_gi_profile *profile_by_name(const struct fake_board *b, const char *name)
{
    size_t i;

    for (i = 0; i < b->count; i++) {
        if (strcmp(b->profiles[i].name, name) == 0)
            return &b->profiles[i];
    }
    return NULL;
}

static __attribute__((unused)) const struct fake_gi_profile *profile_by_index(const struct fake_board *b, unsigned int index)
{
    size_t i;

    for (i = 0; i < b->count; i++) {
        if (b->profiles[i].index == index)
            return &b->profiles[i];
    }
    return NULL;
}

static void mig_uuid(char *out, const char *parent, unsigned int profile_id, unsigned int gi, unsigned int ci)
{
    size_t len = strlen(parent);

    snprintf(out, FAKE_UUID_SIZE, "MIG-%s", parent + 4);
    if (len >= 10)
        snprintf(out + len - 6, FAKE_UUID_SIZE - (len - 6), "%02x%02x%02x", profile_id & 0xFF, gi & 0xFF, ci & 0xFF);
}

/* ---- Node state shared by processes (FAKE_NVML_MIG_STATE) --------------------------------------- */

/* A MIG layout lives on the GPU, not in the process that made it: with FAKE_NVML_MIG_STATE set, every change
 * (an instance created or destroyed, a FIFO re-layout) is written to that file (tmp file + rename), and each
 * nvmlInit of any process reads it back over the fixture's layouts, so a process killed after creating a GPU
 * instance leaves it there for the next one. One line per item:
 *   gpu <uuid> <current> <pending>        a MIG-capable configured GPU
 *   gi <slot> <id> <profile id> <start> <busy>   a GPU instance of the GPU above (busy: 1 while in use)
 *   ci <slot> <gi slot> <ci id> <slices>  a compute instance (a MIG device) of the GPU above
 * Unset: each process starts from the fixture, as before. Another process's change is read at this process's
 * next call (mig_state_refresh), as every process sees one GPU. Called with g_mu held. */

/* The state file as this process last wrote or read it, so that only another process's change is read again. */
static struct stat g_mig_state_seen;

static void mig_state_remember(const char *path)
{
    if (stat(path, &g_mig_state_seen) != 0)
        memset(&g_mig_state_seen, 0, sizeof g_mig_state_seen);
}

static void mig_state_save(void)
{
    const char *path = getenv("FAKE_NVML_MIG_STATE");
    char tmp[PATH_MAX];
    unsigned int c, s;
    FILE *f;

    if (!path || !*path || snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp || !(f = fopen(tmp, "w")))
        return;
    for (c = 0; c < g_conf_count; c++) {
        const struct fake_mig_gpu *m = &g_mig[c];

        if (!m->board)
            continue;
        fprintf(f, "gpu %s %u %u\n", g_conf[c].uuid, m->current, m->pending);
        for (s = 0; s < FAKE_MAX_GIS; s++)
            if (m->gis[s].used)
                fprintf(f, "gi %u %u %u %u %u\n", s, m->gis[s].id, m->gis[s].profile->id, m->gis[s].start,
                        m->gis[s].busy);
        for (s = 0; s < FAKE_MAX_MIGS; s++)
            if (m->migs[s].used)
                fprintf(f, "ci %u %u %u %u\n", s, m->migs[s].gi_slot, m->migs[s].ci_id, m->migs[s].ci_slices);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        fprintf(stderr, "fake NVML: cannot write the MIG state file %s: %s\n", path, strerror(errno));
    else
        mig_state_remember(path);
}

/* A live GPU's layout changed as the driver would keep it: it outlives nvmlShutdown/nvmlInit here and, with
 * FAKE_NVML_MIG_STATE, this process. g_mu held. */
static void mig_changed(unsigned int live)
{
    snprintf(g_mig_changed[CONF(live)], FAKE_UUID_SIZE, "%s", g_devs[live].uuid);
    mig_state_save();
}

/* One "gi" line into m; 0 when it names no slot or no profile of the board. */
static int mig_state_gi(struct fake_mig_gpu *m, const char *line)
{
    unsigned int s, id, profile_id, start, busy = 0, i;

    if (sscanf(line, "gi %u %u %u %u %u", &s, &id, &profile_id, &start, &busy) < 4 || s >= FAKE_MAX_GIS)
        return 0;
    for (i = 0; i < m->board->count && m->board->profiles[i].id != profile_id; i++)
        ;
    if (i == m->board->count)
        return 0;
    m->gis[s] = (struct fake_gi){ 1, id, &m->board->profiles[i], start, busy != 0 };
    return 1;
}

/* One "ci" line into m (its GPU instance read before it); 0 when it does not fit. */
static int mig_state_ci(struct fake_mig_gpu *m, const char *parent, const char *line)
{
    unsigned int s, gi_slot, ci_id, slices;
    struct fake_mig_device *d;

    if (sscanf(line, "ci %u %u %u %u", &s, &gi_slot, &ci_id, &slices) != 4 || s >= FAKE_MAX_MIGS ||
        gi_slot >= FAKE_MAX_GIS || !m->gis[gi_slot].used)
        return 0;
    d = &m->migs[s];
    *d = (struct fake_mig_device){ 1, gi_slot, ci_id, slices, "" };
    mig_uuid(d->uuid, parent, m->gis[gi_slot].profile->id, m->gis[gi_slot].id, ci_id);
    return 1;
}

/* The state file's layouts over the configured GPUs' (GPUs it does not name keep theirs). g_mu held. */
static void mig_state_load(void)
{
    const char *path = getenv("FAKE_NVML_MIG_STATE");
    char line[256], uuid[FAKE_UUID_SIZE];
    struct fake_mig_gpu *m = NULL;
    unsigned int c, current, pending;
    int ok = 1;
    FILE *f;

    if (!path || !*path || !(f = fopen(path, "r")))
        return;
    mig_state_remember(path);
    while (ok && fgets(line, sizeof line, f)) {
        if (strncmp(line, "gpu ", 4) == 0) {
            ok = sscanf(line, "gpu %79s %u %u", uuid, &current, &pending) == 3;
            for (m = NULL, c = 0; ok && c < g_conf_count && !m; c++)
                if (strcmp(g_conf[c].uuid, uuid) == 0 && g_mig[c].board)
                    m = &g_mig[c];
            if (m) {
                memset(m->gis, 0, sizeof m->gis);
                memset(m->migs, 0, sizeof m->migs);
                m->current = current;
                m->pending = pending;
            }
        } else if (m) {
            ok = strncmp(line, "gi ", 3) == 0 ? mig_state_gi(m, line) : mig_state_ci(m, uuid, line);
        }
    }
    fclose(f);
    if (!ok)
        fprintf(stderr, "fake NVML: MIG state file %s: cannot read \"%.*s\"\n", path, (int)strcspn(line, "\n"), line);
}

/* The state file read again when another process replaced it since this one last wrote or read it (a new file:
 * another inode, size or change time), so that instances made by one process are seen by the others at their
 * next call, as on a GPU. Old MIG handles then name whatever is at their slot, as after a FIFO re-layout. g_mu
 * held. */
static void mig_state_refresh(void)
{
    const char *path = getenv("FAKE_NVML_MIG_STATE");
    struct stat st;

    if (!path || !*path || stat(path, &st) != 0)
        return;
    if (st.st_ino == g_mig_state_seen.st_ino && st.st_size == g_mig_state_seen.st_size &&
        st.st_ctim.tv_sec == g_mig_state_seen.st_ctim.tv_sec && st.st_ctim.tv_nsec == g_mig_state_seen.st_ctim.tv_nsec)
        return;
    mig_state_load();
}

/* Places GPU instances k.. of gis where each one's memory slices are free (used: the slices taken), the
 * first assignment that fits, each instance at its earliest start first. 1 when all fit. */
static int place_all(struct fake_gi *gis, unsigned int n, unsigned int k, unsigned int used)
{
    unsigned int size, starts, start;

    if (k == n)
        return 1;
    geometry(gis[k].profile->index, &size, &starts);
    for (start = 0; start < FAKE_MEMORY_SLICES; start++) {
        if (!(starts & (1u << start)) || (used & span(start, size)))
            continue;
        gis[k].start = start;
        if (place_all(gis, n, k + 1, used | span(start, size)))
            return 1;
    }
    return 0;
}

/* Applies a layout (entries as described at the top) to one GPU's MIG state. On error writes a
 * reason into why and leaves the state unchanged. */
static int apply_layout(struct fake_mig_gpu *m, const char *parent_uuid, const char *const *entries, size_t n,
                        char *why, size_t why_size)
{
    struct fake_mig_gpu next = *m;
    unsigned int slices = 0, per_profile[FAKE_GI_PROFILE_COUNT] = { 0 }, ngi = 0, nmig = 0;
    size_t e;

    memset(next.gis, 0, sizeof next.gis);
    memset(next.migs, 0, sizeof next.migs);
    for (e = 0; e < n; e++) {
        char buf[128], *colon, *gi_name = buf;
        unsigned int cis[FAKE_BOARD_SLICES], ncis = 0, used = 0, k;
        const struct fake_gi_profile *p;

        if (strlen(entries[e]) >= sizeof buf) {
            snprintf(why, why_size, "instance %zu: too long", e);
            return -1;
        }
        strcpy(buf, entries[e]);
        colon = strchr(buf, ':');
        if (colon)
            *colon++ = '\0';
        /* "<C>c.<profile>": one compute instance of C slices. */
        if (!colon && buf[0] >= '1' && buf[0] <= '9' && buf[1] == 'c' && buf[2] == '.') {
            cis[ncis++] = (unsigned int)(buf[0] - '0');
            gi_name = buf + 3;
        }
        p = profile_by_name(m->board, gi_name);
        if (!p) {
            snprintf(why, why_size, "instance %zu: \"%.60s\" is not a GPU instance profile of %s", e, gi_name,
                     m->board->fragment);
            return -1;
        }
        if (colon) {
            char *save = NULL, *tok;

            for (tok = strtok_r(colon, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                unsigned long long c;

                if (ncis == FAKE_BOARD_SLICES || parse_u64(tok, &c) < 0 || c > 8) {
                    snprintf(why, why_size, "instance %zu: bad compute instance list", e);
                    return -1;
                }
                cis[ncis++] = (unsigned int)c;
            }
        }
        if (ncis == 0)
            cis[ncis++] = p->slices;
        for (k = 0; k < ncis; k++) {
            if (!ci_fits(cis[k], p->slices)) {
                snprintf(why, why_size, "instance %zu: a %uc compute instance does not fit %s", e, cis[k], p->name);
                return -1;
            }
            used += cis[k];
        }
        if (used > p->slices) {
            snprintf(why, why_size, "instance %zu: compute instances use %u slices, %s has %u", e, used, p->name,
                     p->slices);
            return -1;
        }
        if (++per_profile[p->index] > p->instances) {
            snprintf(why, why_size, "instance %zu: at most %u instances of %s", e, p->instances, p->name);
            return -1;
        }
        if (slices + p->slices > FAKE_BOARD_SLICES || ngi == FAKE_MAX_GIS || nmig + ncis > FAKE_MAX_MIGS) {
            snprintf(why, why_size, "instance %zu: the layout needs more than the GPU's %d slices", e,
                     FAKE_BOARD_SLICES);
            return -1;
        }
        next.gis[ngi] = (struct fake_gi){ 1, ngi + 1, p, FAKE_NO_INSTANCE, 0 };
        for (k = 0; k < ncis; k++) {
            struct fake_mig_device *d = &next.migs[nmig++];

            d->used = 1;
            d->gi_slot = ngi;
            d->ci_id = k;
            d->ci_slices = cis[k];
            mig_uuid(d->uuid, parent_uuid, p->id, ngi + 1, k);
        }
        slices += p->slices;
        ngi++;
    }
    if (!place_all(next.gis, ngi, 0, 0)) {
        snprintf(why, why_size, "the instances do not fit the GPU's %d memory slices", FAKE_MEMORY_SLICES);
        return -1;
    }
    *m = next;
    return 0;
}

/* gpus[i].mig from the fixture (called by load_gpu once the GPU's name and UUID are read). */
static nvmlReturn_t mig_load_gpu(const json_value *g, unsigned int index)
{
    static const char *const allowed[] = { "current", "pending", "instances", NULL };
    struct fake_mig_gpu *m = &g_mig_stage[index];
    const struct fake_device *d = &g_stage.gpus[index];
    const json_value *v, *x;
    const char *entries[FAKE_MAX_MIGS];
    char key[96], why[200];
    size_t i;
    nvmlReturn_t r;

    memset(m, 0, sizeof *m);
    if (!(v = json_object_get(g, "mig")))
        return NVML_SUCCESS;
    snprintf(key, sizeof key, "gpus[%u].mig", index);
    if (v->type != JSON_OBJECT)
        return config_error(key, "expected an object, got %s", json_type_name(v->type));
    if ((r = check_keys(v, key, allowed)) != NVML_SUCCESS)
        return r;
    m->board = board_for(d->name);
    if (!m->board)
        return config_error(key, "\"%.60s\" has no MIG profile table here (A100-SXM4-40GB, A100-SXM4-80GB, H100 80GB HBM3, H200)", d->name);
    /* MIG UUIDs are the parent's with its last six hex digits replaced: parents that differ only there would give
     * two MIG devices one UUID, which no driver does. */
    for (i = 0; i < index; i++) {
        const char *other = g_stage.gpus[i].uuid;
        size_t n = strlen(d->uuid);

        if (g_mig_stage[i].board && n > 6 && strlen(other) == n && strncmp(other, d->uuid, n - 6) == 0)
            return config_error(key, "GPU %u's UUID %s differs from GPU %u's %s only in its last six hex digits, which "
                                "MIG device UUIDs replace: give MIG-capable GPUs UUIDs that differ before them",
                                index, d->uuid, (unsigned int)i, other);
    }
    snprintf(key, sizeof key, "gpus[%u].mig.current", index);
    if ((x = json_object_get(v, "current"))) {
        if (x->type != JSON_BOOL)
            return config_error(key, "expected true or false");
        m->current = (unsigned int)x->boolean;
    }
    m->pending = m->current;
    snprintf(key, sizeof key, "gpus[%u].mig.pending", index);
    if ((x = json_object_get(v, "pending"))) {
        if (x->type != JSON_BOOL)
            return config_error(key, "expected true or false");
        m->pending = (unsigned int)x->boolean;
    }
    snprintf(key, sizeof key, "gpus[%u].mig.instances", index);
    if ((x = json_object_get(v, "instances"))) {
        if (x->type != JSON_ARRAY || x->count > FAKE_MAX_MIGS)
            return config_error(key, "expected an array of at most %d profile strings", FAKE_MAX_MIGS);
        for (i = 0; i < x->count; i++) {
            if (x->items[i]->type != JSON_STRING)
                return config_error(key, "expected an array of profile strings");
            entries[i] = x->items[i]->string;
        }
        if (x->count > 0 && !m->current)
            return config_error(key, "instances need MIG mode enabled (current: true)");
        if (apply_layout(m, d->uuid, entries, x->count, why, sizeof why) < 0)
            return config_error(key, "%s", why);
    }
    return NVML_SUCCESS;
}

/* "mig <index> on [entry...]" | "mig <index> off" | "mig <index> pending <0|1>". g_mu held. */
#define MIG_USAGE "usage: mig <index> on [profile...] | off | pending <0|1> | busy <gi id> <0|1>"

static void mig_command(const char *original, char *args)
{
    char *tokens[FAKE_MAX_MIGS + 3], *save = NULL, *tok, why[200];
    int ntok = 0, gpu;
    struct fake_mig_gpu *m;

    for (tok = strtok_r(args, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        if (ntok == (int)(sizeof tokens / sizeof tokens[0])) {
            control_complain(original, "too many MIG instances");
            return;
        }
        tokens[ntok++] = tok;
    }
    if (ntok < 2) {
        control_complain(original, MIG_USAGE);
        return;
    }
    if (parse_gpu_token(original, tokens[0], 0, &gpu) < 0)
        return;
    m = mig_gpu(gpu);
    if (!m->board) {
        control_complain(original, "the GPU is not MIG-capable (its fixture entry has no \"mig\")");
        return;
    }
    if (strcmp(tokens[1], "off") == 0 && ntok == 2) {
        memset(m->gis, 0, sizeof m->gis);
        memset(m->migs, 0, sizeof m->migs);
        m->current = m->pending = 0;
    } else if (strcmp(tokens[1], "pending") == 0 && ntok == 3 && (strcmp(tokens[2], "0") == 0 || strcmp(tokens[2], "1") == 0)) {
        m->pending = tokens[2][0] == '1';
    } else if (strcmp(tokens[1], "busy") == 0 && ntok == 4 && (strcmp(tokens[3], "0") == 0 || strcmp(tokens[3], "1") == 0)) {
        unsigned int k, id = (unsigned int)strtoul(tokens[2], NULL, 10);

        for (k = 0; k < FAKE_MAX_GIS && !(m->gis[k].used && m->gis[k].id == id); k++)
            ;
        if (k == FAKE_MAX_GIS) {
            control_complain(original, "the GPU has no GPU instance with that id");
            return;
        }
        m->gis[k].busy = tokens[3][0] == '1';
    } else if (strcmp(tokens[1], "on") == 0) {
        if (apply_layout(m, g_devs[gpu].uuid, (const char *const *)(tokens + 2), (size_t)(ntok - 2), why, sizeof why) < 0) {
            control_complain(original, why);
            return;
        }
        m->current = m->pending = 1;
    } else {
        control_complain(original, MIG_USAGE);
        return;
    }
    mig_changed((unsigned int)gpu);
}

/* ---- Whole-GPU calls on MIG handles --------------------------------------------------------- */

/* nvmlDeviceGetUUID/GetName/GetMemoryInfo for a MIG handle: returns 1 and sets *result when the
 * handle is one. Takes and releases g_mu itself. */
static int mig_answer(nvmlDevice_t handle, int what, char *buf, unsigned int length, nvmlMemory_t *memory,
                      nvmlReturn_t *result)
{
    struct fake_mig_device *d;
    const struct fake_gi_profile *p;
    unsigned int gpu;
    char name[FAKE_NAME_SIZE + 32];

    if (enter() != NVML_SUCCESS)
        return 0;
    d = mig_from_handle(handle, &gpu);
    if (!d) {
        leave(NVML_SUCCESS);
        return 0;
    }
    p = MIG(gpu).gis[d->gi_slot].profile;
    if (g_devs[gpu].lost) {
        *result = leave(NVML_ERROR_GPU_IS_LOST);
        return 1;
    }
    switch (what) {
    case 0:
        *result = leave(buf ? copy_string(buf, length, d->uuid) : NVML_ERROR_INVALID_ARGUMENT);
        break;
    case 1:
        if (d->ci_slices == p->slices)
            snprintf(name, sizeof name, "%s MIG %s", g_devs[gpu].name, p->name);
        else
            snprintf(name, sizeof name, "%s MIG %uc.%s", g_devs[gpu].name, d->ci_slices, p->name);
        *result = leave(buf ? copy_string(buf, length, name) : NVML_ERROR_INVALID_ARGUMENT);
        break;
    default:
        if (!memory) {
            *result = leave(NVML_ERROR_INVALID_ARGUMENT);
            break;
        }
        memory->total = p->memory_mb << 20;
        memory->used = 0;
        memory->free = memory->total;
        *result = leave(NVML_SUCCESS);
        break;
    }
    return 1;
}

#ifndef FAKE_OLD_DRIVER

/* ---- MIG entry points ---------------------------------------------------------------------- */

/* Prologue for calls on a parent GPU that must be MIG-capable. Returns with g_mu held only on
 * success. MIG handles: NOT_SUPPORTED. */
static nvmlReturn_t enter_mig_parent(nvmlDevice_t device, int arguments_ok, unsigned int *gpu)
{
    struct fake_device *d;
    nvmlReturn_t r;

    if ((r = enter_device(device, arguments_ok, &d)) != NVML_SUCCESS)
        return r;
    if (!MIG(d->index).board)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *gpu = d->index;
    return NVML_SUCCESS;
}

/* Prologue for calls on a MIG handle. GPU handles: INVALID_ARGUMENT. */
static nvmlReturn_t enter_mig_device(nvmlDevice_t device, int arguments_ok, struct fake_mig_device **out,
                                     unsigned int *gpu)
{
    nvmlReturn_t r;

    if ((r = enter()) != NVML_SUCCESS)
        return r;
    *out = mig_from_handle(device, gpu);
    if (!*out || !arguments_ok)
        return leave(device_from_handle(device) && arguments_ok ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT);
    if (g_devs[*gpu].lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetMigMode);
    if ((r = enter_mig_parent(device, currentMode != NULL && pendingMode != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    *currentMode = MIG(gpu).current;
    *pendingMode = MIG(gpu).pending;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetMaxMigDeviceCount);
    if ((r = enter_mig_parent(device, count != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    *count = FAKE_MAX_MIGS;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig)
{
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetMigDeviceHandleByIndex);
    if ((r = enter_mig_parent(device, mig != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    if (index >= FAKE_MAX_MIGS)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!MIG(gpu).current || !MIG(gpu).migs[index].used)
        return leave(NVML_ERROR_NOT_FOUND);
    *mig = (nvmlDevice_t)(void *)&g_mig_handles[CONF(gpu)][index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig)
{
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceIsMigDeviceHandle);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!isMig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_from_handle(device, &gpu)) {
        *isMig = 1;
        return leave(NVML_SUCCESS);
    }
    if (!device_from_handle(device))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isMig = 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct fake_mig_device *d;
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetGpuInstanceId);
    if ((r = enter_mig_device(device, id != NULL, &d, &gpu)) != NVML_SUCCESS)
        return r;
    *id = MIG(gpu).gis[d->gi_slot].id;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct fake_mig_device *d;
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetComputeInstanceId);
    if ((r = enter_mig_device(device, id != NULL, &d, &gpu)) != NVML_SUCCESS)
        return r;
    *id = d->ci_id;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *device)
{
    struct fake_mig_device *d;
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetDeviceHandleFromMigDeviceHandle);
    if ((r = enter_mig_device(mig, device != NULL, &d, &gpu)) != NVML_SUCCESS)
        return r;
    *device = handle_of(gpu);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *a)
{
    struct fake_mig_device *d;
    struct fake_device *whole;
    const struct fake_gi_profile *p;
    unsigned int gpu;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetAttributes_v2);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!a)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((d = mig_from_handle(device, &gpu))) {
        if (g_devs[gpu].lost)
            return leave(NVML_ERROR_GPU_IS_LOST);
        p = MIG(gpu).gis[d->gi_slot].profile;
        a->multiprocessorCount = d->ci_slices * MIG(gpu).board->sms_per_slice;
        if (d->ci_slices == p->slices)
            a->multiprocessorCount = p->sms;
        a->sharedCopyEngineCount = p->ce;
        a->sharedDecoderCount = p->dec;
        a->sharedEncoderCount = p->enc;
        a->sharedJpegCount = p->jpeg;
        a->sharedOfaCount = p->ofa;
        a->gpuInstanceSliceCount = p->slices;
        a->computeInstanceSliceCount = d->ci_slices;
        a->memorySizeMB = p->memory_mb;
        return leave(NVML_SUCCESS);
    }
    if (!(whole = device_from_handle(device)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (whole->lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = MIG(whole->index).board ? MIG(whole->index).board->sms_per_slice * 7 : 80;
    a->memorySizeMB = whole->memory_total >> 20;
    return leave(NVML_SUCCESS);
}

static void fill_gi_profile(const struct fake_gi_profile *p, nvmlGpuInstanceProfileInfo_t *info)
{
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sms;
    info->copyEngineCount = p->ce;
    info->decoderCount = p->dec;
    info->encoderCount = p->enc;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->memory_mb;
}

/* INVALID_ARGUMENT for an index past the table, NOT_SUPPORTED for one this board lacks. */
static nvmlReturn_t gi_profile(nvmlDevice_t device, unsigned int profile, int arguments_ok,
                               const struct fake_gi_profile **out)
{
    unsigned int gpu;
    nvmlReturn_t r;

    if ((r = enter_mig_parent(device, arguments_ok, &gpu)) != NVML_SUCCESS)
        return r;
    if (profile >= FAKE_GI_PROFILE_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!(*out = profile_by_index(MIG(gpu).board, profile)))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                       nvmlGpuInstanceProfileInfo_t *info)
{
    const struct fake_gi_profile *p;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetGpuInstanceProfileInfo);
    if ((r = gi_profile(device, profile, info != NULL, &p)) != NVML_SUCCESS)
        return r;
    fill_gi_profile(p, info);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct fake_gi_profile *p;
    nvmlGpuInstanceProfileInfo_t v1;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetGpuInstanceProfileInfoV);
    if (info && info->version != FAKE_GI_PROFILE_INFO_V2)
        return NVML_ERROR_INVALID_ARGUMENT; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH on newer drivers */
    if ((r = gi_profile(device, profile, info != NULL, &p)) != NVML_SUCCESS)
        return r;
    fill_gi_profile(p, &v1);
    info->id = v1.id;
    info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->jpegCount = v1.jpegCount;
    info->ofaCount = v1.ofaCount;
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gi)
{
    unsigned int gpu, s;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetGpuInstanceById);
    if ((r = enter_mig_parent(device, gi != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    if (!MIG(gpu).current)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (s = 0; s < FAKE_MAX_GIS; s++) {
        if (MIG(gpu).gis[s].used && MIG(gpu).gis[s].id == id) {
            *gi = &g_gi_handles[CONF(gpu)][s];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t handle, nvmlGpuInstanceInfo_t *info)
{
    struct fake_gi *gi;
    unsigned int gpu, s;
    nvmlReturn_t r;

    COUNT_CALL(nvmlGpuInstanceGetInfo);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(gi = gi_from_handle(handle, &gpu)) || !info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    info->device = handle_of(gpu);
    info->id = gi->id;
    info->profileId = gi->profile->id;
    info->placement.start = gi->start;
    geometry(gi->profile->index, &info->placement.size, &s);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t handle, unsigned int id,
                                                         nvmlComputeInstance_t *ci)
{
    struct fake_gi *gi;
    unsigned int gpu, s;
    nvmlReturn_t r;

    COUNT_CALL(nvmlGpuInstanceGetComputeInstanceById);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(gi = gi_from_handle(handle, &gpu)) || !ci)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (s = 0; s < FAKE_MAX_MIGS; s++) {
        const struct fake_mig_device *d = &MIG(gpu).migs[s];

        if (d->used && &MIG(gpu).gis[d->gi_slot] == gi && d->ci_id == id) {
            *ci = &g_ci_handles[CONF(gpu)][s];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t handle, nvmlComputeInstanceInfo_t *info)
{
    struct fake_mig_device *d;
    unsigned int gpu, slot, start = 0, s;
    nvmlReturn_t r;

    COUNT_CALL(nvmlComputeInstanceGetInfo_v2);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(d = ci_from_handle(handle, &gpu, &slot)) || !info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (s = 0; s < slot; s++) {
        if (MIG(gpu).migs[s].gi_slot == d->gi_slot)
            start += MIG(gpu).migs[s].ci_slices;
    }
    info->device = handle_of(gpu);
    info->gpuInstance = &g_gi_handles[CONF(gpu)][d->gi_slot];
    info->id = d->ci_id;
    info->profileId = (unsigned int)ci_profile_index(d->ci_slices);
    info->placement.start = start;
    info->placement.size = d->ci_slices;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t ci_profile(nvmlGpuInstance_t handle, unsigned int profile, unsigned int eng, int arguments_ok,
                               nvmlComputeInstanceProfileInfo_t *out)
{
    struct fake_gi *gi;
    unsigned int gpu, c;
    nvmlReturn_t r;

    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(gi = gi_from_handle(handle, &gpu)) || !arguments_ok || profile >= FAKE_CI_PROFILE_COUNT || eng != 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (c = 1; c <= FAKE_BOARD_SLICES; c++) {
        if (ci_profile_index(c) == (int)profile)
            break;
    }
    if (c > FAKE_BOARD_SLICES || !ci_fits(c, gi->profile->slices))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    out->id = profile;
    out->sliceCount = c;
    out->instanceCount = gi->profile->slices / c;
    out->multiprocessorCount = c == gi->profile->slices ? gi->profile->sms : c * MIG(gpu).board->sms_per_slice;
    out->sharedCopyEngineCount = gi->profile->ce;
    out->sharedDecoderCount = gi->profile->dec;
    out->sharedEncoderCount = gi->profile->enc;
    out->sharedJpegCount = gi->profile->jpeg;
    out->sharedOfaCount = gi->profile->ofa;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned int profile,
                                                                unsigned int engProfile,
                                                                nvmlComputeInstanceProfileInfo_t *info)
{
    nvmlComputeInstanceProfileInfo_t p;
    nvmlReturn_t r;

    COUNT_CALL(nvmlGpuInstanceGetComputeInstanceProfileInfo);
    if ((r = ci_profile(gi, profile, engProfile, info != NULL, &p)) != NVML_SUCCESS)
        return r;
    *info = p;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gi, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_v2_t *info)
{
    nvmlComputeInstanceProfileInfo_t p;
    nvmlReturn_t r;

    COUNT_CALL(nvmlGpuInstanceGetComputeInstanceProfileInfoV);
    if (info && info->version != FAKE_CI_PROFILE_INFO_V2)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = ci_profile(gi, profile, engProfile, info != NULL, &p)) != NVML_SUCCESS)
        return r;
    info->id = p.id;
    info->sliceCount = p.sliceCount;
    info->instanceCount = p.instanceCount;
    info->multiprocessorCount = p.multiprocessorCount;
    info->sharedCopyEngineCount = p.sharedCopyEngineCount;
    info->sharedDecoderCount = p.sharedDecoderCount;
    info->sharedEncoderCount = p.sharedEncoderCount;
    info->sharedJpegCount = p.sharedJpegCount;
    info->sharedOfaCount = p.sharedOfaCount;
    snprintf(info->name, sizeof info->name, "MIG %uc", p.sliceCount);
    return leave(NVML_SUCCESS);
}

/* ---- Dynamic MIG: placements, creating and destroying instances ----------------------------- */

static const struct fake_gi_profile *profile_by_id(const struct fake_board *b, unsigned int id)
{
    size_t i;

    for (i = 0; i < b->count; i++) {
        if (b->profiles[i].id == id)
            return &b->profiles[i];
    }
    return NULL;
}

/* The memory slices the GPU's instances hold, and how many instances of profile p it has. */
static unsigned int slices_used(const struct fake_mig_gpu *m, const struct fake_gi_profile *p, unsigned int *of_p)
{
    unsigned int used = 0, s, size, starts;

    *of_p = 0;
    for (s = 0; s < FAKE_MAX_GIS; s++) {
        if (!m->gis[s].used)
            continue;
        geometry(m->gis[s].profile->index, &size, &starts);
        used |= span(m->gis[s].start, size);
        if (m->gis[s].profile == p)
            (*of_p)++;
    }
    return used;
}

/* FAKE_NVML_CRASH_AFTER names this step: the process ends as a kill would end it, right after. */
static void crash_point(const char *step)
{
    const char *at = getenv("FAKE_NVML_CRASH_AFTER");

    if (at && strcmp(at, step) == 0)
        _exit(137);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                   nvmlGpuInstancePlacement_t *placements,
                                                                   unsigned int *count)
{
    const struct fake_gi_profile *p;
    unsigned int gpu, size, starts, start, n = 0;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    if ((r = enter_mig_parent(device, count != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    if (!(p = profile_by_id(MIG(gpu).board, profileId)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    geometry(p->index, &size, &starts);
    for (start = 0; start < FAKE_MEMORY_SLICES; start++) {
        if (!(starts & (1u << start)))
            continue;
        if (placements) {
            if (n == *count)
                return leave(NVML_ERROR_INSUFFICIENT_SIZE);
            placements[n] = (nvmlGpuInstancePlacement_t){ start, size };
        }
        n++;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                             unsigned int *count)
{
    const struct fake_gi_profile *p;
    unsigned int gpu, size, starts, start, used, of_p, n = 0;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetGpuInstanceRemainingCapacity);
    if ((r = enter_mig_parent(device, count != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    if (!MIG(gpu).current)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!(p = profile_by_id(MIG(gpu).board, profileId)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    geometry(p->index, &size, &starts);
    used = slices_used(&MIG(gpu), p, &of_p);
    for (start = 0; start < FAKE_MEMORY_SLICES; start++) {
        if ((starts & (1u << start)) && !(used & span(start, size))) {
            n++;
            used |= span(start, size);
        }
    }
    *count = of_p >= p->instances ? 0 : (n < p->instances - of_p ? n : p->instances - of_p);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                            const nvmlGpuInstancePlacement_t *placement,
                                                            nvmlGpuInstance_t *gi)
{
    const struct fake_gi_profile *p;
    struct fake_mig_gpu *m;
    unsigned int gpu, size, starts, used, of_p, s, id, free_slot = FAKE_NO_INSTANCE, taken;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceCreateGpuInstanceWithPlacement);
    if ((r = enter_mig_parent(device, placement != NULL && gi != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    m = &MIG(gpu);
    if (!m->current)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!(p = profile_by_id(m->board, profileId)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    geometry(p->index, &size, &starts);
    if (placement->start >= FAKE_MEMORY_SLICES || !(starts & (1u << placement->start)) || placement->size != size)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    used = slices_used(m, p, &of_p);
    if ((used & span(placement->start, size)) || of_p >= p->instances)
        return leave(NVML_ERROR_INSUFFICIENT_RESOURCES);
    for (s = 0; s < FAKE_MAX_GIS && free_slot == FAKE_NO_INSTANCE; s++)
        if (!m->gis[s].used)
            free_slot = s;
    if (free_slot == FAKE_NO_INSTANCE)
        return leave(NVML_ERROR_INSUFFICIENT_RESOURCES);
    for (id = 1;; id++) {
        for (taken = 0, s = 0; s < FAKE_MAX_GIS; s++)
            taken |= m->gis[s].used && m->gis[s].id == id;
        if (!taken)
            break;
    }
    m->gis[free_slot] = (struct fake_gi){ 1, id, p, placement->start, 0 };
    *gi = &g_gi_handles[CONF(gpu)][free_slot];
    mig_changed(gpu);
    leave(NVML_SUCCESS);
    crash_point("create-gpu-instance");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t handle, unsigned int profileId,
                                                        nvmlComputeInstance_t *ci)
{
    struct fake_gi *gi;
    struct fake_mig_device *d;
    unsigned int gpu, c, s, used = 0, id, taken, free_slot = FAKE_NO_INSTANCE;
    nvmlReturn_t r;

    COUNT_CALL(nvmlGpuInstanceCreateComputeInstance);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(gi = gi_from_handle(handle, &gpu)) || !ci || profileId >= FAKE_CI_PROFILE_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (c = 1; c <= FAKE_BOARD_SLICES && ci_profile_index(c) != (int)profileId; c++)
        ;
    if (c > FAKE_BOARD_SLICES || !ci_fits(c, gi->profile->slices))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (s = 0; s < FAKE_MAX_MIGS; s++) {
        d = &MIG(gpu).migs[s];
        if (d->used && &MIG(gpu).gis[d->gi_slot] == gi)
            used += d->ci_slices;
        else if (!d->used && free_slot == FAKE_NO_INSTANCE)
            free_slot = s;
    }
    if (used + c > gi->profile->slices || free_slot == FAKE_NO_INSTANCE)
        return leave(NVML_ERROR_INSUFFICIENT_RESOURCES);
    for (id = 0;; id++) {
        for (taken = 0, s = 0; s < FAKE_MAX_MIGS; s++) {
            d = &MIG(gpu).migs[s];
            taken |= d->used && &MIG(gpu).gis[d->gi_slot] == gi && d->ci_id == id;
        }
        if (!taken)
            break;
    }
    d = &MIG(gpu).migs[free_slot];
    d->used = 1;
    d->gi_slot = (unsigned int)(gi - MIG(gpu).gis);
    d->ci_id = id;
    d->ci_slices = c;
    mig_uuid(d->uuid, g_devs[gpu].uuid, gi->profile->id, gi->id, id);
    *ci = &g_ci_handles[CONF(gpu)][free_slot];
    mig_changed(gpu);
    leave(NVML_SUCCESS);
    crash_point("create-compute-instance");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t handle)
{
    struct fake_mig_device *d;
    unsigned int gpu, slot;
    nvmlReturn_t r;

    COUNT_CALL(nvmlComputeInstanceDestroy);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(d = ci_from_handle(handle, &gpu, &slot)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (MIG(gpu).gis[d->gi_slot].busy)
        return leave(NVML_ERROR_IN_USE);
    memset(d, 0, sizeof *d);
    mig_changed(gpu);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t handle)
{
    struct fake_gi *gi;
    unsigned int gpu, s;
    nvmlReturn_t r;

    COUNT_CALL(nvmlGpuInstanceDestroy);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(gi = gi_from_handle(handle, &gpu)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (s = 0; s < FAKE_MAX_MIGS; s++) {
        if (MIG(gpu).migs[s].used && &MIG(gpu).gis[MIG(gpu).migs[s].gi_slot] == gi)
            return leave(NVML_ERROR_IN_USE);
    }
    memset(gi, 0, sizeof *gi);
    mig_changed(gpu);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gis,
                                             unsigned int *count)
{
    const struct fake_gi_profile *p;
    unsigned int gpu, s, n = 0;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetGpuInstances);
    if ((r = enter_mig_parent(device, gis != NULL && count != NULL, &gpu)) != NVML_SUCCESS)
        return r;
    if (!MIG(gpu).current)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!(p = profile_by_id(MIG(gpu).board, profileId)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (s = 0; s < FAKE_MAX_GIS; s++) {
        if (!MIG(gpu).gis[s].used || MIG(gpu).gis[s].profile != p)
            continue;
        if (n == *count)
            return leave(NVML_ERROR_INSUFFICIENT_SIZE);
        gis[n++] = &g_gi_handles[CONF(gpu)][s];
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t handle, unsigned int profileId,
                                                      nvmlComputeInstance_t *cis, unsigned int *count)
{
    struct fake_gi *gi;
    unsigned int gpu, s, n = 0;
    nvmlReturn_t r;

    COUNT_CALL(nvmlGpuInstanceGetComputeInstances);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!(gi = gi_from_handle(handle, &gpu)) || !cis || !count || profileId >= FAKE_CI_PROFILE_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (s = 0; s < FAKE_MAX_MIGS; s++) {
        const struct fake_mig_device *d = &MIG(gpu).migs[s];

        if (!d->used || &MIG(gpu).gis[d->gi_slot] != gi || ci_profile_index(d->ci_slices) != (int)profileId)
            continue;
        if (n == *count)
            return leave(NVML_ERROR_INSUFFICIENT_SIZE);
        cis[n++] = &g_ci_handles[CONF(gpu)][s];
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

#endif /* FAKE_OLD_DRIVER */
