/*
 * fake_nvml.c: a stand-in for NVIDIA's libnvidia-ml.so.1 on machines without a GPU.
 *
 * It exports a subset of the real NVML C ABI (same symbol names, argument types,
 * struct layouts and return codes), so a program that loads the real library by
 * soname through dlopen/FFI can load this one instead (LD_LIBRARY_PATH pointing at
 * the build directory). The GPUs it shows come from a JSON file; events and GPU loss
 * are injected at run time through a control FIFO. See build.ts for how it is built
 * and test/unit/fake-nvml.test.ts for the behaviour it promises.
 *
 * Environment, read when the reference count of nvmlInit goes from 0 to 1:
 *   FAKE_NVML_CONFIG   path of the JSON description (format above g_stage below). Unset or
 *                      unreadable: init returns NVML_ERROR_DRIVER_NOT_LOADED (9).
 *                      Malformed or invalid: NVML_ERROR_UNKNOWN (999) and one stderr line.
 *   FAKE_NVML_MIG_STATE optional path of a file the MIG layouts are kept in across processes
 *                      (fake_mig.h: written at each change, read at each nvmlInit and again at
 *                      the next call after another process changed it).
 *   FAKE_NVML_CONTROL  optional path of a control FIFO (created with mkfifo when it does
 *                      not exist; never removed). One line per command:
 *                        xid <index|all> <n> [<gi> <ci>]
 *                                              XidCriticalError, eventData n (all: device NULL);
 *                                              gi/ci name a MIG device (default 0xFFFFFFFF)
 *                        mig <index> on [profile...] | off | pending <0|1> | busy <gi> <0|1>
 *                                              change a GPU's MIG layout or mode (fake_mig.h);
 *                                              it outlives nvmlShutdown/nvmlInit, as on a real node
 *                        dbe <index|all>       DoubleBitEccError
 *                        sbe <index|all>       SingleBitEccError
 *                        lost <index>          the GPU answers NVML_ERROR_GPU_IS_LOST
 *                        back <index>          the GPU answers normally again
 *                        compute-mode <index> <0|2|3>
 *                                              set a GPU's compute mode as an administrator
 *                                              would (`nvidia-smi -c`); like one set through
 *                                              nvmlDeviceSetComputeMode it outlives
 *                                              nvmlShutdown/nvmlInit, until an unload
 *                        remove <index>        the GPU leaves the bus: the device count drops and
 *                                              the GPUs after it move down one index (their
 *                                              handles stay theirs; the removed GPU's answers
 *                                              GPU_IS_LOST); links to it go inactive
 *                        add <uuid|all>        a removed GPU comes back at its configured place
 *                                              (the indices of the GPUs after it move up)
 *                        unload                the driver goes: every call answers
 *                                              DRIVER_NOT_LOADED, nvmlInit fails with it
 *                        load [<version>]      the driver is back, reporting this version (default
 *                                              the config's); a session opened before the unload
 *                                              answers UNINITIALIZED until its last nvmlShutdown
 *                        stats <path>          write call counters, and each GPU's compute mode
 *                                              by UUID, as JSON (tmp file + rename)
 *                        reset-stats           zero the call counters and droppedEvents
 *                        health <index|all> [quiet] <key>=<value>... | reset | clear
 *                                              set or clear a GPU's health states beyond XIDs
 *                                              and fire their events (fake_health.h)
 *                      Commands run in order, so a `stats` file appearing proves every
 *                      earlier command was applied. Empty lines and lines starting with
 *                      '#' are ignored; a malformed line gets one stderr line.
 *                      Node changes (remove, unload) outlive nvmlShutdown/nvmlInit: a GPU
 *                      removed stays removed, an unloaded driver stays unloaded, a loaded
 *                      version stays, until a command undoes it. While one is in effect the
 *                      control thread keeps reading the FIFO after the last nvmlShutdown, so
 *                      the command that undoes it can arrive.
 *
 * Build variants: compiled with -DFAKE_OLD_DRIVER the library stands for an old driver
 * and lacks nvmlDeviceGetNumaNodeId, nvmlDeviceGetNvLinkRemotePciInfo_v2,
 * nvmlDeviceGetNvLinkRemoteDeviceType, nvmlEventSetWait_v2 and every MIG entry point
 * (fake_mig.h). Like the real library,
 * both variants also export the older v1 names nvmlInit, nvmlEventSetWait and
 * nvmlDeviceGetNvLinkRemotePciInfo.
 *
 * Threading: one mutex (g_mu) guards all state; every entry point takes it for the
 * length of the call and nvmlEventSetWait* releases it while blocked (condition variable
 * on CLOCK_MONOTONIC), so any thread may call anything at any time. A second mutex
 * (g_init_mu) serialises the nvmlInit calls and nvmlShutdown, which start and join the control
 * thread; it is always taken before g_mu, never after.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------------------ */
/* The public ABI, as in nvml.h                                                          */
/* ------------------------------------------------------------------------------------ */

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef enum nvmlGpuLevel_enum {
    NVML_TOPOLOGY_INTERNAL = 0,
    NVML_TOPOLOGY_SINGLE = 10,
    NVML_TOPOLOGY_MULTIPLE = 20,
    NVML_TOPOLOGY_HOSTBRIDGE = 30,
    NVML_TOPOLOGY_NODE = 40,
    NVML_TOPOLOGY_SYSTEM = 50
} nvmlGpuTopologyLevel_t;

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;

typedef enum nvmlComputeMode_enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1, /* "Support Removed" in nvml.h */
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
    NVML_COMPUTEMODE_COUNT
} nvmlComputeMode_t;

typedef enum nvmlNvLinkDeviceType_enum {
    NVML_NVLINK_DEVICE_TYPE_GPU = 0x00,
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01,
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02,
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
} nvmlIntNvLinkDeviceType_t;

#define nvmlEventTypeSingleBitEccError 0x0000000000000001ULL
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002ULL
#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL
#define nvmlEventTypeDramRetirementEvent 0x0000000000000400ULL
#define nvmlEventTypeDramRetirementFailure 0x0000000000000800ULL
#define nvmlEventTypeGpuRecoveryAction 0x0000000000008000ULL
#define FAKE_ALL_EVENTS (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError)

typedef struct fake_device *nvmlDevice_t;
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");

/* Prototypes of every exported function, spelled as in nvml.h. */
EXPORT nvmlReturn_t nvmlInit_v2(void);
EXPORT nvmlReturn_t nvmlInit(void);
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
EXPORT nvmlReturn_t nvmlShutdown(void);
EXPORT const char *nvmlErrorString(nvmlReturn_t result);
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length);
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion);
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion);
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device);
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber);
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                        nvmlGpuTopologyLevel_t *pathInfo);
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive);
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci);
EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set);
EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes);
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set);
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms);
EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set);
EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode);
EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode);
#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node);
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci);
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType);
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms);
#endif

/* ------------------------------------------------------------------------------------ */
/* Call counters                                                                         */
/* ------------------------------------------------------------------------------------ */

#define FAKE_FUNCS_BASE(X)                  \
    X(nvmlInit_v2)                          \
    X(nvmlInit)                             \
    X(nvmlInitWithFlags)                    \
    X(nvmlShutdown)                         \
    X(nvmlSystemGetDriverVersion)           \
    X(nvmlSystemGetNVMLVersion)             \
    X(nvmlSystemGetCudaDriverVersion)       \
    X(nvmlSystemGetCudaDriverVersion_v2)    \
    X(nvmlDeviceGetCudaComputeCapability)   \
    X(nvmlDeviceGetCount_v2)                \
    X(nvmlDeviceGetHandleByIndex_v2)        \
    X(nvmlDeviceGetHandleByUUID)            \
    X(nvmlDeviceGetHandleByPciBusId_v2)     \
    X(nvmlDeviceGetIndex)                   \
    X(nvmlDeviceGetUUID)                    \
    X(nvmlDeviceGetName)                    \
    X(nvmlDeviceGetMinorNumber)             \
    X(nvmlDeviceGetPciInfo_v3)              \
    X(nvmlDeviceGetMemoryInfo)              \
    X(nvmlDeviceGetTopologyCommonAncestor)  \
    X(nvmlDeviceGetNvLinkState)             \
    X(nvmlDeviceGetNvLinkRemotePciInfo)     \
    X(nvmlEventSetCreate)                   \
    X(nvmlDeviceGetSupportedEventTypes)     \
    X(nvmlDeviceRegisterEvents)             \
    X(nvmlEventSetWait)                     \
    X(nvmlEventSetFree)                     \
    X(nvmlDeviceGetComputeMode)             \
    X(nvmlDeviceSetComputeMode)             \
    FAKE_FUNCS_HEALTH(X)

/* Health calls beyond XIDs (fake_health.h) every driver variant has. */
#define FAKE_FUNCS_HEALTH(X)                        \
    X(nvmlDeviceGetFieldValues)                     \
    X(nvmlDeviceGetRetiredPagesPendingStatus)       \
    X(nvmlDeviceGetTotalEccErrors)                  \
    X(nvmlDeviceGetCurrPcieLinkWidth)               \
    X(nvmlDeviceGetMaxPcieLinkWidth)                \
    X(nvmlDeviceGetPcieReplayCounter)               \
    X(nvmlDeviceGetCurrentClocksThrottleReasons)

#ifdef FAKE_OLD_DRIVER
#define FAKE_FUNCS_NEWER(X)
#else
#define FAKE_FUNCS_NEWER(X)                 \
    X(nvmlDeviceGetNumaNodeId)              \
    X(nvmlDeviceGetNvLinkRemotePciInfo_v2)  \
    X(nvmlDeviceGetNvLinkRemoteDeviceType)  \
    X(nvmlEventSetWait_v2)                  \
    X(nvmlDeviceGetRemappedRows)            \
    X(nvmlDeviceGetRetiredPages_v2)         \
    X(nvmlDeviceGetCurrentClocksEventReasons) \
    FAKE_FUNCS_MIG(X)
#endif

/* MIG entry points (fake_mig.h), missing from the old-driver variant. */
#define FAKE_FUNCS_MIG(X)                             \
    X(nvmlDeviceGetMigMode)                           \
    X(nvmlDeviceGetMaxMigDeviceCount)                 \
    X(nvmlDeviceGetMigDeviceHandleByIndex)            \
    X(nvmlDeviceIsMigDeviceHandle)                    \
    X(nvmlDeviceGetGpuInstanceId)                     \
    X(nvmlDeviceGetComputeInstanceId)                 \
    X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)   \
    X(nvmlDeviceGetAttributes_v2)                     \
    X(nvmlDeviceGetGpuInstanceProfileInfo)            \
    X(nvmlDeviceGetGpuInstanceProfileInfoV)           \
    X(nvmlDeviceGetGpuInstanceById)                   \
    X(nvmlGpuInstanceGetInfo)                         \
    X(nvmlGpuInstanceGetComputeInstanceById)          \
    X(nvmlComputeInstanceGetInfo_v2)                  \
    X(nvmlGpuInstanceGetComputeInstanceProfileInfo)   \
    X(nvmlGpuInstanceGetComputeInstanceProfileInfoV)  \
    X(nvmlDeviceGetGpuInstancePossiblePlacements_v2)  \
    X(nvmlDeviceGetGpuInstanceRemainingCapacity)      \
    X(nvmlDeviceCreateGpuInstanceWithPlacement)       \
    X(nvmlGpuInstanceCreateComputeInstance)           \
    X(nvmlComputeInstanceDestroy)                     \
    X(nvmlGpuInstanceDestroy)                         \
    X(nvmlDeviceGetGpuInstances)                      \
    X(nvmlGpuInstanceGetComputeInstances)

