/*
 * nvml_access.c: the health thread's way into NVML (see README.md in this folder and nvml_watch.h).
 * NVML is never linked: its entry points are looked up in the already loaded library (dlopen
 * RTLD_NOLOAD), so the library builds without NVIDIA's headers and loads on a machine without a
 * driver. Here too the thread's set-up: a handle for every GPU and, when events are waited for, an
 * event set with each GPU's supported events registered in it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>

#include "nvml_watch.h"

/*
 * Opens the NVML library already loaded as `library` and finds the functions the probe, the event
 * set and the chosen wait (wait_version 2, 1 or 0: none) need. Returns 0, ENOENT (the library is
 * not loaded) or ENOSYS (it lacks a function the probe or the chosen wait needs); w->lib is set
 * whenever the library was opened, for the caller to close.
 */
int gdp_nvml_bind(struct gdp_watch *w, const char *library, int wait_version)
{
    w->lib = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    if (!w->lib)
        return ENOENT;
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
    if (!w->handle_by_index || !w->memory_info || (wait_version != 0 && !w->wait))
        return ENOSYS;
    return 0;
}

/*
 * Runs on the thread before its loop: looks up every GPU's handle (a GPU without one gets
 * GDP_REC_WARN_HANDLE and is reported by the probe) and, unless the watch only probes, creates the
 * event set and registers each GPU's supported XID and ECC events in it (and the events that ask for
 * an immediate read of the signals asked for), writing a record per GPU.
 * Returns 0 with *set (NULL when nothing is waited for) and *watched (GPUs registered), or -1 when
 * set-up failed (GDP_REC_FAILED already written; the thread ends).
 */
int gdp_nvml_open_events(struct gdp_watch *w, void **set, unsigned int *watched)
{
    *set = NULL;
    *watched = 0;
    for (unsigned int i = 0; i < w->count; i++) {
        int rc = w->handle_by_index(w->indices[i], &w->handles[i]);
        if (rc != NVML_SUCCESS) {
            w->handles[i] = NULL;
            gdp_put1(w, GDP_REC_WARN_HANDLE, (int32_t)i, GDP_FN_HANDLE_BY_INDEX, (uint32_t)rc);
        }
    }
    if (w->wait_version != 0) {
        if (!w->set_create || !w->supported || !w->register_events || !w->set_free) {
            gdp_put1(w, GDP_REC_FAILED, -1,
                     !w->set_create ? GDP_FN_SET_CREATE : !w->supported ? GDP_FN_SUPPORTED : GDP_FN_REGISTER,
                     NVML_ERROR_FUNCTION_NOT_FOUND);
            return -1;
        }
        int rc = w->set_create(set);
        if (rc != NVML_SUCCESS) {
            gdp_put1(w, GDP_REC_FAILED, -1, GDP_FN_SET_CREATE, (uint32_t)rc);
            return -1;
        }
        const unsigned long long wanted =
            EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC | gdp_signals_events(w);
        for (unsigned int i = 0; i < w->count; i++) {
            if (w->handles[i] == NULL)
                continue;
            unsigned long long supported = 0;
            rc = w->supported(w->handles[i], &supported);
            unsigned long long mask = rc == NVML_SUCCESS ? (supported & wanted) : 0;
            if (mask == 0) {
                gdp_put1(w, GDP_REC_UNSUPPORTED, (int32_t)i, 0, 0);
                continue;
            }
            rc = w->register_events(w->handles[i], mask, *set);
            if (rc == NVML_SUCCESS) {
                gdp_put1(w, GDP_REC_WATCHED, (int32_t)i, 0, 0);
                (*watched)++;
            } else {
                gdp_put1(w, GDP_REC_UNSUPPORTED, (int32_t)i, 0, 0);
                gdp_put1(w, GDP_REC_WARN_REGISTER, (int32_t)i, GDP_FN_REGISTER, (uint32_t)rc);
            }
        }
    }
    return 0;
}
