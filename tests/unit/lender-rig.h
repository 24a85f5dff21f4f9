/*
 * The rig of the lender's unit tests (check_lender.c, check_lender_untrusted.c,
 * check_lender_server.c).
 *
 * One process, three threads:
 * - the device: a VnServer with a small fake device (BAR0 a mappable
 *   memfd, a config region, INTx and 4 MSI-X vectors) in its own context;
 * - the lender: fabric node "lender" and the VnLender, in its own context
 *   (the lender's vfio-user client blocks, so it cannot share the device's
 *   thread; the borrowers' requests are synchronous, so not theirs either);
 * - the test: borrower nodes "b" and "c" speaking the lending protocol with
 *   fw_request(), in a context the test iterates.
 * What the device saw is read through its DMA and interrupt tables (which
 * lock); the lender's and the server's state through calls run in their
 * threads (on_loop).
 */
#ifndef VN_LENDER_RIG_H
#define VN_LENDER_RIG_H

#include "common/json.h"
#include "common/peerfd.h"
#include "fabric/fabric.h"
#include "lending/lender.h"
#include "lending/proto.h"
#include "vfio-user/server.h"

#include "check-main.h"
#include "fabric-wait.h"
#include "loop-rig.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <linux/pci_regs.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEV "nvme0"
#define BAR0_SIZE 0x4000u
#define CFG_SIZE 256u
#define ROM_SIZE 0x8000u /* the expansion ROM (read-only, trapped) */
#define MSIX_VECTORS 4u
#define MEM_SIZE 0x10000u /* a borrower's "guest RAM" segment */

/* ---- the fake device ---------------------------------------------------- */

typedef struct Fake {
    int bar_fd;
    uint8_t *bar;
    int regs_fd; /* BAR1 with rig_small_bar: registers of less than a page, mappable */
    uint8_t *regs;
    uint8_t cfg[CFG_SIZE];
    uint8_t rom[ROM_SIZE];
    gint resets;                         /* atomic: bumped in the device thread */
    gint irq_changes[VFIO_PCI_NUM_IRQS]; /* SET_IRQS per index, atomic */
    /* When each last happened, in the order of the device's events (atomic): what a
     * fence's order is checked by. */
    gint events;
    gint irq_change_at, bus_master_off_at, reset_at;
    gint odd_writes; /* BAR2's, with rig_odd_bar (atomic) */
} Fake;

/* rig_small_bar's BAR1 (below): its size; its first half takes writes, the rest refuses
 * them. */
#define SMALL_BAR_SIZE 0x100u
#define SMALL_BAR_WRITABLE 0x80u

/* A read of rig_small_bar's BAR1 at SMALL_BAR_GATED waits (in the device's thread) until
 * the test opens the gate (rig_gate_open), at most 5 s: a device that takes its time. */
#define SMALL_BAR_GATED 0xf0u
static GMutex rig_gate_lock;
static GCond rig_gate_cond;
static bool rig_gate_shut, rig_gate_reached;

static inline void rig_gate_pass(void)
{
    gint64 end = g_get_monotonic_time() + 5 * G_TIME_SPAN_SECOND;

    g_mutex_lock(&rig_gate_lock);
    rig_gate_reached = true;
    g_cond_broadcast(&rig_gate_cond);
    while (rig_gate_shut && g_cond_wait_until(&rig_gate_cond, &rig_gate_lock, end)) {
    }
    g_mutex_unlock(&rig_gate_lock);
}

/* Whether a gated read reached the device, waiting at most @ms. */
static inline bool rig_gate_wait_reached(int ms)
{
    gint64 end = g_get_monotonic_time() + ms * G_TIME_SPAN_MILLISECOND;
    bool reached;

    g_mutex_lock(&rig_gate_lock);
    while (!rig_gate_reached && g_cond_wait_until(&rig_gate_cond, &rig_gate_lock, end)) {
    }
    reached = rig_gate_reached;
    g_mutex_unlock(&rig_gate_lock);
    return reached;
}

static inline void rig_gate_set(bool shut)
{
    g_mutex_lock(&rig_gate_lock);
    rig_gate_shut = shut;
    rig_gate_reached = false;
    g_cond_broadcast(&rig_gate_cond);
    g_mutex_unlock(&rig_gate_lock);
}

