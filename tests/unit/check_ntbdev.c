/*
 * The simulated NTB's windows mapped by their clients (simdev/ntbdev-map.c): two real
 * vfio-user servers (one per port) in a thread, and two raw clients that speak the wire
 * as QEMU does, so a test sees each message: the window handed to the client that offered
 * the region-map capability, taken back before the peer's unmap is answered, kept
 * trapped for a client that did not offer it or refused it.
 */
#include "common/peerfd.h"
#include "common/util.h"
#include "simdev/ntbdev.h"
#include "vfio-user/server.h"
#include "vfio-user/transport.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <glib/gstdio.h>
#include <glib-unix.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define WINDOW (64u << 10)
#define PEER_IOVA UINT64_C(0x40000000) /* where port 1's guest memory is, to its IOMMU */
#define PEER_MEM (256u << 10)
#define MEM_AT (64u << 10) /* the window's target in that memory */
#define QUIET_MS 200       /* how long "nothing comes" is watched */

typedef struct Rig {
    char *dir;
    VnNtbDev *dev;
    VnServer *server[2];
    GMainContext *ctx;
    GMainLoop *loop;
    GThread *thread;
    VnTransport *c[2];
    uint16_t id;
    int mem_fd; /* port 1's guest memory */
    uint8_t *mem;
    unsigned bar;    /* the window's region */
    uint64_t offset; /* ... and where in it */
} Rig;

static Rig rig;

static gpointer serve(gpointer data)
{
    g_main_context_push_thread_default(rig.ctx);
    g_main_loop_run(rig.loop);
    g_main_context_pop_thread_default(rig.ctx);
    return NULL;
}

static void setup(void)
{
    uint64_t sizes[1] = { WINDOW };
    g_autoptr(GError) error = NULL;
    VnEpfLayout l;

    memset(&rig, 0, sizeof(rig));
    rig.dir = g_dir_make_tmp("vn-ntbdev-XXXXXX", NULL);
    rig.dev = vn_ntbdev_new(sizes, 1, &error);
    ck_assert_msg(rig.dev != NULL, "%s", error ? error->message : "");
    rig.ctx = g_main_context_new();
    rig.loop = g_main_loop_new(rig.ctx, FALSE);
    for (unsigned p = 0; p < 2; p++) {
        g_autofree char *path = g_strdup_printf("%s/p%u", rig.dir, p);

        rig.server[p] = vn_server_new(path, vn_ntbdev_info(rig.dev), &vn_ntbdev_ops,
                                      vn_ntbdev_port(rig.dev, p), rig.ctx, &error);
        ck_assert_msg(rig.server[p] != NULL, "%s", error ? error->message : "");
        vn_ntbdev_attach(rig.dev, p, rig.server[p]);
    }
    vn_ntbdev_layout(rig.dev, &l);
    rig.bar = l.window_bar[0];
    rig.offset = l.window_offset[0];
    rig.mem_fd = vn_peerfd_memfd_new("peer-ram", PEER_MEM);
    ck_assert_int_ge(rig.mem_fd, 0);
    rig.mem = mmap(NULL, PEER_MEM, PROT_READ | PROT_WRITE, MAP_SHARED, rig.mem_fd, 0);
    ck_assert(rig.mem != MAP_FAILED);
    rig.thread = g_thread_new("ntbsim", serve, NULL);
}

static gboolean quit_loop(gpointer data)
{
    g_main_loop_quit(rig.loop);
    return G_SOURCE_REMOVE;
}

static void teardown(void)
{
    for (unsigned p = 0; p < 2; p++) {
        g_clear_pointer(&rig.c[p], vn_transport_free);
    }
    g_main_context_invoke(rig.ctx, quit_loop, NULL);
    g_thread_join(rig.thread);
    for (unsigned p = 0; p < 2; p++) {
        vn_server_free(rig.server[p]);
        vn_ntbdev_attach(rig.dev, p, NULL);
    }
    vn_ntbdev_free(rig.dev);
    g_main_loop_unref(rig.loop);
    g_main_context_unref(rig.ctx);
    munmap(rig.mem, PEER_MEM);
    close(rig.mem_fd);
    for (unsigned p = 0; p < 2; p++) {
        g_autofree char *path = g_strdup_printf("%s/p%u", rig.dir, p);

        g_unlink(path);
    }
    g_rmdir(rig.dir);
    g_free(rig.dir);
}

