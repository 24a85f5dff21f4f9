/*
 * Unit tests of the lender's watch on its device server (vfio-ntb/lending/lender-server.c):
 * a server that dies is seen at once, with the device lent or not; the holder's DMA
 * windows and the windows onto the device go with it, and its requests are refused, not
 * sent to a dead socket; a server started again on the same socket is found, counted as a
 * new generation, and the holder gets the new device only by attaching again.  The rig is
 * lender-rig.h.
 */
#include "lender-rig.h"

#include <sys/socket.h>
#include <sys/un.h>

/* What the lender told of its server (written on the lender's thread). */
static struct {
    gint downs, ups;
    gint gen;
} told;

static void on_server(void *opaque, bool up, uint32_t gen, const char *why)
{
    g_atomic_int_inc(up ? &told.ups : &told.downs);
    g_atomic_int_set(&told.gen, (gint)gen);
}

static void listen_fn(void *data)
{
    vn_lender_on_server(rig.lender, on_server, NULL);
}

static void server_setup(void)
{
    setup();
    memset(&told, 0, sizeof(told));
    on_loop(&rig.lend, listen_fn, NULL);
}

static void server_kill_fn(void *data)
{
    g_clear_pointer(&rig.server, vn_server_free);
}

static void server_start_fn(void *data)
{
    g_autoptr(GError) error = NULL;

    rig.server = vn_server_new(rig.sock, &rig.info, &fake_ops, &rig.fake, rig.dev.ctx, &error);
    ck_assert_msg(rig.server != NULL, "%s", error ? error->message : "");
}

/* The server dies as a killed process's would: its sockets close. */
static void server_kill(void)
{
    on_loop(&rig.dev, server_kill_fn, NULL);
}

static void server_start(void)
{
    on_loop(&rig.dev, server_start_fn, NULL);
}

START_TEST(test_death_under_lease)
{
    Borrower *b = borrower(0);
    uint8_t cfg[4];
    gint64 t0;
    Mem m;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    m = mem_export(b, "lender");
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    snap_clear(&s);

    t0 = now_ms();
    server_kill();
    ck_assert(lender_server_wait(false, 2000));
    ck_assert_int_lt(now_ms() - t0, 1000); /* its socket hung up: no timeout waited for */
    ck_assert_int_eq(g_atomic_int_get(&told.downs), 1);

    /* Fenced without the device: no window onto the holder's memory is left, and the
     * holder still holds the device (its lease is the daemon's to end). */
    s = snap();
    ck_assert_uint_eq(s.st.windows, 0);
    ck_assert_uint_eq(s.st.server_losses, 1);
    ck_assert_str_eq(s.borrower, "b");
    ck_assert_ptr_nonnull(strstr(s.json, "\"device_server_up\":false"));
    snap_clear(&s);
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0, cfg, 4, false), -ENODEV);
    ck_assert_int_eq(dma_map(b, 0x200000, MEM_SIZE, m.segment, 0), -ENODEV);

    /* Back on the same socket: found without being asked, a new generation. */
    server_start();
    ck_assert(lender_server_wait(true, 5000));
    ck_assert_int_eq(g_atomic_int_get(&told.ups), 1);
    ck_assert_int_eq(g_atomic_int_get(&told.gen), 1);
    s = snap();
    ck_assert_uint_eq(s.st.server_returns, 1);
    snap_clear(&s);
    /* The device the holder had is gone: refused until it attaches again. */
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0, cfg, 4, false), -ENODEV);
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0, cfg, 4, false), 0);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);
    ck_assert_uint_eq(device_dma_count(), 1);
    mem_free(&m);
}
END_TEST

