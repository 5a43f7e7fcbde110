/*
 * foundry_hook.h - the control API of libfoundry_hook.so, read from Python with ctypes.
 *
 * The library is loaded with LD_PRELOAD. It interposes the CUDA driver entry points
 * that matter for determinism (through dlsym, cuGetProcAddress and exported names),
 * routes device allocations into one deterministic VMM region, and counts the calls
 * a LOAD must prove it did not make (stream captures). Every function here returns
 * 0 on success or a negative FOUNDRY_E* code; nothing aborts.
 */
#ifndef FOUNDRY_HOOK_H
#define FOUNDRY_HOOK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FOUNDRY_HOOK_ABI 1

enum foundry_status {
    FOUNDRY_OK = 0,
    FOUNDRY_EINVAL = -1,     /* bad argument */
    FOUNDRY_ESTATE = -2,     /* not possible in the current state */
    FOUNDRY_ETRUNC = -3,     /* output buffer too small; result truncated */
};

enum foundry_mode { FOUNDRY_MODE_OFF = 0, FOUNDRY_MODE_SAVE = 1, FOUNDRY_MODE_LOAD = 2 };

/* One allocation of the region, in call order. */
typedef struct foundry_alloc {
    uint64_t order;   /* 0-based call order among region allocations */
    uint64_t offset;  /* from the region base */
    uint64_t size;    /* bytes mapped (rounded up to the granularity) */
    uint64_t request; /* bytes the caller asked for */
    int32_t freed;    /* 1 once released */
    int32_t pad;
} foundry_alloc_t;

typedef struct foundry_region_info {
    uint64_t base;        /* requested and verified base, 0 before the first allocation */
    uint64_t size;        /* reserved bytes */
    uint64_t cursor;      /* next free offset */
    uint64_t allocations; /* allocations made */
    uint64_t granularity; /* mapping granularity */
    int32_t mode;         /* enum foundry_mode */
    int32_t reserved;     /* 1 once the range is reserved */
} foundry_region_info_t;

/* ABI version of this library (FOUNDRY_HOOK_ABI). */
int foundry_hook_abi(void);
/* 1 once the driver's entry points have been interposed. */
int foundry_hook_active(void);
int foundry_region_info(foundry_region_info_t *out);
/* Copies up to max entries; *count receives the total. FOUNDRY_ETRUNC when max < total. */
int foundry_region_trace(foundry_alloc_t *out, size_t max, size_t *count);
/* Counters by name: "stream_captures", "graph_instantiates", "allocations", "refused". */
int foundry_counter(const char *name, uint64_t *value);
/* Newline-separated event lines (errors and notable calls), NUL-terminated. */
int foundry_events(char *buf, size_t len, size_t *needed);

#ifdef __cplusplus
}
#endif
#endif
