/*
 * Unit tests of the vfio-user server engine over a real socket, driven by
 * our client engine (vfio-ntb/vfio-user/server.c, client.c, transport.c).
 */
#include "common/peerfd.h"
#include "common/util.h"
#include "vfio-user/client.h"
#include "vfio-user/server.h"

#include "vfio-user/transport.h"

#include "check-main.h"

#include <check.h>
#include <gio/gio.h>
#include <glib/gstdio.h>
#include <glib-unix.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <linux/vfio.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#define BAR0_SIZE 0x4000u
#define CFG_SIZE 256u

/* A tiny device: BAR0 is a memfd also reachable by message, CONFIG is RAM. */
typedef struct Fake {
    int bar_fd;
    uint8_t *bar;
    uint8_t cfg[CFG_SIZE];
    gint resets; /* written on the server thread: atomic */
    gint irq_changes;
    /* A write of 8 bytes at P2P_TRIGGER (BAR0) asks the client for a DMA read of 8 bytes at
     * P2P_READ (kept with its result here), then a posted write of P2P_POSTED at P2P_WRITE. */
    GMutex p2p_lock; /* the server thread writes them, the test reads them */
    uint8_t p2p_got[8];
    int p2p_ret;
} Fake;

#define P2P_TRIGGER 0x3ff8u
#define P2P_READ UINT64_C(0xfeed0000)
#define P2P_WRITE UINT64_C(0xfeed1000)
#define P2P_POSTED "posted!!"

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

static VnServer *rig_server(void);

static int fake_write(void *opaque, uint32_t index, uint64_t off, const void *buf, uint32_t n)
{
    Fake *f = opaque;

    if (index == VFIO_PCI_BAR0_REGION_INDEX && off == P2P_TRIGGER && n == 8) {
        uint8_t got[8] = { 0 };
        int ret = vn_server_client_dma(rig_server(), P2P_READ, got, 8, false);

        g_mutex_lock(&f->p2p_lock);
        f->p2p_ret = ret;
        memcpy(f->p2p_got, got, 8);
        g_mutex_unlock(&f->p2p_lock);
        vn_server_client_dma(rig_server(), P2P_WRITE, P2P_POSTED, 8, true);
    }

    if (index == VFIO_PCI_BAR0_REGION_INDEX) {
        memcpy(f->bar + off, buf, n);
    } else if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        memcpy(f->cfg + off, buf, n);
    } else {
        return -EINVAL;
    }
    return 0;
}

/* A reset that takes this long stalls the server past a short client timeout. */
static gint reset_stall_ms;

/* Runs on the server's thread; the test reads the count with g_atomic_int_get(). */
static int fake_reset(void *opaque)
{
    gint ms = g_atomic_int_get(&reset_stall_ms);

    if (ms > 0) {
        g_usleep(ms * 1000ull);
    }
    g_atomic_int_inc(&((Fake *)opaque)->resets);
    return 0;
}

static void fake_irqs_changed(void *opaque, uint32_t index)
{
    g_atomic_int_inc(&((Fake *)opaque)->irq_changes);
}

static const VnDeviceOps fake_ops = {
    .region_read = fake_read,
    .region_write = fake_write,
    .reset = fake_reset,
    .irqs_changed = fake_irqs_changed,
};

/* A device that answers DMA_MAPs, DMA_UNMAPs, BAR0 reads and resets when the test says
 * (vn_server_later()): the reply ids it was given, in order (the server's thread appends,
 * the test reads). */
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER; /* seen by TSan, GMutex not */
static GArray *deferred_ids;

static void owe(void)
{
    uint64_t id = vn_server_later(rig_server());

    if (id == 0) {
        return; /* no command: its client going (the unmapping of everything) */
    }
    pthread_mutex_lock(&deferred_lock);
    g_array_append_val(deferred_ids, id);
    pthread_mutex_unlock(&deferred_lock);
}

/* Set: each DMA_MAP also pauses the server (vn_server_pause), as one whose memory is
 * exported first; the pause's token for the test to resume. */
static gint pausing;
static uint64_t pause_token;

static int deferred_map(void *opaque, const VnDmaMapping *m)
{
    owe();
    if (g_atomic_int_get(&pausing)) {
        pthread_mutex_lock(&deferred_lock);
        pause_token = vn_server_pause(rig_server());
        pthread_mutex_unlock(&deferred_lock);
    }
    return 0;
}

static void deferred_unmap(void *opaque, uint64_t iova, uint64_t size, bool all)
{
    owe();
}

static int deferred_read(void *opaque, uint32_t index, uint64_t off, void *buf, uint32_t n)
{
    if (index != VFIO_PCI_BAR0_REGION_INDEX) {
        return fake_read(opaque, index, off, buf, n);
    }
    owe();
    return -EIO; /* not what the client gets: it waits for vn_server_complete_read() */
}

static int deferred_reset(void *opaque)
{
    owe();
    return 0;
}

static const VnDeviceOps deferred_ops = {
    .region_read = deferred_read,
    .region_write = fake_write,
    .dma_mapped = deferred_map,
    .dma_unmapping = deferred_unmap,
    .reset = deferred_reset,
};

static const VnDeviceOps *rig_ops = &fake_ops; /* what setup() serves */

typedef struct Rig {
    char *dir;
    char *path;
    Fake fake;
    GMainContext *ctx;
    GMainLoop *loop;
    GThread *thread;
    VnServer *server;
    int calls[2]; /* call_on_server()'s pipe */
} Rig;

static Rig rig;

static VnServer *rig_server(void)
{
    return rig.server;
}

static gpointer serve(gpointer data)
{
    g_main_context_push_thread_default(rig.ctx);
    g_main_loop_run(rig.loop);
    g_main_context_pop_thread_default(rig.ctx);
    return NULL;
}

/*
 * A call made on the server's thread, waited for.  Through a pipe, not
 * g_main_context_invoke(): GLib hands an invoked source to the other thread under its own
 * futex lock, which ThreadSanitizer cannot see, and it once reported GLib freeing that
 * source there as a race with our thread's malloc; a pipe's write and read it does see.
 */
typedef struct Call {
    GSourceFunc fn;
    void *data;
    gint done;
} Call;

static gboolean on_call(gint fd, GIOCondition cond, gpointer data)
{
    Call *c;

    if (read(fd, &c, sizeof(c)) == (ssize_t)sizeof(c)) {
        c->fn(c->data);
        g_atomic_int_set(&c->done, 1);
    }
    return G_SOURCE_CONTINUE;
}

static void call_on_server(GSourceFunc fn, void *data)
{
    Call c = { .fn = fn, .data = data };
    Call *p = &c;

    ck_assert_int_eq(write(rig.calls[1], &p, sizeof(p)), (ssize_t)sizeof(p));
    for (int i = 0; i < 20000 && !g_atomic_int_get(&c.done); i++) {
        g_usleep(100);
    }
    ck_assert(g_atomic_int_get(&c.done));
}

static VnDeviceInfo rig_info; /* what setup() serves */

