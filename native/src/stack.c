/*
 * stack.c - run a callback over perturbed leftovers: lower on the stack, over
 * bytes filled with a pattern, with the heap's free lists reshuffled.
 *
 * SAVE captures each step a second time through foundry_call_shifted: the
 * launchers' frames then sit at other addresses over other leftovers, and
 * their short-lived heap blocks come from other, pattern-filled chunks, so
 * parameter bytes a launcher left uninitialised differ from the first
 * capture's. That is how SAVE tells them from real data.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hook.h"

#define MAX_SHIFT (1u << 20)
#define MAX_POISON (4u << 20)

/* Fill `bytes` below this frame; after it returns, the callee's frames reuse them. */
__attribute__((noinline)) static void fill(size_t bytes, int pattern) {
    volatile unsigned char area[bytes];
    memset((void *)area, pattern, bytes);
    __asm__ volatile("" : : "r"(area) : "memory");
}

#define HEAP_SIZES 120  /* chunk sizes 16, 32, ... 1024, then 1152, 1280, ... 8192 bytes */
#define HEAP_PER_SIZE 8

static size_t chunk_size(size_t i) {
    size_t k = i / HEAP_PER_SIZE;
    return k < 64 ? 16 * (k + 1) : 1024 + 128 * (k - 63);
}

/* Take chunks of every small size, fill them with the pattern and give every other
 * one back: the callee's small allocations land elsewhere, on patterned bytes. */
static void **shuffle_heap(int pattern) {
    void **held = calloc(HEAP_SIZES * HEAP_PER_SIZE, sizeof *held);
    if (held == NULL) return NULL;
    for (size_t i = 0; i < HEAP_SIZES * HEAP_PER_SIZE; i++) {
        size_t size = chunk_size(i);
        held[i] = malloc(size);
        if (held[i]) memset(held[i], pattern, size);
    }
    for (size_t i = 0; i < HEAP_SIZES * HEAP_PER_SIZE; i += 2) {
        free(held[i]);
        held[i] = NULL;
    }
    return held;
}

static void release_heap(void **held) {
    if (held == NULL) return;
    for (size_t i = 0; i < HEAP_SIZES * HEAP_PER_SIZE; i++) free(held[i]);
    free(held);
}

#define MARGIN (256u << 10) /* what the callback itself may need below the poisoned bytes */

/* Bytes of this thread's stack below the caller, or 0 when unknown. */
static size_t stack_room(void) {
    pthread_attr_t attr;
    void *low = NULL;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return 0;
    int ok = pthread_attr_getstack(&attr, &low, &size) == 0;
    pthread_attr_destroy(&attr);
    char here;
    return ok ? (size_t)(&here - (char *)low) : 0;
}

__attribute__((noinline)) int foundry_call_shifted(size_t shift, size_t poison, int pattern,
                                                   void (*fn)(void *), void *arg) {
    if (fn == NULL || shift == 0 || shift > MAX_SHIFT || poison == 0 || poison > MAX_POISON) return FOUNDRY_EINVAL;
    size_t room = stack_room();
    if (room != 0 && room < shift + poison + MARGIN) { /* 0: unknown, let it be */
        fh_event("error: %zu bytes of stack left, too few to shift by %zu over %zu patterned bytes", room, shift, poison);
        return FOUNDRY_ESTATE;
    }
    volatile unsigned char pad[shift]; /* moves the callee's frames down by `shift` bytes */
    pad[0] = 0;
    void **held = shuffle_heap(pattern);
    fill(poison, pattern);
    fn(arg);
    release_heap(held);
    __asm__ volatile("" : : "r"(pad) : "memory");
    return FOUNDRY_OK;
}
