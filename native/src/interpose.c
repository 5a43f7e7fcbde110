/*
 * interpose.c - how the hook gets between an application and the CUDA driver.
 *
 * cudart finds driver entry points through dlsym on libcuda (about 90 names on
 * the H200 image's torch) and cuGetProcAddress (the rest, by base name and CUDA
 * version); both are covered for every hooked name. Code linked against libcuda
 * directly reaches the hook through the names exported here (every hooked one,
 * cuMemAlloc_v2, cuMemFree_v2, cuGetProcAddress_v2 among them): it gets its other entry points from
 * libcuda itself. A hooked name resolves to the hook; the hook reaches the real
 * function through fh_real() (resolve.c), to which it offers the real functions
 * dlsym and cuGetProcAddress hand out.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "hook.h"

typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);

static atomic_int interposed;

/* -- hooks ------------------------------------------------------------------------ */

static CUresult hook_mem_alloc(CUdeviceptr *dptr, size_t bytesize) { return fh_mem_alloc(dptr, bytesize); }

static CUresult hook_mem_free(CUdeviceptr dptr) {
    size_t freed;
    CUresult rc = fh_mem_free(dptr, &freed);
    if (freed != FH_NOTHING_FREED) fh_ipc_forget(freed); /* an exported descriptor would keep the memory */
    return rc;
}

static CUresult refuse(const char *name) {
    return fh_refuse(CUDA_ERROR_NOT_SUPPORTED, "%s is not routed into the deterministic region; refused in this mode",
                     name);
}

static CUresult hook_mem_alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    if (fh_region_mode() != FOUNDRY_MODE_OFF) return refuse("cuMemAllocAsync");
    return ((CUresult(*)(CUdeviceptr *, size_t, CUstream))fh_real("cuMemAllocAsync"))(dptr, bytesize, stream);
}

static CUresult hook_mem_alloc_managed(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (fh_region_mode() != FOUNDRY_MODE_OFF) return refuse("cuMemAllocManaged");
    return ((CUresult(*)(CUdeviceptr *, size_t, unsigned int))fh_real("cuMemAllocManaged"))(dptr, bytesize, flags);
}

static CUresult hook_mem_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int bytes) {
    if (fh_region_mode() != FOUNDRY_MODE_OFF) return refuse("cuMemAllocPitch");
    typedef CUresult (*fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    return ((fn)fh_real("cuMemAllocPitch_v2"))(dptr, pitch, width, height, bytes);
}

static CUresult hook_mem_alloc_from_pool_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
    if (fh_region_mode() != FOUNDRY_MODE_OFF) return refuse("cuMemAllocFromPoolAsync");
    typedef CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    return ((fn)fh_real("cuMemAllocFromPoolAsync"))(dptr, bytesize, pool, stream);
}

static CUresult begun(CUresult rc) {
    fh_count("stream_captures");
    if (rc == CUDA_SUCCESS) fh_capture_begin();
    return rc;
}

/* Captures the program marks as passed through (foundry_region_passthrough): graphs an
 * engine captures itself because they cannot be persisted. They neither end the
 * warm-up nor are refused in LOAD mode: SAVE and LOAD make them alike, and their
 * allocations stay in the warm-up trace both compare. The mark is the calling
 * thread's; a capture begun under it is remembered by stream, so its end is
 * recognised wherever it comes from. */
#define MAX_PASSTHROUGH_STREAMS 64
static _Thread_local int passthrough;
static pthread_mutex_t passthrough_lock = PTHREAD_MUTEX_INITIALIZER;
static CUstream passthrough_streams[MAX_PASSTHROUGH_STREAMS];
static int passthrough_count;

int foundry_region_passthrough(int on) {
    if (on) {
        passthrough++;
    } else if (passthrough > 0) {
        passthrough--;
    } else {
        return FOUNDRY_EINVAL; /* unbalanced */
    }
    return FOUNDRY_OK;
}

/* Remember (add=1) or forget (add=0) a passed-through capture's stream; whether it was known. */
static int passthrough_stream(CUstream stream, int add) {
    pthread_mutex_lock(&passthrough_lock);
    int found = -1;
    for (int i = 0; i < passthrough_count && found < 0; i++)
        if (passthrough_streams[i] == stream) found = i;
    int full = add && found < 0 && passthrough_count == MAX_PASSTHROUGH_STREAMS;
    if (add && found < 0 && !full) passthrough_streams[passthrough_count++] = stream;
    if (!add && found >= 0) passthrough_streams[found] = passthrough_streams[--passthrough_count];
    pthread_mutex_unlock(&passthrough_lock);
    if (full) /* its end would then count as the end of a capture Foundry owns: say so */
        fh_event("error: more than %d passed-through captures at once; one's stream is not remembered",
                 MAX_PASSTHROUGH_STREAMS);
    return found >= 0;
}

