/*
 * nvml_watch.c: the GPU health thread (see README.md in this folder).
 *
 * One pthread per watch. It borrows the process's NVML session (the library the main thread
 * loaded and initialised; NVML is thread-safe) and, until asked to stop:
 *   - probes every GPU when due (nvmlDeviceGetMemoryInfo: GPU_IS_LOST when it fell off the bus),
 *   - blocks in nvmlEventSetWait(_v2) for at most wait_timeout_ms, then drains what is already
 *     queued (at most DRAIN_MAX events) and folds identical events into one entry with a count,
 *   - writes what it saw as fixed-size records (struct gdp_record) into a pipe, whose read end
 *     the main thread reads through its event loop.
 * Blocking NVML calls therefore never run on the event loop nor on libuv's shared thread pool.
 * A driver that stops answering (UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH) is
 * reported once and ends the thread; so does a stop request (an atomic flag, looked at after
 * every wait and probe). The last record is GDP_REC_STOPPED; the write end is closed after it, so
 * the reader sees end-of-file once the thread is about to return. NVML is never linked: its
 * entry points are looked up in the already loaded library (dlopen RTLD_NOLOAD), so this file
 * builds without NVIDIA's headers and loads on a machine without a driver.
 *
 * The record layout and every constant below are mirrored in src/nvml/watcher.ts.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#define EXPORT __attribute__((visibility("default")))

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

static int stopping(struct gdp_watch *w)
{
    return __atomic_load_n(&w->stop, __ATOMIC_ACQUIRE);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int driver_gone(int code)
{
    return code == NVML_ERROR_UNINITIALIZED || code == NVML_ERROR_DRIVER_NOT_LOADED ||
           code == NVML_ERROR_LIB_RM_VERSION_MISMATCH;
}

/* Writes every byte (the reader may take a while: the pipe gives back-pressure). */
static void put(struct gdp_watch *w, const struct gdp_record *r, size_t n)
{
    const char *p = (const char *)r;
    size_t left = n * sizeof *r;
    while (left > 0) {
        ssize_t k = write(w->fd, p, left);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return; /* the reader is gone: nothing to tell any more */
        }
        p += k;
        left -= (size_t)k;
    }
}

static void put1(struct gdp_watch *w, uint32_t type, int32_t gpu, uint32_t func, uint32_t code)
{
    struct gdp_record r;
    memset(&r, 0, sizeof r);
    r.type = type;
    r.gpu = gpu;
    r.func = func;
    r.code = code;
    put(w, &r, 1);
}

/* Sleeps up to ms, waking early when asked to stop. */
static void nap(struct gdp_watch *w, uint64_t ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)(ms / 1000u);
    deadline.tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!stopping(w)) {
        if (pthread_cond_timedwait(&w->cond, &w->mu, &deadline) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&w->mu);
}

static int32_t position(struct gdp_watch *w, void *device)
{
    if (device == NULL)
        return -1;
    for (unsigned int i = 0; i < w->count; i++)
        if (w->handles[i] == device)
            return (int32_t)i;
    return -2;
}

static uint32_t fold_hash(const struct gdp_record *r)
{
    uint64_t h = 1469598103934665603ULL;
    uint64_t parts[5] = { r->kind, (uint32_t)r->gpu, r->value, r->gi, r->ci };
    for (int i = 0; i < 5; i++) {
        h ^= parts[i];
        h *= 1099511628211ULL;
    }
    return (uint32_t)(h ^ (h >> 29));
}

/* Adds one event to the batch: identical ones (kind, GPU, and for XIDs the number, GI and CI) share
 * an entry and a count. */