static inline int fake_read(void *opaque, uint32_t index, uint64_t off, void *buf, uint32_t n)
{
    Fake *f = opaque;

    if (index == VFIO_PCI_BAR1_REGION_INDEX && f->regs != NULL && off == SMALL_BAR_GATED) {
        rig_gate_pass();
    }
    if (index == VFIO_PCI_BAR0_REGION_INDEX) {
        memcpy(buf, f->bar + off, n);
    } else if (index == VFIO_PCI_BAR1_REGION_INDEX && f->regs != NULL) {
        memcpy(buf, f->regs + off, n);
    } else if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        memcpy(buf, f->cfg + off, n);
    } else if (index == VFIO_PCI_BAR2_REGION_INDEX) {
        for (uint32_t i = 0; i < n; i++) {
            ((uint8_t *)buf)[i] = (uint8_t)(off + i);
        }
    } else if (index == VFIO_PCI_ROM_REGION_INDEX) {
        memcpy(buf, f->rom + off, n);
    } else {
        return -EINVAL;
    }
    return 0;
}

static inline int fake_write(void *opaque, uint32_t index, uint64_t off, const void *buf,
                             uint32_t n)
{
    Fake *f = opaque;

    if (index == VFIO_PCI_BAR0_REGION_INDEX) {
        memcpy(f->bar + off, buf, n);
    } else if (index == VFIO_PCI_BAR1_REGION_INDEX && f->regs != NULL) {
        if (off + n > SMALL_BAR_WRITABLE) {
            return -EIO; /* its read-only part refuses writes */
        }
        memcpy(f->regs + off, buf, n);
    } else if (index == VFIO_PCI_BAR2_REGION_INDEX) {
        g_atomic_int_inc(&f->odd_writes);
    } else if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        memcpy(f->cfg + off, buf, n);
        if (off <= PCI_COMMAND && off + n > PCI_COMMAND &&
            !(f->cfg[PCI_COMMAND] & PCI_COMMAND_MASTER)) {
            g_atomic_int_set(&f->bus_master_off_at, g_atomic_int_add(&f->events, 1) + 1);
        }
    } else {
        return -EINVAL;
    }
    return 0;
}

static inline int fake_reset(void *opaque)
{
    Fake *f = opaque;

    g_atomic_int_inc(&f->resets);
    g_atomic_int_set(&f->reset_at, g_atomic_int_add(&f->events, 1) + 1);
    return 0;
}

static inline void fake_irqs_changed(void *opaque, uint32_t index)
{
    Fake *f = opaque;

    if (index < VFIO_PCI_NUM_IRQS) {
        g_atomic_int_inc(&f->irq_changes[index]);
        g_atomic_int_set(&f->irq_change_at, g_atomic_int_add(&f->events, 1) + 1);
    }
}

static const VnDeviceOps fake_ops = {
    .region_read = fake_read,
    .region_write = fake_write,
    .reset = fake_reset,
    .irqs_changed = fake_irqs_changed,
};

/* ---- the rig ------------------------------------------------------------ */

typedef struct Borrower {
    char name[VN_MAX_NODE_NAME + 1];
    VnFabric *fab;
    unsigned doorbells[VN_FABRIC_MAX_DOORBELLS]; /* rung, per bit (test thread) */
} Borrower;

/* Set before setup(): the device has a BAR1 of SMALL_BAR_SIZE bytes, mappable (as VFIO lets a
 * page-aligned BAR of less than a page be). */
static bool rig_small_bar;
/* Set before setup(): the device has a trapped BAR2 of ODD_BAR_SIZE bytes, not a power of
 * two (libvfio-user's sample server has one); it reads as its offsets. */
static bool rig_odd_bar;
#define ODD_BAR_SIZE 0x300u

static struct {
    char *dir;
    char *fabric_dir;
    char *sock;
    Fake fake;
    Loop dev;
    VnServer *server;
    VnDeviceInfo info; /* what the server serves (a restarted one serves it again) */
    Loop lend;
    VnFabric *lfab;
    VnLender *lender;
    GMainContext *ctx; /* the borrowers', iterated by the test */
    Borrower *b[2];
    int fds_before;
} rig;

static inline gint64 now_ms(void)
{
    return g_get_monotonic_time() / 1000;
}

