/*
 * Unit tests of workers on their way out (vfio-ntb/daemon/ending.c), with
 * real processes standing in for workers: the caller returns at once and
 * the loop keeps running; a worker that leaves on SIGTERM is reaped, one
 * that ignores it is killed; a borrower worker's QEMU is given its moment
 * (the worker's control channel, served here in the same loop, says when
 * it let go); and the device reads as busy until its worker is gone.
 */
#include "daemon/conf.h"
#include "daemon/daemon.h"
#include "daemon/ending.h"
#include "common/wctl.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static char *tmpdir;
static VnDaemon *d;
static bool client_connected;

static void setup(void)
{
    g_autoptr(GError) error = NULL;

    tmpdir = g_dir_make_tmp("vn-check-ending-XXXXXX", NULL);
    d = g_new0(VnDaemon, 1);
    d->conf =
        vn_conf_parse("[node]\nname = hostb\nfabric = shm\nfabric-dir = /nonexistent\n", &error);
    ck_assert_msg(d->conf != NULL, "%s", error ? error->message : "");
    d->endings = vn_endings_new();
}

static void teardown(void)
{
    g_clear_pointer(&d->endings, vn_endings_free);
    vn_conf_free(d->conf);
    g_free(d);
    rmdir(tmpdir);
    g_clear_pointer(&tmpdir, g_free);
}

/* A child of ours running @script (sh -c). */
static GPid spawn(const char *script)
{
    const char *argv[] = { "/bin/sh", "-c", script, NULL };
    g_autoptr(GError) error = NULL;
    GPid pid = 0;

    ck_assert_msg(g_spawn_async(NULL, (char **)argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD, NULL, NULL,
                                &pid, &error),
                  "%s", error ? error->message : "");
    return pid;
}

static gboolean tick(gpointer data)
{
    (*(unsigned *)data)++;
    return G_SOURCE_CONTINUE;
}

/* Run the loop until nothing of @what ends, at most @ms; how long it took. */
static gint64 spin_while_busy(const char *what, int ms)
{
    gint64 t0 = g_get_monotonic_time();

    while (vn_ending_busy(d, what) && g_get_monotonic_time() - t0 < (gint64)ms * 1000) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    return (g_get_monotonic_time() - t0) / 1000;
}

static bool reaped(GPid pid)
{
    return waitpid(pid, NULL, WNOHANG) < 0 && errno == ECHILD;
}

/* It ends, and so do its files (a worker that served as the worker user cannot remove them
 * from the daemon's directory). */
START_TEST(test_term_reaps)
{
    GPid pid = spawn("exec sleep 30");
    gint64 t0 = g_get_monotonic_time();
    g_autofree char *sock = g_build_filename(g_get_tmp_dir(), "vn-ending-XXXXXX", NULL);
    int fd = g_mkstemp(sock);

    ck_assert_int_ge(fd, 0);
    close(fd);
    vn_ending_start(d, "hosta/nvme0", pid, true, NULL, NULL, g_strdup(sock), 0, 5000);
    ck_assert_int_lt(g_get_monotonic_time() - t0, 100 * 1000);
    ck_assert(vn_ending_busy(d, "hosta/nvme0"));
    ck_assert(!vn_ending_busy(d, "hosta/nvme1"));
    ck_assert(g_file_test(sock, G_FILE_TEST_EXISTS)); /* not while it runs */
    spin_while_busy("hosta/nvme0", 3000);
    ck_assert(!vn_ending_busy(d, "hosta/nvme0"));
    ck_assert(reaped(pid));
    ck_assert(!g_file_test(sock, G_FILE_TEST_EXISTS));
}
END_TEST

/* A worker that ignores SIGTERM: killed after the wait, and the loop ran
 * all along (a 10 ms timer kept ticking). */
START_TEST(test_term_ignored_kills)
{
    GPid pid = spawn("trap '' TERM; while :; do sleep 0.05; done");
    unsigned ticks = 0;
    guint timer = g_timeout_add(10, tick, &ticks);

    g_usleep(100 * 1000); /* the shell has set its trap */
    vn_ending_start(d, "nvme0", pid, true, NULL, NULL, NULL, 0, 400);
    g_usleep(50 * 1000);
    spin_while_busy("nvme0", 250);
    ck_assert_msg(vn_ending_busy(d, "nvme0"), "gone before its SIGTERM wait ended");
    ck_assert_int_eq(kill(pid, 0), 0);
    spin_while_busy("nvme0", 3000);
    ck_assert(!vn_ending_busy(d, "nvme0"));
    ck_assert(reaped(pid));
    ck_assert_uint_ge(ticks, 20);
    g_source_remove(timer);
}
END_TEST

