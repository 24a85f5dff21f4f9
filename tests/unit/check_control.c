/*
 * Unit tests of vfio-ntbd's control socket (vfio-ntb/daemon/control.c): a
 * real socket, driven by a client in this process that runs the daemon's
 * main loop between its requests.  The command table is this file's
 * lookup() (a table of its own, handed to vn_control_new()): one command that
 * answers {} as subscribe-events does.
 */
#include "daemon/daemon-int.h"

#include "check-main.h"

#include <check.h>
#include <malloc.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void cmd_empty(VnDaemon *d, JsonObject *args, VnControlReply *r)
{
    vn_control_return(r, NULL);
}

static VnCommandFn lookup(const char *name, const char *const **allowed)
{
    *allowed = NULL;
    return strcmp(name, "subscribe-events") == 0 ? cmd_empty : NULL;
}

typedef struct Rig {
    VnConfig conf;
    VnDaemon d;
    VnControl *ctl;
    char *dir;
    char *path;
    int fd; /* the client */
} Rig;

static void rig_settle(void)
{
    while (g_main_context_iteration(NULL, FALSE)) {
    }
}

/* The next line the daemon sent (newly allocated). */
static char *rig_line(Rig *r)
{
    GString *s = g_string_new(NULL);
    char c;

    rig_settle();
    while (recv(r->fd, &c, 1, MSG_DONTWAIT) == 1 && c != '\n') {
        g_string_append_c(s, c);
    }
    return g_string_free(s, FALSE);
}

static void rig_start(Rig *r)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    g_autoptr(GError) error = NULL;
    g_autofree char *greeting = NULL;

    memset(r, 0, sizeof(*r));
    r->conf.node = (char *)"hosta";
    r->d.conf = &r->conf;
    r->dir = g_dir_make_tmp("vn-check-control-XXXXXX", &error);
    ck_assert_msg(r->dir != NULL, "%s", error ? error->message : "");
    r->path = g_build_filename(r->dir, "control.sock", NULL);
    r->ctl = vn_control_new(&r->d, r->path, lookup, &error);
    ck_assert_msg(r->ctl != NULL, "%s", error ? error->message : "");
    g_strlcpy(addr.sun_path, r->path, sizeof(addr.sun_path));
    r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(connect(r->fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    greeting = rig_line(r);
    ck_assert_msg(strstr(greeting, "\"vfio-ntbd\"") != NULL, "%s", greeting);
}

static void rig_stop(Rig *r)
{
    close(r->fd);
    rig_settle();
    vn_control_free(r->ctl);
    rmdir(r->dir);
    g_free(r->path);
    g_free(r->dir);
}

/* Send one request line and return the answer line (newly allocated). */
static char *rig_ask(Rig *r, const char *line)
{
    size_t len = strlen(line);

    ck_assert_int_eq(send(r->fd, line, len, MSG_NOSIGNAL), (ssize_t)len);
    return rig_line(r);
}

/* ---- answers ------------------------------------------------------------- */

/* An empty answer ({"return":{}}) costs nothing that stays: found by
 * fuzz_control, where each one leaked the JsonObject it was made of. */
START_TEST(test_empty_return_frees)
{
    enum { WARMUP = 200, ROUNDS = 2000 };
    Rig r;
    size_t before = 0;

    rig_start(&r);
    for (int i = 0; i < WARMUP + ROUNDS; i++) {
        g_autofree char *req = g_strdup_printf("{\"execute\":\"subscribe-events\",\"id\":%d}\n", i);
        g_autofree char *want = g_strdup_printf("{\"return\":{},\"id\":%d}", i);
        g_autofree char *got = rig_ask(&r, req);

        ck_assert_str_eq(got, want);
        if (i == WARMUP) {
            before = mallinfo2().uordblks;
        }
    }
    /* Leaking one object per answer is 100+ bytes each: 200 KiB and more. */
    ck_assert_msg(mallinfo2().uordblks < before + 64 * 1024,
                  "%zu bytes more in use after %d empty answers", mallinfo2().uordblks - before,
                  ROUNDS);
    rig_stop(&r);
}
END_TEST

/* A request that is not a command gets an error and the client stays. */
START_TEST(test_bad_requests)
{
    static const char *const bad[] = {
        "[1]\n",
        "{\"execute\":7}\n",
        "{\"execute\":\"nope\"}\n",
        "{\"execute\":\"subscribe-events\",\"arguments\":[]}\n",
        "{\"execute\":\"subscribe-events\",\"arguments\":{\"x\":1}}\n",
    };
    Rig r;

    rig_start(&r);
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *got = rig_ask(&r, bad[i]);

        ck_assert_msg(g_str_has_prefix(got, "{\"error\":{\"class\":"), "%s -> %s", bad[i], got);
    }
    {
        g_autofree char *got = rig_ask(&r, "{\"execute\":\"subscribe-events\"}\n");

        ck_assert_str_eq(got, "{\"return\":{}}");
    }
    rig_stop(&r);
}
END_TEST

/* ---- the socket's path --------------------------------------------------- */

static int listen_at(const char *path)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(fd, 1), 0);
    return fd;
}

/* A live daemon's socket is not taken over: refused, and it still answers.
 * (It was unlinked and replaced, leaving the first daemon unreachable.) */
START_TEST(test_live_socket_refused)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = g_dir_make_tmp("vn-check-control-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "control.sock", NULL);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    VnConfig conf = { .node = (char *)"hosta" };
    VnDaemon d = { .conf = &conf };
    int live = listen_at(path);
    int probe;

    ck_assert_ptr_null(vn_control_new(&d, path, lookup, &error));
    ck_assert_msg(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_ADDRESS_IN_USE), "%s",
                  error ? error->message : "accepted");
    ck_assert_ptr_nonnull(strstr(error->message, "a running vfio-ntbd answers"));
    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(connect(probe, (struct sockaddr *)&addr, sizeof(addr)), 0);
    close(probe);
    close(live);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* A dead daemon's socket (the file, no listener) is replaced; a file that is
 * not a socket is left alone and refused. */
START_TEST(test_stale_socket_replaced_file_refused)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = g_dir_make_tmp("vn-check-control-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "control.sock", NULL);
    VnConfig conf = { .node = (char *)"hosta" };
    VnDaemon d = { .conf = &conf };
    VnControl *ctl;

    close(listen_at(path)); /* the file stays, nobody listens */
    ctl = vn_control_new(&d, path, lookup, &error);
    ck_assert_msg(ctl != NULL, "%s", error ? error->message : "");
    vn_control_free(ctl);
    ck_assert(g_file_set_contents(path, "not a socket", -1, NULL));
    ck_assert_ptr_null(vn_control_new(&d, path, lookup, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_EXISTS));
    ck_assert(g_file_test(path, G_FILE_TEST_IS_REGULAR));
    unlink(path);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("control");
    TCase *tc = tcase_create("answers");

    tcase_add_test(tc, test_empty_return_frees);
    tcase_add_test(tc, test_bad_requests);
    suite_add_tcase(s, tc);

    tc = tcase_create("path");
    tcase_add_test(tc, test_live_socket_refused);
    tcase_add_test(tc, test_stale_socket_replaced_file_refused);
    suite_add_tcase(s, tc);
    return vn_check_main(s);
}
