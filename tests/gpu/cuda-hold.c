/* Holds GPU memory through the CUDA driver API (libcuda.so.1, loaded at run time, so
 * building it needs no CUDA toolkit): a compute process for NVML to list. With "busy"
 * it also keeps one kernel running (a counting loop, PTX the driver compiles), so that
 * NVML has per-process SM utilization samples of it.
 * Usage: cuda-hold MIB SECONDS [busy]. Build: cc -O1 -o cuda-hold cuda-hold.c -ldl */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One thread counting to n, storing the count so the loop is not optimised away. */
static const char SPIN_PTX[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry spin(.param .u64 out, .param .u64 n) {\n"
    "  .reg .u64 %r<4>;\n  .reg .pred %p;\n"
    "  ld.param.u64 %r1, [n];\n  ld.param.u64 %r3, [out];\n  mov.u64 %r2, 0;\n"
    "LOOP:\n  add.u64 %r2, %r2, 1;\n  setp.lt.u64 %p, %r2, %r1;\n  @%p bra LOOP;\n"
    "  st.global.u64 [%r3], %r2;\n  ret;\n}\n";

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
    if (argc <= 3 || strcmp(argv[3], "busy") != 0) {
        sleep(seconds);
        return 0;
    }
    typedef void *CUmodule;
    typedef void *CUfunction;
    CUresult (*load)(CUmodule *, const void *) = need(lib, "cuModuleLoadData");
    CUresult (*get_function)(CUfunction *, CUmodule, const char *) = need(lib, "cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                       void **, void **) = need(lib, "cuLaunchKernel");
    CUresult (*sync)(void) = need(lib, "cuCtxSynchronize");
    CUmodule module;
    CUfunction spin;
    if ((r = load(&module, SPIN_PTX)) || (r = get_function(&spin, module, "spin"))) {
        fprintf(stderr, "CUDA module error %d\n", r);
        return 1;
    }
    unsigned long long n = 20000000ULL;
    void *params[] = {&memory, &n};
    time_t end = time(NULL) + seconds;
    while (time(NULL) < end) {
        if ((r = launch(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL)) || (r = sync())) {
            fprintf(stderr, "CUDA launch error %d\n", r);
            return 1;
        }
    }
    return 0;
}
