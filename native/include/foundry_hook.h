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

#define FOUNDRY_HOOK_ABI 9 /* 6: foundry_hook_config; 7: foundry_region_restore, late allocations; 8: the session check;
                              9: foundry_cache_config, instantiation flags */

enum foundry_status {
    FOUNDRY_OK = 0,
    FOUNDRY_EINVAL = -1,     /* bad argument */
    FOUNDRY_ESTATE = -2,     /* not possible in the current state */
    FOUNDRY_ETRUNC = -3,     /* output buffer too small; result truncated */
};

enum foundry_mode { FOUNDRY_MODE_OFF = 0, FOUNDRY_MODE_SAVE = 1, FOUNDRY_MODE_LOAD = 2 };

/* When an allocation was made: before the first capture, inside a capture, outside a
 * capture after capturing began (between captures: a LOAD repeating the warm-ups makes
 * it again at SAVE's offset), after a LOAD restored the region (the application's own),
 * or after a SAVE sealed it (its archive written). */
enum foundry_phase {
    FOUNDRY_PHASE_WARMUP = 0,
    FOUNDRY_PHASE_CAPTURE = 1,
    FOUNDRY_PHASE_LATE = 2,
    FOUNDRY_PHASE_RESTORED = 3,
    FOUNDRY_PHASE_SEALED = 4,
};

/* One allocation of the region, in call order. */
typedef struct foundry_alloc {
    uint64_t order;   /* 0-based call order among region allocations */
    uint64_t offset;  /* from the region base */
    uint64_t size;    /* bytes mapped (rounded up to the granularity) */
    uint64_t request; /* bytes the caller asked for */
    int32_t freed;    /* 1 once released */
    int32_t reserve;  /* 1 for a LOAD's mapping of SAVE's ranges (foundry_region_restore) */
    int32_t phase;    /* enum foundry_phase */
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
    uint64_t late_expected; /* LOAD: SAVE's allocations between captures it is to repeat */
    uint64_t late_made;     /* LOAD: how many of them it repeated so far */
    int32_t diverged;       /* LOAD: an allocation departed from SAVE's trace (see the events) */
    int32_t following;      /* LOAD: restored, repeating SAVE's late allocations until sealed */
} foundry_region_info_t;

/* The FOUNDRY_* configuration (foundry_env.h names each variable) as the hook's parsers
 * read the environment now; a variable left unset is reported as what the hook uses. */
typedef struct foundry_config {
    int32_t mode;              /* FOUNDRY_MODE: enum foundry_mode (an unknown word is off) */
    int32_t region_threads;    /* FOUNDRY_REGION_THREADS: 0 owner, 1 any, -1 neither */
    uint64_t region_base;      /* FOUNDRY_REGION_BASE, or the default */
    uint64_t region_size;      /* FOUNDRY_REGION_SIZE, or the default */
    uint64_t import_base;      /* FOUNDRY_IMPORT_BASE, or the default */
    int64_t rank;              /* FOUNDRY_RANK: 0 when unset, -1 when not a rank number */
    int32_t hook_echo;         /* FOUNDRY_HOOK_ECHO is 1 */
    int32_t hook_symbols;      /* FOUNDRY_HOOK_SYMBOLS is 1 */
    int32_t load_captures;     /* FOUNDRY_LOAD_CAPTURES is allow */
    int32_t region_numbers_ok; /* 0: the region's base or size is not a number (the default is used) */
    int64_t session_pid;       /* FOUNDRY_SESSION_PID: 0 when unset, -1 when not a process id */
    int32_t session_marker;    /* FOUNDRY_SESSION_MARKER is set */
    int32_t session_checked;   /* this process's exit 0 fails when no session wrote the marker */
} foundry_config_t;

enum foundry_image_kind { FOUNDRY_IMAGE_MODULE = 1, FOUNDRY_IMAGE_LIBRARY = 2 };
enum foundry_image_format { FOUNDRY_IMAGE_UNKNOWN = 0, FOUNDRY_IMAGE_CUBIN = 1, FOUNDRY_IMAGE_FATBIN = 2, FOUNDRY_IMAGE_PTX = 3 };

/* One loaded code image (module or library), in load order. */
typedef struct foundry_image {
    uint64_t handle;     /* CUmodule or CUlibrary */
    uint64_t size;       /* bytes of the image */
    int32_t kind;        /* enum foundry_image_kind */
    int32_t format;      /* enum foundry_image_format */
    int32_t copied;      /* 1 when the hook keeps its own copy (the caller's memory may go) */
    int32_t unloaded;    /* 1 once unloaded */
    int32_t hashed;      /* 1 once sha256 is filled in */
    int32_t pad;
    uint8_t sha256[32];
} foundry_image_t;

