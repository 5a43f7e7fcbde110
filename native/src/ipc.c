/*
 * ipc.c - sharing region memory between processes without the driver's IPC handles.
 *
 * An exporter registers a POSIX file descriptor (from cuMemExportToShareableHandle
 * on a region allocation) and gets a 64-byte handle - the size of a CUipcMemHandle,
 * so it can travel wherever one does. The handle names the exporter's pid, an
 * export number, the rank slot, where the memory sits in the exporter's region,
 * a random token and the random key of the exporter's socket. An importer connects
 * to the exporter's abstract Unix socket ("\0foundry-ipc-<pid>-<key>"), and checks
 * that the process answering is the handle's pid and its own user (SO_PEERCRED:
 * abstract names carry no permissions) before it sends the token. The key makes the
 * name unguessable: another user cannot bind it first and so stop the export. The
 * exporter's server thread checks each importer's UID as it connects and its token
 * when it asks, then passes the descriptor with SCM_RIGHTS. It serves every
 * connection from one poll loop: a client that connects and says nothing holds a
 * slot until its 5 s run out, never the server. A process that reused a dead
 * exporter's pid does not know the token.
 *
 * Imports are counted: each open takes one reference, each close gives one back,
 * and the descriptor is released when the last reference goes.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "hook.h"

_Static_assert(sizeof(foundry_ipc_handle_t) == 64, "a handle travels where a CUipcMemHandle does");

#define MAX_EXPORTS 1024
#define MAX_IMPORTS 1024
#define MAX_PENDING 64 /* connections the server waits on at once; a new one evicts the oldest */

typedef struct {
    uint32_t export_id;
    uint8_t token[16];
} request_t;

typedef struct {
    int32_t status; /* FOUNDRY_IPC_* */
} reply_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int fd;
    uint8_t token[16];
} exports[MAX_EXPORTS];
static uint32_t export_count;
static int server_fd = -1;
static uint8_t socket_key[8]; /* drawn when the server starts; the handles carry it */

static struct {
    foundry_ipc_handle_t handle; /* an import is the handle's, not just its pid and number */
    int fd;
    uint32_t refs;
} imports[MAX_IMPORTS];

#define IO_TIMEOUT_S 5

int fh_ipc_same_handle(const foundry_ipc_handle_t *a, const foundry_ipc_handle_t *b) {
    return a->pid == b->pid && a->export_id == b->export_id && memcmp(a->token, b->token, sizeof a->token) == 0;
}

static int same_import(int i, const foundry_ipc_handle_t *h) {
    return imports[i].refs && fh_ipc_same_handle(&imports[i].handle, h);
}

static void set_timeouts(int fd) {
    struct timeval tv = {IO_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

typedef union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
} control_t;

static socklen_t socket_address(int32_t pid, const uint8_t key[8], struct sockaddr_un *addr) {
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "foundry-ipc-%d-", (int)pid);
    for (int i = 0; i < 8; i++)
        n += snprintf(addr->sun_path + 1 + n, sizeof addr->sun_path - 1 - (size_t)n, "%02x", key[i]);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* -- the exporter's server ------------------------------------------------------------ */

static int send_reply(int conn, int32_t status, int fd) {
    reply_t reply = {status};
    struct iovec iov = {&reply, sizeof reply};
    control_t control;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&control, 0, sizeof control);
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
    }
    /* the reply is one small datagram on a fresh connection: it never waits for room */
    return sendmsg(conn, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof reply ? 0 : -1;
}

/* A connection just accepted: refused at once unless it comes from this process's user
 * (before anything is read from it). Returns whether to wait for its request. */
static int admit(int conn) {
    struct ucred peer;
    socklen_t len = sizeof peer;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
        send_reply(conn, FOUNDRY_IPC_EPROTO, -1);
        return 0;
    }
    if (peer.uid != getuid()) {
        fh_event("error: ipc: refused a connection from uid %d (pid %d)", (int)peer.uid, (int)peer.pid);
        send_reply(conn, FOUNDRY_IPC_EUID, -1);
        return 0;
    }
    return 1;
}

