/*
 * graph_build.c - build and instantiate a CUDA graph from one packed description.
 *
 * LOAD rebuilds thousands of nodes per graph; doing it from Python costs about
 * 80 us a node in object marshalling alone. Python packs the IR once (format
 * below, little-endian, every record 4-byte aligned) and this file makes the
 * driver calls in a loop. Every length is checked against the buffer before it
 * is read; a malformed description is refused with a reason, never read past.
 *
 *   header   "FGB1" u32 version(1, or 2 for the launch attributes 11 and 16) u32 nodes u32 edges
 *   node     u32 kind, then by kind:
 *     1 kernel   u64 func, u32 grid[3], u32 block[3], u32 shared, u32 arg_mode (0 params, 1 extra),
 *                u32 nparams, u32 offsets[nparams], u32 sizes[nparams], u32 nbytes, bytes[nbytes] (padded to 4),
 *                u32 nattrs, nattrs x { u32 id, u32 pad, u8 value[64] }
 *     2 memcpy   u32 src_type, u32 dst_type, u64 src, u64 dst, u64 src_pos[3], u64 dst_pos[3],
 *                u64 src_pitch, u64 src_height, u64 dst_pitch, u64 dst_height, u64 extent[3]
 *     3 memset   u64 dst, u32 value, u32 element_size, u64 width, u64 height, u64 pitch
 *     4 empty
 *   edge     u32 src, u32 dst, u8 from_port, u8 to_port, u8 type, u8 pad
 *            (the edges must form a DAG: a self-loop or a cycle is refused, naming a node on it;
 *            at most 32 kinds: distinct ports and type)
 *
 * A kernel's func is a CUfunction handle, or, for a description built with a
 * function table (an archive's launch plan, made at SAVE), an index into it.
 * foundry_graph_build_many builds several descriptions, on worker threads when
 * asked (the driver serialises instantiation: on the H200 test machine four threads
 * took as long as one), and can leave instantiation to the caller.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hook.h"

#define MAX_PARAMS 4096
#define ATTR_VALUE_BYTES 64

enum { NODE_KERNEL = 1, NODE_MEMCPY = 2, NODE_MEMSET = 3, NODE_EMPTY = 4 };

typedef struct {
    const unsigned char *at, *end;
    char *err;
    size_t errlen;
    int failed;
} reader_t;

static void fail(reader_t *r, const char *fmt, ...) {
    if (r->failed) return;
    r->failed = 1;
    if (r->err && r->errlen) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(r->err, r->errlen, fmt, args);
        va_end(args);
    }
}

static const unsigned char *take(reader_t *r, size_t n) {
    if (r->failed || (size_t)(r->end - r->at) < n) {
        fail(r, "description truncated");
        return NULL;
    }
    const unsigned char *p = r->at;
    r->at += (n + 3) & ~(size_t)3;
    if (r->at > r->end) r->at = r->end;
    return p;
}

static uint32_t u32(reader_t *r) {
    const unsigned char *p = take(r, 4);
    uint32_t v = 0;
    if (p) memcpy(&v, p, 4);
    return v;
}

static uint64_t u64(reader_t *r) {
    const unsigned char *p = take(r, 8);
    uint64_t v = 0;
    if (p) memcpy(&v, p, 8);
    return v;
}

/* One graph under construction; graph == NULL when only checking. With `indexed`,
 * kernel funcs are indices below nfuncs into funcs (NULL when only checking). */
typedef struct {
    CUgraph graph;
    CUcontext ctx;
    CUgraphNode *nodes;
    int indexed;
    const uint64_t *funcs;
    size_t nfuncs;
    uint64_t lo, hi; /* indexed: every copy and set must stay in [lo, hi); 0, 0: unchecked */
} build_t;

/* The launch attributes Foundry's IR records; a plan from an archive may carry no other
 * (some attributes hold host pointers the driver would follow). */
static int plan_attribute(uint32_t id) {
    switch (id) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
    case CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING: return 1;
    default: return 0; /* events and programmatic launches hold handles the driver would follow */
    }
}

/* Whether [addr + offset, + span) lies in the plan's device range [lo, hi); always true
 * without a range (descriptions packed in this process). */
static int in_range(const build_t *b, uint64_t addr, uint64_t offset, uint64_t span) {
    if (b->lo == 0 && b->hi == 0) return 1;
    uint64_t start, end;
    if (__builtin_add_overflow(addr, offset, &start) || __builtin_add_overflow(start, span, &end)) return 0;
    return start >= b->lo && end <= b->hi;
}

