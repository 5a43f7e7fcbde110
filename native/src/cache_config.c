/*
 * cache_config.c - the cache preference a program sets on its functions, recorded.
 *
 * The driver keeps a function's cache preference (cuFuncSetCacheConfig,
 * cuKernelSetCacheConfig) but has no call that reads it back, and a function a LOAD
 * loads from the archive's image starts without it. Triton sets
 * CU_FUNC_CACHE_PREFER_SHARED on every kernel above 48 KiB of shared memory, which
 * changes the shared-memory/L1 split those kernels run with; so the hook records each
 * setting by handle and lowering asks for it. A few hundred functions at most: a list.
 * A module or library unloaded takes its settings with it: the driver may hand its
 * handles out again.
 */
#include <pthread.h>
#include <stdlib.h>

#include "hook.h"

struct setting {
    uint64_t handle;
    uint64_t owner; /* the CUmodule or CUlibrary it belongs to (0: not known) */
    int32_t config;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct setting *settings;
static size_t count, capacity;

static void remember(uint64_t handle, uint64_t owner, CUfunc_cache config) {
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < count && settings[i].handle != handle) i++;
    if (i == count && count == capacity) {
        size_t grown = capacity ? 2 * capacity : 64;
        struct setting *bigger = realloc(settings, grown * sizeof *bigger);
        if (bigger == NULL) {
            pthread_mutex_unlock(&lock);
            fh_event("error: no memory to record a function's cache preference; SAVE will lack it");
            return;
        }
        settings = bigger;
        capacity = grown;
    }
    if (i == count) count++;
    settings[i] = (struct setting){.handle = handle, .owner = owner, .config = (int32_t)config};
    pthread_mutex_unlock(&lock);
}

/* The module a function belongs to, the library a kernel does; 0 when the driver cannot say. */
static uint64_t module_of(CUfunction function) {
    __typeof__(&cuFuncGetModule) get = DRIVER(cuFuncGetModule);
    CUmodule module = NULL;
    return get && get(&module, function) == CUDA_SUCCESS ? (uint64_t)module : 0;
}

static uint64_t library_of(CUkernel kernel) {
    __typeof__(&cuKernelGetLibrary) get = DRIVER(cuKernelGetLibrary);
    CUlibrary library = NULL;
    return get && get(&library, kernel) == CUDA_SUCCESS ? (uint64_t)library : 0;
}

CUresult fh_func_set_cache_config(CUfunction function, CUfunc_cache config) {
    CUresult rc = DRIVER(cuFuncSetCacheConfig)(function, config);
    if (rc == CUDA_SUCCESS) remember((uint64_t)function, module_of(function), config);
    return rc;
}

CUresult fh_kernel_set_cache_config(CUkernel kernel, CUfunc_cache config, CUdevice device) {
    CUresult rc = DRIVER(cuKernelSetCacheConfig)(kernel, config, device);
    if (rc == CUDA_SUCCESS) remember((uint64_t)kernel, library_of(kernel), config);
    return rc;
}

void fh_cache_config_forget(uint64_t owner) {
    if (owner == 0) return;
    pthread_mutex_lock(&lock);
    size_t kept = 0;
    for (size_t i = 0; i < count; i++)
        if (settings[i].owner != owner) settings[kept++] = settings[i];
    count = kept;
    pthread_mutex_unlock(&lock);
}

int foundry_cache_config(uint64_t handle, int32_t *config) {
    if (config == NULL) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    *config = CU_FUNC_CACHE_PREFER_NONE;
    for (size_t i = 0; i < count; i++)
        if (settings[i].handle == handle) *config = settings[i].config;
    pthread_mutex_unlock(&lock);
    return FOUNDRY_OK;
}