/* A connection with something to read: its request, answered with the descriptor or a refusal. */
static void serve(int conn) {
    request_t req;
    if (recv(conn, &req, sizeof req, MSG_DONTWAIT) != sizeof req) {
        send_reply(conn, FOUNDRY_IPC_EPROTO, -1);
        return;
    }
    pthread_mutex_lock(&lock);
    int fd = req.export_id < export_count ? exports[req.export_id].fd : -1;
    int match = fd >= 0 && memcmp(exports[req.export_id].token, req.token, sizeof req.token) == 0;
    fd = match ? dup(fd) : -1; /* ours to send: an unexport may close the original meanwhile */
    pthread_mutex_unlock(&lock);
    if (fd < 0) {
        struct ucred peer = {0};
        socklen_t len = sizeof peer;
        getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len);
        fh_event("error: ipc: pid %d asked for export %u with a wrong token (or one withdrawn)", (int)peer.pid,
                 req.export_id);
        send_reply(conn, FOUNDRY_IPC_ETOKEN, -1);
        return;
    }
    send_reply(conn, FOUNDRY_IPC_OK, fd);
    close(fd);
}

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

typedef struct {
    int fd;
    int64_t deadline_ms;
} pending_t;

static void drop(pending_t *pending, int *count, int i) {
    close(pending[i].fd);
    memmove(&pending[i], &pending[i + 1], (size_t)(*count - i - 1) * sizeof *pending);
    (*count)--;
}

/* One poll loop over the listening socket and every connection waiting to send its request. */
static void *server_loop(void *arg) {
    int listen_fd = (int)(intptr_t)arg;
    pending_t pending[MAX_PENDING];
    struct pollfd fds[MAX_PENDING + 1];
    int count = 0;
    for (;;) {
        int64_t now = now_ms(), wait = -1;
        fds[0] = (struct pollfd){listen_fd, POLLIN, 0};
        for (int i = 0; i < count; i++) {
            fds[i + 1] = (struct pollfd){pending[i].fd, POLLIN, 0};
            int64_t left = pending[i].deadline_ms - now;
            if (wait < 0 || left < wait) wait = left < 0 ? 0 : left;
        }
        if (poll(fds, (nfds_t)count + 1, (int)wait) < 0) {
            if (errno == EINTR) continue;
            fh_event("error: ipc: the server stopped (poll errno %d)", errno);
            break;
        }
        now = now_ms();
        for (int i = count - 1; i >= 0; i--) { /* backwards: dropping one keeps the lower indices */
            if (fds[i + 1].revents) {
                serve(pending[i].fd);
                drop(pending, &count, i);
            } else if (pending[i].deadline_ms <= now) {
                drop(pending, &count, i); /* said nothing in time: its slot is freed, nothing else waited */
            }
        }
        if (fds[0].revents & (POLLERR | POLLNVAL)) {
            fh_event("error: ipc: the server stopped (its socket failed)");
            break;
        }
        if (!(fds[0].revents & POLLIN)) continue;
        int conn = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK) {
                fh_event("error: ipc: the server stopped (errno %d)", errno);
                break;
            }
            if (errno != EINTR && errno != EAGAIN) usleep(10000); /* EMFILE, ECONNABORTED...: transient */
            continue;
        }
        if (!admit(conn)) {
            close(conn);
            continue;
        }
        if (count == MAX_PENDING) drop(pending, &count, 0); /* the oldest has waited longest */
        pending[count++] = (pending_t){conn, now + IO_TIMEOUT_S * 1000};
    }
    for (int i = 0; i < count; i++) close(pending[i].fd);
    pthread_mutex_lock(&lock);
    server_fd = -1;
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* A forked child inherits the parent's socket but not its server thread. */
static void forget_server(void) {
    if (server_fd >= 0) close(server_fd); /* the parent's: kept here, it would outlive the parent unserved */
    server_fd = -1;                       /* its own server, when it exports, draws its own key */
    export_count = 0;
    memset(imports, 0, sizeof imports);
    pthread_mutex_init(&lock, NULL);
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, forget_server); }

static int start_server(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    if (server_fd >= 0) return 0; /* a forked child has none: forget_server */
    if (getrandom(socket_key, sizeof socket_key, 0) != (ssize_t)sizeof socket_key) return -1;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    socklen_t len = socket_address((int32_t)getpid(), socket_key, &addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, len) != 0 || listen(fd, 64) != 0) {
        fh_event("error: ipc: cannot listen on @%s (errno %d)", addr.sun_path + 1, errno);
        if (fd >= 0) close(fd);
        return -1;
    }
    server_fd = fd;
    pthread_t thread;
    if (pthread_create(&thread, NULL, server_loop, (void *)(intptr_t)fd) != 0) {
        close(fd);
        server_fd = -1;
        return -1;
    }
    pthread_detach(thread);
    return 0;
}

