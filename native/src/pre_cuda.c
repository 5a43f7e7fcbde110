/*
 * pre_cuda.c - what the hook costs a program before CUDA starts.
 *
 * Until the program resolves its first driver entry point through the hook (dlsym of
 * a hooked name, or cuGetProcAddress), the hook's only work is its constructors and
 * the lookup its dlsym does for every symbol the program asks for (Python's import of
 * each extension module is one). That time is summed here, with the lookups counted;
 * after CUDA starts no clock is read. The process `foundry run --mode load` became
 * says it at exit (session_check.c), beside the launcher's own line.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "hook.h"

static atomic_int cuda_started;
static atomic_ullong spent_ns, lookups, constructors;

uint64_t fh_pre_cuda_clock(void) {
    if (atomic_load_explicit(&cuda_started, memory_order_relaxed)) return 0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

static void add_since(uint64_t begun, atomic_ullong *count) {
    if (begun == 0) return;
    uint64_t now = fh_pre_cuda_clock();
    if (now == 0) return; /* CUDA started meanwhile: the rest is not before it */
    atomic_fetch_add_explicit(&spent_ns, now - begun, memory_order_relaxed);
    atomic_fetch_add_explicit(count, 1, memory_order_relaxed);
}

void fh_pre_cuda_lookup(uint64_t begun) { add_since(begun, &lookups); }

void fh_pre_cuda_constructor(uint64_t begun) { add_since(begun, &constructors); }

void fh_pre_cuda_end(void) {
    if (!atomic_load_explicit(&cuda_started, memory_order_relaxed)) atomic_store(&cuda_started, 1);
}

void fh_pre_cuda_say(FILE *out) {
    fprintf(out, "foundry: hook: %.3f ms of its own before CUDA started (%llu symbol lookups, %llu constructors%s)\n",
            (double)atomic_load(&spent_ns) / 1e6, (unsigned long long)atomic_load(&lookups),
            (unsigned long long)atomic_load(&constructors),
            atomic_load(&cuda_started) ? "" : "; CUDA never started");
}