static void fold(struct gdp_watch *w, const nvml_event_data_t *d)
{
    struct gdp_record r;
    memset(&r, 0, sizeof r);
    r.type = GDP_REC_EVENT;
    r.gpu = position(w, d->device);
    r.kind = d->eventType == EVENT_XID ? (uint32_t)EVENT_XID
             : d->eventType == EVENT_DOUBLE_BIT_ECC ? (uint32_t)EVENT_DOUBLE_BIT_ECC
                                                     : (uint32_t)EVENT_SINGLE_BIT_ECC;
    if (r.kind == EVENT_XID) {
        r.value = d->eventData;
        if (w->wait_version == 2) {
            r.func = 1; /* flags: gi and ci are known */
            r.gi = d->gpuInstanceId;
            r.ci = d->computeInstanceId;
        }
    }
    uint32_t mask = FOLD_SLOTS - 1;
    for (uint32_t s = fold_hash(&r) & mask;; s = (s + 1) & mask) {
        int16_t at = w->slots[s];
        if (at < 0) {
            r.count = 1;
            w->slots[s] = (int16_t)w->batch_len;
            w->batch[w->batch_len++] = r;
            return;
        }
        struct gdp_record *e = &w->batch[at];
        if (e->kind == r.kind && e->gpu == r.gpu && e->value == r.value && e->gi == r.gi && e->ci == r.ci &&
            e->func == r.func) {
            e->count++;
            return;
        }
    }
}

static void flush_batch(struct gdp_watch *w)
{
    if (w->batch_len == 0)
        return;
    memset(&w->batch[w->batch_len], 0, sizeof w->batch[0]);
    w->batch[w->batch_len].type = GDP_REC_EVENTS_END;
    put(w, w->batch, w->batch_len + 1);
    w->batch_len = 0;
    memset(w->slots, 0xff, FOLD_SLOTS * sizeof w->slots[0]);
}

/* Probes every GPU; returns 0, or the code that says the driver is gone (and *at the GPU). */
static int probe_all(struct gdp_watch *w, int32_t *at)
{
    int gone = 0;
    for (unsigned int i = 0; i < w->count; i++) {
        struct gdp_record *r = &w->probe[i];
        memset(r, 0, sizeof *r);
        r->type = GDP_REC_PROBE;
        r->gpu = (int32_t)i;
        r->func = GDP_FN_MEMORY_INFO;
        if (w->handles[i] == NULL) {
            r->value = 2;
            continue;
        }
        nvml_memory_t m;
        int rc = w->memory_info(w->handles[i], &m);
        r->code = (uint32_t)rc;
        r->value = rc == NVML_SUCCESS ? 0 : rc == NVML_ERROR_GPU_IS_LOST ? 1 : 2;
        if (driver_gone(rc) && !gone) {
            gone = rc;
            *at = (int32_t)i;
        }
    }
    /* Each GPU's record is written even when the driver went (the reader logs the failures),
     * but the round ends only when it is complete. */
    put(w, w->probe, w->count);
    if (!gone) {
        struct gdp_record end;
        memset(&end, 0, sizeof end);
        end.type = GDP_REC_PROBE_END;
        put(w, &end, 1);
    }
    return gone;
}

