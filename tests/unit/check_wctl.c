/*
 * Unit tests of the workers' control channel (vfio-ntb/common/wctl.c):
 * a server on its own thread and context, as in a worker, and the daemon's
 * bounded client: answers, errors, a worker that does not answer in time,
 * and clients that send garbage or too much (the server drops them and goes
 * on serving).
 */
#include "common/wctl.h"

#include "check-main.h"

#include <check.h>
#include <gio/gio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct Rig {
    char *dir;
    char *path;
    GMainContext *ctx;
    GMainLoop *loop;
    GThread *thread;
    VnWctl *w;
    unsigned slow_ms; /* the handler sleeps this long */
    gint calls;
} Rig;

static char *handler(void *opaque, const char *name, GError **error)
{
    Rig *r = opaque;

    g_atomic_int_inc(&r->calls);
    if (r->slow_ms > 0) {
        g_usleep(r->slow_ms * 1000);
    }
    if (strcmp(name, "stats") == 0) {
        return g_strdup("{\"client_connected\":true,\"messages\":3}");
    }
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, "no command \"%s\"", name);
    return NULL;
}

static gpointer serve(gpointer data)
{
    Rig *r = data;
    g_autoptr(GError) error = NULL;

    VnWctl *w;

    g_main_context_push_thread_default(r->ctx);
    w = vn_wctl_new(r->path, handler, r, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    g_atomic_pointer_set(&r->w, w);
    g_main_loop_run(r->loop);
    vn_wctl_free(r->w);
    g_main_context_pop_thread_default(r->ctx);
    return NULL;
}

static void rig_start(Rig *r)
{
    r->dir = g_dir_make_tmp("vn-wctl-XXXXXX", NULL);
    r->path = g_build_filename(r->dir, "w-channel.sock", NULL);
    r->ctx = g_main_context_new();
    r->loop = g_main_loop_new(r->ctx, FALSE);
    r->thread = g_thread_new("wctl", serve, r);
    /* Until the server is made: its socket file appears at bind(), a moment
     * before listen(), and a connect in between is refused. */
    while (g_atomic_pointer_get(&r->w) == NULL) {
        g_usleep(1000);
    }
}

static void rig_stop(Rig *r)
{
    g_main_loop_quit(r->loop);
    g_main_context_wakeup(r->ctx);
    g_thread_join(r->thread);
    /* The server unlinks its socket when it stops. */
    ck_assert(!g_file_test(r->path, G_FILE_TEST_EXISTS));
    g_main_loop_unref(r->loop);
    g_main_context_unref(r->ctx);
    rmdir(r->dir);
    g_free(r->path);
    g_free(r->dir);
}

typedef struct Answer {
    bool done;
    char *text;
    GError *error;
} Answer;

static void on_answer(char *answer, const GError *error, void *opaque)
{
    Answer *a = opaque;

    a->done = true;
    a->text = answer;
    a->error = error != NULL ? g_error_copy(error) : NULL;
}

/* The daemon's call, its loop run here until the answer comes. */
static char *call(const char *path, const char *name, unsigned timeout_ms, size_t max_reply,
                  GError **error)
{
    Answer a = { 0 };

    if (vn_wctl_call_async(path, name, timeout_ms, max_reply, on_answer, &a, error) == NULL) {
        return NULL;
    }
    while (!a.done) {
        g_main_context_iteration(NULL, TRUE);
    }
    if (a.error != NULL) {
        g_propagate_error(error, a.error);
    }
    return a.text;
}

START_TEST(test_call)
{
    Rig r = { 0 };
    g_autoptr(GError) error = NULL;
    g_autofree char *stats = NULL, *none = NULL;

    rig_start(&r);
    stats = call(r.path, "stats", 1000, 4096, &error);
    ck_assert_msg(stats != NULL, "%s", error ? error->message : "");
    ck_assert_str_eq(stats, "{\"client_connected\":true,\"messages\":3}");
    none = call(r.path, "format-disk", 1000, 4096, &error);
    ck_assert_ptr_null(none);
    ck_assert_ptr_nonnull(strstr(error->message, "no command"));
    g_clear_error(&error);
    /* A reply longer than the caller takes is refused, not read in full. */
    ck_assert_ptr_null(call(r.path, "stats", 1000, 8, &error));
    ck_assert_ptr_nonnull(error);
    rig_stop(&r);
}
END_TEST

START_TEST(test_no_worker)
{
    g_autoptr(GError) error = NULL;

    ck_assert_ptr_null(call("/nonexistent/w-channel.sock", "stats", 200, 4096, &error));
    ck_assert_ptr_nonnull(error);
}
END_TEST

/* A worker busy for longer than the caller waits: the call ends at its
 * timeout, not when the worker gets round to it. */
START_TEST(test_timeout)
{
    Rig r = { .slow_ms = 1500 };
    g_autoptr(GError) error = NULL;
    gint64 t0 = g_get_monotonic_time();

    rig_start(&r);
    ck_assert_ptr_null(call(r.path, "stats", 300, 4096, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT));
    ck_assert_int_lt(g_get_monotonic_time() - t0, 1000 * 1000);
    rig_stop(&r);
}
END_TEST

static gboolean tick(gpointer data)
{
    (*(unsigned *)data)++;
    return G_SOURCE_CONTINUE;
}

/* The loop's side: the answer comes to a callback, the loop runs meanwhile
 * (here a 10 ms timer ticks while a slow worker thinks), a slow worker's
 * call ends at its timeout, and a cancelled call never calls back. */
START_TEST(test_call_async)
{
    Rig r = { 0 };
    Answer a = { 0 }, slow = { 0 }, cancelled = { 0 };
    g_autoptr(GError) error = NULL;
    unsigned ticks = 0;
    guint timer;
    VnWctlCall *c;

    rig_start(&r);
    ck_assert_ptr_nonnull(vn_wctl_call_async(r.path, "stats", 1000, 4096, on_answer, &a, &error));
    while (!a.done) {
        g_main_context_iteration(NULL, TRUE);
    }
    ck_assert_msg(a.text != NULL, "%s", a.error ? a.error->message : "");
    ck_assert_str_eq(a.text, "{\"client_connected\":true,\"messages\":3}");

    r.slow_ms = 700;
    timer = g_timeout_add(10, tick, &ticks);
    ck_assert_ptr_nonnull(vn_wctl_call_async(r.path, "stats", 300, 4096, on_answer, &slow, &error));
    while (!slow.done) {
        g_main_context_iteration(NULL, TRUE);
    }
    ck_assert(g_error_matches(slow.error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT));
    ck_assert_uint_ge(ticks, 5);
    g_source_remove(timer);

    c = vn_wctl_call_async(r.path, "stats", 1000, 4096, on_answer, &cancelled, &error);
    ck_assert_ptr_nonnull(c);
    vn_wctl_call_cancel(c);
    for (int i = 0; i < 100; i++) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(10000);
    }
    ck_assert(!cancelled.done);

    ck_assert_ptr_null(vn_wctl_call_async("/nonexistent/w-channel.sock", "stats", 200, 4096,
                                          on_answer, &a, &error));
    ck_assert_ptr_nonnull(error);
    rig_stop(&r);
    g_free(a.text);
    g_clear_error(&a.error);
    g_clear_error(&slow.error);
}
END_TEST

