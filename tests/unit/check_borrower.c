/*
 * Unit tests of the borrower (vfio-ntb/borrower/borrower.c): what QEMU sees of
 * a borrowed device, the device-request interrupt it may register, and what
 * happens when the lender goes.  The device and the lender are lender-rig.h's;
 * the borrower gets a thread of its own ("borrower": fabric node "b" and the
 * VnBorrower share its context), because the test plays QEMU with the
 * blocking vfio-user client.
 */
#include "lender-rig.h"

#include "borrower/borrower.h"
#include "vfio-user/client.h"

#include "common/util.h"

#include <fcntl.h>
#include <linux/pci_regs.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#define VM_SOCK_NAME "vm.sock"

static struct {
    Loop loop;
    VnFabric *fab;
    VnBorrower *b;
    char *sock;
    /* The borrower's node's window limits ("max-window-size" and
     * "max-windows"; NULL: the default), and why the borrower was not
     * made, when it was not. */
    const char *window_size, *windows;
    char *refusal;
} bor;

static void bor_on_link(void *opaque, const char *peer, bool up)
{
    if (!up && bor.b != NULL && strcmp(peer, vn_borrower_lender(bor.b)) == 0) {
        vn_borrower_lender_down(bor.b);
    }
}

static const VnFabricHandlers bor_handlers = {
    .on_link = bor_on_link,
};

/* The start's end, in the borrower's thread; started tells the test's. */
static gint bor_started;

static void bor_on_started(void *opaque, VnBorrower *b, const GError *error)
{
    bor.b = b;
    bor.refusal = error != NULL ? g_strdup(error->message) : NULL;
    g_atomic_int_set(&bor_started, 1);
}

/* Until the start in the borrower's thread has ended (it answers from its loop). */
static void bor_wait_started(void)
{
    for (int i = 0; i < 10000 && !g_atomic_int_get(&bor_started); i++) {
        g_usleep(1000);
    }
    ck_assert_msg(g_atomic_int_get(&bor_started), "the borrower did not start in 10 s");
}

static void bor_open(void *data)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;

    g_hash_table_insert(params, "dir", rig.fabric_dir);
    g_hash_table_insert(params, "request-timeout-ms", "3000");
    if (bor.window_size != NULL) {
        g_hash_table_insert(params, "max-window-size", (char *)bor.window_size);
    }
    if (bor.windows != NULL) {
        g_hash_table_insert(params, "max-windows", (char *)bor.windows);
    }
    bor.fab = vn_fabric_open("shm", "b", params, &bor_handlers, NULL, bor.loop.ctx, &error);
    ck_assert_msg(bor.fab != NULL, "%s", error ? error->message : "");
    ck_assert_msg(vn_fabric_connect(bor.fab, "lender", &error), "%s", error ? error->message : "");
    g_atomic_int_set(&bor_started, 0);
    vn_borrower_start(bor.fab, "lender", DEV, VN_IRQ_MODE_FD, bor.sock, -1, bor.loop.ctx,
                      bor_on_started, NULL);
}

static void bor_close(void *data)
{
    g_clear_pointer(&bor.b, vn_borrower_free);
    g_clear_pointer(&bor.fab, vn_fabric_close);
}

static void bor_setup_limited(const char *window_size, const char *windows)
{
    setup();
    memset(&bor, 0, sizeof(bor));
    bor.window_size = window_size;
    bor.windows = windows;
    bor.sock = g_build_filename(rig.dir, VM_SOCK_NAME, NULL);
    bor.loop.ctx = g_main_context_new();
    loop_start(&bor.loop, "borrower");
    on_loop(&bor.loop, bor_open, NULL);
    bor_wait_started();
    if (windows == NULL) {
        ck_assert_msg(bor.b != NULL, "%s", bor.refusal ? bor.refusal : "");
    }
}

static void bor_setup(void)
{
    bor_setup_limited(NULL, NULL);
}

/* Windows of 4 KiB: BAR0 (16 KiB) takes 4 of them. */
static void bor_setup_small_windows(void)
{
    bor_setup_limited("4096", NULL);
}

/* The same, with room for 2 windows only. */
static void bor_setup_two_windows(void)
{
    bor_setup_limited("4096", "2");
}

/* Windows of 4 KiB, 4 of them: all BAR0's, none left for BAR1 (registers, 256 bytes). */
static void bor_setup_small_bar(void)
{
    rig_small_bar = true;
    bor_setup_limited("4096", "4");
}

/* A device whose BAR2 is 0x300 bytes. */
static void bor_setup_odd_bar(void)
{
    rig_odd_bar = true;
    bor_setup_limited(NULL, NULL);
}

static void bor_teardown(void)
{
    on_loop(&bor.loop, bor_close, NULL);
    loop_stop(&bor.loop);
    g_free(bor.sock);
    g_free(bor.refusal);
    teardown();
    rig_small_bar = false;
    rig_odd_bar = false;
}