static void run(struct gdp_watch *w)
{
    void *set = NULL;
    unsigned int watched = 0;

    for (unsigned int i = 0; i < w->count; i++) {
        int rc = w->handle_by_index(w->indices[i], &w->handles[i]);
        if (rc != NVML_SUCCESS) {
            w->handles[i] = NULL;
            put1(w, GDP_REC_WARN_HANDLE, (int32_t)i, GDP_FN_HANDLE_BY_INDEX, (uint32_t)rc);
        }
    }
    if (w->wait_version != 0) {
        if (!w->set_create || !w->supported || !w->register_events || !w->set_free) {
            put1(w, GDP_REC_FAILED, -1,
                 !w->set_create ? GDP_FN_SET_CREATE : !w->supported ? GDP_FN_SUPPORTED : GDP_FN_REGISTER,
                 NVML_ERROR_FUNCTION_NOT_FOUND);
            return;
        }
        int rc = w->set_create(&set);
        if (rc != NVML_SUCCESS) {
            put1(w, GDP_REC_FAILED, -1, GDP_FN_SET_CREATE, (uint32_t)rc);
            return;
        }
        const unsigned long long wanted = EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC;
        for (unsigned int i = 0; i < w->count; i++) {
            if (w->handles[i] == NULL)
                continue;
            unsigned long long supported = 0;
            rc = w->supported(w->handles[i], &supported);
            unsigned long long mask = rc == NVML_SUCCESS ? (supported & wanted) : 0;
            if (mask == 0) {
                put1(w, GDP_REC_UNSUPPORTED, (int32_t)i, 0, 0);
                continue;
            }
            rc = w->register_events(w->handles[i], mask, set);
            if (rc == NVML_SUCCESS) {
                put1(w, GDP_REC_WATCHED, (int32_t)i, 0, 0);
                watched++;
            } else {
                put1(w, GDP_REC_UNSUPPORTED, (int32_t)i, 0, 0);
                put1(w, GDP_REC_WARN_REGISTER, (int32_t)i, GDP_FN_REGISTER, (uint32_t)rc);
            }
        }
    }
    put1(w, GDP_REC_READY, -1, 0, 0);

    uint64_t next_probe = 0;
    int gone = 0;
    uint32_t gone_func = GDP_FN_NONE;
    int32_t gone_gpu = -1;
    nvml_event_data_t data;
    while (!stopping(w) && !gone) {
        uint64_t now = now_ms();
        if (now >= next_probe) {
            gone = probe_all(w, &gone_gpu);
            if (gone) {
                gone_func = GDP_FN_MEMORY_INFO;
                break;
            }
            next_probe = now + w->probe_interval_ms;
        }
        uint64_t t = now_ms();
        uint64_t until = next_probe > t ? next_probe - t : 1;
        uint64_t timeout = until < w->wait_timeout_ms ? until : w->wait_timeout_ms;
        if (timeout < 1)
            timeout = 1;
        if (set == NULL || watched == 0) {
            /* Nothing to wait on: sleep until the next probe, waking early to stop. */
            nap(w, timeout);
            continue;
        }
        memset(&data, 0, sizeof data);
        int rc = w->wait(set, &data, (unsigned int)timeout);
        unsigned int drained = 0;
        /* Drain what is already queued without waiting, so a storm travels in batches. */
        while (rc == NVML_SUCCESS) {
            fold(w, &data);
            if (++drained >= DRAIN_MAX || stopping(w))
                break;
            memset(&data, 0, sizeof data);
            rc = w->wait(set, &data, 0);
        }
        flush_batch(w);
        if (driver_gone(rc)) {
            gone = rc;
            gone_func = w->wait_version == 2 ? GDP_FN_WAIT_V2 : GDP_FN_WAIT;
            gone_gpu = -1;
            break;
        }
        if (rc != NVML_SUCCESS && rc != NVML_ERROR_TIMEOUT) {
            put1(w, GDP_REC_WAIT_FAILED, -1, w->wait_version == 2 ? GDP_FN_WAIT_V2 : GDP_FN_WAIT, (uint32_t)rc);
            nap(w, w->wait_timeout_ms);
        }
    }
    if (gone)
        put1(w, GDP_REC_DRIVER_GONE, gone_gpu, gone_func, (uint32_t)gone);
    else if (set != NULL)
        w->set_free(set);
}

static void *thread_main(void *arg)
{
    struct gdp_watch *w = arg;
    pthread_setname_np(pthread_self(), "nvml-events"); /* prctl: no file opened */
    run(w);
    put1(w, GDP_REC_STOPPED, -1, 0, 0);
    close(w->fd);
    w->fd = -1;
    return NULL;
}

static void release(struct gdp_watch *w)
{
    if (w->lib)
        dlclose(w->lib);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mu);
    free(w->indices);
    free(w->handles);
    free(w->batch);
    free(w->slots);
    free(w->probe);
    free(w);
}