START_TEST(test_death_while_idle)
{
    uint64_t before;

    /* Not lent: the connection kept for the next attach is watched too. */
    server_kill();
    ck_assert(lender_server_wait(false, 2000));
    ck_assert_int_eq(g_atomic_int_get(&told.downs), 1);
    /* An attach meanwhile is refused, saying why. */
    {
        g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
        g_autofree char *message = NULL;

        ck_assert_int_lt(req_msg(borrower(0), VN_PROTO_ATTACH, json, NULL, 0, &message), 0);
        ck_assert_ptr_nonnull(message);
        ck_assert_ptr_nonnull(strstr(message, rig.sock));
    }
    server_start();
    ck_assert(lender_server_wait(true, 5000));
    ck_assert_int_eq(g_atomic_int_get(&told.gen), 1);
    /* The attach takes the connection the lender made: no second one. */
    before = device_stats().clients;
    attach_ok(borrower(1), VN_IRQ_MODE_FD, NULL);
    ck_assert_uint_eq(device_stats().clients, before);
}
END_TEST

START_TEST(test_idle_dials_back_off)
{
    uint64_t dials;

    /* Nobody holds the device: a server that stays away is dialled after 1 s, then 2 s
     * more, then 4 s more (not each second: a host lending many devices whose servers are
     * away stays quiet).  In 4.5 s, 2 dials (each second would be 4); fewer only if the
     * loop was slow. */
    server_kill();
    ck_assert(lender_server_wait(false, 2000));
    {
        Snap s = snap();

        dials = s.st.server_dials;
        snap_clear(&s);
    }
    g_usleep(4500 * 1000);
    {
        Snap s = snap();

        ck_assert_uint_le(s.st.server_dials - dials, 2);
        ck_assert_uint_ge(s.st.server_dials - dials, 1);
        snap_clear(&s);
    }
    /* A borrow does not wait for the next dial: it dials itself, and is refused. */
    {
        g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
        g_autofree char *message = NULL;

        ck_assert_int_lt(req_msg(borrower(0), VN_PROTO_ATTACH, json, NULL, 0, &message), 0);
        ck_assert_ptr_nonnull(strstr(message, rig.sock));
    }
}
END_TEST