static void setup(void)
{
    VnDeviceInfo info = { .flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
                          .num_regions = VFIO_PCI_NUM_REGIONS,
                          .num_irqs = VFIO_PCI_NUM_IRQS };
    g_autoptr(GError) error = NULL;

    memset(&rig, 0, sizeof(rig));
    rig.dir = g_dir_make_tmp("vn-server-XXXXXX", NULL);
    rig.path = g_build_filename(rig.dir, "dev.sock", NULL);
    rig.fake.bar_fd = vn_peerfd_memfd_new("bar0", BAR0_SIZE);
    ck_assert_int_ge(rig.fake.bar_fd, 0);
    rig.fake.bar = mmap(NULL, BAR0_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, rig.fake.bar_fd, 0);
    for (uint32_t i = 0; i < info.num_regions; i++) {
        info.regions[i].mmap_fd = -1;
    }
    info.regions[0] = (VnRegion){ .size = BAR0_SIZE,
                                  .flags = VFIO_REGION_INFO_FLAG_READ |
                                           VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP,
                                  .mmap_fd = rig.fake.bar_fd,
                                  .nr_sparse = 2,
                                  .sparse = { { 0, 0x1000 }, { 0x2000, 0x2000 } } };
    info.regions[VFIO_PCI_CONFIG_REGION_INDEX] =
        (VnRegion){ .size = CFG_SIZE,
                    .mmap_fd = -1,
                    .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE };
    info.irq_count[VFIO_PCI_INTX_IRQ_INDEX] = 1;
    info.irq_count[VFIO_PCI_MSIX_IRQ_INDEX] = 4;
    info.irq_flags[VFIO_PCI_MSIX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;

    rig_info = info;
    rig.ctx = g_main_context_new();
    rig.loop = g_main_loop_new(rig.ctx, FALSE);
    rig.server = vn_server_new(rig.path, &info, rig_ops, &rig.fake, rig.ctx, &error);
    ck_assert_msg(rig.server != NULL, "%s", error ? error->message : "");
    ck_assert(g_unix_open_pipe(rig.calls, FD_CLOEXEC, NULL));
    {
        GSource *calls = g_unix_fd_source_new(rig.calls[0], G_IO_IN);

        g_source_set_callback(calls, G_SOURCE_FUNC(on_call), NULL, NULL);
        g_source_attach(calls, rig.ctx);
        g_source_unref(calls);
    }
    rig.thread = g_thread_new("server", serve, NULL);
}

static gboolean quit_loop(gpointer data)
{
    g_main_loop_quit(rig.loop);
    return G_SOURCE_REMOVE;
}

static void teardown(void)
{
    call_on_server(quit_loop, NULL);
    g_thread_join(rig.thread);
    vn_server_free(rig.server);
    ck_assert(!g_file_test(rig.path, G_FILE_TEST_EXISTS)); /* socket removed */
    g_main_loop_unref(rig.loop);
    g_main_context_unref(rig.ctx);
    vn_util_close_fds(rig.calls, 2);
    munmap(rig.fake.bar, BAR0_SIZE);
    close(rig.fake.bar_fd);
    g_rmdir(rig.dir);
    g_free(rig.path);
    g_free(rig.dir);
}

static VnClient *connect_ok(void)
{
    g_autoptr(GError) error = NULL;
    VnClient *c = vn_client_connect(rig.path, 2000, &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    return c;
}

/* vn_server_has_client() asked on the server's own thread, as its callers do. */
static gboolean ask_has_client(gpointer data)
{
    g_atomic_int_set((gint *)data, vn_server_has_client(rig.server) ? 1 : 0);
    return G_SOURCE_REMOVE;
}

static bool server_has_client(void)
{
    gint answer = -1;

    call_on_server(ask_has_client, &answer);
    ck_assert_int_ge(g_atomic_int_get(&answer), 0);
    return g_atomic_int_get(&answer) == 1;
}

/* Wait (bounded, 5 s) until the server has dropped its client.  One observation decides:
 * asked twice, the second answer may already be a client from the backlog (accepted the
 * moment the first went), which is not the client this waits for. */
static void wait_no_client(void)
{
    bool has = server_has_client();

    for (int i = 0; i < 1000 && has; i++) {
        g_usleep(5000);
        has = server_has_client();
    }
    ck_assert(!has);
}

START_TEST(test_info_and_regions)
{
    g_autoptr(VnClient) c = connect_ok();
    VnWireDeviceInfo di;
    struct vfio_region_info ri;
    struct vfio_region_sparse_mmap_area areas[4];
    uint32_t nr = 0;
    int fd = -1;
    uint8_t *map;
    uint32_t val = 0;

    ck_assert_int_eq(vn_client_get_info(c, &di), 0);
    ck_assert_uint_eq(di.num_regions, VFIO_PCI_NUM_REGIONS);
    ck_assert_uint_eq(di.num_irqs, VFIO_PCI_NUM_IRQS);
    ck_assert(di.flags & VFIO_DEVICE_FLAGS_RESET);

    ck_assert_int_eq(vn_client_get_region_info(c, 0, &ri, &fd, areas, 4, &nr), 0);
    ck_assert_uint_eq(ri.size, BAR0_SIZE);
    ck_assert(ri.flags & VFIO_REGION_INFO_FLAG_MMAP);
    ck_assert(ri.flags & VFIO_REGION_INFO_FLAG_CAPS);
    ck_assert_uint_eq(ri.argsz, 32 + 16 + 2 * 16);
    ck_assert_uint_eq(nr, 2);
    ck_assert_uint_eq(areas[1].offset, 0x2000);
    ck_assert_uint_eq(areas[1].size, 0x2000);
    ck_assert_int_ge(fd, 0);

    /* The fd is the BAR: a store through it is what a message read sees. */
    map = mmap(NULL, BAR0_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(map != MAP_FAILED);
    memcpy(map + 0x2004, "\x78\x56\x34\x12", 4);
    ck_assert_int_eq(vn_client_region_read(c, 0, 0x2004, &val, 4), 4);
    ck_assert_uint_eq(val, 0x12345678);
    munmap(map, BAR0_SIZE);
    close(fd);

    /* The config region has no fd and no caps. */
    ck_assert_int_eq(
        vn_client_get_region_info(c, VFIO_PCI_CONFIG_REGION_INDEX, &ri, &fd, areas, 4, &nr), 0);
    ck_assert_int_eq(fd, -1);
    ck_assert(!(ri.flags & VFIO_REGION_INFO_FLAG_MMAP));
    ck_assert_uint_eq(ri.size, CFG_SIZE);
}
END_TEST

START_TEST(test_region_errors)
{
    g_autoptr(VnClient) c = connect_ok();
    uint8_t buf[8] = { 0 };
    struct vfio_region_info ri;
    int fd;

    ck_assert_int_eq(vn_client_region_read(c, 12, 0, buf, 4), -EINVAL); /* no region */
    ck_assert_int_eq(vn_client_region_read(c, 1, 0, buf, 4), -EINVAL);  /* size 0 */
    ck_assert_int_eq(vn_client_region_read(c, 0, BAR0_SIZE - 2, buf, 4), -EINVAL);
    ck_assert_int_eq(
        vn_client_region_write(c, VFIO_PCI_CONFIG_REGION_INDEX, CFG_SIZE, buf, 1, false), -EINVAL);
    ck_assert_int_eq(vn_client_get_region_info(c, 99, &ri, &fd, NULL, 0, NULL), -EINVAL);
    /* and the session goes on */
    ck_assert_int_eq(vn_client_region_read(c, 0, 0, buf, 4), 4);
}
END_TEST

START_TEST(test_posted_writes_keep_order)
{
    g_autoptr(VnClient) c = connect_ok();
    uint32_t v, got = 0;

    /* Posted writes get no reply; a read after them sees the last one. */
    for (v = 1; v <= 100; v++) {
        ck_assert_int_eq(vn_client_region_write(c, VFIO_PCI_CONFIG_REGION_INDEX, 0x40, &v, 4, true),
                         4);
    }
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, 0x40, &got, 4), 4);
    ck_assert_uint_eq(got, 100);
}
END_TEST

START_TEST(test_dma_table)
{
    g_autoptr(VnClient) c = connect_ok();
    VnDma *dma = vn_server_dma(rig.server);
    int mem = vn_peerfd_memfd_new("guest", 0x10000); /* sealed, as QEMU's */
    uint8_t *ram;
    char out[6] = { 0 };

    ram = mmap(NULL, 0x10000, PROT_READ | PROT_WRITE, MAP_SHARED, mem, 0);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x8000, 0x8000,
                                       VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, mem),
                     0);
    ck_assert_uint_eq(vn_dma_count(dma), 1);
    /* the device reaches guest memory at iova, through the fd's offset */
    ck_assert_int_eq(vn_dma_write(dma, 0x100010, "hello", 5), 0);
    ck_assert_mem_eq(ram + 0x8010, "hello", 5);
    ck_assert_int_eq(vn_dma_read(dma, 0x100010, out, 5), 0);
    ck_assert_str_eq(out, "hello");
    /* outside the mapping: refused, not a stray access */
    ck_assert_int_eq(vn_dma_read(dma, 0x108000 - 2, out, 4), -EFAULT);
    ck_assert_int_eq(vn_dma_write(dma, 0x200000, "x", 1), -EFAULT);

    /* overlapping map refused; a map without fd is recorded, not reachable */
    ck_assert_int_eq(vn_client_dma_map(c, 0x104000, 0x8000, 0, 3, mem), -EEXIST);
    ck_assert_int_eq(vn_client_dma_map(c, 0x40000000, 0x1000, 0, 3, -1), 0);
    ck_assert_int_eq(vn_dma_read(dma, 0x40000000, out, 1), -EFAULT);
    /* read-only mapping cannot be written by the device */
    ck_assert_int_eq(vn_client_dma_map(c, 0x300000, 0x1000, 0, VFIO_DMA_MAP_FLAG_READ, mem), 0);
    ck_assert_int_eq(vn_dma_write(dma, 0x300000, "x", 1), -EFAULT);
    ck_assert_int_eq(vn_dma_read(dma, 0x300000, out, 1), 0);

    /* unmap: a range with nothing mapped (type1: 0 bytes, no error), a range that splits a
     * mapping, exact, all */
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x500000, 0x1000, false), 0);
    ck_assert_uint_eq(vn_dma_count(dma), 3);
    /* QEMU unmaps a 64-bit IOMMU space in two halves, the second ending at 2^64. */
    ck_assert_int_eq(vn_client_dma_map(c, UINT64_C(1) << 63, 0x1000, 0, 3, mem), 0);
    ck_assert_int_eq(vn_client_dma_unmap(c, UINT64_C(1) << 63, UINT64_C(1) << 63, false), 0);
    ck_assert_uint_eq(vn_dma_count(dma), 3);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x1000, false), -EINVAL);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x8000, false), 0);
    ck_assert_int_eq(vn_dma_read(dma, 0x100010, out, 1), -EFAULT);
    ck_assert_uint_eq(vn_dma_count(dma), 2);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0, 0, true), 0);
    ck_assert_uint_eq(vn_dma_count(dma), 0);

    /* a disconnect drops every mapping */
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x8000, 0, 3, mem), 0);
    vn_client_free(g_steal_pointer(&c));
    wait_no_client();
    ck_assert_uint_eq(vn_dma_count(dma), 0);
    munmap(ram, 0x10000);
    close(mem);
}
END_TEST

