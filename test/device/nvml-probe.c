/* Reads, on a real driver, every NVML state the health signals are built from, one line per read
 * with the call's own return code, so that a run beside `nvidia-smi -q` shows what this driver and
 * GPU answer (SUCCESS, NOT_SUPPORTED, a value). Loads NVML with dlopen, as the plugin does. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef void *dev_t_;
typedef union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; unsigned short us; } value_t;
typedef struct {
  unsigned fieldId, scopeId;
  long long timestamp, latencyUsec;
  int valueType, nvmlReturn;
  value_t value;
} field_value_t;

static void *lib;
static const char *(*err_str)(int);
#define SYM(name) dlsym(lib, name)
static const char *rc(int r) { return r == -1 ? "symbol missing" : err_str ? err_str(r) : "?"; }

int main(void) {
  lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
  err_str = (const char *(*)(int))SYM("nvmlErrorString");
  int (*init)(void) = (int (*)(void))SYM("nvmlInit_v2");
  int (*count_f)(unsigned *) = (int (*)(unsigned *))SYM("nvmlDeviceGetCount_v2");
  int (*handle_f)(unsigned, dev_t_ *) = (int (*)(unsigned, dev_t_ *))SYM("nvmlDeviceGetHandleByIndex_v2");
  int r = init ? init() : -1;
  printf("nvmlInit_v2: %s\n", rc(r));
  char buf[256];
  int (*drv)(char *, unsigned) = (int (*)(char *, unsigned))SYM("nvmlSystemGetDriverVersion");
  if (drv && drv(buf, sizeof buf) == 0) printf("driver: %s\n", buf);
  unsigned n = 0;
  r = count_f ? count_f(&n) : -1;
  printf("count: %u (%s)\n", n, rc(r));
  for (unsigned i = 0; i < n; i++) {
    dev_t_ d;
    r = handle_f(i, &d);
    if (r != 0) { printf("gpu %u handle: %s\n", i, rc(r)); continue; }
    int (*name)(dev_t_, char *, unsigned) = (int (*)(dev_t_, char *, unsigned))SYM("nvmlDeviceGetName");
    int (*uuid)(dev_t_, char *, unsigned) = (int (*)(dev_t_, char *, unsigned))SYM("nvmlDeviceGetUUID");
    if (name && name(d, buf, sizeof buf) == 0) printf("gpu %u name: %s\n", i, buf);
    if (uuid) uuid(d, buf, sizeof buf);
    printf("gpu %u uuid: %s\n", i, buf);

    int (*fields)(dev_t_, int, field_value_t *) = (int (*)(dev_t_, int, field_value_t *))SYM("nvmlDeviceGetFieldValues");
    field_value_t fv[3];
    memset(fv, 0, sizeof fv);
    fv[0].fieldId = 230; /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */
    fv[1].fieldId = 226;
    fv[2].fieldId = 227;
    r = fields ? fields(d, 3, fv) : -1;
    printf("gpu %u sizeof(nvmlFieldValue_t)=%zu getFieldValues: %s\n", i, sizeof(field_value_t), rc(r));
    for (int k = 0; r == 0 && k < 3; k++)
      printf("gpu %u field %u: return %s valueType %d ui %u ull %llu\n", i, fv[k].fieldId, rc(fv[k].nvmlReturn),
             fv[k].valueType, fv[k].value.ui, fv[k].value.ull);

    unsigned corr = 0, unc = 0, pend = 0, fail = 0;
    int (*rows)(dev_t_, unsigned *, unsigned *, unsigned *, unsigned *) =
        (int (*)(dev_t_, unsigned *, unsigned *, unsigned *, unsigned *))SYM("nvmlDeviceGetRemappedRows");
    r = rows ? rows(d, &corr, &unc, &pend, &fail) : -1;
    printf("gpu %u remappedRows: %s corr=%u unc=%u pending=%u failure=%u\n", i, rc(r), corr, unc, pend, fail);

    int st = 0;
    int (*rp_pend)(dev_t_, int *) = (int (*)(dev_t_, int *))SYM("nvmlDeviceGetRetiredPagesPendingStatus");
    r = rp_pend ? rp_pend(d, &st) : -1;
    printf("gpu %u retiredPagesPending: %s %d\n", i, rc(r), st);
    int (*rp)(dev_t_, int, unsigned *, unsigned long long *, unsigned long long *) =
        (int (*)(dev_t_, int, unsigned *, unsigned long long *, unsigned long long *))SYM("nvmlDeviceGetRetiredPages_v2");
    for (int cause = 0; cause < 2; cause++) {
      unsigned pc = 0;
      r = rp ? rp(d, cause, &pc, NULL, NULL) : -1;
      printf("gpu %u retiredPages_v2 cause %d: %s count=%u\n", i, cause, rc(r), pc);
    }

    int (*ecc_mode)(dev_t_, int *, int *) = (int (*)(dev_t_, int *, int *))SYM("nvmlDeviceGetEccMode");
    int cur = -1, pendm = -1;
    r = ecc_mode ? ecc_mode(d, &cur, &pendm) : -1;
    printf("gpu %u eccMode: %s current=%d pending=%d\n", i, rc(r), cur, pendm);
    int (*ecc)(dev_t_, int, int, unsigned long long *) =
        (int (*)(dev_t_, int, int, unsigned long long *))SYM("nvmlDeviceGetTotalEccErrors");
    for (int counter = 0; counter < 2; counter++) {
      unsigned long long c = 0;
      r = ecc ? ecc(d, 1, counter, &c) : -1;
      printf("gpu %u totalEccErrors(UNCORRECTED,%s): %s %llu\n", i, counter ? "AGGREGATE" : "VOLATILE", rc(r), c);
    }

    int (*nvl)(dev_t_, unsigned, int *) = (int (*)(dev_t_, unsigned, int *))SYM("nvmlDeviceGetNvLinkState");
    printf("gpu %u nvlinkState:", i);
    for (unsigned l = 0; l < 36; l++) {
      int a = -1;
      r = nvl ? nvl(d, l, &a) : -1;
      if (r == 0) printf(" %u=%d", l, a);
      else if (l < 18 || r != 2) printf(" %u:%s", l, rc(r));
    }
    printf("\n");

    unsigned w = 0, mw = 0, g = 0, mg = 0, replay = 0;
    int (*cw)(dev_t_, unsigned *) = (int (*)(dev_t_, unsigned *))SYM("nvmlDeviceGetCurrPcieLinkWidth");
    int (*xw)(dev_t_, unsigned *) = (int (*)(dev_t_, unsigned *))SYM("nvmlDeviceGetMaxPcieLinkWidth");
    int (*cg)(dev_t_, unsigned *) = (int (*)(dev_t_, unsigned *))SYM("nvmlDeviceGetCurrPcieLinkGeneration");
    int (*xg)(dev_t_, unsigned *) = (int (*)(dev_t_, unsigned *))SYM("nvmlDeviceGetMaxPcieLinkGeneration");
    int (*rep)(dev_t_, unsigned *) = (int (*)(dev_t_, unsigned *))SYM("nvmlDeviceGetPcieReplayCounter");
    int r1 = cw ? cw(d, &w) : -1, r2 = xw ? xw(d, &mw) : -1, r3 = cg ? cg(d, &g) : -1;
    int r4 = xg ? xg(d, &mg) : -1, r5 = rep ? rep(d, &replay) : -1;
    printf("gpu %u pcie width %u/%u (%s/%s) gen %u/%u (%s/%s) replay %u (%s)\n", i, w, mw, rc(r1), rc(r2), g, mg,
           rc(r3), rc(r4), replay, rc(r5));

    unsigned long long reasons = 0;
    int (*ce)(dev_t_, unsigned long long *) = (int (*)(dev_t_, unsigned long long *))SYM("nvmlDeviceGetCurrentClocksEventReasons");
    r = ce ? ce(d, &reasons) : -1;
    printf("gpu %u clocksEventReasons: %s 0x%llx\n", i, rc(r), reasons);

    unsigned long long ev = 0;
    int (*sup)(dev_t_, unsigned long long *) = (int (*)(dev_t_, unsigned long long *))SYM("nvmlDeviceGetSupportedEventTypes");
    r = sup ? sup(d, &ev) : -1;
    printf("gpu %u supportedEventTypes: %s 0x%llx\n", i, rc(r), ev);
  }
  return 0;
}
