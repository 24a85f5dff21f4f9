/*
 * Unit tests of a worker's `host` backend (fabric/host.c, host-ask.c) against a daemon the
 * test plays itself on the other end of a socket pair: what the worker asks of its daemon
 * (exports, doorbell bits, a dial) is never waited for, so a daemon that stalls its answers
 * stalls nothing of the worker's loop; answers come to whoever asked, in any order; and a
 * daemon that answers what was never asked, or says anything before it greeted us, loses
 * the connection (what was asked fails), not the worker.
 */
#include "check-main.h"
#include "common/peerfd.h"
#include "fabric/host.h"
#include "fabric/record.h"

#include <glib-unix.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct Rig {
    VnFabric *fab;     /* the worker's node */
    int daemon;        /* our end: we are its daemon */
    VnRecordReader rx; /* what the worker said */
    char dir[64];
} Rig;

static Rig rig;

/* A sealed memfd of @size bytes, mapped at *@map. */
static int memfd_new(size_t size, uint8_t **map)
{
    int fd = vn_peerfd_memfd_new("check-host", size);

    ck_assert_int_ge(fd, 0);
    *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(*map != MAP_FAILED);
    return fd;
}

/* What one asked op was told. */
typedef struct Told {
    bool done;
    uint64_t id;
    int first, fd;
    char message[256];
} Told;

static void exported(void *opaque, uint64_t id, const GError *error)
{
    Told *t = opaque;

    t->done = true;
    t->id = id;
    if (error != NULL) {
        g_strlcpy(t->message, error->message, sizeof(t->message));
    }
}

static void bits(void *opaque, int first, const GError *error)
{
    Told *t = opaque;

    t->done = true;
    t->first = first;
    if (error != NULL) {
        g_strlcpy(t->message, error->message, sizeof(t->message));
    }
}

static void dialled(void *opaque, int fd, const GError *error)
{
    Told *t = opaque;

    t->done = true;
    t->fd = fd;
    if (error != NULL) {
        g_strlcpy(t->message, error->message, sizeof(t->message));
    }
}

/* The worker's next record, within a second: its header, the fd it carried (or -1). */
static VnHostHdr said(int *fd)
{
    VnRecord rec = { 0 };
    VnHostHdr h;
    int ret = 0;

    for (int i = 0; i < 1000 && ret == 0; i++) {
        ret = vn_record_step(&rig.rx, rig.daemon, VN_HOST_MAX_RECORD, &rec);
        if (ret == 0) {
            g_main_context_iteration(NULL, FALSE); /* what the worker still has to send */
            g_usleep(1000);
        }
    }
    ck_assert_int_gt(ret, 0);
    ck_assert_uint_ge(rec.len, sizeof(h));
    memcpy(&h, rec.buf, sizeof(h));
    g_free(rec.buf);
    *fd = rec.nfds == 1 ? rec.fds[0] : -1;
    return h;
}

static void answer(uint64_t seq, int status, uint64_t arg, int fd)
{
    ck_assert_int_eq(
        vn_host_send(rig.daemon, VN_HOST_REPLY, seq, status, NULL, arg, 0, NULL, 0, fd), 0);
}

/* Iterate the worker's loop until @t is told (or 2 s). */
static void until(const Told *t)
{
    gint64 end = g_get_monotonic_time() + 2 * G_USEC_PER_SEC;

    while (!t->done && g_get_monotonic_time() < end) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(500);
    }
}

static gboolean ticked(gpointer data)
{
    (*(int *)data)++;
    return G_SOURCE_CONTINUE;
}

static void host_setup(void)
{
    g_autoptr(GHashTable) params = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
    g_autoptr(GError) error = NULL;
    uint8_t secret[VN_HOST_SECRET_LEN] = { 1, 2, 3 };
    int sv[2];
    int fd;

    memset(&rig, 0, sizeof(rig));
    g_strlcpy(rig.dir, "/tmp/vn-host-XXXXXX", sizeof(rig.dir));
    ck_assert_ptr_nonnull(g_mkdtemp(rig.dir));
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    rig.daemon = sv[0];
    ck_assert(g_unix_set_fd_nonblocking(rig.daemon, TRUE, NULL));
    /* A daemon that made our connection may tell the lease holder's link before it answers
     * our HELLO (its port does); the greeting is answered before the worker asks. */
    ck_assert_int_eq(vn_host_send(rig.daemon, VN_HOST_LINK, 0, 0, "hosta", 1, 0, NULL, 0, -1), 0);
    ck_assert_int_eq(
        vn_host_send(rig.daemon, VN_HOST_REPLY, 1, 0, NULL,
                     VN_FABRIC_CAP_DIRECT_ROUTES | (UINT64_C(20) << VN_HOST_HELLO_WINDOW_SHIFT), 8,
                     secret, sizeof(secret), -1),
        0);
    g_hash_table_insert(params, "port", g_strdup_printf("%s/port.sock", rig.dir));
    g_hash_table_insert(params, "fd", g_strdup_printf("%d", sv[1]));
    rig.fab = vn_fabric_open("host", "hostb", params, &(VnFabricHandlers){ 0 }, NULL, NULL, &error);
    ck_assert_msg(rig.fab != NULL, "%s", error != NULL ? error->message : "");
    (void)said(&fd); /* its HELLO */
}

