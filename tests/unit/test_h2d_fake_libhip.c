/*
 * A stand-in for libamdhip64.so with the HIP entry points gpunuma's H2D probe uses
 * (verify/h2d_hip.py), built on the fake libcuda beside it: the same virtual
 * clock, environment variables (FAKE_CUDA_*) and allocation count, answered
 * under HIP's names and signatures.  NOT a GPU.
 */
#include "test_h2d_fake_libcuda.c"

typedef struct { char bytes[16]; } hipUUID;
static int current = -1;

int hipInit(unsigned flags) { return cuInit(flags); }
int hipGetDeviceCount(int *n) { return cuDeviceGetCount(n); }
int hipDeviceGet(int *d, int ordinal) { return cuDeviceGet(d, ordinal); }
int hipDeviceGetName(char *name, int len, int d) { snprintf(name, len, "Fake MI300X %d", d); return 0; }
int hipDeviceGetPCIBusId(char *bus, int len, int d) { return cuDeviceGetPCIBusId(bus, len, d); }
/* HIP fills the 16 characters of the GPU's unique_id (no terminating NUL). */
int hipDeviceGetUuid(hipUUID *uuid, int d) {
    char text[17];
    snprintf(text, sizeof text, "%016llx", 0x5b4ac59a0da2a6a0ULL + (unsigned long long)d);
    memcpy(uuid->bytes, text, 16);
    return 0;
}
int hipDriverGetVersion(int *v) { *v = 60443484; return 0; }
int hipSetDevice(int d) {
    if (hang) for (;;) pause();
    if (d < 0 || d >= ndev) return 101;
    if (d == busy) return 46;
    current = d;
    return 0;
}
int hipStreamCreateWithFlags(void **s, unsigned flags) { return current < 0 ? 709 : cuStreamCreate(s, flags); }
int hipStreamDestroy(void *s) { return cuStreamDestroy_v2(s); }
int hipStreamSynchronize(void *s) { return cuStreamSynchronize(s); }
int hipEventCreateWithFlags(double **e, unsigned flags) { return cuEventCreate(e, flags); }
int hipEventDestroy(double *e) { return cuEventDestroy_v2(e); }
int hipEventRecord(double *e, void *s) { return cuEventRecord(e, s); }
int hipEventSynchronize(double *e) { return cuEventSynchronize(e); }
int hipEventElapsedTime(float *ms, double *a, double *b) { return cuEventElapsedTime(ms, a, b); }
int hipMalloc(uint64_t *p, size_t n) { return cuMemAlloc_v2(p, n); }
int hipFree(void *p) { return cuMemFree_v2((uint64_t)(uintptr_t)p); }
int hipHostMalloc(void **p, size_t n, unsigned flags) { return cuMemHostAlloc(p, n, flags); }
int hipHostFree(void *p) { return cuMemFreeHost(p); }
int hipHostRegister(void *p, size_t n, unsigned flags) { return cuMemHostRegister_v2(p, n, flags); }
int hipHostUnregister(void *p) { return cuMemHostUnregister(p); }
int hipMemcpyHtoDAsync(uint64_t dst, const void *src, size_t n, void *s) { return cuMemcpyHtoDAsync_v2(dst, src, n, s); }
int hipMemcpyDtoHAsync(void *dst, uint64_t src, size_t n, void *s) { return cuMemcpyDtoHAsync_v2(dst, src, n, s); }

const char *hipGetErrorName(int code) {
    switch (code) {
    case 2: return "hipErrorOutOfMemory";
    case 35: return "hipErrorInsufficientDriver";
    case 46: return "hipErrorDeviceUnavailable";
    case 100: return "hipErrorNoDevice";
    case 101: return "hipErrorInvalidDevice";
    case 709: return "hipErrorContextIsDestroyed";
    default: return "hipErrorUnknown";
    }
}
const char *hipGetErrorString(int code) {
    switch (code) {
    case 2: return "out of memory";
    case 100: return "no ROCm-capable device is detected";
    default: return "unknown error";
    }
}