/* QEMU's side: connected, or failing the test. */
static VnClient *qemu_connect(void)
{
    g_autoptr(GError) error = NULL;
    VnClient *c = vn_client_connect(bor.sock, 3000, &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    return c;
}

/* Calls into the borrower, in its thread. */
typedef struct Ask {
    bool can, sent;
    VnBorrowerStats st;
} Ask;

static void ask_fn(void *data)
{
    Ask *a = data;

    a->can = vn_borrower_can_request_unplug(bor.b);
    vn_borrower_stats(bor.b, &a->st);
}

static void request_fn(void *data)
{
    Ask *a = data;

    a->sent = vn_borrower_request_unplug(bor.b);
    ask_fn(data);
}

static Ask ask(void)
{
    Ask a = { 0 };

    on_loop(&bor.loop, ask_fn, &a);
    return a;
}

static Ask request_unplug(void)
{
    Ask a = { 0 };

    on_loop(&bor.loop, request_fn, &a);
    return a;
}

/* The eventfd's count, waiting at most @ms for it to be signalled (0 if not). */
static uint64_t req_count(int fd, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    uint64_t n = 0;

    if (poll(&p, 1, ms) == 1 && read(fd, &n, sizeof(n)) != sizeof(n)) {
        n = 0;
    }
    return n;
}

static int req_register(VnClient *c, int fd)
{
    return vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_REQ_IRQ_INDEX, 0, 1, NULL, &fd);
}

/* ---- what QEMU sees ----------------------------------------------------- */

/* The device's own interrupts and regions, plus one device-request vector
 * that the borrower offers whatever the device has. */
START_TEST(test_describes_device)
{
    g_autoptr(VnClient) c = qemu_connect();
    struct vfio_irq_info irq = { 0 };
    struct vfio_region_info reg = { 0 };
    VnWireDeviceInfo info = { 0 };
    int fd = -1;

    ck_assert_int_eq(vn_client_get_info(c, &info), 0);
    ck_assert(info.flags & VFIO_DEVICE_FLAGS_PCI);
    ck_assert_uint_gt(info.num_irqs, VFIO_PCI_REQ_IRQ_INDEX);
    ck_assert_int_eq(vn_client_get_irq_info(c, VFIO_PCI_MSIX_IRQ_INDEX, &irq), 0);
    ck_assert_uint_eq(irq.count, MSIX_VECTORS);
    ck_assert_int_eq(vn_client_get_irq_info(c, VFIO_PCI_REQ_IRQ_INDEX, &irq), 0);
    ck_assert_uint_eq(irq.count, 1);
    ck_assert(irq.flags & VFIO_IRQ_INFO_EVENTFD);
    /* BAR0 is offered as the fabric window's fd: QEMU maps the device. */
    ck_assert_int_eq(vn_client_get_region_info(c, 0, &reg, &fd, NULL, 0, NULL), 0);
    ck_assert_uint_eq(reg.size, BAR0_SIZE);
    ck_assert(reg.flags & VFIO_REGION_INFO_FLAG_MMAP);
    ck_assert_int_ge(fd, 0);
    close(fd);
}
END_TEST

static void send_config(VnClient *c, uint16_t id, uint16_t cmd, uint64_t offset, uint32_t count,
                        const void *data)
{
    g_autoptr(GByteArray) m = g_byte_array_new();
    VnWireRegionRw rw = { .offset = offset,
                          .region = VFIO_PCI_CONFIG_REGION_INDEX,
                          .count = count };

    vn_wire_begin(m, id, cmd, 0);
    g_byte_array_append(m, (const guint8 *)&rw, sizeof(rw));
    if (data != NULL) {
        g_byte_array_append(m, data, count);
    }
    vn_wire_finish(m);
    ck_assert_int_eq(vn_client_raw(c, m->data, m->len, NULL, 0, NULL), 0);
}

/* QEMU's reply to @id, next in turn, and its first byte of data (a read's). */
static uint8_t config_reply(VnClient *c, uint16_t id)
{
    g_autoptr(GByteArray) m = NULL;
    VnWireHdr h;

    ck_assert_int_eq(vn_client_raw(c, NULL, 0, NULL, 0, &m), 0);
    ck_assert_uint_ge(m->len, sizeof(h) + sizeof(VnWireRegionRw));
    memcpy(&h, m->data, sizeof(h));
    ck_assert_uint_eq(h.id, id);
    ck_assert_uint_eq(h.flags & VN_WIRE_FLAG_ERROR, 0);
    return m->len > sizeof(h) + sizeof(VnWireRegionRw) ? m->data[sizeof(h) + sizeof(VnWireRegionRw)]
                                                       : 0;
}

/* A config read answered once the lender has (the device's bytes) shows the borrower's own
 * bytes as they were when QEMU asked: the Interrupt Line QEMU writes right after the read
 * (answered at once, here) is in the next read, not in that one. */