/* A LOAD restores its graphs; a process that captures one again (an engine whose
 * Foundry plugin did not load, say) would run without anyone noticing, so a
 * capture in LOAD mode fails unless FOUNDRY_LOAD_CAPTURES=allow says the program
 * captures graphs of its own on purpose. */
static int capture_refused(void) {
    if (fh_region_mode() != FOUNDRY_MODE_LOAD) return 0;
    if (fh_env_load_captures_allowed()) return 0;
    fh_count("stream_captures");
    fh_refuse(CUDA_ERROR_NOT_PERMITTED, "a stream capture in LOAD mode (the graphs come from the archive); refused "
              "(" FOUNDRY_ENV_LOAD_CAPTURES "=" FOUNDRY_ENV_CAPTURES_ALLOW " permits captures of the program's own)");
    return 1;
}

/* The result of a capture begun while the program's own captures pass through. */
static CUresult passed_through(CUstream stream, CUresult rc) {
    if (rc == CUDA_SUCCESS) {
        passthrough_stream(stream, 1);
        fh_count("passthrough_captures");
    }
    return rc;
}

static CUresult hook_begin_capture(CUstream stream, CUstreamCaptureMode mode) {
    CUresult (*real)(CUstream, CUstreamCaptureMode) = fh_real("cuStreamBeginCapture_v2");
    if (passthrough > 0) return passed_through(stream, real(stream, mode));
    if (capture_refused()) return CUDA_ERROR_NOT_PERMITTED;
    return begun(real(stream, mode));
}

/* CUDA 10.0's signature, still exported and still handed out for old version requests. */
static CUresult hook_begin_capture_v1(CUstream stream) {
    CUresult (*real)(CUstream) = fh_real("cuStreamBeginCapture");
    if (passthrough > 0) return passed_through(stream, real(stream));
    if (capture_refused()) return CUDA_ERROR_NOT_PERMITTED;
    return begun(real(stream));
}

static CUresult hook_end_capture(CUstream stream, CUgraph *graph) {
    CUresult rc = ((CUresult(*)(CUstream, CUgraph *))fh_real("cuStreamEndCapture"))(stream, graph);
    if (passthrough_stream(stream, 0)) return rc; /* a passed-through capture: its begin was not counted */
    /* an invalidated capture is over too; a stream that was not capturing ended nothing */
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED || rc == CUDA_ERROR_STREAM_CAPTURE_UNJOINED ||
        rc == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
        fh_capture_end();
    return rc;
}

static CUresult hook_instantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    fh_count(passthrough > 0 ? "passthrough_instantiates" : "graph_instantiates");
    return ((CUresult(*)(CUgraphExec *, CUgraph, unsigned long long))fh_real("cuGraphInstantiateWithFlags"))(exec, graph, flags);
}

