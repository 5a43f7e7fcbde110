/* Internal declarations shared by the hook's translation units. */
#ifndef FOUNDRY_HOOK_INTERNAL_H
#define FOUNDRY_HOOK_INTERNAL_H

#include <cuda.h>
#include <stdio.h>

#include "foundry_env.h"
#include "foundry_hook.h"

/* events.c: a bounded, thread-safe log Python reads, and counters. */
void fh_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fh_count(const char *name);
void fh_count_add(const char *name, uint64_t amount);
/* A refusal: counted as `refused`, logged as an error; returns rc. */
CUresult fh_refuse(CUresult rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* config.c: the FOUNDRY_* variables (foundry_env.h), parsed; nothing there logs. */
const char *fh_env_text(const char *name);  /* the raw text, or NULL */
int fh_env_mode(void);                      /* enum foundry_mode */
/* `name` as a number (any base): 0, or -1 when it is not one; *out is `fallback` unless set. */
int fh_env_u64(const char *name, uint64_t fallback, uint64_t *out);
int fh_env_flag(const char *name);          /* 1 when the variable holds FOUNDRY_ENV_FLAG_ON */
int fh_env_region_threads(void);            /* 0 owner (also unset), 1 any, -1 neither */
long fh_env_rank(void);                     /* FOUNDRY_RANK: 0 when unset, -1 when not a rank number */
uint64_t fh_env_import_base(void);          /* FOUNDRY_IMPORT_BASE, or the default */
int fh_env_load_captures_allowed(void);     /* FOUNDRY_LOAD_CAPTURES=allow */
long fh_env_session_pid(void);              /* FOUNDRY_SESSION_PID: 0 when unset, -1 when not a process id */
int fh_env_session_checked(void);           /* 1: a LOAD, a marker named, and FOUNDRY_SESSION_PID is this process */

/* pre_cuda.c: the hook's own time before CUDA starts. fh_pre_cuda_clock() is 0 once it has
 * (then the others do nothing); fh_pre_cuda_end() marks the first driver entry point resolved. */
uint64_t fh_pre_cuda_clock(void);
void fh_pre_cuda_lookup(uint64_t begun);
void fh_pre_cuda_constructor(uint64_t begun);
void fh_pre_cuda_end(void);
void fh_pre_cuda_say(FILE *out);

/* resolve.c: the real driver entry point for an exported (versioned) symbol name. */
void *fh_real(const char *exported);
/* The real driver function `fn`, typed as cuda.h declares it. */
#define DRIVER(fn) ((__typeof__(&fn))fh_real(#fn))
#define GiB (1ULL << 30)
/* The first of `names` the driver lacks (fh_real logged it), or NULL when it has them all. */
const char *fh_driver_missing(const char *const *names, size_t count);
/* A real entry point for `exported` found on the way (dlsym, cuGetProcAddress): the
 * first one offered is the one fh_real gives from then on. */
void fh_real_offer(const char *exported, void *fn);
/* The real dlsym (glibc's), and the driver library. */
void *fh_real_dlsym(void *handle, const char *symbol);
void *fh_libcuda(void);

/* region.c: the deterministic VMM region. */
CUresult fh_mem_alloc(CUdeviceptr *dptr, size_t bytesize);
/* *freed: the offset of the region allocation released, FH_NOTHING_FREED for none. */
#define FH_NOTHING_FREED ((size_t)-1)
CUresult fh_mem_free(CUdeviceptr dptr, size_t *freed);
int fh_region_mode(void);
/* The live region allocation holding p: its offset, size and physical handle (0: none). */
int fh_region_lookup(CUdeviceptr p, size_t *offset, size_t *size, CUmemGenericAllocationHandle *handle);
/* The region's base, size and access descriptor; whether it is reserved yet. */
int fh_region_geometry(CUdeviceptr *base, size_t *size, CUmemAccessDesc *access);
/* ipc_driver.c: the driver's IPC calls on region memory, through Foundry handles. */
CUresult fh_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult fh_ipc_open_mem_handle(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags);
CUresult fh_ipc_open_mem_handle_v1(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags);
CUresult fh_ipc_close_mem_handle(CUdeviceptr dptr);
/* The region allocation at `offset` was freed: withdraw its export, if any. */
void fh_ipc_forget(size_t offset);
/* ipc.c: whether two Foundry handles name the same export (pid, number and token). */
int fh_ipc_same_handle(const foundry_ipc_handle_t *a, const foundry_ipc_handle_t *b);
/* region.c: the stream-capture hooks report captures begun and ended. */
void fh_capture_begin(void);
void fh_capture_end(void);

/* registry.c: module and library loads, recorded. */
CUresult fh_module_load(CUmodule *module, const char *fname);
CUresult fh_module_load_data(CUmodule *module, const void *image);
CUresult fh_module_load_data_ex(CUmodule *module, const void *image, unsigned int n, CUjit_option *options,
                                void **values);
CUresult fh_module_load_fat_binary(CUmodule *module, const void *fat_cubin);
CUresult fh_library_load_data(CUlibrary *library, const void *code, CUjit_option *jit, void **jit_values,
                              unsigned int n_jit, CUlibraryOption *options, void **values, unsigned int n);
CUresult fh_library_load_from_file(CUlibrary *library, const char *path, CUjit_option *jit, void **jit_values,
                                   unsigned int n_jit, CUlibraryOption *options, void **values, unsigned int n);
CUresult fh_module_unload(CUmodule module);
CUresult fh_library_unload(CUlibrary library);

/* cache_config.c: the cache preference set on functions and kernels, recorded. */
CUresult fh_func_set_cache_config(CUfunction function, CUfunc_cache config);
CUresult fh_kernel_set_cache_config(CUkernel kernel, CUfunc_cache config, CUdevice device);
/* A module or library unloaded: its functions' settings go (owner 0 never matches one). */
void fh_cache_config_forget(uint64_t owner);

#endif