START_TEST(test_config_read_sees_its_moment)
{
    g_autoptr(VnClient) c = qemu_connect();
    uint8_t line = 0x42, before;

    send_config(c, 1, VN_CMD_REGION_READ, PCI_INTERRUPT_LINE, 4, NULL);
    send_config(c, 2, VN_CMD_REGION_WRITE, PCI_INTERRUPT_LINE, 1, &line);
    send_config(c, 3, VN_CMD_REGION_READ, PCI_INTERRUPT_LINE, 4, NULL);
    before = config_reply(c, 1);
    ck_assert_uint_ne(before, 0x42);
    config_reply(c, 2);
    ck_assert_uint_eq(config_reply(c, 3), 0x42);
}
END_TEST

/* The expansion ROM: QEMU sizes the ROM BAR (kept by the borrower, sized like
 * the lender's ROM region) and reads the ROM's bytes through the ROM region;
 * the device's own ROM BAR is never written. */
START_TEST(test_expansion_rom)
{
    g_autoptr(VnClient) c = qemu_connect();
    struct vfio_region_info reg = { 0 };
    uint32_t v = 0xffffffffu, got = 0;
    uint8_t head[4], tail[2];
    int fd = -1;

    ck_assert_int_eq(
        vn_client_get_region_info(c, VFIO_PCI_ROM_REGION_INDEX, &reg, &fd, NULL, 0, NULL), 0);
    ck_assert_uint_eq(reg.size, ROM_SIZE);
    ck_assert_int_lt(fd, 0); /* read through messages: rarely, once */
    ck_assert_int_eq(
        vn_client_region_write(c, VFIO_PCI_CONFIG_REGION_INDEX, PCI_ROM_ADDRESS, &v, 4, false), 4);
    ck_assert_int_eq(
        vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, PCI_ROM_ADDRESS, &got, 4), 4);
    ck_assert_uint_eq(got, ~(ROM_SIZE - 1) | PCI_ROM_ADDRESS_ENABLE);
    v = 0xfeb00001u;
    ck_assert_int_eq(
        vn_client_region_write(c, VFIO_PCI_CONFIG_REGION_INDEX, PCI_ROM_ADDRESS, &v, 4, false), 4);
    ck_assert_int_eq(
        vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, PCI_ROM_ADDRESS, &got, 4), 4);
    ck_assert_uint_eq(got, 0xfeb00001u);
    ck_assert_uint_eq(rig.fake.cfg[PCI_ROM_ADDRESS], 0); /* the lender's alone */
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_ROM_REGION_INDEX, 0, head, 4), 4);
    ck_assert_uint_eq(head[0], 0x55);
    ck_assert_uint_eq(head[1], 0xaa);
    ck_assert_uint_eq(head[2], (uint8_t)(2 * 7));
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_ROM_REGION_INDEX, ROM_SIZE - 2, tail, 2), 2);
    ck_assert_uint_eq(tail[1], (uint8_t)((ROM_SIZE - 1) * 7));
}
END_TEST

/* ---- a BAR larger than a window ----------------------------------------- */

/* QEMU gets one fd for the whole BAR although it crossed as 4 windows: a
 * mapping of it reaches every part of the device's BAR; a trapped access
 * inside one window is served from it, one across two goes to the lender. */
START_TEST(test_large_bar_one_mapping)
{
    g_autoptr(VnClient) c = qemu_connect();
    struct vfio_region_info reg = { 0 };
    uint8_t got[4];
    uint8_t *bar;
    Ask a;
    int fd = -1;

    ck_assert_uint_eq(vn_fabric_windows_in_use(bor.fab), 4);
    ck_assert_int_eq(vn_client_get_region_info(c, 0, &reg, &fd, NULL, 0, NULL), 0);
    ck_assert(reg.flags & VFIO_REGION_INFO_FLAG_MMAP);
    ck_assert_int_ge(fd, 0);
    bar = mmap(NULL, BAR0_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)reg.offset);
    ck_assert(bar != MAP_FAILED);
    for (uint32_t k = 0; k < 4; k++) {
        bar[k * 0x1000 + 0x10] = (uint8_t)(0xc0 + k);
        ck_assert_uint_eq(rig.fake.bar[k * 0x1000 + 0x10], 0xc0 + k);
    }
    rig.fake.bar[0x3ffc] = 0x77;
    ck_assert_uint_eq(bar[0x3ffc], 0x77);
    munmap(bar, BAR0_SIZE);
    close(fd);

    rig.fake.bar[0x1010] = 0x5e;
    ck_assert_int_eq(vn_client_region_read(c, 0, 0x1010, got, 1), 1);
    ck_assert_uint_eq(got[0], 0x5e);
    a = ask();
    ck_assert_uint_eq(a.st.region_forwarded, 0);
    memcpy(&rig.fake.bar[0x0ffe], "\x01\x02\x03\x04", 4);
    ck_assert_int_eq(vn_client_region_read(c, 0, 0x0ffe, got, 4), 4);
    ck_assert_int_eq(memcmp(got, "\x01\x02\x03\x04", 4), 0);
    a = ask();
    ck_assert_uint_eq(a.st.region_forwarded, 1);
}
END_TEST

/* A BAR that needs more windows than the host has: no device, and the
 * refusal names the BAR, what it needs and the budget. */