/* Sharing region memory between processes (ipc.c). A handle is 64 bytes, the size of a
 * CUipcMemHandle, so it can travel wherever one does. */
#define FOUNDRY_IPC_MAGIC 0x43504946u /* "FIPC" */
#define FOUNDRY_IPC_VERSION 2 /* 2: the exporter's socket name carries a random key */

enum foundry_ipc_status {
    FOUNDRY_IPC_OK = 0,
    FOUNDRY_IPC_EFORMAT = -10,  /* not a Foundry handle */
    FOUNDRY_IPC_EVERSION = -11, /* a handle of another version */
    FOUNDRY_IPC_ESTALE = -12,   /* the exporting process no longer exists */
    FOUNDRY_IPC_ECONNECT = -13, /* the exporter does not answer */
    FOUNDRY_IPC_EUID = -14,     /* the exporter refused: another user */
    FOUNDRY_IPC_ETOKEN = -15,   /* the exporter refused: wrong token (e.g. a reused pid) */
    FOUNDRY_IPC_EPROTO = -16,   /* a malformed exchange */
    FOUNDRY_IPC_EPEERUID = -17, /* another user's process answers on the exporter's socket */
    FOUNDRY_IPC_EPEER = -18,    /* a process other than the exporter answers on its socket */
};

typedef struct foundry_ipc_handle {
    uint32_t magic;       /* FOUNDRY_IPC_MAGIC */
    uint16_t version;     /* FOUNDRY_IPC_VERSION */
    uint16_t rank_slot;   /* the exporter's rank: its slot in an importer's zone */
    int32_t pid;          /* the exporting process */
    uint32_t export_id;   /* its export number */
    uint64_t region_base; /* the exporter's region base */
    uint64_t offset;      /* the memory's offset in that region */
    uint64_t size;
    uint8_t token[16];    /* random, known only to the exporter and the handle's holders */
    uint8_t socket_key[8]; /* random per exporting process: its socket is @foundry-ipc-<pid>-<key in hex> */
} foundry_ipc_handle_t;

/* Export an open file descriptor (a shareable memory handle) under a new handle. */
int foundry_ipc_export(int fd, uint16_t rank_slot, uint64_t region_base, uint64_t offset, uint64_t size,
                       foundry_ipc_handle_t *out);
/* Withdraw an export (its memory was freed): the descriptor is closed, later opens refused. */
int foundry_ipc_unexport(uint32_t export_id);
/* FOUNDRY_IPC_OK when the handle is well-formed, of this version, and its exporter alive. */
int foundry_ipc_check(const foundry_ipc_handle_t *handle);
/* Take a reference on the exported descriptor (fetched from the exporter on first open). */
int foundry_ipc_open(const foundry_ipc_handle_t *handle, int *fd);
/* This process's import zone: base address, slot size (a region's) and slot count; peer
 * rank r's region offset o maps at base + r * slot + o. */
int foundry_ipc_zone(uint64_t *base, uint64_t *slot, uint32_t *slots);
/* Give one reference back; the descriptor is closed with the last. */
int foundry_ipc_close(const foundry_ipc_handle_t *handle, uint32_t *refs_left);

/* Mark the calling thread's captures that follow (on=1) as passed through, until on=0:
 * graphs the program captures itself because they are not persisted. They do not end
 * the warm-up, are not refused in LOAD mode, and count as "passthrough_captures" (their
 * instantiations as "passthrough_instantiates"), not "stream_captures". */
int foundry_region_passthrough(int on);
/* SAVE: the archive is written; LOAD: the session finished. Allocations from here on are
 * the application's own (a server's first requests): neither late nor compared. */
int foundry_region_seal(void);
/* ABI version of this library (FOUNDRY_HOOK_ABI). */
int foundry_hook_abi(void);
/* 1 once the driver's entry points have been interposed. */
int foundry_hook_active(void);
/* The FOUNDRY_* configuration the hook reads from its environment (see foundry_config_t). */
int foundry_hook_config(foundry_config_t *out);
int foundry_region_info(foundry_region_info_t *out);
/* LOAD: map the region from the cursor up to `offset` (SAVE's final offset) in one
 * allocation, so every address SAVE's graphs use exists. Needs a current context.
 * foundry_region_restore with one range and nothing to follow. */
int foundry_region_map_to(uint64_t offset);
/* LOAD: restore the region up to `final_offset` (SAVE's final offset): map `nranges`
 * (offset, size) pairs of `ranges` and leave room for `nlate` of SAVE's allocations
 * between captures; together they must tile [cursor, final_offset) in ascending order
 * (FOUNDRY_EINVAL otherwise). With `follow` (a LOAD repeating the warm-ups), every later
 * allocation until foundry_region_seal must repeat the next of `late` (same request, in
 * order) and is placed at its offset; the first that does not, or one beyond them, is
 * logged as a divergence (foundry_region_info's `diverged`) and placed at the cursor.
 * Without it, later allocations are the application's own. Needs a current context. */