/* A withdrawn export's number, or the next new one (MAX_EXPORTS: none left). Its new token
 * refuses the handles given out before. Call with the lock held. */
static uint32_t free_export(void) {
    for (uint32_t id = 0; id < export_count; id++)
        if (exports[id].fd < 0) return id;
    return export_count;
}

int foundry_ipc_export(int fd, uint16_t rank_slot, uint64_t region_base, uint64_t offset, uint64_t size,
                       foundry_ipc_handle_t *out) {
    if (fd < 0 || out == NULL) return FOUNDRY_EINVAL;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* ours: the caller may close or reuse its number */
    if (own < 0) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    uint32_t id = free_export();
    int status = id < MAX_EXPORTS && start_server() == 0 ? FOUNDRY_OK : FOUNDRY_ESTATE;
    if (status == FOUNDRY_OK) {
        if (getrandom(exports[id].token, sizeof exports[id].token, 0) != (ssize_t)sizeof exports[id].token) {
            status = FOUNDRY_ESTATE;
        } else {
            exports[id].fd = own;
            own = -1;
            if (id == export_count) export_count++;
            memset(out, 0, sizeof *out);
            out->magic = FOUNDRY_IPC_MAGIC;
            out->version = FOUNDRY_IPC_VERSION;
            out->rank_slot = rank_slot;
            out->pid = (int32_t)getpid();
            out->export_id = id;
            out->region_base = region_base;
            out->offset = offset;
            out->size = size;
            memcpy(out->token, exports[id].token, sizeof out->token);
            memcpy(out->socket_key, socket_key, sizeof out->socket_key);
        }
    }
    pthread_mutex_unlock(&lock);
    if (own >= 0) close(own);
    return status;
}