START_TEST(test_large_bar_over_budget)
{
    ck_assert_ptr_null(bor.b);
    ck_assert_ptr_nonnull(bor.refusal);
    ck_assert_msg(strstr(bor.refusal, "BAR0") != NULL &&
                      strstr(bor.refusal, "needs 4 windows") != NULL &&
                      strstr(bor.refusal, "max-windows") != NULL,
                  "%s", bor.refusal);
    ck_assert_uint_eq(vn_fabric_windows_in_use(bor.fab), 0);
}
END_TEST

/* A BAR of less than a page that finds no window left stays trapped: the device is still
 * borrowed, its large BAR mapped (the largest BAR is mapped first: all 4 windows), the small
 * one served through the lender. */
START_TEST(test_small_bar_trapped)
{
    g_autoptr(VnClient) c = qemu_connect();
    struct vfio_region_info reg = { 0 };
    uint8_t got[4];
    int fd = -1;
    Ask a;

    ck_assert_msg(bor.b != NULL, "%s", bor.refusal);
    ck_assert_uint_eq(vn_fabric_windows_in_use(bor.fab), 4);
    ck_assert_int_eq(vn_client_get_region_info(c, 0, &reg, &fd, NULL, 0, NULL), 0);
    ck_assert(reg.flags & VFIO_REGION_INFO_FLAG_MMAP);
    close(fd);
    fd = -1;
    ck_assert_int_eq(vn_client_get_region_info(c, 1, &reg, &fd, NULL, 0, NULL), 0);
    ck_assert_uint_eq(reg.size, SMALL_BAR_SIZE);
    ck_assert(!(reg.flags & VFIO_REGION_INFO_FLAG_MMAP));
    ck_assert_int_eq(fd, -1);
    memcpy(rig.fake.regs + 0x10, "\x0a\x0b\x0c\x0d", 4);
    ck_assert_int_eq(vn_client_region_read(c, 1, 0x10, got, 4), 4);
    ck_assert_int_eq(memcmp(got, "\x0a\x0b\x0c\x0d", 4), 0);
    a = ask();
    ck_assert_uint_eq(a.st.region_forwarded, 1);
}
END_TEST

/* A write to a trapped BAR is posted: QEMU is answered before the lender, yet the read that
 * follows it sees it, every time; a write the device refuses is counted, not answered to
 * QEMU as an error (a posted write's is not). */
START_TEST(test_trapped_writes_posted)
{
    g_autoptr(VnClient) c = qemu_connect();
    uint32_t got;
    Ask a;

    ck_assert_msg(bor.b != NULL, "%s", bor.refusal);
    for (uint32_t k = 1; k <= 100; k++) {
        uint32_t v = k * 0x01010101u;

        ck_assert_int_eq(vn_client_region_write(c, 1, 0x20, &v, 4, false), 4);
        ck_assert_int_eq(vn_client_region_read(c, 1, 0x20, &got, 4), 4);
        ck_assert_uint_eq(got, v);
    }
    a = ask();
    ck_assert_uint_eq(a.st.posted_writes, 100);
    ck_assert_uint_eq(a.st.posted_write_failures, 0);
    /* Where the device refuses writes: still 0 for QEMU, and counted once answered (the read
     * after it is answered after it). */
    got = 0x5a5a5a5a;
    ck_assert_int_eq(vn_client_region_write(c, 1, SMALL_BAR_WRITABLE, &got, 4, false), 4);
    ck_assert_int_eq(vn_client_region_read(c, 1, 0x20, &got, 4), 4);
    a = ask();
    ck_assert_uint_eq(a.st.posted_writes, 101);
    ck_assert_uint_eq(a.st.posted_write_failures, 1);
}
END_TEST

typedef struct SlowRead {
    VnClient *c;
    uint32_t got;
    gint ret;
    gint done;
} SlowRead;

static gpointer slow_read(gpointer data)
{
    SlowRead *r = data;

    g_atomic_int_set(&r->ret, vn_client_region_read(r->c, 1, SMALL_BAR_GATED, &r->got, 4));
    g_atomic_int_set(&r->done, 1);
    return NULL;
}

/* A trapped BAR read the device takes its time over does not hold the borrower's loop: the
 * worker answers its daemon meanwhile (its stats here), and QEMU gets the device's bytes
 * once they come. */
START_TEST(test_slow_read_leaves_loop_free)
{
    SlowRead r = { .c = qemu_connect() };
    GThread *t;
    Ask a;

    ck_assert_msg(bor.b != NULL, "%s", bor.refusal);
    memcpy(rig.fake.regs + SMALL_BAR_GATED, "\x11\x22\x33\x44", 4);
    rig_gate_set(true);
    t = g_thread_new("qemu-read", slow_read, &r);
    ck_assert(rig_gate_wait_reached(3000)); /* the read is at the device, held there */
    a = ask();                              /* on the borrower's loop */
    ck_assert_uint_eq(a.st.region_forwarded, 1);
    ck_assert(!g_atomic_int_get(&r.done)); /* answered while QEMU's read still waits */
    rig_gate_set(false);
    g_thread_join(t);
    ck_assert_int_eq(g_atomic_int_get(&r.ret), 4);
    ck_assert_int_eq(memcmp(&r.got, "\x11\x22\x33\x44", 4), 0);
    vn_client_free(r.c);
}
END_TEST