/* The next message from port @p's server within @ms (false: none came). */
static bool next(unsigned p, unsigned ms, VnTransportMsg *m)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)ms * 1000;

    memset(m, 0, sizeof(*m));
    for (;;) {
        struct pollfd pfd = { .fd = vn_transport_fd(rig.c[p]), .events = POLLIN };
        gint64 left = deadline - g_get_monotonic_time();
        int ret = vn_transport_recv(rig.c[p], m);

        ck_assert_int_ge(ret, 0);
        if (ret == 1) {
            return true;
        }
        if (left <= 0) {
            return false;
        }
        poll(&pfd, 1, (int)((left + 999) / 1000));
    }
}

static VnWireHdr hdr_of(const VnTransportMsg *m)
{
    VnWireHdr h;

    ck_assert_uint_ge(m->len, sizeof(h));
    memcpy(&h, m->data, sizeof(h));
    return h;
}

static uint16_t send_cmd(unsigned p, uint16_t cmd, const void *body, size_t len, int fd)
{
    g_autoptr(GByteArray) b = g_byte_array_new();
    uint16_t id = ++rig.id;

    vn_wire_begin(b, id, cmd, VN_WIRE_FLAG_COMMAND);
    g_byte_array_append(b, body, (guint)len);
    vn_wire_finish(b);
    ck_assert_int_eq(
        vn_transport_send(rig.c[p], b->data, b->len, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0), 0);
    return id;
}

/* Port @p's reply to @id (any server request before it fails the test). */
static VnWireHdr reply(unsigned p, uint16_t id)
{
    VnTransportMsg m;
    VnWireHdr h;

    ck_assert_msg(next(p, 5000, &m), "port %u: no reply to id %u", p, id);
    h = hdr_of(&m);
    ck_assert_uint_eq(h.flags & VN_WIRE_FLAG_TYPE_MASK, VN_WIRE_FLAG_REPLY);
    ck_assert_uint_eq(h.id, id);
    vn_transport_msg_clear(&m);
    return h;
}

static void connect_port(unsigned p, bool region_map)
{
    g_autofree char *path = g_strdup_printf("%s/p%u", rig.dir, p);
    const char *caps =
        region_map ? "{\"capabilities\":{\"max_msg_fds\":16,\"" VN_WIRE_CAP_REGION_MAP "\":true}}"
                   : "{\"capabilities\":{\"max_msg_fds\":16}}";
    g_autoptr(GByteArray) body = g_byte_array_new();
    VnWireVersion v = { VN_WIRE_VERSION_MAJOR, VN_WIRE_VERSION_MINOR };
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    g_strlcpy(a.sun_path, path, sizeof(a.sun_path));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    rig.c[p] = vn_transport_new(fd);
    g_byte_array_append(body, (const guint8 *)&v, sizeof(v));
    g_byte_array_append(body, (const guint8 *)caps, (guint)strlen(caps) + 1);
    ck_assert_uint_eq(reply(p, send_cmd(p, VN_CMD_VERSION, body->data, body->len, -1)).error, 0);
}

static void region_write(unsigned p, uint32_t index, uint64_t offset, const void *data, uint32_t n)
{
    uint8_t body[sizeof(VnWireRegionRw) + 8];
    VnWireRegionRw rw = { .offset = offset, .region = index, .count = n };

    ck_assert_uint_le(n, 8);
    memcpy(body, &rw, sizeof(rw));
    memcpy(body + sizeof(rw), data, n);
    ck_assert_uint_eq(reply(p, send_cmd(p, VN_CMD_REGION_WRITE, body, sizeof(rw) + n, -1)).error,
                      0);
}

static void region_read(unsigned p, uint32_t index, uint64_t offset, void *data, uint32_t n)
{
    VnWireRegionRw rw = { .offset = offset, .region = index, .count = n };
    uint16_t id = send_cmd(p, VN_CMD_REGION_READ, &rw, sizeof(rw), -1);
    VnTransportMsg m;

    ck_assert(next(p, 5000, &m));
    ck_assert_uint_eq(hdr_of(&m).id, id);
    ck_assert_uint_eq(m.len, VN_WIRE_HDR_SIZE + sizeof(rw) + n);
    memcpy(data, m.data + VN_WIRE_HDR_SIZE + sizeof(rw), n);
    vn_transport_msg_clear(&m);
}