#define FAKE_FUNCS(X) FAKE_FUNCS_BASE(X) FAKE_FUNCS_NEWER(X)

enum fake_function_id {
#define FAKE_ENUM_ENTRY(name) FN_##name,
    FAKE_FUNCS(FAKE_ENUM_ENTRY)
#undef FAKE_ENUM_ENTRY
    FN__COUNT
};

static const char *const g_function_names[FN__COUNT] = {
#define FAKE_NAME_ENTRY(name) #name,
    FAKE_FUNCS(FAKE_NAME_ENTRY)
#undef FAKE_NAME_ENTRY
};

/* Lock-free so that counting never contends with a blocked wait or the control thread. */
static unsigned long long g_calls[FN__COUNT];
static unsigned long long g_dropped_events;

#define COUNT_CALL(name) __atomic_fetch_add(&g_calls[FN_##name], 1ULL, __ATOMIC_RELAXED)

static void reset_counters(void)
{
    int i;

    for (i = 0; i < FN__COUNT; i++)
        __atomic_store_n(&g_calls[i], 0ULL, __ATOMIC_RELAXED);
    __atomic_store_n(&g_dropped_events, 0ULL, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------------------------ */
/* State                                                                                 */
/* ------------------------------------------------------------------------------------ */

#define FAKE_MAX_GPUS 64
#define FAKE_MAX_LINKS 18 /* NVML_NVLINK_MAX_LINKS */
#define FAKE_MAX_SWITCHES 64
#define FAKE_QUEUE_CAPACITY 4096
#define FAKE_NO_NUMA (-1)
#define FAKE_DROPPED_EVENT (-2) /* queued event of a GPU removed since */
#define FAKE_DEVICE_MAGIC 0x4e564d4cu /* "NVML" */
#define FAKE_SET_MAGIC 0x45565453u    /* "EVTS" */
#define FAKE_UUID_SIZE 96
#define FAKE_NAME_SIZE 96
#define FAKE_VERSION_SIZE 80

enum fake_link_kind { LINK_UNUSED = 0, LINK_TO_GPU = 1, LINK_TO_SWITCH = 2 };

struct fake_link {
    int kind;
    unsigned int remote; /* GPU index or switch index */
};

struct fake_device {
    unsigned int magic;
    unsigned int index;
    char uuid[FAKE_UUID_SIZE];
    char name[FAKE_NAME_SIZE];
    unsigned int minor;
    nvmlPciInfo_t pci;
    unsigned long long memory_total;
    unsigned long long memory_used;
    int numa_node; /* FAKE_NO_NUMA: no affinity */
    unsigned long long supported_events;
    int lost;
    int compute_mode; /* nvmlComputeMode_t; the config's, or the last one set (g_modes) */
    struct fake_link links[FAKE_MAX_LINKS];
};

struct fake_event {
    int device; /* GPU index, -1 for "every GPU" (device handle NULL) */
    unsigned long long type;
    unsigned long long data;
    unsigned int gi, ci; /* MIG device named by the event; 0xFFFFFFFF: the whole GPU */
};

struct fake_event_set {
    unsigned int magic;
    struct fake_event_set *next;
    unsigned long long registered[FAKE_MAX_GPUS]; /* event types registered per GPU */
    unsigned long long registered_any;            /* union of the above */
    struct fake_event *ring;                      /* FAKE_QUEUE_CAPACITY entries */
    unsigned int head;
    unsigned int count;
    pthread_cond_t cond; /* signalled on a new event, on free and on shutdown */
    unsigned int waiters;
    int closing;
};

/* Serialises nvmlInit* and nvmlShutdown (taken before g_mu, never after). */
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;

/* Everything below is guarded by g_mu. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_idle_cond = PTHREAD_COND_INITIALIZER; /* a waiter left nvmlEventSetWait* */
static int g_live;
static char g_driver_version[FAKE_VERSION_SIZE];
static char g_nvml_version[FAKE_VERSION_SIZE];
static int g_cuda_driver_version;
static unsigned int g_gpu_count;
static unsigned int g_link_count;
static struct fake_device g_devs[FAKE_MAX_GPUS]; /* the live GPUs, by index */
static nvmlPciInfo_t g_switch_pci[FAKE_MAX_SWITCHES];
static unsigned char g_level[FAKE_MAX_GPUS][FAKE_MAX_GPUS];
static struct fake_event_set *g_sets;
static unsigned int g_total_waiters;

/* Node changes made through the FIFO (remove/add/unload/load). Guarded by g_mu; they
 * outlive nvmlShutdown (see the file comment). */
static char g_removed[FAKE_MAX_GPUS][FAKE_UUID_SIZE];
static unsigned int g_removed_count;
static int g_unloaded;                            /* every call: DRIVER_NOT_LOADED */
static int g_stale;                               /* session predates an unload: UNINITIALIZED */
static char g_loaded_version[FAKE_VERSION_SIZE];  /* after `load <v>`; "" = the config's */
/* Compute modes set since the driver loaded (nvmlDeviceSetComputeMode or the FIFO's
 * compute-mode), by UUID: like a real driver's, they outlive nvmlShutdown/nvmlInit and a GPU's
 * removal, and go with an unload (a loaded driver starts every GPU in its configured mode). */
static struct {
    char uuid[FAKE_UUID_SIZE];
    int mode;
} g_modes[FAKE_MAX_GPUS];
static unsigned int g_modes_count;
/* Every configured GPU (removed ones too), by configured index, copied at init. */
static struct fake_device g_conf[FAKE_MAX_GPUS];
static unsigned char g_conf_level[FAKE_MAX_GPUS][FAKE_MAX_GPUS];
static unsigned int g_conf_count;

/* Control thread (started and joined under g_init_mu). */
static int g_ctl_fd = -1;
static pthread_t g_ctl_thread;
static int g_ctl_running;
static int g_ctl_stop; /* atomic */

/* MIG (fake_mig.h, included at the end of this file). */
struct fake_mig_gpu;
static int is_mig_handle(nvmlDevice_t handle);
static int mig_answer(nvmlDevice_t handle, int what, char *buf, unsigned int length, nvmlMemory_t *memory,
                      nvmlReturn_t *result);
static nvmlReturn_t mig_load_gpu(const json_value *g, unsigned int index);
static void mig_commit_stage(void);
static void mig_state_refresh(void);
static void mig_command(const char *original, char *args);
static int conf_of(unsigned int live);
static int live_of(unsigned int conf);

/* Health states beyond XIDs (fake_health.h, included at the end of this file). */
static nvmlReturn_t health_load_gpu(const json_value *g, unsigned int index);
static void health_commit_stage(void);
static void health_command(const char *original, char *args);
static int health_link_down(const struct fake_device *d, unsigned int link);
static nvmlReturn_t health_nvlink_answer(const struct fake_device *d);

/* ------------------------------------------------------------------------------------ */
/* Small helpers                                                                         */
/* ------------------------------------------------------------------------------------ */

static const char *errno_text(int err, char *buf, size_t size)
{
    /* GNU strerror_r: returns a pointer that may or may not be buf. */
    return strerror_r(err, buf, size);
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    size_t need = strlen(src) + 1;

    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < need)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, need);
    return NVML_SUCCESS;
}

