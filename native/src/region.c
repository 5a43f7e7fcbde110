/*
 * region.c - the deterministic VMM region.
 *
 * In SAVE or LOAD mode every cuMemAlloc lands in one large virtual range
 * reserved at a fixed base (FOUNDRY_REGION_BASE, default 0x600000000000; the
 * H200's driver honours fixed addresses for reservations of 1 GiB and more).
 * Allocations are mapped at a cursor that only moves forward, so the same
 * sequence of requests gives the same addresses in every process, and each one
 * is recorded (call order, offset, size, phase). Any loss of determinism fails
 * the allocation and says why in the event log: a reserve that lands elsewhere,
 * an allocation that would leave the region, one from a thread other than the
 * owner or from another context, and at LOAD one that diverges from SAVE's
 * trace.
 *
 * Engines warm each shape up right before capturing it, so at a production graph
 * set some warm-ups take new memory after the first capture began: such an
 * allocation is marked (phase LATE) and kept in the trace, between the graph
 * pool's (phase CAPTURE). A LOAD never captures. It maps every range the captures
 * used at once (foundry_region_restore) and, when it repeats the warm-ups, places
 * each late allocation where SAVE's trace put it: the same request in the same
 * order, or the first that differs is logged as a divergence.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "hook.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static struct {
    int mode;
    int reserved;
    int failed;
    CUdeviceptr base;
    size_t size;
    size_t cursor;
    size_t granularity;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    foundry_alloc_t *trace;
    CUmemGenericAllocationHandle *handles;
    size_t count, capacity;
    CUcontext context; /* the context the region was reserved in */
    pid_t owner;       /* the thread allowed to allocate (0: the first one that does) */
    int any_thread;    /* FOUNDRY_REGION_THREADS=any: other threads may allocate too */
    foundry_alloc_t *expected; /* LOAD: SAVE's warm-up trace */
    size_t expected_count;
    int restored;      /* LOAD: foundry_region_restore ran; later allocations are the application's own ... */
    int following;     /* ... except, until sealed, SAVE's late allocations, repeated at SAVE's offsets */
    foundry_alloc_t *late; /* LOAD, following: SAVE's allocations between captures, in order */
    size_t late_count, late_made;
    int sealed;        /* SAVE: the archive is written; LOAD: the session finished; the application's own */
    int diverged;      /* LOAD: an allocation left SAVE's trace (logged once) */
    size_t late_logged; /* SAVE: late allocations logged (the first few; all are counted) */
} region;

/* Capture state, from the stream-capture hooks: captures begun, captures open. */
static atomic_int captures_begun, captures_open;

void fh_capture_begin(void) {
    atomic_fetch_add(&captures_begun, 1);
    atomic_fetch_add(&captures_open, 1);
}

void fh_capture_end(void) {
    int open = atomic_load(&captures_open);
    while (open > 0 && !atomic_compare_exchange_weak(&captures_open, &open, open - 1)) {
    }
}

static int phase_now(void) {
    if (atomic_load(&captures_open) > 0) return FOUNDRY_PHASE_CAPTURE;
    if (region.restored) return region.following && !region.sealed ? FOUNDRY_PHASE_LATE : FOUNDRY_PHASE_RESTORED;
    if (region.sealed) return FOUNDRY_PHASE_SEALED;
    return atomic_load(&captures_begun) > 0 ? FOUNDRY_PHASE_LATE : FOUNDRY_PHASE_WARMUP;
}

static pid_t thread_id(void) { return (pid_t)syscall(SYS_gettid); }

/* A number the region is configured with, or its default (said as an error when unreadable). */
static uint64_t region_number(const char *name, uint64_t fallback) {
    uint64_t value;
    if (fh_env_u64(name, fallback, &value) < 0)
        fh_event("error: %s=%s is not a number; using 0x%llx", name, fh_env_text(name), (unsigned long long)fallback);
    return value;
}

