/*
 * fake_health.h: the health states of the fake NVML beyond XIDs. Not a header of its own: it is
 * included once, at the end of fake_nvml.c (after fake_mig.h), and is part of that translation unit.
 *
 * Calls, with nvml.h's signatures:
 *   nvmlDeviceGetFieldValues          field 230 (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) with its own
 *                                     nvmlReturn and valueType; any other field: NOT_SUPPORTED in
 *                                     that value; the old driver does not know field 230 either
 *   nvmlDeviceGetRemappedRows         NOT_SUPPORTED on boards before Ampere and on a MIG-enabled GPU
 *                                     with instances; absent from the old driver
 *   nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRetiredPages_v2 (cause 0 multiple
 *                                     single-bit, 1 double-bit; *pageCount too small: the count and
 *                                     INSUFFICIENT_SIZE)  NOT_SUPPORTED on Ampere and later; _v2
 *                                     absent from the old driver
 *   nvmlDeviceGetTotalEccErrors       (CORRECTED 0 | UNCORRECTED 1, VOLATILE 0 | AGGREGATE 1)
 *   nvmlDeviceGetNvLinkState          (fake_nvml.c) answers DISABLED for a link set down here
 *   nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth, nvmlDeviceGetPcieReplayCounter
 *   nvmlDeviceGetCurrentClocksEventReasons (absent from the old driver) and its older name
 *   nvmlDeviceGetCurrentClocksThrottleReasons
 * Events DramRetirementEvent 0x400, DramRetirementFailure 0x800 and GpuRecoveryAction 0x8000 are
 * supported where the GPU's "events" list names "retirement", "retirement-failure",
 * "recovery-action"; their event data is 0.
 *
 * Fixture ("gpus[i].health", every key optional; default: a healthy GPU at x16 of x16):
 *   recoveryAction n, recoveryActionValueType 0..6 (nvmlValueType_t; default 1 UNSIGNED_INT),
 *   remappedRows {corrected, uncorrected, pending, failure}, retiredPages {singleBit, doubleBit,
 *   pending}, ecc {volatileUncorrected, aggregateUncorrected, volatileCorrected,
 *   aggregateCorrected}, nvlinkDown [link...], pcieWidth, pcieMaxWidth, pcieReplays,
 *   clocksEventReasons, unsupported [call...] (NOT_SUPPORTED; replaces the board's default) and
 *   missing [call...] (FUNCTION_NOT_FOUND). Calls are named "recovery-action", "row-remap",
 *   "retired-pages", "ecc", "nvlink", "pcie-width", "pcie-replay", "clocks".
 * Control FIFO:
 *   health <index|all> [quiet] <key>=<value>...
 *     recovery-action=N                               fires 0x8000
 *     remap-corrected=N remap-uncorrected=N remap-pending=0|1
 *     retired-sbe=N retired-dbe=N retired-pending=0|1  fire 0x400
 *     remap-failure=0|1                               fires 0x800 when set, 0x400 when cleared
 *     ecc-volatile=N ecc-aggregate=N                  (uncorrected; no event)
 *     nvlink-down=<link>[.<link>...]|none  pcie-width=N  pcie-max-width=N  pcie-replays=N
 *     clocks=N (0x... allowed)  unsupported=<call>[,<call>...]|none  missing=...|none
 *   health <index|all> [quiet] reset                  what a GPU reset does: pending flags and the
 *                                                     recovery action cleared, volatile ECC zeroed,
 *                                                     links up (fires 0x8000 and 0x400)
 *   health <index|all> [quiet] clear                  back to the fixture's state (fires all three)
 *   quiet: change the state without an event (as a driver without these events would).
 * Like MIG layouts, a state set through the FIFO outlives nvmlShutdown/nvmlInit for the GPU with
 * that UUID.
 */

#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230

typedef enum nvmlValueType_enum {
    NVML_VALUE_TYPE_DOUBLE = 0,
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG = 2,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4,
    NVML_VALUE_TYPE_SIGNED_INT = 5,
    NVML_VALUE_TYPE_UNSIGNED_SHORT = 6,
    NVML_VALUE_TYPE_COUNT
} nvmlValueType_t;