static void host_teardown(void)
{
    g_clear_pointer(&rig.fab, vn_fabric_close);
    vn_record_reader_clear(&rig.rx);
    close(rig.daemon);
    rmdir(rig.dir);
}

/* A daemon that answers late: the worker's loop runs on meanwhile, and each answer goes to
 * whoever asked it, whatever the order. */
START_TEST(test_stalled_daemon_blocks_nothing)
{
    uint8_t *map;
    int memfd = memfd_new(4096, &map);
    Told seg = { 0 }, db = { 0 }, dial = { .fd = -1 };
    VnHostHdr exp, alloc, dl;
    int fd, ticks = 0, got;
    GSource *tick = g_timeout_source_new(5);

    g_source_set_callback(tick, ticked, &ticks, NULL);
    g_source_attach(tick, NULL);
    vn_fabric_segment_export_async(rig.fab, memfd, 0, 4096, "hosta", exported, &seg);
    vn_fabric_doorbells_alloc_async(rig.fab, 2, bits, &db);
    vn_host_dial_device_async(rig.fab, dialled, &dial);
    ck_assert(!seg.done && !db.done && !dial.done);
    exp = said(&fd);
    ck_assert_uint_eq(exp.op, VN_HOST_EXPORT_SEGMENT);
    ck_assert_uint_eq(exp.arg, 4096);
    ck_assert_int_ge(fd, 0); /* the memory itself, for the daemon to export */
    close(fd);
    alloc = said(&fd);
    ck_assert_uint_eq(alloc.op, VN_HOST_DOORBELLS_ALLOC);
    dl = said(&fd);
    ck_assert_uint_eq(dl.op, VN_HOST_DIAL_DEVICE);
    /* A daemon that says nothing for a while: the worker's loop is not held. */
    while (ticks < 20) {
        g_main_context_iteration(NULL, TRUE);
    }
    ck_assert(!seg.done && !db.done && !dial.done);
    /* Answered last first: each to its own. */
    got = eventfd(0, EFD_CLOEXEC);
    answer(dl.seq, 0, 0, got);
    close(got);
    answer(alloc.seq, 0, 5, -1);
    answer(exp.seq, 0, 77, -1);
    until(&seg);
    until(&db);
    until(&dial);
    ck_assert_uint_eq(seg.id, 77);
    ck_assert_int_eq(db.first, 5);
    ck_assert_int_ge(dial.fd, 0);
    close(dial.fd);
    g_source_destroy(tick);
    g_source_unref(tick);
    munmap(map, 4096);
    close(memfd);
}
END_TEST

/* What the daemon said before its greeting's answer is heard, not refused: open succeeded
 * (the fixture), and the link it told is up once the loop ran. */
START_TEST(test_link_told_before_greeting)
{
    for (int i = 0; i < 100 && !vn_fabric_link_up(rig.fab, "hosta"); i++) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    ck_assert(vn_fabric_link_up(rig.fab, "hosta"));
}
END_TEST

/* A daemon's answers are a peer's: doorbell bits outside the register and a dial's answer
 * without the connection are errors, not trusted. */
START_TEST(test_bad_answers_refused)
{
    Told db = { 0 }, dial = { .fd = -1 };
    VnHostHdr alloc, dl;
    int fd;

    vn_fabric_doorbells_alloc_async(rig.fab, 4, bits, &db);
    vn_host_dial_device_async(rig.fab, dialled, &dial);
    alloc = said(&fd);
    dl = said(&fd);
    answer(alloc.seq, 0, VN_FABRIC_MAX_DOORBELLS - 2, -1);
    answer(dl.seq, 0, 0, -1);
    until(&db);
    until(&dial);
    ck_assert_int_eq(db.first, -EPROTO);
    ck_assert_int_eq(dial.fd, -1);
    ck_assert_msg(strstr(dial.message, "Protocol error") != NULL, "%s", dial.message);
}
END_TEST

/* An answer to nothing we asked: the daemon broke the protocol.  The connection goes (what
 * was asked fails, counted as a bad message), the worker does not. */
START_TEST(test_answer_to_nothing_drops_the_daemon)
{
    uint8_t *map;
    int memfd = memfd_new(4096, &map);
    Told seg = { 0 };
    VnFabricStats st;
    char c;
    int fd;

    vn_fabric_segment_export_async(rig.fab, memfd, 0, 4096, "hosta", exported, &seg);
    (void)said(&fd);
    close(fd);
    answer(999, 0, 1, -1);
    until(&seg);
    ck_assert_uint_eq(seg.id, 0);
    vn_fabric_stats(rig.fab, &st);
    ck_assert_uint_eq(st.bad_messages, 1);
    /* Our end sees the worker hang up. */
    for (int i = 0; i < 1000 && read(rig.daemon, &c, 1) < 0; i++) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    ck_assert_int_eq(read(rig.daemon, &c, 1), 0);
    munmap(map, 4096);
    close(memfd);
}
END_TEST

