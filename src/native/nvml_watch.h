/*
 * nvml_watch.h: what the files of the GPU health thread share (see README.md in this folder):
 * NVML's return codes, event types and structures as far as they are used, the record written into
 * the pipe (struct gdp_record and its constants), the watch itself (struct gdp_watch), and the
 * functions one file calls in another.
 *   nvml_watch.c   the exported entry points: start, stop and join a watch
 *   nvml_access.c  NVML's entry points found in the loaded library; the event set
 *   watch_loop.c   the thread: probes, event waits folded into batches, records into the pipe
 *   signals.c      the health signals beyond XIDs: one GPU's states read into a signals record
 *
 * The record layout and every constant below are mirrored in src/nvml/watcher.ts (the signals record
 * and its bits in src/nvml/signals-record.ts).
 */
#ifndef GDP_NVML_WATCH_H
#define GDP_NVML_WATCH_H

#include <pthread.h>
#include <stdint.h>

/* NVML return codes and event types used here. */
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
};
#define EVENT_SINGLE_BIT_ECC 0x1ULL
#define EVENT_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_XID 0x8ULL
#define EVENT_DRAM_RETIREMENT 0x400ULL
#define EVENT_DRAM_RETIREMENT_FAILURE 0x800ULL
#define EVENT_RECOVERY_ACTION 0x8000ULL
/* XID 154: the driver's recovery action changed (a prompt to read it, travelling as an XID too). */
#define XID_RECOVERY_ACTION 154

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

/* nvmlFieldValue_t (40 bytes): the value's type says which member of the 8-byte union is set. */
typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    unsigned int valueType;
    int nvmlReturn;
    union {
        double dVal;
        int siVal;
        unsigned int uiVal;
        unsigned long ulVal;
        unsigned long long ullVal;
        signed long long sllVal;
        unsigned short usVal;
    } value;
} nvml_field_value_t;
_Static_assert(sizeof(nvml_field_value_t) == 40, "nvmlFieldValue_t layout");
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230

typedef int (*fn_field_values)(void *, int, nvml_field_value_t *);
typedef int (*fn_remapped_rows)(void *, unsigned int *, unsigned int *, unsigned int *, unsigned int *);
typedef int (*fn_retired_pending)(void *, int *);
typedef int (*fn_retired_pages)(void *, int, unsigned int *, unsigned long long *, unsigned long long *);
typedef int (*fn_total_ecc)(void *, int, int, unsigned long long *);
typedef int (*fn_nvlink_state)(void *, unsigned int, int *);
typedef int (*fn_uint)(void *, unsigned int *);
typedef int (*fn_ull)(void *, unsigned long long *);

/* The health signals (bits of the watch's `signals` and of a signals record's bytes), in the order
 * of SIGNAL_NAMES in src/core/health-signal-types.ts. */
enum {
    GDP_SIG_RECOVERY = 1 << 0,
    GDP_SIG_ROW_REMAP = 1 << 1,
    GDP_SIG_RETIRED = 1 << 2,
    GDP_SIG_ECC = 1 << 3,
    GDP_SIG_NVLINK = 1 << 4,
    GDP_SIG_PCIE_WIDTH = 1 << 5,
    GDP_SIG_PCIE_REPLAY = 1 << 6,
    GDP_SIG_CLOCKS = 1 << 7,
};
#define GDP_MAX_LINKS 32 /* NVLink links read (the record's masks are 32 bits) */

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
    GDP_REC_SIGNALS = 14,      /* gpu: its health signals (struct gdp_signals_record) */
    GDP_REC_SIGNALS_END = 15,  /* the signals records of one round (or of an event's GPUs) are complete */
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

/* A GDP_REC_SIGNALS record: the same 40 bytes, laid out for one GPU's signals. Counters that do not
 * fit their field are saturated. A signal not read this round (not asked for, or its read failed
 * otherwise) has its bit in `failed`; one the driver lacks (a missing function, NOT_SUPPORTED, a
 * field value whose own return says so) in `unavailable`. */
struct gdp_signals_record {
    uint32_t type;
    int32_t gpu;
    uint8_t unavailable;        /* GDP_SIG_* */
    uint8_t failed;             /* GDP_SIG_* */
    uint8_t recovery_action;    /* nvmlDeviceGpuRecoveryAction_t (255: 255 or more) */
    uint8_t flags;              /* GDP_SIGF_* */
    uint8_t pcie_width;         /* current lanes */
    uint8_t pcie_max_width;
    uint16_t clocks;            /* clocks-event reason bits (low 16) */
    uint16_t remap_corrected;   /* rows */
    uint16_t remap_uncorrected;
    uint16_t retired_sbe;       /* retired pages, multiple single-bit errors */
    uint16_t retired_dbe;       /* retired pages, double-bit errors */
    uint32_t ecc_volatile;      /* uncorrected ECC errors since the last reset */
    uint32_t pcie_replays;      /* the replay counter */
    uint32_t nvlink_active;     /* bit per link active now */
    uint32_t nvlink_links;      /* bit per link that answered */
};
_Static_assert(sizeof(struct gdp_signals_record) == sizeof(struct gdp_record), "signals record layout");
enum {
    GDP_SIGF_REMAP_PENDING = 1 << 0,
    GDP_SIGF_REMAP_FAILURE = 1 << 1,
    GDP_SIGF_RETIRED_PENDING = 1 << 2,
};

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
    /* The health signals to read (GDP_SIG_*; 0: none) and their functions (NULL: missing). */
    uint32_t signals;
    fn_field_values field_values;
    fn_remapped_rows remapped_rows;
    fn_retired_pending retired_pending;
    fn_retired_pages retired_pages;
    fn_total_ecc total_ecc;
    fn_nvlink_state nvlink_state;
    fn_uint pcie_width, pcie_max_width, pcie_replays;
    fn_ull clocks;
    /* GPUs whose signals an event asked to read at once (by position). */
    uint8_t *signals_due;
    struct gdp_signals_record *signals_out;
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

/* watch_loop.c: writes records into the pipe; the thread's start routine. */
void gdp_put(struct gdp_watch *w, const void *records, size_t n);
void gdp_put1(struct gdp_watch *w, uint32_t type, int32_t gpu, uint32_t func, uint32_t code);
void *gdp_thread_main(void *arg);

/* signals.c: finds the signals' functions (any may be missing); the event types they need
 * registered; reads the signals of every GPU (all) or of those due, writing their records and the
 * round's end. */
void gdp_signals_bind(struct gdp_watch *w);
unsigned long long gdp_signals_events(const struct gdp_watch *w);
void gdp_signals_read(struct gdp_watch *w, int all);

#endif