typedef union nvmlValue_st {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    nvmlValueType_t valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

_Static_assert(sizeof(nvmlValue_t) == 8, "nvmlValue_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values);
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending);
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                               unsigned long long *eccCounts);
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth);
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth);
EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value);
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons);
#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                             unsigned int *isPending, unsigned int *failureOccurred);
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause, unsigned int *pageCount,
                                                unsigned long long *addresses, unsigned long long *timestamps);
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons);
#endif

/* The calls a state can be made unsupported or missing for (bits of unsupported/missing). */
enum {
    HC_RECOVERY = 1 << 0,
    HC_REMAP = 1 << 1,
    HC_RETIRED = 1 << 2,
    HC_ECC = 1 << 3,
    HC_NVLINK = 1 << 4,
    HC_PCIE_WIDTH = 1 << 5,
    HC_PCIE_REPLAY = 1 << 6,
    HC_CLOCKS = 1 << 7,
};
static const char *const g_hc_names[] = { "recovery-action", "row-remap", "retired-pages", "ecc",
                                          "nvlink", "pcie-width", "pcie-replay", "clocks", NULL };

struct fake_health {
    unsigned int recovery_action, recovery_type;
    unsigned int remap_corrected, remap_uncorrected, remap_pending, remap_failure;
    unsigned int retired_sbe, retired_dbe, retired_pending;
    unsigned long long ecc[2][2]; /* [errorType][counterType] */
    unsigned long long nvlink_down; /* bit per link */
    unsigned int pcie_width, pcie_max_width, pcie_replays;
    unsigned long long clocks;
    unsigned int unsupported, missing; /* HC_* */
};

/* By configured index, like the MIG state (fake_mig.h): the fixture's, and the live one. */
static struct fake_health g_health[FAKE_MAX_GPUS];
static struct fake_health g_health_stage[FAKE_MAX_GPUS];
static char g_health_changed[FAKE_MAX_GPUS][FAKE_UUID_SIZE];

static void health_commit_stage(void)
{
    unsigned int c;

    for (c = 0; c < FAKE_MAX_GPUS; c++) {
        if (c < g_conf_count && g_health_changed[c][0] && strcmp(g_health_changed[c], g_conf[c].uuid) == 0)
            continue;
        g_health[c] = g_health_stage[c];
        g_health_changed[c][0] = '\0';
    }
}

static struct fake_health *health_of(unsigned int live)
{
    return &g_health[CONF(live)];
}

/* Boards before Ampere retire pages and have no row remapping; Ampere and later the other way. */
static unsigned int default_unsupported(const char *name)
{
    int old = strstr(name, "V100") || strstr(name, "P100") || strstr(name, "T4");

    return old ? HC_REMAP : HC_RETIRED;
}

static nvmlReturn_t health_names(const json_value *v, const char *key, unsigned int *out)
{
    size_t i;
    int k;

    if (v->type != JSON_ARRAY)
        return config_error(key, "expected an array of call names, got %s", json_type_name(v->type));
    *out = 0;
    for (i = 0; i < v->count; i++) {
        for (k = 0; g_hc_names[k]; k++)
            if (v->items[i]->type == JSON_STRING && strcmp(v->items[i]->string, g_hc_names[k]) == 0)
                break;
        if (!g_hc_names[k])
            return config_error(key, "item %zu: expected one of recovery-action, row-remap, retired-pages, ecc, "
                                     "nvlink, pcie-width, pcie-replay, clocks", i);
        *out |= 1u << k;
    }
    return NVML_SUCCESS;
}

