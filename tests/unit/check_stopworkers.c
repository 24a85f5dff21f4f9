/*
 * Unit tests of stopping the workers a stopped daemon left (vfio-ntb/daemon/stopworkers.c):
 * among a cgroup's pids, the workers (by their command's name) get SIGTERM, those that do
 * not stop in time SIGKILL; any other process, and the caller, are left alone.
 */
#include "daemon/stopworkers.h"

#include "check-main.h"

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

static Suite *stopworkers_suite(void)
{
    Suite *s = suite_create("stopworkers");
    TCase *tc = tcase_create("stopworkers");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_stops_workers_only);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(stopworkers_suite());
}