/* A borrower that goes (its worker stopped) while QEMU's trapped read waits for the lender:
 * the answer that comes later finds nobody (no use of the gone borrower: ASan runs this),
 * and QEMU's read ends with an error, not a wait for ever. */
START_TEST(test_borrower_goes_mid_read)
{
    SlowRead r = { .c = qemu_connect() };
    GThread *t;

    ck_assert_msg(bor.b != NULL, "%s", bor.refusal);
    rig_gate_set(true);
    t = g_thread_new("qemu-read", slow_read, &r);
    ck_assert(rig_gate_wait_reached(3000));
    on_loop(&bor.loop, bor_close, NULL);
    rig_gate_set(false); /* the lender answers now, to a node that is gone */
    g_thread_join(t);
    ck_assert_int_lt(g_atomic_int_get(&r.ret), 0);
    vn_client_free(r.c);
}
END_TEST

/* ---- the device request ------------------------------------------------- */

/* Only a QEMU that registered the REQ eventfd can be asked; asking signals
 * it once and is counted; the lender's device never hears of REQ. */
START_TEST(test_request_unplug)
{
    g_autoptr(VnClient) c = qemu_connect();
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    Ask a;

    ck_assert_int_ge(efd, 0);
    a = request_unplug();
    ck_assert(!a.can);
    ck_assert(!a.sent);
    ck_assert_uint_eq(a.st.unplug_requests, 0);

    ck_assert_int_eq(req_register(c, efd), 0);
    a = ask();
    ck_assert(a.can);
    a = request_unplug();
    ck_assert(a.sent);
    ck_assert_uint_eq(a.st.unplug_requests, 1);
    ck_assert_uint_eq(req_count(efd, 1000), 1);
    ck_assert_int_eq(g_atomic_int_get(&rig.fake.irq_changes[VFIO_PCI_REQ_IRQ_INDEX]), 0);

    /* QEMU takes the eventfd back (DATA_NONE, count 0): nothing to ask. */
    ck_assert_int_eq(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                                        VFIO_PCI_REQ_IRQ_INDEX, 0, 0, NULL, NULL),
                     0);
    a = request_unplug();
    ck_assert(!a.can);
    ck_assert(!a.sent);
    ck_assert_uint_eq(req_count(efd, 50), 0);
    close(efd);
}
END_TEST

/* Out-of-range REQ vectors are refused and change nothing. */
START_TEST(test_request_bad_range)
{
    g_autoptr(VnClient) c = qemu_connect();
    int efd[2] = { eventfd(0, EFD_CLOEXEC), eventfd(0, EFD_CLOEXEC) };

    ck_assert_int_lt(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                                        VFIO_PCI_REQ_IRQ_INDEX, 0, 2, NULL, efd),
                     0);
    ck_assert_int_lt(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                                        VFIO_PCI_REQ_IRQ_INDEX, 1, 1, NULL, efd),
                     0);
    ck_assert_int_lt(vn_client_set_irqs(c, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                                        VFIO_PCI_REQ_IRQ_INDEX, UINT32_MAX, 1, NULL, efd),
                     0);
    ck_assert(!ask().can);
    close(efd[0]);
    close(efd[1]);
}
END_TEST

/* A QEMU that goes away takes its registration with it. */
START_TEST(test_request_after_disconnect)
{
    VnClient *c = qemu_connect();
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    gint64 end;

    ck_assert_int_eq(req_register(c, efd), 0);
    ck_assert(ask().can);
    vn_client_free(c);
    end = now_ms() + 3000;
    while (ask().can && now_ms() < end) {
        g_usleep(2000);
    }
    ck_assert(!request_unplug().sent);
    ck_assert_uint_eq(req_count(efd, 50), 0);
    close(efd);
}
END_TEST

/* ---- losing the lender -------------------------------------------------- */

/* The lender's node goes: reads of what the borrower serves become
 * all-ones, writes are dropped, the loss is counted, and the QEMU that takes
 * device requests is asked to unplug the device. */