/* Reads the integer or boolean members of an object into `out` (unsigned ints, or 64-bit when wide). */
static nvmlReturn_t health_members(const json_value *v, const char *key, const char *const *names, void *const *out,
                                   int wide)
{
    char sub[128];
    nvmlReturn_t r;
    size_t i;

    if (v->type != JSON_OBJECT)
        return config_error(key, "expected an object, got %s", json_type_name(v->type));
    if ((r = check_keys(v, key, names)) != NVML_SUCCESS)
        return r;
    for (i = 0; names[i]; i++) {
        const json_value *m = json_object_get(v, names[i]);
        long long n;

        if (!m)
            continue;
        snprintf(sub, sizeof sub, "%s.%s", key, names[i]);
        if (m->type == JSON_BOOL)
            n = m->boolean;
        else if ((r = get_integer(m, sub, 0, wide ? LLONG_MAX : 0xFFFFFFFFLL, &n)) != NVML_SUCCESS)
            return r;
        if (wide)
            *(unsigned long long *)out[i] = (unsigned long long)n;
        else
            *(unsigned int *)out[i] = (unsigned int)n;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t health_scalar(const json_value *h, const char *gpu_key, const char *name, long long max,
                                  unsigned long long *out)
{
    const json_value *v = json_object_get(h, name);
    char key[128];
    long long n;
    nvmlReturn_t r;

    if (!v)
        return NVML_SUCCESS;
    snprintf(key, sizeof key, "%s.%s", gpu_key, name);
    if ((r = get_integer(v, key, 0, max, &n)) != NVML_SUCCESS)
        return r;
    *out = (unsigned long long)n;
    return NVML_SUCCESS;
}

static nvmlReturn_t health_load_gpu(const json_value *g, unsigned int index)
{
    static const char *const allowed[] = { "recoveryAction", "recoveryActionValueType", "remappedRows", "retiredPages",
                                           "ecc", "nvlinkDown", "pcieWidth", "pcieMaxWidth", "pcieReplays",
                                           "clocksEventReasons", "unsupported", "missing", NULL };
    static const char *const remap[] = { "corrected", "uncorrected", "pending", "failure", NULL };
    static const char *const retired[] = { "singleBit", "doubleBit", "pending", NULL };
    static const char *const ecc[] = { "volatileUncorrected", "aggregateUncorrected", "volatileCorrected",
                                       "aggregateCorrected", NULL };
    struct fake_health *h = &g_health_stage[index];
    const json_value *v, *x;
    unsigned long long n;
    char key[96], sub[128];
    nvmlReturn_t r;
    size_t i;

    memset(h, 0, sizeof *h);
    h->recovery_type = NVML_VALUE_TYPE_UNSIGNED_INT;
    h->pcie_width = h->pcie_max_width = 16;
    h->unsupported = default_unsupported(g_stage.gpus[index].name);
    if (!(v = json_object_get(g, "health")))
        return NVML_SUCCESS;
    snprintf(key, sizeof key, "gpus[%u].health", index);
    if (v->type != JSON_OBJECT)
        return config_error(key, "expected an object, got %s", json_type_name(v->type));
    if ((r = check_keys(v, key, allowed)) != NVML_SUCCESS)
        return r;
    n = h->recovery_action;
    if ((r = health_scalar(v, key, "recoveryAction", 0xFFFF, &n)) != NVML_SUCCESS)
        return r;
    h->recovery_action = (unsigned int)n;
    n = h->recovery_type;
    if ((r = health_scalar(v, key, "recoveryActionValueType", NVML_VALUE_TYPE_COUNT - 1, &n)) != NVML_SUCCESS)
        return r;
    h->recovery_type = (unsigned int)n;
    snprintf(sub, sizeof sub, "%s.remappedRows", key);
    if ((x = json_object_get(v, "remappedRows")) &&
        (r = health_members(x, sub, remap,
                            (void *const[]){ &h->remap_corrected, &h->remap_uncorrected, &h->remap_pending,
                                             &h->remap_failure },
                            0)) != NVML_SUCCESS)
        return r;
    snprintf(sub, sizeof sub, "%s.retiredPages", key);
    if ((x = json_object_get(v, "retiredPages")) &&
        (r = health_members(x, sub, retired,
                            (void *const[]){ &h->retired_sbe, &h->retired_dbe, &h->retired_pending }, 0)) !=
            NVML_SUCCESS)
        return r;
    snprintf(sub, sizeof sub, "%s.ecc", key);
    if ((x = json_object_get(v, "ecc")) &&
        (r = health_members(x, sub, ecc, (void *const[]){ &h->ecc[1][0], &h->ecc[1][1], &h->ecc[0][0], &h->ecc[0][1] },
                            1)) != NVML_SUCCESS)
        return r;
    if ((x = json_object_get(v, "nvlinkDown"))) {
        snprintf(sub, sizeof sub, "%s.nvlinkDown", key);
        if (x->type != JSON_ARRAY)
            return config_error(sub, "expected an array of link numbers");
        for (i = 0; i < x->count; i++) {
            long long link;

            if ((r = get_integer(x->items[i], sub, 0, FAKE_MAX_LINKS - 1, &link)) != NVML_SUCCESS)
                return r;
            h->nvlink_down |= 1ULL << link;
        }
    }
    n = h->pcie_width;
    if ((r = health_scalar(v, key, "pcieWidth", 32, &n)) != NVML_SUCCESS)
        return r;
    h->pcie_width = (unsigned int)n;
    n = h->pcie_max_width;
    if ((r = health_scalar(v, key, "pcieMaxWidth", 32, &n)) != NVML_SUCCESS)
        return r;
    h->pcie_max_width = (unsigned int)n;
    n = 0;
    if ((r = health_scalar(v, key, "pcieReplays", 0xFFFFFFFFLL, &n)) != NVML_SUCCESS)
        return r;
    h->pcie_replays = (unsigned int)n;
    if ((r = health_scalar(v, key, "clocksEventReasons", LLONG_MAX, &h->clocks)) != NVML_SUCCESS)
        return r;
    snprintf(sub, sizeof sub, "%s.unsupported", key);
    if ((x = json_object_get(v, "unsupported")) && (r = health_names(x, sub, &h->unsupported)) != NVML_SUCCESS)
        return r;
    snprintf(sub, sizeof sub, "%s.missing", key);
    if ((x = json_object_get(v, "missing")) && (r = health_names(x, sub, &h->missing)) != NVML_SUCCESS)
        return r;
    return NVML_SUCCESS;
}

/* Whether a link of a live GPU was set down (nvmlDeviceGetNvLinkState). g_mu held. */
static int health_link_down(const struct fake_device *d, unsigned int link)
{
    return link < 64 && (health_of(d->index)->nvlink_down & (1ULL << link)) != 0;
}

/* NVLink calls on a GPU whose NVLink state is unsupported or missing: that answer, else SUCCESS. */
static nvmlReturn_t health_nvlink_answer(const struct fake_device *d)
{
    const struct fake_health *h = health_of(d->index);

    return (h->missing & HC_NVLINK) ? NVML_ERROR_FUNCTION_NOT_FOUND
           : (h->unsupported & HC_NVLINK) ? NVML_ERROR_NOT_SUPPORTED
                                            : NVML_SUCCESS;
}

/* Prologue of the health calls: enter_device, then the state's missing/unsupported answer. Returns
 * with g_mu held only on success. */
static nvmlReturn_t enter_health(nvmlDevice_t device, int arguments_ok, unsigned int call, struct fake_health **out)
{
    struct fake_device *d;
    nvmlReturn_t r;

    if ((r = enter_device(device, arguments_ok, &d)) != NVML_SUCCESS)
        return r;
    *out = health_of(d->index);
    if ((*out)->missing & call)
        return leave(NVML_ERROR_FUNCTION_NOT_FOUND);
    if ((*out)->unsupported & call)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

static __attribute__((unused)) void put_value(nvmlFieldValue_t *f, unsigned int type, unsigned int n)
{
    f->valueType = (nvmlValueType_t)type;
    memset(&f->value, 0, sizeof f->value);
    switch (type) {
    case NVML_VALUE_TYPE_DOUBLE:
        f->value.dVal = n;
        break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG:
        f->value.ulVal = n;
        break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        f->value.ullVal = n;
        break;
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        f->value.sllVal = n;
        break;
    case NVML_VALUE_TYPE_SIGNED_INT:
        f->value.siVal = (int)n;
        break;
    case NVML_VALUE_TYPE_UNSIGNED_SHORT:
        f->value.usVal = (unsigned short)n;
        break;
    default:
        f->value.uiVal = n;
        break;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    struct fake_device *d;
    struct fake_health *h;
    struct timespec now;
    nvmlReturn_t r;
    int i;

    COUNT_CALL(nvmlDeviceGetFieldValues);
    if ((r = enter_device(device, values != NULL && valuesCount > 0, &d)) != NVML_SUCCESS)
        return r;
    h = health_of(d->index);
    if (h->missing & HC_RECOVERY)
        return leave(NVML_ERROR_FUNCTION_NOT_FOUND);
    clock_gettime(CLOCK_REALTIME, &now);
    for (i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *f = &values[i];

        f->timestamp = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
        f->latencyUsec = 0;
#ifdef FAKE_OLD_DRIVER
        f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; /* drivers before R570 do not know field 230 */
#else
        if (f->fieldId != NVML_FI_DEV_GET_GPU_RECOVERY_ACTION || (h->unsupported & HC_RECOVERY)) {
            f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        f->nvmlReturn = NVML_SUCCESS;
        put_value(f, h->recovery_type, h->recovery_action);
#endif
    }
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                             unsigned int *isPending, unsigned int *failureOccurred)
{
    struct fake_health *h;
    const struct fake_mig_gpu *m;
    nvmlReturn_t r;
    unsigned int s;

    COUNT_CALL(nvmlDeviceGetRemappedRows);
    if ((r = enter_health(device, corrRows && uncRows && isPending && failureOccurred, HC_REMAP, &h)) != NVML_SUCCESS)
        return r;
    m = mig_gpu(device_from_handle(device)->index);
    for (s = 0; m->current && s < FAKE_MAX_MIGS; s++)
        if (m->migs[s].used)
            return leave(NVML_ERROR_NOT_SUPPORTED); /* a MIG-enabled GPU with instances */
    *corrRows = h->remap_corrected;
    *uncRows = h->remap_uncorrected;
    *isPending = h->remap_pending;
    *failureOccurred = h->remap_failure;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause, unsigned int *pageCount,
                                                unsigned long long *addresses, unsigned long long *timestamps)
{
    struct fake_health *h;
    unsigned int n, i;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetRetiredPages_v2);
    if ((r = enter_health(device, (cause == 0 || cause == 1) && pageCount != NULL &&
                                      (*pageCount == 0 || addresses != NULL),
                          HC_RETIRED, &h)) != NVML_SUCCESS)
        return r;
    n = cause == 0 ? h->retired_sbe : h->retired_dbe;
    if (*pageCount < n) {
        *pageCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i = 0; i < n; i++) {
        addresses[i] = 0x100000ULL * (unsigned long long)(cause + 1) + 0x1000ULL * i;
        if (timestamps)
            timestamps[i] = 1700000000ULL + i;
    }
    *pageCount = n;
    return leave(NVML_SUCCESS);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    struct fake_health *h;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetRetiredPagesPendingStatus);
    if ((r = enter_health(device, isPending != NULL, HC_RETIRED, &h)) != NVML_SUCCESS)
        return r;
    *isPending = h->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}

/* NOT_SUPPORTED with ECC mode off (the "ecc" call unsupported). */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                               unsigned long long *eccCounts)
{
    struct fake_health *h;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetTotalEccErrors);
    if ((r = enter_health(device, (errorType == 0 || errorType == 1) && (counterType == 0 || counterType == 1) &&
                                      eccCounts != NULL,
                          HC_ECC, &h)) != NVML_SUCCESS)
        return r;
    *eccCounts = h->ecc[errorType][counterType];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t pcie_width(nvmlDevice_t device, unsigned int *out, int max)
{
    struct fake_health *h;
    nvmlReturn_t r;

    if ((r = enter_health(device, out != NULL, HC_PCIE_WIDTH, &h)) != NVML_SUCCESS)
        return r;
    *out = max ? h->pcie_max_width : h->pcie_width;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    COUNT_CALL(nvmlDeviceGetCurrPcieLinkWidth);
    return pcie_width(device, currLinkWidth, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    COUNT_CALL(nvmlDeviceGetMaxPcieLinkWidth);
    return pcie_width(device, maxLinkWidth, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    struct fake_health *h;
    nvmlReturn_t r;

    COUNT_CALL(nvmlDeviceGetPcieReplayCounter);
    if ((r = enter_health(device, value != NULL, HC_PCIE_REPLAY, &h)) != NVML_SUCCESS)
        return r;
    *value = h->pcie_replays;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t clocks_reasons(nvmlDevice_t device, unsigned long long *reasons)
{
    struct fake_health *h;
    nvmlReturn_t r;

    if ((r = enter_health(device, reasons != NULL, HC_CLOCKS, &h)) != NVML_SUCCESS)
        return r;
    *reasons = h->clocks;
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    COUNT_CALL(nvmlDeviceGetCurrentClocksEventReasons);
    return clocks_reasons(device, reasons);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    COUNT_CALL(nvmlDeviceGetCurrentClocksThrottleReasons);
    return clocks_reasons(device, reasons);
}

/* ---- Control FIFO ------------------------------------------------------------------------- */

static int health_calls(const char *s, unsigned int *out)
{
    char buf[160], *save = NULL, *tok;
    int k;

    *out = 0;
    if (strcmp(s, "none") == 0)
        return 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        for (k = 0; g_hc_names[k] && strcmp(tok, g_hc_names[k]) != 0; k++)
            ;
        if (!g_hc_names[k])
            return -1;
        *out |= 1u << k;
    }
    return 0;
}

static int health_links(const char *s, unsigned long long *out)
{
    char buf[160], *save = NULL, *tok;
    unsigned long long link;

    *out = 0;
    if (strcmp(s, "none") == 0)
        return 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (tok = strtok_r(buf, ".,", &save); tok; tok = strtok_r(NULL, ".,", &save)) {
        if (parse_u64(tok, &link) < 0 || link >= FAKE_MAX_LINKS)
            return -1;
        *out |= 1ULL << link;
    }
    return 0;
}

/* Applies one key=value to h; returns the events it fires, or -1 (with *why) when malformed. */
static long long health_set(struct fake_health *h, const char *item, const char **why)
{
    static const struct {
        const char *key;
        size_t offset;
        unsigned long long event, max;
    } keys[] = {
        { "recovery-action", offsetof(struct fake_health, recovery_action), nvmlEventTypeGpuRecoveryAction, 0xFFFF },
        { "remap-corrected", offsetof(struct fake_health, remap_corrected), nvmlEventTypeDramRetirementEvent,
          UINT_MAX },
        { "remap-uncorrected", offsetof(struct fake_health, remap_uncorrected), nvmlEventTypeDramRetirementEvent,
          UINT_MAX },
        { "remap-pending", offsetof(struct fake_health, remap_pending), nvmlEventTypeDramRetirementEvent, 1 },
        { "remap-failure", offsetof(struct fake_health, remap_failure), nvmlEventTypeDramRetirementFailure, 1 },
        { "retired-sbe", offsetof(struct fake_health, retired_sbe), nvmlEventTypeDramRetirementEvent, UINT_MAX },
        { "retired-dbe", offsetof(struct fake_health, retired_dbe), nvmlEventTypeDramRetirementEvent, UINT_MAX },
        { "retired-pending", offsetof(struct fake_health, retired_pending), nvmlEventTypeDramRetirementEvent, 1 },
        { "pcie-width", offsetof(struct fake_health, pcie_width), 0, 32 },
        { "pcie-max-width", offsetof(struct fake_health, pcie_max_width), 0, 32 },
        { "pcie-replays", offsetof(struct fake_health, pcie_replays), 0, UINT_MAX },
    };
    const char *eq = strchr(item, '=');
    unsigned long long n;
    char key[40];
    size_t i;

    if (!eq || (size_t)(eq - item) >= sizeof key) {
        *why = "expected <key>=<value>";
        return -1;
    }
    snprintf(key, sizeof key, "%.*s", (int)(eq - item), item);
    if (strcmp(key, "nvlink-down") == 0) {
        if (health_links(eq + 1, &h->nvlink_down) == 0)
            return 0;
        *why = "nvlink-down: link numbers joined by '.', or none";
        return -1;
    }
    if (strcmp(key, "unsupported") == 0 || strcmp(key, "missing") == 0) {
        if (health_calls(eq + 1, key[0] == 'u' ? &h->unsupported : &h->missing) == 0)
            return 0;
        *why = "calls: recovery-action, row-remap, retired-pages, ecc, nvlink, pcie-width, pcie-replay, clocks "
               "(comma-separated), or none";
        return -1;
    }
    if (parse_u64(eq + 1, &n) < 0) {
        *why = "the value must be a number";
        return -1;
    }
    if (strcmp(key, "ecc-volatile") == 0 || strcmp(key, "ecc-aggregate") == 0) {
        h->ecc[1][key[4] == 'v' ? 0 : 1] = n;
        return 0;
    }
    if (strcmp(key, "clocks") == 0) {
        h->clocks = n;
        return 0;
    }
    for (i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strcmp(key, keys[i].key) != 0)
            continue;
        if (n > keys[i].max) {
            *why = "value out of range";
            return -1;
        }
        *(unsigned int *)((char *)h + keys[i].offset) = (unsigned int)n;
        if (keys[i].event == nvmlEventTypeDramRetirementFailure && n == 0)
            return (long long)nvmlEventTypeDramRetirementEvent;
        return (long long)keys[i].event;
    }
    *why = "unknown key";
    return -1;
}

/* What a GPU reset does to these states. */
static void health_reset(struct fake_health *h)
{
    h->recovery_action = 0;
    h->remap_pending = 0;
    h->retired_pending = 0;
    h->ecc[0][0] = h->ecc[1][0] = 0;
    h->nvlink_down = 0;
}

/* "health <index|all> [quiet] <key>=<value>... | reset | clear". g_mu held. */
static void health_command(const char *original, char *args)
{
    static const char usage[] = "usage: health <index|all> [quiet] <key>=<value>... | reset | clear";
    char *tokens[24], *save = NULL, *tok;
    int ntok = 0, gpu, quiet = 0, first = 1, i;
    unsigned int g, from, to;

    for (tok = strtok_r(args, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        if (ntok == (int)(sizeof tokens / sizeof tokens[0])) {
            control_complain(original, "too many settings");
            return;
        }
        tokens[ntok++] = tok;
    }
    if (ntok < 2 || parse_gpu_token(original, tokens[0], 1, &gpu) < 0) {
        if (ntok < 2)
            control_complain(original, usage);
        return;
    }
    if (strcmp(tokens[1], "quiet") == 0) {
        quiet = 1;
        first = 2;
    }
    if (first >= ntok) {
        control_complain(original, usage);
        return;
    }
    from = gpu < 0 ? 0 : (unsigned int)gpu;
    to = gpu < 0 ? g_gpu_count : (unsigned int)gpu + 1;
    for (g = from; g < to; g++) {
        struct fake_health next = *health_of(g);
        unsigned long long events = 0;

        if (strcmp(tokens[first], "reset") == 0 && ntok == first + 1) {
            health_reset(&next);
            events = nvmlEventTypeGpuRecoveryAction | nvmlEventTypeDramRetirementEvent;
        } else if (strcmp(tokens[first], "clear") == 0 && ntok == first + 1) {
            next = g_health_stage[CONF(g)];
            events = nvmlEventTypeGpuRecoveryAction | nvmlEventTypeDramRetirementEvent |
                     nvmlEventTypeDramRetirementFailure;
        } else {
            for (i = first; i < ntok; i++) {
                const char *why = NULL;
                long long e = health_set(&next, tokens[i], &why);

                if (e < 0) {
                    control_complain(original, why);
                    return;
                }
                events |= (unsigned long long)e;
            }
        }
        *health_of(g) = next;
        snprintf(g_health_changed[CONF(g)], FAKE_UUID_SIZE, "%s", g_devs[g].uuid);
        for (i = 0; !quiet && i < 64; i++)
            if (events & (1ULL << i))
                post_event_mig((int)g, 1ULL << i, 0, FAKE_NO_INSTANCE, FAKE_NO_INSTANCE);
    }
}
