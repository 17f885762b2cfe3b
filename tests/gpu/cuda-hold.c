/* Holds GPU memory through the CUDA driver API (libcuda.so.1, loaded at run time, so
 * building it needs no CUDA toolkit): a compute process for NVML to list.
 * Usage: cuda-hold MIB SECONDS. Build: cc -O1 -o cuda-hold cuda-hold.c -ldl */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *need(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "no %s in libcuda.so.1\n", name);
        exit(1);
    }
    return f;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    unsigned seconds = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 60;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "no libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    CUresult (*init)(unsigned) = need(lib, "cuInit");
    CUresult (*device_get)(CUdevice *, int) = need(lib, "cuDeviceGet");
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice) = need(lib, "cuCtxCreate_v2");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = need(lib, "cuMemAlloc_v2");
    CUdevice device;
    CUcontext context;
    CUdeviceptr memory;
    CUresult r;
    if ((r = init(0)) || (r = device_get(&device, 0)) || (r = ctx_create(&context, 0, device)) ||
        (r = mem_alloc(&memory, mib << 20))) {
        fprintf(stderr, "CUDA error %d\n", r);
        return 1;
    }
    printf("pid %d holds %zu MiB\n", (int)getpid(), mib);
    fflush(stdout);
    sleep(seconds);
    return 0;
}