static void configure(void) {
    region.mode = fh_env_mode();
    region.base = region_number(FOUNDRY_ENV_REGION_BASE, FOUNDRY_ENV_DEFAULT_REGION_BASE);
    region.size = region_number(FOUNDRY_ENV_REGION_SIZE, FOUNDRY_ENV_DEFAULT_REGION_SIZE);
    int threads = fh_env_region_threads();
    region.any_thread = threads == 1;
    if (threads < 0)
        fh_event("error: " FOUNDRY_ENV_REGION_THREADS "=%s is neither " FOUNDRY_ENV_THREADS_OWNER " nor "
                 FOUNDRY_ENV_THREADS_ANY "; using " FOUNDRY_ENV_THREADS_OWNER, fh_env_text(FOUNDRY_ENV_REGION_THREADS));
    if (region.mode != FOUNDRY_MODE_OFF)
        fh_event("region: mode %s, base 0x%llx, size %zu, threads %s",
                 region.mode == FOUNDRY_MODE_SAVE ? FOUNDRY_ENV_MODE_SAVE : FOUNDRY_ENV_MODE_LOAD,
                 (unsigned long long)region.base, region.size,
                 region.any_thread ? FOUNDRY_ENV_THREADS_ANY : FOUNDRY_ENV_THREADS_OWNER);
}

int fh_region_mode(void) {
    pthread_once(&once, configure);
    return region.mode;
}

/* Every driver entry point the region calls, resolved up front: a missing one is
 * refused here by name instead of crashing on a NULL call later. */
static int entry_points_present(void) {
    static const char *const names[] = {"cuCtxGetDevice", "cuCtxGetCurrent", "cuCtxSynchronize",
                                        "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree",
                                        "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"};
    return fh_driver_missing(names, sizeof names / sizeof names[0]) == NULL; /* fh_real logged which */
}

