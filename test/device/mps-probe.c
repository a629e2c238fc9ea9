/*
 * mps-probe.c: an MPS client for the GPU machine (test/device/dra-sharing.sh). Through the CUDA driver API
 * (libcuda.so.1, opened at run time, so it builds without the CUDA toolkit) it makes a context on device 0
 * and allocates the sizes given, in MiB, one after the other, printing each result; then it holds what it got
 * for the seconds given with -h, so that another client can run beside it.
 *
 *   mps-probe [-h seconds] MiB [MiB ...]
 *
 * Under MPS (CUDA_MPS_PIPE_DIRECTORY naming a control daemon's pipe) the allocations count against the
 * pinned-memory limit of the daemon's server; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in the client's environment is
 * the client's own ask. Exit status: 0 when every allocation succeeded, 1 when one failed, 2 when CUDA could
 * not start.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemGetInfo)(size_t *, size_t *);
static CUresult (*cuGetErrorName)(CUresult, const char **);

static const char *name(CUresult r) {
    const char *s = "?";
    if (cuGetErrorName != NULL) cuGetErrorName(r, &s);
    return s;
}

static void *sym(void *lib, const char *n) {
    void *p = dlsym(lib, n);
    if (p == NULL) {
        fprintf(stderr, "mps-probe: libcuda has no %s\n", n);
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    int hold = 0, first = 1;
    if (argc > 2 && strcmp(argv[1], "-h") == 0) {
        hold = atoi(argv[2]);
        first = 3;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: mps-probe [-h seconds] MiB [MiB ...]\n");
        return 2;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "mps-probe: %s\n", dlerror());
        return 2;
    }
    *(void **)&cuInit = sym(lib, "cuInit");
    *(void **)&cuDeviceGet = sym(lib, "cuDeviceGet");
    *(void **)&cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent");
    *(void **)&cuMemAlloc = sym(lib, "cuMemAlloc_v2");
    *(void **)&cuMemGetInfo = sym(lib, "cuMemGetInfo_v2");
    *(void **)&cuGetErrorName = sym(lib, "cuGetErrorName");
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuInit(0);
    if (r == 0) r = cuDeviceGet(&dev, 0);
    if (r == 0) r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == 0) r = cuCtxSetCurrent(ctx);
    if (r != 0) {
        printf("cuda start: %s (%d)\n", name(r), r);
        return 2;
    }
    size_t free_b = 0, total_b = 0;
    cuMemGetInfo(&free_b, &total_b);
    printf("pid %d: context on device 0; cuMemGetInfo free %zu MiB total %zu MiB\n", (int)getpid(), free_b >> 20,
           total_b >> 20);
    int failed = 0;
    for (int i = first; i < argc; i++) {
        size_t mib = strtoull(argv[i], NULL, 10);
        CUdeviceptr p;
        r = cuMemAlloc(&p, mib << 20);
        printf("cuMemAlloc %zu MiB: %s\n", mib, r == 0 ? "ok" : name(r));
        if (r != 0) failed = 1;
    }
    fflush(stdout);
    if (hold > 0) sleep(hold);
    return failed;
}
