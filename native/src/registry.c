/*
 * registry.c - the module registry: every code image the process loads.
 *
 * Each module and library load (cuModuleLoad*, cuLibraryLoad*) is recorded with
 * its handle, size and format. Images inside a loaded shared object (cudart's
 * registered fatbins, which are most of them) stay where they are; any other
 * image (Triton's cubins, a JIT's PTX) is copied, since its owner may free it.
 * The sha256 is computed only when asked for: torch alone registers about a
 * gigabyte of fatbins, and a graph uses a few of them.
 */
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hook.h"
#include "sha256.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u
#define MAX_TEXT_IMAGE (1ULL << 30)

struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t fat_size;
};

struct fatbin_wrapper {
    int32_t magic;
    int32_t version;
    const void *data;
    const void *filename_or_fatbins;
};

struct entry {
    foundry_image_t info;
    const void *data;
    void *owned;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *entries;
static size_t count, capacity;

/* -- image geometry ----------------------------------------------------------------- */

static size_t elf_size(const Elf64_Ehdr *eh) {
    size_t size = eh->e_shoff + (size_t)eh->e_shnum * eh->e_shentsize;
    size_t ph = eh->e_phoff + (size_t)eh->e_phnum * eh->e_phentsize;
    if (ph > size) size = ph;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)((const char *)eh + eh->e_shoff);
    for (int i = 0; eh->e_shoff && i < eh->e_shnum; i++)
        if (sh[i].sh_type != SHT_NOBITS && sh[i].sh_offset + sh[i].sh_size > size) size = sh[i].sh_offset + sh[i].sh_size;
    return size;
}

/* The image's first byte, size and format; a fatbin wrapper is followed to its data. */
static const void *measure(const void *image, size_t *size, int32_t *format) {
    uint32_t magic;
    memcpy(&magic, image, sizeof magic);
    if (magic == FATBIN_WRAPPER_MAGIC) {
        image = ((const struct fatbin_wrapper *)image)->data;
        memcpy(&magic, image, sizeof magic);
    }
    if (magic == FATBIN_MAGIC) {
        const struct fatbin_header *h = image;
        *size = h->header_size + h->fat_size;
        *format = FOUNDRY_IMAGE_FATBIN;
    } else if (memcmp(image, ELFMAG, SELFMAG) == 0) {
        *size = elf_size(image);
        *format = FOUNDRY_IMAGE_CUBIN;
    } else {
        *size = strnlen(image, MAX_TEXT_IMAGE) + 1;
        *format = FOUNDRY_IMAGE_PTX;
    }
    return image;
}

static int inside_loaded_object(const void *address) {
    Dl_info info;
    return dladdr(address, &info) != 0 && info.dli_fname != NULL;
}

/* -- recording ------------------------------------------------------------------------ */

static void record(int32_t kind, uint64_t handle, const void *image, int preserved) {
    size_t size;
    int32_t format;
    const void *start = measure(image, &size, &format);
    void *owned = NULL;
    if (!preserved && !inside_loaded_object(start)) {
        owned = malloc(size);
        if (owned == NULL) {
            fh_event("error: cannot copy a %zu-byte module image; it will be missing from SAVE", size);
            return;
        }
        memcpy(owned, start, size);
        start = owned;
    }
    pthread_mutex_lock(&lock);
    if (count == capacity) {
        size_t grown = capacity ? 2 * capacity : 256;
        struct entry *bigger = realloc(entries, grown * sizeof *bigger);
        if (bigger == NULL) {
            pthread_mutex_unlock(&lock);
            free(owned);
            fh_event("error: module registry is out of memory");
            return;
        }
        entries = bigger;
        capacity = grown;
    }
    struct entry *e = &entries[count++];
    memset(e, 0, sizeof *e);
    e->info = (foundry_image_t){.handle = handle, .size = size, .kind = kind, .format = format, .copied = owned != NULL};
    e->data = start;
    e->owned = owned;
    pthread_mutex_unlock(&lock);
    fh_count("images");
}

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    void *data = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n + 1)) != NULL) {
            if (fread(data, 1, (size_t)n, f) != (size_t)n) {
                free(data);
                data = NULL;
            } else {
                ((char *)data)[n] = '\0'; /* a PTX file is text */
                *size = (size_t)n;
            }
        }
    }
    fclose(f);
    return data;
}

static void record_file(int32_t kind, uint64_t handle, const char *path) {
    size_t size = 0;
    void *data = path ? read_file(path, &size) : NULL;
    if (data == NULL) {
        fh_event("error: cannot read module file %s; it will be missing from SAVE", path ? path : "(null)");
        return;
    }
    record(kind, handle, data, 0);
    free(data);
}

static void unloaded(uint64_t handle, int32_t kind) {
    pthread_mutex_lock(&lock);
    for (size_t i = count; i-- > 0;)
        if (entries[i].info.handle == handle && entries[i].info.kind == kind && !entries[i].info.unloaded) {
            entries[i].info.unloaded = 1;
            break;
        }
    pthread_mutex_unlock(&lock);
}