/* Bytes from a 3D copy's base to one past its last byte. */
static int copy_span(uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height, uint64_t width,
                     uint64_t rows, uint64_t depth, uint64_t *offset, uint64_t *span) {
    uint64_t slice, zoff, yoff, last_rows, last_slices;
    if (rows == 0 || depth == 0) return 0;
    if (__builtin_mul_overflow(pitch, height, &slice) || __builtin_mul_overflow(z, slice, &zoff) ||
        __builtin_mul_overflow(y, pitch, &yoff) || __builtin_add_overflow(zoff, yoff, offset) ||
        __builtin_add_overflow(*offset, x, offset) || __builtin_mul_overflow(depth - 1, slice, &last_slices) ||
        __builtin_mul_overflow(rows - 1, pitch, &last_rows) || __builtin_add_overflow(last_slices, last_rows, span) ||
        __builtin_add_overflow(*span, width, span))
        return 0;
    return 1;
}

static CUresult add_kernel(reader_t *r, build_t *b, CUgraphNode *out) {
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    uint64_t func = u64(r);
    if (b->indexed) {
        if (func >= b->nfuncs)
            fail(r, "kernel function %llu is not in the %zu-entry function table", (unsigned long long)func,
                 b->nfuncs);
        else if (b->funcs)
            func = b->funcs[func];
    }
    p.func = (CUfunction)(uintptr_t)func;
    p.gridDimX = u32(r), p.gridDimY = u32(r), p.gridDimZ = u32(r);
    p.blockDimX = u32(r), p.blockDimY = u32(r), p.blockDimZ = u32(r);
    p.sharedMemBytes = u32(r);
    uint32_t arg_mode = u32(r), nparams = u32(r);
    if (nparams > MAX_PARAMS || arg_mode > 1) fail(r, "kernel record: %u parameters, arg mode %u", nparams, arg_mode);
    const unsigned char *offsets = take(r, (size_t)nparams * 4);
    const unsigned char *sizes = take(r, (size_t)nparams * 4);
    uint32_t nbytes = u32(r);
    const unsigned char *bytes = take(r, nbytes);
    uint32_t nattrs = u32(r);
    const unsigned char *attrs = take(r, (size_t)nattrs * (8 + ATTR_VALUE_BYTES));
    for (uint32_t i = 0; b->indexed && attrs && i < nattrs; i++) {
        uint32_t id;
        memcpy(&id, attrs + i * (8 + ATTR_VALUE_BYTES), 4);
        if (!plan_attribute(id)) fail(r, "launch attribute %u is not one a plan may carry", id);
    }
    if (r->failed) return CUDA_ERROR_INVALID_VALUE;
    void **pointers = calloc(nparams ? nparams : 1, sizeof *pointers);
    if (pointers == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    for (uint32_t i = 0; i < nparams && !r->failed; i++) {
        uint32_t offset, size;
        memcpy(&offset, offsets + 4 * i, 4);
        memcpy(&size, sizes + 4 * i, 4);
        if (size == 0 || offset > UINT32_MAX - size)
            fail(r, "parameter %u (%u bytes at %u) is malformed", i, size, offset);
        else if (arg_mode == 1) {
            /* one packed buffer: the driver reads its nbytes, which may end inside a parameter (NCCL
             * passes only the used bytes of its 4 KiB argument), never past the last one */
            if (i + 1 == nparams && nbytes > offset + size)
                fail(r, "a packed buffer of %u bytes runs past its last parameter (%u bytes at %u)", nbytes, size,
                     offset);
        } else if (offset > nbytes || size > nbytes - offset) /* the driver reads all `size` bytes */
            fail(r, "parameter %u (%u bytes at %u) lies outside the %u-byte buffer", i, size, offset, nbytes);
        else
            pointers[i] = (void *)(bytes + offset);
    }
    size_t extra_size = nbytes;
    void *extra[5] = {CU_LAUNCH_PARAM_BUFFER_POINTER, (void *)bytes, CU_LAUNCH_PARAM_BUFFER_SIZE, &extra_size,
                      CU_LAUNCH_PARAM_END};
    CUresult rc = r->failed ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS && b->graph) {
        if (arg_mode == 1)
            p.extra = extra;
        else
            p.kernelParams = pointers;
        rc = DRIVER(cuGraphAddKernelNode_v2)(out, b->graph, NULL, 0, &p); /* the driver copies the arguments */
        for (uint32_t i = 0; rc == CUDA_SUCCESS && i < nattrs; i++) {
            CUkernelNodeAttrValue value;
            uint32_t id;
            memcpy(&id, attrs + i * (8 + ATTR_VALUE_BYTES), 4);
            memset(&value, 0, sizeof value);
            memcpy(&value, attrs + i * (8 + ATTR_VALUE_BYTES) + 8,
                   sizeof value < ATTR_VALUE_BYTES ? sizeof value : ATTR_VALUE_BYTES);
            rc = DRIVER(cuGraphKernelNodeSetAttribute)(*out, (CUkernelNodeAttrID)id, &value);
        }
    }
    free(pointers);
    return rc;
}

