/*
 * The "kmod" NTB port provider (ntbport.h): a port of a real adapter through
 * our kernel module's character device, /dev/vfio-ntb/<pci name>
 * (vfio-ntb/kmod/vfio_ntb_uapi.h), so every adapter Linux's NTB drivers
 * handle works.
 *
 * An inbound target of our memory is the memory mapped here and handed to
 * VN_NTB_MW_EXPORT, which pins it and maps it for the NTB's DMA device; the
 * mapping is kept until the target is cleared.  A device's BAR is exported
 * the same way, mapped from its VFIO device fd (the only device memory the
 * module takes).
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntbport.h"

#include "common/util.h"
#include "kmod/vfio_ntb_uapi.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct KmodTarget {
    uint8_t *map; /* what we mapped for it (ours, or the module's buffer) */
    uint64_t size;
} KmodTarget;

typedef struct KmodPort {
    VnNtbPort base;
    int fd;
    int link_efd;
    int db_efd[VN_NTBPORT_MAX_DOORBELLS];
    KmodTarget in[VN_NTBPORT_MAX_WINDOWS];
} KmodPort;

static KmodPort *kmod_port(VnNtbPort *p)
{
    return (KmodPort *)p;
}

static int kmod_ioctl(VnNtbPort *p, unsigned long cmd, void *arg)
{
    return ioctl(kmod_port(p)->fd, cmd, arg) < 0 ? -errno : 0;
}

static void target_unmap(KmodTarget *t)
{
    if (t->map != NULL) {
        munmap(t->map, t->size);
    }
    *t = (KmodTarget){ 0 };
}

static void kmod_close(VnNtbPort *p)
{
    KmodPort *kp = kmod_port(p);

    /* Unmapped first: the module keeps a window that is mapped (EBUSY). */
    for (unsigned w = 0; w < VN_NTBPORT_MAX_WINDOWS; w++) {
        target_unmap(&kp->in[w]);
    }
    /* Closing the device undoes the rest: targets, links, eventfds. */
    vn_util_close_fd(&kp->fd);
    vn_util_close_fd(&kp->link_efd);
    vn_util_close_fds(kp->db_efd, VN_NTBPORT_MAX_DOORBELLS);
    g_free(kp);
}

static bool kmod_link_up(VnNtbPort *p)
{
    struct vn_ntb_info info = { .argsz = sizeof(info) };

    return kmod_ioctl(p, VN_NTB_INFO, &info) == 0 && (info.flags & VN_NTB_INFO_LINK_UP);
}

static int kmod_link_fd(VnNtbPort *p)
{
    return kmod_port(p)->link_efd;
}

static int kmod_doorbell_fd(VnNtbPort *p, uint32_t bit)
{
    return bit < p->info.doorbells ? kmod_port(p)->db_efd[bit] : -EINVAL;
}

static int kmod_peer_doorbell(VnNtbPort *p, uint64_t bits)
{
    return kmod_ioctl(p, VN_NTB_PEER_DB_SET, &bits);
}

/* Our doorbell @bit signals @fd, or its own eventfd again (-1): the module keeps one
 * eventfd per bit, so registering one replaces the other. */
static int kmod_doorbell_route(VnNtbPort *p, uint32_t bit, int fd)
{
    struct vn_ntb_db_eventfd d = { .fd = fd, .bits = UINT64_C(1) << bit };

    if (bit >= p->info.doorbells || !p->info.doorbell_routes) {
        return -EINVAL;
    }
    if (fd < 0) {
        d.fd = kmod_port(p)->db_efd[bit];
    }
    return kmod_ioctl(p, VN_NTB_DB_EVENTFD, &d);
}

static int kmod_peer_doorbell_fd(VnNtbPort *p, uint32_t bit)
{
    struct vn_ntb_db_eventfd d = { .bits = UINT64_C(1) << bit };
    int ret;

    if (bit >= p->info.doorbells || !p->info.doorbell_routes) {
        return -EINVAL;
    }
    d.fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (d.fd < 0) {
        return -errno;
    }
    ret = kmod_ioctl(p, VN_NTB_PEER_DB_EVENTFD, &d);
    if (ret < 0) {
        close(d.fd);
        return ret;
    }
    return d.fd;
}

static void kmod_peer_doorbell_drop(VnNtbPort *p, uint32_t bit)
{
    struct vn_ntb_db_eventfd d = { .fd = -1, .bits = UINT64_C(1) << bit };

    if (bit < p->info.doorbells && p->info.doorbell_routes) {
        kmod_ioctl(p, VN_NTB_PEER_DB_EVENTFD, &d);
    }
}

