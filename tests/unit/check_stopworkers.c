/*
 * Unit tests of stopping the workers a stopped daemon left (vfio-ntb/daemon/stopworkers.c):
 * among a cgroup's pids, the workers (by their command's name) get SIGTERM, those that do
 * not stop in time SIGKILL; any other process, and the caller, are left alone.
 */
#include "daemon/stopworkers.h"

#include "check-main.h"
#include "fake-sysfs.h"

#include <check.h>
#include <errno.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child running @prog (a copy of @orig named @name in @dir) with @args. */
static pid_t start_as(const char *dir, const char *orig, const char *name, char *const args[])
{
    g_autofree char *copy = g_build_filename(dir, name, NULL);
    g_autofree char *text = NULL;
    gsize len;
    pid_t pid;

    ck_assert(g_file_get_contents(orig, &text, &len, NULL));
    ck_assert(g_file_set_contents(copy, text, (gssize)len, NULL));
    ck_assert_int_eq(g_chmod(copy, 0755), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        execv(copy, args);
        _exit(127);
    }
    return pid;
}

static bool exited(pid_t pid, int *status)
{
    return waitpid(pid, status, WNOHANG) == pid;
}

START_TEST(test_stops_workers_only)
{
    g_autofree char *dir = g_dir_make_tmp("vn-stopworkers-XXXXXX", NULL);
    g_autofree char *procs = g_build_filename(dir, "cgroup.procs", NULL);
    g_autofree char *list = NULL;
    char *lender_args[] = { "vfio-ntb-lender", "60", NULL };
    char *stubborn_args[] = { "vfio-ntb-borrower", "-c", "trap '' TERM; while :; do sleep 1; done",
                              NULL };
    char *other_args[] = { "sleep", "60", NULL };
    pid_t lender, stubborn, other;
    unsigned killed = 7;
    int status;

    lender = start_as(dir, "/bin/sleep", "vfio-ntb-lender", lender_args);
    stubborn = start_as(dir, "/bin/sh", "vfio-ntb-borrower", stubborn_args);
    other = start_as(dir, "/bin/sleep", "sleep", other_args);
    g_usleep(200 * 1000); /* each has exec'd (its trap set) */
    list = g_strdup_printf("%d\n%d\nnot-a-pid\n%d\n%d\n1\n", (int)getpid(), (int)lender,
                           (int)stubborn, (int)other);
    ck_assert(g_file_set_contents(procs, list, -1, NULL));

    ck_assert_int_eq(vn_stopworkers_run(procs, 500, &killed), 2);
    ck_assert_uint_eq(killed, 1);
    ck_assert(exited(lender, &status) || waitpid(lender, &status, 0) == lender);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
    ck_assert_int_eq(waitpid(stubborn, &status, 0), stubborn);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* Not a worker: untouched. */
    ck_assert(!exited(other, &status));
    kill(other, SIGKILL);
    waitpid(other, &status, 0);

    ck_assert_int_eq(vn_stopworkers_run("/nonexistent/cgroup.procs", 10, &killed), -ENOENT);
    g_unlink(procs);
    for (const char *const *n =
             (const char *const[]){ "vfio-ntb-lender", "vfio-ntb-borrower", "sleep", NULL };
         *n != NULL; n++) {
        g_autofree char *f = g_build_filename(dir, *n, NULL);

        g_unlink(f);
    }
    g_rmdir(dir);
}
END_TEST

#define BDF "0000:00:05.0"

/* Then the managed functions the run dir's kept files name go back to their drivers: only
 * files named lend-NAME-driver, regular, ours; one that cannot go back is counted, its file
 * left. */
START_TEST(test_gives_back_managed)
{
    g_autofree char *sys = NULL, *run = NULL, *kept = NULL, *other = NULL, *stale = NULL;
    unsigned failed = 9;

    root = fake_root("stopworkers");
    sys = g_build_filename(root, "sys", NULL);
    run = g_build_filename(root, "run", NULL);
    fake_put("sys/bus/pci/drivers/vfio-pci/unbind", "");
    fake_put("sys/bus/pci/drivers_probe", "");
    fake_put("sys/devices/pci0000:00/" BDF "/driver_override", "vfio-pci\n");
    fake_link("sys/bus/pci/devices/" BDF, "../../../devices/pci0000:00/" BDF);
    fake_link("sys/devices/pci0000:00/" BDF "/driver", "../../../bus/pci/drivers/vfio-pci");
    fake_put("run/lend-nvme0-driver", "\n" BDF "\n");      /* back to any driver */
    fake_put("run/lend-gpu0-driver", "amdgpu\n" BDF "\n"); /* this tree's probe binds none */
    fake_put("run/nvme0-driver", "\n" BDF "\n");           /* not a kept file's name */
    fake_link("run/lend-link-driver", "lend-nvme0-driver");
    kept = g_build_filename(run, "lend-nvme0-driver", NULL);
    other = g_build_filename(run, "lend-gpu0-driver", NULL);
    stale = g_build_filename(run, "nvme0-driver", NULL);
    ck_assert_uint_eq(vn_stopworkers_give_back(sys, run, &failed), 1);
    ck_assert_uint_eq(failed, 1);
    ck_assert(!g_file_test(kept, G_FILE_TEST_EXISTS));
    ck_assert(g_file_test(other, G_FILE_TEST_EXISTS) && g_file_test(stale, G_FILE_TEST_EXISTS));
    {
        g_autofree char *unbound = NULL, *ovr = NULL;
        g_autofree char *up = g_build_filename(sys, "bus/pci/drivers/vfio-pci/unbind", NULL);
        g_autofree char *op =
            g_build_filename(sys, "devices/pci0000:00/" BDF "/driver_override", NULL);

        ck_assert(g_file_get_contents(up, &unbound, NULL, NULL));
        ck_assert(g_file_get_contents(op, &ovr, NULL, NULL));
        ck_assert_str_eq(unbound, BDF);
        ck_assert_str_eq(ovr, "\n");
    }
    ck_assert_uint_eq(vn_stopworkers_give_back(sys, "/nonexistent", &failed), 0);
    ck_assert_uint_eq(failed, 0);
    fake_remove();
}
END_TEST

static Suite *stopworkers_suite(void)
{
    Suite *s = suite_create("stopworkers");
    TCase *tc = tcase_create("stopworkers");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_stops_workers_only);
    tcase_add_test(tc, test_gives_back_managed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(stopworkers_suite());
}
