/*
 * nvml_watch.c: the library's exported entry points (see README.md in this folder and
 * nvml_watch.h): gdp_watch_start sets a watch up and starts its thread (watch_loop.c) with NVML's
 * functions found by nvml_access.c; gdp_watch_stop asks the thread to stop; gdp_watch_join waits
 * for it and frees the watch.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nvml_watch.h"

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
    free(w->signals_due);
    free(w->signals_out);
    free(w);
}

/*
 * Starts watching the GPUs with these NVML indices (positions in records are positions in this
 * list), through the NVML library already loaded as `library` (the name or path it was loaded by).
 * wait_version: 2 (nvmlEventSetWait_v2), 1 (nvmlEventSetWait) or 0 (no events: probes only).
 * signals: the health signals to read with every probe and when their events arrive (GDP_SIG_*;
 * 0: none, and no signals record is written).
 * Returns 0 with *out and *fd (the read end of the record pipe, close-on-exec, the caller's to
 * close), or an errno value (ENOENT: the library is not loaded; ENOSYS: it lacks a function the
 * probe or the chosen wait needs).
 */
EXPORT int gdp_watch_start(const char *library, const uint32_t *indices, uint32_t count,
                           uint32_t probe_interval_ms, uint32_t wait_timeout_ms, int32_t wait_version,
                           uint32_t signals, struct gdp_watch **out, int32_t *fd)
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
    w->signals = signals & 0xFFu;
    w->indices = calloc(count ? count : 1, sizeof *w->indices);
    w->handles = calloc(count ? count : 1, sizeof *w->handles);
    w->probe = calloc(count ? count : 1, sizeof *w->probe);
    w->batch = calloc(DRAIN_MAX + 1, sizeof *w->batch);
    w->slots = malloc(FOLD_SLOTS * sizeof *w->slots);
    w->signals_due = calloc(count ? count : 1, sizeof *w->signals_due);
    w->signals_out = calloc(count + 1, sizeof *w->signals_out);
    if (!w->indices || !w->handles || !w->probe || !w->batch || !w->slots || !w->signals_due || !w->signals_out) {
        err = ENOMEM;
        goto fail;
    }
    memcpy(w->indices, indices, count * sizeof *indices);
    memset(w->slots, 0xff, FOLD_SLOTS * sizeof w->slots[0]);

    err = gdp_nvml_bind(w, library, wait_version);
    if (err != 0)
        goto fail;
    gdp_signals_bind(w);

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
        err = pthread_create(&w->thread, &attr, gdp_thread_main, w);
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