static int kmod_spad_read(VnNtbPort *p, uint32_t index, uint32_t *value)
{
    struct vn_ntb_spad s = { .index = index };
    int ret = kmod_ioctl(p, VN_NTB_SPAD_READ, &s);

    *value = s.value;
    return ret;
}

static int kmod_peer_spad_write(VnNtbPort *p, uint32_t index, uint32_t value)
{
    struct vn_ntb_spad s = { .index = index, .value = value };

    return kmod_ioctl(p, VN_NTB_PEER_SPAD_WRITE, &s);
}

/* The module's buffer behind inbound window @win, @size bytes of it mapped here (ours until
 * in_clear); -ENOENT when there is none of that size. */
static int buffer_map(VnNtbPort *p, uint32_t win, uint64_t size, uint8_t **map)
{
    struct vn_ntb_mw_info mi = { .argsz = sizeof(mi), .index = win };
    int ret = kmod_ioctl(p, VN_NTB_MW_INFO, &mi);
    void *m;

    if (ret < 0) {
        return ret;
    }
    if (mi.in_mmap_offset == 0 || mi.in_size < size) {
        return -ENOENT;
    }
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, kmod_port(p)->fd,
             (off_t)mi.in_mmap_offset);
    if (m == MAP_FAILED) {
        return -errno;
    }
    kmod_port(p)->in[win] = (KmodTarget){ .map = m, .size = size };
    *map = m;
    return 0;
}

static int kmod_in_alloc(VnNtbPort *p, uint32_t win, uint64_t size, uint8_t **map)
{
    struct vn_ntb_mw_alloc a = { .index = win, .size = size };
    int ret;

    if (win >= p->info.windows || kmod_port(p)->in[win].map != NULL) {
        return win >= p->info.windows ? -EINVAL : -EBUSY;
    }
    ret = kmod_ioctl(p, VN_NTB_MW_ALLOC, &a);
    if (ret == 0 && (ret = buffer_map(p, win, size, map)) < 0) {
        kmod_ioctl(p, VN_NTB_MW_CLEAR, &win);
    }
    return ret;
}

static int kmod_in_export(VnNtbPort *p, uint32_t win, int fd, uint64_t offset, uint64_t size)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    struct vn_ntb_mw_export e = { .index = win };
    void *m;
    int ret;

    /* A translation is whole pages.  A segment of less than a page is a BAR smaller than one
     * (registers), which VFIO lets be mapped only when the rest of its page is reserved
     * for it, as it does for the borrower's QEMU. */
    if (size == 0 || size > UINT64_MAX - page) {
        return -EINVAL;
    }
    size = (size + page - 1) & ~(page - 1);
    e.size = size;
    if (win >= p->info.windows || kmod_port(p)->in[win].map != NULL) {
        return win >= p->info.windows ? -EINVAL : -EBUSY;
    }
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    if (m == MAP_FAILED) {
        return -errno;
    }
    e.vaddr = (uintptr_t)m;
    /* EAGAIN: VFIO took the BAR's mapping away while the module read it (a reset or a
     * decode change under way); what it reads next time is what holds. */
    for (int tries = 0; (ret = kmod_ioctl(p, VN_NTB_MW_EXPORT, &e)) == -EAGAIN && tries < 10;
         tries++) {
        g_info("ntb port %s: window %u: its BAR changed while it was read; again", p->spec, win);
        g_usleep(1000);
    }
    if (ret < 0) {
        munmap(m, size);
        return ret;
    }
    kmod_port(p)->in[win] = (KmodTarget){ .map = m, .size = size };
    return 0;
}

static int kmod_in_clear(VnNtbPort *p, uint32_t win)
{
    int ret;

    if (win >= p->info.windows) {
        return -EINVAL;
    }
    /* Cleared first: our munmap of a BAR target would revoke it in the module too (its
     * watch on that mapping), which is for VFIO's taking the BAR away, not for us. */
    ret = kmod_ioctl(p, VN_NTB_MW_CLEAR, &win);
    target_unmap(&kmod_port(p)->in[win]);
    return ret;
}

static int kmod_out_fd(VnNtbPort *p, uint32_t win, bool memory, uint64_t *offset, uint64_t *size)
{
    struct vn_ntb_mw_info mi = { .argsz = sizeof(mi), .index = win };
    struct vn_ntb_mw_fd wf = { .argsz = sizeof(wf),
                               .index = win,
                               .flags = memory ? VN_NTB_MW_FD_WC : 0 };
    int ret = kmod_ioctl(p, VN_NTB_MW_INFO, &mi);

    if (ret < 0) {
        return ret;
    }
    if (mi.out_size == 0) {
        return -ENXIO;
    }
    /* A file for this window alone (mmap and nothing else): it may reach a VM's QEMU. */
    ret = ioctl(kmod_port(p)->fd, VN_NTB_MW_FD, &wf);
    if (ret < 0) {
        return -errno;
    }
    *offset = 0;
    *size = mi.out_size;
    return ret;
}