START_TEST(test_detach_keeps_watching)
{
    Borrower *b = borrower(0);
    uint64_t before;

    before = device_stats().clients;
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
    /* The fence held: its connection is kept for the next lease (a server that serves one
     * client for its lifetime serves them all), and watched. */
    ck_assert(lender_server_wait(true, 2000));
    attach_ok(borrower(1), VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(simple(borrower(1), VN_PROTO_DETACH), 0);
    ck_assert_uint_eq(device_stats().clients, before);
    server_kill();
    ck_assert(lender_server_wait(false, 2000));
    ck_assert_int_eq(g_atomic_int_get(&told.downs), 1);
    server_start();
    ck_assert(lender_server_wait(true, 5000));
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
}
END_TEST

static void holder_b_fn(void *data)
{
    vn_lender_peer_up(rig.lender, "b");
}

/* A new lender (its worker restarted) knows its lease holder from the port, but not its
 * attachment: the holder's requests are answered "attach again" (ENODEV), not "not lent to
 * you" (EPERM), which stays for everyone else; the holder's attach works. */
START_TEST(test_holder_not_attached)
{
    g_autofree char *json = NULL;
    g_autofree char *message = NULL;
    VnProtoRegionRw r = { .region = VFIO_PCI_CONFIG_REGION_INDEX, .count = 4 };
    uint8_t cfg[4];

    on_loop(&rig.lend, holder_b_fn, NULL);
    json = vn_proto_region_rw_to_json(DEV, &r);
    ck_assert_int_eq(req_msg(borrower(0), VN_PROTO_REGION_RW, json, NULL, 0, &message), -ENODEV);
    ck_assert_ptr_nonnull(strstr(message, "attach again"));
    ck_assert_int_eq(region_rw(borrower(1), VFIO_PCI_CONFIG_REGION_INDEX, 0, cfg, 4, false),
                     -EPERM);
    attach_ok(borrower(0), VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(region_rw(borrower(0), VFIO_PCI_CONFIG_REGION_INDEX, 0, cfg, 4, false), 0);
}
END_TEST

/* A dialer as a worker's daemon is one: asked, it answers dial_ms (100) later (on the
 * lender's loop), with a connection to the server or, while dial_refuses, an error. */
static gint dials_asked, dial_refuses, dial_ms = 100;

typedef struct SlowDial {
    VnLenderDialedFn done;
    void *done_opaque;
} SlowDial;

static gboolean slow_dial_answer(gpointer data)
{
    g_autofree SlowDial *d = data;
    g_autoptr(GError) error = NULL;
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = -1;

    if (g_atomic_int_get(&dial_refuses)) {
        error = g_error_new(G_IO_ERROR, G_IO_ERROR_CONNECTION_REFUSED, "the daemon said no");
    } else {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        g_strlcpy(addr.sun_path, rig.sock, sizeof(addr.sun_path));
        ck_assert_int_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    }
    d->done(d->done_opaque, fd, error);
    return G_SOURCE_REMOVE;
}

static void slow_dialer(void *opaque, VnLenderDialedFn done, void *done_opaque)
{
    SlowDial *d = g_new0(SlowDial, 1);
    GSource *src = g_timeout_source_new((guint)g_atomic_int_get(&dial_ms));

    *d = (SlowDial){ .done = done, .done_opaque = done_opaque };
    g_atomic_int_inc(&dials_asked);
    g_source_set_callback(src, slow_dial_answer, d, NULL);
    g_source_attach(src, rig.lend.ctx);
    g_source_unref(src);
}

static void set_dialer_fn(void *data)
{
    vn_lender_set_dialer(rig.lender, slow_dialer, NULL);
}

/* A worker's lender has its daemon dial the device server, and does not wait for it: an
 * attach with no connection waits for the dial's answer in the lender's queue (the lender's
 * loop serves on), and is refused with the dialer's own words when the dial is. */
START_TEST(test_attach_waits_for_the_dialer)
{
    g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
    g_autofree char *message = NULL;
    uint8_t cfg[4];

    server_kill();
    ck_assert(lender_server_wait(false, 2000));
    on_loop(&rig.lend, set_dialer_fn, NULL);
    server_start();
    g_atomic_int_set(&dial_refuses, 1);
    ck_assert_int_lt(req_msg(borrower(0), VN_PROTO_ATTACH, json, NULL, 0, &message), 0);
    ck_assert_ptr_nonnull(strstr(message, "the daemon said no"));
    ck_assert_int_ge(g_atomic_int_get(&dials_asked), 1);
    g_atomic_int_set(&dial_refuses, 0);
    attach_ok(borrower(0), VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(region_rw(borrower(0), VFIO_PCI_CONFIG_REGION_INDEX, 0, cfg, 4, false), 0);
}
END_TEST

/* One dial at a time (a daemon refuses a worker that dials too often): an attach that comes
 * while the background redial is on its way takes that one's connection, and asks none of
 * its own. */
START_TEST(test_attach_joins_the_dial_on_its_way)
{
    server_kill();
    ck_assert(lender_server_wait(false, 2000));
    g_atomic_int_set(&dial_ms, 1500);
    on_loop(&rig.lend, set_dialer_fn, NULL);
    server_start();
    /* The lender dials a lost server again after VN_LENDER_DIAL_MS. */
    for (int i = 0; i < 400 && g_atomic_int_get(&dials_asked) == 0; i++) {
        g_usleep(10 * 1000);
    }
    ck_assert_int_eq(g_atomic_int_get(&dials_asked), 1);
    attach_ok(borrower(0), VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(g_atomic_int_get(&dials_asked), 1);
    g_atomic_int_set(&dial_ms, 100);
}
END_TEST

static Suite *lender_server_suite(void)
{
    Suite *s = suite_create("lender-server");
    TCase *tc = tcase_create("server");

    tcase_add_checked_fixture(tc, server_setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_death_under_lease);
    tcase_add_test(tc, test_death_while_idle);
    tcase_add_test(tc, test_idle_dials_back_off);
    tcase_add_test(tc, test_detach_keeps_watching);
    tcase_add_test(tc, test_holder_not_attached);
    tcase_add_test(tc, test_attach_waits_for_the_dialer);
    tcase_add_test(tc, test_attach_joins_the_dial_on_its_way);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(lender_server_suite());
}