/* -- hooks ---------------------------------------------------------------------------- */

#define REAL(fn) ((__typeof__(&fn))fh_real(#fn))

CUresult fh_module_load(CUmodule *module, const char *fname) {
    CUresult rc = REAL(cuModuleLoad)(module, fname);
    if (rc == CUDA_SUCCESS) record_file(FOUNDRY_IMAGE_MODULE, (uint64_t)*module, fname);
    return rc;
}

CUresult fh_module_load_data(CUmodule *module, const void *image) {
    CUresult rc = REAL(cuModuleLoadData)(module, image);
    if (rc == CUDA_SUCCESS) record(FOUNDRY_IMAGE_MODULE, (uint64_t)*module, image, 0);
    return rc;
}

CUresult fh_module_load_data_ex(CUmodule *module, const void *image, unsigned int n, CUjit_option *options,
                                void **values) {
    CUresult rc = REAL(cuModuleLoadDataEx)(module, image, n, options, values);
    if (rc == CUDA_SUCCESS) record(FOUNDRY_IMAGE_MODULE, (uint64_t)*module, image, 0);
    return rc;
}

CUresult fh_module_load_fat_binary(CUmodule *module, const void *fat_cubin) {
    CUresult rc = REAL(cuModuleLoadFatBinary)(module, fat_cubin);
    if (rc == CUDA_SUCCESS) record(FOUNDRY_IMAGE_MODULE, (uint64_t)*module, fat_cubin, 0);
    return rc;
}

static int preserved(CUlibraryOption *options, unsigned int n) {
    for (unsigned int i = 0; options && i < n; i++)
        if (options[i] == CU_LIBRARY_BINARY_IS_PRESERVED) return 1;
    return 0;
}

CUresult fh_library_load_data(CUlibrary *library, const void *code, CUjit_option *jit, void **jit_values,
                              unsigned int n_jit, CUlibraryOption *options, void **values, unsigned int n) {
    CUresult rc = REAL(cuLibraryLoadData)(library, code, jit, jit_values, n_jit, options, values, n);
    if (rc == CUDA_SUCCESS) record(FOUNDRY_IMAGE_LIBRARY, (uint64_t)*library, code, preserved(options, n));
    return rc;
}

CUresult fh_library_load_from_file(CUlibrary *library, const char *path, CUjit_option *jit, void **jit_values,
                                   unsigned int n_jit, CUlibraryOption *options, void **values, unsigned int n) {
    CUresult rc = REAL(cuLibraryLoadFromFile)(library, path, jit, jit_values, n_jit, options, values, n);
    if (rc == CUDA_SUCCESS) record_file(FOUNDRY_IMAGE_LIBRARY, (uint64_t)*library, path);
    return rc;
}

CUresult fh_module_unload(CUmodule module) {
    unloaded((uint64_t)module, FOUNDRY_IMAGE_MODULE);
    fh_cache_config_forget((uint64_t)module);
    return REAL(cuModuleUnload)(module);
}

CUresult fh_library_unload(CUlibrary library) {
    unloaded((uint64_t)library, FOUNDRY_IMAGE_LIBRARY);
    fh_cache_config_forget((uint64_t)library);
    return REAL(cuLibraryUnload)(library);
}

/* -- control API ---------------------------------------------------------------------- */

int foundry_registry_count(size_t *out) {
    if (out == NULL) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    *out = count;
    pthread_mutex_unlock(&lock);
    return FOUNDRY_OK;
}

int foundry_registry_entry(size_t index, int hash, foundry_image_t *out) {
    if (out == NULL) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    int status = FOUNDRY_EINVAL;
    if (index < count) {
        struct entry *e = &entries[index];
        if (hash && !e->info.hashed && !e->info.unloaded) {
            fh_sha256(e->data, e->info.size, e->info.sha256);
            e->info.hashed = 1;
        }
        *out = e->info;
        status = FOUNDRY_OK;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

int foundry_registry_find(uint64_t handle, int32_t kind, size_t *index) {
    if (index == NULL) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    int status = FOUNDRY_ESTATE;
    for (size_t i = count; i-- > 0;)
        if (entries[i].info.handle == handle && entries[i].info.kind == kind && !entries[i].info.unloaded) {
            *index = i;
            status = FOUNDRY_OK;
            break;
        }
    pthread_mutex_unlock(&lock);
    return status;
}

int foundry_registry_copy(size_t index, void *buf, size_t len) {
    pthread_mutex_lock(&lock);
    int status = FOUNDRY_EINVAL;
    if (index < count && buf && len >= entries[index].info.size && !entries[index].info.unloaded) {
        memcpy(buf, entries[index].data, entries[index].info.size);
        status = FOUNDRY_OK;
    }
    pthread_mutex_unlock(&lock);
    return status;
}
