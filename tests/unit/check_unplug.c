/*
 * Unit tests of asking a VM to let go of a borrowed device
 * (vfio-ntb/daemon/unplug.c): the worker's device request first; when its
 * QEMU takes none, device_del on the VM's QMP socket -- here a fake QEMU
 * monitor on a thread of its own that answers slowly -- while the daemon's
 * loop goes on; and a daemon that stops while a VM is being asked.  A device presented
 * anew (its device server was lost and another answers): taken out where it sat, its
 * worker started again, and added back at the same bus and slot.
 */
#include "daemon-rig.h"
#include "daemon/devserver.h"
#include "daemon/qmp.h"
#include "daemon/unplug.h"

#include "check-main.h"

#include <sys/un.h>

/* A QEMU monitor that greets, answers qmp_capabilities at once and
 * device_del after @delay_ms. */
typedef struct Monitor {
    char *path;
    int listener;
    unsigned delay_ms;
    GThread *thread;
    char deleted[64]; /* the id device_del named */
    bool replug;      /* answer as QEMU does a replug's two connections (below) */
    char added[1024]; /* the device_add line */
    /* A hostile or broken QEMU (NULL: as above): its answers to the qom-gets, and a guest
     * that never lets go (no DEVICE_DELETED for the device). */
    const char *bus_answer, *addr_answer;
    bool never_deleted;
    bool one_connection; /* a replug's first only */
    gint dels;           /* device_del lines seen (atomic) */
} Monitor;

/* A replug's monitor: the device sits on "rp1" at slot 2 function 0; device_del is followed
 * by its DEVICE_DELETED (and another for a backend, without "device"). */
static const char *replug_answer(Monitor *m, const char *line)
{
    if (strstr(line, "parent_bus") != NULL) {
        return m->bus_answer != NULL ? m->bus_answer
                                     : "{\"return\":\"/machine/peripheral/rp1/rp1\"}\n";
    }
    if (strstr(line, "\"addr\"") != NULL && strstr(line, "qom-get") != NULL) {
        return m->addr_answer != NULL ? m->addr_answer : "{\"return\":16}\n";
    }
    if (strstr(line, "device_del") != NULL && m->never_deleted) {
        return "{\"return\":{}}\n{\"event\":\"DEVICE_DELETED\",\"data\":{\"device\":\"dev9\"}}\n";
    }
    if (strstr(line, "device_del") != NULL) {
        return "{\"return\":{}}\n{\"event\":\"DEVICE_DELETED\",\"data\":{\"path\":\"/x\"}}\n"
               "{\"event\":\"DEVICE_DELETED\",\"data\":{\"device\":\"dev0\"}}\n";
    }
    if (strstr(line, "device_add") != NULL) {
        g_strlcpy(m->added, line, sizeof(m->added));
    }
    return "{\"return\":{}}\n";
}

static void monitor_serve_one(Monitor *m, int fd);

static gpointer monitor_serve(gpointer data)
{
    Monitor *m = data;

    for (int i = 0; i < (m->replug && !m->one_connection ? 2 : 1); i++) {
        int fd = accept(m->listener, NULL, NULL);

        if (fd < 0) {
            break;
        }
        monitor_serve_one(m, fd);
    }
    return NULL;
}

static void monitor_serve_one(Monitor *m, int fd)
{
    char buf[4096];
    size_t have = 0;
    const char *greeting = "{\"QMP\":{\"version\":{},\"capabilities\":[]}}\n";

    ck_assert_int_eq(write(fd, greeting, strlen(greeting)), (ssize_t)strlen(greeting));
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
        char *nl;

        if (n <= 0) {
            break;
        }
        have += (size_t)n;
        buf[have] = '\0';
        while ((nl = strchr(buf, '\n')) != NULL) {
            const char *id = strstr(buf, "\"id\":\"");

            *nl = '\0';
            if (strstr(buf, "device_del") != NULL) {
                g_atomic_int_inc(&m->dels);
            }
            if (strstr(buf, "device_del") != NULL && id != NULL) {
                g_strlcpy(m->deleted, id + 6, sizeof(m->deleted));
                m->deleted[strcspn(m->deleted, "\"")] = '\0';
                g_usleep(m->delay_ms * 1000);
            }
            if (m->replug) {
                const char *ans = replug_answer(m, buf);

                ck_assert_int_eq(write(fd, ans, strlen(ans)), (ssize_t)strlen(ans));
            } else {
                ck_assert_int_eq(write(fd, "{\"return\":{}}\n", 14), 14);
            }
            have -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, have);
        }
    }
    close(fd);
}

