/*
 * The "pair" NTB port provider (ntbport.h): two ports joined inside one
 * process, for the fabric unit suite and benches on a machine with no NTB.
 *
 * It behaves as an adapter would where the backend can tell: the link is up
 * while both sides are open; a doorbell signals the other side's eventfd of
 * that bit (or the one routed there); a scratchpad write lands in the other
 * side's registers (and stays there, as in hardware, across the writer's
 * restarts); an outbound window reaches what the other side set as its
 * inbound target; a side closed with a keep stays as it was until it is
 * opened again.  What it cannot do: revoke a mapping already made of a
 * target (a memfd stays mapped where it was mapped; the backend clears
 * targets all the same), an eventfd that rings the peer's doorbell, or end
 * a keep by itself (no timer: it lasts until the next open).
 *
 * Threads: the two sides of a pair may belong to two threads (the unit
 * suite's threaded nodes); everything shared is under pair_lock (a pthread
 * mutex, which ThreadSanitizer sees).
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntbport.h"

#include "common/lock.h"
#include "common/peerfd.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

/* The emulated adapter's shape: a Switchtec-like port. */
#define PAIR_WINDOWS 4u
#define PAIR_SPADS 16u
#define PAIR_DOORBELLS 64u
#define PAIR_WINDOW_SIZE (UINT64_C(1) << 30)

typedef struct PairTarget {
    int fd; /* -1: no target */
    uint64_t offset;
    uint64_t size;
    uint8_t *map; /* in_alloc's buffer, mapped for its side */
} PairTarget;

typedef struct PairSide {
    bool open;     /* or kept: the link stays up, doorbells and windows as they were */
    bool kept;     /* closed with a keep: the next open of this side takes it over */
    uint32_t keep; /* the open side's keep (ms; 0: none); no timer here */
    GBytes *stash;
    int link_efd;
    int db_efd[PAIR_DOORBELLS];
    int route_efd[PAIR_DOORBELLS]; /* doorbell_route's (a copy), or -1 */
    uint32_t spad[PAIR_SPADS];     /* written by the other side */
    PairTarget in[PAIR_WINDOWS];
} PairSide;

typedef struct Pair {
    char *key;
    PairSide side[2];
} Pair;

typedef struct PairPort {
    VnNtbPort base;
    Pair *pair;
    unsigned side;
} PairPort;

static VnMutex pair_lock = VN_MUTEX_INIT;
static GHashTable *pairs; /* key -> Pair, while a side is open */

static PairPort *pair_port(VnNtbPort *p)
{
    return (PairPort *)p;
}

static PairSide *me(VnNtbPort *p)
{
    return &pair_port(p)->pair->side[pair_port(p)->side];
}

static PairSide *other(VnNtbPort *p)
{
    return &pair_port(p)->pair->side[!pair_port(p)->side];
}

static void target_clear(PairTarget *t)
{
    if (t->map != NULL) {
        munmap(t->map, t->size);
    }
    vn_util_close_fd(&t->fd);
    *t = (PairTarget){ .fd = -1 };
}

static void link_changed(Pair *pair)
{
    for (unsigned i = 0; i < 2; i++) {
        if (pair->side[i].open) {
            vn_peerfd_signal(pair->side[i].link_efd);
        }
    }
}

/* Everything a side set up goes, as a close without a keep. */
static void side_clear(PairSide *s)
{
    s->open = s->kept = false;
    s->keep = 0;
    for (unsigned w = 0; w < PAIR_WINDOWS; w++) {
        target_clear(&s->in[w]);
    }
    vn_util_close_fd(&s->link_efd);
    vn_util_close_fds(s->db_efd, PAIR_DOORBELLS);
    vn_util_close_fds(s->route_efd, PAIR_DOORBELLS);
    g_clear_pointer(&s->stash, g_bytes_unref);
}

static void pair_close(VnNtbPort *p)
{
    PairPort *pp = pair_port(p);
    PairSide *s;

    vn_mutex_lock(&pair_lock);
    s = me(p);
    if (s->keep > 0) {
        s->kept = true;
        s->keep = 0;
        vn_mutex_unlock(&pair_lock);
        g_free(pp);
        return;
    }
    side_clear(s);
    link_changed(pp->pair);
    if (!pp->pair->side[!pp->side].open) {
        g_hash_table_remove(pairs, pp->pair->key);
        g_free(pp->pair->key);
        g_free(pp->pair);
    }
    vn_mutex_unlock(&pair_lock);
    g_free(pp);
}