/* Guest memory a client may not map: a memfd not sealed against shrinking
 * (it could shrink under the device), a plain file (it could be truncated),
 * a sealed memfd smaller than offset + size, something that is no file. */
enum { BAD_MEM_UNSEALED, BAD_MEM_FILE, BAD_MEM_SHORT, BAD_MEM_OFFSET, BAD_MEM_PIPE, BAD_MEM_LAST };

static int bad_memory(int kind, int *keep)
{
    g_autofree char *path = NULL;
    int fd, p[2];

    *keep = -1;
    switch (kind) {
    case BAD_MEM_UNSEALED:
        fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        ck_assert_int_eq(ftruncate(fd, 0x10000), 0);
        return fd;
    case BAD_MEM_FILE:
        path = g_build_filename(rig.dir, "ram", NULL);
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        ck_assert_int_eq(ftruncate(fd, 0x10000), 0);
        unlink(path);
        return fd;
    case BAD_MEM_SHORT:
        return vn_peerfd_memfd_new("short", 0x4000);
    case BAD_MEM_OFFSET:
        return vn_peerfd_memfd_new("offset", 0x10000);
    default:
        ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
        *keep = p[1];
        return p[0];
    }
}

START_TEST(test_dma_map_refuses_bad_memory)
{
    g_autoptr(VnClient) c = connect_ok();
    VnDma *dma = vn_server_dma(rig.server);
    int keep;
    int fd = bad_memory(_i, &keep);
    /* 0x8000 bytes: beyond a 0x4000 memfd; at 0xc000, beyond a 0x10000 one */
    uint64_t offset = _i == BAD_MEM_OFFSET ? 0xc000 : 0;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x8000, offset,
                                       VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, fd),
                     -EINVAL);
    ck_assert_uint_eq(vn_dma_count(dma), 0);
    close(fd);
    if (keep >= 0) {
        close(keep);
    }
    /* The session goes on, and a sealed memfd that holds the range maps. */
    fd = vn_peerfd_memfd_new("good", 0x8000);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x8000, 0, VFIO_DMA_MAP_FLAG_READ, fd), 0);
    ck_assert_uint_eq(vn_dma_count(dma), 1);
    close(fd);
}
END_TEST

static uint64_t drain(int efd)
{
    uint64_t n = 0;

    if (read(efd, &n, sizeof(n)) != sizeof(n)) {
        return 0;
    }
    return n;
}

START_TEST(test_irqs)
{
    g_autoptr(VnClient) c = connect_ok();
    VnIrqs *irqs = vn_server_irqs(rig.server);
    int efd[2] = { eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) };
    const uint32_t EV = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    const uint32_t NONE_TRIG = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    uint8_t bools[2] = { 0, 1 };

    /* assign vectors 2 and 3 */
    ck_assert_int_eq(vn_client_set_irqs(c, EV, VFIO_PCI_MSIX_IRQ_INDEX, 2, 2, NULL, efd), 0);
    ck_assert(vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    ck_assert(!vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 0));
    ck_assert(vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    ck_assert_uint_eq(drain(efd[1]), 1);
    /* loopback trigger (DATA_NONE) and DATA_BOOL */
    ck_assert_int_eq(vn_client_set_irqs(c, NONE_TRIG, VFIO_PCI_MSIX_IRQ_INDEX, 2, 1, NULL, NULL),
                     0);
    ck_assert_uint_eq(drain(efd[0]), 1);
    ck_assert_int_eq(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_TRIGGER,
                                        VFIO_PCI_MSIX_IRQ_INDEX, 2, 2, bools, NULL),
                     0);
    ck_assert_uint_eq(drain(efd[0]), 0);
    ck_assert_uint_eq(drain(efd[1]), 1);
    /* masked: held pending, delivered on unmask */
    ck_assert_int_eq(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_MASK,
                                        VFIO_PCI_MSIX_IRQ_INDEX, 3, 1, NULL, NULL),
                     0);
    ck_assert(!vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    ck_assert_uint_eq(drain(efd[1]), 0);
    ck_assert_int_eq(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK,
                                        VFIO_PCI_MSIX_IRQ_INDEX, 3, 1, NULL, NULL),
                     0);
    ck_assert_uint_eq(drain(efd[1]), 1);
    /* de-assign one vector (no fds), then disable the index (count 0) */
    ck_assert_int_eq(vn_client_set_irqs(c, EV, VFIO_PCI_MSIX_IRQ_INDEX, 3, 1, NULL, NULL), 0);
    ck_assert(!vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    ck_assert(vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 2));
    ck_assert_int_eq(vn_client_set_irqs(c, NONE_TRIG, VFIO_PCI_MSIX_IRQ_INDEX, 0, 0, NULL, NULL),
                     0);
    ck_assert(!vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 2));
    /* out of range for the device, unsupported unmask-eventfd */
    ck_assert_int_eq(vn_client_set_irqs(c, EV, VFIO_PCI_MSIX_IRQ_INDEX, 3, 2, NULL, efd), -EINVAL);
    ck_assert_int_eq(vn_client_set_irqs(c, EV, 7, 0, 1, NULL, efd), -EINVAL);
    ck_assert_int_eq(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_UNMASK,
                                        VFIO_PCI_INTX_IRQ_INDEX, 0, 1, NULL, efd),
                     -ENOTSUP);
    close(efd[0]);
    close(efd[1]);
}
END_TEST

/* fds a client may not pass as interrupt eventfds: each could block the
 * engine thread that signals it (a pipe nobody reads, a socket) or is no
 * counter at all. */
enum { NOT_EVENTFD_PIPE, NOT_EVENTFD_SOCKET, NOT_EVENTFD_MEMFD, NOT_EVENTFD_LAST };

static int not_an_eventfd(int kind, int *keep)
{
    int p[2];

    switch (kind) {
    case NOT_EVENTFD_PIPE:
        ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
        *keep = p[0];
        return p[1];
    case NOT_EVENTFD_SOCKET:
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
        *keep = p[0];
        return p[1];
    default:
        *keep = -1;
        return vn_peerfd_memfd_new("not-an-eventfd", 4096);
    }
}

