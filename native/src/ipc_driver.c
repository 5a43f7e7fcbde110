/*
 * ipc_driver.c - the driver's IPC calls on region memory, through Foundry handles.
 *
 * In SAVE or LOAD mode, cuIpcGetMemHandle on region memory exports the allocation's
 * physical memory as a POSIX descriptor and returns a Foundry handle in the 64 bytes
 * of a CUipcMemHandle (ipc.c carries the descriptor between processes).
 * cuIpcOpenMemHandle on such a handle fetches the descriptor from the exporter and
 * maps it in this process's import zone: one reservation at a fixed address
 * (FOUNDRY_IMPORT_BASE), one slot of the region's size per rank, the allocation at
 * its offset in the exporter's region. Peer memory therefore has the same address
 * in every SAVE and LOAD process. Each open is counted and needs its own close; the
 * mapping goes with the last one. Memory outside the region, handles that are not
 * Foundry's, a peer whose region sits elsewhere and a taken import zone are refused
 * by name in the event log: none of them could be reproduced.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hook.h"

#define MAX_SLOTS 8
#define MAX_EXPORTS 1024
#define MAX_MAPPINGS 1024

typedef CUresult (*get_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*close_fn)(CUdeviceptr);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    size_t offset; /* the allocation's offset in this process's region */
    foundry_ipc_handle_t handle;
} exported[MAX_EXPORTS];
static size_t exported_count;

static struct {
    int used;
    foundry_ipc_handle_t handle;
    CUdeviceptr address;
    size_t size;
    CUmemGenericAllocationHandle memory;
} mapped[MAX_MAPPINGS];

static CUdeviceptr zone;   /* the import zone, once reserved */

/* This process's slot in its peers' import zones (its rank), or -1 when it has none. */
static int rank_slot(void) {
    long rank = fh_env_rank();
    return rank >= 0 && rank < MAX_SLOTS ? (int)rank : -1;
}

/* The driver's VMM sharing calls, present or refused by name (no call through NULL). */
static int sharing_present(void) {
    static const char *const names[] = {"cuMemExportToShareableHandle", "cuMemImportFromShareableHandle",
                                        "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess"};
    return fh_driver_missing(names, sizeof names / sizeof names[0]) == NULL;
}

/* The cached export of the allocation at `offset`, or -1. Call with the lock held. */
static int cached_export(size_t offset) {
    for (size_t i = 0; i < exported_count; i++)
        if (exported[i].offset == offset) return (int)i;
    return -1;
}

CUresult fh_ipc_get_mem_handle(CUipcMemHandle *out, CUdeviceptr dptr) {
    if (fh_region_mode() == FOUNDRY_MODE_OFF) return ((get_fn)fh_real("cuIpcGetMemHandle"))(out, dptr);
    if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
    size_t offset, size, region_size;
    CUmemGenericAllocationHandle memory;
    CUdeviceptr base;
    CUmemAccessDesc access;
    int slot = rank_slot();
    if (!fh_region_lookup(dptr, &offset, &size, &memory) || !fh_region_geometry(&base, &region_size, &access))
        return fh_refuse(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle of 0x%llx: not region memory",
                         (unsigned long long)dptr);
    if (slot < 0)
        return fh_refuse(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle: " FOUNDRY_ENV_RANK "=%s has no slot in an "
                         "import zone (ranks 0-%d)", fh_env_text(FOUNDRY_ENV_RANK), MAX_SLOTS - 1);
    if (!sharing_present())
        return fh_refuse(CUDA_ERROR_NOT_SUPPORTED, "cuIpcGetMemHandle: the driver lacks the VMM sharing calls");
    pthread_mutex_lock(&lock);
    int hit = cached_export(offset); /* one export per allocation: its handle again */
    if (hit >= 0) memcpy(out, &exported[hit].handle, sizeof *out);
    pthread_mutex_unlock(&lock);
    if (hit >= 0) return CUDA_SUCCESS;
    int fd = -1;
    CUresult rc = DRIVER(cuMemExportToShareableHandle)(&fd, memory, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc != CUDA_SUCCESS)
        return fh_refuse(rc, "cuIpcGetMemHandle of 0x%llx: the allocation cannot be exported (status %d)",
                         (unsigned long long)dptr, (int)rc);
    foundry_ipc_handle_t handle;
    int status = foundry_ipc_export(fd, (uint16_t)slot, base, offset, size, &handle);
    close(fd); /* the exporter keeps its own copy */
    if (status != FOUNDRY_OK)
        return fh_refuse(CUDA_ERROR_OPERATING_SYSTEM, "cuIpcGetMemHandle of 0x%llx: export failed (%d)",
                         (unsigned long long)dptr, status);
    pthread_mutex_lock(&lock);
    hit = cached_export(offset); /* another thread exported it meanwhile: keep the first handle */
    int keep = hit < 0 && exported_count < MAX_EXPORTS;
    if (keep) {
        exported[exported_count].offset = offset;
        exported[exported_count].handle = handle;
        hit = (int)exported_count++;
    }
    if (hit >= 0) memcpy(out, &exported[hit].handle, sizeof *out);
    pthread_mutex_unlock(&lock);
    if (!keep) foundry_ipc_unexport(handle.export_id); /* the first handle stands, or there is no room */
    if (hit < 0)
        return fh_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuIpcGetMemHandle: more than %d live exports", MAX_EXPORTS);
    return CUDA_SUCCESS;
}

