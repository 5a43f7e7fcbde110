/*
 * config.c - the FOUNDRY_* variables the hook reads, parsed in one place.
 *
 * Their names and words come from foundry_env.h. Each unit asks here at the moment
 * it reads one: the region once, at its first use; the event log as the library
 * loads; the import zone, the rank slot and the capture policy at each use.
 * Nothing here logs (the event log itself reads its setting here): a caller that
 * gets a value it cannot use says so. foundry_hook_config reports what these
 * parsers make of the environment now.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hook.h"

const char *fh_env_text(const char *name) { return getenv(name); }

static int is(const char *name, const char *word) {
    const char *text = getenv(name);
    return text && strcmp(text, word) == 0;
}

int fh_env_mode(void) {
    if (is(FOUNDRY_ENV_MODE, FOUNDRY_ENV_MODE_SAVE)) return FOUNDRY_MODE_SAVE;
    if (is(FOUNDRY_ENV_MODE, FOUNDRY_ENV_MODE_LOAD)) return FOUNDRY_MODE_LOAD;
    return FOUNDRY_MODE_OFF;
}

int fh_env_u64(const char *name, uint64_t fallback, uint64_t *out) {
    const char *text = getenv(name);
    *out = fallback;
    if (text == NULL || *text == '\0') return 0;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 0);
    if (end == NULL || *end != '\0') return -1;
    *out = value;
    return 0;
}

int fh_env_flag(const char *name) { return is(name, FOUNDRY_ENV_FLAG_ON); }

int fh_env_region_threads(void) {
    const char *text = getenv(FOUNDRY_ENV_REGION_THREADS);
    if (text == NULL || *text == '\0' || strcmp(text, FOUNDRY_ENV_THREADS_OWNER) == 0) return 0;
    return strcmp(text, FOUNDRY_ENV_THREADS_ANY) == 0 ? 1 : -1;
}

long fh_env_rank(void) {
    const char *text = getenv(FOUNDRY_ENV_RANK);
    if (text == NULL || *text == '\0') return 0;
    char *end = NULL;
    long rank = strtol(text, &end, 10);
    return *end == '\0' && rank >= 0 ? rank : -1;
}

uint64_t fh_env_import_base(void) {
    const char *text = getenv(FOUNDRY_ENV_IMPORT_BASE);
    return text && *text ? strtoull(text, NULL, 0) : FOUNDRY_ENV_DEFAULT_IMPORT_BASE;
}

int fh_env_load_captures_allowed(void) { return is(FOUNDRY_ENV_LOAD_CAPTURES, FOUNDRY_ENV_CAPTURES_ALLOW); }

long fh_env_session_pid(void) {
    const char *text = getenv(FOUNDRY_ENV_SESSION_PID);
    if (text == NULL || *text == '\0') return 0;
    char *end = NULL;
    long pid = strtol(text, &end, 10);
    return *end == '\0' && pid > 0 ? pid : -1;
}

int fh_env_session_checked(void) {
    const char *marker = getenv(FOUNDRY_ENV_SESSION_MARKER);
    return fh_env_mode() == FOUNDRY_MODE_LOAD && marker != NULL && *marker && fh_env_session_pid() == (long)getpid();
}

/* -- control API ------------------------------------------------------------------- */

int foundry_hook_config(foundry_config_t *out) {
    if (out == NULL) return FOUNDRY_EINVAL;
    uint64_t base, size;
    int bad = fh_env_u64(FOUNDRY_ENV_REGION_BASE, FOUNDRY_ENV_DEFAULT_REGION_BASE, &base) |
              fh_env_u64(FOUNDRY_ENV_REGION_SIZE, FOUNDRY_ENV_DEFAULT_REGION_SIZE, &size);
    *out = (foundry_config_t){
        .mode = fh_env_mode(),
        .region_threads = fh_env_region_threads(),
        .region_base = base,
        .region_size = size,
        .import_base = fh_env_import_base(),
        .rank = fh_env_rank(),
        .hook_echo = fh_env_flag(FOUNDRY_ENV_HOOK_ECHO),
        .hook_symbols = fh_env_flag(FOUNDRY_ENV_HOOK_SYMBOLS),
        .load_captures = fh_env_load_captures_allowed(),
        .region_numbers_ok = bad == 0,
        .session_pid = fh_env_session_pid(),
        .session_marker = fh_env_text(FOUNDRY_ENV_SESSION_MARKER) != NULL && *fh_env_text(FOUNDRY_ENV_SESSION_MARKER) != '\0',
        .session_checked = fh_env_session_checked(),
    };
    return FOUNDRY_OK;
}
