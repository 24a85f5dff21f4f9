/*
 * Unit tests of the lender (vfio-ntb/lending/lender.c, lender-irq.c).
 *
 * One process, three threads:
 * - the device: a VnServer with a small fake device (BAR0 a mappable
 *   memfd, a config region, INTx and 4 MSI-X vectors) in its own context;
 * - the lender: fabric node "lender" and the VnLender, in its own context
 *   (the lender's vfio-user client blocks, so it cannot share the device's
 *   thread; the borrowers' requests are synchronous, so not theirs either);
 * - the test: borrower nodes "b" and "c" speaking the lending protocol with
 *   vn_fabric_request_sync(), in a context the test iterates.
 * What the device saw is read through its DMA and interrupt tables (which
 * lock); the lender's and the server's state through calls run in their
 * threads (on_loop).
 */
#include "fabric/fabric.h"
#include "lending/lender.h"
#include "lending/proto.h"
#include "vfio-user/server.h"

#include "check-main.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
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
#define MSIX_VECTORS 4u
#define MEM_SIZE 0x10000u        /* a borrower's "guest RAM" segment */

/* ---- the fake device ---------------------------------------------------- */

typedef struct Fake {
    int bar_fd;
    uint8_t *bar;
    uint8_t cfg[CFG_SIZE];
    gint resets;                /* atomic: bumped in the device thread */
    gint irq_changes[VFIO_PCI_NUM_IRQS];    /* SET_IRQS per index, atomic */
} Fake;

static int fake_read(void *opaque, uint32_t index, uint64_t off, void *buf, uint32_t n)
{
    Fake *f = opaque;

    if (index == VFIO_PCI_BAR0_REGION_INDEX) {
        memcpy(buf, f->bar + off, n);
    } else if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        memcpy(buf, f->cfg + off, n);
    } else {
        return -EINVAL;
    }
    return 0;
}

static int fake_write(void *opaque, uint32_t index, uint64_t off, const void *buf,
                      uint32_t n)
{
    Fake *f = opaque;

    if (index == VFIO_PCI_BAR0_REGION_INDEX) {
        memcpy(f->bar + off, buf, n);
    } else if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        memcpy(f->cfg + off, buf, n);
    } else {
        return -EINVAL;
    }
    return 0;
}

static int fake_reset(void *opaque)
{
    g_atomic_int_inc(&((Fake *)opaque)->resets);
    return 0;
}

static void fake_irqs_changed(void *opaque, uint32_t index)
{
    if (index < VFIO_PCI_NUM_IRQS) {
        g_atomic_int_inc(&((Fake *)opaque)->irq_changes[index]);
    }
}

static const VnDeviceOps fake_ops = {
    .region_read = fake_read,
    .region_write = fake_write,
    .reset = fake_reset,
    .irqs_changed = fake_irqs_changed,
};

/* ---- the rig ------------------------------------------------------------ */

typedef struct Loop {
    GMainContext *ctx;
    GMainLoop *loop;
    GThread *thread;
} Loop;

typedef struct Borrower {
    char name[VN_FABRIC_MAX_NAME + 1];
    VnFabric *fab;
    unsigned doorbells[VN_FABRIC_DOORBELLS];    /* rung, per bit (test thread) */
} Borrower;

static struct {
    char *dir;
    char *fabric_dir;
    char *sock;
    Fake fake;
    Loop dev;
    VnServer *server;
    Loop lend;
    VnFabric *lfab;
    VnLender *lender;
    GMainContext *ctx;           /* the borrowers', iterated by the test */
    Borrower *b[2];
    int fds_before;
} rig;

static gint64 now_ms(void)
{
    return g_get_monotonic_time() / 1000;
}

/* Iterate the borrowers' context until @cond holds (bounded by @ms). */
#define WAIT_FOR_MS(cond, ms)                                                  \
    do {                                                                       \
        gint64 end_ = now_ms() + (ms);                                         \
        while (!(cond) && now_ms() < end_) {                                   \
            if (!g_main_context_iteration(rig.ctx, FALSE)) {                   \
                g_usleep(500);                                                 \
            }                                                                  \
        }                                                                      \
        ck_assert_msg((cond), "timed out waiting for: %s", #cond);             \
    } while (0)
#define WAIT_FOR(cond) WAIT_FOR_MS(cond, 3000)

static void spin(int ms)
{
    gint64 end = now_ms() + ms;

    while (now_ms() < end) {
        if (!g_main_context_iteration(rig.ctx, FALSE)) {
            g_usleep(500);
        }
    }
}

static gpointer loop_thread(gpointer data)
{
    Loop *lp = data;

    g_main_context_push_thread_default(lp->ctx);
    g_main_loop_run(lp->loop);
    g_main_context_pop_thread_default(lp->ctx);
    return NULL;
}

static void loop_start(Loop *lp, const char *name)
{
    lp->loop = g_main_loop_new(lp->ctx, FALSE);
    lp->thread = g_thread_new(name, loop_thread, lp);
}

static gboolean quit_cb(gpointer data)
{
    g_main_loop_quit(data);
    return G_SOURCE_REMOVE;
}

static void loop_stop(Loop *lp)
{
    g_main_context_invoke(lp->ctx, quit_cb, lp->loop);
    g_thread_join(lp->thread);
    g_main_loop_unref(lp->loop);
    g_main_context_unref(lp->ctx);
}

/* Run @fn(@data) in @lp's thread and wait for it. */
typedef struct Call {
    void (*fn)(void *data);
    void *data;
    GMutex lock;
    GCond cond;
    bool done;
} Call;

static gboolean call_cb(gpointer p)
{
    Call *c = p;

    c->fn(c->data);
    g_mutex_lock(&c->lock);
    c->done = true;
    g_cond_signal(&c->cond);
    g_mutex_unlock(&c->lock);
    return G_SOURCE_REMOVE;
}

static void on_loop(Loop *lp, void (*fn)(void *data), void *data)
{
    Call c = { .fn = fn, .data = data };

    g_mutex_init(&c.lock);
    g_cond_init(&c.cond);
    g_main_context_invoke(lp->ctx, call_cb, &c);
    g_mutex_lock(&c.lock);
    while (!c.done) {
        g_cond_wait(&c.cond, &c.lock);
    }
    g_mutex_unlock(&c.lock);
    g_mutex_clear(&c.lock);
    g_cond_clear(&c.cond);
}

/* The lender node's handlers: what a daemon would route to its lender. */
static void lender_on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    if (rig.lender == NULL) {
        vn_fabric_reply_error(rig.lfab, token, ENODEV, "no lender");
        return;
    }
    vn_lender_request(rig.lender, msg, token);
}