static CUresult add_memcpy(reader_t *r, build_t *b, CUgraphNode *out) {
    CUDA_MEMCPY3D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = (CUmemorytype)u32(r);
    p.dstMemoryType = (CUmemorytype)u32(r);
    uint64_t src = u64(r), dst = u64(r);
    p.srcXInBytes = u64(r), p.srcY = u64(r), p.srcZ = u64(r);
    p.dstXInBytes = u64(r), p.dstY = u64(r), p.dstZ = u64(r);
    p.srcPitch = u64(r), p.srcHeight = u64(r), p.dstPitch = u64(r), p.dstHeight = u64(r);
    p.WidthInBytes = u64(r), p.Height = u64(r), p.Depth = u64(r);
    if (r->failed) return CUDA_ERROR_INVALID_VALUE;
    if (b->indexed) { /* a plan copies device memory inside the region only */
        uint64_t soff, sspan, doff, dspan;
        int device = (p.srcMemoryType == CU_MEMORYTYPE_DEVICE || p.srcMemoryType == CU_MEMORYTYPE_UNIFIED) &&
                     (p.dstMemoryType == CU_MEMORYTYPE_DEVICE || p.dstMemoryType == CU_MEMORYTYPE_UNIFIED);
        if (!device || !copy_span(p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight, p.WidthInBytes, p.Height,
                                  p.Depth, &soff, &sspan) ||
            !copy_span(p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight, p.WidthInBytes, p.Height, p.Depth,
                       &doff, &dspan) ||
            !in_range(b, src, soff, sspan) || !in_range(b, dst, doff, dspan)) {
            fail(r, "a copy reaches outside the region (or not device to device)");
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (p.srcMemoryType == CU_MEMORYTYPE_HOST)
        p.srcHost = (const void *)(uintptr_t)src;
    else
        p.srcDevice = src;
    if (p.dstMemoryType == CU_MEMORYTYPE_HOST)
        p.dstHost = (void *)(uintptr_t)dst;
    else
        p.dstDevice = dst;
    return b->graph ? DRIVER(cuGraphAddMemcpyNode)(out, b->graph, NULL, 0, &p, b->ctx) : CUDA_SUCCESS;
}

static CUresult add_memset(reader_t *r, build_t *b, CUgraphNode *out) {
    CUDA_MEMSET_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.dst = u64(r);
    p.value = u32(r);
    p.elementSize = u32(r);
    p.width = u64(r), p.height = u64(r), p.pitch = u64(r);
    if (r->failed) return CUDA_ERROR_INVALID_VALUE;
    if (b->indexed) {
        uint64_t row, offset, span; /* a memset is a one-slice copy of `height` rows of `row` bytes */
        if (__builtin_mul_overflow(p.width, (uint64_t)p.elementSize, &row) ||
            !copy_span(0, 0, 0, p.pitch, 0, row, p.height, 1, &offset, &span) || !in_range(b, p.dst, offset, span)) {
            fail(r, "a memset reaches outside the region");
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return b->graph ? DRIVER(cuGraphAddMemsetNode)(out, b->graph, NULL, 0, &p, b->ctx) : CUDA_SUCCESS;
}

static CUresult add_node(reader_t *r, build_t *b, uint32_t index) {
    uint32_t kind = u32(r);
    CUgraphNode *out = b->nodes ? &b->nodes[index] : NULL;
    switch (kind) {
    case NODE_KERNEL: return add_kernel(r, b, out);
    case NODE_MEMCPY: return add_memcpy(r, b, out);
    case NODE_MEMSET: return add_memset(r, b, out);
    case NODE_EMPTY: return b->graph ? DRIVER(cuGraphAddEmptyNode)(out, b->graph, NULL, 0) : CUDA_SUCCESS;
    default: fail(r, "node %u: unknown kind %u", index, kind); return CUDA_ERROR_INVALID_VALUE;
    }
}

/* An edge as the builder adds and the read-back compares it: its ends' node indices and its
 * kind (from_port | to_port << 8 | type << 16). */
typedef struct {
    uint32_t src, dst, kind;
} edge_t;

static edge_t edge_at(const unsigned char *raw, uint32_t i) {
    const unsigned char *e = raw + (size_t)12 * i;
    edge_t out = {0, 0, e[8] | e[9] << 8 | (uint32_t)e[10] << 16};
    memcpy(&out.src, e, 4);
    memcpy(&out.dst, e + 4, 4);
    return out;
}

/* Whether the edges (endpoints already checked below `nodes`) form a DAG:
 * Kahn's algorithm over a compressed adjacency list. A self-loop or a cycle is refused
 * here, with a node on it named, rather than by the driver at instantiation (or never). */
static int acyclic(reader_t *r, const edge_t *edge, uint32_t nodes, uint32_t edges) {
    uint32_t *incoming = calloc(nodes ? nodes : 1, sizeof *incoming);
    uint32_t *start = calloc((size_t)nodes + 1, sizeof *start), *next = calloc(edges, sizeof *next);
    uint32_t *ready = calloc(nodes ? nodes : 1, sizeof *ready), *fill = calloc(nodes ? nodes : 1, sizeof *fill);
    int ok = incoming && start && next && ready && fill;
    if (!ok) fail(r, "out of host memory checking %u edges", edges);
    for (uint32_t i = 0; ok && i < edges; i++) {
        uint32_t src = edge[i].src, dst = edge[i].dst;
        if (src == dst) {
            fail(r, "edge %u: %u -> %u makes node %u depend on itself", i, src, dst, src);
            ok = 0;
        } else {
            incoming[dst]++;
            start[src + 1]++;
        }
    }
    for (uint32_t n = 0; ok && n < nodes; n++) start[n + 1] += start[n];
    for (uint32_t i = 0; ok && i < edges; i++) {
        next[start[edge[i].src] + fill[edge[i].src]++] = edge[i].dst;
    }
    uint32_t top = 0, done = 0;
    for (uint32_t n = 0; ok && n < nodes; n++)
        if (incoming[n] == 0) ready[top++] = n;
    while (ok && top) {
        uint32_t n = ready[--top];
        done++;
        for (uint32_t k = start[n]; k < start[n + 1]; k++)
            if (--incoming[next[k]] == 0) ready[top++] = next[k];
    }
    if (ok && done < nodes) {
        uint32_t stuck = 0;
        while (incoming[stuck] == 0) stuck++;
        fail(r, "the edges form a cycle through node %u", stuck);
        ok = 0;
    }
    free(incoming);
    free(start);
    free(next);
    free(ready);
    free(fill);
    return ok;
}

/* Given one batch, the driver gives every edge the first edge's data (seen on the H200 test
 * machine, driver 580): edges are added with one call per kind, each kind's in their order. */
#define MAX_EDGE_KINDS 32

static CUresult add_edges_of_kind(reader_t *r, build_t *b, const edge_t *edge, uint32_t edges, uint32_t kind,
                                  CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *data) {
    size_t n = 0;
    for (uint32_t i = 0; i < edges; i++) {
        if (edge[i].kind != kind) continue;
        from[n] = b->nodes[edge[i].src], to[n] = b->nodes[edge[i].dst];
        memset(&data[n], 0, sizeof data[n]);
        data[n].from_port = kind & 0xff, data[n].to_port = kind >> 8 & 0xff, data[n].type = kind >> 16 & 0xff;
        n++;
    }
    CUresult rc = DRIVER(cuGraphAddDependencies_v2)(b->graph, from, to, data, n);
    if (rc != CUDA_SUCCESS) fail(r, "adding %zu edges: driver status %d", n, (int)rc);
    return rc;
}

typedef struct {
    uintptr_t handle;
    uint32_t index;
} node_key_t;

static int by_edge(const void *pa, const void *pb) {
    const edge_t *a = pa, *b = pb;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    if (a->dst != b->dst) return a->dst < b->dst ? -1 : 1;
    return a->kind < b->kind ? -1 : a->kind > b->kind;
}

static int by_handle(const void *pa, const void *pb) {
    const node_key_t *a = pa, *b = pb;
    return a->handle < b->handle ? -1 : a->handle > b->handle;
}

/* The index of the node whose handle is h, UINT32_MAX for one the graph was not given. */
static uint32_t node_index(const node_key_t *keys, uint32_t nodes, CUgraphNode h) {
    node_key_t want = {(uintptr_t)h, 0};
    const node_key_t *k = nodes ? bsearch(&want, keys, nodes, sizeof *keys, by_handle) : NULL;
    return k ? k->index : UINT32_MAX;
}

/* The first difference between the edges described and those read back (both sorted). */
static void name_difference(reader_t *r, const edge_t *want, uint32_t edges, const edge_t *kept, size_t n) {
    size_t i = 0;
    while (i < edges && i < n && by_edge(&want[i], &kept[i]) == 0) i++;
    int lost = i < edges && (i == n || by_edge(&want[i], &kept[i]) < 0);
    const edge_t *e = lost ? &want[i] : &kept[i], *other = lost ? (i < n ? &kept[i] : NULL) : (i < edges ? &want[i] : NULL);
    if (other && other->src == e->src && other->dst == e->dst) {
        const edge_t *w = lost ? e : other, *k = lost ? other : e;
        fail(r, "edge %u -> %u came back with ports %u -> %u, type %u, described with ports %u -> %u, type %u "
             "(%zu edges in all, %u described)", e->src, e->dst, k->kind & 0xff, k->kind >> 8 & 0xff, k->kind >> 16,
             w->kind & 0xff, w->kind >> 8 & 0xff, w->kind >> 16, n, edges);
    } else if (lost) {
        fail(r, "the driver lost edge %u -> %u (ports %u -> %u, type %u) (%zu edges in all, %u described)", e->src,
             e->dst, e->kind & 0xff, e->kind >> 8 & 0xff, e->kind >> 16, n, edges);
    } else { /* "?": a node the graph was not given */
        char src[12] = "?", dst[12] = "?";
        if (e->src != UINT32_MAX) snprintf(src, sizeof src, "%u", e->src);
        if (e->dst != UINT32_MAX) snprintf(dst, sizeof dst, "%u", e->dst);
        fail(r, "the driver added an edge %s -> %s (ports %u -> %u, type %u) (%zu edges in all, %u described)", src,
             dst, e->kind & 0xff, e->kind >> 8 & 0xff, e->kind >> 16, n, edges);
    }
}

/* The graph's edges read back must be ``want`` (sorted here), each with its ends and kind: a
 * driver that changed an edge's kind would order the kernels otherwise, silently. All of them
 * are read (the driver fills at most the count it is given), so that an edge it added is seen too. */
static CUresult check_edges(reader_t *r, build_t *b, edge_t *want, uint32_t nodes, uint32_t edges) {
    size_t n = 0;
    CUresult rc = DRIVER(cuGraphGetEdges_v2)(b->graph, NULL, NULL, NULL, &n);
    if (rc != CUDA_SUCCESS) {
        fail(r, "counting the %u edges back: driver status %d", edges, (int)rc);
        return rc;
    }
    size_t room = n ? n : 1;
    CUgraphNode *from = calloc(room, sizeof *from), *to = calloc(room, sizeof *to);
    CUgraphEdgeData *data = calloc(room, sizeof *data);
    edge_t *kept = calloc(room, sizeof *kept);
    node_key_t *keys = calloc(nodes ? nodes : 1, sizeof *keys);
    if (!from || !to || !data || !kept || !keys) {
        fail(r, "out of host memory for reading %zu edges back", n);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (n && (rc = DRIVER(cuGraphGetEdges_v2)(b->graph, from, to, data, &n)) != CUDA_SUCCESS) {
        fail(r, "reading the graph's edges back: driver status %d", (int)rc);
    }
    if (rc == CUDA_SUCCESS) {
        n = n < room ? n : room;
        for (uint32_t i = 0; i < nodes; i++) keys[i] = (node_key_t){(uintptr_t)b->nodes[i], i};
        qsort(keys, nodes, sizeof *keys, by_handle);
        for (size_t i = 0; i < n; i++)
            kept[i] = (edge_t){node_index(keys, nodes, from[i]), node_index(keys, nodes, to[i]),
                               data[i].from_port | data[i].to_port << 8 | (uint32_t)data[i].type << 16};
        qsort(kept, n, sizeof *kept, by_edge);
        if (edges) qsort(want, edges, sizeof *want, by_edge);
        int same = n == edges;
        for (size_t i = 0; same && i < n; i++) same = by_edge(&want[i], &kept[i]) == 0;
        if (!same) {
            name_difference(r, want, edges, kept, n);
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    free(from);
    free(to);
    free(data);
    free(kept);
    free(keys);
    return rc;
}

static CUresult add_edges(reader_t *r, build_t *b, uint32_t nodes, uint32_t edges) {
    const unsigned char *raw = take(r, (size_t)edges * 12);
    if (raw == NULL) return CUDA_ERROR_INVALID_VALUE; /* take failed, and said why */
    if (edges == 0) return b->graph ? check_edges(r, b, NULL, nodes, 0) : CUDA_SUCCESS;
    edge_t *edge = calloc(edges, sizeof *edge);
    if (edge == NULL) {
        fail(r, "out of host memory for %u edges", edges);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint32_t kinds[MAX_EDGE_KINDS], nkinds = 0;
    CUresult rc = CUDA_SUCCESS;
    for (uint32_t i = 0; rc == CUDA_SUCCESS && i < edges; i++) {
        uint32_t k = 0;
        edge[i] = edge_at(raw, i);
        if (edge[i].src >= nodes || edge[i].dst >= nodes) {
            fail(r, "edge %u: %u -> %u names a node the graph does not have", i, edge[i].src, edge[i].dst);
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        while (k < nkinds && kinds[k] != edge[i].kind) k++;
        if (k == MAX_EDGE_KINDS) {
            fail(r, "edge %u: more than %d kinds of edge (ports and type)", i, MAX_EDGE_KINDS);
            rc = CUDA_ERROR_INVALID_VALUE;
        } else if (k == nkinds) {
            kinds[nkinds++] = edge[i].kind;
        }
    }
    if (rc == CUDA_SUCCESS && !acyclic(r, edge, nodes, edges)) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && b->graph) {
        CUgraphNode *from = calloc(edges, sizeof *from), *to = calloc(edges, sizeof *to);
        CUgraphEdgeData *data = calloc(edges, sizeof *data);
        if (!from || !to || !data) {
            fail(r, "out of host memory for %u edges", edges);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        for (uint32_t k = 0; rc == CUDA_SUCCESS && k < nkinds; k++)
            rc = add_edges_of_kind(r, b, edge, edges, kinds[k], from, to, data);
        free(from);
        free(to);
        free(data);
        if (rc == CUDA_SUCCESS) rc = check_edges(r, b, edge, nodes, edges);
    }
    free(edge);
    return rc;
}

/* Parse (and, with a graph in b, build) the description; report the node and edge counts. */
static CUresult run(const void *desc, size_t len, build_t *b, uint32_t *nodes_out, uint32_t *edges_out, char *err,
                    size_t errlen) {
    reader_t r = {desc, (const unsigned char *)desc + len, err, errlen, 0};
    if (err && errlen) err[0] = '\0';
    const unsigned char *magic = take(&r, 4);
    if (magic == NULL || memcmp(magic, "FGB1", 4) != 0) {
        fail(&r, "not a packed graph (magic)");
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint32_t version = u32(&r), nodes = u32(&r), edges = u32(&r);
    if (version != 1 && version != 2) fail(&r, "packed graph version %u; this library reads 1 and 2", version);
    if (nodes > (uint32_t)(len / 4) || edges > (uint32_t)(len / 12)) fail(&r, "counts larger than the description");
    if (r.failed) return CUDA_ERROR_INVALID_VALUE;
    if (b->graph) {
        b->nodes = calloc(nodes ? nodes : 1, sizeof *b->nodes);
        if (b->nodes == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CUDA_SUCCESS;
    for (uint32_t i = 0; rc == CUDA_SUCCESS && i < nodes; i++) {
        rc = add_node(&r, b, i);
        if (rc != CUDA_SUCCESS && !r.failed) fail(&r, "node %u: driver status %d", i, (int)rc);
    }
    if (rc == CUDA_SUCCESS) rc = add_edges(&r, b, nodes, edges);
    if (rc == CUDA_SUCCESS && r.at != r.end) {
        fail(&r, "%zu bytes after the last edge", (size_t)(r.end - r.at));
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    if (nodes_out) *nodes_out = nodes;
    if (edges_out) *edges_out = edges;
    free(b->nodes);
    b->nodes = NULL;
    return rc;
}

int foundry_graph_check(const void *desc, size_t len, uint32_t *nodes, uint32_t *edges, char *err, size_t errlen) {
    if (desc == NULL) return FOUNDRY_EINVAL;
    build_t b = {0};
    return run(desc, len, &b, nodes, edges, err, errlen) == CUDA_SUCCESS ? FOUNDRY_OK : FOUNDRY_EINVAL;
}

int foundry_graph_check_indexed(const void *desc, size_t len, size_t nfuncs, uint64_t lo, uint64_t hi,
                                uint32_t *nodes, uint32_t *edges, char *err, size_t errlen) {
    if (desc == NULL) return FOUNDRY_EINVAL;
    build_t b = {0};
    b.indexed = 1, b.nfuncs = nfuncs, b.lo = lo, b.hi = hi;
    return run(desc, len, &b, nodes, edges, err, errlen) == CUDA_SUCCESS ? FOUNDRY_OK : FOUNDRY_EINVAL;
}

static const char *const needed[] = {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuGraphCreate", "cuGraphDestroy",
                               "cuGraphExecDestroy", "cuGraphAddKernelNode_v2", "cuGraphKernelNodeSetAttribute",
                               "cuGraphAddMemcpyNode", "cuGraphAddMemsetNode", "cuGraphAddEmptyNode",
                               "cuGraphAddDependencies_v2", "cuGraphGetEdges_v2", "cuGraphInstantiateWithFlags"};

static int driver_ready(char *err, size_t errlen) {
    const char *missing = fh_driver_missing(needed, sizeof needed / sizeof needed[0]);
    if (missing && err && errlen) snprintf(err, errlen, "the driver has no %s", missing);
    return missing == NULL;
}

static uint64_t elapsed_us(const struct timespec *from, const struct timespec *to) {
    return (uint64_t)((to->tv_sec - from->tv_sec) * 1000000 + (to->tv_nsec - from->tv_nsec) / 1000);
}

/* Build one description in the current context and instantiate it with `flags` (the
 * program's own at SAVE; exec_out NULL: build only). */
static int build_one(const void *desc, size_t len, int indexed, const uint64_t *funcs, size_t nfuncs, uint64_t lo,
                     uint64_t hi, uint64_t flags, uint64_t *graph_out, uint64_t *exec_out, char *err,
                     size_t errlen) {
    build_t b = {0};
    b.indexed = indexed, b.funcs = funcs, b.nfuncs = nfuncs, b.lo = lo, b.hi = hi;
    CUresult rc = DRIVER(cuCtxGetCurrent)(&b.ctx);
    if (rc == CUDA_SUCCESS) rc = DRIVER(cuGraphCreate)(&b.graph, 0);
    if (rc != CUDA_SUCCESS) {
        if (err && errlen) snprintf(err, errlen, "cannot create a graph (driver status %d)", (int)rc);
        return FOUNDRY_ESTATE;
    }
    /* LOAD's timing report splits a native build into adding nodes and the driver's instantiation. */
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = run(desc, len, &b, NULL, NULL, err, errlen);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fh_count_add("native_nodes_us", elapsed_us(&t0, &t1));
    CUgraphExec exec = NULL;
    if (rc == CUDA_SUCCESS && exec_out != NULL) {
        rc = DRIVER(cuGraphInstantiateWithFlags)(&exec, b.graph, flags);
        clock_gettime(CLOCK_MONOTONIC, &t2);
        fh_count_add("native_instantiate_us", elapsed_us(&t1, &t2));
        if (rc == CUDA_SUCCESS) fh_count("graph_instantiates");
        else if (err && errlen) snprintf(err, errlen, "instantiation failed (driver status %d)", (int)rc);
    }
    if (rc != CUDA_SUCCESS) {
        DRIVER(cuGraphDestroy)(b.graph);
        return FOUNDRY_ESTATE;
    }
    *graph_out = (uint64_t)(uintptr_t)b.graph;
    if (exec_out != NULL) *exec_out = (uint64_t)(uintptr_t)exec;
    return FOUNDRY_OK;
}

int foundry_graph_build(const void *desc, size_t len, uint64_t flags, uint64_t *graph_out, uint64_t *exec_out,
                        char *err, size_t errlen) {
    if (desc == NULL || graph_out == NULL || exec_out == NULL) return FOUNDRY_EINVAL;
    if (!driver_ready(err, errlen)) return FOUNDRY_ESTATE;
    return build_one(desc, len, 0, NULL, 0, 0, 0, flags, graph_out, exec_out, err, errlen);
}

/* Work shared by the threads of one foundry_graph_build_many call. */
typedef struct {
    const void *const *descs;
    const size_t *lens;
    uint32_t count;
    const uint64_t *const *funcs; /* per description, or NULL: they hold handles */
    const size_t *nfuncs;
    uint64_t lo, hi;
    const uint64_t *flags; /* per description, or NULL: 0 */
    CUcontext ctx;
    uint64_t *graphs, *execs;
    pthread_mutex_t lock;
    uint32_t next;
    int status;
    char *err;
    size_t errlen;
} batch_t;

static void *batch_worker(void *arg) {
    batch_t *w = arg;
    char err[256];
    if (DRIVER(cuCtxSetCurrent)(w->ctx) != CUDA_SUCCESS) {
        pthread_mutex_lock(&w->lock);
        if (w->status == FOUNDRY_OK) {
            w->status = FOUNDRY_ESTATE;
            if (w->err && w->errlen) snprintf(w->err, w->errlen, "a build thread cannot enter the context");
        }
        pthread_mutex_unlock(&w->lock);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&w->lock);
        uint32_t i = w->status == FOUNDRY_OK && w->next < w->count ? w->next++ : w->count;
        pthread_mutex_unlock(&w->lock);
        if (i >= w->count) return NULL;
        int status;
        if (w->funcs && w->funcs[i] == NULL) { /* a plan without its table: never read as handles */
            snprintf(err, sizeof err, "no function table");
            status = FOUNDRY_EINVAL;
        } else {
            status = build_one(w->descs[i], w->lens[i], w->funcs != NULL, w->funcs ? w->funcs[i] : NULL,
                               w->funcs ? w->nfuncs[i] : 0, w->lo, w->hi, w->flags ? w->flags[i] : 0,
                               &w->graphs[i], w->execs ? &w->execs[i] : NULL, err, sizeof err);
        }
        if (status != FOUNDRY_OK) {
            pthread_mutex_lock(&w->lock);
            if (w->status == FOUNDRY_OK) {
                w->status = status;
                if (w->err && w->errlen) snprintf(w->err, w->errlen, "graph %u: %s", i, err);
            }
            pthread_mutex_unlock(&w->lock);
        }
    }
}

int foundry_graph_build_many(const void *const *descs, const size_t *lens, uint32_t count,
                             const uint64_t *const *funcs, const size_t *nfuncs, uint64_t lo, uint64_t hi,
                             const uint64_t *flags, uint32_t threads, uint64_t *graphs, uint64_t *execs, char *err,
                             size_t errlen) {
    if (descs == NULL || lens == NULL || graphs == NULL || threads == 0 || threads > 64 ||
        (funcs != NULL && nfuncs == NULL))
        return FOUNDRY_EINVAL;
    if (err && errlen) err[0] = '\0';
    if (!driver_ready(err, errlen)) return FOUNDRY_ESTATE;
    memset(graphs, 0, count * sizeof *graphs);
    if (execs) memset(execs, 0, count * sizeof *execs);
    batch_t w = {descs, lens, count, funcs, nfuncs, lo, hi, flags, NULL, graphs, execs, PTHREAD_MUTEX_INITIALIZER, 0,
                 FOUNDRY_OK, err, errlen};
    if (DRIVER(cuCtxGetCurrent)(&w.ctx) != CUDA_SUCCESS || w.ctx == NULL) {
        if (err && errlen) snprintf(err, errlen, "no current CUDA context");
        return FOUNDRY_ESTATE;
    }
    pthread_t workers[64];
    uint32_t started = 0;
    for (; started + 1 < threads && started + 1 < count; started++)
        if (pthread_create(&workers[started], NULL, batch_worker, &w) != 0) break;
    batch_worker(&w); /* the calling thread works too */
    for (uint32_t i = 0; i < started; i++) pthread_join(workers[i], NULL);
    if (w.status != FOUNDRY_OK) { /* all or nothing: release what was built */
        for (uint32_t i = 0; i < count; i++) {
            if (execs && execs[i]) DRIVER(cuGraphExecDestroy)((CUgraphExec)(uintptr_t)execs[i]);
            if (graphs[i]) DRIVER(cuGraphDestroy)((CUgraph)(uintptr_t)graphs[i]);
            graphs[i] = 0;
            if (execs) execs[i] = 0;
        }
    }
    return w.status;
}