START_TEST(test_set_irqs_refuses_non_eventfds)
{
    g_autoptr(VnClient) c = connect_ok();
    VnIrqs *irqs = vn_server_irqs(rig.server);
    const uint32_t EV = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    int keep = -1;
    int fds[2] = { eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), not_an_eventfd(_i, &keep) };

    ck_assert_int_ge(fds[1], 0);
    /* Refused at SET_IRQS, the good one beside it too: nothing assigned. */
    ck_assert_int_eq(vn_client_set_irqs(c, EV, VFIO_PCI_MSIX_IRQ_INDEX, 0, 2, NULL, fds), -EINVAL);
    ck_assert(!vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 0));
    ck_assert(!vn_irqs_enabled(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 1));
    ck_assert_int_eq(vn_client_set_irqs(c, EV, VFIO_PCI_INTX_IRQ_INDEX, 0, 1, NULL, &fds[1]),
                     -EINVAL);
    ck_assert(!vn_irqs_enabled(irqs, VFIO_PCI_INTX_IRQ_INDEX, 0));
    /* And a real eventfd is still taken. */
    ck_assert_int_eq(vn_client_set_irqs(c, EV, VFIO_PCI_INTX_IRQ_INDEX, 0, 1, NULL, fds), 0);
    ck_assert(vn_irqs_enabled(irqs, VFIO_PCI_INTX_IRQ_INDEX, 0));
    close(fds[0]);
    close(fds[1]);
    if (keep >= 0) {
        close(keep);
    }
}
END_TEST

/* A signal while the engine would block, run off the test's thread so a
 * hang is a failed test (the timeout), not a lost suite. */
typedef struct Signaller {
    VnIrqs *irqs;
    gint done;
    bool written;
} Signaller;

static gpointer signal_once(gpointer data)
{
    Signaller *s = data;

    s->written = vn_irqs_signal(s->irqs, VFIO_PCI_MSIX_IRQ_INDEX, 1);
    g_atomic_int_set(&s->done, 1);
    return NULL;
}

START_TEST(test_saturated_eventfd_does_not_block)
{
    g_autoptr(VnClient) c = connect_ok();
    const uint32_t EV = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    uint64_t most = UINT64_C(0xfffffffffffffffe); /* eventfd(2): the counter's top */
    Signaller sig = { .irqs = vn_server_irqs(rig.server) };
    /* A blocking eventfd: a write to it waits while the counter is full. */
    int efd = eventfd(0, EFD_CLOEXEC);
    GThread *t;

    ck_assert_int_eq(vn_client_set_irqs(c, EV, VFIO_PCI_MSIX_IRQ_INDEX, 1, 1, NULL, &efd), 0);
    /* The client saturates it and never reads. */
    ck_assert_int_eq(write(efd, &most, sizeof(most)), sizeof(most));
    t = g_thread_new("signal", signal_once, &sig);
    for (int i = 0; i < 2000 && !g_atomic_int_get(&sig.done); i++) {
        g_usleep(1000);
    }
    ck_assert_msg(g_atomic_int_get(&sig.done), "the signal blocked on a full eventfd");
    g_thread_join(t);
    ck_assert(!sig.written); /* dropped, not queued */
    /* The server is not wedged: SET_IRQS is answered, and once the client
     * reads its counter, signals flow again. */
    ck_assert_int_eq(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_MASK,
                                        VFIO_PCI_MSIX_IRQ_INDEX, 1, 1, NULL, NULL),
                     0);
    ck_assert_int_eq(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK,
                                        VFIO_PCI_MSIX_IRQ_INDEX, 1, 1, NULL, NULL),
                     0);
    ck_assert_uint_eq(drain(efd), most);
    ck_assert(vn_irqs_signal(sig.irqs, VFIO_PCI_MSIX_IRQ_INDEX, 1));
    ck_assert_uint_eq(drain(efd), 1);
    /* How: the server made it non-blocking (our open file is the same). */
    ck_assert(fcntl(efd, F_GETFL) & O_NONBLOCK);
    close(efd);
}
END_TEST

/* vn_server_region_map() asked on the server's thread, of whatever client is there. */
typedef struct RegionMapCall {
    uint64_t offset;
    gint ret;
} RegionMapCall;

static gboolean call_region_map(gpointer data)
{
    RegionMapCall *c = data;

    g_atomic_int_set(&c->ret,
                     vn_server_region_map(rig.server, VFIO_PCI_BAR0_REGION_INDEX, c->offset, 0x1000,
                                          rig.fake.bar_fd, 0, 0x1000, NULL, NULL));
    return G_SOURCE_REMOVE;
}

static int region_map_now(uint64_t offset)
{
    RegionMapCall c = { .offset = offset, .ret = 1 };

    call_on_server(call_region_map, &c);
    return g_atomic_int_get(&c.ret);
}

/* The server asks a client to map part of a BAR only when the client offered it in VERSION
 * (QEMU's own never does: patch 0008 does); nothing is sent otherwise. */
START_TEST(test_region_map_only_to_a_client_that_offers_it)
{
    ck_assert_int_eq(region_map_now(0), -ENOTCONN);
    {
        g_autoptr(VnClient) c = connect_ok();
        VnWireDeviceInfo di;

        ck_assert_int_eq(region_map_now(0), -EOPNOTSUPP);
        ck_assert_int_eq(vn_client_get_info(c, &di), 0); /* and the session goes on */
    }
}
END_TEST

START_TEST(test_reset)
{
    g_autoptr(VnClient) c = connect_ok();

    ck_assert_int_eq(vn_client_reset(c), 0);
    ck_assert_int_ge(g_atomic_int_get(&rig.fake.resets), 1);
}
END_TEST

/* Send raw bytes; return the reply's errno (0 for success), or -1 if none. */
static int raw_errno(VnClient *c, const void *msg, size_t len, const int *fds, unsigned nfds)
{
    g_autoptr(GByteArray) reply = NULL;
    VnWireHdr hdr;

    if (vn_client_raw(c, msg, len, fds, nfds, &reply) < 0 || reply->len < 16) {
        return -1;
    }
    memcpy(&hdr, reply->data, sizeof(hdr));
    return (hdr.flags & VN_WIRE_FLAG_ERROR) ? (int)hdr.error : 0;
}

/* The next message the server sends us (unasked: its client DMA), or a reply. */
static VnWireHdr next_msg(VnClient *c, GByteArray **msg)
{
    VnWireHdr hdr;

    g_clear_pointer(msg, g_byte_array_unref);
    ck_assert_int_eq(vn_client_raw(c, NULL, 0, NULL, 0, msg), 0);
    ck_assert_uint_ge((*msg)->len, sizeof(hdr));
    memcpy(&hdr, (*msg)->data, sizeof(hdr));
    return hdr;
}

/* A DMA request as vfio-user.rst lays it out: address at 16, count (8 bytes) at 24, a
 * write's data at 32. */
static void check_client_dma(const VnWireHdr *h, const GByteArray *m, uint16_t cmd, uint64_t addr,
                             const char *data)
{
    uint64_t a, count;

    ck_assert_uint_eq(h->cmd, cmd);
    ck_assert_uint_eq(h->flags & VN_WIRE_FLAG_TYPE_MASK, VN_WIRE_FLAG_COMMAND);
    ck_assert_uint_eq(!!(h->flags & VN_WIRE_FLAG_NO_REPLY), cmd == VN_CMD_DMA_WRITE);
    ck_assert_uint_eq(h->size, 32 + (data != NULL ? 8 : 0));
    ck_assert_uint_eq(m->len, h->size);
    memcpy(&a, m->data + 16, 8);
    memcpy(&count, m->data + 24, 8);
    ck_assert_uint_eq(a, addr);
    ck_assert_uint_eq(count, 8);
    if (data != NULL) {
        ck_assert_mem_eq(m->data + 32, data, 8);
    }
}

static void send_trigger(VnClient *c, uint16_t id)
{
    g_autoptr(GByteArray) m = g_byte_array_new();
    VnWireRegionRw rw = { .offset = P2P_TRIGGER, .region = 0, .count = 8 };

    vn_wire_begin(m, id, VN_CMD_REGION_WRITE, 0);
    g_byte_array_append(m, (const guint8 *)&rw, sizeof(rw));
    g_byte_array_append(m, (const guint8 *)"trigger!", 8);
    vn_wire_finish(m);
    ck_assert_int_eq(vn_client_raw(c, m->data, m->len, NULL, 0, NULL), 0);
}