static void monitor_start(Monitor *m, unsigned delay_ms)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };

    m->path = g_build_filename(tmpdir, "qmp.sock", NULL);
    m->delay_ms = delay_ms;
    m->listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    g_strlcpy(addr.sun_path, m->path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(m->listener, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(m->listener, 1), 0);
    m->thread = g_thread_new("monitor", monitor_serve, m);
}

static void monitor_stop(Monitor *m)
{
    g_thread_join(m->thread);
    close(m->listener);
    unlink(m->path);
    g_free(m->path);
}

typedef struct Asked {
    int calls;
    bool asked, stopping;
    char device[64];
} Asked;

static void on_asked(VnDaemon *d, const char *device, uint64_t lease, bool asked, bool stopping,
                     void *opaque)
{
    Asked *a = opaque;

    a->calls++;
    a->asked = asked;
    a->stopping = stopping;
    g_strlcpy(a->device, device, sizeof(a->device));
}

static bool answered(void *opaque)
{
    return ((Asked *)opaque)->calls > 0;
}

static gboolean tick(gpointer data)
{
    (*(unsigned *)data)++;
    return G_SOURCE_CONTINUE;
}

static bool gen_known(void *opaque)
{
    return ((VnBorrowed *)opaque)->server_gen_known;
}

static bool spin_until_gen_known(VnBorrowed *bw)
{
    return spin_until(gen_known, bw, 3000);
}

static bool gen_is_1(void *opaque)
{
    return ((VnBorrowed *)opaque)->server_gen == 1;
}

static bool server_down(void *opaque)
{
    return ((VnBorrowed *)opaque)->server_down;
}

/* hostb holds hosta/nvme0, "attached" to vm1 whose monitor is @m. */
static VnBorrowed *attached(VnDaemon *a, VnDaemon *b, Monitor *m)
{
    VnBorrowed *bw;

    borrow(a, b);
    bw = vn_devices_borrowed(b, "hosta/nvme0");
    ck_assert_ptr_nonnull(bw);
    bw->worker_pid = 4242; /* a worker the fake launcher never ran */
    bw->domain = g_strdup("vm1");
    bw->qmp = m != NULL ? g_strdup(m->path) : NULL;
    bw->qdev_id = g_strdup("dev0");
    return bw;
}

/* The worker's QEMU takes no device requests: device_del on the VM's
 * monitor, which takes 400 ms to answer while the loop goes on. */
START_TEST(test_device_del_without_waiting)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    Monitor m = { 0 };
    Asked got = { 0 };
    unsigned ticks = 0;
    guint timer;
    gint64 t0;

    monitor_start(&m, 400);
    timer = g_timeout_add(10, tick, &ticks);
    t0 = g_get_monotonic_time();
    vn_unplug_start(b, attached(a, b, &m), true, on_asked, &got);
    ck_assert_int_lt(g_get_monotonic_time() - t0, 100 * 1000);
    ck_assert_int_eq(got.calls, 0);
    ck_assert(spin_until(answered, &got, 3000));
    ck_assert(got.asked && !got.stopping);
    ck_assert_str_eq(got.device, "hosta/nvme0");
    ck_assert_str_eq(m.deleted, "dev0");
    ck_assert_uint_ge(ticks, 20);
    g_source_remove(timer);
    monitor_stop(&m);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* No device request and no monitor: nothing could ask, said at once. */
START_TEST(test_no_way_to_ask)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    Asked got = { 0 };

    vn_unplug_start(b, attached(a, b, NULL), true, on_asked, &got);
    ck_assert_int_eq(got.calls, 1);
    ck_assert(!got.asked && !got.stopping);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* The daemon stops while device_del waits on a slow monitor: the caller
 * hears so at once, and the thread's late end touches nothing freed. */