/* Takes g_mu; returns with it held only on success. */
static nvmlReturn_t enter(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_live && g_unloaded) {
        pthread_mutex_unlock(&g_mu);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (!g_live || g_stale) {
        pthread_mutex_unlock(&g_mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    mig_state_refresh();
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t result)
{
    pthread_mutex_unlock(&g_mu);
    return result;
}

/* GPU handles: one per configured GPU, so that a handle names the same GPU for as long as the
 * session lasts, as NVML's do, whatever is removed or added meanwhile (indices move; handles do
 * not). Nothing is read through a handle before it is found in this array, so foreign pointers are
 * safe. */
static struct fake_gpu_handle {
    unsigned int unused;
} g_gpu_handles[FAKE_MAX_GPUS];

/* The configured index a GPU handle names, or -1 for any other pointer. */
static int handle_conf(nvmlDevice_t handle)
{
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)&g_gpu_handles[0];

    if (p < base || (p - base) % sizeof g_gpu_handles[0] != 0 || (p - base) / sizeof g_gpu_handles[0] >= g_conf_count)
        return -1;
    return (int)((p - base) / sizeof g_gpu_handles[0]);
}

/* The handle of a live GPU (by its index now). Called with g_mu held. */
static nvmlDevice_t handle_of(unsigned int live)
{
    return (nvmlDevice_t)&g_gpu_handles[conf_of(live)];
}

/* A handle of a configured GPU that was removed since: NVML answers GPU_IS_LOST on it. */
static int is_stale_handle(nvmlDevice_t handle)
{
    int c = handle_conf(handle);

    return c >= 0 && live_of((unsigned int)c) < 0;
}

static struct fake_device *device_from_handle(nvmlDevice_t handle)
{
    int c = handle_conf(handle), live = c < 0 ? -1 : live_of((unsigned int)c);

    return live < 0 ? NULL : &g_devs[live];
}

/* Common prologue of per-device calls: initialised, valid handle, valid arguments,
 * GPU not lost (in that order). Returns with g_mu held only on success. */
static nvmlReturn_t enter_device(nvmlDevice_t handle, int arguments_ok, struct fake_device **out)
{
    nvmlReturn_t r = enter();
    struct fake_device *d;

    if (r != NVML_SUCCESS)
        return r;
    d = device_from_handle(handle);
    if (!d && arguments_ok && is_mig_handle(handle))
        return leave(NVML_ERROR_NOT_SUPPORTED); /* a whole-GPU call on a MIG device */
    if (!d && arguments_ok && is_stale_handle(handle))
        return leave(NVML_ERROR_GPU_IS_LOST); /* as NVML answers on the handle of a GPU removed since */
    if (!d || !arguments_ok)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (d->lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    *out = d;
    return NVML_SUCCESS;
}

/* Event sets are found by walking the live list, never by reading through the handle. */
static struct fake_event_set *set_from_handle(nvmlEventSet_t handle)
{
    struct fake_event_set *s;

    for (s = g_sets; s; s = s->next) {
        if (s == handle && !s->closing)
            return s;
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* Configuration                                                                         */
/* ------------------------------------------------------------------------------------ */

/* The configuration file (FAKE_NVML_CONFIG), one JSON object:
 *
 *   driverVersion   string, default "550.54.15"      nvmlSystemGetDriverVersion
 *   nvmlVersion     string, default "12." + driver    nvmlSystemGetNVMLVersion
 *   cudaDriverVersion integer, default 12040 (12.4)   nvmlSystemGetCudaDriverVersion(_v2)
 *   initError       integer, default 0                what the first nvmlInit returns (0: works)
 *   linkCount       integer 0..18, default 12         NVLink slots per GPU (0: no NVLink at all)
 *   gpus            array (required, at most 64), in index order, of objects:
 *     uuid          "GPU-..." (required, unique)
 *     name          string (required)
 *     busId         "DDDDDDDD:BB:DD.F" hex (required, unique; reported upper case)
 *     minor         integer, default the index (unique)
 *     memoryMiB     integer, default 16384; memoryUsedMiB integer, default 0
 *     numaNode      integer, or -1 / null / absent for none (nvmlDeviceGetNumaNodeId:
 *                   NOT_SUPPORTED; topology default NODE)
 *     events        subset of ["xid", "dbe", "sbe", "retirement", "retirement-failure",
 *                   "recovery-action"], default the first three; [] = none
 *     health        the health states beyond XIDs (fake_health.h)
 *     computeMode   0 DEFAULT (default), 2 PROHIBITED or 3 EXCLUSIVE_PROCESS: the mode the
 *                   driver starts the GPU in (1, EXCLUSIVE_THREAD, is gone from real drivers)
 *     pciDeviceId, pciSubSystemId   integer or "0x..." string; defaults by board name
 *                   (the CUDA compute capability also comes from the board name)
 *   nvlinks         [[gpuA, gpuB, count], ...]  count links between two GPUs
 *   nvswitches      [{ "busId": ..., "links": [[gpu, count], ...], "pciDeviceId"?: ... }, ...]
 *   pcie            [[gpuA, gpuB, level], ...] with level 0/10/20/30/40/50; pairs not listed
 *                   are NODE (40) on the same NUMA node or when either has none, else
 *                   SYSTEM (50)
 *
 * NVLink slots of a GPU are filled in order: nvlinks entries first, then switches; the
 * slots left up to linkCount are inactive. "description" and keys starting with '_' are
 * comments; any other unknown key, a wrong type, an index out of range, a duplicate UUID,
 * bus id or minor, or more links than linkCount makes init fail with UNKNOWN and one
 * stderr line naming the key (e.g. "gpus[3].busId").
 *
 * It is parsed into this staging area under g_init_mu, then copied into the live globals
 * under g_mu. */
static struct {
    char driver_version[FAKE_VERSION_SIZE];
    char nvml_version[FAKE_VERSION_SIZE];
    int cuda_driver_version;
    unsigned int init_error;
    unsigned int link_count;
    unsigned int gpu_count;
    unsigned int switch_count;
    struct fake_device gpus[FAKE_MAX_GPUS];
    nvmlPciInfo_t switches[FAKE_MAX_SWITCHES];
    unsigned char level[FAKE_MAX_GPUS][FAKE_MAX_GPUS];
    unsigned char level_given[FAKE_MAX_GPUS][FAKE_MAX_GPUS];
    unsigned int used_links[FAKE_MAX_GPUS];
} g_stage;

static const char *g_config_path; /* for messages, valid while loading */

static __attribute__((format(printf, 2, 3))) nvmlReturn_t config_error(const char *key, const char *fmt, ...)
{
    char message[512];
    char line[1024];
    va_list ap;
    size_t i;

    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "%s: %s", key, message);
    /* Keys and values come from the file: keep the report on one line. */
    for (i = 0; line[i]; i++) {
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7F)
            line[i] = '?';
    }
    fprintf(stderr, "fake-nvml: %s: %s\n", g_config_path ? g_config_path : "(config)", line);
    return NVML_ERROR_UNKNOWN;
}

/* Keys starting with '_' and "description" are comments and always allowed. */
static nvmlReturn_t check_keys(const json_value *object, const char *where, const char *const *allowed)
{
    size_t i;

    for (i = 0; i < object->count; i++) {
        const char *k = object->keys[i];
        const char *const *a;
        int ok = (k[0] == '_' || strcmp(k, "description") == 0);

        for (a = allowed; !ok && *a; a++)
            ok = strcmp(k, *a) == 0;
        if (!ok)
            return config_error(where, "unknown key \"%.80s\"", k);
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t get_integer(const json_value *v, const char *key, long long min, long long max, long long *out)
{
    if (v->type != JSON_NUMBER || !v->is_integer)
        return config_error(key, "expected an integer, got %s", v->type == JSON_NUMBER ? "a non-integer number" : json_type_name(v->type));
    if (v->integer < min || v->integer > max)
        return config_error(key, "%lld is out of range [%lld, %lld]", v->integer, min, max);
    *out = v->integer;
    return NVML_SUCCESS;
}

static nvmlReturn_t get_string(const json_value *v, const char *key, char *out, size_t size)
{
    if (v->type != JSON_STRING)
        return config_error(key, "expected a string, got %s", json_type_name(v->type));
    if (v->string[0] == '\0')
        return config_error(key, "must not be empty");
    if (strlen(v->string) >= size)
        return config_error(key, "longer than %zu characters", size - 1);
    memcpy(out, v->string, strlen(v->string) + 1);
    return NVML_SUCCESS;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A 32-bit id: an integer, or a string "0x" followed by 1 to 8 hex digits (JSON has no
 * hex literals, and PCI ids read best in hex). */
static nvmlReturn_t get_pci_id(const json_value *v, const char *key, unsigned int *out)
{
    long long n;
    nvmlReturn_t r;

    if (v->type == JSON_STRING) {
        const char *s = v->string;
        size_t len = strlen(s);
        unsigned int value = 0;
        size_t i;

        if (len < 3 || len > 10 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X'))
            return config_error(key, "expected an integer or a \"0x...\" hex string of at most 8 digits");
        for (i = 2; i < len; i++) {
            int h = hex_digit(s[i]);

            if (h < 0)
                return config_error(key, "expected an integer or a \"0x...\" hex string of at most 8 digits");
            value = (value << 4) | (unsigned int)h;
        }
        *out = value;
        return NVML_SUCCESS;
    }
    if ((r = get_integer(v, key, 0, 0xFFFFFFFFLL, &n)) != NVML_SUCCESS)
        return r;
    *out = (unsigned int)n;
    return NVML_SUCCESS;
}

static int parse_hex_field(const char *s, int digits, unsigned int *out)
{
    unsigned int v = 0;
    int i;

    for (i = 0; i < digits; i++) {
        int h = hex_digit(s[i]);

        if (h < 0)
            return -1;
        v = (v << 4) | (unsigned int)h;
    }
    *out = v;
    return 0;
}

/* Fills busId (normalised to upper case, 8-digit domain), busIdLegacy (4-digit domain),
 * domain, bus and device from a "DDDDDDDD:BB:DD.F" string. */
static nvmlReturn_t parse_bus_id(const json_value *v, const char *key, nvmlPciInfo_t *pci)
{
    const char *s;
    unsigned int domain, bus, device, function;

    if (v->type != JSON_STRING)
        return config_error(key, "expected a string, got %s", json_type_name(v->type));
    s = v->string;
    if (strlen(s) != 16 || s[8] != ':' || s[11] != ':' || s[14] != '.' || parse_hex_field(s, 8, &domain) < 0 ||
        parse_hex_field(s + 9, 2, &bus) < 0 || parse_hex_field(s + 12, 2, &device) < 0 ||
        parse_hex_field(s + 15, 1, &function) < 0)
        return config_error(key, "bad bus id \"%.40s\" (want DDDDDDDD:BB:DD.F, e.g. 00000000:07:00.0)", s);
    if (domain > 0xFFFF || device > 0x1F || function > 7)
        return config_error(key, "bad bus id \"%.40s\" (domain <= FFFF, device <= 1F, function <= 7)", s);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus, device, function);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus, device, function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    return NVML_SUCCESS;
}

/* Plausible PCI device ids (device << 16 | vendor 0x10DE) for the boards the fixtures use. */
static unsigned int default_pci_device_id(const char *name)
{
    static const struct {
        const char *fragment;
        unsigned int id;
    } table[] = {
        { "V100-SXM2-32GB", 0x1DB510DEu }, { "V100-SXM2-16GB", 0x1DB110DEu }, { "A100-SXM4-80GB", 0x20B210DEu },
        { "A100-SXM4-40GB", 0x20B010DEu }, { "H100 80GB HBM3", 0x233010DEu }, { "L40S", 0x26B910DEu },
        { "RTX A6000", 0x223010DEu },
    };
    size_t i;

    for (i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strstr(name, table[i].fragment))
            return table[i].id;
    }
    return 0x20B010DEu;
}

static nvmlReturn_t load_gpu(const json_value *g, unsigned int index)
{
    static const char *const allowed[] = { "uuid", "name", "minor", "busId", "memoryMiB", "memoryUsedMiB", "numaNode",
                                           "events", "pciDeviceId", "pciSubSystemId", "mig", "computeMode",
                                           "health", NULL };
    struct fake_device *d = &g_stage.gpus[index];
    char key[96];
    const json_value *v;
    long long n;
    nvmlReturn_t r;

    snprintf(key, sizeof key, "gpus[%u]", index);
    if (g->type != JSON_OBJECT)
        return config_error(key, "expected an object, got %s", json_type_name(g->type));
    if ((r = check_keys(g, key, allowed)) != NVML_SUCCESS)
        return r;
    memset(d, 0, sizeof *d);
    d->magic = FAKE_DEVICE_MAGIC;
    d->index = index;

    snprintf(key, sizeof key, "gpus[%u].uuid", index);
    if (!(v = json_object_get(g, "uuid")))
        return config_error(key, "missing");
    if ((r = get_string(v, key, d->uuid, sizeof d->uuid)) != NVML_SUCCESS)
        return r;
    if (strncmp(d->uuid, "GPU-", 4) != 0)
        return config_error(key, "\"%.60s\" does not start with \"GPU-\"", d->uuid);

    snprintf(key, sizeof key, "gpus[%u].name", index);
    if (!(v = json_object_get(g, "name")))
        return config_error(key, "missing");
    if ((r = get_string(v, key, d->name, sizeof d->name)) != NVML_SUCCESS)
        return r;

    snprintf(key, sizeof key, "gpus[%u].busId", index);
    if (!(v = json_object_get(g, "busId")))
        return config_error(key, "missing");
    if ((r = parse_bus_id(v, key, &d->pci)) != NVML_SUCCESS)
        return r;

    snprintf(key, sizeof key, "gpus[%u].minor", index);
    d->minor = index;
    if ((v = json_object_get(g, "minor"))) {
        if ((r = get_integer(v, key, 0, 255, &n)) != NVML_SUCCESS)
            return r;
        d->minor = (unsigned int)n;
    }

    snprintf(key, sizeof key, "gpus[%u].memoryMiB", index);
    d->memory_total = 16384ULL << 20;
    if ((v = json_object_get(g, "memoryMiB"))) {
        if ((r = get_integer(v, key, 1, 1LL << 30, &n)) != NVML_SUCCESS)
            return r;
        d->memory_total = (unsigned long long)n << 20;
    }
    snprintf(key, sizeof key, "gpus[%u].memoryUsedMiB", index);
    if ((v = json_object_get(g, "memoryUsedMiB"))) {
        if ((r = get_integer(v, key, 0, (long long)(d->memory_total >> 20), &n)) != NVML_SUCCESS)
            return r;
        d->memory_used = (unsigned long long)n << 20;
    }

    snprintf(key, sizeof key, "gpus[%u].numaNode", index);
    d->numa_node = FAKE_NO_NUMA;
    if ((v = json_object_get(g, "numaNode")) && v->type != JSON_NULL) {
        if ((r = get_integer(v, key, -1, 1023, &n)) != NVML_SUCCESS)
            return r;
        d->numa_node = (int)n;
    }

    snprintf(key, sizeof key, "gpus[%u].events", index);
    d->supported_events = FAKE_ALL_EVENTS;
    if ((v = json_object_get(g, "events"))) {
        size_t i;

        if (v->type != JSON_ARRAY)
            return config_error(key, "expected an array of \"xid\", \"dbe\", \"sbe\", got %s", json_type_name(v->type));
        d->supported_events = 0;
        for (i = 0; i < v->count; i++) {
            const json_value *e = v->items[i];

            snprintf(key, sizeof key, "gpus[%u].events[%zu]", index, i);
            if (e->type == JSON_STRING && strcmp(e->string, "xid") == 0)
                d->supported_events |= nvmlEventTypeXidCriticalError;
            else if (e->type == JSON_STRING && strcmp(e->string, "dbe") == 0)
                d->supported_events |= nvmlEventTypeDoubleBitEccError;
            else if (e->type == JSON_STRING && strcmp(e->string, "sbe") == 0)
                d->supported_events |= nvmlEventTypeSingleBitEccError;
            else if (e->type == JSON_STRING && strcmp(e->string, "retirement") == 0)
                d->supported_events |= nvmlEventTypeDramRetirementEvent;
            else if (e->type == JSON_STRING && strcmp(e->string, "retirement-failure") == 0)
                d->supported_events |= nvmlEventTypeDramRetirementFailure;
            else if (e->type == JSON_STRING && strcmp(e->string, "recovery-action") == 0)
                d->supported_events |= nvmlEventTypeGpuRecoveryAction;
            else
                return config_error(key, "expected \"xid\", \"dbe\", \"sbe\", \"retirement\", \"retirement-failure\" "
                                         "or \"recovery-action\"");
        }
    }

    snprintf(key, sizeof key, "gpus[%u].computeMode", index);
    d->compute_mode = NVML_COMPUTEMODE_DEFAULT;
    if ((v = json_object_get(g, "computeMode"))) {
        if ((r = get_integer(v, key, 0, 3, &n)) != NVML_SUCCESS)
            return r;
        if (n == NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
            return config_error(key, "1 (EXCLUSIVE_THREAD) is no longer supported by NVIDIA drivers; use 0, 2 or 3");
        d->compute_mode = (int)n;
    }

    snprintf(key, sizeof key, "gpus[%u].pciDeviceId", index);
    d->pci.pciDeviceId = default_pci_device_id(d->name);
    if ((v = json_object_get(g, "pciDeviceId")) && (r = get_pci_id(v, key, &d->pci.pciDeviceId)) != NVML_SUCCESS)
        return r;
    snprintf(key, sizeof key, "gpus[%u].pciSubSystemId", index);
    d->pci.pciSubSystemId = 0x147F10DEu;
    if ((v = json_object_get(g, "pciSubSystemId")) && (r = get_pci_id(v, key, &d->pci.pciSubSystemId)) != NVML_SUCCESS)
        return r;
    if ((r = mig_load_gpu(g, index)) != NVML_SUCCESS)
        return r;
    return health_load_gpu(g, index);
}

/* Reads an array of integer tuples: the value at key must be an array of arrays of
 * exactly `width` integers. */
static nvmlReturn_t get_tuple(const json_value *v, const char *key, size_t width, long long *out)
{
    size_t i;

    if (v->type != JSON_ARRAY || v->count != width)
        return config_error(key, "expected an array of %zu integers", width);
    for (i = 0; i < width; i++) {
        const json_value *e = v->items[i];

        if (e->type != JSON_NUMBER || !e->is_integer)
            return config_error(key, "expected an array of %zu integers", width);
        out[i] = e->integer;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t add_links(const char *key, unsigned int gpu, unsigned int count, int kind, unsigned int remote)
{
    unsigned int i;

    if (g_stage.used_links[gpu] + count > g_stage.link_count)
        return config_error(key, "GPU %u would have %u NVLinks, more than linkCount (%u)", gpu,
                            g_stage.used_links[gpu] + count, g_stage.link_count);
    for (i = 0; i < count; i++) {
        struct fake_link *l = &g_stage.gpus[gpu].links[g_stage.used_links[gpu]++];

        l->kind = kind;
        l->remote = remote;
    }
    return NVML_SUCCESS;
}

static int same_bus(const nvmlPciInfo_t *a, const nvmlPciInfo_t *b)
{
    return strcmp(a->busId, b->busId) == 0;
}

static nvmlReturn_t load_config_tree(const json_value *root)
{
    static const char *const allowed[] = { "driverVersion", "nvmlVersion", "cudaDriverVersion", "initError", "linkCount",
                                           "gpus", "nvlinks", "nvswitches", "pcie", NULL };
    const json_value *v;
    char key[96];
    long long n;
    nvmlReturn_t r;
    size_t i, j;

    if (root->type != JSON_OBJECT)
        return config_error("(top level)", "expected an object, got %s", json_type_name(root->type));
    if ((r = check_keys(root, "(top level)", allowed)) != NVML_SUCCESS)
        return r;

    strcpy(g_stage.driver_version, "550.54.15");
    if ((v = json_object_get(root, "driverVersion")) &&
        (r = get_string(v, "driverVersion", g_stage.driver_version, sizeof g_stage.driver_version)) != NVML_SUCCESS)
        return r;
    if ((v = json_object_get(root, "nvmlVersion"))) {
        if ((r = get_string(v, "nvmlVersion", g_stage.nvml_version, sizeof g_stage.nvml_version)) != NVML_SUCCESS)
            return r;
    } else {
        /* Like the real one: the CUDA major version in front of the driver version. */
        snprintf(g_stage.nvml_version, sizeof g_stage.nvml_version, "12.%.70s", g_stage.driver_version);
    }

    g_stage.cuda_driver_version = 12040;
    if ((v = json_object_get(root, "cudaDriverVersion"))) {
        if ((r = get_integer(v, "cudaDriverVersion", 1000, 999990, &n)) != NVML_SUCCESS)
            return r;
        g_stage.cuda_driver_version = (int)n;
    }

    g_stage.init_error = 0;
    if ((v = json_object_get(root, "initError"))) {
        if ((r = get_integer(v, "initError", 0, 999, &n)) != NVML_SUCCESS)
            return r;
        g_stage.init_error = (unsigned int)n;
    }

    g_stage.link_count = 12;
    if ((v = json_object_get(root, "linkCount"))) {
        if ((r = get_integer(v, "linkCount", 0, FAKE_MAX_LINKS, &n)) != NVML_SUCCESS)
            return r;
        g_stage.link_count = (unsigned int)n;
    }

    if (!(v = json_object_get(root, "gpus")))
        return config_error("gpus", "missing");
    if (v->type != JSON_ARRAY)
        return config_error("gpus", "expected an array, got %s", json_type_name(v->type));
    if (v->count > FAKE_MAX_GPUS)
        return config_error("gpus", "%zu GPUs, at most %d supported", v->count, FAKE_MAX_GPUS);
    g_stage.gpu_count = (unsigned int)v->count;
    for (i = 0; i < v->count; i++) {
        if ((r = load_gpu(v->items[i], (unsigned int)i)) != NVML_SUCCESS)
            return r;
        g_stage.used_links[i] = 0;
    }
    for (i = 0; i < g_stage.gpu_count; i++) {
        for (j = 0; j < i; j++) {
            const struct fake_device *a = &g_stage.gpus[j], *b = &g_stage.gpus[i];

            if (strcmp(a->uuid, b->uuid) == 0) {
                snprintf(key, sizeof key, "gpus[%zu].uuid", i);
                return config_error(key, "duplicate UUID \"%.60s\" (also gpus[%zu])", b->uuid, j);
            }
            if (same_bus(&a->pci, &b->pci)) {
                snprintf(key, sizeof key, "gpus[%zu].busId", i);
                return config_error(key, "duplicate bus id \"%s\" (also gpus[%zu])", b->pci.busId, j);
            }
            if (a->minor == b->minor) {
                snprintf(key, sizeof key, "gpus[%zu].minor", i);
                return config_error(key, "duplicate minor number %u (also gpus[%zu])", b->minor, j);
            }
        }
    }

    /* Default PCIe relation: NODE on the same NUMA node (or when either has none), else SYSTEM. */
    memset(g_stage.level_given, 0, sizeof g_stage.level_given);
    for (i = 0; i < g_stage.gpu_count; i++) {
        for (j = 0; j < g_stage.gpu_count; j++) {
            int na = g_stage.gpus[i].numa_node, nb = g_stage.gpus[j].numa_node;

            g_stage.level[i][j] = (na == FAKE_NO_NUMA || nb == FAKE_NO_NUMA || na == nb) ? NVML_TOPOLOGY_NODE
                                                                                           : NVML_TOPOLOGY_SYSTEM;
        }
    }
    if ((v = json_object_get(root, "pcie"))) {
        if (v->type != JSON_ARRAY)
            return config_error("pcie", "expected an array of [gpuA, gpuB, level], got %s", json_type_name(v->type));
        for (i = 0; i < v->count; i++) {
            long long t[3];

            snprintf(key, sizeof key, "pcie[%zu]", i);
            if ((r = get_tuple(v->items[i], key, 3, t)) != NVML_SUCCESS)
                return r;
            if (t[0] < 0 || t[0] >= g_stage.gpu_count || t[1] < 0 || t[1] >= g_stage.gpu_count)
                return config_error(key, "GPU index out of range (%u GPUs)", g_stage.gpu_count);
            if (t[0] == t[1])
                return config_error(key, "a GPU paired with itself");
            if (t[2] != NVML_TOPOLOGY_INTERNAL && t[2] != NVML_TOPOLOGY_SINGLE && t[2] != NVML_TOPOLOGY_MULTIPLE &&
                t[2] != NVML_TOPOLOGY_HOSTBRIDGE && t[2] != NVML_TOPOLOGY_NODE && t[2] != NVML_TOPOLOGY_SYSTEM)
                return config_error(key, "level %lld is not one of 0, 10, 20, 30, 40, 50", t[2]);
            if (g_stage.level_given[t[0]][t[1]])
                return config_error(key, "pair (%lld, %lld) given twice", t[0], t[1]);
            g_stage.level_given[t[0]][t[1]] = g_stage.level_given[t[1]][t[0]] = 1;
            g_stage.level[t[0]][t[1]] = g_stage.level[t[1]][t[0]] = (unsigned char)t[2];
        }
    }

    /* NVLinks: GPU-GPU entries first, then switches, each filling slots in order. */
    if ((v = json_object_get(root, "nvlinks"))) {
        if (v->type != JSON_ARRAY)
            return config_error("nvlinks", "expected an array of [gpuA, gpuB, count], got %s",
                                json_type_name(v->type));
        for (i = 0; i < v->count; i++) {
            long long t[3];

            snprintf(key, sizeof key, "nvlinks[%zu]", i);
            if ((r = get_tuple(v->items[i], key, 3, t)) != NVML_SUCCESS)
                return r;
            if (t[0] < 0 || t[0] >= g_stage.gpu_count || t[1] < 0 || t[1] >= g_stage.gpu_count)
                return config_error(key, "GPU index out of range (%u GPUs)", g_stage.gpu_count);
            if (t[0] == t[1])
                return config_error(key, "a GPU linked to itself");
            if (t[2] < 1 || t[2] > FAKE_MAX_LINKS)
                return config_error(key, "link count %lld out of range [1, %d]", t[2], FAKE_MAX_LINKS);
            if ((r = add_links(key, (unsigned int)t[0], (unsigned int)t[2], LINK_TO_GPU, (unsigned int)t[1])) !=
                    NVML_SUCCESS ||
                (r = add_links(key, (unsigned int)t[1], (unsigned int)t[2], LINK_TO_GPU, (unsigned int)t[0])) !=
                    NVML_SUCCESS)
                return r;
        }
    }
    g_stage.switch_count = 0;
    if ((v = json_object_get(root, "nvswitches"))) {
        static const char *const switch_keys[] = { "busId", "links", "pciDeviceId", NULL };

        if (v->type != JSON_ARRAY)
            return config_error("nvswitches", "expected an array of objects, got %s", json_type_name(v->type));
        if (v->count > FAKE_MAX_SWITCHES)
            return config_error("nvswitches", "%zu switches, at most %d supported", v->count, FAKE_MAX_SWITCHES);
        for (i = 0; i < v->count; i++) {
            const json_value *s = v->items[i], *links;
            nvmlPciInfo_t *pci = &g_stage.switches[i];
            size_t k;

            snprintf(key, sizeof key, "nvswitches[%zu]", i);
            if (s->type != JSON_OBJECT)
                return config_error(key, "expected an object, got %s", json_type_name(s->type));
            if ((r = check_keys(s, key, switch_keys)) != NVML_SUCCESS)
                return r;
            memset(pci, 0, sizeof *pci);
            snprintf(key, sizeof key, "nvswitches[%zu].busId", i);
            if (!json_object_get(s, "busId"))
                return config_error(key, "missing");
            if ((r = parse_bus_id(json_object_get(s, "busId"), key, pci)) != NVML_SUCCESS)
                return r;
            for (k = 0; k < g_stage.gpu_count; k++) {
                if (same_bus(pci, &g_stage.gpus[k].pci))
                    return config_error(key, "duplicate bus id \"%s\" (also gpus[%zu])", pci->busId, k);
            }
            for (k = 0; k < i; k++) {
                if (same_bus(pci, &g_stage.switches[k]))
                    return config_error(key, "duplicate bus id \"%s\" (also nvswitches[%zu])", pci->busId, k);
            }
            pci->pciDeviceId = 0x1AF110DEu; /* NVSwitch */
            pci->pciSubSystemId = 0x000010DEu;
            snprintf(key, sizeof key, "nvswitches[%zu].pciDeviceId", i);
            if (json_object_get(s, "pciDeviceId") &&
                (r = get_pci_id(json_object_get(s, "pciDeviceId"), key, &pci->pciDeviceId)) != NVML_SUCCESS)
                return r;
            snprintf(key, sizeof key, "nvswitches[%zu].links", i);
            links = json_object_get(s, "links");
            if (!links)
                return config_error(key, "missing");
            if (links->type != JSON_ARRAY)
                return config_error(key, "expected an array of [gpu, count], got %s", json_type_name(links->type));
            for (k = 0; k < links->count; k++) {
                long long t[2];

                snprintf(key, sizeof key, "nvswitches[%zu].links[%zu]", i, k);
                if ((r = get_tuple(links->items[k], key, 2, t)) != NVML_SUCCESS)
                    return r;
                if (t[0] < 0 || t[0] >= g_stage.gpu_count)
                    return config_error(key, "GPU index out of range (%u GPUs)", g_stage.gpu_count);
                if (t[1] < 1 || t[1] > FAKE_MAX_LINKS)
                    return config_error(key, "link count %lld out of range [1, %d]", t[1], FAKE_MAX_LINKS);
                if ((r = add_links(key, (unsigned int)t[0], (unsigned int)t[1], LINK_TO_SWITCH, (unsigned int)i)) !=
                    NVML_SUCCESS)
                    return r;
            }
        }
        g_stage.switch_count = (unsigned int)v->count;
    }
    return NVML_SUCCESS;
}

/* Reads and checks FAKE_NVML_CONFIG into g_stage. */
static nvmlReturn_t load_config(void)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    char error[256];
    char ebuf[128];
    FILE *f;
    char *text = NULL;
    size_t len = 0, cap = 0;
    json_value *root;
    nvmlReturn_t r;

    memset(&g_stage, 0, sizeof g_stage);
    if (!path || !path[0])
        return NVML_ERROR_DRIVER_NOT_LOADED; /* no "driver" at all */
    g_config_path = path;
    f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fake-nvml: %s: cannot read FAKE_NVML_CONFIG: %s\n", path,
                errno_text(errno, ebuf, sizeof ebuf));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    for (;;) {
        size_t got;

        if (len == cap) {
            char *grown;

            cap = cap ? cap * 2 : 65536;
            if (cap > (64u << 20)) {
                fclose(f);
                free(text);
                return config_error("(file)", "larger than 64 MiB");
            }
            grown = realloc(text, cap);
            if (!grown) {
                fclose(f);
                free(text);
                return config_error("(file)", "out of memory");
            }
            text = grown;
        }
        got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        int err = errno;

        fclose(f);
        free(text);
        fprintf(stderr, "fake-nvml: %s: cannot read FAKE_NVML_CONFIG: %s\n", path, errno_text(err, ebuf, sizeof ebuf));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    fclose(f);
    root = json_parse(text ? text : "", len, error, sizeof error);
    free(text);
    if (!root)
        return config_error("(file)", "%s", error);
    r = load_config_tree(root);
    json_free(root);
    return r;
}

/* ------------------------------------------------------------------------------------ */
/* Events                                                                                */
/* ------------------------------------------------------------------------------------ */

/* Queues an event on every set that registered `type` for that GPU (device -1: for any
 * GPU). Full queues drop their oldest event. Called with g_mu held. */
static void post_event_mig(int device, unsigned long long type, unsigned long long data, unsigned int gi,
                           unsigned int ci)
{
    struct fake_event_set *s;

    for (s = g_sets; s; s = s->next) {
        unsigned long long mask = device < 0 ? s->registered_any : s->registered[device];

        if (s->closing || !(mask & type))
            continue;
        if (s->count == FAKE_QUEUE_CAPACITY) {
            s->head = (s->head + 1) % FAKE_QUEUE_CAPACITY;
            s->count--;
            __atomic_fetch_add(&g_dropped_events, 1ULL, __ATOMIC_RELAXED);
        }
        s->ring[(s->head + s->count) % FAKE_QUEUE_CAPACITY] = (struct fake_event){ device, type, data, gi, ci };
        s->count++;
        pthread_cond_broadcast(&s->cond);
    }
}


static void add_ms(struct timespec *ts, unsigned int ms)
{
    ts->tv_sec += (time_t)(ms / 1000u);
    ts->tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Blocks until the set has an event or timeoutms passed. v2 fills the whole struct;
 * the v1 entry point writes only device, eventType and eventData, as the pre-MIG
 * library did (its nvmlEventData_t ended there), and leaves the rest of the caller's
 * struct untouched.
 * A set freed by another thread while this one waits: INVALID_ARGUMENT. nvmlShutdown
 * while waiting: UNINITIALIZED (the real library leaves this undefined; the fake wakes
 * the waiter so that shutdown can complete). */
static nvmlReturn_t event_wait(nvmlEventSet_t handle, nvmlEventData_t *data, unsigned int timeoutms, int v2)
{
    struct fake_event_set *s;
    struct timespec deadline;
    nvmlReturn_t r;

    if ((r = enter()) != NVML_SUCCESS)
        return r;
    s = set_from_handle(handle);
    if (!s || !data)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    add_ms(&deadline, timeoutms);
    s->waiters++;
    g_total_waiters++;
    for (;;) {
        int rc;

        /* Events for a GPU removed since they were queued are dropped. */
        while (s->count > 0 && s->ring[s->head].device == FAKE_DROPPED_EVENT) {
            s->head = (s->head + 1) % FAKE_QUEUE_CAPACITY;
            s->count--;
        }
        if (!g_live || g_unloaded || g_stale || s->closing || s->count > 0)
            break;
        rc = pthread_cond_timedwait(&s->cond, &g_mu, &deadline);
        if (rc == ETIMEDOUT) {
            while (s->count > 0 && s->ring[s->head].device == FAKE_DROPPED_EVENT) {
                s->head = (s->head + 1) % FAKE_QUEUE_CAPACITY;
                s->count--;
            }
            break;
        }
    }
    if (g_live && g_unloaded) {
        r = NVML_ERROR_DRIVER_NOT_LOADED;
    } else if (!g_live || g_stale) {
        r = NVML_ERROR_UNINITIALIZED;
    } else if (s->closing) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else if (s->count > 0) {
        struct fake_event e = s->ring[s->head];

        s->head = (s->head + 1) % FAKE_QUEUE_CAPACITY;
        s->count--;
        data->device = e.device < 0 ? NULL : handle_of((unsigned int)e.device);
        data->eventType = e.type;
        data->eventData = e.data;
        if (v2) {
            data->gpuInstanceId = e.gi;
            data->computeInstanceId = e.ci;
        }
        r = NVML_SUCCESS;
    } else {
        r = NVML_ERROR_TIMEOUT;
    }
    s->waiters--;
    g_total_waiters--;
    pthread_cond_broadcast(&g_idle_cond);
    return leave(r);
}

/* Frees a set once no thread waits on it any more. Called with g_mu held. The set
 * leaves the live list first, so no other thread (nvmlShutdown, a second
 * nvmlEventSetFree) can find it while this one waits for its waiters to go. */
static void destroy_set_locked(struct fake_event_set *s)
{
    struct fake_event_set **pp;

    for (pp = &g_sets; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    s->next = NULL;
    s->closing = 1;
    pthread_cond_broadcast(&s->cond);
    while (s->waiters > 0)
        pthread_cond_wait(&g_idle_cond, &g_mu);
    pthread_cond_destroy(&s->cond);
    s->magic = 0;
    free(s->ring);
    free(s);
}

/* ------------------------------------------------------------------------------------ */
/* Control FIFO                                                                          */
/* ------------------------------------------------------------------------------------ */

static void control_complain(const char *line, const char *why)
{
    char shown[160];
    size_t i;

    for (i = 0; line[i] && i < sizeof shown - 1; i++)
        shown[i] = (line[i] >= 0x20 && line[i] < 0x7F) ? line[i] : '?';
    shown[i] = '\0';
    fprintf(stderr, "fake-nvml: control: %s: \"%s\"\n", why, shown);
}

/* Decimal (or 0x-prefixed hex) unsigned 64-bit number, the whole token. */
static int parse_u64(const char *s, unsigned long long *out)
{
    unsigned long long v = 0;
    int base = 10;

    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (!*s)
        return -1;
    for (; *s; s++) {
        int d = base == 16 ? hex_digit(*s) : (*s >= '0' && *s <= '9' ? *s - '0' : -1);

        if (d < 0)
            return -1;
        if (v > (ULLONG_MAX - (unsigned long long)d) / (unsigned long long)base)
            return -1;
        v = v * (unsigned long long)base + (unsigned long long)d;
    }
    *out = v;
    return 0;
}

static void write_stats(const char *line, const char *path)
{
    static unsigned int sequence;
    unsigned long long counts[FN__COUNT], total = 0, dropped;
    char tmp[PATH_MAX + 64];
    char ebuf[128];
    FILE *f;
    int i, failed;

    for (i = 0; i < FN__COUNT; i++) {
        counts[i] = __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
        total += counts[i];
    }
    dropped = __atomic_load_n(&g_dropped_events, __ATOMIC_RELAXED);
    if (strlen(path) >= PATH_MAX) {
        control_complain(line, "stats path too long");
        return;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), sequence++);
    f = fopen(tmp, "w");
    if (!f) {
        char why[256];

        snprintf(why, sizeof why, "cannot write stats: %s", errno_text(errno, ebuf, sizeof ebuf));
        control_complain(line, why);
        return;
    }
    fprintf(f, "{\"total\": %llu, \"calls\": {", total);
    for (i = 0; i < FN__COUNT; i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", g_function_names[i], counts[i]);
    fprintf(f, "}, \"droppedEvents\": %llu, \"computeModes\": {", dropped);
    pthread_mutex_lock(&g_mu);
    if (g_live && !g_stale && !g_unloaded) {
        unsigned int g;

        for (g = 0; g < g_gpu_count; g++)
            fprintf(f, "%s\"%s\": %d", g ? ", " : "", g_devs[g].uuid, g_devs[g].compute_mode);
    }
    pthread_mutex_unlock(&g_mu);
    fprintf(f, "}}\n");
    failed = ferror(f);
    failed |= fclose(f) != 0;
    if (failed || rename(tmp, path) != 0) {
        char why[256];

        snprintf(why, sizeof why, "cannot write stats: %s", errno_text(errno, ebuf, sizeof ebuf));
        control_complain(line, why);
        unlink(tmp);
    }
}


/* ------------------------------------------------------------------------------------ */
/* Node changes: GPUs removed and added, the driver unloaded and loaded                   */
/* ------------------------------------------------------------------------------------ */

static int node_changed_locked(void)
{
    return g_unloaded || g_removed_count > 0;
}

static int removed_index_locked(const char *uuid)
{
    unsigned int i;

    for (i = 0; i < g_removed_count; i++)
        if (strcmp(g_removed[i], uuid) == 0)
            return (int)i;
    return -1;
}

/* The compute mode last set on the GPU with this UUID since the driver loaded, else dflt.
 * Called with g_mu held. */
static int remembered_mode_locked(const char *uuid, int dflt)
{
    unsigned int i;

    for (i = 0; i < g_modes_count; i++)
        if (strcmp(g_modes[i].uuid, uuid) == 0)
            return g_modes[i].mode;
    return dflt;
}

/* Sets a live GPU's compute mode and remembers it (see g_modes). Called with g_mu held. */
static void set_mode_locked(struct fake_device *d, int mode)
{
    unsigned int i;

    d->compute_mode = mode;
    for (i = 0; i < g_modes_count; i++) {
        if (strcmp(g_modes[i].uuid, d->uuid) == 0) {
            g_modes[i].mode = mode;
            return;
        }
    }
    if (g_modes_count < FAKE_MAX_GPUS) { /* one entry per configured GPU at most */
        snprintf(g_modes[g_modes_count].uuid, FAKE_UUID_SIZE, "%s", d->uuid);
        g_modes[g_modes_count++].mode = mode;
    }
}

/* Rebuilds the live GPUs from the configured ones minus the removed ones: indices, handles,
 * topology levels and NVLink peers follow the new order (links to a removed GPU go
 * inactive); a GPU still present keeps its lost flag; event registrations and queued events
 * move with their GPU (those of a removed GPU are dropped). Called with g_mu held. */
static void publish_devices_locked(void)
{
    static struct fake_device old[FAKE_MAX_GPUS];
    int conf_to_new[FAKE_MAX_GPUS], old_to_new[FAKE_MAX_GPUS];
    unsigned int old_count = g_gpu_count, count = 0, i, j, k;
    struct fake_event_set *set;

    memcpy(old, g_devs, sizeof old[0] * old_count);
    for (i = 0; i < g_conf_count; i++)
        conf_to_new[i] = removed_index_locked(g_conf[i].uuid) < 0 ? (int)count++ : -1;
    memset(g_devs, 0, sizeof g_devs);
    for (i = 0; i < g_conf_count; i++) {
        struct fake_device *d;

        if (conf_to_new[i] < 0)
            continue;
        d = &g_devs[conf_to_new[i]];
        *d = g_conf[i];
        d->index = (unsigned int)conf_to_new[i];
        d->compute_mode = remembered_mode_locked(d->uuid, d->compute_mode);
        for (k = 0; k < FAKE_MAX_LINKS; k++) {
            if (d->links[k].kind != LINK_TO_GPU)
                continue;
            if (conf_to_new[d->links[k].remote] < 0)
                d->links[k].kind = LINK_UNUSED;
            else
                d->links[k].remote = (unsigned int)conf_to_new[d->links[k].remote];
        }
        for (j = 0; j < old_count; j++)
            if (strcmp(old[j].uuid, d->uuid) == 0)
                d->lost = old[j].lost;
        for (j = 0; j < g_conf_count; j++)
            if (conf_to_new[j] >= 0)
                g_level[conf_to_new[i]][conf_to_new[j]] = g_conf_level[i][j];
    }
    for (j = 0; j < old_count; j++) {
        old_to_new[j] = -1;
        for (i = 0; i < g_conf_count; i++)
            if (conf_to_new[i] >= 0 && strcmp(g_conf[i].uuid, old[j].uuid) == 0)
                old_to_new[j] = conf_to_new[i];
    }
    for (set = g_sets; set; set = set->next) {
        unsigned long long registered[FAKE_MAX_GPUS] = { 0 };

        set->registered_any = 0;
        for (j = 0; j < old_count; j++) {
            if (old_to_new[j] >= 0) {
                registered[old_to_new[j]] = set->registered[j];
                set->registered_any |= set->registered[j];
            }
        }
        memcpy(set->registered, registered, sizeof registered);
        for (k = 0; k < set->count; k++) {
            struct fake_event *e = &set->ring[(set->head + k) % FAKE_QUEUE_CAPACITY];

            if (e->device >= 0)
                e->device = (unsigned int)e->device < old_count && old_to_new[e->device] >= 0 ? old_to_new[e->device] : FAKE_DROPPED_EVENT;
        }
    }
    g_gpu_count = count;
}

/* Wakes every thread blocked in an event wait (it re-checks the state). Called with g_mu held. */
static void wake_waiters_locked(void)
{
    struct fake_event_set *set;

    for (set = g_sets; set; set = set->next)
        pthread_cond_broadcast(&set->cond);
}

/* GPU index token; "all" gives -1 when allowed. Call with g_mu held. */
static int parse_gpu_token(const char *line, const char *token, int allow_all, int *out)
{
    unsigned long long v;

    if (!token) {
        control_complain(line, "missing GPU index");
        return -1;
    }
    if (allow_all && strcmp(token, "all") == 0) {
        *out = -1;
        return 0;
    }
    if (parse_u64(token, &v) < 0) {
        control_complain(line, allow_all ? "GPU index must be a number or \"all\"" : "GPU index must be a number");
        return -1;
    }
    if (v >= g_gpu_count) {
        control_complain(line, "GPU index out of range");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* FIFO commands. Each handler gets the tokens (tok[0] is the command) and runs with g_mu
 * held, except CMD_UNLOCKED ones; CMD_LIVE ones are skipped while NVML is not initialised
 * (they act on the session's GPUs), CMD_NODE ones act on the node whatever the session. */
enum command_scope { CMD_UNLOCKED, CMD_LIVE, CMD_NODE };

struct control_command {
    const char *name;
    int min_args, max_args; /* after the name */
    enum command_scope scope;
    const char *usage;
    void (*run)(const char *line, char **tok, int ntok);
};

static void cmd_event(const char *line, char **tok, int ntok)
{
    unsigned long long value = 0;
    unsigned long long type = tok[0][0] == 'x' ? nvmlEventTypeXidCriticalError
                              : tok[0][0] == 'd' ? nvmlEventTypeDoubleBitEccError : nvmlEventTypeSingleBitEccError;
    int gpu;

    if (parse_gpu_token(line, tok[1], 1, &gpu) < 0)
        return;
    unsigned long long gi = 0xFFFFFFFFu, ci = 0xFFFFFFFFu;

    if (ntok >= 3 && parse_u64(tok[2], &value) < 0) {
        control_complain(line, "XID must be a number");
        return;
    }
    if (ntok == 4) {
        control_complain(line, "usage: xid <index|all> <n> [<gi> <ci>]");
        return;
    }
    if (ntok == 5 && (parse_u64(tok[3], &gi) < 0 || parse_u64(tok[4], &ci) < 0 || gi > 0xFFFFFFFFu || ci > 0xFFFFFFFFu)) {
        control_complain(line, "GPU and compute instance ids must be numbers below 2^32");
        return;
    }
    post_event_mig(gpu, type, value, (unsigned int)gi, (unsigned int)ci);
}

static void cmd_lost(const char *line, char **tok, int ntok)
{
    int gpu;

    (void)ntok;
    if (parse_gpu_token(line, tok[1], 0, &gpu) == 0)
        g_devs[gpu].lost = tok[0][0] == 'l';
}

/* compute-mode <index> <0|2|3>: an administrator's `nvidia-smi -i <index> -c <mode>`. */
static void cmd_compute_mode(const char *line, char **tok, int ntok)
{
    unsigned long long mode;
    int gpu;

    (void)ntok;
    if (parse_gpu_token(line, tok[1], 0, &gpu) < 0)
        return;
    if (parse_u64(tok[2], &mode) < 0 || mode >= NVML_COMPUTEMODE_COUNT || mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD) {
        control_complain(line, "compute mode must be 0 (DEFAULT), 2 (PROHIBITED) or 3 (EXCLUSIVE_PROCESS)");
        return;
    }
    set_mode_locked(&g_devs[gpu], (int)mode);
}

static void cmd_reset_stats(const char *line, char **tok, int ntok)
{
    (void)line, (void)tok, (void)ntok;
    reset_counters();
}

static void cmd_remove(const char *line, char **tok, int ntok)
{
    int gpu;

    (void)ntok;
    if (g_unloaded || g_stale) {
        control_complain(line, "the driver is not loaded; load it first");
        return;
    }
    if (parse_gpu_token(line, tok[1], 0, &gpu) < 0)
        return;
    if (g_removed_count == FAKE_MAX_GPUS) {
        control_complain(line, "too many GPUs removed");
        return;
    }
    snprintf(g_removed[g_removed_count++], FAKE_UUID_SIZE, "%s", g_devs[gpu].uuid);
    publish_devices_locked();
}

static void cmd_add(const char *line, char **tok, int ntok)
{
    int at;

    (void)ntok;
    if (strcmp(tok[1], "all") == 0) {
        g_removed_count = 0;
    } else if ((at = removed_index_locked(tok[1])) < 0) {
        control_complain(line, "not the UUID of a removed GPU");
        return;
    } else {
        memmove(g_removed[at], g_removed[at + 1], (g_removed_count - (unsigned int)at - 1) * sizeof g_removed[0]);
        g_removed_count--;
    }
    if (g_live && !g_stale && !g_unloaded)
        publish_devices_locked();
}

static void cmd_unload(const char *line, char **tok, int ntok)
{
    (void)line, (void)tok, (void)ntok;
    g_unloaded = 1;
    g_modes_count = 0; /* a driver loaded again starts every GPU in its configured mode */
    if (g_live)
        g_stale = 1;
    wake_waiters_locked();
}

static void cmd_load(const char *line, char **tok, int ntok)
{
    if (!g_unloaded) {
        control_complain(line, "the driver is loaded; unload it first");
        return;
    }
    if (ntok == 2 && strlen(tok[1]) >= FAKE_VERSION_SIZE) {
        control_complain(line, "version too long");
        return;
    }
    g_unloaded = 0;
    snprintf(g_loaded_version, sizeof g_loaded_version, "%s", ntok == 2 ? tok[1] : "");
}

static const struct control_command g_commands[] = {
    { "xid", 2, 4, CMD_LIVE, "usage: xid <index|all> <n> [<gi> <ci>]", cmd_event },
    { "dbe", 1, 1, CMD_LIVE, "usage: dbe <index|all>", cmd_event },
    { "sbe", 1, 1, CMD_LIVE, "usage: sbe <index|all>", cmd_event },
    { "lost", 1, 1, CMD_LIVE, "usage: lost <index>", cmd_lost },
    { "back", 1, 1, CMD_LIVE, "usage: back <index>", cmd_lost },
    { "compute-mode", 2, 2, CMD_LIVE, "usage: compute-mode <index> <0|2|3>", cmd_compute_mode },
    { "reset-stats", 0, 0, CMD_UNLOCKED, "reset-stats takes no argument", cmd_reset_stats },
    { "remove", 1, 1, CMD_LIVE, "usage: remove <index>", cmd_remove },
    { "add", 1, 1, CMD_NODE, "usage: add <uuid|all>", cmd_add },
    { "unload", 0, 0, CMD_NODE, "unload takes no argument", cmd_unload },
    { "load", 0, 1, CMD_NODE, "usage: load [<driver version>]", cmd_load },
};

#define CONTROL_MAX_TOKENS 5

static void handle_command(char *line)
{
    char original[256];
    char *tokens[CONTROL_MAX_TOKENS] = { NULL };
    char *save = NULL, *p, *tok;
    const struct control_command *c = NULL;
    size_t len = strlen(line), i;
    int ntok = 0;

    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
        line[--len] = '\0';
    for (p = line; *p == ' ' || *p == '\t'; p++)
        ;
    if (*p == '\0' || *p == '#')
        return;
    snprintf(original, sizeof original, "%s", p);

    if (strncmp(p, "stats", 5) == 0 && (p[5] == ' ' || p[5] == '\t')) {
        char *path = p + 6;

        while (*path == ' ' || *path == '\t')
            path++;
        if (!*path) {
            control_complain(original, "missing stats path");
            return;
        }
        write_stats(original, path);
        return;
    }
    if (strncmp(p, "mig", 3) == 0 && (p[3] == ' ' || p[3] == '\t')) {
        /* A layout lists up to seven instances: more words than the command table takes. */
        pthread_mutex_lock(&g_mu);
        if (g_live) {
            mig_state_refresh(); /* another process's instances are on the GPU this command changes */
            mig_command(original, p + 4);
        }
        pthread_mutex_unlock(&g_mu);
        return;
    }
    if (strncmp(p, "health", 6) == 0 && (p[6] == ' ' || p[6] == '\t')) {
        pthread_mutex_lock(&g_mu);
        if (g_live)
            health_command(original, p + 7);
        pthread_mutex_unlock(&g_mu);
        return;
    }
    for (tok = strtok_r(p, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        if (ntok == CONTROL_MAX_TOKENS) {
            control_complain(original, "too many arguments");
            return;
        }
        tokens[ntok++] = tok;
    }
    if (strcmp(tokens[0], "stats") == 0) {
        control_complain(original, "missing stats path");
        return;
    }
    for (i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (strcmp(tokens[0], g_commands[i].name) == 0)
            c = &g_commands[i];
    if (!c) {
        control_complain(original, "unknown command");
        return;
    }
    if (ntok - 1 < c->min_args || ntok - 1 > c->max_args) {
        control_complain(original, c->usage);
        return;
    }
    if (c->scope == CMD_UNLOCKED) {
        c->run(original, tokens, ntok);
        return;
    }
    pthread_mutex_lock(&g_mu);
    if (g_live || c->scope == CMD_NODE)
        c->run(original, tokens, ntok);
    pthread_mutex_unlock(&g_mu);
}

#define CONTROL_LINE_MAX 4096

static void *control_main(void *arg)
{
    static char buffer[CONTROL_LINE_MAX * 4];
    size_t used = 0;
    int discarding = 0; /* inside an over-long line: drop bytes up to its newline */

    (void)arg;
    while (!__atomic_load_n(&g_ctl_stop, __ATOMIC_ACQUIRE)) {
        struct pollfd pfd = { g_ctl_fd, POLLIN, 0 };
        int rounds;

        if (poll(&pfd, 1, 50) <= 0)
            continue;
        /* Bounded so that a writer that never stops cannot delay shutdown. */
        for (rounds = 0; rounds < 64 && !__atomic_load_n(&g_ctl_stop, __ATOMIC_ACQUIRE); rounds++) {
            ssize_t got = read(g_ctl_fd, buffer + used, sizeof buffer - used);
            size_t start = 0, i;

            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                break;
            used += (size_t)got;
            for (i = 0; i < used; i++) {
                if (buffer[i] != '\n')
                    continue;
                buffer[i] = '\0';
                if (discarding)
                    discarding = 0;
                else if (i - start > CONTROL_LINE_MAX)
                    control_complain(buffer + start, "line too long");
                else
                    handle_command(buffer + start);
                start = i + 1;
            }
            memmove(buffer, buffer + start, used - start);
            used -= start;
            if (used > CONTROL_LINE_MAX) {
                if (!discarding) {
                    buffer[64] = '\0';
                    control_complain(buffer, "line too long");
                }
                discarding = 1;
                used = 0;
            }
        }
    }
    return NULL;
}

/* Creates (if needed) and opens the control FIFO; the thread is started later by
 * control_spawn, once the state it acts on is live. */
static nvmlReturn_t control_open(void)
{
    const char *path = getenv("FAKE_NVML_CONTROL");
    struct stat st;
    char ebuf[128];

    if (!path || !path[0] || g_ctl_fd >= 0) /* none, or still open (kept for a node change) */
        return NVML_SUCCESS;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT || (mkfifo(path, 0600) != 0 && errno != EEXIST) || stat(path, &st) != 0) {
            fprintf(stderr, "fake-nvml: FAKE_NVML_CONTROL: cannot create FIFO %s: %s\n", path,
                    errno_text(errno, ebuf, sizeof ebuf));
            return NVML_ERROR_UNKNOWN;
        }
    }
    if (!S_ISFIFO(st.st_mode)) {
        fprintf(stderr, "fake-nvml: FAKE_NVML_CONTROL: %s exists and is not a FIFO\n", path);
        return NVML_ERROR_UNKNOWN;
    }
    /* Read-write so that writers closing their end never gives us EOF. */
    g_ctl_fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (g_ctl_fd < 0) {
        fprintf(stderr, "fake-nvml: FAKE_NVML_CONTROL: cannot open %s: %s\n", path, errno_text(errno, ebuf, sizeof ebuf));
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t control_spawn(void)
{
    char ebuf[128];
    sigset_t all, old;
    int rc;

    if (g_ctl_fd < 0 || g_ctl_running)
        return NVML_SUCCESS;
    __atomic_store_n(&g_ctl_stop, 0, __ATOMIC_RELEASE);
    /* The thread blocks every signal: the host process keeps its own signal handling. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&g_ctl_thread, NULL, control_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        fprintf(stderr, "fake-nvml: FAKE_NVML_CONTROL: cannot start thread: %s\n", errno_text(rc, ebuf, sizeof ebuf));
        return NVML_ERROR_UNKNOWN;
    }
    g_ctl_running = 1;
    return NVML_SUCCESS;
}

static void control_stop(void)
{
    if (g_ctl_running) {
        __atomic_store_n(&g_ctl_stop, 1, __ATOMIC_RELEASE);
        pthread_join(g_ctl_thread, NULL);
        g_ctl_running = 0;
    }
    if (g_ctl_fd >= 0) {
        close(g_ctl_fd);
        g_ctl_fd = -1;
    }
}

/* ------------------------------------------------------------------------------------ */
/* Initialisation                                                                        */
/* ------------------------------------------------------------------------------------ */

/* Undoes a successful first init: stops the control thread first (it takes g_mu),
 * then wakes every waiter, waits for them to leave and frees the sets. Called with
 * g_init_mu held. */
static void teardown(void)
{
    int keep;

    /* While a node change is in effect the FIFO stays read, for the command that undoes it. */
    pthread_mutex_lock(&g_mu);
    keep = node_changed_locked();
    pthread_mutex_unlock(&g_mu);
    if (!keep)
        control_stop();
    pthread_mutex_lock(&g_mu);
    g_live = 0;
    while (g_sets)
        destroy_set_locked(g_sets);
    while (g_total_waiters > 0)
        pthread_cond_wait(&g_idle_cond, &g_mu);
    g_gpu_count = 0;
    pthread_mutex_unlock(&g_mu);
}

static nvmlReturn_t do_init(enum fake_function_id fn)
{
    nvmlReturn_t r;

    int unloaded;

    pthread_mutex_lock(&g_init_mu);
    pthread_mutex_lock(&g_mu);
    unloaded = g_unloaded;
    pthread_mutex_unlock(&g_mu);
    if (g_refcount > 0) {
        __atomic_fetch_add(&g_calls[fn], 1ULL, __ATOMIC_RELAXED);
        if (!unloaded)
            g_refcount++;
        pthread_mutex_unlock(&g_init_mu);
        return unloaded ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
    }
    /* Counters cover the calls since this (first) init, the init included. */
    reset_counters();
    __atomic_fetch_add(&g_calls[fn], 1ULL, __ATOMIC_RELAXED);
    r = unloaded ? NVML_ERROR_DRIVER_NOT_LOADED : load_config();
    g_config_path = NULL;
    if (r == NVML_SUCCESS && g_stage.init_error != 0)
        r = (nvmlReturn_t)g_stage.init_error;
    if (r != NVML_SUCCESS) {
        pthread_mutex_unlock(&g_init_mu);
        return r;
    }

    r = control_open();
    if (r != NVML_SUCCESS) {
        pthread_mutex_unlock(&g_init_mu);
        return r;
    }

    pthread_mutex_lock(&g_mu);
    memcpy(g_driver_version, g_loaded_version[0] ? g_loaded_version : g_stage.driver_version, sizeof g_driver_version);
    memcpy(g_nvml_version, g_stage.nvml_version, sizeof g_nvml_version);
    g_cuda_driver_version = g_stage.cuda_driver_version;
    g_link_count = g_stage.link_count;
    g_conf_count = g_stage.gpu_count;
    memcpy(g_conf, g_stage.gpus, sizeof g_conf[0] * g_conf_count);
    memcpy(g_conf_level, g_stage.level, sizeof g_conf_level);
    memcpy(g_switch_pci, g_stage.switches, sizeof g_switch_pci);
    memset(g_level, 0, sizeof g_level);
    mig_commit_stage();
    health_commit_stage();
    g_sets = NULL;
    g_gpu_count = 0;
    publish_devices_locked(); /* the configured GPUs minus those removed through the FIFO */
    g_total_waiters = 0;
    g_stale = 0;
    g_live = 1;
    pthread_mutex_unlock(&g_mu);

    r = control_spawn();
    if (r != NVML_SUCCESS) {
        teardown();
        pthread_mutex_unlock(&g_init_mu);
        return r;
    }
    g_refcount = 1;
    pthread_mutex_unlock(&g_init_mu);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return do_init(FN_nvmlInit_v2);
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return do_init(FN_nvmlInit);
}

/* Flags (NVML_INIT_FLAG_NO_GPUS, NVML_INIT_FLAG_NO_ATTACH) change nothing here. */
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init(FN_nvmlInitWithFlags);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    COUNT_CALL(nvmlShutdown);
    pthread_mutex_lock(&g_init_mu);
    if (g_refcount == 0) {
        pthread_mutex_unlock(&g_init_mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (--g_refcount > 0) {
        pthread_mutex_unlock(&g_init_mu);
        return NVML_SUCCESS;
    }
    teardown(); /* the last one */
    pthread_mutex_unlock(&g_init_mu);
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

/* ------------------------------------------------------------------------------------ */
/* System and device queries                                                             */
/* ------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t r;

    COUNT_CALL(nvmlSystemGetDriverVersion);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    return leave(copy_string(version, length, g_driver_version));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t r;

    COUNT_CALL(nvmlSystemGetNVMLVersion);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    return leave(copy_string(version, length, g_nvml_version));
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetCount_v2);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!deviceCount)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = g_gpu_count; /* lost GPUs still count, as with the real driver */
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetHandleByIndex_v2);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!device || index >= g_gpu_count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g_devs[index].lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    *device = handle_of(index);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t r;
    unsigned int i;

    COUNT_CALL(nvmlDeviceGetHandleByUUID);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_gpu_count; i++) {
        if (strcmp(g_devs[i].uuid, uuid) == 0) {
            if (g_devs[i].lost)
                return leave(NVML_ERROR_GPU_IS_LOST);
            *device = handle_of(i);
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

/* By PCI bus id (the nvmlPciInfo_t.busId form, any case): a GPU fallen off the bus is still at its
 * address and answers GPU_IS_LOST; one that left the bus is NOT_FOUND. */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    nvmlReturn_t r;
    unsigned int i;

    COUNT_CALL(nvmlDeviceGetHandleByPciBusId_v2);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!pciBusId || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_gpu_count; i++) {
        if (strcasecmp(g_devs[i].pci.busId, pciBusId) == 0) {
            if (g_devs[i].lost)
                return leave(NVML_ERROR_GPU_IS_LOST);
            *device = handle_of(i);
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetIndex);
    if ((r = enter_device(device, index != NULL, &d)) != NVML_SUCCESS)
        return r;
    *index = d->index;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetUUID);
    if (mig_answer(device, 0, uuid, length, NULL, &r))
        return r;
    if ((r = enter_device(device, uuid != NULL, &d)) != NVML_SUCCESS)
        return r;
    return leave(copy_string(uuid, length, d->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetName);
    if (mig_answer(device, 1, name, length, NULL, &r))
        return r;
    if ((r = enter_device(device, name != NULL, &d)) != NVML_SUCCESS)
        return r;
    return leave(copy_string(name, length, d->name));
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetMinorNumber);
    if ((r = enter_device(device, minorNumber != NULL, &d)) != NVML_SUCCESS)
        return r;
    *minorNumber = d->minor;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetPciInfo_v3);
    if ((r = enter_device(device, pci != NULL, &d)) != NVML_SUCCESS)
        return r;
    *pci = d->pci;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetMemoryInfo);
    if (mig_answer(device, 2, NULL, 0, memory, &r))
        return r;
    if ((r = enter_device(device, memory != NULL, &d)) != NVML_SUCCESS)
        return r;
    memory->total = d->memory_total;
    memory->used = d->memory_used;
    memory->free = d->memory_total - d->memory_used;
    return leave(NVML_SUCCESS);
}

/* Compute mode (MPS needs EXCLUSIVE_PROCESS). A MIG device answers NOT_SUPPORTED. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetComputeMode);
    if ((r = enter_device(device, mode != NULL, &d)) != NVML_SUCCESS)
        return r;
    *mode = (nvmlComputeMode_t)d->compute_mode;
    return leave(NVML_SUCCESS);
}

/* As nvml.h documents it: INVALID_ARGUMENT for a bad handle or a mode outside the enum, NO_PERMISSION
 * unless the caller is root (checked with geteuid, as the real library needs root for this call),
 * and NOT_SUPPORTED for EXCLUSIVE_THREAD, whose support NVIDIA removed. */
EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode)
{
    unsigned int wanted = (unsigned int)mode;
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceSetComputeMode);
    if ((r = enter_device(device, wanted < NVML_COMPUTEMODE_COUNT, &d)) != NVML_SUCCESS)
        return r;
    if (geteuid() != 0)
        return leave(NVML_ERROR_NO_PERMISSION);
    if (wanted == NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    set_mode_locked(d, (int)wanted);
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
/* NOT_SUPPORTED when the GPU has no NUMA affinity (sysfs numa_node -1). */
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetNumaNodeId);
    if ((r = enter_device(device, node != NULL, &d)) != NVML_SUCCESS)
        return r;
    if (d->numa_node == FAKE_NO_NUMA)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *node = (unsigned int)d->numa_node;
    return leave(NVML_SUCCESS);
}
#endif

/* The same device twice is refused with INVALID_ARGUMENT: the call asks for the path
 * between two different GPUs, and callers (nvidia-smi topo shows "X") never ask it for
 * one GPU with itself; a caller that needs "self" must not rely on the library for it. */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                        nvmlGpuTopologyLevel_t *pathInfo)
{
    struct fake_device *a, *b;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetTopologyCommonAncestor);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    a = device_from_handle(device1);
    b = device_from_handle(device2);
    if ((!a && is_mig_handle(device1)) || (!b && is_mig_handle(device2)))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!a || !b || !pathInfo || a == b)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (a->lost || b->lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    *pathInfo = (nvmlGpuTopologyLevel_t)g_level[a->index][b->index];
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------ */
/* NVLink                                                                                */
/*                                                                                       */
/* Behaviour, modelled on the real library:                                              */
/*  - a GPU model without NVLink (linkCount 0): NOT_SUPPORTED for every link;            */
/*  - link >= linkCount: INVALID_ARGUMENT (how callers learn there are no more links);   */
/*  - a slot that exists but is not connected: nvmlDeviceGetNvLinkState says disabled    */
/*    (0) with SUCCESS, and the remote queries (PCI info, device type) answer            */
/*    NOT_SUPPORTED, since there is no remote end to describe;                           */
/*  - an active link: remote PCI info is the peer GPU's own PCI info (type GPU), or the  */
/*    NVSwitch's bus id (type SWITCH).                                                   */
/* ------------------------------------------------------------------------------------ */

/* Prologue of the link queries; returns with g_mu held only on success. */
static nvmlReturn_t enter_link(nvmlDevice_t device, unsigned int link, int arguments_ok, const struct fake_link **out)
{
    struct fake_device *d;
    nvmlReturn_t r;

    if ((r = enter_device(device, arguments_ok, &d)) != NVML_SUCCESS)
        return r;
    if (g_link_count == 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (link >= g_link_count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *out = &d->links[link];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    const struct fake_link *l;
    const struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetNvLinkState);
    if ((r = enter_link(device, link, isActive != NULL, &l)) != NVML_SUCCESS)
        return r;
    d = device_from_handle(device);
    if ((r = health_nvlink_answer(d)) != NVML_SUCCESS)
        return leave(r);
    /* A link set down through the FIFO (fake_health.h) reads inactive, as a link that trained down. */
    *isActive = l->kind == LINK_UNUSED || health_link_down(d, link) ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t remote_pci_info(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    const struct fake_link *l;
    nvmlReturn_t r;

    if ((r = enter_link(device, link, pci != NULL, &l)) != NVML_SUCCESS)
        return r;
    switch (l->kind) {
    case LINK_TO_GPU:
        *pci = g_devs[l->remote].pci;
        return leave(NVML_SUCCESS);
    case LINK_TO_SWITCH:
        *pci = g_switch_pci[l->remote];
        return leave(NVML_SUCCESS);
    default:
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    COUNT_CALL(nvmlDeviceGetNvLinkRemotePciInfo);
    return remote_pci_info(device, link, pci);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    COUNT_CALL(nvmlDeviceGetNvLinkRemotePciInfo_v2);
    return remote_pci_info(device, link, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    const struct fake_link *l;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetNvLinkRemoteDeviceType);
    if ((r = enter_link(device, link, pNvLinkDeviceType != NULL, &l)) != NVML_SUCCESS)
        return r;
    switch (l->kind) {
    case LINK_TO_GPU:
        *pNvLinkDeviceType = NVML_NVLINK_DEVICE_TYPE_GPU;
        return leave(NVML_SUCCESS);
    case LINK_TO_SWITCH:
        *pNvLinkDeviceType = NVML_NVLINK_DEVICE_TYPE_SWITCH;
        return leave(NVML_SUCCESS);
    default:
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
}
#endif

static nvmlReturn_t cuda_driver_version(int *out)
{
    nvmlReturn_t r;

    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *out = g_cuda_driver_version;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    COUNT_CALL(nvmlSystemGetCudaDriverVersion);
    return cuda_driver_version(cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    COUNT_CALL(nvmlSystemGetCudaDriverVersion_v2);
    return cuda_driver_version(cudaDriverVersion);
}

/* Compute capability by board name, like the PCI device ids above (8.0 for boards not listed). */
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    static const struct {
        const char *fragment;
        int major, minor;
    } table[] = {
        { "P100", 6, 0 }, { "V100", 7, 0 }, { "T4", 7, 5 }, { "A100", 8, 0 }, { "A10", 8, 6 }, { "RTX A6000", 8, 6 },
        { "L40S", 8, 9 }, { "H100", 9, 0 }, { "B200", 10, 0 },
    };
    struct fake_device *d;
    nvmlReturn_t r;
    size_t i;

    COUNT_CALL(nvmlDeviceGetCudaComputeCapability);
    if ((r = enter_device(device, major != NULL && minor != NULL, &d)) != NVML_SUCCESS)
        return r;
    *major = 8;
    *minor = 0;
    for (i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strstr(d->name, table[i].fragment)) {
            *major = table[i].major;
            *minor = table[i].minor;
            break;
        }
    }
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------ */
/* Event API                                                                             */
/* ------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    struct fake_event_set *s;
    pthread_condattr_t attr;
    nvmlReturn_t r;

    COUNT_CALL(nvmlEventSetCreate);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    if (!set)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    s = calloc(1, sizeof *s);
    if (s)
        s->ring = calloc(FAKE_QUEUE_CAPACITY, sizeof *s->ring);
    if (!s || !s->ring) {
        if (s)
            free(s);
        return leave(NVML_ERROR_UNKNOWN);
    }
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &attr);
    pthread_condattr_destroy(&attr);
    s->magic = FAKE_SET_MAGIC;
    s->next = g_sets;
    g_sets = s;
    *set = s;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    struct fake_device *d;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetSupportedEventTypes);
    if ((r = enter_device(device, eventTypes != NULL, &d)) != NVML_SUCCESS)
        return r;
    *eventTypes = d->supported_events;
    return leave(NVML_SUCCESS);
}

/* NOT_SUPPORTED when the GPU supports no events at all, or when any requested type is
 * one it does not support; registering adds to what the set already has for that GPU. */
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    struct fake_device *d;
    struct fake_event_set *s;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceRegisterEvents);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    d = device_from_handle(device);
    s = set_from_handle(set);
    if (!d && s && is_mig_handle(device))
        return leave(NVML_ERROR_NOT_SUPPORTED); /* events are registered on the parent GPU */
    if (!d || !s)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (d->lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    if (d->supported_events == 0 || (eventTypes & ~d->supported_events) != 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    s->registered[d->index] |= eventTypes;
    s->registered_any |= eventTypes;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    COUNT_CALL(nvmlEventSetWait);
    return event_wait(set, data, timeoutms, 0);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    COUNT_CALL(nvmlEventSetWait_v2);
    return event_wait(set, data, timeoutms, 1);
}
#endif

/* A thread blocked on the set is woken and answers INVALID_ARGUMENT; the set's memory is
 * released only after it left. */
EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    struct fake_event_set *s;
    nvmlReturn_t r;

    COUNT_CALL(nvmlEventSetFree);
    if ((r = enter()) != NVML_SUCCESS)
        return r;
    s = set_from_handle(set);
    if (!s)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    destroy_set_locked(s);
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------ */
/* MIG                                                                                   */
/* ------------------------------------------------------------------------------------ */

#include "fake_mig.h"

/* ------------------------------------------------------------------------------------ */
/* Health states beyond XIDs                                                             */
/* ------------------------------------------------------------------------------------ */

#include "fake_health.h"