static void send_dma_answer(VnClient *c, uint16_t id, const char *data)
{
    uint8_t m[40] = { 0 };
    VnWireHdr h = {
        .id = id, .cmd = VN_CMD_DMA_READ, .size = sizeof(m), .flags = VN_WIRE_FLAG_REPLY
    };

    memcpy(m, &h, sizeof(h));
    memcpy(m + 32, data, 8);
    ck_assert_int_eq(vn_client_raw(c, m, sizeof(m), NULL, 0, NULL), 0);
}

START_TEST(test_client_dma)
{
    g_autoptr(VnClient) c = connect_ok();
    g_autoptr(GByteArray) m = g_byte_array_new();
    g_autoptr(GByteArray) msg = NULL;
    VnWireRegionRw rw = { .offset = 0, .region = VFIO_PCI_CONFIG_REGION_INDEX, .count = 4 };
    VnWireDeviceInfo di;
    VnWireHdr read_req, h;

    /* The device's op asks us for a read: we send a command of our own before answering;
     * the server holds it and serves it after the op, in order. */
    send_trigger(c, 700);
    read_req = next_msg(c, &msg);
    check_client_dma(&read_req, msg, VN_CMD_DMA_READ, P2P_READ, NULL);
    vn_wire_begin(m, 701, VN_CMD_REGION_READ, 0);
    g_byte_array_append(m, (const guint8 *)&rw, sizeof(rw));
    vn_wire_finish(m);
    ck_assert_int_eq(vn_client_raw(c, m->data, m->len, NULL, 0, NULL), 0);
    send_dma_answer(c, read_req.id, "p2p-data");
    h = next_msg(c, &msg);
    check_client_dma(&h, msg, VN_CMD_DMA_WRITE, P2P_WRITE, P2P_POSTED);
    h = next_msg(c, &msg);
    ck_assert_uint_eq(h.id, 700);
    ck_assert_uint_eq(h.flags, VN_WIRE_FLAG_REPLY);
    h = next_msg(c, &msg);
    ck_assert_uint_eq(h.id, 701);
    ck_assert_uint_eq(h.flags, VN_WIRE_FLAG_REPLY);
    g_mutex_lock(&rig.fake.p2p_lock);
    ck_assert_int_eq(rig.fake.p2p_ret, 0);
    ck_assert_mem_eq(rig.fake.p2p_got, "p2p-data", 8);
    g_mutex_unlock(&rig.fake.p2p_lock);

    /* Unanswered, the read gives up after its timeout (the op goes on); the late answer
     * is dropped and the session goes on. */
    send_trigger(c, 702);
    read_req = next_msg(c, &msg);
    check_client_dma(&read_req, msg, VN_CMD_DMA_READ, P2P_READ, NULL);
    h = next_msg(c, &msg);
    check_client_dma(&h, msg, VN_CMD_DMA_WRITE, P2P_WRITE, P2P_POSTED);
    h = next_msg(c, &msg);
    ck_assert_uint_eq(h.id, 702);
    g_mutex_lock(&rig.fake.p2p_lock);
    ck_assert_int_eq(rig.fake.p2p_ret, -ETIMEDOUT);
    g_mutex_unlock(&rig.fake.p2p_lock);
    send_dma_answer(c, read_req.id, "too-late");
    ck_assert_int_eq(vn_client_get_info(c, &di), 0);
    ck_assert_uint_eq(di.num_regions, VFIO_PCI_NUM_REGIONS);
}
END_TEST

START_TEST(test_malformed_over_socket)
{
    g_autoptr(VnClient) c = connect_ok();
    g_autoptr(GByteArray) m = g_byte_array_new();
    VnWireDeviceInfo di;
    int fds[VN_MAX_MSG_FDS + 1];
    VnWireRegionRw rw = { .offset = 0, .region = 0, .count = VN_MAX_DATA_XFER + 1 };

    /* unknown command: ENOTSUP, session goes on */
    vn_wire_begin(m, 900, 77, 0);
    vn_wire_finish(m);
    ck_assert_int_eq(raw_errno(c, m->data, m->len, NULL, 0), ENOTSUP);
    /* fds where none belong: EINVAL, and the fd is not kept */
    vn_wire_begin(m, 901, VN_CMD_DEVICE_RESET, 0);
    vn_wire_finish(m);
    fds[0] = eventfd(0, EFD_CLOEXEC);
    ck_assert_int_eq(raw_errno(c, m->data, m->len, fds, 1), EINVAL);
    close(fds[0]);
    /* count above max_data_xfer_size */
    vn_wire_begin(m, 902, VN_CMD_REGION_READ, 0);
    g_byte_array_append(m, (const guint8 *)&rw, sizeof(rw));
    vn_wire_finish(m);
    ck_assert_int_eq(raw_errno(c, m->data, m->len, NULL, 0), E2BIG);
    /* too many fds for one message */
    for (unsigned i = 0; i < G_N_ELEMENTS(fds); i++) {
        fds[i] = eventfd(0, EFD_CLOEXEC);
    }
    vn_wire_begin(m, 903, VN_CMD_DEVICE_GET_INFO, 0);
    di = (VnWireDeviceInfo){ .argsz = sizeof(di) };
    g_byte_array_append(m, (const guint8 *)&di, sizeof(di));
    vn_wire_finish(m);
    ck_assert_int_eq(raw_errno(c, m->data, m->len, fds, VN_MAX_MSG_FDS), EINVAL);
    for (unsigned i = 0; i < G_N_ELEMENTS(fds); i++) {
        close(fds[i]);
    }
    ck_assert_int_eq(vn_client_get_info(c, &di), 0);
    ck_assert_uint_eq(di.num_regions, VFIO_PCI_NUM_REGIONS);
}
END_TEST

START_TEST(test_untrusted_stream_disconnects_and_next_client_served)
{
    g_autoptr(VnClient) c = connect_ok();
    g_autoptr(VnClient) c2 = NULL;
    VnWireHdr huge = { .id = 1, .cmd = VN_CMD_REGION_WRITE, .size = 0x7fffffff };
    g_autoptr(GByteArray) reply = NULL;
    VnWireDeviceInfo di;

    /* A size we will not buffer: the stream cannot be resynchronised, so
     * the client is dropped; the server lives on for the next one. */
    ck_assert_int_lt(vn_client_raw(c, &huge, sizeof(huge), NULL, 0, &reply), 0);
    wait_no_client();
    c2 = connect_ok();
    ck_assert_int_eq(vn_client_get_info(c2, &di), 0);
}
END_TEST

START_TEST(test_command_before_version)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    g_autoptr(VnTransport) t = NULL;
    VnWireDeviceInfo di = { .argsz = sizeof(di) };
    g_autoptr(GByteArray) m = g_byte_array_new();
    VnTransportMsg reply = { 0 };
    VnWireHdr hdr;
    int ret = 0;

    g_strlcpy(addr.sun_path, rig.path, sizeof(addr.sun_path));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    t = vn_transport_new(fd);
    /* vfio-user.rst: VERSION comes first; anything else is refused */
    vn_wire_begin(m, 5, VN_CMD_DEVICE_GET_INFO, 0);
    g_byte_array_append(m, (const guint8 *)&di, sizeof(di));
    vn_wire_finish(m);
    ck_assert_int_eq(vn_transport_send(t, m->data, m->len, NULL, 0), 0);
    for (int i = 0; i < 400 && ret == 0; i++) {
        ret = vn_transport_recv(t, &reply);
        if (ret == 0) {
            g_usleep(5000);
        }
    }
    ck_assert_int_eq(ret, 1);
    memcpy(&hdr, reply.data, sizeof(hdr));
    ck_assert_uint_eq(hdr.id, 5);
    ck_assert(hdr.flags & VN_WIRE_FLAG_ERROR);
    ck_assert_uint_eq(hdr.error, EINVAL);
    vn_transport_msg_clear(&reply);
}
END_TEST

START_TEST(test_queued_client_served_after_first_leaves)
{
    g_autoptr(VnClient) c = connect_ok();
    g_autoptr(GError) error = NULL;
    VnClient *c2;
    VnWireDeviceInfo di;

    /* The second connects but is not served while the first holds the
     * device: its VERSION times out. */
    c2 = vn_client_connect(rig.path, 300, &error);
    ck_assert_ptr_null(c2);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT));
    vn_client_free(g_steal_pointer(&c));
    wait_no_client();
    c = connect_ok();
    ck_assert_int_eq(vn_client_get_info(c, &di), 0);
}
END_TEST