static void ctrl32(unsigned p, uint32_t reg, uint32_t v)
{
    region_write(p, VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_CTRL_BAR, reg, &v, 4);
}

static uint16_t dma_map_peer(uint64_t iova, uint64_t size, uint64_t offset, uint32_t prot)
{
    VnWireDmaMap m = {
        .argsz = sizeof(m), .flags = prot, .offset = offset, .iova = iova, .size = size
    };
    int fd = dup(rig.mem_fd);
    uint16_t id = send_cmd(1, VN_CMD_DMA_MAP, &m, sizeof(m), fd);

    close(fd);
    return id;
}

/* Port 1's function may master the bus, and port 1 translates port 0's window to @iova
 * (what ntb_hw_epf's mw_set_trans does). */
static void peer_sets_translation(uint64_t iova)
{
    uint16_t command = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;

    region_write(1, VFIO_PCI_CONFIG_REGION_INDEX, PCI_COMMAND, &command, 2);
    ctrl32(1, VN_EPF_REG_LOWER_ADDR, (uint32_t)iova);
    ctrl32(1, VN_EPF_REG_UPPER_ADDR, (uint32_t)(iova >> 32));
    ctrl32(1, VN_EPF_REG_LOWER_SIZE, WINDOW);
    ctrl32(1, VN_EPF_REG_UPPER_SIZE, 0);
    ctrl32(1, VN_EPF_REG_ARGUMENT, 0);
    ctrl32(1, VN_EPF_REG_COMMAND, VN_EPF_CMD_CONFIGURE_MW);
}

/* Port 1's host: its memory mapped for its NTB function, and port 0's window translated onto
 * MEM_AT of it. */
static void peer_translates(void)
{
    ck_assert_uint_eq(reply(1, dma_map_peer(PEER_IOVA, PEER_MEM, 0,
                                            VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE))
                          .error,
                      0);
    peer_sets_translation(PEER_IOVA + MEM_AT);
}

/* An X_REGION_MAP ask of port 0's (its body in *@rm, its extents in @ext when given, its fd,
 * if any, in *@fd). */
static VnWireHdr next_ask(VnWireRegionMap *rm, VnWireRegionExtent *ext, int *fd)
{
    VnTransportMsg m;
    VnWireHdr h;

    ck_assert_msg(next(0, 5000, &m), "port 0 was asked nothing");
    h = hdr_of(&m);
    ck_assert_uint_eq(h.cmd, VN_CMD_X_REGION_MAP);
    ck_assert_uint_eq(h.flags & VN_WIRE_FLAG_TYPE_MASK, VN_WIRE_FLAG_COMMAND);
    ck_assert_uint_ge(m.len, VN_WIRE_HDR_SIZE + sizeof(*rm));
    memcpy(rm, m.data + VN_WIRE_HDR_SIZE, sizeof(*rm));
    ck_assert_uint_eq(m.len, VN_WIRE_HDR_SIZE + sizeof(*rm) + rm->nr_extents * sizeof(*ext));
    ck_assert_uint_le(rm->nr_extents, WINDOW / 4096);
    if (ext != NULL) {
        memcpy(ext, m.data + VN_WIRE_HDR_SIZE + sizeof(*rm), rm->nr_extents * sizeof(*ext));
    }
    ck_assert_uint_eq(rm->region, VFIO_PCI_BAR0_REGION_INDEX + rig.bar);
    ck_assert_uint_eq(rm->offset, rig.offset);
    ck_assert_uint_eq(rm->size, WINDOW);
    *fd = -1;
    if (m.nfds == 1) {
        *fd = m.fds[0];
        m.fds[0] = -1;
    }
    vn_transport_msg_clear(&m);
    return h;
}

/* The window as the client maps it (what patch 0008 does): each extent of @fd in place, all
 * ones between them. */