static char *channel_handler(void *opaque, const char *name, GError **error)
{
    return g_strdup_printf("{\"client_connected\":%s}", client_connected ? "true" : "false");
}

static gboolean let_go(gpointer data)
{
    client_connected = false;
    return G_SOURCE_REMOVE;
}

/* The worker's QEMU holds on for 300 ms: no SIGTERM before it lets go,
 * then one soon after, well before the client wait's bound. */
START_TEST(test_waits_for_the_client)
{
    g_autofree char *path = g_build_filename(tmpdir, "w-channel.sock", NULL);
    g_autoptr(GError) error = NULL;
    VnWctl *w = vn_wctl_new(path, channel_handler, NULL, &error);
    GPid pid = spawn("exec sleep 30");
    gint64 took;

    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    client_connected = true;
    g_timeout_add(300, let_go, NULL);
    vn_ending_start(d, "hosta/nvme0", pid, true, NULL, g_strdup(path), NULL, 5000, 5000);
    took = spin_while_busy("hosta/nvme0", 4000);
    ck_assert(!vn_ending_busy(d, "hosta/nvme0"));
    ck_assert_int_ge(took, 250);
    ck_assert_int_lt(took, 3000);
    ck_assert(reaped(pid));
    /* The ending took the channel's path with it. */
    ck_assert(!g_file_test(path, G_FILE_TEST_EXISTS));
    vn_wctl_free(w);
}
END_TEST

/* No one listens on the channel: no QEMU to wait for. */
START_TEST(test_no_channel_no_wait)
{
    g_autofree char *path = g_build_filename(tmpdir, "none-channel.sock", NULL);
    GPid pid = spawn("exec sleep 30");
    gint64 took;

    vn_ending_start(d, "hosta/nvme0", pid, true, NULL, g_strdup(path), NULL, 5000, 5000);
    took = spin_while_busy("hosta/nvme0", 4000);
    ck_assert(!vn_ending_busy(d, "hosta/nvme0"));
    ck_assert_int_lt(took, 2000);
    ck_assert(reaped(pid));
}
END_TEST

/* A worker adopted after a restart is not our child: its exit is seen all
 * the same (its pidfd), and it is not ours to reap. */
START_TEST(test_adopted_worker)
{
    g_autofree char *out = NULL;
    g_autoptr(GError) error = NULL;
    GPid pid;
    gint64 took;

    ck_assert(g_spawn_command_line_sync("sh -c 'sleep 30 >/dev/null 2>&1 & echo $!'", &out, NULL,
                                        NULL, &error));
    pid = (GPid)g_ascii_strtoll(out, NULL, 10);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(kill(pid, 0), 0);
    vn_ending_start(d, "hosta/nvme0", pid, false, NULL, NULL, NULL, 0, 5000);
    took = spin_while_busy("hosta/nvme0", 3000);
    ck_assert(!vn_ending_busy(d, "hosta/nvme0"));
    ck_assert_int_lt(took, 2000);
    /* init reaps it; a moment later it is gone for good. */
    for (int i = 0; i < 200 && kill(pid, 0) == 0; i++) {
        g_usleep(10000);
    }
    ck_assert_int_ne(kill(pid, 0), 0);
}
END_TEST

/* The daemon stops while a worker waits for its QEMU: it is told to go. */
START_TEST(test_daemon_end_terminates)
{
    GPid pid = spawn("exec sleep 30");
    int status = 0;

    vn_ending_start(d, "hosta/nvme0", pid, true, NULL, NULL, NULL, 5000, 5000);
    g_clear_pointer(&d->endings, vn_endings_free);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
}
END_TEST

static Suite *ending_suite(void)
{
    Suite *s = suite_create("ending");
    TCase *tc = tcase_create("ending");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_term_reaps);
    tcase_add_test(tc, test_term_ignored_kills);
    tcase_add_test(tc, test_waits_for_the_client);
    tcase_add_test(tc, test_no_channel_no_wait);
    tcase_add_test(tc, test_daemon_end_terminates);
    tcase_add_test(tc, test_adopted_worker);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(ending_suite());
}