static int raw_connect(const char *path)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    return fd;
}

/* Garbage, a line too long, and idle connections beyond the bound: each is
 * answered with an error or dropped, and a good request still works. */
START_TEST(test_hostile_clients)
{
    Rig r = { 0 };
    g_autofree char *big = g_strnfill(VN_WCTL_MAX_REQUEST * 4, 'x');
    g_autofree char *stats = NULL;
    char buf[256] = { 0 };
    int idle[VN_WCTL_MAX_CLIENTS + 4];
    int fd;

    rig_start(&r);
    fd = raw_connect(r.path);
    ck_assert_int_eq(write(fd, "not json\n", 9), 9);
    ck_assert_int_gt(read(fd, buf, sizeof(buf) - 1), 0);
    ck_assert_ptr_nonnull(strstr(buf, "\"error\""));
    close(fd);
    fd = raw_connect(r.path);
    /* No newline within the bound: dropped unanswered. */
    ck_assert_int_gt(write(fd, big, strlen(big)), 0);
    ck_assert_int_le(read(fd, buf, sizeof(buf)), 0);
    close(fd);
    for (unsigned i = 0; i < G_N_ELEMENTS(idle); i++) {
        idle[i] = raw_connect(r.path);
    }
    g_usleep(100 * 1000);
    for (unsigned i = 0; i < G_N_ELEMENTS(idle); i++) {
        close(idle[i]);
    }
    g_usleep(100 * 1000);
    stats = call(r.path, "stats", 1000, 4096, NULL);
    ck_assert_ptr_nonnull(stats);
    ck_assert_int_eq(g_atomic_int_get(&r.calls), 1); /* garbage reached no handler */
    rig_stop(&r);
}
END_TEST

static Suite *wctl_suite(void)
{
    Suite *s = suite_create("wctl");
    TCase *tc = tcase_create("channel");

    tcase_add_test(tc, test_call);
    tcase_add_test(tc, test_no_worker);
    tcase_add_test(tc, test_timeout);
    tcase_add_test(tc, test_call_async);
    tcase_add_test(tc, test_hostile_clients);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(wctl_suite());
}
