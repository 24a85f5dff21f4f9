/*
 * Unit tests of the daemon's QMP client (vfio-ntb/daemon/qmp.c) against a
 * hostile QEMU: a reply that nests too deep is refused, not parsed.  It runs
 * on a small thread stack with a line of 64 KiB of "[": json-glib's
 * recursive parser would overflow it (the test's process dies of SIGSEGV, a
 * failure), a bounded parse skips the line.  (The control socket and the
 * state file have no seam short of the whole daemon: their parse is the
 * same vn_json_parse_object() call, tested in check_json.)
 */
#include "daemon/qmp.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <gio/gio.h>
#include <glib/gstdio.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Enough for the daemon's own paths, far too little for 65535 levels of
 * json-glib recursion (about 115 bytes each). */
#define SMALL_STACK (256 * 1024)
#define DEEP_LEN (64 * 1024 - 1)

static char *tmpdir;

static void setup(void)
{
    tmpdir = g_dir_make_tmp("vn-daemon-XXXXXX", NULL);
    ck_assert_ptr_nonnull(tmpdir);
}

static void teardown(void)
{
    g_autofree char *sock = g_build_filename(tmpdir, "qmp.sock", NULL);

    g_unlink(sock);
    g_rmdir(tmpdir);
    g_clear_pointer(&tmpdir, g_free);
}

/* DEEP_LEN '[' and a NUL. */
static char *deep_line(void)
{
    char *s = g_malloc(DEEP_LEN + 1);

    memset(s, '[', DEEP_LEN);
    s[DEEP_LEN] = '\0';
    return s;
}

static void run_small_stack(void *(*fn)(void *), void *data, pthread_t *t)
{
    pthread_attr_t attr;

    ck_assert_int_eq(pthread_attr_init(&attr), 0);
    ck_assert_int_eq(pthread_attr_setstacksize(&attr, SMALL_STACK), 0);
    ck_assert_int_eq(pthread_create(t, &attr, fn, data), 0);
    pthread_attr_destroy(&attr);
}

/* ---- a QMP reply --------------------------------------------------------- */

typedef struct Qemu {
    int listen_fd;
    char *sock;
    bool ok;
    GError *error;
} Qemu;

/* A "QEMU" whose greeting is 64 KiB of "[", then closes. */
static gpointer fake_qemu(gpointer data)
{
    Qemu *q = data;
    g_autofree char *deep = deep_line();
    int fd = accept4(q->listen_fd, NULL, NULL, SOCK_CLOEXEC);

    if (fd >= 0) {
        (void)!write(fd, deep, DEEP_LEN);
        (void)!write(fd, "\n", 1);
        close(fd);
    }
    return NULL;
}

static void *device_del(void *data)
{
    Qemu *q = data;

    q->ok = vn_qmp_device_del(q->sock, "ntb0", &q->error);
    return NULL;
}

START_TEST(test_qmp_reply_too_deep)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    Qemu q = { .sock = g_build_filename(tmpdir, "qmp.sock", NULL) };
    GThread *qemu;
    pthread_t t;

    q.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    g_strlcpy(addr.sun_path, q.sock, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(q.listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(q.listen_fd, 1), 0);
    qemu = g_thread_new("qemu", fake_qemu, &q);
    run_small_stack(device_del, &q, &t);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    g_thread_join(qemu);
    /* The line is skipped as no object of ours; then QEMU is gone. */
    ck_assert(!q.ok);
    ck_assert(g_error_matches(q.error, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED));
    g_error_free(q.error);
    close(q.listen_fd);
    g_free(q.sock);
}
END_TEST

static Suite *qmp_suite(void)
{
    Suite *s = suite_create("qmp");
    TCase *tc = tcase_create("untrusted");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_qmp_reply_too_deep);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(qmp_suite());
}
