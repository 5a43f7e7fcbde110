/* Internal declarations shared by the hook's translation units. */
#ifndef FOUNDRY_HOOK_INTERNAL_H
#define FOUNDRY_HOOK_INTERNAL_H

#include <cuda.h>

#include "foundry_hook.h"

/* events.c: a bounded, thread-safe log Python reads, and counters. */
void fh_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fh_count(const char *name);

/* interpose.c: the real driver entry point for an exported (versioned) symbol name. */
void *fh_real(const char *exported);

/* region.c: the deterministic VMM region. */
CUresult fh_mem_alloc(CUdeviceptr *dptr, size_t bytesize);
CUresult fh_mem_free(CUdeviceptr dptr);
int fh_region_mode(void);

#endif