/*
 * Starts watching the GPUs with these NVML indices (positions in records are positions in this
 * list), through the NVML library already loaded as `library` (the name or path it was loaded by).
 * wait_version: 2 (nvmlEventSetWait_v2), 1 (nvmlEventSetWait) or 0 (no events: probes only).
 * Returns 0 with *out and *fd (the read end of the record pipe, close-on-exec, the caller's to
 * close), or an errno value (ENOENT: the library is not loaded; ENOSYS: it lacks a function the
 * probe or the chosen wait needs).
 */
EXPORT int gdp_watch_start(const char *library, const uint32_t *indices, uint32_t count,
                           uint32_t probe_interval_ms, uint32_t wait_timeout_ms, int32_t wait_version,
                           struct gdp_watch **out, int32_t *fd)
{
    struct gdp_watch *w = calloc(1, sizeof *w);
    int pipefd[2] = { -1, -1 };
    int err;

    if (!w)
        return ENOMEM;
    w->fd = -1;
    pthread_mutex_init(&w->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&w->cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    w->count = count;
    w->probe_interval_ms = probe_interval_ms;
    w->wait_timeout_ms = wait_timeout_ms > 0 ? wait_timeout_ms : 1;
    w->wait_version = wait_version;
    w->indices = calloc(count ? count : 1, sizeof *w->indices);
    w->handles = calloc(count ? count : 1, sizeof *w->handles);
    w->probe = calloc(count ? count : 1, sizeof *w->probe);
    w->batch = calloc(DRAIN_MAX + 1, sizeof *w->batch);
    w->slots = malloc(FOLD_SLOTS * sizeof *w->slots);
    if (!w->indices || !w->handles || !w->probe || !w->batch || !w->slots) {
        err = ENOMEM;
        goto fail;
    }
    memcpy(w->indices, indices, count * sizeof *indices);
    memset(w->slots, 0xff, FOLD_SLOTS * sizeof w->slots[0]);

    w->lib = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    if (!w->lib) {
        err = ENOENT;
        goto fail;
    }
    w->handle_by_index = (fn_handle_by_index)dlsym(w->lib, "nvmlDeviceGetHandleByIndex_v2");
    w->memory_info = (fn_memory_info)dlsym(w->lib, "nvmlDeviceGetMemoryInfo");
    w->set_create = (fn_set_create)dlsym(w->lib, "nvmlEventSetCreate");
    w->supported = (fn_supported)dlsym(w->lib, "nvmlDeviceGetSupportedEventTypes");
    w->register_events = (fn_register)dlsym(w->lib, "nvmlDeviceRegisterEvents");
    w->set_free = (fn_set_free)dlsym(w->lib, "nvmlEventSetFree");
    if (wait_version == 2)
        w->wait = (fn_wait)dlsym(w->lib, "nvmlEventSetWait_v2");
    else if (wait_version == 1)
        w->wait = (fn_wait)dlsym(w->lib, "nvmlEventSetWait");
    if (!w->handle_by_index || !w->memory_info || (wait_version != 0 && !w->wait)) {
        err = ENOSYS;
        goto fail;
    }

    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        err = errno;
        goto fail;
    }
    w->fd = pipefd[1];

    /* The thread starts with every signal blocked: signals are the main thread's business, and
     * NVML's calls are not interrupted by them. */
    {
        sigset_t all, old;
        pthread_attr_t attr;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_attr_init(&attr);
        err = pthread_create(&w->thread, &attr, thread_main, w);
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (err != 0) {
        close(pipefd[0]);
        close(pipefd[1]);
        w->fd = -1;
        goto fail;
    }
    *out = w;
    *fd = pipefd[0];
    return 0;

fail:
    release(w);
    return err;
}

/* Asks the thread to stop; returns at once. It notices within one wait timeout, or when the NVML
 * call it is in returns. */
EXPORT void gdp_watch_stop(struct gdp_watch *w)
{
    pthread_mutex_lock(&w->mu);
    __atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

/* Waits for the thread (call after the reader saw end-of-file: it is then about to return) and
 * frees the watch. */
EXPORT int gdp_watch_join(struct gdp_watch *w)
{
    int err = pthread_join(w->thread, NULL);
    release(w);
    return err;
}