static void lender_on_link(void *opaque, const char *peer, bool up)
{
    if (!up && rig.lender != NULL) {
        vn_lender_peer_down(rig.lender, peer);
    }
}

static const VnFabricHandlers lender_handlers = {
    .on_request = lender_on_request,
    .on_link = lender_on_link,
};

static void borrower_on_doorbell(void *opaque, const char *peer, uint32_t bit)
{
    ((Borrower *)opaque)->doorbells[bit]++;
}

static const VnFabricHandlers borrower_handlers = {
    .on_doorbell = borrower_on_doorbell,
};

static VnFabric *node_open(const char *name, const VnFabricHandlers *h, void *opaque,
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
static Borrower *borrower(int i)
{
    g_autoptr(GError) error = NULL;
    Borrower *b;

    if (rig.b[i] != NULL) {
        return rig.b[i];
    }
    b = g_new0(Borrower, 1);
    g_strlcpy(b->name, i == 0 ? "b" : "c", sizeof(b->name));
    b->fab = node_open(b->name, &borrower_handlers, b, rig.ctx);
    ck_assert_msg(vn_fabric_connect(b->fab, "lender", &error), "%s",
                  error ? error->message : "");
    rig.b[i] = b;
    return b;
}

static void borrower_close(int i)
{
    if (rig.b[i] != NULL) {
        vn_fabric_close(rig.b[i]->fab);
        g_free(rig.b[i]);
        rig.b[i] = NULL;
    }
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n - 1;       /* the DIR's own */
}

static void setup(void)
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

    rig.fake.bar_fd = memfd_create("bar0", MFD_CLOEXEC);
    ck_assert_int_ge(rig.fake.bar_fd, 0);
    ck_assert_int_eq(ftruncate(rig.fake.bar_fd, BAR0_SIZE), 0);
    rig.fake.bar = mmap(NULL, BAR0_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
                        rig.fake.bar_fd, 0);
    ck_assert(rig.fake.bar != MAP_FAILED);
    for (uint32_t i = 0; i < info.num_regions; i++) {
        info.regions[i].mmap_fd = -1;
    }
    info.regions[0] = (VnRegion){ .size = BAR0_SIZE,
                                  .flags = VFIO_REGION_INFO_FLAG_READ |
                                           VFIO_REGION_INFO_FLAG_WRITE |
                                           VFIO_REGION_INFO_FLAG_MMAP,
                                  .mmap_fd = rig.fake.bar_fd, .nr_sparse = 2,
                                  .sparse = { { 0, 0x1000 }, { 0x2000, 0x2000 } } };
    info.regions[VFIO_PCI_CONFIG_REGION_INDEX] =
        (VnRegion){ .size = CFG_SIZE, .mmap_fd = -1,
                    .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE };
    info.irq_count[VFIO_PCI_INTX_IRQ_INDEX] = 1;
    info.irq_flags[VFIO_PCI_INTX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
    info.irq_count[VFIO_PCI_MSIX_IRQ_INDEX] = MSIX_VECTORS;
    info.irq_flags[VFIO_PCI_MSIX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;

    rig.dev.ctx = g_main_context_new();
    rig.server = vn_server_new(rig.sock, &info, &fake_ops, &rig.fake, rig.dev.ctx, &error);
    ck_assert_msg(rig.server != NULL, "%s", error ? error->message : "");
    loop_start(&rig.dev, "device");

    rig.lend.ctx = g_main_context_new();
    rig.lfab = node_open("lender", &lender_handlers, NULL, rig.lend.ctx);
    rig.lender = vn_lender_new(rig.lfab, DEV, rig.sock, &error);
    ck_assert_msg(rig.lender != NULL, "%s", error ? error->message : "");
    loop_start(&rig.lend, "lender");

    rig.ctx = g_main_context_new();
}

static void lender_close(void *data)
{
    g_clear_pointer(&rig.lender, vn_lender_free);
    g_clear_pointer(&rig.lfab, vn_fabric_close);
}

static void teardown(void)
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
    char borrower[VN_FABRIC_MAX_NAME + 1];     /* "" when free */
    char *json;
} Snap;

static void snap_fn(void *data)
{
    Snap *s = data;
    const char *b = vn_lender_borrower(rig.lender);

    vn_lender_stats(rig.lender, &s->st);
    g_strlcpy(s->borrower, b != NULL ? b : "", sizeof(s->borrower));
    s->json = vn_lender_stats_json(rig.lender);
}

static Snap snap(void)
{
    Snap s = { 0 };

    on_loop(&rig.lend, snap_fn, &s);
    return s;
}

static void snap_clear(Snap *s)
{
    g_clear_pointer(&s->json, g_free);
}

static void server_stats_fn(void *data)
{
    vn_server_stats(rig.server, data);
}

static VnServerStats device_stats(void)
{
    VnServerStats st;

    on_loop(&rig.dev, server_stats_fn, &st);
    return st;
}

static uint64_t device_messages(void)
{
    return device_stats().messages;
}

static unsigned device_dma_count(void)
{
    return vn_dma_count(vn_server_dma(rig.server));
}

static bool device_irqs_any(void)
{
    VnIrqs *irqs = vn_server_irqs(rig.server);

    for (uint32_t v = 0; v < MSIX_VECTORS; v++) {
        if (vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, v)) {
            return true;
        }
    }
    return vn_irqs_enabled(irqs, VFIO_PCI_INTX_IRQ_INDEX, 0);
}