START_TEST(test_lender_lost)
{
    g_autoptr(VnClient) c = qemu_connect();
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    uint32_t v = 0;
    gint64 end;
    Ask a;

    ck_assert_int_eq(req_register(c, efd), 0);
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, 0, &v, 4), 4);
    ck_assert_uint_ne(v, 0xffffffffu);

    on_loop(&rig.lend, lender_close, NULL);
    end = now_ms() + 5000;
    while (!(a = ask()).st.lender_lost && now_ms() < end) {
        g_usleep(5000);
    }
    ck_assert(a.st.lender_lost);
    ck_assert_uint_eq(a.st.unplug_requests, 1);
    ck_assert_uint_eq(req_count(efd, 1000), 1);

    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, 0, &v, 4), 4);
    ck_assert_uint_eq(v, 0xffffffffu);
    ck_assert_int_eq(vn_client_region_read(c, 0, 0x10, &v, 4), 4);
    ck_assert_uint_eq(v, 0xffffffffu);
    v = 0x12345678;
    ck_assert_int_ge(vn_client_region_write(c, 0, 0x10, &v, 4, false), 4);
    ck_assert_uint_ne(rig.fake.bar[0x10], 0x78);
    /* Asked once: a second loss report changes nothing. */
    on_loop(&bor.loop, (void (*)(void *))vn_borrower_lender_down, bor.b);
    ck_assert_uint_eq(ask().st.unplug_requests, 1);
    close(efd);
}
END_TEST

/* A BAR a device server sizes other than a power of two (QEMU asserts on such a BAR) is
 * shown as the next power of two: the device's own bytes read through, past them reads are
 * all-ones and writes reach nothing. */
START_TEST(test_odd_bar_rounded_up)
{
    g_autoptr(VnClient) c = qemu_connect();
    struct vfio_region_info ri;
    uint8_t in[4], mark[4] = { 1, 2, 3, 4 };
    int fd = -1;

    ck_assert_int_eq(
        vn_client_get_region_info(c, VFIO_PCI_BAR2_REGION_INDEX, &ri, &fd, NULL, 0, NULL), 0);
    ck_assert_uint_eq(ri.size, 0x400);
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_BAR2_REGION_INDEX, 0x2fc, in, 4), 4);
    ck_assert_mem_eq(in, "\xfc\xfd\xfe\xff", 4);
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_BAR2_REGION_INDEX, 0x300, in, 4), 4);
    ck_assert_mem_eq(in, "\xff\xff\xff\xff", 4);
    ck_assert_int_ge(vn_client_region_write(c, VFIO_PCI_BAR2_REGION_INDEX, 0x3fc, mark, 4, false),
                     0);
    ck_assert_int_ge(vn_client_region_write(c, VFIO_PCI_BAR2_REGION_INDEX, 0x10, mark, 4, false),
                     0);
    /* The write is posted: a read after it is answered once it reached the device. */
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_BAR2_REGION_INDEX, 0x10, in, 4), 4);
    ck_assert_int_eq(g_atomic_int_get(&rig.fake.odd_writes), 1);
}
END_TEST

/* ---- a worker that takes over a dead one's QEMU --------------------------- */

typedef struct TakeOver {
    const char *handoff;
    VnBorrower *b;
    char *error;
    gint done; /* set in the borrower's thread */
    VnBorrowerStats st;
} TakeOver;

static void taken_over(void *opaque, VnBorrower *b, const GError *error)
{
    TakeOver *t = opaque;

    t->b = b;
    t->error = error != NULL ? g_strdup(error->message) : NULL;
    g_atomic_int_set(&t->done, 1);
}

/* Until taken_over() was told (the borrower's loop runs meanwhile). */
static void take_over_wait(TakeOver *t)
{
    for (int i = 0; i < 10000 && !g_atomic_int_get(&t->done); i++) {
        g_usleep(1000);
    }
    ck_assert_msg(g_atomic_int_get(&t->done), "the take over did not end in 10 s");
}

static void take_over_fn(void *data)
{
    TakeOver *t = data;
    g_autofree char *path = g_build_filename(rig.dir, "taken.sock", NULL);
    int fd = memfd_create("handoff", MFD_CLOEXEC);

    ck_assert_int_eq(write(fd, t->handoff, strlen(t->handoff)), (ssize_t)strlen(t->handoff));
    vn_borrower_start(bor.fab, "lender", DEV, VN_IRQ_MODE_FD, path, fd, bor.loop.ctx, taken_over,
                      t);
}

/* A listening UNIX socket's fd, as a dead worker's would be. */
static int listening(void)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    g_autofree char *path = g_build_filename(rig.dir, "dead.sock", NULL);

    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    unlink(path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(fd, 1), 0);
    return fd;
}

/* @fd's other end is closed (at once: whoever closed it told its caller after). */
static bool peer_hung_up(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };

    return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

/* A connection to @path is accepted into a backlog: something listens there still. */
static bool dials(const char *path)
{
    int fd = vn_util_dial_unix(path);

    if (fd >= 0) {
        close(fd);
    }
    return fd >= 0;
}

/* The handoff is the daemon's, the state in it a dead worker's: neither is trusted.  Text
 * that is no handoff, an fd that is not open, a socket that does not listen, mappings that
 * name no segment or overlap, a route for a vector the device lacks, doorbell bits out of
 * range: each is refused, naming what was wrong, and nothing is served. */
/* A refused takeover lets go of the attachment (the daemon detaches then): attached again,
 * for the next case. */