/* Iterate the borrowers' context until @cond holds (bounded by @ms). */
#define WAIT_FOR_MS(cond, ms)                                      \
    do {                                                           \
        gint64 end_ = now_ms() + (ms);                             \
        while (!(cond) && now_ms() < end_) {                       \
            if (!g_main_context_iteration(rig.ctx, FALSE)) {       \
                g_usleep(500);                                     \
            }                                                      \
        }                                                          \
        ck_assert_msg((cond), "timed out waiting for: %s", #cond); \
    } while (0)
#define WAIT_FOR(cond) WAIT_FOR_MS(cond, 3000)

static inline void spin(int ms)
{
    gint64 end = now_ms() + ms;

    while (now_ms() < end) {
        if (!g_main_context_iteration(rig.ctx, FALSE)) {
            g_usleep(500);
        }
    }
}

/* The lender node's handlers: what a daemon would route to its lender. */
static inline void lender_on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    if (rig.lender == NULL) {
        vn_fabric_reply_error(rig.lfab, token, ENODEV, "no lender");
        return;
    }
    vn_lender_request(rig.lender, msg, token);
}

static inline void lender_on_link(void *opaque, const char *peer, bool up)
{
    if (!up && rig.lender != NULL) {
        vn_lender_peer_down(rig.lender, peer);
    }
}

static const VnFabricHandlers lender_handlers = {
    .on_request = lender_on_request,
    .on_link = lender_on_link,
};

static inline void borrower_on_doorbell(void *opaque, const char *peer, uint32_t bit)
{
    ((Borrower *)opaque)->doorbells[bit]++;
}

static const VnFabricHandlers borrower_handlers = {
    .on_doorbell = borrower_on_doorbell,
};

static inline VnFabric *node_open(const char *name, const VnFabricHandlers *h, void *opaque,
                                  GMainContext *ctx)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    VnFabric *fab;

    g_hash_table_insert(params, "dir", rig.fabric_dir);
    g_hash_table_insert(params, "request-timeout-ms", "3000");
    fab = vn_fabric_open("shm", name, params, h, opaque, ctx, &error);
    ck_assert_msg(fab != NULL, "%s", error ? error->message : "");
    return fab;
}

/* Borrower @i ("b" or "c"), linked to the lender. */
static inline Borrower *borrower(int i)
{
    g_autoptr(GError) error = NULL;
    Borrower *b;

    if (rig.b[i] != NULL) {
        return rig.b[i];
    }
    b = g_new0(Borrower, 1);
    g_strlcpy(b->name, i == 0 ? "b" : "c", sizeof(b->name));
    b->fab = node_open(b->name, &borrower_handlers, b, rig.ctx);
    ck_assert_msg(vn_fabric_connect(b->fab, "lender", &error), "%s", error ? error->message : "");
    rig.b[i] = b;
    return b;
}

static inline void borrower_close(int i)
{
    if (rig.b[i] != NULL) {
        vn_fabric_close(rig.b[i]->fab);
        g_free(rig.b[i]);
        rig.b[i] = NULL;
    }
}

static inline int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n - 1; /* the DIR's own */
}

/* How the lender reaches the rig's device server (a suite may wrap it). */
static const VnBackendOps *rig_backend = &vn_backend_vfio_user;

static inline void server_up_fn(void *data)
{
    *(bool *)data = vn_lender_server_up(rig.lender);
}

/* Wait until the lender says a device server answers (@up) or not; false after @ms. */
static inline bool lender_server_wait(bool up, int ms)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)ms * 1000;

    for (;;) {
        bool now = !up;

        on_loop(&rig.lend, server_up_fn, &now);
        if (now == up) {
            return true;
        }
        if (g_get_monotonic_time() > deadline) {
            return false;
        }
        g_usleep(10 * 1000);
    }
}