static bool lender_free_and_clean(void)
{
    Snap s = snap();
    bool ok = s.borrower[0] == '\0' && s.st.windows == 0;

    snap_clear(&s);
    return ok && device_dma_count() == 0 && !device_irqs_any();
}

/* ---- speaking the protocol ---------------------------------------------- */

static int req(Borrower *b, uint32_t type, const char *json, const void *data, size_t len,
               const int *fds, unsigned nfds, VnFabricMsg **reply)
{
    return vn_fabric_request_sync(b->fab, "lender", type, json, data, len, fds, nfds, reply);
}

/* The asynchronous form, for the error message of a refusal. */
typedef struct Answer {
    bool done;
    int err;
    char *json;
} Answer;

static void on_answer(void *opaque, VnFabricMsg *reply, int err)
{
    Answer *a = opaque;

    a->done = true;
    a->err = err;
    a->json = reply != NULL ? g_strdup(reply->json) : NULL;
}

static int req_msg(Borrower *b, uint32_t type, const char *json, const void *data,
                   size_t len, const int *fds, unsigned nfds, char **message)
{
    Answer a = { 0 };

    ck_assert_int_eq(vn_fabric_request(b->fab, "lender", type, json, data, len, fds, nfds,
                                       on_answer, &a), 0);
    WAIT_FOR(a.done);
    *message = a.json;
    return a.err;
}

static char *attach_json(VnIrqMode mode)
{
    VnProtoAttach a = { .irq_mode = mode };

    g_strlcpy(a.device, DEV, sizeof(a.device));
    return vn_proto_attach_to_json(&a);
}

static void attach_ok(Borrower *b, VnIrqMode mode, VnProtoDevice *d)
{
    g_autoptr(VnFabricMsg) reply = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *json = attach_json(mode);
    VnProtoDevice local;

    ck_assert_int_eq(req(b, VN_PROTO_ATTACH, json, NULL, 0, NULL, 0, &reply), 0);
    ck_assert_msg(vn_proto_device_from_json(reply->json, d ? d : &local, &error), "%s",
                  error ? error->message : "");
}

static int region_rw(Borrower *b, uint32_t region, uint64_t offset, void *buf, uint32_t count,
                     bool write)
{
    VnProtoRegionRw r = { .region = region, .offset = offset, .count = count, .write = write };
    g_autofree char *json = vn_proto_region_rw_to_json(DEV, &r);
    g_autoptr(VnFabricMsg) reply = NULL;
    int ret;

    ret = req(b, VN_PROTO_REGION_RW, json, write ? buf : NULL, write ? count : 0, NULL, 0,
              &reply);
    if (ret == 0 && !write) {
        ck_assert_uint_eq(reply->data_len, count);
        memcpy(buf, reply->data, count);
    }
    return ret;
}

static int dma_map(Borrower *b, uint64_t iova, uint64_t size, uint64_t segment,
                   uint64_t offset)
{
    VnProtoDmaMap m = { .iova = iova, .size = size, .segment = segment, .offset = offset,
                        .prot = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE };
    g_autofree char *json = vn_proto_dma_map_to_json(DEV, &m);

    return req(b, VN_PROTO_DMA_MAP, json, NULL, 0, NULL, 0, NULL);
}

static int dma_unmap(Borrower *b, uint64_t iova, uint64_t size, bool all)
{
    VnProtoDmaUnmap u = { .iova = iova, .size = size, .all = all };
    g_autofree char *json = vn_proto_dma_unmap_to_json(DEV, &u);

    return req(b, VN_PROTO_DMA_UNMAP, json, NULL, 0, NULL, 0, NULL);
}

static int set_irqs(Borrower *b, uint32_t flags, uint32_t index, uint32_t start,
                    uint32_t count, bool relay, const void *bools, const int *fds,
                    unsigned nfds)
{
    VnProtoSetIrqs s = { .flags = flags, .index = index, .start = start, .count = count,
                         .relay = relay };
    g_autofree char *json = vn_proto_set_irqs_to_json(DEV, &s);

    return req(b, VN_PROTO_SET_IRQS, json, bools, bools != NULL ? count : 0, fds, nfds, NULL);
}

static int simple(Borrower *b, uint32_t type)
{
    g_autofree char *json = vn_proto_device_only_to_json(DEV);

    return req(b, type, json, NULL, 0, NULL, 0, NULL);
}

/* A memfd of the borrower's, mapped, exported to the lender. */
typedef struct Mem {
    int fd;
    uint8_t *map;
    uint64_t segment;
} Mem;

static Mem mem_export(Borrower *b, const char *to)
{
    g_autoptr(GError) error = NULL;
    Mem m;

    m.fd = memfd_create("guest-ram", MFD_CLOEXEC);
    ck_assert_int_ge(m.fd, 0);
    ck_assert_int_eq(ftruncate(m.fd, MEM_SIZE), 0);
    m.map = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    ck_assert(m.map != MAP_FAILED);
    m.segment = vn_fabric_segment_export(b->fab, m.fd, MEM_SIZE, to, &error);
    ck_assert_msg(m.segment != 0, "%s", error ? error->message : "");
    return m;
}