static void attach_again_fn(void *data)
{
    VnProtoAttach a = { .irq_mode = VN_IRQ_MODE_FD };
    g_autofree char *json = NULL;
    g_autoptr(VnFabricMsg) reply = NULL;

    g_strlcpy(a.device, DEV, sizeof(a.device));
    json = vn_proto_attach_to_json(&a);
    ck_assert_int_eq(fw_request(bor.fab, "lender", VN_PROTO_ATTACH, json, NULL, 0, &reply), 0);
}

/* The handoff is the daemon's, the state in it a dead worker's: neither is trusted.  Text
 * that is no handoff, an fd that is not open, a socket that does not listen, mappings that
 * name no segment or overlap (lingering ones too), a route for a vector the device lacks,
 * doorbell bits out of range: each is refused, naming what was wrong, and nothing is served. */
START_TEST(test_take_over_refuses_bad_handoffs)
{
    g_autofree char *dead_path = g_build_filename(rig.dir, "dead.sock", NULL);
    int pair[2];
    struct {
        const char *state; /* with a listening socket under key 1; NULL: @handoff as is */
        const char *handoff;
        const char *why;
    } cases[] = {
        { NULL, "[1,2", "the handoff" },
        { NULL, "{\"state\":\"{}\",\"fds\":{\"1\":999}}", "is not open" },
        { NULL, "{\"state\":\"{}\",\"fds\":{\"x\":5}}", "is not open" },
        { NULL, "{\"fds\":{}}", "no state" },
        { NULL, NULL, "no listening UNIX socket" }, /* a socketpair's end under key 1 */
        { "{\\\"caps\\\":[1,2]}", NULL, "caps 0" },
        { "{\\\"mappings\\\":[[4096,4096,3,77]]}", NULL, "mapping 0" },
        { "{\\\"segments\\\":[[1,2,5]],\\\"mappings\\\":[[4096,8192,3,5],"
          "[8192,4096,3,5]]}",
          NULL, "mapping 1" },
        { "{\\\"routes\\\":[[1,4000,9]]}", NULL, "route 0" },
        { "{\\\"relay\\\":[[0,0,70]]}", NULL, "relay 0" },
        { "{\\\"segments\\\":[[1,2,0]]}", NULL, "segment 0" },
        { "{\\\"lingering\\\":[[1,2]]}", NULL, "lingering 0" },
        /* Lingering mappings are checked as the others are: no overlap, no empty range. */
        { "{\\\"segments\\\":[[1,2,5]],\\\"mappings\\\":[[4096,8192,3,5],"
          "[8192,4096,3,5]],\\\"lingering\\\":[[8192]]}",
          NULL, "mapping 1" },
        { "{\\\"segments\\\":[[1,2,5]],\\\"mappings\\\":[[4096,0,3,5]],"
          "\\\"lingering\\\":[[4096]]}",
          NULL, "mapping 0" },
    };

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        int lfd = cases[i].handoff == NULL ? (cases[i].state != NULL ? listening() : pair[0]) : -1;
        g_autofree char *handoff =
            cases[i].handoff != NULL
                ? g_strdup(cases[i].handoff)
                : g_strdup_printf("{\"state\":\"%s\",\"fds\":{\"1\":%d}}",
                                  cases[i].state != NULL ? cases[i].state : "{}", lfd);
        TakeOver t = { .handoff = handoff };

        on_loop(&bor.loop, take_over_fn, &t);
        take_over_wait(&t);
        ck_assert_msg(t.b == NULL, "case %zu was taken", i);
        ck_assert_msg(t.error != NULL && strstr(t.error, cases[i].why) != NULL,
                      "case %zu: \"%s\" does not say \"%s\"", i, t.error ? t.error : "",
                      cases[i].why);
        /* What it was given, it closed: seen from the other end, as the fd's number may
         * be some other thread's new file already. */
        ck_assert_msg(lfd < 0 || (lfd == pair[0] ? peer_hung_up(pair[1]) : !dials(dead_path)),
                      "case %zu: fd %d is open still", i, lfd);
        g_free(t.error);
        on_loop(&bor.loop, attach_again_fn, NULL);
    }
    close(pair[1]);
    unlink(dead_path);
}
END_TEST

static void request_on_fn(void *data)
{
    TakeOver *t = data;

    t->error = vn_borrower_request_unplug(t->b) ? NULL : g_strdup("not asked");
}

static void free_taken_fn(void *data)
{
    g_clear_pointer(&((TakeOver *)data)->b, vn_borrower_free);
}

/* A takeover that works: the connection is served as it was (already negotiated), and the
 * eventfd QEMU gave the dead worker for the device request is the very one signalled. */
