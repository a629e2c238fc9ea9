/*
 * signals.c: the health signals beyond XIDs (see README.md in this folder and nvml_watch.h). On the
 * health thread, for each GPU: the driver's recovery action (nvmlDeviceGetFieldValues, field 230),
 * row remapping, retired pages, volatile uncorrected ECC errors, the NVLink links active now, the
 * PCIe link width (current and maximum) and replay counter, and the clocks-event reasons, written
 * as one GDP_REC_SIGNALS record per GPU and a GDP_REC_SIGNALS_END. Every function is looked up on
 * its own: one the library lacks, or a call answering NOT_SUPPORTED, makes that signal unavailable
 * on that GPU, never an error. What the values mean is decided in src/core/health-signals.ts.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "nvml_watch.h"

void gdp_signals_bind(struct gdp_watch *w)
{
    w->field_values = (fn_field_values)dlsym(w->lib, "nvmlDeviceGetFieldValues");
    w->remapped_rows = (fn_remapped_rows)dlsym(w->lib, "nvmlDeviceGetRemappedRows");
    w->retired_pending = (fn_retired_pending)dlsym(w->lib, "nvmlDeviceGetRetiredPagesPendingStatus");
    w->retired_pages = (fn_retired_pages)dlsym(w->lib, "nvmlDeviceGetRetiredPages_v2");
    w->total_ecc = (fn_total_ecc)dlsym(w->lib, "nvmlDeviceGetTotalEccErrors");
    w->nvlink_state = (fn_nvlink_state)dlsym(w->lib, "nvmlDeviceGetNvLinkState");
    w->pcie_width = (fn_uint)dlsym(w->lib, "nvmlDeviceGetCurrPcieLinkWidth");
    w->pcie_max_width = (fn_uint)dlsym(w->lib, "nvmlDeviceGetMaxPcieLinkWidth");
    w->pcie_replays = (fn_uint)dlsym(w->lib, "nvmlDeviceGetPcieReplayCounter");
    /* The older name of the same call, for drivers before the rename. */
    w->clocks = (fn_ull)dlsym(w->lib, "nvmlDeviceGetCurrentClocksEventReasons");
    if (!w->clocks)
        w->clocks = (fn_ull)dlsym(w->lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
}

/* The event types that ask for an immediate read of the signals asked for. */
unsigned long long gdp_signals_events(const struct gdp_watch *w)
{
    unsigned long long types = 0;
    if (w->signals & GDP_SIG_RECOVERY)
        types |= EVENT_RECOVERY_ACTION;
    if (w->signals & (GDP_SIG_ROW_REMAP | GDP_SIG_RETIRED))
        types |= EVENT_DRAM_RETIREMENT | EVENT_DRAM_RETIREMENT_FAILURE;
    return types;
}

static uint16_t sat16(unsigned long long v)
{
    return v > 0xFFFFu ? 0xFFFFu : (uint16_t)v;
}

static uint32_t sat32(unsigned long long v)
{
    return v > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)v;
}

/* Records what a call answered: 1 when it gave a value; else the signal's bit goes to unavailable
 * (the driver lacks it) or failed (no value this time). */
static int answered(struct gdp_signals_record *r, uint8_t bit, int rc)
{
    if (rc == NVML_SUCCESS)
        return 1;
    if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_FUNCTION_NOT_FOUND)
        r->unavailable |= bit;
    else
        r->failed |= bit;
    return 0;
}

/* A field value as an unsigned number, by its type (negative values count as the largest). */
static unsigned long long field_number(const nvml_field_value_t *v)
{
    switch (v->valueType) {
    case 0:
        return v->value.dVal < 0 ? ~0ULL : (unsigned long long)v->value.dVal;
    case 1:
        return v->value.uiVal;
    case 2:
        return v->value.ulVal;
    case 3:
        return v->value.ullVal;
    case 4:
        return v->value.sllVal < 0 ? ~0ULL : (unsigned long long)v->value.sllVal;
    case 5:
        return v->value.siVal < 0 ? ~0ULL : (unsigned long long)v->value.siVal;
    case 6:
        return v->value.usVal;
    default:
        return v->value.uiVal;
    }
}

static void read_recovery(struct gdp_watch *w, void *h, struct gdp_signals_record *r)
{
    nvml_field_value_t v;
    if (!w->field_values) {
        r->unavailable |= GDP_SIG_RECOVERY;
        return;
    }
    memset(&v, 0, sizeof v);
    v.fieldId = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
    if (!answered(r, GDP_SIG_RECOVERY, w->field_values(h, 1, &v)))
        return;
    /* The field's own answer: a driver that does not know the field says so here. */
    if (v.nvmlReturn != NVML_SUCCESS) {
        int known = v.nvmlReturn == NVML_ERROR_NOT_SUPPORTED || v.nvmlReturn == NVML_ERROR_FUNCTION_NOT_FOUND ||
                    v.nvmlReturn == NVML_ERROR_INVALID_ARGUMENT;
        answered(r, GDP_SIG_RECOVERY, known ? NVML_ERROR_NOT_SUPPORTED : v.nvmlReturn);
        return;
    }
    unsigned long long action = field_number(&v);
    r->recovery_action = action > 0xFF ? 0xFF : (uint8_t)action;
}

