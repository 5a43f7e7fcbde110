/*
 * foundry_env.h - the FOUNDRY_* variables the hook reads: their names and words.
 *
 * The one place the C side names them; foundry/env.py lists the same variables
 * with their types and meanings, and tests/test_env.py checks that the two agree
 * and that a child started through the launcher parses the same values on both
 * sides (foundry_hook_config reports the hook's). Only config.c reads them.
 */
#ifndef FOUNDRY_ENV_H
#define FOUNDRY_ENV_H

#define FOUNDRY_ENV_MODE "FOUNDRY_MODE"                     /* off | save | load */
#define FOUNDRY_ENV_RANK "FOUNDRY_RANK"                     /* this process's slot in its peers' import zones */
#define FOUNDRY_ENV_REGION_BASE "FOUNDRY_REGION_BASE"       /* the region's base (any base strtoull reads) */
#define FOUNDRY_ENV_REGION_SIZE "FOUNDRY_REGION_SIZE"       /* the region's size in bytes */
#define FOUNDRY_ENV_REGION_THREADS "FOUNDRY_REGION_THREADS" /* owner | any */
#define FOUNDRY_ENV_IMPORT_BASE "FOUNDRY_IMPORT_BASE"       /* the import zone's base */
#define FOUNDRY_ENV_HOOK_ECHO "FOUNDRY_HOOK_ECHO"           /* 1: errors also go to stderr */
#define FOUNDRY_ENV_HOOK_SYMBOLS "FOUNDRY_HOOK_SYMBOLS"     /* 1: log every name cuGetProcAddress resolves */
#define FOUNDRY_ENV_LOAD_CAPTURES "FOUNDRY_LOAD_CAPTURES"   /* allow: a LOAD lets the program capture */
#define FOUNDRY_ENV_SESSION_MARKER "FOUNDRY_SESSION_MARKER" /* the file a session writes when it opens */
#define FOUNDRY_ENV_SESSION_PID "FOUNDRY_SESSION_PID"       /* LOAD: the process foundry run became */

/* The words those variables hold. */
#define FOUNDRY_ENV_MODE_OFF "off"
#define FOUNDRY_ENV_MODE_SAVE "save"
#define FOUNDRY_ENV_MODE_LOAD "load"
#define FOUNDRY_ENV_THREADS_OWNER "owner"
#define FOUNDRY_ENV_THREADS_ANY "any"
#define FOUNDRY_ENV_FLAG_ON "1"
#define FOUNDRY_ENV_CAPTURES_ALLOW "allow"

/* What the hook uses where a variable is unset. */
#define FOUNDRY_ENV_DEFAULT_REGION_BASE 0x600000000000ULL
#define FOUNDRY_ENV_DEFAULT_REGION_SIZE (64ULL << 30)
#define FOUNDRY_ENV_DEFAULT_IMPORT_BASE 0x700000000000ULL

#endif