static int kmod_out_revoke(VnNtbPort *p, uint32_t win)
{
    return kmod_ioctl(p, VN_NTB_MW_REVOKE, &win);
}

/* One file for several windows (mmap and nothing else), as kmod_out_fd's for one. */
static int kmod_out_span_fd(VnNtbPort *p, const uint32_t *wins, uint32_t n, uint64_t chunk,
                            bool memory)
{
    struct vn_ntb_mw_span_fd sf = {
        .argsz = sizeof(sf), .flags = memory ? VN_NTB_MW_FD_WC : 0, .count = n, .chunk = chunk
    };
    int ret;

    if (n == 0 || n > VN_NTB_MAX_MWS) {
        return -EINVAL;
    }
    memcpy(sf.index, wins, n * sizeof(wins[0]));
    ret = ioctl(kmod_port(p)->fd, VN_NTB_MW_SPAN_FD, &sf);
    return ret < 0 ? -errno : ret;
}

static int kmod_keep(VnNtbPort *p, uint32_t ms)
{
    return kmod_ioctl(p, VN_NTB_KEEP, &ms);
}

static int kmod_stash_set(VnNtbPort *p, const void *buf, uint32_t len)
{
    struct vn_ntb_stash st = { .addr = (uintptr_t)buf, .len = len };

    return kmod_ioctl(p, VN_NTB_STASH_SET, &st);
}

static int kmod_stash_get(VnNtbPort *p, void *buf, uint32_t size)
{
    struct vn_ntb_stash st = { .addr = (uintptr_t)buf, .len = size };
    int ret = kmod_ioctl(p, VN_NTB_STASH_GET, &st);

    return ret < 0 ? ret : (int)st.len;
}

static int kmod_register_doorbells(KmodPort *kp, const char **what);

static int kmod_reset(VnNtbPort *p)
{
    KmodPort *kp = kmod_port(p);
    const char *what;
    uint32_t enable = 1;
    int ret;

    for (unsigned w = 0; w < VN_NTBPORT_MAX_WINDOWS; w++) {
        target_unmap(&kp->in[w]);
    }
    /* Everything goes, our eventfds' registrations too: they are made again. */
    ret = kmod_ioctl(p, VN_NTB_RESET, NULL);
    if (ret == 0) {
        p->took_over = false;
        ret = kmod_ioctl(p, VN_NTB_LINK_EVENTFD, &kp->link_efd);
    }
    if (ret == 0) {
        ret = kmod_register_doorbells(kp, &what);
    }
    return ret < 0 ? ret : kmod_ioctl(p, VN_NTB_LINK, &enable);
}

static int kmod_in_take(VnNtbPort *p, uint32_t win, uint64_t size, uint8_t **map)
{
    if (win >= p->info.windows || kmod_port(p)->in[win].map != NULL) {
        return win >= p->info.windows ? -EINVAL : -EBUSY;
    }
    return buffer_map(p, win, size, map);
}

static const VnNtbPortOps kmod_ops = {
    .name = "kmod",
    .close = kmod_close,
    .link_up = kmod_link_up,
    .link_fd = kmod_link_fd,
    .doorbell_fd = kmod_doorbell_fd,
    .peer_doorbell = kmod_peer_doorbell,
    .doorbell_route = kmod_doorbell_route,
    .peer_doorbell_fd = kmod_peer_doorbell_fd,
    .peer_doorbell_drop = kmod_peer_doorbell_drop,
    .spad_read = kmod_spad_read,
    .peer_spad_write = kmod_peer_spad_write,
    .in_alloc = kmod_in_alloc,
    .in_export = kmod_in_export,
    .in_clear = kmod_in_clear,
    .out_fd = kmod_out_fd,
    .out_span_fd = kmod_out_span_fd,
    .out_revoke = kmod_out_revoke,
    .keep = kmod_keep,
    .stash_set = kmod_stash_set,
    .stash_get = kmod_stash_get,
    .reset = kmod_reset,
    .in_take = kmod_in_take,
};