static uint8_t *map_like_qemu(const VnWireRegionMap *rm, const VnWireRegionExtent *ext, int fd)
{
    uint8_t *win = mmap(NULL, rm->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    ck_assert(win != MAP_FAILED);
    memset(win, 0xff, rm->size);
    for (uint32_t i = 0; i < rm->nr_extents; i++) {
        ck_assert(mmap(win + ext[i].at, ext[i].len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                       fd, (off_t)ext[i].fd_offset) != MAP_FAILED);
    }
    return win;
}

static void answer(const VnWireHdr *ask, int err)
{
    VnWireHdr h = { .id = ask->id,
                    .cmd = ask->cmd,
                    .size = VN_WIRE_HDR_SIZE,
                    .flags = VN_WIRE_FLAG_REPLY | (err != 0 ? VN_WIRE_FLAG_ERROR : 0),
                    .error = (uint32_t)err };

    ck_assert_int_eq(vn_transport_send(rig.c[0], &h, sizeof(h), NULL, 0), 0);
}

/* Both ports' clients (port 0's offers the region map), port 1's memory translated, and
 * port 0 handed its window, which it takes. */
static void window_handed_over(void)
{
    VnWireRegionMap rm;
    VnWireHdr ask;
    int fd;

    connect_port(0, true);
    connect_port(1, false);
    peer_translates();
    ask = next_ask(&rm, NULL, &fd);
    ck_assert_uint_eq(rm.flags, VN_WIRE_REGION_MAP_FLAG_MAP);
    close(fd);
    answer(&ask, 0);
}

/* Whether port 0's server closes the connection within 5 s (what it sends meanwhile is
 * dropped). */
static bool port0_dropped(void)
{
    gint64 deadline = g_get_monotonic_time() + 5 * G_USEC_PER_SEC;
    VnTransportMsg m = { 0 };
    int ret = 0;

    while (ret >= 0 && g_get_monotonic_time() < deadline) {
        ret = vn_transport_recv(rig.c[0], &m);
        vn_transport_msg_clear(&m);
        g_usleep(10000);
    }
    return ret == -ECONNRESET;
}

/* Port 0's window reached through messages (trapped): a store, then a load. */
static void trapped_store(uint64_t at, const char *what)
{
    region_write(0, VFIO_PCI_BAR0_REGION_INDEX + rig.bar, rig.offset + at, what, 8);
}

static void trapped_load(uint64_t at, char *out)
{
    region_read(0, VFIO_PCI_BAR0_REGION_INDEX + rig.bar, rig.offset + at, out, 8);
}

/* A store and a load through port 0's trapped window, both reaching port 1's memory. */
static void trapped_round_trip(uint64_t at, const char *what)
{
    char got[8];

    trapped_store(at, what);
    ck_assert_mem_eq(rig.mem + MEM_AT + at, what, 8);
    trapped_load(at, got);
    ck_assert_mem_eq(got, what, 8);
}

START_TEST(test_window_handed_over_then_taken_back_before_unmap)
{
    VnWireRegionExtent ext[WINDOW / 4096];
    VnWireRegionMap rm;
    VnWireHdr ask, h;
    VnTransportMsg m;
    uint8_t *win;
    char got[8];
    int fd;

    connect_port(0, true);
    connect_port(1, false);
    peer_translates();

    /* The window reaches port 1's memory: port 0's client is handed it, the part of the
     * memory its translation names, and what it stores there is in port 1's memory. */
    ask = next_ask(&rm, ext, &fd);
    ck_assert_uint_eq(rm.flags, VN_WIRE_REGION_MAP_FLAG_MAP);
    ck_assert_int_ge(fd, 0);
    ck_assert_uint_eq(rm.nr_extents, 1); /* one run of the memory: one piece */
    ck_assert_uint_eq(ext[0].at, 0);
    ck_assert_uint_eq(ext[0].fd_offset, MEM_AT);
    ck_assert_uint_eq(ext[0].len, WINDOW);
    win = map_like_qemu(&rm, ext, fd);
    close(fd);
    answer(&ask, 0);
    memcpy(win + 0x100, "mapped!!", 8);
    ck_assert_mem_eq(rig.mem + MEM_AT + 0x100, "mapped!!", 8);

    /* Port 1's host unmaps that memory.  Port 0's client is asked to take the window back,
     * and the unmap is answered only once it has: until then nothing comes back to port 1,
     * however long port 0 takes. */
    {
        VnWireDmaUnmap u = { .argsz = sizeof(u), .iova = PEER_IOVA, .size = PEER_MEM };
        uint16_t id = send_cmd(1, VN_CMD_DMA_UNMAP, &u, sizeof(u), -1);

        ask = next_ask(&rm, NULL, &fd);
        ck_assert_uint_eq(rm.flags, 0);
        ck_assert_uint_eq(rm.nr_extents, 0);
        ck_assert_int_eq(fd, -1);
        ck_assert_msg(!next(1, QUIET_MS, &m),
                      "the unmap was answered before the window was taken back");
        answer(&ask, 0);
        h = reply(1, id);
        ck_assert_uint_eq(h.error, 0);
    }
    munmap(win, WINDOW);

    /* Trapped again, the window's accesses are messages: its translation is no longer in
     * port 1's table, so they go to port 1's host, whose IOMMU (here: this test) refuses
     * them.  A load reads all ones, and nothing reaches the memory that was unmapped. */
    trapped_store(0x200, "nowhere!");
    ck_assert(next(1, 5000, &m));
    h = hdr_of(&m);
    ck_assert_uint_eq(h.cmd, VN_CMD_DMA_WRITE);
    vn_transport_msg_clear(&m);
    {
        VnWireRegionRw rw = { .offset = rig.offset + 0x200,
                              .region = VFIO_PCI_BAR0_REGION_INDEX + rig.bar,
                              .count = 8 };
        uint16_t id = send_cmd(0, VN_CMD_REGION_READ, &rw, sizeof(rw), -1);
        VnWireHdr refused;

        ck_assert(next(1, 5000, &m));
        refused = hdr_of(&m);
        ck_assert_uint_eq(refused.cmd, VN_CMD_DMA_READ);
        vn_transport_msg_clear(&m);
        refused.flags = VN_WIRE_FLAG_REPLY | VN_WIRE_FLAG_ERROR;
        refused.error = EFAULT;
        refused.size = VN_WIRE_HDR_SIZE;
        ck_assert_int_eq(vn_transport_send(rig.c[1], &refused, sizeof(refused), NULL, 0), 0);
        ck_assert(next(0, 5000, &m));
        ck_assert_uint_eq(hdr_of(&m).id, id);
        memcpy(got, m.data + VN_WIRE_HDR_SIZE + sizeof(rw), 8);
        vn_transport_msg_clear(&m);
    }
    ck_assert_mem_eq(got, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
    ck_assert_mem_ne(rig.mem + MEM_AT + 0x200, "nowhere!", 8);

    /* Mapped again: handed over again. */
    ck_assert_uint_eq(reply(1, dma_map_peer(PEER_IOVA, PEER_MEM, 0,
                                            VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE))
                          .error,
                      0);
    ask = next_ask(&rm, NULL, &fd);
    ck_assert_uint_eq(rm.flags, VN_WIRE_REGION_MAP_FLAG_MAP);
    ck_assert_int_ge(fd, 0);
    close(fd);
    answer(&ask, 0);
}
END_TEST

START_TEST(test_client_without_capability_stays_trapped)
{
    VnTransportMsg m;

    connect_port(0, false);
    connect_port(1, false);
    peer_translates();
    ck_assert_msg(!next(0, QUIET_MS, &m), "a client that did not offer it was asked to map");
    trapped_round_trip(0x300, "trapped!");
}
END_TEST

/* Memory the peer's IOMMU gives its function for reading only: a window onto it would let
 * port 0 write it, so it stays trapped, where each write is refused. */
START_TEST(test_read_only_memory_not_handed_over)
{
    VnTransportMsg m;

    connect_port(0, true);
    connect_port(1, false);
    ck_assert_uint_eq(reply(1, dma_map_peer(PEER_IOVA, PEER_MEM, 0, VFIO_DMA_MAP_FLAG_READ)).error,
                      0);
    peer_sets_translation(PEER_IOVA + MEM_AT);
    ck_assert_msg(!next(0, QUIET_MS, &m), "read-only memory was handed over");
    trapped_store(0x400, "readonly");
    ck_assert_mem_ne(rig.mem + MEM_AT + 0x400, "readonly", 8);
    ck_assert(next(1, 5000, &m)); /* left to port 1's host, whose IOMMU refuses it */
    ck_assert_uint_eq(hdr_of(&m).cmd, VN_CMD_DMA_WRITE);
    vn_transport_msg_clear(&m);
}
END_TEST

/* A client that refuses the map keeps a trapped window that still works, and is not asked
 * again for the same target (no loop of asks). */
START_TEST(test_refused_map_stays_trapped_and_is_not_asked_again)
{
    VnWireRegionMap rm;
    VnWireHdr ask;
    VnTransportMsg m;
    int fd;

    connect_port(0, true);
    connect_port(1, false);
    peer_translates();
    ask = next_ask(&rm, NULL, &fd);
    close(fd);
    answer(&ask, ENOSPC);
    trapped_round_trip(0x500, "refused!");
    ctrl32(1, VN_EPF_REG_ARGUMENT, 0); /* an event: the same target, not asked again */
    ck_assert_msg(!next(0, QUIET_MS, &m), "a refused map was asked again");
}
END_TEST

/* A client that never answers the take-back and goes: the peer's unmap is answered then. */
START_TEST(test_unmap_answered_when_silent_client_goes)
{
    VnWireDmaUnmap u = { .argsz = sizeof(u), .iova = PEER_IOVA, .size = PEER_MEM };
    VnWireRegionMap rm;
    VnTransportMsg m;
    uint16_t id;
    int fd;

    window_handed_over();
    id = send_cmd(1, VN_CMD_DMA_UNMAP, &u, sizeof(u), -1);
    (void)next_ask(&rm, NULL, &fd); /* asked to take it back: never answered */
    ck_assert_uint_eq(rm.flags, 0);
    ck_assert(!next(1, QUIET_MS, &m));
    g_clear_pointer(&rig.c[0], vn_transport_free);
    ck_assert_uint_eq(reply(1, id).error, 0);
}
END_TEST

/* Where page @i of the scattered buffer is: the pages in reverse, but for the middle two,
 * which the IOMMU happened to map in order. */
static uint64_t scattered_page(unsigned i)
{
    unsigned pages = WINDOW / 4096;

    return i == pages / 2 - 1 || i == pages / 2 ? i : pages - 1 - i;
}

/* The peer's buffer is scattered in its RAM, as a buffer behind an IOMMU is (its pages
 * allocated one by one, mapped contiguously for the device): the window is handed over in
 * pieces, each where the IOMMU put it, and a store through the window lands in the page the
 * peer's IOMMU maps at that address. */
START_TEST(test_scattered_buffer_handed_over_in_pieces)
{
    enum { PAGES = WINDOW / 4096 };
    VnWireRegionExtent ext[PAGES];
    VnWireRegionMap rm;
    VnWireHdr ask;
    uint8_t *win;
    int fd;

    connect_port(0, true);
    connect_port(1, false);
    for (unsigned i = 0; i < PAGES; i++) {
        uint64_t page = scattered_page(i);

        ck_assert_uint_eq(reply(1, dma_map_peer(PEER_IOVA + i * 4096ull, 4096, page * 4096,
                                                VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE))
                              .error,
                          0);
    }
    peer_sets_translation(PEER_IOVA);
    ask = next_ask(&rm, ext, &fd);
    ck_assert_uint_eq(rm.flags, VN_WIRE_REGION_MAP_FLAG_MAP);
    ck_assert_uint_eq(rm.nr_extents, PAGES - 1); /* the two in order are one piece */
    win = map_like_qemu(&rm, ext, fd);
    close(fd);
    answer(&ask, 0);
    for (unsigned i = 0; i < PAGES; i++) {
        uint64_t page = scattered_page(i);

        memcpy(win + i * 4096ull + 8, &i, sizeof(i));
        ck_assert_mem_eq(rig.mem + page * 4096 + 8, &i, sizeof(i));
    }
    munmap(win, WINDOW);
}
END_TEST

/* A translation half in one memory and half in another (two memfds: what no single mapping
 * of the client's can hold) stays trapped, and its accesses still reach both. */
START_TEST(test_translation_across_two_memories_stays_trapped)
{
    int other = vn_peerfd_memfd_new("other-ram", WINDOW);
    VnWireDmaMap dm = { .argsz = sizeof(dm),
                        .flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
                        .offset = 0,
                        .iova = PEER_IOVA + WINDOW / 2,
                        .size = WINDOW / 2 };
    VnTransportMsg m;

    ck_assert_int_ge(other, 0);
    connect_port(0, true);
    connect_port(1, false);
    ck_assert_uint_eq(reply(1, dma_map_peer(PEER_IOVA, WINDOW / 2, 0,
                                            VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE))
                          .error,
                      0);
    ck_assert_uint_eq(reply(1, send_cmd(1, VN_CMD_DMA_MAP, &dm, sizeof(dm), other)).error, 0);
    close(other);
    peer_sets_translation(PEER_IOVA);
    ck_assert_msg(!next(0, QUIET_MS, &m), "a window across two memories was handed over");
    trapped_store(0x10, "first!!!");
    ck_assert_mem_eq(rig.mem + 0x10, "first!!!", 8);
}
END_TEST

/* A client that refuses to take a window back may still reach the memory: it is dropped,
 * and only then is the peer's unmap answered. */
START_TEST(test_refused_take_back_drops_client)
{
    VnWireDmaUnmap u = { .argsz = sizeof(u), .iova = PEER_IOVA, .size = PEER_MEM };
    VnTransportMsg m = { 0 };
    VnWireRegionMap rm;
    VnWireHdr ask;
    uint16_t id;
    int fd;

    window_handed_over();
    id = send_cmd(1, VN_CMD_DMA_UNMAP, &u, sizeof(u), -1);
    ask = next_ask(&rm, NULL, &fd);
    ck_assert_uint_eq(rm.flags, 0);
    ck_assert(!next(1, QUIET_MS, &m));
    answer(&ask, EBUSY);
    ck_assert_msg(port0_dropped(), "a client that kept its window was not dropped");
    ck_assert_uint_eq(reply(1, id).error, 0);
}
END_TEST

static gboolean mapping_off(gpointer data)
{
    vn_ntbdev_set_mapping(rig.dev, false);
    g_atomic_int_set((gint *)data, 1);
    return G_SOURCE_REMOVE;
}

/* --trap-windows (SIGUSR2): a mapped window is taken back, and its accesses are messages
 * that still reach the peer's memory. */
START_TEST(test_mapping_off_traps_mapped_window)
{
    VnWireRegionMap rm;
    VnWireHdr ask;
    gint done = 0;
    int fd;

    window_handed_over();
    g_main_context_invoke(rig.ctx, mapping_off, &done);
    ask = next_ask(&rm, NULL, &fd);
    ck_assert_uint_eq(rm.flags, 0);
    ck_assert_int_eq(fd, -1);
    answer(&ask, 0);
    ck_assert(g_atomic_int_get(&done));
    trapped_round_trip(0x600, "trapped!");
}
END_TEST

/* A client that answers an ask nobody made is confused or hostile: it is dropped. */
START_TEST(test_answer_to_no_ask_drops_client)
{
    VnWireHdr forged = { .id = 999, .cmd = VN_CMD_X_REGION_MAP, .size = VN_WIRE_HDR_SIZE };

    connect_port(0, true);
    answer(&forged, 0);
    ck_assert(port0_dropped());
}
END_TEST

static Suite *ntbdev_suite(void)
{
    Suite *s = suite_create("ntbdev");
    TCase *tc = tcase_create("windows");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_window_handed_over_then_taken_back_before_unmap);
    tcase_add_test(tc, test_scattered_buffer_handed_over_in_pieces);
    tcase_add_test(tc, test_client_without_capability_stays_trapped);
    tcase_add_test(tc, test_read_only_memory_not_handed_over);
    tcase_add_test(tc, test_refused_map_stays_trapped_and_is_not_asked_again);
    tcase_add_test(tc, test_unmap_answered_when_silent_client_goes);
    tcase_add_test(tc, test_refused_take_back_drops_client);
    tcase_add_test(tc, test_mapping_off_traps_mapped_window);
    tcase_add_test(tc, test_translation_across_two_memories_stays_trapped);
    tcase_add_test(tc, test_answer_to_no_ask_drops_client);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(ntbdev_suite());
}