static inline void setup(void)
{
    VnDeviceInfo info = { .flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
                          .num_regions = VFIO_PCI_NUM_REGIONS,
                          .num_irqs = VFIO_PCI_NUM_IRQS };
    g_autoptr(GError) error = NULL;

    memset(&rig, 0, sizeof(rig));
    /* GLib's default context (and its wakeup fd) is made once per process,
     * by the first g_main_context_push_thread_default(): not ours. */
    g_main_context_default();
    rig.fds_before = count_fds();
    rig.dir = g_dir_make_tmp("vn-lender-XXXXXX", NULL);
    ck_assert_ptr_nonnull(rig.dir);
    rig.fabric_dir = g_build_filename(rig.dir, "fabric", NULL);
    ck_assert_int_eq(g_mkdir(rig.fabric_dir, 0700), 0);
    rig.sock = g_build_filename(rig.dir, "dev.sock", NULL);

    rig.fake.bar_fd = vn_peerfd_memfd_new("bar0", BAR0_SIZE);
    ck_assert_int_ge(rig.fake.bar_fd, 0);
    rig.fake.bar = mmap(NULL, BAR0_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, rig.fake.bar_fd, 0);
    ck_assert(rig.fake.bar != MAP_FAILED);
    for (uint32_t i = 0; i < info.num_regions; i++) {
        info.regions[i].mmap_fd = -1;
    }
    info.regions[0] = (VnRegion){ .size = BAR0_SIZE,
                                  .flags = VFIO_REGION_INFO_FLAG_READ |
                                           VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP,
                                  .mmap_fd = rig.fake.bar_fd,
                                  .nr_sparse = 2,
                                  .sparse = { { 0, 0x1000 }, { 0x2000, 0x2000 } } };
    if (rig_small_bar) {
        rig.fake.regs_fd = vn_peerfd_memfd_new("bar1", 4096);
        rig.fake.regs = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rig.fake.regs_fd, 0);
        ck_assert(rig.fake.regs != MAP_FAILED);
        info.regions[1] =
            (VnRegion){ .size = SMALL_BAR_SIZE,
                        .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE |
                                 VFIO_REGION_INFO_FLAG_MMAP,
                        .mmap_fd = rig.fake.regs_fd };
    }
    if (rig_odd_bar) {
        info.regions[VFIO_PCI_BAR2_REGION_INDEX] =
            (VnRegion){ .size = ODD_BAR_SIZE,
                        .mmap_fd = -1,
                        .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE };
    }
    info.regions[VFIO_PCI_CONFIG_REGION_INDEX] =
        (VnRegion){ .size = CFG_SIZE,
                    .mmap_fd = -1,
                    .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE };
    info.regions[VFIO_PCI_ROM_REGION_INDEX] =
        (VnRegion){ .size = ROM_SIZE, .mmap_fd = -1, .flags = VFIO_REGION_INFO_FLAG_READ };
    /* An option ROM's signature, then a pattern (what QEMU shows a guest). */
    rig.fake.rom[0] = 0x55;
    rig.fake.rom[1] = 0xaa;
    for (uint32_t i = 2; i < ROM_SIZE; i++) {
        rig.fake.rom[i] = (uint8_t)(i * 7);
    }
    info.irq_count[VFIO_PCI_INTX_IRQ_INDEX] = 1;
    info.irq_flags[VFIO_PCI_INTX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
    info.irq_count[VFIO_PCI_MSIX_IRQ_INDEX] = MSIX_VECTORS;
    info.irq_flags[VFIO_PCI_MSIX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;

    rig.dev.ctx = g_main_context_new();
    rig.info = info;
    rig.server = vn_server_new(rig.sock, &info, &fake_ops, &rig.fake, rig.dev.ctx, &error);
    ck_assert_msg(rig.server != NULL, "%s", error ? error->message : "");
    loop_start(&rig.dev, "device");

    rig.lend.ctx = g_main_context_new();
    rig.lfab = node_open("lender", &lender_handlers, NULL, rig.lend.ctx);
    rig.lender = vn_lender_new(rig.lfab, DEV, rig_backend, rig.sock, &error);
    ck_assert_msg(rig.lender != NULL, "%s", error ? error->message : "");
    loop_start(&rig.lend, "lender");

    rig.ctx = g_main_context_new();
    /* The lender dials its device server at once and keeps the connection: every test
     * starts once it has. */
    ck_assert(lender_server_wait(true, 5000));
}

static inline void lender_close(void *data)
{
    g_clear_pointer(&rig.lender, vn_lender_free);
    g_clear_pointer(&rig.lfab, vn_fabric_close);
}

static inline void teardown(void)
{
    borrower_close(0);
    borrower_close(1);
    on_loop(&rig.lend, lender_close, NULL);
    loop_stop(&rig.lend);
    loop_stop(&rig.dev);
    vn_server_free(rig.server);
    while (g_main_context_iteration(rig.ctx, FALSE)) {
    }
    g_main_context_unref(rig.ctx);
    munmap(rig.fake.bar, BAR0_SIZE);
    close(rig.fake.bar_fd);
    if (rig.fake.regs != NULL) {
        munmap(rig.fake.regs, 4096);
        close(rig.fake.regs_fd);
    }
    /* Nothing left behind: the directories are empty, no fd is open. */
    ck_assert_int_eq(g_rmdir(rig.fabric_dir), 0);
    ck_assert_int_eq(g_rmdir(rig.dir), 0);
    g_free(rig.sock);
    g_free(rig.fabric_dir);
    g_free(rig.dir);
    ck_assert_int_eq(count_fds(), rig.fds_before);
}

/* ---- looking at the lender and the device ------------------------------- */

typedef struct Snap {
    VnLenderStats st;
    char borrower[VN_MAX_NODE_NAME + 1]; /* "" when free */
    char *json;
} Snap;

static inline void snap_fn(void *data)
{
    Snap *s = data;
    const char *b = vn_lender_borrower(rig.lender);

    vn_lender_stats(rig.lender, &s->st);
    g_strlcpy(s->borrower, b != NULL ? b : "", sizeof(s->borrower));
    s->json = vn_lender_stats_json(rig.lender);
}

static inline Snap snap(void)
{
    Snap s = { 0 };

    on_loop(&rig.lend, snap_fn, &s);
    return s;
}

static inline void snap_clear(Snap *s)
{
    g_clear_pointer(&s->json, g_free);
}

static inline void server_stats_fn(void *data)
{
    vn_server_stats(rig.server, data);
}

static inline VnServerStats device_stats(void)
{
    VnServerStats st;

    on_loop(&rig.dev, server_stats_fn, &st);
    return st;
}

static inline uint64_t device_messages(void)
{
    return device_stats().messages;
}

static inline unsigned device_dma_count(void)
{
    return vn_dma_count(vn_server_dma(rig.server));
}

static inline bool device_irqs_any(void)
{
    VnIrqs *irqs = vn_server_irqs(rig.server);

    for (uint32_t v = 0; v < MSIX_VECTORS; v++) {
        if (vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, v)) {
            return true;
        }
    }
    return vn_irqs_enabled(irqs, VFIO_PCI_INTX_IRQ_INDEX, 0);
}