/* Each doorbell bit signals an eventfd of ours. */
static int kmod_register_doorbells(KmodPort *kp, const char **what)
{
    int ret = 0;

    for (uint32_t b = 0; ret == 0 && b < MIN(kp->base.info.doorbells, VN_NTBPORT_MAX_DOORBELLS);
         b++) {
        struct vn_ntb_db_eventfd d = { .fd = kp->db_efd[b], .bits = UINT64_C(1) << b };

        *what = "VN_NTB_DB_EVENTFD";
        ret = kmod_ioctl(&kp->base, VN_NTB_DB_EVENTFD, &d);
    }
    return ret;
}

/* The shape, the link and doorbell eventfds, the link enabled; -errno with
 * what failed in *@what. */
static int kmod_setup(KmodPort *kp, const char **what)
{
    struct vn_ntb_info info = { .argsz = sizeof(info) };
    uint64_t out_size = UINT64_MAX;
    uint32_t enable = 1;
    int ret;

    *what = "VN_NTB_INFO";
    ret = kmod_ioctl(&kp->base, VN_NTB_INFO, &info);
    if (ret < 0) {
        return ret;
    }
    kp->base.info.windows = MIN(MIN(info.mw_count, info.peer_mw_count), VN_NTBPORT_MAX_WINDOWS);
    kp->base.info.spads = info.spad_count;
    /* Bits 0..n-1 valid, as every driver Linux has reports them. */
    kp->base.info.doorbells = (uint32_t)__builtin_popcountll(info.db_valid_mask);
    for (uint32_t w = 0; w < kp->base.info.windows; w++) {
        struct vn_ntb_mw_info mi = { .argsz = sizeof(mi), .index = w };

        *what = "VN_NTB_MW_INFO";
        ret = kmod_ioctl(&kp->base, VN_NTB_MW_INFO, &mi);
        if (ret < 0) {
            return ret;
        }
        /* Window 0 carries messages (fabric/ntb.c): the rest carry segments. */
        if (w > 0 || kp->base.info.windows == 1) {
            out_size = MIN(out_size, mi.out_size);
        }
    }
    kp->base.info.out_size = out_size == UINT64_MAX ? 0 : out_size;

    *what = "eventfd";
    kp->link_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (kp->link_efd < 0) {
        return -errno;
    }
    *what = "VN_NTB_LINK_EVENTFD";
    ret = kmod_ioctl(&kp->base, VN_NTB_LINK_EVENTFD, &kp->link_efd);
    for (uint32_t b = 0; ret == 0 && b < MIN(kp->base.info.doorbells, VN_NTBPORT_MAX_DOORBELLS);
         b++) {
        kp->db_efd[b] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (kp->db_efd[b] < 0) {
            *what = "eventfd";
            return -errno;
        }
    }
    /* What we took over keeps its doorbells' eventfds (a VM's, for a route) until the
     * backend gives each bit of its own back. */
    kp->base.took_over = (info.flags & VN_NTB_INFO_KEPT) != 0;
    if (ret == 0 && !kp->base.took_over) {
        ret = kmod_register_doorbells(kp, what);
    }
    if (ret == 0) {
        /* A module older than VN_NTB_PEER_DB_EVENTFD answers ENOTTY; ours ENOENT (no
         * trigger on that bit): interrupts are then relayed as messages. */
        struct vn_ntb_db_eventfd d = { .fd = -1, .bits = 1 };

        kp->base.info.doorbell_routes =
            kp->base.info.doorbells > 0 &&
            kmod_ioctl(&kp->base, VN_NTB_PEER_DB_EVENTFD, &d) == -ENOENT;
        *what = "VN_NTB_LINK";
        ret = kmod_ioctl(&kp->base, VN_NTB_LINK, &enable);
    }
    return ret;
}

VnNtbPort *vn_ntbport_kmod_open(const char *path, GError **error)
{
    KmodPort *kp = g_new0(KmodPort, 1);
    const char *what = "open";
    int ret;

    kp->base.ops = &kmod_ops;
    kp->link_efd = -1;
    for (unsigned b = 0; b < VN_NTBPORT_MAX_DOORBELLS; b++) {
        kp->db_efd[b] = -1;
    }
    kp->fd = open(path, O_RDWR | O_CLOEXEC);
    ret = kp->fd < 0 ? -errno : kmod_setup(kp, &what);
    if (ret < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret), "ntb port %s: %s: %s%s", path,
                    what, g_strerror(-ret),
                    ret == -ENOENT  ? " (is the vfio_ntb module loaded? make install-modules)"
                    : ret == -EBUSY ? " (another process has it open)"
                                    : "");
        kmod_close(&kp->base);
        return NULL;
    }
    return &kp->base;
}
