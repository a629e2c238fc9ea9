/*
 * watch_loop.c: the GPU health thread itself (see README.md in this folder and nvml_watch.h).
 *
 * One pthread per watch. It borrows the process's NVML session (the library the main thread
 * loaded and initialised; NVML is thread-safe) and, until asked to stop:
 *   - probes every GPU when due (nvmlDeviceGetMemoryInfo: GPU_IS_LOST when it fell off the bus),
 *     and reads the health signals asked for (signals.c) of every GPU,
 *   - blocks in nvmlEventSetWait(_v2) for at most wait_timeout_ms, then drains what is already
 *     queued (at most DRAIN_MAX events) and folds identical events into one entry with a count;
 *     an event that asks for a read of a GPU's signals has them read after its batch,
 *   - writes what it saw as fixed-size records (struct gdp_record) into a pipe, whose read end
 *     the main thread reads through its event loop.
 * Blocking NVML calls therefore never run on the event loop nor on libuv's shared thread pool.
 * A driver that stops answering (UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH) is
 * reported once and ends the thread; so does a stop request (an atomic flag, looked at after
 * every wait and probe). The last record is GDP_REC_STOPPED; the write end is closed after it, so
 * the reader sees end-of-file once the thread is about to return.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nvml_watch.h"

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

/* Writes n records, every byte (the reader may take a while: the pipe gives back-pressure). */
void gdp_put(struct gdp_watch *w, const void *records, size_t n)
{
    const char *p = (const char *)records;
    size_t left = n * sizeof(struct gdp_record);
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

/* Writes one record of `type` with these fields (the others zero). */
void gdp_put1(struct gdp_watch *w, uint32_t type, int32_t gpu, uint32_t func, uint32_t code)
{
    struct gdp_record r;
    memset(&r, 0, sizeof r);
    r.type = type;
    r.gpu = gpu;
    r.func = func;
    r.code = code;
    gdp_put(w, &r, 1);
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

/* Marks the GPU an event names (every GPU for none) for an immediate read of its signals. */
static void signals_due(struct gdp_watch *w, int32_t gpu)
{
    if (gpu >= 0)
        w->signals_due[gpu] = 1;
    else if (gpu == -1)
        memset(w->signals_due, 1, w->count);
}

/* Adds one event to the batch: identical ones (kind, GPU, and for XIDs the number, GI and CI) share
 * an entry and a count. The events that only prompt a read of the signals (their data is 0) mark
 * their GPU instead; XID 154 does both. */
static void fold(struct gdp_watch *w, const nvml_event_data_t *d)
{
    struct gdp_record r;
    memset(&r, 0, sizeof r);
    r.type = GDP_REC_EVENT;
    r.gpu = position(w, d->device);
    if (d->eventType == EVENT_RECOVERY_ACTION || d->eventType == EVENT_DRAM_RETIREMENT ||
        d->eventType == EVENT_DRAM_RETIREMENT_FAILURE) {
        signals_due(w, r.gpu);
        return;
    }
    if (d->eventType == EVENT_XID && d->eventData == XID_RECOVERY_ACTION && (w->signals & GDP_SIG_RECOVERY))
        signals_due(w, r.gpu);
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
    gdp_put(w, w->batch, w->batch_len + 1);
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
    gdp_put(w, w->probe, w->count);
    if (!gone) {
        struct gdp_record end;
        memset(&end, 0, sizeof end);
        end.type = GDP_REC_PROBE_END;
        gdp_put(w, &end, 1);
    }
    return gone;
}

/* Probes when due and waits for events until asked to stop or the driver is gone; the set-up
 * (gdp_nvml_open_events) has been done. */
static void watch(struct gdp_watch *w, void *set, unsigned int watched)
{
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
            gdp_signals_read(w, 1);
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
        gdp_signals_read(w, 0);
        if (driver_gone(rc)) {
            gone = rc;
            gone_func = w->wait_version == 2 ? GDP_FN_WAIT_V2 : GDP_FN_WAIT;
            gone_gpu = -1;
            break;
        }
        if (rc != NVML_SUCCESS && rc != NVML_ERROR_TIMEOUT) {
            gdp_put1(w, GDP_REC_WAIT_FAILED, -1, w->wait_version == 2 ? GDP_FN_WAIT_V2 : GDP_FN_WAIT, (uint32_t)rc);
            nap(w, w->wait_timeout_ms);
        }
    }
    if (gone)
        gdp_put1(w, GDP_REC_DRIVER_GONE, gone_gpu, gone_func, (uint32_t)gone);
    else if (set != NULL)
        w->set_free(set);
}

static void run(struct gdp_watch *w)
{
    void *set = NULL;
    unsigned int watched = 0;

    if (gdp_nvml_open_events(w, &set, &watched) != 0)
        return;
    gdp_put1(w, GDP_REC_READY, -1, 0, 0);
    watch(w, set, watched);
}

void *gdp_thread_main(void *arg)
{
    struct gdp_watch *w = arg;
    pthread_setname_np(pthread_self(), "nvml-events"); /* prctl: no file opened */
    run(w);
    gdp_put1(w, GDP_REC_STOPPED, -1, 0, 0);
    close(w->fd);
    w->fd = -1;
    return NULL;
}
