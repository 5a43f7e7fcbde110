/*
 * events.c - the hook's report channel: a bounded event log and named counters.
 *
 * The hook never aborts to report: it records what happened here, and Python
 * reads it through the control API. With FOUNDRY_HOOK_ECHO=1 (set by `foundry
 * run`) it also writes errors to stderr (the first 64), for the refusals no Python session
 * reads: a program that captures in LOAD mode sees only the driver's status.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hook.h"

#define EVENT_BYTES (64 * 1024)
#define MAX_COUNTERS 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char events[EVENT_BYTES];
static size_t events_len;
static int events_dropped;

static struct {
    const char *name;
    uint64_t value;
} counters[MAX_COUNTERS];

#define MAX_ECHOED 64 /* errors written to stderr; the log keeps the rest */

static int echo_enabled;
static int echoed;

/* Read once as the library loads, before the program can change its environment. */
__attribute__((constructor)) static void read_echo_setting(void) {
    uint64_t begun = fh_pre_cuda_clock();
    echo_enabled = fh_env_flag(FOUNDRY_ENV_HOOK_ECHO);
    fh_pre_cuda_constructor(begun);
}

void fh_event(const char *fmt, ...) {
    char line[512];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    if (n < 0) return;
    size_t len = (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 2;
    line[len++] = '\n';
    int echo = 0;
    pthread_mutex_lock(&lock);
    if (echo_enabled && strncmp(line, "error:", 6) == 0 && echoed < MAX_ECHOED) echo = ++echoed;
    if (events_len + len < EVENT_BYTES) {
        memcpy(events + events_len, line, len);
        events_len += len;
    } else {
        events_dropped = 1;
    }
    pthread_mutex_unlock(&lock);
    if (echo) fprintf(stderr, "foundry hook: %.*s", (int)len, line);
}

void fh_count_add(const char *name, uint64_t amount) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_COUNTERS; i++) {
        if (counters[i].name == NULL) counters[i].name = name;
        if (strcmp(counters[i].name, name) == 0) {
            counters[i].value += amount;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
}

void fh_count(const char *name) { fh_count_add(name, 1); }

CUresult fh_refuse(CUresult rc, const char *fmt, ...) {
    fh_count("refused");
    char message[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    fh_event("error: %s", message);
    return rc;
}

int foundry_counter(const char *name, uint64_t *value) {
    if (name == NULL || value == NULL) return FOUNDRY_EINVAL;
    *value = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_COUNTERS && counters[i].name; i++) {
        if (strcmp(counters[i].name, name) == 0) *value = counters[i].value;
    }
    pthread_mutex_unlock(&lock);
    return FOUNDRY_OK;
}

int foundry_events(char *buf, size_t len, size_t *needed) {
    if (buf == NULL && len) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    const char *tail = events_dropped ? "(events dropped: log full)\n" : "";
    size_t total = events_len + strlen(tail);
    if (needed) *needed = total + 1;
    int status = FOUNDRY_OK;
    if (len) {
        size_t n = total < len - 1 ? total : len - 1;
        size_t head = n < events_len ? n : events_len;
        memcpy(buf, events, head);
        memcpy(buf + head, tail, n - head);
        buf[n] = '\0';
        if (n < total) status = FOUNDRY_ETRUNC;
    }
    pthread_mutex_unlock(&lock);
    return status;
}