START_TEST(test_take_over_keeps_eventfds)
{
    g_autofree char *dead_path = g_build_filename(rig.dir, "dead.sock", NULL);
    int lfd = listening(), pair[2], efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    g_autofree char *handoff = NULL;
    TakeOver t = { 0 };

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    /* Key 0x4100: the device request's vector (index 4, vector 0). */
    handoff = g_strdup_printf("{\"state\":\"{\\\"caps\\\":[16,1048576,4096,1024],"
                              "\\\"int_line\\\":11}\",\"fds\":{\"1\":%d,\"2\":%d,"
                              "\"16640\":%d}}",
                              lfd, pair[0], dup(efd));
    t.handoff = handoff;
    on_loop(&bor.loop, take_over_fn, &t);
    take_over_wait(&t);
    ck_assert_msg(t.b != NULL, "%s", t.error ? t.error : "");
    on_loop(&bor.loop, request_on_fn, &t);
    ck_assert_msg(t.error == NULL, "%s", t.error ? t.error : "");
    ck_assert_uint_eq(req_count(efd, 1000), 1);
    on_loop(&bor.loop, free_taken_fn, &t);
    close(pair[1]);
    close(efd);
    unlink(dead_path);
}
END_TEST

static void taken_stats_fn(void *data)
{
    TakeOver *t = data;

    vn_borrower_stats(t->b, &t->st);
}

/* A mapping its QEMU had unmapped while it lingered at the lender (borrower.h) lingers in
 * the worker that takes over too: not in the vfio-user table, so QEMU can map over it. */
START_TEST(test_take_over_keeps_lingering)
{
    g_autofree char *dead_path = g_build_filename(rig.dir, "dead.sock", NULL);
    int lfd = listening(), pair[2], mem;
    g_autofree char *handoff = NULL;
    g_autoptr(GError) error = NULL;
    g_autoptr(VnClient) c = NULL;
    TakeOver t = { 0 };

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    handoff = g_strdup_printf("{\"state\":\"{\\\"caps\\\":[16,1048576,4096,1024],"
                              "\\\"segments\\\":[[1,2,5]],"
                              "\\\"mappings\\\":[[1048576,4096,3,5]],"
                              "\\\"lingering\\\":[[1048576]]}\",\"fds\":{\"1\":%d,\"2\":%d}}",
                              lfd, pair[0]);
    t.handoff = handoff;
    on_loop(&bor.loop, take_over_fn, &t);
    take_over_wait(&t);
    ck_assert_msg(t.b != NULL, "%s", t.error ? t.error : "");
    on_loop(&bor.loop, taken_stats_fn, &t);
    ck_assert_uint_eq(t.st.dma_lingering, 1);

    c = vn_client_new_fd(pair[1], "taken", 3000, &error);
    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    mem = memfd_create("guest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_eq(ftruncate(mem, 0x10000), 0);
    ck_assert_int_eq(fcntl(mem, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0, 3, mem), 0);
    on_loop(&bor.loop, taken_stats_fn, &t);
    ck_assert_uint_eq(t.st.dma_lingering, 0);
    ck_assert_uint_eq(t.st.dma_maps, 1);
    g_clear_pointer(&c, vn_client_free);
    on_loop(&bor.loop, free_taken_fn, &t);
    close(mem);
    unlink(dead_path);
}
END_TEST

static Suite *borrower_suite(void)
{
    Suite *s = suite_create("borrower");
    TCase *tc;

    tc = tcase_create("describe");
    tcase_add_checked_fixture(tc, bor_setup, bor_teardown);
    tcase_add_test(tc, test_describes_device);
    tcase_add_test(tc, test_expansion_rom);
    tcase_add_test(tc, test_config_read_sees_its_moment);
    suite_add_tcase(s, tc);

    tc = tcase_create("odd-bar");
    tcase_add_checked_fixture(tc, bor_setup_odd_bar, bor_teardown);
    tcase_add_test(tc, test_odd_bar_rounded_up);
    suite_add_tcase(s, tc);

    tc = tcase_create("large-bar");
    tcase_add_checked_fixture(tc, bor_setup_small_windows, bor_teardown);
    tcase_add_test(tc, test_large_bar_one_mapping);
    suite_add_tcase(s, tc);
    tc = tcase_create("window-budget");
    tcase_add_checked_fixture(tc, bor_setup_two_windows, bor_teardown);
    tcase_add_test(tc, test_large_bar_over_budget);
    suite_add_tcase(s, tc);
    tc = tcase_create("small-bar");
    tcase_add_checked_fixture(tc, bor_setup_small_bar, bor_teardown);
    tcase_add_test(tc, test_small_bar_trapped);
    tcase_add_test(tc, test_trapped_writes_posted);
    tcase_add_test(tc, test_slow_read_leaves_loop_free);
    tcase_add_test(tc, test_borrower_goes_mid_read);
    suite_add_tcase(s, tc);

    tc = tcase_create("device-request");
    tcase_add_checked_fixture(tc, bor_setup, bor_teardown);
    tcase_add_test(tc, test_request_unplug);
    tcase_add_test(tc, test_request_bad_range);
    tcase_add_test(tc, test_request_after_disconnect);
    suite_add_tcase(s, tc);

    tc = tcase_create("lender-lost");
    tcase_add_checked_fixture(tc, bor_setup, bor_teardown);
    tcase_add_test(tc, test_lender_lost);
    tcase_add_test(tc, test_take_over_refuses_bad_handoffs);
    tcase_add_test(tc, test_take_over_keeps_eventfds);
    tcase_add_test(tc, test_take_over_keeps_lingering);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(borrower_suite());
}
