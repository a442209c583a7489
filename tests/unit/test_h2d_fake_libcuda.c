/*
 * A stand-in for libcuda.so.1 with the entry points gpunuma's H2D probe uses.
 * NOT a GPU: "device memory" is host memory, copies are real memcpy, and time
 * is a virtual clock advanced by each copy (FAKE_CUDA_GBPS, FAKE_CUDA_LAT_US),
 * so statistics are deterministic.  Behaviour is chosen with environment
 * variables read at cuInit:
 *   FAKE_CUDA_DEVICES=N         number of GPUs (default 2)
 *   FAKE_CUDA_INIT_ERROR=code   cuInit returns this CUresult
 *   FAKE_CUDA_BUSY=i            cuCtxCreate on ordinal i returns 46 (DEVICES_UNAVAILABLE)
 *   FAKE_CUDA_OOM=kind          device | host_register | host_alloc allocation fails (2)
 *   FAKE_CUDA_HANG=1            cuCtxCreate never returns
 *   FAKE_CUDA_PROHIBITED=i      ordinal i reports compute mode Prohibited
 *   FAKE_CUDA_GBPS, FAKE_CUDA_LAT_US  simulated bandwidth and per-copy latency
 *   FAKE_CUDA_PCI_BUS_IDS=a,b   PCI bus id of ordinal 0, 1, ... (a real device of
 *                               the host, so the probe finds its NUMA node in
 *                               sysfs); ordinals past the list keep 00000000:<6+i>:00.0
 * fake_outstanding() returns how many contexts, streams, events and buffers
 * are still alive in this process.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
static int ndev = 2, busy = -1, hang = 0, prohibited = -1, init_error = 0;
static const char *oom = "";
static double gbps = 50.0, lat_us = 5.0, clock_us = 0.0, spin_us = 0.0;
static int outstanding = 0, inited = 0;

int fake_outstanding(void) { return outstanding; }

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    ndev = env_int("FAKE_CUDA_DEVICES", 2);
    busy = env_int("FAKE_CUDA_BUSY", -1);
    hang = env_int("FAKE_CUDA_HANG", 0);
    prohibited = env_int("FAKE_CUDA_PROHIBITED", -1);
    init_error = env_int("FAKE_CUDA_INIT_ERROR", 0);
    oom = getenv("FAKE_CUDA_OOM") ? getenv("FAKE_CUDA_OOM") : "";
    if (getenv("FAKE_CUDA_GBPS")) gbps = atof(getenv("FAKE_CUDA_GBPS"));
    if (getenv("FAKE_CUDA_LAT_US")) lat_us = atof(getenv("FAKE_CUDA_LAT_US"));
    spin_us = getenv("FAKE_CUDA_SPIN_US") ? atof(getenv("FAKE_CUDA_SPIN_US")) : 0.0;
    if (init_error) return init_error;
    inited = 1;
    return 0;
}

CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return 3; *n = ndev; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal >= ndev) return 101; *d = ordinal; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d) { snprintf(name, len, "Fake H200 %d", d); return 0; }
CUresult cuDeviceGetPCIBusId(char *bus, int len, int d) {
    const char *ids = getenv("FAKE_CUDA_PCI_BUS_IDS");
    for (int i = 0; ids && *ids; i++) {
        const char *end = strchr(ids, ',');
        size_t n = end ? (size_t)(end - ids) : strlen(ids);
        if (i == d && n > 0) { snprintf(bus, len, "%.*s", (int)n, ids); return 0; }
        ids = end ? end + 1 : NULL;
    }
    snprintf(bus, len, "00000000:%02X:00.0", 6 + d);
    return 0;
}
CUresult cuDeviceGetUuid(unsigned char *uuid, int d) {
    for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0x10 * d + i);
    return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int d) { *v = (attr == 20 && d == prohibited) ? 2 : 0; return 0; }

CUresult cuCtxCreate_v2(void **ctx, unsigned flags, int d) {
    (void)flags;
    if (hang) for (;;) pause();
    if (d == busy) return 46;
    *ctx = malloc(1); outstanding++; return 0;
}
CUresult cuCtxDestroy_v2(void *ctx) { free(ctx); outstanding--; return 0; }
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = malloc(1); outstanding++; return 0; }
CUresult cuStreamDestroy_v2(void *s) { free(s); outstanding--; return 0; }
/* A synchronize that waits the way a spinning CUDA context does: it burns this thread's CPU for
   FAKE_CUDA_SPIN_US microseconds (measured on the thread's own CPU clock). */
static void spin(void) {
    struct timespec t0, t;
    if (spin_us <= 0) return;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1e6 + (t.tv_nsec - t0.tv_nsec) / 1e3 < spin_us);
}

CUresult cuStreamSynchronize(void *s) { (void)s; spin(); return 0; }
CUresult cuEventCreate(double **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(double)); outstanding++; return 0; }
CUresult cuEventDestroy_v2(double *e) { free(e); outstanding--; return 0; }
CUresult cuEventRecord(double *e, void *s) { (void)s; *e = clock_us; return 0; }
CUresult cuEventSynchronize(double *e) { (void)e; spin(); return 0; }
CUresult cuEventElapsedTime(float *ms, double *a, double *b) { *ms = (float)((*b - *a) / 1000.0); return 0; }

CUresult cuMemAlloc_v2(uint64_t *p, size_t n) {
    if (!strcmp(oom, "device")) return 2;
    void *m = malloc(n); if (!m) return 2;
    *p = (uint64_t)(uintptr_t)m; outstanding++; return 0;
}
CUresult cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); outstanding--; return 0; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    if (!strcmp(oom, "host_alloc")) return 2;
    *p = malloc(n); outstanding++; return 0;
}
CUresult cuMemFreeHost(void *p) { free(p); outstanding--; return 0; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    (void)p; (void)n; (void)flags;
    if (!strcmp(oom, "host_register")) return 2;
    outstanding++; return 0;
}
CUresult cuMemHostUnregister(void *p) { (void)p; outstanding--; return 0; }

static void tick(size_t n) { clock_us += lat_us + (double)n / (gbps * 1e3); }
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *s) {
    (void)s; memcpy((void *)(uintptr_t)dst, src, n); tick(n); return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *s) {
    (void)s; memcpy(dst, (void *)(uintptr_t)src, n); tick(n); return 0;
}

CUresult cuGetErrorName(int code, const char **s) {
    switch (code) {
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 46: *s = "CUDA_ERROR_DEVICES_UNAVAILABLE"; return 0;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 35: *s = "CUDA_ERROR_INSUFFICIENT_DRIVER"; return 0;
    case 999: *s = "CUDA_ERROR_UNKNOWN"; return 0;
    default: return 1;
    }
}
CUresult cuGetErrorString(int code, const char **s) {
    switch (code) {
    case 2: *s = "out of memory"; return 0;
    case 46: *s = "CUDA-capable device(s) is/are busy or unavailable"; return 0;
    case 100: *s = "no CUDA-capable device is detected"; return 0;
    case 35: *s = "CUDA driver version is insufficient for CUDA runtime version"; return 0;
    default: *s = "unknown error"; return 0;
    }
}
