/*
 * session_check.c - a LOAD whose program never opened a session fails.
 *
 * `foundry run --mode load` becomes the program (exec): no launcher is left to see
 * how it ended. It names the process it became (FOUNDRY_SESSION_PID) and a marker
 * file that a session writes when it opens, in whichever process of the program
 * opens it (FOUNDRY_SESSION_MARKER). In that one process, as it exits, the hook
 * reads the exit status: 0 without the marker restored nothing and becomes 2, said
 * in one line (the launcher's wording, for the runs it waits for itself). Any other
 * status stays the program's. The marker and its directory are removed either way.
 * A process that replaces itself again (a shell's exec) keeps its pid and loads the
 * hook again, so the check moves with it; a child it forks inherits the exit handler
 * but is not checked. Before that check it says the hook's own time before CUDA
 * started (pre_cuda.c).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hook.h"

#define NO_SESSION                                                                                      \
    "foundry: error: the program exited 0 but never opened a LOAD session: nothing was restored (does " \
    "it call foundry.runtime.open_session()?)\n"

static char marker[PATH_MAX];
static pid_t armed; /* the process checked: a child forked from it inherits the handler, not the check */

static void remove_marker(void) {
    unlink(marker);
    char *slash = strrchr(marker, '/');
    if (slash == NULL || slash == marker) return;
    *slash = '\0'; /* the directory the launcher made for it, empty now */
    rmdir(marker);
    *slash = '/';
}

static void check_session_at_exit(int status, void *unused) {
    (void)unused;
    if (getpid() != armed) return;
    fh_pre_cuda_say(stderr);
    int opened = access(marker, F_OK) == 0;
    remove_marker();
    if (status != 0 || opened) return;
    fflush(NULL);
    fputs(NO_SESSION, stderr);
    _exit(2);
}

static void arm(void) {
    const char *path = fh_env_text(FOUNDRY_ENV_SESSION_MARKER);
    if (!fh_env_session_checked() || strlen(path) >= sizeof marker) return;
    memcpy(marker, path, strlen(path) + 1);
    armed = getpid();
    on_exit(check_session_at_exit, NULL);
}

__attribute__((constructor)) static void arm_session_check(void) {
    uint64_t begun = fh_pre_cuda_clock();
    arm();
    fh_pre_cuda_constructor(begun);
}