static bool pair_link_up(VnNtbPort *p)
{
    bool up;

    vn_mutex_lock(&pair_lock);
    up = other(p)->open;
    vn_mutex_unlock(&pair_lock);
    return up;
}

static int pair_link_fd(VnNtbPort *p)
{
    return me(p)->link_efd; /* only this side closes it */
}

static int pair_doorbell_fd(VnNtbPort *p, uint32_t bit)
{
    return bit < PAIR_DOORBELLS ? me(p)->db_efd[bit] : -EINVAL;
}

static int pair_peer_doorbell(VnNtbPort *p, uint64_t bits)
{
    vn_mutex_lock(&pair_lock);
    if (other(p)->open) {
        for (uint32_t b = 0; b < PAIR_DOORBELLS; b++) {
            if (bits & (UINT64_C(1) << b)) {
                vn_peerfd_signal(other(p)->route_efd[b] >= 0 ? other(p)->route_efd[b]
                                                             : other(p)->db_efd[b]);
            }
        }
    }
    vn_mutex_unlock(&pair_lock);
    return 0;
}

static int pair_doorbell_route(VnNtbPort *p, uint32_t bit, int fd)
{
    int copy = -1;

    if (bit >= PAIR_DOORBELLS) {
        return -EINVAL;
    }
    if (fd >= 0 && (copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        return -errno;
    }
    vn_mutex_lock(&pair_lock);
    vn_util_close_fd(&me(p)->route_efd[bit]);
    me(p)->route_efd[bit] = copy;
    vn_mutex_unlock(&pair_lock);
    return 0;
}

/* No kernel here to ring the peer from a signal: the peer's eventfd of that bit itself
 * (the route's once the peer set one), which a drop cannot take back. */
static int pair_peer_doorbell_fd(VnNtbPort *p, uint32_t bit)
{
    int fd;

    if (bit >= PAIR_DOORBELLS) {
        return -EINVAL;
    }
    vn_mutex_lock(&pair_lock);
    if (!other(p)->open) {
        fd = -ENOTCONN;
    } else {
        fd = fcntl(other(p)->route_efd[bit] >= 0 ? other(p)->route_efd[bit] : other(p)->db_efd[bit],
                   F_DUPFD_CLOEXEC, 0);
        fd = fd < 0 ? -errno : fd;
    }
    vn_mutex_unlock(&pair_lock);
    return fd;
}

static void pair_peer_doorbell_drop(VnNtbPort *p, uint32_t bit)
{
    /* A copy of the peer's eventfd cannot be taken back (pair_peer_doorbell_fd). */
}

static int pair_spad_read(VnNtbPort *p, uint32_t index, uint32_t *value)
{
    if (index >= PAIR_SPADS) {
        return -EINVAL;
    }
    vn_mutex_lock(&pair_lock);
    *value = me(p)->spad[index];
    vn_mutex_unlock(&pair_lock);
    return 0;
}

static int pair_peer_spad_write(VnNtbPort *p, uint32_t index, uint32_t value)
{
    if (index >= PAIR_SPADS) {
        return -EINVAL;
    }
    vn_mutex_lock(&pair_lock);
    other(p)->spad[index] = value;
    vn_mutex_unlock(&pair_lock);
    return 0;
}

/* Window @win of ours reaches @t now, or -EBUSY (and @t is undone): it reaches something. */
static int target_set(VnNtbPort *p, uint32_t win, PairTarget *t)
{
    PairTarget *in;
    int ret = 0;

    vn_mutex_lock(&pair_lock);
    in = &me(p)->in[win];
    if (in->fd >= 0) {
        ret = -EBUSY;
    } else {
        *in = *t;
    }
    vn_mutex_unlock(&pair_lock);
    if (ret < 0) {
        target_clear(t);
    }
    return ret;
}

static int pair_in_alloc(VnNtbPort *p, uint32_t win, uint64_t size, uint8_t **map)
{
    PairTarget t;
    int fd, ret = 0;
    void *m;

    if (win >= PAIR_WINDOWS || size == 0 || size > PAIR_WINDOW_SIZE || size % 4096 != 0) {
        return -EINVAL;
    }
    fd = vn_peerfd_memfd_new("vn-ntb-pair", size);
    if (fd < 0) {
        return fd;
    }
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        ret = -errno;
        close(fd);
        return ret;
    }
    t = (PairTarget){ .fd = fd, .offset = 0, .size = size, .map = m };
    ret = target_set(p, win, &t);
    if (ret == 0) {
        *map = m;
    }
    return ret;
}