static void mem_free(Mem *m)
{
    munmap(m->map, MEM_SIZE);
    close(m->fd);
}

static bool readable(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };

    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* Wait (bounded) for @fd to become readable, and read its counter. */
static uint64_t eventfd_wait(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    uint64_t n = 0;

    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    ck_assert_int_eq(read(fd, &n, sizeof(n)), sizeof(n));
    return n;
}

/* ---- attach ------------------------------------------------------------- */

START_TEST(test_attach_describes)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonParser) p = json_parser_new();
    VnFabricWindow *w;
    VnProtoDevice d;
    JsonObject *o;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, &d);
    ck_assert(d.flags & VFIO_DEVICE_FLAGS_RESET);
    ck_assert_uint_eq(d.num_regions, VFIO_PCI_NUM_REGIONS);
    ck_assert_uint_eq(d.regions[0].size, BAR0_SIZE);
    ck_assert(d.regions[0].flags & VFIO_REGION_INFO_FLAG_MMAP);
    ck_assert_uint_gt(d.regions[0].segment, 0);
    ck_assert_uint_eq(d.regions[0].nr_sparse, 2);
    ck_assert_uint_eq(d.regions[0].sparse[1].offset, 0x2000);
    ck_assert_uint_eq(d.regions[0].sparse[1].size, 0x2000);
    ck_assert_uint_eq(d.regions[VFIO_PCI_CONFIG_REGION_INDEX].size, CFG_SIZE);
    ck_assert_uint_eq(d.regions[VFIO_PCI_CONFIG_REGION_INDEX].segment, 0);
    ck_assert(!(d.regions[VFIO_PCI_CONFIG_REGION_INDEX].flags & VFIO_REGION_INFO_FLAG_MMAP));
    ck_assert_uint_eq(d.regions[1].size, 0);
    ck_assert_uint_eq(d.num_irqs, VFIO_PCI_NUM_IRQS);
    ck_assert_uint_eq(d.irq_count[VFIO_PCI_MSIX_IRQ_INDEX], MSIX_VECTORS);
    ck_assert_uint_eq(d.irq_flags[VFIO_PCI_MSIX_IRQ_INDEX], VFIO_IRQ_INFO_EVENTFD);

    /* The BAR's segment is the device's BAR memory, both ways. */
    w = vn_fabric_window_map(b->fab, "lender", d.regions[0].segment, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(w->size, BAR0_SIZE);
    w->host[0x2010] = 0xab;
    ck_assert_uint_eq(rig.fake.bar[0x2010], 0xab);
    rig.fake.bar[0x18] = 0x5a;
    ck_assert_uint_eq(w->host[0x18], 0x5a);
    vn_fabric_window_unmap(b->fab, w);
    /* ...and only the borrower may map it. */
    ck_assert_ptr_null(vn_fabric_window_map(c->fab, "lender", d.regions[0].segment, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED));

    s = snap();
    ck_assert_str_eq(s.borrower, "b");
    ck_assert_uint_eq(s.st.requests, 1);
    ck_assert(json_parser_load_from_data(p, s.json, -1, NULL));
    o = json_node_get_object(json_parser_get_root(p));
    ck_assert_str_eq(json_object_get_string_member(o, "device"), DEV);
    ck_assert_str_eq(json_object_get_string_member(o, "borrower"), "b");
    ck_assert_int_eq(json_object_get_int_member(o, "requests"), 1);
    ck_assert_int_eq(json_object_get_int_member(o, "fences"), 0);
    snap_clear(&s);
}
END_TEST

START_TEST(test_attach_busy_detach)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    g_autoptr(GError) error = NULL;
    g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
    g_autofree char *message = NULL;
    g_autoptr(JsonParser) p = json_parser_new();
    VnFabricWindow *w;
    VnProtoDevice d;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, &d);
    /* Held: a second borrower is told by whom. */
    ck_assert_int_eq(req_msg(c, VN_PROTO_ATTACH, json, NULL, 0, NULL, 0, &message), -EBUSY);
    ck_assert_ptr_nonnull(strstr(message, "lent to b"));
    ck_assert_int_eq(simple(c, VN_PROTO_DETACH), -EPERM);
    s = snap();
    ck_assert_str_eq(s.borrower, "b");
    snap_clear(&s);

    /* DETACH frees the device and withdraws the BAR segment. */
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
    s = snap();
    ck_assert_str_eq(s.borrower, "");
    ck_assert_uint_eq(s.st.fences, 1);
    ck_assert(json_parser_load_from_data(p, s.json, -1, NULL));
    ck_assert(json_object_get_null_member(json_node_get_object(json_parser_get_root(p)),
                                          "borrower"));
    snap_clear(&s);
    w = vn_fabric_window_map(b->fab, "lender", d.regions[0].segment, &error);
    ck_assert_ptr_null(w);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND));
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), -EPERM);

    /* Now the other one can. */
    attach_ok(c, VN_IRQ_MODE_FD, NULL);
    s = snap();
    ck_assert_str_eq(s.borrower, "c");
    snap_clear(&s);
}
END_TEST

START_TEST(test_reattach_fresh)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    VnProtoDevice d1, d2;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, &d1);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);
    ck_assert_uint_eq(device_dma_count(), 1);
    attach_ok(b, VN_IRQ_MODE_RELAY, &d2);
    ck_assert_uint_eq(device_dma_count(), 0);
    ck_assert_uint_ne(d1.regions[0].segment, d2.regions[0].segment);
    s = snap();
    ck_assert_str_eq(s.borrower, "b");
    ck_assert_uint_eq(s.st.fences, 1);
    ck_assert_uint_eq(s.st.windows, 0);
    snap_clear(&s);
    mem_free(&m);
}
END_TEST

