/*
 * resolve.c - the real driver entry points, for every unit of the hook.
 *
 * The hook reaches the driver's own functions through fh_real(): by exported
 * (versioned) name, looked up once in libcuda with the real dlsym (dlsym takes the
 * loader's lock) and cached. interpose.c offers the real functions it meets on the
 * way (what the application's dlsym or cuGetProcAddress returned) with
 * fh_real_offer(): the first one offered for a name is the one fh_real gives, so
 * a hooked name and its caller use the same function. Entries are filled under
 * the lock and published by the count; readers need no lock.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "hook.h"

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn real_dlsym_fn;

static dlsym_fn real_dlsym(void) {
    if (real_dlsym_fn == NULL) {
        /* glibc 2.34 moved dlsym into libc; older ones version it GLIBC_2.2.5 */
        real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (real_dlsym_fn == NULL) real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    return real_dlsym_fn;
}

void *fh_real_dlsym(void *handle, const char *symbol) {
    dlsym_fn next = real_dlsym();
    return next ? next(handle, symbol) : NULL;
}

void *fh_libcuda(void) {
    static void *handle;
    if (handle == NULL) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    return handle;
}

/* Every entry point resolved so far: the hooked ones and those Foundry calls itself
 * (graph building, VMM calls per allocation). */
#define MAX_ENTRIES 128
static struct {
    char name[64];
    void *fn;
} entries[MAX_ENTRIES];
static atomic_int entry_count;
static pthread_mutex_t entries_lock = PTHREAD_MUTEX_INITIALIZER;

static void *cached(const char *name) {
    int n = atomic_load_explicit(&entry_count, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (strcmp(entries[i].name, name) == 0) return entries[i].fn;
    return NULL;
}

/* Cache fn for name unless an entry is there already; the entry that stands. */
static void *remember(const char *name, void *fn) {
    pthread_mutex_lock(&entries_lock);
    void *known = cached(name);
    int n = atomic_load_explicit(&entry_count, memory_order_relaxed);
    if (known == NULL && n < MAX_ENTRIES && strlen(name) < sizeof entries[n].name) {
        strcpy(entries[n].name, name);
        entries[n].fn = fn;
        atomic_store_explicit(&entry_count, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&entries_lock);
    return known ? known : fn;
}

void fh_real_offer(const char *exported, void *fn) {
    if (exported && fn) remember(exported, fn);
}

void *fh_real(const char *exported) {
    void *fn = cached(exported);
    if (fn) return fn;
    void *lib = fh_libcuda();
    fn = lib ? fh_real_dlsym(lib, exported) : NULL;
    if (fn == NULL) {
        fh_event("error: driver entry point %s not found", exported);
        return NULL;
    }
    return remember(exported, fn);
}

const char *fh_driver_missing(const char *const *names, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (fh_real(names[i]) == NULL) return names[i];
    return NULL;
}