int foundry_ipc_unexport(uint32_t export_id) {
    pthread_mutex_lock(&lock);
    int status = export_id < export_count && exports[export_id].fd >= 0 ? FOUNDRY_OK : FOUNDRY_EINVAL;
    if (status == FOUNDRY_OK) { /* importers that already hold the memory keep it; no new one gets it */
        close(exports[export_id].fd);
        exports[export_id].fd = -1;
        memset(exports[export_id].token, 0, sizeof exports[export_id].token);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* -- the importer ----------------------------------------------------------------------- */

int foundry_ipc_check(const foundry_ipc_handle_t *h) {
    if (h == NULL) return FOUNDRY_EINVAL;
    if (h->magic != FOUNDRY_IPC_MAGIC) return FOUNDRY_IPC_EFORMAT;
    if (h->version != FOUNDRY_IPC_VERSION) return FOUNDRY_IPC_EVERSION;
    if (h->pid <= 0) return FOUNDRY_IPC_EFORMAT;
    if (kill(h->pid, 0) != 0 && errno == ESRCH) return FOUNDRY_IPC_ESTALE;
    return FOUNDRY_IPC_OK;
}

/* Whoever answers on the exporter's socket must be the exporter: abstract names carry
 * no permissions, so any process could bind one. */
static int peer_is_exporter(int conn, const foundry_ipc_handle_t *h) {
    struct ucred peer;
    socklen_t len = sizeof peer;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) return FOUNDRY_IPC_EPROTO;
    if (peer.uid == getuid()) return peer.pid == h->pid ? FOUNDRY_IPC_OK : FOUNDRY_IPC_EPEER;
    if (peer.pid != h->pid) return FOUNDRY_IPC_EPEERUID; /* an impostor of another user */
    /* The exporter itself, run by another user: it refuses this importer as it accepts it,
     * before reading anything, so its answer is already on the way; report what it said. */
    reply_t reply = {FOUNDRY_IPC_EPROTO};
    if (recv(conn, &reply, sizeof reply, 0) == (ssize_t)sizeof reply && reply.status == FOUNDRY_IPC_EUID)
        return FOUNDRY_IPC_EUID;
    return FOUNDRY_IPC_EPEERUID;
}

static int fetch(const foundry_ipc_handle_t *h, int *fd_out) {
    int conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    socklen_t len = socket_address(h->pid, h->socket_key, &addr);
    if (conn >= 0) set_timeouts(conn); /* connect too: a full backlog waits at most that long */
    if (conn < 0 || connect(conn, (struct sockaddr *)&addr, len) != 0) {
        if (conn >= 0) close(conn);
        return FOUNDRY_IPC_ECONNECT;
    }
    int status = peer_is_exporter(conn, h);
    if (status != FOUNDRY_IPC_OK) { /* never hand the token to an impostor */
        close(conn);
        return status;
    }
    request_t req = {h->export_id, {0}};
    memcpy(req.token, h->token, sizeof req.token);
    reply_t reply = {FOUNDRY_IPC_EPROTO};
    control_t control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {&reply, sizeof reply};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    status = FOUNDRY_IPC_EPROTO;
    int fd = -1;
    if (send(conn, &req, sizeof req, MSG_NOSIGNAL) == sizeof req &&
        recvmsg(conn, &msg, MSG_CMSG_CLOEXEC) == (ssize_t)sizeof reply) {
        struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
        if (cmsg && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS &&
            cmsg->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&fd, CMSG_DATA(cmsg), sizeof fd);
        status = reply.status;
        if (status == FOUNDRY_IPC_OK && (fd < 0 || (msg.msg_flags & MSG_CTRUNC))) status = FOUNDRY_IPC_EPROTO;
    }
    close(conn);
    if (status != FOUNDRY_IPC_OK) {
        if (fd >= 0) close(fd);
        return status;
    }
    *fd_out = fd;
    return FOUNDRY_IPC_OK;
}

int foundry_ipc_open(const foundry_ipc_handle_t *h, int *fd_out) {
    int status = foundry_ipc_check(h);
    if (status != FOUNDRY_IPC_OK || fd_out == NULL) return status == FOUNDRY_IPC_OK ? FOUNDRY_EINVAL : status;
    pthread_mutex_lock(&lock);
    int free_slot = -1;
    for (int i = 0; i < MAX_IMPORTS; i++) {
        if (same_import(i, h)) {
            imports[i].refs++; /* one open per call: each needs its own close */
            *fd_out = imports[i].fd;
            pthread_mutex_unlock(&lock);
            return FOUNDRY_IPC_OK;
        }
        if (!imports[i].refs && free_slot < 0) free_slot = i;
    }
    pthread_mutex_unlock(&lock);
    if (free_slot < 0) return FOUNDRY_ESTATE;
    int fd = -1;
    status = fetch(h, &fd); /* outside the lock: the server thread of this process takes it too */
    if (status != FOUNDRY_IPC_OK) return status;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_IMPORTS; i++) { /* another thread may have imported it meanwhile */
        if (same_import(i, h)) {
            imports[i].refs++;
            *fd_out = imports[i].fd;
            pthread_mutex_unlock(&lock);
            close(fd);
            return FOUNDRY_IPC_OK;
        }
    }
    if (imports[free_slot].refs) free_slot = -1;
    for (int i = 0; free_slot < 0 && i < MAX_IMPORTS; i++)
        if (!imports[i].refs) free_slot = i;
    if (free_slot < 0) {
        pthread_mutex_unlock(&lock);
        close(fd);
        return FOUNDRY_ESTATE;
    }
    imports[free_slot].handle = *h;
    imports[free_slot].fd = fd;
    imports[free_slot].refs = 1;
    pthread_mutex_unlock(&lock);
    *fd_out = fd;
    return FOUNDRY_IPC_OK;
}

int foundry_ipc_close(const foundry_ipc_handle_t *h, uint32_t *refs_left) {
    if (h == NULL) return FOUNDRY_EINVAL;
    pthread_mutex_lock(&lock);
    int status = FOUNDRY_ESTATE;
    for (int i = 0; i < MAX_IMPORTS; i++) {
        if (!same_import(i, h)) continue;
        if (--imports[i].refs == 0) close(imports[i].fd); /* the last reference releases the import */
        if (refs_left) *refs_left = imports[i].refs;
        status = FOUNDRY_OK;
        break;
    }
    pthread_mutex_unlock(&lock);
    return status;
}