static void lender_elsewhere_fn(void *data)
{
    g_autofree char *path = g_build_filename(rig.dir, "nobody.sock", NULL);

    vn_lender_free(rig.lender);
    rig.lender = vn_lender_new(rig.lfab, DEV, path, NULL);
}

START_TEST(test_attach_no_device_server)
{
    Borrower *b = borrower(0);
    g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
    g_autofree char *message = NULL;
    Snap s;

    /* A lender whose device server is not there refuses, and stays free. */
    on_loop(&rig.lend, lender_elsewhere_fn, NULL);
    ck_assert_int_eq(req_msg(b, VN_PROTO_ATTACH, json, NULL, 0, NULL, 0, &message), -ENOENT);
    ck_assert_ptr_nonnull(strstr(message, "nobody.sock"));
    s = snap();
    ck_assert_str_eq(s.borrower, "");
    ck_assert_uint_eq(s.st.fences, 0);
    snap_clear(&s);
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), -EPERM);
}
END_TEST

/* ---- region accesses ---------------------------------------------------- */

START_TEST(test_region_rw)
{
    Borrower *b = borrower(0);
    uint32_t v = 0xcafef00d, got = 0;
    uint8_t buf[8];
    g_autofree char *message = NULL;
    VnProtoRegionRw bad = { .region = VFIO_PCI_CONFIG_REGION_INDEX, .offset = CFG_SIZE - 2,
                            .count = 4 };
    g_autofree char *json = vn_proto_region_rw_to_json(DEV, &bad);
    int resets;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0x40, &v, 4, true), 0);
    ck_assert_int_eq(memcmp(rig.fake.cfg + 0x40, &v, 4), 0);
    memcpy(rig.fake.bar + 0x100, "trapped!", 8);
    ck_assert_int_eq(region_rw(b, 0, 0x100, buf, 8, false), 0);
    ck_assert_int_eq(memcmp(buf, "trapped!", 8), 0);
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0x40, &got, 4, false), 0);
    ck_assert_uint_eq(got, v);

    /* The device's own refusal comes back with its errno. */
    ck_assert_int_eq(req_msg(b, VN_PROTO_REGION_RW, json, NULL, 0, NULL, 0, &message),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(message, "on the device"));

    resets = g_atomic_int_get(&rig.fake.resets);
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), 0);
    ck_assert_int_eq(g_atomic_int_get(&rig.fake.resets), resets + 1);

    s = snap();
    ck_assert_uint_eq(s.st.region_rw, 4);
    ck_assert_uint_eq(s.st.config_rw, 3);
    ck_assert_uint_eq(s.st.resets, 1);
    snap_clear(&s);
}
END_TEST

/* ---- DMA ---------------------------------------------------------------- */

START_TEST(test_dma_isolation)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    VnDma *dma = vn_server_dma(rig.server);
    uint8_t buf[8] = { 0 };
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(vn_dma_read(dma, 0x100000, buf, 4), -EFAULT);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);

    /* The device reaches the borrower's memory, both ways. */
    ck_assert_int_eq(vn_dma_write(dma, 0x100008, "hello", 5), 0);
    ck_assert_int_eq(memcmp(m.map + 8, "hello", 5), 0);
    memcpy(m.map + 0x3000, "guest", 5);
    ck_assert_int_eq(vn_dma_read(dma, 0x103000, buf, 5), 0);
    ck_assert_int_eq(memcmp(buf, "guest", 5), 0);

    /* A second mapping into the segment shares its window. */
    ck_assert_int_eq(dma_map(b, 0x200000, 0x1000, m.segment, 0x1000), 0);
    ck_assert_int_eq(vn_dma_write(dma, 0x200010, "two", 3), 0);
    ck_assert_int_eq(memcmp(m.map + 0x1010, "two", 3), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    ck_assert_uint_eq(s.st.dma_maps, 2);
    snap_clear(&s);

    /* When DMA_UNMAP returns, the device can no longer reach it. */
    ck_assert_int_eq(dma_unmap(b, 0x100000, MEM_SIZE, false), 0);
    ck_assert_int_eq(vn_dma_read(dma, 0x100008, buf, 4), -EFAULT);
    ck_assert_int_eq(vn_dma_write(dma, 0x100008, "x", 1), -EFAULT);
    ck_assert_int_eq(vn_dma_read(dma, 0x200010, buf, 3), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    snap_clear(&s);

    ck_assert_int_eq(dma_unmap(b, 0, 0, true), 0);
    ck_assert_int_eq(vn_dma_read(dma, 0x200010, buf, 3), -EFAULT);
    ck_assert_uint_eq(device_dma_count(), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 0);
    ck_assert_uint_eq(s.st.dma_unmaps, 2);
    snap_clear(&s);
    mem_free(&m);
}
END_TEST

START_TEST(test_dma_refused)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    Mem m = mem_export(b, "lender");
    Mem other = mem_export(b, "c");
    g_autofree char *message = NULL;
    VnProtoDmaMap beyond = { .iova = 0x100000, .size = 0x2000, .segment = m.segment,
                             .offset = MEM_SIZE - 0x1000, .prot = VFIO_DMA_MAP_FLAG_READ };
    g_autofree char *json = vn_proto_dma_map_to_json(DEV, &beyond);
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    /* Past the end of the segment: refused, no window kept. */
    ck_assert_int_eq(req_msg(b, VN_PROTO_DMA_MAP, json, NULL, 0, NULL, 0, &message), -EINVAL);
    ck_assert_ptr_nonnull(strstr(message, "outside segment"));
    /* A segment that is not there, or not ours to map. */
    ck_assert_int_eq(dma_map(b, 0x100000, 0x1000, 999, 0), -ENOENT);
    ck_assert_int_eq(dma_map(b, 0x100000, 0x1000, other.segment, 0), -EACCES);
    ck_assert_uint_eq(device_dma_count(), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 0);
    ck_assert_uint_eq(s.st.dma_maps, 0);
    snap_clear(&s);

    /* The device refuses an overlap; the window of the first one stays. */
    ck_assert_int_eq(dma_map(b, 0x100000, 0x2000, m.segment, 0), 0);
    ck_assert_int_eq(dma_map(b, 0x101000, 0x2000, m.segment, 0), -EEXIST);
    ck_assert_int_eq(dma_unmap(b, 0x300000, 0x1000, false), -ENOENT);
    ck_assert_uint_eq(device_dma_count(), 1);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    snap_clear(&s);
    /* A non-borrower cannot unmap it. */
    ck_assert_int_eq(dma_unmap(c, 0, 0, true), -EPERM);
    ck_assert_uint_eq(device_dma_count(), 1);
    mem_free(&m);
    mem_free(&other);
}
END_TEST