int foundry_region_restore(const uint64_t *ranges, size_t nranges, uint64_t final_offset,
                           const foundry_alloc_t *late, size_t nlate, int follow);
/* Reserve the region now (needs a current context), so a taken base is reported before
 * the application allocates. */
int foundry_region_reserve(void);
/* Make the calling thread the one allowed to allocate (the previous owner must be idle). */
int foundry_region_set_owner(void);
/* LOAD: the warm-up allocations SAVE made, in order; each later allocation before
 * foundry_region_map_to must repeat its entry (request and offset): the first that
 * does not is logged as an error (the session then refuses the LOAD).
 * FOUNDRY_ESTATE when the allocations already made do not match. */
int foundry_region_expect(const foundry_alloc_t *trace, size_t count);
/* The index of the first allocation where `actual` differs from `expected` (request,
 * offset or size), n when `actual` goes beyond `expected`, -1 when it is a prefix. */
long long foundry_trace_diverges(const foundry_alloc_t *expected, size_t n, const foundry_alloc_t *actual, size_t m);
/* Call fn(arg) with its frames `shift` bytes (<= 1 MiB) lower on this thread's stack,
 * over `poison` bytes (<= 4 MiB) filled with `pattern`. */
int foundry_call_shifted(size_t shift, size_t poison, int pattern, void (*fn)(void *), void *arg);
/* Build a graph in the current context from a packed description (format in
 * native/src/graph_build.c) and instantiate it with `flags` (CUgraphInstantiate_flags);
 * handles are returned as integers. On failure `err` says why (a malformed description
 * or the driver's status). */
int foundry_graph_build(const void *desc, size_t len, uint64_t flags, uint64_t *graph, uint64_t *exec, char *err,
                        size_t errlen);
/* Parse a packed description without building it: node and edge counts, or why not. */
int foundry_graph_check(const void *desc, size_t len, uint32_t *nodes, uint32_t *edges, char *err, size_t errlen);
/* The same for a launch plan: kernel funcs index a table of nfuncs functions, only the
 * launch attributes Foundry records are allowed, and copies and sets must be device
 * memory inside [lo, hi) (unchecked when both are 0). */
int foundry_graph_check_indexed(const void *desc, size_t len, size_t nfuncs, uint64_t lo, uint64_t hi,
                                uint32_t *nodes, uint32_t *edges, char *err, size_t errlen);
/* Build and instantiate `count` descriptions (funcs[i]: description i's function table of
 * nfuncs[i] entries, checked as plans against [lo, hi); funcs NULL when they hold handles;
 * flags[i]: description i's instantiation flags, flags NULL for none) on `threads` threads
 * (1-64) in the caller's context. With execs NULL the graphs are built but not instantiated
 * (the caller instantiates them later). All or nothing: on failure nothing stays built and
 * err names the graph. */
int foundry_graph_build_many(const void *const *descs, const size_t *lens, uint32_t count,
                             const uint64_t *const *funcs, const size_t *nfuncs, uint64_t lo, uint64_t hi,
                             const uint64_t *flags, uint32_t threads, uint64_t *graphs, uint64_t *execs, char *err,
                             size_t errlen);
/* Copies up to max entries; *count receives the total. FOUNDRY_ETRUNC when max < total. */
int foundry_region_trace(foundry_alloc_t *out, size_t max, size_t *count);
/* Counters by name: "stream_captures", "graph_instantiates", "allocations", "refused", "images". */
int foundry_counter(const char *name, uint64_t *value);
/* Newline-separated event lines (errors and notable calls), NUL-terminated. */
int foundry_events(char *buf, size_t len, size_t *needed);

/* The module registry. Entries are never removed; `hash` computes the sha256 on first request. */
int foundry_registry_count(size_t *count);
int foundry_registry_entry(size_t index, int hash, foundry_image_t *out);
/* The newest loaded entry for a CUmodule or CUlibrary handle; FOUNDRY_ESTATE when none. */
int foundry_registry_find(uint64_t handle, int32_t kind, size_t *index);
/* Copies the image bytes; len must be at least the entry's size. */
int foundry_registry_copy(size_t index, void *buf, size_t len);
/* The cache preference (CUfunc_cache) last set on a CUfunction or CUkernel handle through
 * cuFuncSetCacheConfig or cuKernelSetCacheConfig; CU_FUNC_CACHE_PREFER_NONE when never set. */
int foundry_cache_config(uint64_t handle, int32_t *config);

#ifdef __cplusplus
}
#endif
#endif