static inline bool lender_free_and_clean(void)
{
    Snap s = snap();
    bool ok = s.borrower[0] == '\0' && s.st.windows == 0;

    snap_clear(&s);
    return ok && device_dma_count() == 0 && !device_irqs_any();
}

/* ---- speaking the protocol ---------------------------------------------- */

static inline int req(Borrower *b, uint32_t type, const char *json, const void *data, size_t len,
                      VnFabricMsg **reply)
{
    return fw_request(b->fab, "lender", type, json, data, len, reply);
}

/* The asynchronous form, for the error message of a refusal. */
typedef struct Answer {
    bool done;
    int err;
    char *json;
} Answer;

static inline void on_answer(void *opaque, VnFabricMsg *reply, int err)
{
    Answer *a = opaque;

    a->done = true;
    a->err = err;
    a->json = reply != NULL ? g_strdup(reply->json) : NULL;
}

static inline int req_msg(Borrower *b, uint32_t type, const char *json, const void *data,
                          size_t len, char **message)
{
    Answer a = { 0 };

    ck_assert_int_eq(vn_fabric_request(b->fab, "lender", type, json, data, len, on_answer, &a), 0);
    WAIT_FOR(a.done);
    *message = a.json;
    return a.err;
}

static inline char *attach_json(VnIrqMode mode)
{
    VnProtoAttach a = { .irq_mode = mode };

    g_strlcpy(a.device, DEV, sizeof(a.device));
    return vn_proto_attach_to_json(&a);
}

static inline void attach_ok(Borrower *b, VnIrqMode mode, VnProtoDevice *d)
{
    g_autoptr(VnFabricMsg) reply = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *json = attach_json(mode);
    VnProtoDevice local;

    ck_assert_int_eq(req(b, VN_PROTO_ATTACH, json, NULL, 0, &reply), 0);
    ck_assert_msg(vn_proto_device_from_json(reply->json, d ? d : &local, &error), "%s",
                  error ? error->message : "");
}

static inline int region_rw(Borrower *b, uint32_t region, uint64_t offset, void *buf,
                            uint32_t count, bool write)
{
    VnProtoRegionRw r = { .region = region, .offset = offset, .count = count, .write = write };
    g_autofree char *json = vn_proto_region_rw_to_json(DEV, &r);
    g_autoptr(VnFabricMsg) reply = NULL;
    int ret;

    ret = req(b, VN_PROTO_REGION_RW, json, write ? buf : NULL, write ? count : 0, &reply);
    if (ret == 0 && !write) {
        ck_assert_uint_eq(reply->data_len, count);
        memcpy(buf, reply->data, count);
    }
    return ret;
}