/* ---- interrupts --------------------------------------------------------- */

START_TEST(test_irqs_fd)
{
    Borrower *b = borrower(0);
    VnIrqs *irqs = vn_server_irqs(rig.server);
    const uint32_t trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    const uint8_t masked = 1;
    int efd[MSIX_VECTORS];

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    for (unsigned i = 0; i < MSIX_VECTORS; i++) {
        efd[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        ck_assert_int_ge(efd[i], 0);
    }
    ck_assert_int_eq(set_irqs(b, trigger, VFIO_PCI_MSIX_IRQ_INDEX, 0, MSIX_VECTORS, false,
                              NULL, efd, MSIX_VECTORS), 0);
    /* The device signals the VM's eventfd itself. */
    ck_assert(vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 2));
    ck_assert_uint_eq(eventfd_wait(efd[2]), 1);
    ck_assert(!readable(efd[0]) && !readable(efd[1]) && !readable(efd[3]));

    /* DATA_BOOL masks go through as they are. */
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_MASK,
                              VFIO_PCI_MSIX_IRQ_INDEX, 1, 1, false, &masked, NULL, 0), 0);
    ck_assert(!vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 1));
    ck_assert(!readable(efd[1]));
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK,
                              VFIO_PCI_MSIX_IRQ_INDEX, 1, 1, false, NULL, NULL, 0), 0);
    ck_assert_uint_eq(eventfd_wait(efd[1]), 1);

    /* count 0 disables the index. */
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_MSIX_IRQ_INDEX, 0, 0, false, NULL, NULL, 0), 0);
    ck_assert(!device_irqs_any());
    ck_assert(!vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 2));
    for (unsigned i = 0; i < MSIX_VECTORS; i++) {
        close(efd[i]);
    }
}
END_TEST

START_TEST(test_irqs_relay)
{
    Borrower *b = borrower(0);
    VnIrqs *irqs = vn_server_irqs(rig.server);
    const uint32_t trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    g_autofree char *message = NULL;
    VnProtoSetIrqs high = { .flags = trigger, .index = VFIO_PCI_MSIX_IRQ_INDEX,
                            .start = VN_PROTO_RELAY_VECTORS, .count = 1, .relay = true };
    g_autofree char *json = vn_proto_set_irqs_to_json(DEV, &high);
    int efd = eventfd(0, EFD_CLOEXEC);
    int fds_attached;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_RELAY, NULL);
    fds_attached = count_fds();
    ck_assert_int_eq(set_irqs(b, trigger, VFIO_PCI_MSIX_IRQ_INDEX, 0, MSIX_VECTORS, true,
                              NULL, NULL, 0), 0);
    ck_assert_int_eq(set_irqs(b, trigger, VFIO_PCI_INTX_IRQ_INDEX, 0, 1, true, NULL, NULL, 0),
                     0);
    ck_assert(vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    WAIT_FOR(b->doorbells[3] == 1);
    ck_assert(vn_irqs_signal(irqs, VFIO_PCI_INTX_IRQ_INDEX, 0));
    WAIT_FOR(b->doorbells[VN_PROTO_DOORBELL_INTX] == 1);
    ck_assert_uint_eq(b->doorbells[0] + b->doorbells[1] + b->doorbells[2], 0);
    s = snap();
    ck_assert_uint_eq(s.st.relayed_irqs, 2);
    snap_clear(&s);

    /* Beyond the doorbells; fds in relay mode. */
    ck_assert_int_eq(req_msg(b, VN_PROTO_SET_IRQS, json, NULL, 0, NULL, 0, &message),
                     -ENOSPC);
    ck_assert_int_eq(set_irqs(b, trigger, VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, false, NULL, &efd, 1),
                     -EINVAL);

    /* De-assigning stops the relay. */
    ck_assert_int_eq(set_irqs(b, trigger, VFIO_PCI_MSIX_IRQ_INDEX, 0, MSIX_VECTORS, false,
                              NULL, NULL, 0), 0);
    ck_assert(!vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    spin(50);
    ck_assert_uint_eq(b->doorbells[3], 1);
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_INTX_IRQ_INDEX, 0, 0, false, NULL, NULL, 0), 0);
    ck_assert(!device_irqs_any());
    /* ...and the lender's eventfds are gone with it (the device's copies
     * were closed before its reply, the lender's before its own). */
    ck_assert_int_eq(count_fds(), fds_attached);
    close(efd);
}
END_TEST

START_TEST(test_relay_needs_relay_mode)
{
    Borrower *b = borrower(0);

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, true, NULL, NULL, 0), -EINVAL);
    ck_assert(!device_irqs_any());
}
END_TEST

/* ---- fencing ------------------------------------------------------------ */

/* What a fence must have told the device (not merely what its server
 * undoes when the client goes): DMA_UNMAP, SET_IRQS off, RESET. */