static void read_memory(struct gdp_watch *w, void *h, struct gdp_signals_record *r)
{
    if (w->signals & GDP_SIG_ROW_REMAP) {
        unsigned int corrected = 0, uncorrected = 0, pending = 0, failure = 0;
        if (!w->remapped_rows)
            r->unavailable |= GDP_SIG_ROW_REMAP;
        else if (answered(r, GDP_SIG_ROW_REMAP, w->remapped_rows(h, &corrected, &uncorrected, &pending, &failure))) {
            r->remap_corrected = sat16(corrected);
            r->remap_uncorrected = sat16(uncorrected);
            r->flags |= (pending ? GDP_SIGF_REMAP_PENDING : 0) | (failure ? GDP_SIGF_REMAP_FAILURE : 0);
        }
    }
    if (w->signals & GDP_SIG_RETIRED) {
        int pending = 0;
        if (!w->retired_pending || !w->retired_pages) {
            r->unavailable |= GDP_SIG_RETIRED;
        } else if (answered(r, GDP_SIG_RETIRED, w->retired_pending(h, &pending))) {
            unsigned int counts[2] = { 0, 0 };
            for (int cause = 0; cause < 2; cause++) {
                int rc = w->retired_pages(h, cause, &counts[cause], NULL, NULL);
                if (!answered(r, GDP_SIG_RETIRED, rc == NVML_ERROR_INSUFFICIENT_SIZE ? NVML_SUCCESS : rc))
                    return;
            }
            r->retired_sbe = sat16(counts[0]);
            r->retired_dbe = sat16(counts[1]);
            r->flags |= pending ? GDP_SIGF_RETIRED_PENDING : 0;
        }
    }
    if (w->signals & GDP_SIG_ECC) {
        unsigned long long n = 0;
        if (!w->total_ecc)
            r->unavailable |= GDP_SIG_ECC;
        else if (answered(r, GDP_SIG_ECC, w->total_ecc(h, 1 /* UNCORRECTED */, 0 /* VOLATILE */, &n)))
            r->ecc_volatile = sat32(n);
    }
}

/* Links 0.. until NVML says there are no more; a GPU without NVLink: unavailable. */
static void read_nvlink(struct gdp_watch *w, void *h, struct gdp_signals_record *r)
{
    if (!w->nvlink_state) {
        r->unavailable |= GDP_SIG_NVLINK;
        return;
    }
    for (unsigned int link = 0; link < GDP_MAX_LINKS; link++) {
        int active = 0;
        int rc = w->nvlink_state(h, link, &active);
        if (rc == NVML_ERROR_INVALID_ARGUMENT || (rc == NVML_ERROR_NOT_SUPPORTED && link > 0))
            break;
        if (!answered(r, GDP_SIG_NVLINK, rc))
            return;
        r->nvlink_links |= 1u << link;
        if (active)
            r->nvlink_active |= 1u << link;
    }
    if (r->nvlink_links == 0)
        r->unavailable |= GDP_SIG_NVLINK;
}

static void read_pcie_and_clocks(struct gdp_watch *w, void *h, struct gdp_signals_record *r)
{
    if (w->signals & GDP_SIG_PCIE_WIDTH) {
        unsigned int cur = 0, max = 0;
        if (!w->pcie_width || !w->pcie_max_width)
            r->unavailable |= GDP_SIG_PCIE_WIDTH;
        else if (answered(r, GDP_SIG_PCIE_WIDTH, w->pcie_width(h, &cur)) &&
                 answered(r, GDP_SIG_PCIE_WIDTH, w->pcie_max_width(h, &max))) {
            r->pcie_width = cur > 0xFF ? 0xFF : (uint8_t)cur;
            r->pcie_max_width = max > 0xFF ? 0xFF : (uint8_t)max;
        }
    }
    if (w->signals & GDP_SIG_PCIE_REPLAY) {
        unsigned int n = 0;
        if (!w->pcie_replays)
            r->unavailable |= GDP_SIG_PCIE_REPLAY;
        else if (answered(r, GDP_SIG_PCIE_REPLAY, w->pcie_replays(h, &n)))
            r->pcie_replays = n;
    }
    if (w->signals & GDP_SIG_CLOCKS) {
        unsigned long long reasons = 0;
        if (!w->clocks)
            r->unavailable |= GDP_SIG_CLOCKS;
        else if (answered(r, GDP_SIG_CLOCKS, w->clocks(h, &reasons)))
            r->clocks = (uint16_t)(reasons & 0xFFFFu);
    }
}

/* One GPU's signals record. Signals not asked for are marked failed (not read). */
static void read_gpu(struct gdp_watch *w, unsigned int i, struct gdp_signals_record *r)
{
    void *h = w->handles[i];
    memset(r, 0, sizeof *r);
    r->type = GDP_REC_SIGNALS;
    r->gpu = (int32_t)i;
    r->failed = (uint8_t)~w->signals;
    if (h == NULL) {
        r->failed = 0xFF;
        return;
    }
    if (w->signals & GDP_SIG_RECOVERY)
        read_recovery(w, h, r);
    read_memory(w, h, r);
    if (w->signals & GDP_SIG_NVLINK)
        read_nvlink(w, h, r);
    read_pcie_and_clocks(w, h, r);
}

void gdp_signals_read(struct gdp_watch *w, int all)
{
    uint32_t n = 0;
    if (w->signals == 0)
        return;
    for (unsigned int i = 0; i < w->count; i++) {
        if (!all && !w->signals_due[i])
            continue;
        w->signals_due[i] = 0;
        read_gpu(w, i, &w->signals_out[n++]);
    }
    if (n == 0)
        return;
    struct gdp_signals_record *end = &w->signals_out[n];
    memset(end, 0, sizeof *end);
    end->type = GDP_REC_SIGNALS_END;
    end->gpu = -1;
    gdp_put(w, w->signals_out, n + 1);
}