static inline int dma_map(Borrower *b, uint64_t iova, uint64_t size, uint64_t segment,
                          uint64_t offset)
{
    VnProtoDmaMap m = { .iova = iova,
                        .size = size,
                        .segment = segment,
                        .offset = offset,
                        .prot = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE };
    g_autofree char *json = vn_proto_dma_map_to_json(DEV, &m);

    return req(b, VN_PROTO_DMA_MAP, json, NULL, 0, NULL);
}

static inline int dma_unmap(Borrower *b, uint64_t iova, uint64_t size, bool all)
{
    VnProtoDmaUnmap u = { .iova = iova, .size = size, .all = all };
    g_autofree char *json = vn_proto_dma_unmap_to_json(DEV, &u);

    return req(b, VN_PROTO_DMA_UNMAP, json, NULL, 0, NULL);
}

static inline int set_irqs(Borrower *b, uint32_t flags, uint32_t index, uint32_t start,
                           uint32_t count, bool relay, const void *bools, const int *fds,
                           unsigned nfds)
{
    VnProtoSetIrqs s = {
        .flags = flags, .index = index, .start = start, .count = count, .relay = relay
    };
    g_autofree char *json = vn_proto_set_irqs_to_json(DEV, &s);
    uint64_t routes[VN_MAX_MSG_FDS];

    /* As the borrower does: each eventfd becomes an interrupt route. */
    ck_assert_uint_le(nfds, VN_MAX_MSG_FDS);
    for (unsigned i = 0; i < nfds; i++) {
        routes[i] = GUINT64_TO_LE(vn_fabric_route_export(b->fab, fds[i], "lender", NULL));
        ck_assert_uint_ne(routes[i], 0);
    }
    if (nfds > 0) {
        int ret = req(b, VN_PROTO_SET_IRQS, json, routes, nfds * sizeof(routes[0]), NULL);

        /* Refused: the routes go again (granted ones stay, as the
         * borrower's do). */
        for (unsigned i = 0; ret < 0 && i < nfds; i++) {
            vn_fabric_route_unexport(b->fab, GUINT64_FROM_LE(routes[i]));
        }
        return ret;
    }
    return req(b, VN_PROTO_SET_IRQS, json, bools, bools != NULL ? count : 0, NULL);
}

/* A relayed DATA_EVENTFD|TRIGGER of [start, start + count): the lender rings
 * bits from @doorbell on. */
static inline int relay_irqs(Borrower *b, uint32_t index, uint32_t start, uint32_t count,
                             uint32_t doorbell)
{
    VnProtoSetIrqs s = { .flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                         .index = index,
                         .start = start,
                         .count = count,
                         .relay = true,
                         .doorbell = doorbell };
    g_autofree char *json = vn_proto_set_irqs_to_json(DEV, &s);

    return req(b, VN_PROTO_SET_IRQS, json, NULL, 0, NULL);
}

static inline int simple(Borrower *b, uint32_t type)
{
    g_autofree char *json = vn_proto_device_only_to_json(DEV);

    return req(b, type, json, NULL, 0, NULL);
}

/* A memfd of the borrower's, mapped, exported to the lender. */
typedef struct Mem {
    int fd;
    uint8_t *map;
    uint64_t segment;
} Mem;

static inline Mem mem_export(Borrower *b, const char *to)
{
    g_autoptr(GError) error = NULL;
    Mem m;

    m.fd = vn_peerfd_memfd_new("guest-ram", MEM_SIZE); /* sealed, as QEMU's */
    ck_assert_int_ge(m.fd, 0);
    m.map = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    ck_assert(m.map != MAP_FAILED);
    m.segment = vn_fabric_segment_export(b->fab, m.fd, MEM_SIZE, to, &error);
    ck_assert_msg(m.segment != 0, "%s", error ? error->message : "");
    return m;
}

static inline void mem_free(Mem *m)
{
    munmap(m->map, MEM_SIZE);
    close(m->fd);
}

static inline bool readable(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };

    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* Wait (bounded) for @fd to become readable, and read its counter. */
static inline uint64_t eventfd_wait(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    uint64_t n = 0;

    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    ck_assert_int_eq(read(fd, &n, sizeof(n)), sizeof(n));
    return n;
}

#endif /* VN_LENDER_RIG_H */