static int pair_in_export(VnNtbPort *p, uint32_t win, int fd, uint64_t offset, uint64_t size)
{
    const char *why = NULL;
    PairTarget t;
    int copy;

    if (win >= PAIR_WINDOWS || size == 0 || size > PAIR_WINDOW_SIZE) {
        return -EINVAL;
    }
    if (vn_peerfd_memory(fd, offset, size, &why) < 0) {
        return -EINVAL;
    }
    copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        return -errno;
    }
    t = (PairTarget){ .fd = copy, .offset = offset, .size = size };
    return target_set(p, win, &t);
}

static int pair_in_clear(VnNtbPort *p, uint32_t win)
{
    if (win >= PAIR_WINDOWS) {
        return -EINVAL;
    }
    vn_mutex_lock(&pair_lock);
    target_clear(&me(p)->in[win]);
    vn_mutex_unlock(&pair_lock);
    return 0;
}

static int pair_out_fd(VnNtbPort *p, uint32_t win, bool memory, uint64_t *offset, uint64_t *size)
{
    PairTarget *t;
    int ret;

    if (win >= PAIR_WINDOWS) {
        return -EINVAL;
    }
    vn_mutex_lock(&pair_lock);
    t = &other(p)->in[win];
    if (!other(p)->open || t->fd < 0) {
        ret = -ENXIO;
    } else {
        ret = fcntl(t->fd, F_DUPFD_CLOEXEC, 0);
        ret = ret < 0 ? -errno : ret;
        *offset = t->offset;
        *size = t->size;
    }
    vn_mutex_unlock(&pair_lock);
    return ret;
}

static int pair_keep(VnNtbPort *p, uint32_t ms)
{
    vn_mutex_lock(&pair_lock);
    me(p)->keep = ms;
    vn_mutex_unlock(&pair_lock);
    return 0;
}

static int pair_stash_set(VnNtbPort *p, const void *buf, uint32_t len)
{
    if (len > VN_NTBPORT_MAX_STASH) {
        return -EINVAL;
    }
    vn_mutex_lock(&pair_lock);
    g_clear_pointer(&me(p)->stash, g_bytes_unref);
    me(p)->stash = len > 0 ? g_bytes_new(buf, len) : NULL;
    vn_mutex_unlock(&pair_lock);
    return 0;
}

static int pair_stash_get(VnNtbPort *p, void *buf, uint32_t size)
{
    gsize len = 0;
    const void *data;
    int ret;

    vn_mutex_lock(&pair_lock);
    data = me(p)->stash != NULL ? g_bytes_get_data(me(p)->stash, &len) : NULL;
    ret = len > size ? -ENOSPC : (int)len;
    if (ret > 0) {
        memcpy(buf, data, len);
    }
    vn_mutex_unlock(&pair_lock);
    return ret;
}

static bool side_open(PairSide *s, GError **error);

static int pair_reset(VnNtbPort *p)
{
    g_autoptr(GError) error = NULL;
    int ret = 0;

    vn_mutex_lock(&pair_lock);
    side_clear(me(p));
    if (!side_open(me(p), &error)) {
        ret = -EIO;
    }
    p->took_over = false;
    vn_mutex_unlock(&pair_lock);
    return ret;
}