static CUresult hook_instantiate_params(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    fh_count(passthrough > 0 ? "passthrough_instantiates" : "graph_instantiates");
    typedef CUresult (*fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
    return ((fn)fh_real("cuGraphInstantiateWithParams"))(exec, graph, params);
}

static CUresult hook_get_proc_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static CUresult hook_get_proc_v1(const char *, void **, int, cuuint64_t);

/*
 * The hook table. `base` is the name cuGetProcAddress is asked for (NULL: reached
 * through dlsym only), `min_version` the CUDA version from which that base name
 * has the hook's signature (older requests are passed through untouched), and
 * `exported` the versioned symbol dlsym sees. The real function is fh_real(exported),
 * kept per exported name, so two names never share one.
 */
static const struct hook {
    const char *base;
    int min_version;
    const char *exported;
    void *hook;
} hooks[] = {
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", (void *)hook_mem_alloc},
    {"cuMemFree", 3020, "cuMemFree_v2", (void *)hook_mem_free},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync", (void *)hook_mem_alloc_async},
    {"cuMemAllocManaged", 6000, "cuMemAllocManaged", (void *)hook_mem_alloc_managed},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", (void *)hook_mem_alloc_pitch},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", (void *)hook_mem_alloc_from_pool_async},
    {"cuStreamBeginCapture", 10000, "cuStreamBeginCapture", (void *)hook_begin_capture_v1},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2", (void *)hook_begin_capture},
    {"cuStreamEndCapture", 10000, "cuStreamEndCapture", (void *)hook_end_capture},
    {"cuGraphInstantiateWithFlags", 11040, "cuGraphInstantiateWithFlags", (void *)hook_instantiate},
    {"cuGraphInstantiateWithParams", 12000, "cuGraphInstantiateWithParams", (void *)hook_instantiate_params},
    {"cuModuleLoad", 2000, "cuModuleLoad", (void *)fh_module_load},
    {"cuModuleLoadData", 2000, "cuModuleLoadData", (void *)fh_module_load_data},
    {"cuModuleLoadDataEx", 2010, "cuModuleLoadDataEx", (void *)fh_module_load_data_ex},
    {"cuModuleLoadFatBinary", 2000, "cuModuleLoadFatBinary", (void *)fh_module_load_fat_binary},
    {"cuLibraryLoadData", 12000, "cuLibraryLoadData", (void *)fh_library_load_data},
    {"cuLibraryLoadFromFile", 12000, "cuLibraryLoadFromFile", (void *)fh_library_load_from_file},
    {"cuModuleUnload", 2000, "cuModuleUnload", (void *)fh_module_unload},
    {"cuLibraryUnload", 12000, "cuLibraryUnload", (void *)fh_library_unload},
    {"cuFuncSetCacheConfig", 3000, "cuFuncSetCacheConfig", (void *)fh_func_set_cache_config},
    {"cuKernelSetCacheConfig", 12000, "cuKernelSetCacheConfig", (void *)fh_kernel_set_cache_config},
    {"cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle", (void *)fh_ipc_get_mem_handle},
    {"cuIpcOpenMemHandle", 4010, "cuIpcOpenMemHandle", (void *)fh_ipc_open_mem_handle_v1},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2", (void *)fh_ipc_open_mem_handle},
    {"cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle", (void *)fh_ipc_close_mem_handle},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", (void *)hook_get_proc_v2},
    {NULL, 0, "cuGetProcAddress", (void *)hook_get_proc_v1},
};
#define HOOK_COUNT (sizeof hooks / sizeof hooks[0])

static const struct hook *find_exported(const char *symbol) {
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (strcmp(hooks[i].exported, symbol) == 0) return &hooks[i];
    return NULL;
}

/* The entry for a base name at a CUDA version: the newest signature not newer than
 * the version asked for. NULL when the name is not hooked or only newer ones are. */
static const struct hook *find_base(const char *symbol, int version, int *known) {
    const struct hook *best = NULL;
    *known = 0;
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        if (hooks[i].base == NULL || strcmp(hooks[i].base, symbol) != 0) continue;
        *known = 1;
        if (hooks[i].min_version <= version && (best == NULL || hooks[i].min_version > best->min_version))
            best = &hooks[i];
    }
    return best;
}

/* Whether fn is defined in this library (then it is one of our own exports, never the driver's). */
static int is_own(void *fn) {
    Dl_info mine, theirs;
    return fn && dladdr((void *)is_own, &mine) && dladdr(fn, &theirs) && mine.dli_fbase == theirs.dli_fbase;
}

/* -- dlsym ------------------------------------------------------------------------ */

void *dlsym(void *handle, const char *symbol) {
    uint64_t begun = fh_pre_cuda_clock();
    const struct hook *h = find_exported(symbol);
    fh_pre_cuda_lookup(begun);
    if (h == NULL) return fh_real_dlsym(handle, symbol);
    fh_pre_cuda_end(); /* a driver entry point asked for: CUDA is starting */
    void *real = fh_real_dlsym(handle, symbol);
    if (is_own(real)) /* RTLD_DEFAULT finds our export first */
        real = fh_libcuda() ? fh_real_dlsym(fh_libcuda(), symbol) : NULL;
    if (real == NULL) return NULL;
    fh_real_offer(h->exported, real);
    atomic_store(&interposed, 1);
    return h->hook;
}

/* -- cuGetProcAddress ------------------------------------------------------------- */

static void swap_in(const char *symbol, int version, void **pfn) {
    int known;
    const struct hook *h = find_base(symbol, version, &known);
    if (pfn == NULL || *pfn == NULL || !known) return;
    if (h == NULL) {
        fh_event("not interposed: %s asked for with CUDA version %d", symbol, version);
        return;
    }
    fh_real_offer(h->exported, *pfn);
    *pfn = h->hook;
    atomic_store(&interposed, 1);
}