typedef struct Heard {
    int timed_out;
    int late;
    uint16_t cmd;
    uint64_t min_late_ms; /* every late answer is at least this late (0: 100) */
} Heard;

static void heard(void *opaque, VnClientEvent ev, uint16_t cmd, uint64_t ms)
{
    Heard *h = opaque;

    if (ev == VN_CLIENT_TIMED_OUT) {
        h->timed_out++;
    } else if (ev == VN_CLIENT_LATE_REPLY) {
        h->late++;
        ck_assert_uint_ge(ms, h->min_late_ms != 0 ? h->min_late_ms : 100);
    }
    h->cmd = cmd;
}

/*
 * A server that stalls past the client's timeout answers later, in order:
 * that late answer is dropped, and the next request gets its own answer,
 * not the one before (which failed every later request with -EPROTO, each
 * getting its predecessor's reply).
 */
START_TEST(test_client_stall_late_reply)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnClient) c = vn_client_connect(rig.path, 100, &error);
    VnWireDeviceInfo info;
    VnClientStats st;
    uint8_t cfg[4];
    Heard h = { 0 };

    ck_assert_msg(c != NULL, "%s", error ? error->message : "?");
    vn_client_set_observer(c, heard, &h);
    g_atomic_int_set(&reset_stall_ms, 400);
    ck_assert_int_eq(vn_client_reset(c), -ETIMEDOUT);
    vn_client_stats(c, &st);
    ck_assert_uint_eq(st.timeouts, 1);
    ck_assert_uint_eq(st.awaiting, 1);
    ck_assert(st.stalled);
    ck_assert_int_eq(h.timed_out, 1);
    g_atomic_int_set(&reset_stall_ms, 0);
    g_usleep(500 * 1000); /* the reset's answer is in the socket now */
    ck_assert_int_eq(vn_client_get_info(c, &info), 0);
    ck_assert_uint_eq(info.num_regions, VFIO_PCI_NUM_REGIONS);
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, 0, cfg, 4), 4);
    ck_assert_int_eq(g_atomic_int_get(&rig.fake.resets), 1);
    vn_client_stats(c, &st);
    ck_assert_uint_eq(st.late_replies, 1);
    ck_assert_uint_eq(st.awaiting, 0);
    ck_assert(!st.stalled);
    ck_assert_int_eq(h.late, 1);
    ck_assert_uint_eq(h.cmd, VN_CMD_DEVICE_RESET);
}
END_TEST

/* Two requests in a row time out while the server stalls; both answers are
 * dropped when they come and the third request gets its own. */
START_TEST(test_client_stall_answer_before_next)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnClient) c = vn_client_connect(rig.path, 100, &error);
    VnWireDeviceInfo info;

    ck_assert_msg(c != NULL, "%s", error ? error->message : "?");
    g_atomic_int_set(&reset_stall_ms, 400);
    ck_assert_int_eq(vn_client_reset(c), -ETIMEDOUT);
    /* Still stalled when the next request goes: that one times out too, and
     * both answers are dropped when they come. */
    ck_assert_int_eq(vn_client_get_info(c, &info), -ETIMEDOUT);
    g_atomic_int_set(&reset_stall_ms, 0);
    g_usleep(600 * 1000);
    ck_assert_int_eq(vn_client_get_info(c, &info), 0);
    ck_assert_uint_eq(info.num_regions, VFIO_PCI_NUM_REGIONS);
}
END_TEST

/* Far more requests than any fixed table holds time out in one stall (a
 * guest resetting its controller while the device server is stopped): each
 * late answer is still recognised, and the next request gets its own (the
 * 17th-oldest was once taken for a reply to nothing: -EPROTO, then every
 * request got another's answer). */
START_TEST(test_client_stall_many)
{
    enum { TIMED_OUT = 40, TIMEOUT_MS = 20 };
    g_autoptr(GError) error = NULL;
    g_autoptr(VnClient) c = vn_client_connect(rig.path, TIMEOUT_MS, &error);
    VnWireDeviceInfo info;
    VnClientStats st;
    Heard h = { .min_late_ms = TIMEOUT_MS };

    ck_assert_msg(c != NULL, "%s", error ? error->message : "?");
    vn_client_set_observer(c, heard, &h);
    g_atomic_int_set(&reset_stall_ms, TIMED_OUT * TIMEOUT_MS + 300);
    ck_assert_int_eq(vn_client_reset(c), -ETIMEDOUT);
    for (int i = 1; i < TIMED_OUT; i++) {
        ck_assert_int_eq(vn_client_get_info(c, &info), -ETIMEDOUT);
    }
    vn_client_stats(c, &st);
    ck_assert_uint_eq(st.awaiting, TIMED_OUT);
    g_atomic_int_set(&reset_stall_ms, 0);
    g_usleep(800 * 1000); /* every answer is in the socket now */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(vn_client_get_info(c, &info), 0);
        ck_assert_uint_eq(info.num_regions, VFIO_PCI_NUM_REGIONS);
    }
    vn_client_stats(c, &st);
    ck_assert_uint_eq(st.late_replies, TIMED_OUT);
    ck_assert_uint_eq(st.awaiting, 0);
    ck_assert_int_eq(h.late, TIMED_OUT);
}
END_TEST

/* A socket a killed server left behind is taken over by the next one (a
 * restarted simdev was refused "Address already in use"); one a live server
 * listens on is not, and that server goes on serving. */
START_TEST(test_stale_socket_taken_over)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *stale = g_build_filename(rig.dir, "stale.sock", NULL);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    g_autoptr(VnClient) c = NULL;
    VnServer *second;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    second = vn_server_new(rig.path, &rig_info, &fake_ops, &rig.fake, NULL, &error);
    ck_assert_ptr_null(second);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_ADDRESS_IN_USE));
    c = connect_ok();
    g_clear_error(&error);
    g_strlcpy(addr.sun_path, stale, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    close(fd); /* the file stays, nobody listens: what kill -9 leaves */
    second = vn_server_new(stale, &rig_info, &fake_ops, &rig.fake, NULL, &error);
    ck_assert_msg(second != NULL, "%s", error ? error->message : "");
    vn_server_free(second);
    ck_assert(!g_file_test(stale, G_FILE_TEST_EXISTS));
}
END_TEST

/* A server that is stopped and whose backlog is full accepts no connection: the client
 * says so at once instead of waiting in connect() until the server runs again. */
START_TEST(test_client_connect_backlog_full)
{
    g_autofree char *path = g_build_filename(rig.dir, "full.sock", NULL);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    g_autoptr(GError) error = NULL;
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int queued = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    gint64 t0;

    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(lfd, 0), 0); /* never accepted: one connection fills it */
    ck_assert_int_eq(connect(queued, (struct sockaddr *)&addr, sizeof(addr)), 0);
    t0 = g_get_monotonic_time();
    ck_assert_ptr_null(vn_client_connect(path, 500, &error));
    ck_assert_int_lt(g_get_monotonic_time() - t0, G_USEC_PER_SEC);
    ck_assert_msg(strstr(error->message, "backlog is full") != NULL, "%s", error->message);
    close(queued);
    close(lfd);
    unlink(path);
}
END_TEST

/* ---- a device server of another make ----------------------------------- */

typedef struct Other {
    char *path;
    int listen_fd;
    bool same; /* its region fds are one file (libvfio-user's way) or two */
} Other;

/* Answer one command of @t with @body (@len bytes) and @fds. */
static void other_answer(VnTransport *t, uint16_t cmd, const void *body, size_t len, const int *fds,
                         unsigned nfds)
{
    g_autoptr(GByteArray) out = g_byte_array_new();
    VnTransportMsg msg = { 0 };
    VnWireHdr hdr;
    int ret = 0;

    for (int i = 0; i < 2000 && ret == 0; i++) {
        ret = vn_transport_recv(t, &msg);
        if (ret == 0) {
            g_usleep(1000);
        }
    }
    ck_assert_int_eq(ret, 1);
    memcpy(&hdr, msg.data, sizeof(hdr));
    ck_assert_uint_eq(hdr.cmd, cmd);
    vn_wire_begin_reply(out, &hdr);
    g_byte_array_append(out, body, (guint)len);
    vn_wire_finish(out);
    ck_assert_int_eq(vn_transport_send(t, out->data, out->len, fds, nfds), 0);
    vn_transport_msg_clear(&msg);
}