/* A daemon that takes an ask and never answers (stuck, or lying by silence): the asker is
 * told ETIMEDOUT after VN_HOST_REPLY_TIMEOUT_MS, the worker's loop ran all along, and the
 * connection to that daemon is dropped (the worker dials again). */
START_TEST(test_unanswered_ask_times_out)
{
    uint8_t *map;
    int memfd = memfd_new(4096, &map);
    Told seg = { 0 };
    gint64 t0 = g_get_monotonic_time();
    char c;
    int fd;

    vn_fabric_segment_export_async(rig.fab, memfd, 0, 4096, "hosta", exported, &seg);
    (void)said(&fd);
    close(fd);
    while (!seg.done && g_get_monotonic_time() - t0 < (VN_HOST_REPLY_TIMEOUT_MS + 3000) * 1000) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    ck_assert(seg.done);
    ck_assert_uint_eq(seg.id, 0);
    ck_assert_msg(strstr(seg.message, "timed out") != NULL, "%s", seg.message);
    ck_assert_int_ge(g_get_monotonic_time() - t0, (gint64)VN_HOST_REPLY_TIMEOUT_MS * 1000);
    for (int i = 0; i < 1000 && read(rig.daemon, &c, 1) < 0; i++) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    ck_assert_int_eq(read(rig.daemon, &c, 1), 0);
    munmap(map, 4096);
    close(memfd);
}
END_TEST

/* The daemon restarts: what the worker asks meanwhile waits for it, and goes once the new
 * daemon greeted it, in the order asked, after the greeting; nothing fails for the restart. */
START_TEST(test_asked_while_away_goes_after_greeting)
{
    g_autofree char *path = g_strdup_printf("%s/port.sock", rig.dir);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    uint8_t *map;
    int memfd = memfd_new(4096, &map);
    Told seg = { 0 }, db = { 0 };
    VnHostHdr hello, exp, alloc;
    int lsock, fd = -1;

    /* The daemon goes: the worker sees its connection end. */
    close(rig.daemon);
    vn_record_reader_clear(&rig.rx);
    memset(&rig.rx, 0, sizeof(rig.rx));
    for (int i = 0; i < 50; i++) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    vn_fabric_segment_export_async(rig.fab, memfd, 0, 4096, "hosta", exported, &seg);
    vn_fabric_doorbells_alloc_async(rig.fab, 2, bits, &db);
    for (int i = 0; i < 20; i++) {
        g_main_context_iteration(NULL, FALSE);
    }
    ck_assert(!seg.done && !db.done); /* held, not failed */
    /* A new daemon's port. */
    lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(lsock, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(lsock, 4), 0);
    for (int i = 0; i < 2000 && fd < 0; i++) {
        fd = accept4(lsock, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    ck_assert_int_ge(fd, 0);
    rig.daemon = fd;
    hello = said(&fd);
    ck_assert_uint_eq(hello.op, VN_HOST_HELLO); /* with the secret the first one gave */
    ck_assert_int_eq(vn_host_send(rig.daemon, VN_HOST_REPLY, hello.seq, 0, NULL, 0, 8, NULL, 0, -1),
                     0);
    exp = said(&fd);
    ck_assert_uint_eq(exp.op, VN_HOST_EXPORT_SEGMENT);
    ck_assert_int_ge(fd, 0);
    close(fd);
    alloc = said(&fd);
    ck_assert_uint_eq(alloc.op, VN_HOST_DOORBELLS_ALLOC);
    answer(exp.seq, 0, 9, -1);
    answer(alloc.seq, 0, 3, -1);
    until(&seg);
    until(&db);
    ck_assert_uint_eq(seg.id, 9);
    ck_assert_int_eq(db.first, 3);
    close(lsock);
    unlink(path);
    munmap(map, 4096);
    close(memfd);
}
END_TEST

static Suite *host_suite(void)
{
    Suite *s = suite_create("host");
    TCase *tc = tcase_create("daemon");

    tcase_add_checked_fixture(tc, host_setup, host_teardown);
    tcase_set_timeout(tc, 20); /* an ask's timeout is waited for once */
    tcase_add_test(tc, test_link_told_before_greeting);
    tcase_add_test(tc, test_stalled_daemon_blocks_nothing);
    tcase_add_test(tc, test_bad_answers_refused);
    tcase_add_test(tc, test_answer_to_nothing_drops_the_daemon);
    tcase_add_test(tc, test_unanswered_ask_times_out);
    tcase_add_test(tc, test_asked_while_away_goes_after_greeting);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(host_suite());
}