static int pair_in_take(VnNtbPort *p, uint32_t win, uint64_t size, uint8_t **map)
{
    PairTarget *t;
    int ret = -ENOENT;

    if (win >= PAIR_WINDOWS) {
        return -EINVAL;
    }
    vn_mutex_lock(&pair_lock);
    t = &me(p)->in[win];
    if (t->map != NULL && t->size >= size) {
        *map = t->map;
        ret = 0;
    }
    vn_mutex_unlock(&pair_lock);
    return ret;
}

static const VnNtbPortOps pair_ops = {
    .name = "pair",
    .close = pair_close,
    .link_up = pair_link_up,
    .link_fd = pair_link_fd,
    .doorbell_fd = pair_doorbell_fd,
    .peer_doorbell = pair_peer_doorbell,
    .doorbell_route = pair_doorbell_route,
    .peer_doorbell_fd = pair_peer_doorbell_fd,
    .peer_doorbell_drop = pair_peer_doorbell_drop,
    .spad_read = pair_spad_read,
    .peer_spad_write = pair_peer_spad_write,
    .in_alloc = pair_in_alloc,
    .in_export = pair_in_export,
    .in_clear = pair_in_clear,
    .out_fd = pair_out_fd,
    .keep = pair_keep,
    .stash_set = pair_stash_set,
    .stash_get = pair_stash_get,
    .reset = pair_reset,
    .in_take = pair_in_take,
};

static bool side_open(PairSide *s, GError **error)
{
    s->link_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    for (unsigned b = 0; b < PAIR_DOORBELLS; b++) {
        s->db_efd[b] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (s->db_efd[b] < 0) {
            break;
        }
    }
    if (s->link_efd < 0 || s->db_efd[PAIR_DOORBELLS - 1] < 0) {
        int e = errno;

        vn_util_close_fd(&s->link_efd);
        vn_util_close_fds(s->db_efd, PAIR_DOORBELLS);
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "eventfd: %s", g_strerror(e));
        return false;
    }
    for (unsigned w = 0; w < PAIR_WINDOWS; w++) {
        s->in[w] = (PairTarget){ .fd = -1 };
    }
    s->open = true;
    return true;
}

VnNtbPort *vn_ntbport_pair_open(const char *key, unsigned side, GError **error)
{
    bool took_over;
    PairPort *pp;
    Pair *pair;

    if (side > 1 || key == NULL || key[0] == '\0') {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "ntb port pair:%s/%u: a pair has sides 0 and 1", key != NULL ? key : "", side);
        return NULL;
    }
    vn_mutex_lock(&pair_lock);
    if (pairs == NULL) {
        pairs = g_hash_table_new(g_str_hash, g_str_equal);
    }
    pair = g_hash_table_lookup(pairs, key);
    took_over = pair != NULL && pair->side[side].kept;
    if (pair != NULL && pair->side[side].open && !took_over) {
        vn_mutex_unlock(&pair_lock);
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_BUSY, "ntb port pair:%s/%u: already open", key,
                    side);
        return NULL;
    }
    if (pair == NULL) {
        pair = g_new0(Pair, 1);
        pair->key = g_strdup(key);
        for (unsigned i = 0; i < 2; i++) {
            pair->side[i].link_efd = -1;
            for (unsigned b = 0; b < PAIR_DOORBELLS; b++) {
                pair->side[i].db_efd[b] = -1;
                pair->side[i].route_efd[b] = -1;
            }
        }
        g_hash_table_insert(pairs, pair->key, pair);
    }
    if (took_over) {
        pair->side[side].kept = false;
    } else if (!side_open(&pair->side[side], error)) {
        if (!pair->side[!side].open) {
            g_hash_table_remove(pairs, key);
            g_free(pair->key);
            g_free(pair);
        }
        vn_mutex_unlock(&pair_lock);
        return NULL;
    }
    link_changed(pair);
    vn_mutex_unlock(&pair_lock);

    pp = g_new0(PairPort, 1);
    pp->pair = pair;
    pp->side = side;
    pp->base.ops = &pair_ops;
    pp->base.info = (VnNtbPortInfo){ .windows = PAIR_WINDOWS,
                                     .spads = PAIR_SPADS,
                                     .doorbells = PAIR_DOORBELLS,
                                     .out_size = PAIR_WINDOW_SIZE,
                                     .doorbell_routes = true };
    pp->base.took_over = took_over;
    return &pp->base;
}