/* VERSION, then GET_REGION_INFO of BAR0 answered with two fds, as libvfio-user does for a
 * region with two sparse mmap areas. */
static gpointer other_thread(gpointer data)
{
    Other *o = data;
    int c = accept4(o->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    VnTransport *t;
    VnWireVersion v = { VN_WIRE_VERSION_MAJOR, VN_WIRE_VERSION_MINOR };
    struct vfio_region_info ri = { .argsz = sizeof(ri),
                                   .index = 0,
                                   .size = 4096,
                                   .flags = VFIO_REGION_INFO_FLAG_READ |
                                            VFIO_REGION_INFO_FLAG_WRITE |
                                            VFIO_REGION_INFO_FLAG_MMAP };
    int a = memfd_create("bar", MFD_CLOEXEC), b = o->same ? dup(a) : memfd_create("other", 0);
    int fds[2] = { a, b };

    ck_assert_int_ge(c, 0);
    t = vn_transport_new(c);
    other_answer(t, VN_CMD_VERSION, &v, sizeof(v), NULL, 0);
    other_answer(t, VN_CMD_DEVICE_GET_REGION_INFO, &ri, sizeof(ri), fds, 2);
    close(a);
    close(b);
    vn_transport_free(t);
    return NULL;
}

/* A region's fd comes once per sparse mmap area from libvfio-user: the client keeps one
 * (they are one file); fds of two files for one region are a server's mistake, refused. */
START_TEST(test_client_region_fd_per_area)
{
    for (int same = 1; same >= 0; same--) {
        g_autofree char *dir = g_dir_make_tmp("vn-check-other-XXXXXX", NULL);
        Other o = { .path = g_build_filename(dir, "s.sock", NULL), .same = same };
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        g_autoptr(GError) error = NULL;
        struct vfio_region_info info;
        VnClient *c;
        GThread *th;
        int fd = -1, ret;

        o.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        g_strlcpy(addr.sun_path, o.path, sizeof(addr.sun_path));
        ck_assert_int_eq(bind(o.listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        ck_assert_int_eq(listen(o.listen_fd, 1), 0);
        th = g_thread_new("other", other_thread, &o);
        c = vn_client_connect(o.path, 2000, &error);
        ck_assert_msg(c != NULL, "%s", error ? error->message : "");
        ret = vn_client_get_region_info(c, 0, &info, &fd, NULL, 0, NULL);
        if (same) {
            ck_assert_int_eq(ret, 0);
            ck_assert_int_ge(fd, 0);
            ck_assert_uint_eq(info.size, 4096);
            close(fd);
        } else {
            ck_assert_int_eq(ret, -EPROTO);
            ck_assert_int_eq(fd, -1);
        }
        vn_client_free(c);
        g_thread_join(th);
        close(o.listen_fd);
        g_unlink(o.path);
        g_rmdir(dir);
        g_free(o.path);
    }
}
END_TEST

static void setup_deferred(void)
{
    rig_ops = &deferred_ops;
    deferred_ids = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    setup();
}

static void teardown_deferred(void)
{
    teardown();
    rig_ops = &fake_ops;
    g_array_unref(deferred_ids);
}

/* The reply id of the device's @i-th DMA_MAP, once it has that many (bounded wait). */
static uint64_t deferred_id(guint i)
{
    uint64_t id = 0;

    for (int tries = 0; tries < 2000 && id == 0; tries++) {
        pthread_mutex_lock(&deferred_lock);
        if (deferred_ids->len > i) {
            id = g_array_index(deferred_ids, uint64_t, i);
        }
        pthread_mutex_unlock(&deferred_lock);
        if (id == 0) {
            g_usleep(1000);
        }
    }
    ck_assert_msg(id != 0, "the device was not asked for DMA_MAP number %u", i + 1);
    return id;
}

static guint deferred_count(void)
{
    guint n;

    pthread_mutex_lock(&deferred_lock);
    n = deferred_ids->len;
    pthread_mutex_unlock(&deferred_lock);
    return n;
}

typedef struct Answer {
    uint64_t id;
    int err;
    const char *data; /* a read's 4 bytes, or NULL */
} Answer;

static gboolean answer_on_server(gpointer data)
{
    Answer *a = data;

    if (a->data != NULL) {
        vn_server_complete_read(rig.server, a->id, a->data, 4);
    } else {
        vn_server_complete(rig.server, a->id, a->err);
    }
    return G_SOURCE_REMOVE;
}

static void answer(uint64_t id, int err)
{
    Answer a = { id, err, NULL };

    call_on_server(answer_on_server, &a);
}

static void answer_read(uint64_t id, const char *data)
{
    Answer a = { id, 0, data };

    call_on_server(answer_on_server, &a);
}

/* Whether the server sent us anything within @ms. */
static bool something_sent(VnClient *c, int ms)
{
    struct pollfd pfd = { .fd = vn_client_fd(c), .events = POLLIN };

    return poll(&pfd, 1, ms) == 1;
}

static void send_cmd(VnClient *c, uint16_t id, uint16_t cmd, const void *body, size_t len, int fd)
{
    g_autoptr(GByteArray) m = g_byte_array_new();

    vn_wire_begin(m, id, cmd, 0);
    g_byte_array_append(m, body, (guint)len);
    vn_wire_finish(m);
    ck_assert_int_eq(vn_client_raw(c, m->data, m->len, fd >= 0 ? &fd : NULL, fd >= 0, NULL), 0);
}

static void send_map(VnClient *c, uint16_t id, uint64_t iova, int mem)
{
    VnWireDmaMap map = {
        .argsz = sizeof(map), .flags = 3, .offset = 0, .iova = iova, .size = 0x1000
    };

    send_cmd(c, id, VN_CMD_DMA_MAP, &map, sizeof(map), mem);
}

/* The reply to @id, in turn: its error (0: none) and, for a read, its 4 bytes in @data. */
static uint32_t reply_of(VnClient *c, uint16_t id, char *data)
{
    g_autoptr(GByteArray) msg = NULL;
    VnWireHdr h = next_msg(c, &msg);

    ck_assert_uint_eq(h.id, id);
    if (data != NULL && !(h.flags & VN_WIRE_FLAG_ERROR)) {
        ck_assert_uint_eq(msg->len, VN_WIRE_HDR_SIZE + sizeof(VnWireRegionRw) + 4);
        memcpy(data, msg->data + VN_WIRE_HDR_SIZE + sizeof(VnWireRegionRw), 4);
    }
    return (h.flags & VN_WIRE_FLAG_ERROR) ? h.error : 0;
}

/* A device that answers later, out of order (maps, a BAR read, an unmap, a reset): the
 * client still gets every reply in the order it asked (QEMU takes a transaction's last map
 * reply as "all mapped"), a command answered at once meanwhile waits behind them, a read
 * gets the bytes the device gave later, and a refused map is undone in the table. */
START_TEST(test_deferred_replies_keep_order)
{
    g_autoptr(VnClient) c = connect_ok();
    VnWireRegionRw cfg = { .offset = 0, .region = VFIO_PCI_CONFIG_REGION_INDEX, .count = 4 };
    VnWireRegionRw bar = { .offset = 0x10, .region = VFIO_PCI_BAR0_REGION_INDEX, .count = 4 };
    VnWireDmaUnmap unmap = { .argsz = sizeof(unmap), .iova = 0x100000, .size = 0x1000 };
    int mem = vn_peerfd_memfd_new("guest", 0x10000);
    uint64_t id[5];
    char got[4];

    memcpy(rig.fake.cfg, "\x86\x80\x34\x12", 4);
    send_map(c, 101, 0x100000, mem);
    send_map(c, 102, 0x200000, mem);
    send_cmd(c, 103, VN_CMD_REGION_READ, &cfg, sizeof(cfg), -1);
    send_cmd(c, 104, VN_CMD_REGION_READ, &bar, sizeof(bar), -1);
    send_cmd(c, 105, VN_CMD_DMA_UNMAP, &unmap, sizeof(unmap), -1);
    send_cmd(c, 106, VN_CMD_DEVICE_RESET, NULL, 0, -1);
    for (guint i = 0; i < 5; i++) {
        id[i] = deferred_id(i);
    }
    ck_assert(!something_sent(c, 100)); /* the config read is answered, its reply waits */

    answer(id[1], -EACCES); /* out of order: still nothing may go */
    answer(id[4], 0);
    answer_read(id[2], "abcd");
    answer(id[3], 0);
    ck_assert(!something_sent(c, 50));
    answer(id[0], 0);
    ck_assert_uint_eq(reply_of(c, 101, NULL), 0);
    ck_assert_uint_eq(reply_of(c, 102, NULL), EACCES);
    ck_assert_uint_eq(reply_of(c, 103, got), 0);
    ck_assert_mem_eq(got, "\x86\x80\x34\x12", 4);
    ck_assert_uint_eq(reply_of(c, 104, got), 0);
    ck_assert_mem_eq(got, "abcd", 4);
    ck_assert_uint_eq(reply_of(c, 105, NULL), 0);
    ck_assert_uint_eq(reply_of(c, 106, NULL), 0);
    /* the refused map was taken out of the table, the other unmapped */
    ck_assert_uint_eq(vn_dma_count(vn_server_dma(rig.server)), 0);
    close(mem);
}
END_TEST

static gboolean resume_on_server(gpointer data)
{
    pthread_mutex_lock(&deferred_lock);
    *(bool *)data = vn_server_resume(rig.server, pause_token);
    pthread_mutex_unlock(&deferred_lock);
    return G_SOURCE_REMOVE;
}

/* A command whose op pauses the server: the client's next command is not looked at until
 * the op resumes it (so it finds the map done), then is; the replies keep their order, and
 * a second resume, or one of a client that went, is refused. */
START_TEST(test_pause_holds_next_command)
{
    g_autoptr(VnClient) c = connect_ok();
    int mem = vn_peerfd_memfd_new("guest", 0x10000);
    bool resumed = false;
    uint64_t first, second;

    g_atomic_int_set(&pausing, 1);
    send_map(c, 101, 0x100000, mem);
    send_map(c, 102, 0x200000, mem);
    first = deferred_id(0);
    g_usleep(100 * 1000);
    ck_assert_uint_eq(deferred_count(), 1); /* the second waits in the socket */
    g_atomic_int_set(&pausing, 0);
    call_on_server(resume_on_server, &resumed);
    ck_assert(resumed);
    second = deferred_id(1);
    answer(second, 0);
    ck_assert(!something_sent(c, 50));
    answer(first, 0);
    ck_assert_uint_eq(reply_of(c, 101, NULL), 0);
    ck_assert_uint_eq(reply_of(c, 102, NULL), 0);
    /* A client that goes while paused is seen gone once resumed (its socket is not read
     * meanwhile); a resume after that is nobody's. */
    g_atomic_int_set(&pausing, 1);
    send_map(c, 103, 0x300000, mem);
    (void)deferred_id(2);
    g_atomic_int_set(&pausing, 0);
    g_clear_pointer(&c, vn_client_free);
    call_on_server(resume_on_server, &resumed);
    ck_assert(resumed);
    for (int i = 0; i < 200 && server_has_client(); i++) {
        g_usleep(5000);
    }
    ck_assert(!server_has_client());
    call_on_server(resume_on_server, &resumed);
    ck_assert(!resumed);
    close(mem);
}
END_TEST

typedef struct ManyMaps {
    VnClient *c;
    int mem;
    unsigned n;
    gint ret;
    gint done;
} ManyMaps;

static gpointer map_many(gpointer data)
{
    ManyMaps *mm = data;
    g_autofree VnClientDmaMap *maps = g_new0(VnClientDmaMap, mm->n);

    for (unsigned i = 0; i < mm->n; i++) {
        maps[i] = (VnClientDmaMap){
            .iova = 0x100000ull * (i + 1), .size = 0x1000, .prot = 3, .fd = mm->mem
        };
    }
    g_atomic_int_set(&mm->ret, vn_client_dma_map_many(mm->c, maps, mm->n));
    g_atomic_int_set(&mm->done, 1);
    return NULL;
}

/* A client that sends more maps than the device may owe answers for: the server stops
 * reading at VN_SERVER_MAX_DEFERRED (the rest wait in the socket, not in our memory) and
 * goes on once the device answers. */
START_TEST(test_deferred_replies_bounded)
{
    ManyMaps mm = { .c = connect_ok(),
                    .mem = vn_peerfd_memfd_new("guest", 0x10000),
                    .n = VN_SERVER_MAX_DEFERRED + 6 };
    GThread *t = g_thread_new("maps", map_many, &mm);

    deferred_id(VN_SERVER_MAX_DEFERRED - 1);
    g_usleep(100 * 1000);
    ck_assert_uint_eq(deferred_count(), VN_SERVER_MAX_DEFERRED);
    for (guint i = 0; i < mm.n; i++) {
        answer(deferred_id(i), 0);
    }
    g_thread_join(t);
    ck_assert(g_atomic_int_get(&mm.done));
    ck_assert_int_eq(g_atomic_int_get(&mm.ret), 0);
    ck_assert_uint_eq(vn_dma_count(vn_server_dma(rig.server)), mm.n);
    vn_client_free(mm.c);
    close(mm.mem);
}
END_TEST

/* A client that goes while its map is unanswered: the device's late answer is ignored, and
 * the next client is served from a clean table. */
START_TEST(test_deferred_reply_after_client_left)
{
    g_autoptr(VnClient) c = connect_ok();
    int mem = vn_peerfd_memfd_new("guest", 0x10000);
    uint64_t id;

    send_map(c, 7, 0x100000, mem);
    id = deferred_id(0);
    vn_client_free(g_steal_pointer(&c));
    wait_no_client();
    answer(id, 0);
    ck_assert_uint_eq(vn_dma_count(vn_server_dma(rig.server)), 0);
    c = connect_ok();
    send_map(c, 8, 0x100000, mem);
    answer(deferred_id(1), 0);
    ck_assert_int_eq(raw_errno(c, NULL, 0, NULL, 0), 0);
    ck_assert_uint_eq(vn_dma_count(vn_server_dma(rig.server)), 1);
    close(mem);
}
END_TEST

static Suite *server_suite(void)
{
    Suite *s = suite_create("server");
    TCase *tc;

    tc = tcase_create("protocol");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_info_and_regions);
    tcase_add_test(tc, test_region_errors);
    tcase_add_test(tc, test_posted_writes_keep_order);
    tcase_add_test(tc, test_reset);
    tcase_add_test(tc, test_region_map_only_to_a_client_that_offers_it);
    tcase_add_test(tc, test_client_dma);
    suite_add_tcase(s, tc);

    tc = tcase_create("stall");
    tcase_add_test(tc, test_client_stall_late_reply);
    tcase_add_test(tc, test_client_stall_answer_before_next);
    tcase_add_test(tc, test_client_stall_many);
    tcase_add_checked_fixture(tc, setup, teardown);
    suite_add_tcase(s, tc);

    tc = tcase_create("dma");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_dma_table);
    tcase_add_loop_test(tc, test_dma_map_refuses_bad_memory, 0, BAD_MEM_LAST);
    suite_add_tcase(s, tc);

    tc = tcase_create("deferred");
    tcase_add_checked_fixture(tc, setup_deferred, teardown_deferred);
    tcase_add_test(tc, test_deferred_replies_keep_order);
    tcase_add_test(tc, test_pause_holds_next_command);
    tcase_add_test(tc, test_deferred_replies_bounded);
    tcase_add_test(tc, test_deferred_reply_after_client_left);
    suite_add_tcase(s, tc);

    tc = tcase_create("irqs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_irqs);
    tcase_add_loop_test(tc, test_set_irqs_refuses_non_eventfds, 0, NOT_EVENTFD_LAST);
    tcase_add_test(tc, test_saturated_eventfd_does_not_block);
    suite_add_tcase(s, tc);

    tc = tcase_create("other-servers");
    tcase_add_test(tc, test_client_region_fd_per_area);
    suite_add_tcase(s, tc);

    tc = tcase_create("untrusted");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_malformed_over_socket);
    tcase_add_test(tc, test_untrusted_stream_disconnects_and_next_client_served);
    tcase_add_test(tc, test_command_before_version);
    tcase_add_test(tc, test_queued_client_served_after_first_leaves);
    tcase_add_test(tc, test_stale_socket_taken_over);
    tcase_add_test(tc, test_client_connect_backlog_full);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(server_suite());
}