static CUresult reserve(void) {
    if (!entry_points_present()) return CUDA_ERROR_NOT_FOUND;
    CUdevice device;
    CUresult rc = DRIVER(cuCtxGetDevice)(&device);
    if (rc != CUDA_SUCCESS) return rc;
    memset(&region.prop, 0, sizeof region.prop);
    region.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    region.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    region.prop.location.id = device;
    /* exportable as a POSIX descriptor, so cuIpcGetMemHandle on region memory works (ipc_driver.c) */
    region.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    region.access.location = region.prop.location;
    region.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = DRIVER(cuMemGetAllocationGranularity)(&region.granularity, &region.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS) return rc;
    CUdeviceptr got = 0;
    rc = DRIVER(cuMemAddressReserve)(&got, region.size, GiB, region.base, 0);
    if (rc != CUDA_SUCCESS || got != region.base) {
        fh_event("error: region reserve of %zu bytes at 0x%llx landed at 0x%llx (status %d)", region.size,
                 (unsigned long long)region.base, (unsigned long long)got, (int)rc);
        if (rc == CUDA_SUCCESS) DRIVER(cuMemAddressFree)(got, region.size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    region.reserved = 1;
    DRIVER(cuCtxGetCurrent)(&region.context);
    fh_event("region: reserved 0x%llx + %zu, granularity %zu", (unsigned long long)got, region.size,
             region.granularity);
    return CUDA_SUCCESS;
}

static int record(size_t offset, size_t mapped, size_t request, int phase, CUmemGenericAllocationHandle handle) {
    if (region.count == region.capacity) {
        size_t capacity = region.capacity ? 2 * region.capacity : 1024;
        foundry_alloc_t *trace = realloc(region.trace, capacity * sizeof *trace);
        CUmemGenericAllocationHandle *handles = realloc(region.handles, capacity * sizeof *handles);
        if (trace) region.trace = trace;
        if (handles) region.handles = handles;
        if (trace == NULL || handles == NULL) return -1;
        region.capacity = capacity;
    }
    region.trace[region.count] = (foundry_alloc_t){region.count, offset, mapped, request, 0, 0, phase, 0};
    region.handles[region.count] = handle;
    region.count++;
    return 0;
}

static size_t rounded(size_t bytesize) {
    size_t mapped = (bytesize + region.granularity - 1) / region.granularity * region.granularity;
    return mapped ? mapped : region.granularity;
}

/* Map `mapped` bytes at `offset` and record them as one allocation of `request` bytes. */
static CUresult map_at(size_t offset, size_t mapped, size_t request, int phase, CUdeviceptr *dptr) {
    CUdeviceptr at = region.base + offset;
    CUmemGenericAllocationHandle handle;
    CUresult rc = DRIVER(cuMemCreate)(&handle, mapped, &region.prop, 0);
    if ((rc == CUDA_ERROR_NOT_SUPPORTED || rc == CUDA_ERROR_INVALID_VALUE || rc == CUDA_ERROR_NOT_PERMITTED) &&
        region.prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
        /* a driver or container without shareable memory: the region works, IPC on it will not */
        fh_event("region: memory cannot be created exportable (status %d); cuIpcGetMemHandle on it will fail",
                 (int)rc);
        region.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        rc = DRIVER(cuMemCreate)(&handle, mapped, &region.prop, 0);
    }
    if (rc != CUDA_SUCCESS) return rc;
    rc = DRIVER(cuMemMap)(at, mapped, 0, handle, 0);
    if (rc == CUDA_SUCCESS) rc = DRIVER(cuMemSetAccess)(at, mapped, &region.access, 1);
    if (rc == CUDA_SUCCESS && record(offset, mapped, request, phase, handle) != 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc != CUDA_SUCCESS) {
        DRIVER(cuMemUnmap)(at, mapped);
        DRIVER(cuMemRelease)(handle);
        return rc;
    }
    *dptr = at;
    return CUDA_SUCCESS;
}

static CUresult map_at_cursor(CUdeviceptr *dptr, size_t bytesize, int phase) {
    size_t room = region.size - region.cursor;
    if (bytesize > room || rounded(bytesize) > room) {
        fh_event("error: allocation #%zu of %zu bytes would leave the region (cursor %zu of %zu)", region.count,
                 bytesize, region.cursor, region.size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t mapped = rounded(bytesize);
    CUresult rc = map_at(region.cursor, mapped, bytesize, phase, dptr);
    if (rc == CUDA_SUCCESS) region.cursor += mapped;
    return rc;
}

/* The thread and context policy: one owner thread allocates at a time, in the
 * context the region was reserved in. FOUNDRY_REGION_THREADS=any lets other threads
 * allocate too (NCCL's proxy thread allocates its peer buffers while the caller
 * waits for it): each such allocation is counted (`other_thread_allocations`), the
 * first of each run from one thread logged (logging every one could fill the log
 * and crowd out later errors), and the trace comparisons (the runs of a SAVE, a
 * LOAD against SAVE's warm-up) still refuse any reordering. */
static CUresult check_caller(size_t bytesize) {
    static pid_t last_logged; /* the other thread whose allocation was logged last */
    pid_t tid = thread_id();
    if (region.owner == 0) region.owner = tid;
    if (tid != region.owner && region.any_thread) {
        fh_count("other_thread_allocations");
        if (tid != last_logged)
            fh_event("region: allocation #%zu of %zu bytes from thread %d (owner %d; " FOUNDRY_ENV_REGION_THREADS
                     "=" FOUNDRY_ENV_THREADS_ANY ")",
                     region.count, bytesize, (int)tid, (int)region.owner);
        last_logged = tid;
    } else if (tid != region.owner) {
        fh_event("error: allocation #%zu of %zu bytes from thread %d; the region's owner is thread %d", region.count,
                 bytesize, (int)tid, (int)region.owner);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    CUcontext current = NULL;
    DRIVER(cuCtxGetCurrent)(&current);
    if (current != region.context) {
        fh_event("error: allocation #%zu of %zu bytes from context %p; the region belongs to context %p",
                 region.count, bytesize, (void *)current, (void *)region.context);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    return CUDA_SUCCESS;
}

/* LOAD: the warm-up must ask for exactly what SAVE's warm-up asked for, in order.
 * The first divergence is logged and the allocation let through: the session
 * refuses the LOAD before any replay, naming it (a refusal here would surface
 * as an anonymous out-of-memory error in the application). */
static void check_expected(size_t bytesize) {
    if (region.mode != FOUNDRY_MODE_LOAD || region.expected == NULL || region.restored || region.diverged) return;
    size_t i = region.count;
    if (i >= region.expected_count) {
        fh_event("error: allocation #%zu of %zu bytes diverges from SAVE's trace: SAVE's warm-up made only %zu "
                 "allocations", i, bytesize, region.expected_count);
        region.diverged = 1;
        return;
    }
    const foundry_alloc_t *want = &region.expected[i];
    if (want->request != bytesize || want->offset != region.cursor) {
        fh_event("error: allocation #%zu of %zu bytes at offset %zu diverges from SAVE's trace (SAVE's #%zu: %llu "
                 "bytes at offset %llu)", i, bytesize, region.cursor, i, (unsigned long long)want->request,
                 (unsigned long long)want->offset);
        region.diverged = 1;
    }
}

/* LOAD, following: SAVE's late allocation this one repeats, or NULL once it departs
 * from them (the first departure is logged; the session refuses the LOAD). */
static const foundry_alloc_t *follow_next(size_t bytesize) {
    if (region.diverged) return NULL;
    size_t i = region.count;
    if (region.late_made == region.late_count) {
        fh_event("error: allocation #%zu of %zu bytes between captures diverges from SAVE's trace: SAVE made only %zu "
                 "allocations between its captures", i, bytesize, region.late_count);
    } else {
        const foundry_alloc_t *want = &region.late[region.late_made];
        if (want->request == bytesize && want->size == rounded(bytesize)) {
            region.late_made++;
            return want;
        }
        fh_event("error: allocation #%zu of %zu bytes between captures diverges from SAVE's trace (SAVE's #%llu: %llu "
                 "bytes at offset %llu)", i, bytesize, (unsigned long long)want->order,
                 (unsigned long long)want->request, (unsigned long long)want->offset);
    }
    region.diverged = 1;
    return NULL;
}

/* SAVE: an allocation between captures is kept in the trace, where a LOAD repeats it. */
static void note_late(size_t bytesize) {
    fh_count("late_allocations");
    if (region.late_logged++ < 4)
        fh_event("region: allocation #%zu of %zu bytes between captures, at offset %zu (a LOAD places it there)",
                 region.count - 1, bytesize, region.trace[region.count - 1].offset);
}

/* At the cursor, or for a LOAD repeating SAVE's allocations between captures, where
 * SAVE's trace put them. */
static CUresult place(CUdeviceptr *dptr, size_t bytesize) {
    int phase = phase_now();
    const foundry_alloc_t *want = NULL;
    if (region.mode == FOUNDRY_MODE_LOAD && phase == FOUNDRY_PHASE_LATE) want = follow_next(bytesize);
    if (want != NULL) return map_at(want->offset, want->size, bytesize, phase, dptr);
    CUresult rc = map_at_cursor(dptr, bytesize, phase);
    if (rc == CUDA_SUCCESS && region.mode == FOUNDRY_MODE_SAVE && phase == FOUNDRY_PHASE_LATE) note_late(bytesize);
    return rc;
}

CUresult fh_mem_alloc(CUdeviceptr *dptr, size_t bytesize) {
    if (fh_region_mode() == FOUNDRY_MODE_OFF) return ((alloc_fn)fh_real("cuMemAlloc_v2"))(dptr, bytesize);
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult rc = region.failed ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS && !region.reserved) rc = reserve();
    if (rc == CUDA_SUCCESS) rc = check_caller(bytesize);
    if (rc == CUDA_SUCCESS) check_expected(bytesize);
    if (rc == CUDA_SUCCESS) rc = place(dptr, bytesize);
    if (rc != CUDA_SUCCESS && !region.reserved) region.failed = 1;
    pthread_mutex_unlock(&lock);
    fh_count(rc == CUDA_SUCCESS ? "allocations" : "refused");
    return rc;
}

/* The live allocation holding p, or -1. Call with the lock held. */
static long find_live(CUdeviceptr p) {
    for (size_t i = 0; i < region.count; i++) {
        foundry_alloc_t *a = &region.trace[i];
        if (!a->freed && p >= region.base + a->offset && p < region.base + a->offset + a->size) return (long)i;
    }
    return -1;
}

CUresult fh_mem_free(CUdeviceptr dptr, size_t *freed) {
    *freed = FH_NOTHING_FREED;
    if (fh_region_mode() == FOUNDRY_MODE_OFF) return ((free_fn)fh_real("cuMemFree_v2"))(dptr);
    pthread_mutex_lock(&lock);
    if (!region.reserved || dptr < region.base || dptr >= region.base + region.size) {
        pthread_mutex_unlock(&lock);
        return ((free_fn)fh_real("cuMemFree_v2"))(dptr);
    }
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    long i = find_live(dptr);
    int found = i >= 0 && region.base + region.trace[i].offset == dptr; /* only an allocation's start frees it */
    if (found) {
        foundry_alloc_t *a = &region.trace[i];
        DRIVER(cuCtxSynchronize)(); /* cuMemFree synchronizes; cuMemUnmap does not */
        rc = DRIVER(cuMemUnmap)(dptr, a->size);
        if (rc == CUDA_SUCCESS) rc = DRIVER(cuMemRelease)(region.handles[i]);
        if (rc == CUDA_SUCCESS) a->freed = 1;
    }
    pthread_mutex_unlock(&lock);
    if (found && rc == CUDA_SUCCESS) *freed = dptr - region.base; /* the caller withdraws its export, if any */
    if (!found)
        fh_event("error: free of 0x%llx, not the start of a live region allocation", (unsigned long long)dptr);
    else if (rc != CUDA_SUCCESS)
        fh_event("error: free of 0x%llx failed (driver status %d)", (unsigned long long)dptr, (int)rc);
    return rc;
}

int fh_region_lookup(CUdeviceptr p, size_t *offset, size_t *size, CUmemGenericAllocationHandle *handle) {
    pthread_mutex_lock(&lock);
    long i = region.reserved ? find_live(p) : -1;
    if (i >= 0) *offset = region.trace[i].offset, *size = region.trace[i].size, *handle = region.handles[i];
    pthread_mutex_unlock(&lock);
    return i >= 0;
}

int fh_region_geometry(CUdeviceptr *base, size_t *size, CUmemAccessDesc *access) {
    pthread_mutex_lock(&lock);
    int reserved = region.reserved;
    *base = region.base, *size = region.size, *access = region.access;
    pthread_mutex_unlock(&lock);
    return reserved;
}

int foundry_region_seal(void) {
    if (fh_region_mode() == FOUNDRY_MODE_OFF) return FOUNDRY_ESTATE;
    pthread_mutex_lock(&lock);
    region.sealed = 1;
    pthread_mutex_unlock(&lock);
    return FOUNDRY_OK;
}

/* The ranges and the late allocations must tile [cursor, final) exactly, in ascending
 * order, each aligned to the granularity: what the session computed from SAVE's trace. */
static int tiles(const uint64_t *ranges, size_t nranges, uint64_t final, const foundry_alloc_t *late, size_t nlate) {
    uint64_t at = region.cursor;
    size_t r = 0, l = 0;
    while (r < nranges || l < nlate) {
        int take_range = l == nlate || (r < nranges && ranges[2 * r] < late[l].offset);
        uint64_t offset = take_range ? ranges[2 * r] : late[l].offset;
        uint64_t size = take_range ? ranges[2 * r + 1] : late[l].size;
        if (offset != at || size == 0 || size % region.granularity || size > final - at) {
            fh_event("error: the LOAD's restore plan does not tile the region from %llu to %llu (at %llu: %s of %llu "
                     "bytes at offset %llu)", (unsigned long long)region.cursor, (unsigned long long)final,
                     (unsigned long long)at, take_range ? "a range" : "a late allocation", (unsigned long long)size,
                     (unsigned long long)offset);
            return 0;
        }
        at += size;
        if (take_range)
            r++;
        else
            l++;
    }
    if (at != final) fh_event("error: the LOAD's restore plan ends at %llu, not at %llu", (unsigned long long)at,
                              (unsigned long long)final);
    return at == final;
}

int foundry_region_restore(const uint64_t *ranges, size_t nranges, uint64_t final_offset,
                           const foundry_alloc_t *late, size_t nlate, int follow) {
    if ((ranges == NULL && nranges) || (late == NULL && nlate) || (nlate && !follow)) return FOUNDRY_EINVAL;
    if (fh_region_mode() != FOUNDRY_MODE_LOAD) return FOUNDRY_ESTATE;
    foundry_alloc_t *copy = nlate ? malloc(nlate * sizeof *copy) : NULL;
    if (nlate && copy == NULL) return FOUNDRY_ESTATE;
    if (nlate) memcpy(copy, late, nlate * sizeof *copy);
    pthread_mutex_lock(&lock);
    int status = FOUNDRY_OK;
    if (region.restored || (!region.reserved && reserve() != CUDA_SUCCESS)) status = FOUNDRY_ESTATE;
    if (status == FOUNDRY_OK && final_offset < region.cursor) final_offset = region.cursor; /* nothing left to map */
    if (status == FOUNDRY_OK && (final_offset > region.size || !tiles(ranges, nranges, final_offset, late, nlate)))
        status = FOUNDRY_EINVAL;
    for (size_t i = 0; status == FOUNDRY_OK && i < nranges; i++) {
        CUdeviceptr at;
        CUresult rc = map_at(ranges[2 * i], ranges[2 * i + 1], 0, FOUNDRY_PHASE_RESTORED, &at);
        if (rc != CUDA_SUCCESS) {
            fh_event("error: cannot map the region at offset %llu (%llu bytes, status %d)",
                     (unsigned long long)ranges[2 * i], (unsigned long long)ranges[2 * i + 1], (int)rc);
            status = FOUNDRY_ESTATE;
            break;
        }
        region.trace[region.count - 1].reserve = 1; /* SAVE's memory, mapped at once: no allocation of the LOAD's */
    }
    if (status == FOUNDRY_OK) {
        if (nranges || nlate)
            fh_event("region: restored up to offset %llu: %zu ranges mapped, %zu late allocations to repeat",
                     (unsigned long long)final_offset, nranges, nlate);
        region.cursor = final_offset;
        region.restored = 1;
        region.following = follow;
        free(region.late);
        region.late = copy, region.late_count = nlate, region.late_made = 0;
        copy = NULL;
    }
    pthread_mutex_unlock(&lock);
    free(copy);
    return status;
}

int foundry_region_map_to(uint64_t offset) {
    pthread_mutex_lock(&lock);
    uint64_t cursor = region.cursor;
    pthread_mutex_unlock(&lock);
    uint64_t range[2] = {cursor, offset > cursor ? offset - cursor : 0};
    return foundry_region_restore(range, range[1] ? 1 : 0, offset, NULL, 0, 0);
}

int foundry_region_info(foundry_region_info_t *out) {
    if (out == NULL) return FOUNDRY_EINVAL;
    fh_region_mode();
    pthread_mutex_lock(&lock);
    *out = (foundry_region_info_t){region.reserved ? region.base : 0, region.size, region.cursor, region.count,
                                   region.granularity, region.mode, region.reserved, region.late_count,
                                   region.late_made, region.diverged, region.following && !region.sealed};
    pthread_mutex_unlock(&lock);
    return FOUNDRY_OK;
}

int foundry_region_trace(foundry_alloc_t *out, size_t max, size_t *count) {
    if (count == NULL || (out == NULL && max)) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    *count = region.count;
    size_t n = max < region.count ? max : region.count;
    if (n) memcpy(out, region.trace, n * sizeof *out);
    pthread_mutex_unlock(&lock);
    return n < *count ? FOUNDRY_ETRUNC : FOUNDRY_OK;
}

int foundry_region_reserve(void) {
    if (fh_region_mode() == FOUNDRY_MODE_OFF) return FOUNDRY_ESTATE;
    pthread_mutex_lock(&lock);
    CUresult rc = region.reserved ? CUDA_SUCCESS : reserve();
    if (rc != CUDA_SUCCESS) region.failed = 1;
    pthread_mutex_unlock(&lock);
    return rc == CUDA_SUCCESS ? FOUNDRY_OK : FOUNDRY_ESTATE;
}

int foundry_region_set_owner(void) {
    pthread_mutex_lock(&lock);
    region.owner = thread_id();
    pthread_mutex_unlock(&lock);
    return FOUNDRY_OK;
}

int foundry_region_expect(const foundry_alloc_t *trace, size_t count) {
    if (trace == NULL && count) return FOUNDRY_EINVAL;
    if (fh_region_mode() != FOUNDRY_MODE_LOAD) return FOUNDRY_ESTATE;
    foundry_alloc_t *copy = count ? malloc(count * sizeof *copy) : NULL;
    if (count && copy == NULL) return FOUNDRY_ESTATE;
    if (count) memcpy(copy, trace, count * sizeof *copy);
    pthread_mutex_lock(&lock);
    int status = FOUNDRY_OK;
    if (region.count > count || foundry_trace_diverges(trace, count, region.trace, region.count) >= 0) {
        status = FOUNDRY_ESTATE; /* what was already allocated does not match */
        free(copy);
    } else {
        free(region.expected);
        region.expected = copy;
        region.expected_count = count;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

long long foundry_trace_diverges(const foundry_alloc_t *expected, size_t n, const foundry_alloc_t *actual, size_t m) {
    size_t common = n < m ? n : m;
    for (size_t i = 0; i < common; i++)
        if (expected[i].request != actual[i].request || expected[i].offset != actual[i].offset ||
            expected[i].size != actual[i].size)
            return (long long)i;
    return m > n ? (long long)n : -1;
}