void fh_ipc_forget(size_t offset) {
    pthread_mutex_lock(&lock);
    int hit = cached_export(offset);
    if (hit >= 0) { /* the memory was freed: withdraw its export so it can be released */
        foundry_ipc_unexport(exported[hit].handle.export_id);
        exported[hit] = exported[--exported_count];
    }
    pthread_mutex_unlock(&lock);
}

static CUdeviceptr zone_base(void) { return fh_env_import_base(); }

int foundry_ipc_zone(uint64_t *base, uint64_t *slot, uint32_t *slots) {
    if (base == NULL || slot == NULL || slots == NULL) return FOUNDRY_EINVAL;
    foundry_region_info_t region; /* the configured size, reserved or not */
    foundry_region_info(&region);
    *base = zone_base(), *slot = region.size, *slots = MAX_SLOTS;
    return FOUNDRY_OK;
}

/* The import zone, reserved on first use at its fixed address, in slots of the region's
 * size (a peer's whole region fits in its slot). Call with the lock held. */
static CUresult reserve_zone(size_t slot_size) {
    if (zone) return CUDA_SUCCESS;
    CUdeviceptr want = zone_base(), got = 0;
    CUresult rc = DRIVER(cuMemAddressReserve)(&got, slot_size * MAX_SLOTS, GiB, want, 0);
    if (rc != CUDA_SUCCESS || got != want) {
        if (rc == CUDA_SUCCESS) DRIVER(cuMemAddressFree)(got, slot_size * MAX_SLOTS);
        return fh_refuse(CUDA_ERROR_OUT_OF_MEMORY, "the import zone at 0x%llx is taken (the driver gave 0x%llx)",
                         (unsigned long long)want, (unsigned long long)got);
    }
    zone = got;
    fh_event("ipc: import zone 0x%llx, %d slots of %zu bytes", (unsigned long long)zone, MAX_SLOTS, slot_size);
    return CUDA_SUCCESS;
}