typedef struct DeviceMark {
    uint64_t dma_unmaps;
    int msix_changes;
    int resets;
} DeviceMark;

static DeviceMark device_mark(void)
{
    return (DeviceMark){ .dma_unmaps = device_stats().dma_unmaps,
                         .msix_changes =
                             g_atomic_int_get(&rig.fake.irq_changes[VFIO_PCI_MSIX_IRQ_INDEX]),
                         .resets = g_atomic_int_get(&rig.fake.resets) };
}

static void device_was_fenced(const DeviceMark *before)
{
    DeviceMark now = device_mark();

    ck_assert_uint_eq(now.dma_unmaps, before->dma_unmaps + 1);
    ck_assert_int_eq(now.msix_changes, before->msix_changes + 1);
    /* One RESET, one more when the server saw the client go. */
    ck_assert_int_ge(now.resets, before->resets + 1);
}

/* A borrower with DMA and interrupts in place. */
static void busy_borrower(Borrower *b, Mem *m, int *efd)
{
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    *m = mem_export(b, "lender");
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m->segment, 0), 0);
    *efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, false, NULL, efd, 1), 0);
    ck_assert_uint_eq(device_dma_count(), 1);
    ck_assert(device_irqs_any());
}

START_TEST(test_fence_on_link_down)
{
    Borrower *b = borrower(0);
    DeviceMark mark;
    gint64 t0;
    Mem m;
    int efd;
    Snap s;

    busy_borrower(b, &m, &efd);
    mark = device_mark();
    t0 = now_ms();
    borrower_close(0);
    WAIT_FOR_MS(lender_free_and_clean(), 1000);
    ck_assert_int_lt(now_ms() - t0, 1000);
    device_was_fenced(&mark);
    ck_assert(!vn_irqs_signal(vn_server_irqs(rig.server), VFIO_PCI_MSIX_IRQ_INDEX, 0));
    s = snap();
    ck_assert_uint_eq(s.st.fences, 1);
    snap_clear(&s);

    /* A new borrower can attach. */
    attach_ok(borrower(1), VN_IRQ_MODE_FD, NULL);
    close(efd);
    mem_free(&m);
}
END_TEST

START_TEST(test_fence_on_detach)
{
    Borrower *b = borrower(0);
    DeviceMark mark;
    Mem m;
    int efd;

    busy_borrower(b, &m, &efd);
    mark = device_mark();
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
    /* Done before the reply. */
    ck_assert(lender_free_and_clean());
    device_was_fenced(&mark);
    close(efd);
    mem_free(&m);
}
END_TEST

static void lender_free_fn(void *data)
{
    g_clear_pointer(&rig.lender, vn_lender_free);
}

START_TEST(test_fence_on_free)
{
    Borrower *b = borrower(0);
    DeviceMark mark;
    Mem m;
    int efd;

    busy_borrower(b, &m, &efd);
    mark = device_mark();
    on_loop(&rig.lend, lender_free_fn, NULL);
    ck_assert_uint_eq(device_dma_count(), 0);
    ck_assert(!device_irqs_any());
    device_was_fenced(&mark);
    close(efd);
    mem_free(&m);
}
END_TEST

/* ---- untrusted requests ------------------------------------------------- */

#define TRIG "\"flags\":36"      /* DATA_EVENTFD | ACTION_TRIGGER */

/* Each is refused with @err and changes nothing (see test_refused). */
static const struct {
    const char *name;
    bool from_c;                 /* sent by a node that is not the borrower */
    uint32_t type;
    const char *json;
    size_t data_len;
    unsigned nfds;
    int err;
} refused[] = {
    /* The fabric refuses this one before the lender sees it. */
    { "JSON that does not parse", false, VN_PROTO_REGION_RW, "{\"device\":", 0, 0, EINVAL },
    { "no JSON", false, VN_PROTO_REGION_RW, NULL, 0, 0, EINVAL },
    { "no device", false, VN_PROTO_RESET, "{}", 0, 0, EINVAL },
    { "a bad device name", false, VN_PROTO_RESET, "{\"device\":\"../x\"}", 0, 0, EINVAL },
    { "an unknown device", false, VN_PROTO_RESET, "{\"device\":\"sda\"}", 0, 0, ENODEV },
    { "an unknown type", false, 99, "{\"device\":\"" DEV "\"}", 0, 0, ENOTSUP },
    { "REGION_RW from a non-borrower", true, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":0,\"count\":4,\"write\":false}", 0, 0,
      EPERM },
    { "DETACH from a non-borrower", true, VN_PROTO_DETACH, "{\"device\":\"" DEV "\"}", 0, 0,
      EPERM },
    { "DMA_UNMAP from a non-borrower", true, VN_PROTO_DMA_UNMAP,
      "{\"device\":\"" DEV "\",\"iova\":0,\"size\":0,\"all\":true}", 0, 0, EPERM },
    { "a region the device lacks", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":9,\"offset\":0,\"count\":4,\"write\":false}", 0, 0,
      EINVAL },
    { "a region beyond the protocol", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":16,\"offset\":0,\"count\":4,\"write\":false}", 0, 0,
      EINVAL },
    { "a write shorter than its count", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":0,\"count\":4,\"write\":true}", 3, 0,
      EINVAL },
    { "a read with data", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":0,\"count\":4,\"write\":false}", 4, 0,
      EINVAL },
    { "a count above the transfer limit", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":0,\"offset\":0,\"count\":1048577,\"write\":false}",
      0, 0, EINVAL },
    { "a negative offset", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":-1,\"count\":4,\"write\":false}", 0, 0,
      EINVAL },
    { "an fd with REGION_RW", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":0,\"count\":4,\"write\":false}", 0, 1,
      EINVAL },
    { "DMA_MAP of segment 0", false, VN_PROTO_DMA_MAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":4096,\"segment\":0,\"offset\":0,"
      "\"prot\":3}", 0, 0, EINVAL },
    { "an empty DMA_MAP", false, VN_PROTO_DMA_MAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":0,\"segment\":1,\"offset\":0,"
      "\"prot\":3}", 0, 0, EINVAL },
    { "DMA_MAP with unknown prot bits", false, VN_PROTO_DMA_MAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":4096,\"segment\":1,\"offset\":0,"
      "\"prot\":4}", 0, 0, EINVAL },
    { "an empty DMA_UNMAP", false, VN_PROTO_DMA_UNMAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":0,\"all\":false}", 0, 0, EINVAL },
    { "SET_IRQS with two data types", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\",\"flags\":35,\"index\":2,\"start\":0,\"count\":1,"
      "\"relay\":false}", 0, 0, EINVAL },
    { "SET_IRQS with fewer fds than vectors", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":2,\"start\":0,\"count\":2,"
      "\"relay\":false}", 0, 1, EINVAL },
    { "SET_IRQS with fds and no DATA_EVENTFD", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\",\"flags\":33,\"index\":2,\"start\":0,\"count\":1,"
      "\"relay\":false}", 0, 1, EINVAL },
    { "SET_IRQS DATA_BOOL of the wrong length", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\",\"flags\":10,\"index\":2,\"start\":0,\"count\":2,"
      "\"relay\":false}", 1, 0, EINVAL },
    { "SET_IRQS of an index the device lacks", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":7,\"start\":0,\"count\":1,"
      "\"relay\":false}", 0, 1, EINVAL },
    { "SET_IRQS relay in fd mode", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":2,\"start\":0,\"count\":1,"
      "\"relay\":true}", 0, 0, EINVAL },
    { "ATTACH with an unknown irq_mode", true, VN_PROTO_ATTACH,
      "{\"device\":\"" DEV "\",\"irq_mode\":\"carrier-pigeon\"}", 0, 0, EINVAL },
    { "RESET with data", false, VN_PROTO_RESET, "{\"device\":\"" DEV "\"}", 8, 0, EINVAL },
};

