/* SHA-256 of a byte range (sha256.c). */
#ifndef FOUNDRY_SHA256_H
#define FOUNDRY_SHA256_H

#include <stddef.h>
#include <stdint.h>

void fh_sha256(const void *data, size_t len, uint8_t out[32]);

#endif