/* Map the descriptor at the handle's address in the zone; the mapping's index or -1. */
static int map_import(const foundry_ipc_handle_t *h, int fd, CUdeviceptr at, const CUmemAccessDesc *access) {
    int slot = -1;
    for (int i = 0; i < MAX_MAPPINGS && slot < 0; i++)
        if (!mapped[i].used) slot = i;
    if (slot < 0) return -1;
    CUmemGenericAllocationHandle memory;
    CUresult rc = DRIVER(cuMemImportFromShareableHandle)(&memory, (void *)(intptr_t)fd,
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (rc != CUDA_SUCCESS) return -1;
    rc = DRIVER(cuMemMap)(at, h->size, 0, memory, 0);
    if (rc != CUDA_SUCCESS) { /* nothing of ours is mapped there: leave the range alone */
        DRIVER(cuMemRelease)(memory);
        return -1;
    }
    rc = DRIVER(cuMemSetAccess)(at, h->size, access, 1);
    if (rc != CUDA_SUCCESS) {
        DRIVER(cuMemUnmap)(at, h->size);
        DRIVER(cuMemRelease)(memory);
        return -1;
    }
    mapped[slot].used = 1, mapped[slot].handle = *h, mapped[slot].address = at, mapped[slot].size = h->size;
    mapped[slot].memory = memory;
    return slot;
}

static CUresult open_handle(const char *real, CUdeviceptr *dptr, CUipcMemHandle raw, unsigned int flags);

/* Each name passes through to its own driver function when the hook is off. */
CUresult fh_ipc_open_mem_handle(CUdeviceptr *dptr, CUipcMemHandle raw, unsigned int flags) {
    return open_handle("cuIpcOpenMemHandle_v2", dptr, raw, flags);
}

CUresult fh_ipc_open_mem_handle_v1(CUdeviceptr *dptr, CUipcMemHandle raw, unsigned int flags) {
    return open_handle("cuIpcOpenMemHandle", dptr, raw, flags);
}

static CUresult open_handle(const char *real, CUdeviceptr *dptr, CUipcMemHandle raw, unsigned int flags) {
    if (fh_region_mode() == FOUNDRY_MODE_OFF) return ((open_fn)fh_real(real))(dptr, raw, flags);
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    foundry_ipc_handle_t h;
    memcpy(&h, &raw, sizeof h);
    CUdeviceptr base;
    CUmemAccessDesc access;
    size_t region_size;
    if (foundry_ipc_check(&h) == FOUNDRY_IPC_EFORMAT)
        return fh_refuse(CUDA_ERROR_INVALID_HANDLE, "cuIpcOpenMemHandle: not a Foundry handle (the exporter ran "
                         "without the hook?)");
    if (!fh_region_geometry(&base, &region_size, &access))
        return fh_refuse(CUDA_ERROR_NOT_INITIALIZED, "cuIpcOpenMemHandle before this process's region exists");
    if (h.region_base != base)
        return fh_refuse(CUDA_ERROR_INVALID_HANDLE,
                         "cuIpcOpenMemHandle: the peer's region is at 0x%llx, this one at 0x%llx",
                         (unsigned long long)h.region_base, (unsigned long long)base);
    if (h.rank_slot >= MAX_SLOTS || h.offset > region_size || h.size > region_size - h.offset)
        return fh_refuse(CUDA_ERROR_INVALID_HANDLE, "cuIpcOpenMemHandle: rank slot %u, offset %llu out of the zone",
                         (unsigned)h.rank_slot, (unsigned long long)h.offset);
    int fd = -1;
    int status = foundry_ipc_open(&h, &fd); /* one reference per open */
    if (status != FOUNDRY_IPC_OK)
        return fh_refuse(CUDA_ERROR_INVALID_HANDLE, "cuIpcOpenMemHandle of rank %u's memory refused (status %d)",
                         (unsigned)h.rank_slot, status);
    pthread_mutex_lock(&lock);
    CUresult rc = reserve_zone(region_size);
    CUdeviceptr at = zone + (CUdeviceptr)h.rank_slot * region_size + h.offset;
    for (int i = 0; rc == CUDA_SUCCESS && i < MAX_MAPPINGS; i++) {
        if (mapped[i].used && fh_ipc_same_handle(&mapped[i].handle, &h)) { /* opened before: the same address */
            pthread_mutex_unlock(&lock);
            *dptr = mapped[i].address;
            return CUDA_SUCCESS;
        }
    }
    for (int i = 0; rc == CUDA_SUCCESS && i < MAX_MAPPINGS; i++) { /* another import already holds that range */
        if (mapped[i].used && at < mapped[i].address + mapped[i].size && mapped[i].address < at + h.size)
            rc = fh_refuse(CUDA_ERROR_ALREADY_MAPPED, "cuIpcOpenMemHandle: rank %u's memory at 0x%llx overlaps an "
                           "open import (an older export of the same place?)", (unsigned)h.rank_slot,
                           (unsigned long long)at);
    }
    if (rc == CUDA_SUCCESS && !sharing_present())
        rc = fh_refuse(CUDA_ERROR_NOT_SUPPORTED, "cuIpcOpenMemHandle: the driver lacks the VMM sharing calls");
    if (rc == CUDA_SUCCESS && map_import(&h, fd, at, &access) < 0)
        rc = fh_refuse(CUDA_ERROR_OUT_OF_MEMORY, "cannot map rank %u's memory at 0x%llx", (unsigned)h.rank_slot,
                       (unsigned long long)at);
    pthread_mutex_unlock(&lock);
    if (rc != CUDA_SUCCESS) {
        foundry_ipc_close(&h, NULL);
        return rc;
    }
    fh_count("ipc_imports");
    *dptr = at;
    return CUDA_SUCCESS;
}

CUresult fh_ipc_close_mem_handle(CUdeviceptr dptr) {
    if (fh_region_mode() == FOUNDRY_MODE_OFF) return ((close_fn)fh_real("cuIpcCloseMemHandle"))(dptr);
    DRIVER(cuCtxSynchronize)(); /* like the driver's close; outside the lock, so other threads' calls go on */
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int i = 0; i < MAX_MAPPINGS && slot < 0; i++)
        if (mapped[i].used && mapped[i].address == dptr) slot = i;
    CUresult rc = CUDA_SUCCESS;
    uint32_t left = 1;
    if (slot < 0 || foundry_ipc_close(&mapped[slot].handle, &left) != FOUNDRY_OK) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (left == 0) { /* the last close releases the mapping */
        rc = DRIVER(cuMemUnmap)(mapped[slot].address, mapped[slot].size);
        if (rc == CUDA_SUCCESS) {
            rc = DRIVER(cuMemRelease)(mapped[slot].memory);
            mapped[slot].used = 0;
        } else {
            fh_event("error: cuIpcCloseMemHandle of 0x%llx: unmap failed (status %d); the import stays",
                     (unsigned long long)dptr, (int)rc);
        }
    }
    pthread_mutex_unlock(&lock);
    if (slot < 0)
        return fh_refuse(CUDA_ERROR_INVALID_VALUE, "cuIpcCloseMemHandle of 0x%llx: not an open import",
                         (unsigned long long)dptr);
    return rc;
}
