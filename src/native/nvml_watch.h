/*
 * nvml_watch.h: what the three files of the GPU health thread share (see README.md in this folder):
 * NVML's return codes, event types and structures as far as they are used, the record written into
 * the pipe (struct gdp_record and its constants), the watch itself (struct gdp_watch), and the
 * functions one file calls in another.
 *   nvml_watch.c   the exported entry points: start, stop and join a watch
 *   nvml_access.c  NVML's entry points found in the loaded library; the event set
 *   watch_loop.c   the thread: probes, event waits folded into batches, records into the pipe
 *
 * The record layout and every constant below are mirrored in src/nvml/watcher.ts.
 */
#ifndef GDP_NVML_WATCH_H
#define GDP_NVML_WATCH_H

#include <pthread.h>
#include <stdint.h>

/* NVML return codes and event types used here (FACTS §4). */
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
};
#define EVENT_SINGLE_BIT_ECC 0x1ULL
#define EVENT_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_XID 0x8ULL

typedef struct {
    unsigned long long total, free, used;
} nvml_memory_t;

typedef struct {
    void *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvml_event_data_t;

typedef int (*fn_handle_by_index)(unsigned int, void **);
typedef int (*fn_memory_info)(void *, nvml_memory_t *);
typedef int (*fn_set_create)(void **);
typedef int (*fn_supported)(void *, unsigned long long *);
typedef int (*fn_register)(void *, unsigned long long, void *);
typedef int (*fn_wait)(void *, nvml_event_data_t *, unsigned int);
typedef int (*fn_set_free)(void *);

/* Record types (struct gdp_record.type). */
enum {
    GDP_REC_WARN_HANDLE = 1,   /* gpu, code: no handle for this GPU; the probe reports it */
    GDP_REC_WARN_REGISTER = 2, /* gpu, code: nvmlDeviceRegisterEvents failed; the probe watches it */
    GDP_REC_WATCHED = 3,       /* gpu: events registered */
    GDP_REC_UNSUPPORTED = 4,   /* gpu: no events for it; the probe watches it */
    GDP_REC_READY = 5,         /* the lists above are complete */
    GDP_REC_PROBE = 6,         /* gpu, value: 0 ok, 1 lost, 2 error; code: what NVML answered */
    GDP_REC_PROBE_END = 7,     /* one probe of every GPU is complete */
    GDP_REC_EVENT = 8,         /* gpu (-1: no device, -2: unknown handle), kind, value, gi, ci, count */
    GDP_REC_EVENTS_END = 9,    /* one batch is complete */
    GDP_REC_WAIT_FAILED = 10,  /* code: the wait failed; retried after wait_timeout_ms */
    GDP_REC_DRIVER_GONE = 11,  /* func, code, gpu: the driver does not answer; the thread ends */
    GDP_REC_FAILED = 12,       /* func, code: set-up failed; the thread ends */
    GDP_REC_STOPPED = 13,      /* the last record */
};

/* NVML functions named in records (struct gdp_record.func). */
enum {
    GDP_FN_NONE = 0,
    GDP_FN_HANDLE_BY_INDEX = 1,
    GDP_FN_MEMORY_INFO = 2,
    GDP_FN_SET_CREATE = 3,
    GDP_FN_SUPPORTED = 4,
    GDP_FN_REGISTER = 5,
    GDP_FN_WAIT_V2 = 6,
    GDP_FN_WAIT = 7,
};

/* 40 bytes, the same on x86_64 and aarch64 (both little-endian, 8-byte aligned u64). */
struct gdp_record {
    uint32_t type;
    int32_t gpu;
    uint32_t code;
    uint32_t func;
    uint64_t value;
    uint32_t kind;  /* event: the NVML event type bit */
    uint32_t count; /* event: identical events folded into this one */
    uint32_t gi;    /* event: GPU instance (v2 wait only; flags bit 0) */
    uint32_t ci;    /* event: compute instance */
};
_Static_assert(sizeof(struct gdp_record) == 40, "record layout");

#define DRAIN_MAX 4096
#define FOLD_SLOTS 8192 /* power of two, > DRAIN_MAX */

struct gdp_watch {
    void *lib;
    unsigned int count;
    unsigned int *indices;
    void **handles;
    unsigned int probe_interval_ms;
    unsigned int wait_timeout_ms;
    int wait_version; /* 2, 1, or 0: no event wait */
    int fd;           /* write end of the pipe */
    pthread_t thread;
    int stop;         /* atomic */
    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC; signalled by gdp_watch_stop */
    fn_handle_by_index handle_by_index;
    fn_memory_info memory_info;
    fn_set_create set_create;
    fn_supported supported;
    fn_register register_events;
    fn_wait wait;
    fn_set_free set_free;
    /* The batch being folded: entries in arrival order, and an index into them. */
    struct gdp_record *batch;
    uint32_t batch_len;
    int16_t *slots;
    /* Record buffer for one probe round. */
    struct gdp_record *probe;
};

/* Only the three functions marked EXPORT leave the library (it is built with -fvisibility=hidden). */
#define EXPORT __attribute__((visibility("default")))

/* nvml_access.c: finds NVML's functions (0, ENOENT or ENOSYS); sets up handles and the event set
 * on the thread (0, or -1 when set-up failed and the thread ends). */
int gdp_nvml_bind(struct gdp_watch *w, const char *library, int wait_version);
int gdp_nvml_open_events(struct gdp_watch *w, void **set, unsigned int *watched);

/* watch_loop.c: writes one record into the pipe; the thread's start routine. */
void gdp_put1(struct gdp_watch *w, uint32_t type, int32_t gpu, uint32_t func, uint32_t code);
void *gdp_thread_main(void *arg);

#endif