/* True once every copy of a pipe's write end is closed. */
static bool pipe_closed(int rd)
{
    struct pollfd p = { .fd = rd, .events = POLLIN };

    return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

START_TEST(test_refused)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    Mem m = mem_export(b, "lender");
    uint8_t data[8] = { 0 };
    uint8_t cfg[CFG_SIZE];
    int fds[2] = { -1, -1 };
    g_autofree char *message = NULL;
    uint64_t messages;
    Snap before, after;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);
    before = snap();
    messages = device_messages();
    memcpy(cfg, rig.fake.cfg, CFG_SIZE);
    ck_assert_int_eq(pipe2(fds, O_CLOEXEC), 0);

    ck_assert_msg(req_msg(refused[_i].from_c ? c : b, refused[_i].type, refused[_i].json,
                          refused[_i].data_len ? data : NULL, refused[_i].data_len, &fds[1],
                          refused[_i].nfds, &message) == -refused[_i].err,
                  "%s: not refused with %s", refused[_i].name, g_strerror(refused[_i].err));
    ck_assert_msg(message != NULL && strlen(message) > 0, "%s: no message", refused[_i].name);

    /* Nothing changed: no device traffic, same state, same counters. */
    after = snap();
    ck_assert_uint_eq(device_messages(), messages);
    ck_assert_str_eq(after.borrower, "b");
    ck_assert_uint_eq(after.st.requests, before.st.requests + (_i == 0 ? 0 : 1));
    after.st.requests = before.st.requests;
    ck_assert_msg(memcmp(&after.st, &before.st, sizeof(before.st)) == 0, "%s: counters",
                  refused[_i].name);
    ck_assert_uint_eq(device_dma_count(), 1);
    ck_assert_int_eq(memcmp(cfg, rig.fake.cfg, CFG_SIZE), 0);
    /* An fd that came with it was closed. */
    close(fds[1]);
    WAIT_FOR(pipe_closed(fds[0]));
    close(fds[0]);
    /* And the borrower is still served. */
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0, data, 4, false), 0);
    snap_clear(&before);
    snap_clear(&after);
    mem_free(&m);
}
END_TEST

START_TEST(test_not_attached)
{
    Borrower *b = borrower(0);
    uint8_t buf[4];

    /* Nothing is lent yet: only ATTACH is heard. */
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0, buf, 4, false), -EPERM);
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), -EPERM);
    ck_assert_int_eq(device_messages(), 0);
}
END_TEST

static Suite *lender_suite(void)
{
    Suite *s = suite_create("lender");
    TCase *tc;

    tc = tcase_create("attach");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_attach_describes);
    tcase_add_test(tc, test_attach_busy_detach);
    tcase_add_test(tc, test_reattach_fresh);
    tcase_add_test(tc, test_attach_no_device_server);
    suite_add_tcase(s, tc);

    tc = tcase_create("region");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_region_rw);
    suite_add_tcase(s, tc);

    tc = tcase_create("dma");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_dma_isolation);
    tcase_add_test(tc, test_dma_refused);
    suite_add_tcase(s, tc);

    tc = tcase_create("irqs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_irqs_fd);
    tcase_add_test(tc, test_irqs_relay);
    tcase_add_test(tc, test_relay_needs_relay_mode);
    suite_add_tcase(s, tc);

    tc = tcase_create("fence");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_fence_on_link_down);
    tcase_add_test(tc, test_fence_on_detach);
    tcase_add_test(tc, test_fence_on_free);
    suite_add_tcase(s, tc);

    tc = tcase_create("untrusted");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_refused, 0, G_N_ELEMENTS(refused));
    tcase_add_test(tc, test_not_attached);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(lender_suite());
}
