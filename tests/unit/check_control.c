/*
 * Unit tests of vfio-ntbd's control socket (vfio-ntb/daemon/control.c): a
 * real socket, driven by a client in this process that runs the daemon's
 * main loop between its requests.  The command table is this file's
 * lookup() (a table of its own, handed to vn_control_new()): subscribe-events
 * (the transport's own, vn_control_subscribe), and "big", a 64 KiB answer.
 */
#include "daemon/conf.h"
#include "daemon/control.h"
#include "daemon/daemon.h"

#include "check-main.h"

#include <check.h>
#include <malloc.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void cmd_empty(VnDaemon *d, JsonObject *args, VnControlReply *r)
{
    JsonNode *since = json_object_get_member(args, "since");

    vn_control_subscribe(r, since != NULL ? json_node_get_int(since) : 0);
}

static void cmd_big(VnDaemon *d, JsonObject *args, VnControlReply *r)
{
    g_autofree char *text = g_strnfill(64 * 1024, 'x');
    JsonNode *n = json_node_new(JSON_NODE_VALUE);

    json_node_set_string(n, text);
    vn_control_return(r, n);
}

static VnCommandFn lookup(const char *name, const char *const **allowed)
{
    static const char *const since[] = { "since", NULL };

    *allowed = NULL;
    if (strcmp(name, "big") == 0) {
        return cmd_big;
    }
    *allowed = since;
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
static char *rig_ask_len(Rig *r, const char *line, size_t len)
{
    ck_assert_int_eq(send(r->fd, line, len, MSG_NOSIGNAL), (ssize_t)len);
    return rig_line(r);
}

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
        /* a NUL byte: answered, not skipped */
        "\0{\"execute\":\"subscribe-events\"}\n",
    };
    Rig r;

    rig_start(&r);
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        size_t len = bad[i][0] != '\0' ? strlen(bad[i]) : 1 + strlen(bad[i] + 1);
        g_autofree char *got = rig_ask_len(&r, bad[i], len);

        ck_assert_msg(g_str_has_prefix(got, "{\"error\":{\"class\":"), "%s -> %s", bad[i], got);
    }
    {
        g_autofree char *got = rig_ask(&r, "{\"execute\":\"subscribe-events\"}\n");

        ck_assert_str_eq(got, "{\"return\":{}}");
    }
    rig_stop(&r);
}
END_TEST

/* ---- clients that do not play fair --------------------------------------- */

static int rig_connect(Rig *r)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    g_strlcpy(addr.sun_path, r->path, sizeof(addr.sun_path));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    rig_settle();
    return fd;
}

/* Whether the daemon closed @fd's connection (what it sent is drained). */
static bool rig_closed(int fd)
{
    char buf[65536];
    ssize_t n;

    rig_settle();
    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
    }
    return n == 0;
}

/* A client that asks and never reads is dropped once its unread answers
 * pass the bound; the daemon never waited on it, and the others are
 * answered. */
START_TEST(test_non_reader_dropped)
{
    Rig r;
    int greedy;
    bool dropped = false;

    rig_start(&r);
    greedy = rig_connect(&r);
    for (int i = 0; i < 200 && !dropped; i++) {
        static const char req[] = "{\"execute\":\"big\"}\n";

        dropped = send(greedy, req, sizeof(req) - 1, MSG_NOSIGNAL) < 0;
        rig_settle();
    }
    ck_assert(dropped || rig_closed(greedy));
    {
        g_autofree char *got = rig_ask(&r, "{\"execute\":\"subscribe-events\"}\n");

        ck_assert_str_eq(got, "{\"return\":{}}");
    }
    close(greedy);
    rig_stop(&r);
}
END_TEST

/* Clients that hold their connections never lock a new one out: at the
 * limit, the one idle longest makes room. */
START_TEST(test_held_connections_make_room)
{
    enum { HELD = 64 };
    int held[HELD];
    Rig r;
    int fresh;
    g_autofree char *greeting = NULL;
    g_autofree char *got = NULL;

    rig_start(&r); /* r.fd: the first, idle longest */
    for (int i = 0; i < HELD; i++) {
        held[i] = rig_connect(&r);
    }
    fresh = rig_connect(&r);
    {
        Rig f = r;

        f.fd = fresh;
        greeting = rig_line(&f);
        ck_assert_msg(strstr(greeting, "\"vfio-ntbd\"") != NULL, "%s", greeting);
        got = rig_ask(&f, "{\"execute\":\"subscribe-events\"}\n");
        ck_assert_str_eq(got, "{\"return\":{}}");
    }
    ck_assert(rig_closed(r.fd));
    ck_assert(!rig_closed(held[HELD - 1]));
    for (int i = 0; i < HELD; i++) {
        close(held[i]);
    }
    close(fresh);
    rig_stop(&r);
}
END_TEST

/* A subscriber that names the last event it saw gets those kept since,
 * then the new ones. */
START_TEST(test_events_since)
{
    Rig r;
    g_autofree char *req = NULL;
    g_autofree char *first = NULL;
    g_autofree char *got = NULL;
    g_autofree char *second = NULL;
    g_autofree char *third = NULL;
    g_autoptr(JsonNode) ev = NULL;
    JsonObject *ts;
    gint64 since;

    rig_start(&r);
    got = rig_ask(&r, "{\"execute\":\"subscribe-events\"}\n");
    vn_control_event(r.ctl, "ONE", json_node_new(JSON_NODE_NULL));
    first = rig_line(&r);
    g_usleep(2000);
    vn_control_event(r.ctl, "TWO", json_node_new(JSON_NODE_NULL));
    close(r.fd);
    ev = json_from_string(first, NULL);
    ck_assert_ptr_nonnull(ev);
    ts = json_object_get_object_member(json_node_get_object(ev), "timestamp");
    since = json_object_get_int_member(ts, "seconds") * G_USEC_PER_SEC +
            json_object_get_int_member(ts, "microseconds");
    r.fd = rig_connect(&r);
    g_free(rig_line(&r)); /* the greeting */
    req = g_strdup_printf(
        "{\"execute\":\"subscribe-events\",\"arguments\":{\"since\":%" G_GINT64_FORMAT "}}\n",
        since);
    g_free(got);
    got = rig_ask(&r, req);
    ck_assert_str_eq(got, "{\"return\":{}}");
    second = rig_line(&r);
    ck_assert_msg(strstr(second, "\"TWO\"") != NULL, "%s", second);
    vn_control_event(r.ctl, "THREE", json_node_new(JSON_NODE_NULL));
    third = rig_line(&r);
    ck_assert_msg(strstr(third, "\"THREE\"") != NULL, "%s", third);
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

    tc = tcase_create("unfair");
    tcase_add_test(tc, test_non_reader_dropped);
    tcase_add_test(tc, test_held_connections_make_room);
    tcase_add_test(tc, test_events_since);
    suite_add_tcase(s, tc);

    tc = tcase_create("path");
    tcase_add_test(tc, test_live_socket_refused);
    tcase_add_test(tc, test_stale_socket_replaced_file_refused);
    suite_add_tcase(s, tc);
    return vn_check_main(s);
}