/* FOUNDRY_HOOK_SYMBOLS=1 logs every name resolved through cuGetProcAddress. */
static void log_symbol(const char *symbol, int version, cuuint64_t flags) {
    static int enabled = -1;
    if (enabled < 0) enabled = fh_env_flag(FOUNDRY_ENV_HOOK_SYMBOLS);
    if (enabled && symbol) fh_event("resolve: %s (version %d, flags %llu)", symbol, version, (unsigned long long)flags);
}

static CUresult hook_get_proc_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    fh_pre_cuda_end();
    get_proc_v2_fn real = (get_proc_v2_fn)fh_real("cuGetProcAddress_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    log_symbol(symbol, version, flags);
    CUresult rc = real(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && symbol) swap_in(symbol, version, pfn);
    return rc;
}

static CUresult hook_get_proc_v1(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    fh_pre_cuda_end();
    get_proc_v1_fn real = (get_proc_v1_fn)fh_real("cuGetProcAddress");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    log_symbol(symbol, version, flags);
    CUresult rc = real(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && symbol) swap_in(symbol, version, pfn);
    return rc;
}

/* -- exported driver names, for code linked against libcuda directly --------------- */

/* A call through an export shows the hook in the path as dlsym and cuGetProcAddress do. */
static void reached_by_export(void) { /* read first: every allocation comes here, from any thread */
    if (!atomic_load_explicit(&interposed, memory_order_relaxed)) atomic_store(&interposed, 1);
    fh_pre_cuda_end();
}

/* Each hooked name under the symbol cuda.h makes callers link to (its macros pick the
 * versioned one), so a library built with -lcuda (Triton's launcher, for one) binds
 * here instead of the driver: seen on the H200 test machine, SGLang's Triton
 * attention kernels were loaded past a hook that exported only the allocators. */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    reached_by_export();
    return hook_mem_alloc(dptr, bytesize);
}
CUresult cuMemFree_v2(CUdeviceptr dptr) {
    reached_by_export();
    return hook_mem_free(dptr);
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    reached_by_export();
    return hook_get_proc_v2(symbol, pfn, version, flags, status);
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    reached_by_export();
    return hook_mem_alloc_async(dptr, bytesize, stream);
}
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    reached_by_export();
    return hook_mem_alloc_managed(dptr, bytesize, flags);
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int bytes) {
    reached_by_export();
    return hook_mem_alloc_pitch(dptr, pitch, width, height, bytes);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
    reached_by_export();
    return hook_mem_alloc_from_pool_async(dptr, bytesize, pool, stream);
}
CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
    reached_by_export();
    return hook_begin_capture(stream, mode);
}
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    reached_by_export();
    return hook_end_capture(stream, graph);
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    reached_by_export();
    return hook_instantiate(exec, graph, flags);
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    reached_by_export();
    return hook_instantiate_params(exec, graph, params);
}
CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    reached_by_export();
    return fh_module_load(module, fname);
}
CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    reached_by_export();
    return fh_module_load_data(module, image);
}
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n, CUjit_option *options,
                            void **values) {
    reached_by_export();
    return fh_module_load_data_ex(module, image, n, options, values);
}
CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fat_cubin) {
    reached_by_export();
    return fh_module_load_fat_binary(module, fat_cubin);
}
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jit, void **jit_values,
                           unsigned int n_jit, CUlibraryOption *options, void **values, unsigned int n) {
    reached_by_export();
    return fh_library_load_data(library, code, jit, jit_values, n_jit, options, values, n);
}
CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *path, CUjit_option *jit, void **jit_values,
                               unsigned int n_jit, CUlibraryOption *options, void **values, unsigned int n) {
    reached_by_export();
    return fh_library_load_from_file(library, path, jit, jit_values, n_jit, options, values, n);
}
CUresult cuModuleUnload(CUmodule module) {
    reached_by_export();
    return fh_module_unload(module);
}
CUresult cuLibraryUnload(CUlibrary library) {
    reached_by_export();
    return fh_library_unload(library);
}
CUresult cuFuncSetCacheConfig(CUfunction function, CUfunc_cache config) {
    reached_by_export();
    return fh_func_set_cache_config(function, config);
}
CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice device) {
    reached_by_export();
    return fh_kernel_set_cache_config(kernel, config, device);
}
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) {
    reached_by_export();
    return fh_ipc_get_mem_handle(handle, dptr);
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags) {
    reached_by_export();
    return fh_ipc_open_mem_handle(dptr, handle, flags);
}
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    reached_by_export();
    return fh_ipc_close_mem_handle(dptr);
}

/* -- control API ------------------------------------------------------------------- */

int foundry_hook_abi(void) { return FOUNDRY_HOOK_ABI; }

int foundry_hook_active(void) { return atomic_load(&interposed); }