START_TEST(test_daemon_stops_meanwhile)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    Monitor m = { 0 };
    Asked got = { 0 };

    monitor_start(&m, 600);
    vn_unplug_start(b, attached(a, b, &m), true, on_asked, &got);
    spin(100);
    vn_daemon_free(b);
    ck_assert_int_eq(got.calls, 1);
    ck_assert(got.stopping);
    spin(1000); /* the thread ends, its answer comes to no one */
    ck_assert_int_eq(got.calls, 1);
    monitor_stop(&m);
    vn_daemon_free(a);
}
END_TEST

/* A worker's channel that takes connections and never answers. */
static char *silent_path;

static VnWctlCall *silent_unplug(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque)
{
    return vn_wctl_call_async(silent_path, "unplug", 500, 4096, done, opaque, NULL);
}

/* Each VM being asked holds a socket or a thread: VN_UNPLUG_MAX at once,
 * the next refused with nothing started; once they are answered (here:
 * timed out, so not asked), there is room again. */
START_TEST(test_bounded)
{
    VnWorkerOps ops = fake_ops;
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int silent = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    Asked got[VN_UNPLUG_MAX + 1] = { 0 };
    VnDaemon *a, *b;
    VnBorrowed *bw;

    silent_path = g_build_filename(tmpdir, "silent.sock", NULL);
    g_strlcpy(addr.sun_path, silent_path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(silent, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(silent, 64), 0);
    ops.request_unplug = silent_unplug;
    ops_in_use = &ops;
    a = daemon_start("hosta");
    b = daemon_start("hostb");
    ops_in_use = &fake_ops;
    bw = attached(a, b, NULL);
    for (int i = 0; i < VN_UNPLUG_MAX; i++) {
        ck_assert(vn_unplug_start(b, bw, true, on_asked, &got[i]));
    }
    ck_assert(!vn_unplug_start(b, bw, true, on_asked, &got[VN_UNPLUG_MAX]));
    ck_assert(spin_until(answered, &got[VN_UNPLUG_MAX - 1], 3000));
    spin(50);
    for (int i = 0; i < VN_UNPLUG_MAX; i++) {
        ck_assert_int_eq(got[i].calls, 1);
        ck_assert(!got[i].asked);
    }
    ck_assert_int_eq(got[VN_UNPLUG_MAX].calls, 0);
    ck_assert(vn_unplug_start(b, bw, true, on_asked, &got[VN_UNPLUG_MAX]));
    vn_daemon_free(b);
    vn_daemon_free(a);
    close(silent);
    unlink(silent_path);
    g_clear_pointer(&silent_path, g_free);
}
END_TEST

static bool replugged(void *opaque)
{
    return ((Monitor *)opaque)->added[0] != '\0';
}

/* hosta's device server is lost, then another answers: hostb takes the device out of its
 * VM where it sat, starts its worker again (to describe the new device) and adds it back
 * there, on the same socket.  Lost alone changes nothing in the VM. */
/* attached(), served on a socket (what a replug adds the device back on), once hostb knows
 * the generation hosta/nvme0's server is of; *@ld: hosta's nvme0. */
static VnBorrowed *attached_for_replug(VnDaemon *a, VnDaemon *b, Monitor *m, VnLocalDevice **ld)
{
    VnBorrowed *bw = attached(a, b, m);

    bw->socket = g_strdup("/run/vm1-nvme0.sock");
    ck_assert(spin_until_gen_known(bw));
    *ld = vn_devices_local(a, "nvme0");
    return bw;
}

START_TEST(test_replug_on_new_server)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    Monitor m = { .replug = true };
    VnLocalDevice *ld;
    VnBorrowed *bw;
    unsigned starts, stops;

    monitor_start(&m, 0);
    bw = attached_for_replug(a, b, &m, &ld);
    starts = fake.starts;
    stops = fake.stops;
    vn_devserver_changed(ld, true, 0); /* first heard: nothing to tell */
    vn_devserver_changed(ld, false, 0);
    ck_assert(spin_until(server_down, bw, 3000));
    ck_assert_str_eq(m.deleted, "");
    vn_devserver_changed(ld, true, 1);
    ck_assert(spin_until(replugged, &m, 5000));
    ck_assert_str_eq(m.deleted, "dev0");
    ck_assert_uint_eq(fake.stops, stops + 1);
    ck_assert_uint_eq(fake.starts, starts + 1);
    ck_assert_ptr_nonnull(strstr(m.added, "\"driver\":\"vfio-user-pci\""));
    ck_assert_ptr_nonnull(strstr(m.added, "\"bus\":\"rp1\""));
    ck_assert_ptr_nonnull(strstr(m.added, "\"addr\":\"02.0\""));
    ck_assert_ptr_nonnull(strstr(m.added, "\"path\":\"/run/vm1-nvme0.sock\""));
    ck_assert(!bw->server_down);
    ck_assert_uint_eq(bw->server_gen, 1);
    monitor_stop(&m);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* The device server flaps (or the lender counts fast): a return while the VM is being given
 * the device anew starts no second replug (the worker it starts attaches to whichever server
 * answers then). */
START_TEST(test_replug_once_while_flapping)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    Monitor m = { .replug = true };
    VnLocalDevice *ld;
    VnBorrowed *bw;

    monitor_start(&m, 400); /* the guest takes its time to let go */
    bw = attached_for_replug(a, b, &m, &ld);
    vn_devserver_changed(ld, false, 0);
    vn_devserver_changed(ld, true, 1);
    ck_assert(spin_until(gen_is_1, bw, 3000));
    vn_devserver_changed(ld, false, 1);
    vn_devserver_changed(ld, true, 2);
    ck_assert(spin_until(replugged, &m, 5000));
    ck_assert_uint_eq(bw->server_gen, 2);
    spin(300);
    ck_assert_int_eq(g_atomic_int_get(&m.dels), 1);
    monitor_stop(&m);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* QEMU is a peer: where it says the device sits must be a bus path and a slot, and a guest
 * that never lets go is waited for a bounded time.  Each is refused with what was wrong, and
 * nothing is added. */
static const struct {
    const char *name, *bus, *addr;
    bool never_deleted;
    const char *why;
} hostile_monitors[] = {
    { "bus not a string", "{\"return\":7}\n", NULL, false, "not a bus path" },
    { "bus without a name", "{\"return\":\"/machine/\"}\n", NULL, false, "not a bus path" },
    { "slot past 0xff", NULL, "{\"return\":4096}\n", false, "not a slot and function" },
    { "slot negative", NULL, "{\"return\":-1}\n", false, "not a slot and function" },
    { "slot a string", NULL, "{\"return\":\"02.0\"}\n", false, "not a slot and function" },
    { "no such device", "{\"error\":{\"desc\":\"Device 'dev0' not found\"}}\n", NULL, false,
      "not found" },
    { "never let go", NULL, NULL, true, "was not let go of" },
};

START_TEST(test_replug_hostile_monitor)
{
    Monitor m = { .replug = true,
                  .one_connection = true, /* the removal's */
                  .bus_answer = hostile_monitors[_i].bus,
                  .addr_answer = hostile_monitors[_i].addr,
                  .never_deleted = hostile_monitors[_i].never_deleted };
    g_autoptr(GError) error = NULL;
    g_autofree char *bus = NULL, *addr = NULL;
    gint64 t0 = g_get_monotonic_time();

    monitor_start(&m, 0);
    ck_assert(!vn_qmp_device_remove(m.path, "dev0", 500, &bus, &addr, &error));
    ck_assert_msg(strstr(error->message, hostile_monitors[_i].why) != NULL, "%s: %s",
                  hostile_monitors[_i].name, error->message);
    ck_assert_ptr_null(bus);
    ck_assert_ptr_null(addr);
    ck_assert_int_lt(g_get_monotonic_time() - t0, 3 * G_USEC_PER_SEC);
    monitor_stop(&m);
}
END_TEST

static Suite *unplug_suite(void)
{
    Suite *s = suite_create("unplug");
    TCase *tc = tcase_create("unplug");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_device_del_without_waiting);
    tcase_add_test(tc, test_no_way_to_ask);
    tcase_add_test(tc, test_daemon_stops_meanwhile);
    tcase_add_test(tc, test_bounded);
    tcase_add_test(tc, test_replug_on_new_server);
    tcase_add_test(tc, test_replug_once_while_flapping);
    tcase_add_loop_test(tc, test_replug_hostile_monitor, 0, G_N_ELEMENTS(hostile_monitors));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(unplug_suite());
}
