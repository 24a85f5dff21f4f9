/*
 * Unit tests of the node's counters (vfio-ntb/daemon/stats.c): every worker
 * is asked at once and without waiting; the answer comes when the last has
 * answered, or with what came in when the daemon stops first.
 */
#include "daemon-rig.h"
#include "daemon/stats.h"

#include "check-main.h"

/* A lender worker that takes 600 ms to answer, on a thread of its own. */
typedef struct SlowWorker {
    char *path;
    GMainContext *ctx;
    GMainLoop *loop;
    GThread *thread;
} SlowWorker;

static SlowWorker slow;

static char *slow_answer(void *opaque, const char *name, GError **error)
{
    g_usleep(600 * 1000);
    return g_strdup("{\"requests\":9,\"device_server\":\"slow\"}");
}

static gpointer slow_serve(gpointer data)
{
    g_autoptr(GError) error = NULL;
    VnWctl *w;

    g_main_context_push_thread_default(slow.ctx);
    w = vn_wctl_new(slow.path, slow_answer, NULL, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    g_main_loop_run(slow.loop);
    vn_wctl_free(w);
    g_main_context_pop_thread_default(slow.ctx);
    return NULL;
}

static VnWctlCall *slow_lend_stats(VnDaemon *d, VnLocalDevice *ld, VnWctlDone done, void *opaque)
{
    g_autoptr(GError) error = NULL;
    VnWctlCall *c = vn_wctl_call_async(slow.path, "stats", 2000, 4096, done, opaque, &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    return c;
}

static gboolean tick(gpointer data)
{
    (*(unsigned *)data)++;
    return G_SOURCE_CONTINUE;
}

/* Counters are asked of the workers without waiting: the loop runs while a
 * slow one thinks (a 10 ms timer ticks), its answer is in the result, and
 * a daemon that stops meanwhile still answers the caller. */
START_TEST(test_stats_do_not_wait)
{
    VnWorkerOps ops = fake_ops;
    JsonNode *stats = NULL, *cut = NULL;
    g_autofree char *text = NULL;
    unsigned ticks = 0;
    guint timer;
    gint64 t0;
    VnDaemon *a;

    slow.path = g_build_filename(tmpdir, "slow-channel.sock", NULL);
    slow.ctx = g_main_context_new();
    slow.loop = g_main_loop_new(slow.ctx, FALSE);
    slow.thread = g_thread_new("slow", slow_serve, NULL);
    while (!g_file_test(slow.path, G_FILE_TEST_EXISTS)) {
        g_usleep(1000);
    }
    ops.lend_stats = slow_lend_stats;
    ops_in_use = &ops;
    a = daemon_start("hosta");
    ops_in_use = &fake_ops;

    timer = g_timeout_add(10, tick, &ticks);
    t0 = g_get_monotonic_time();
    ck_assert(vn_stats_gather(a, NULL, keep_stats, &stats));
    ck_assert_int_lt(g_get_monotonic_time() - t0, 100 * 1000);
    ck_assert_ptr_null(stats);
    while (stats == NULL && g_get_monotonic_time() - t0 < 3 * G_USEC_PER_SEC) {
        g_main_context_iteration(NULL, TRUE);
    }
    ck_assert_ptr_nonnull(stats);
    ck_assert_uint_ge(ticks, 20);
    text = json_to_string(stats, FALSE);
    ck_assert_msg(strstr(text, "\"device_server\":\"slow\"") != NULL, "%s", text);
    g_source_remove(timer);

    /* Stopping while a question is out: the caller hears what there is. */
    ck_assert(vn_stats_gather(a, NULL, keep_stats, &cut));
    vn_daemon_free(a);
    ck_assert_ptr_nonnull(cut);
    /* The worker that did not answer is still one device's entry (it was a
     * null, which ntbctl refused as malformed from then on). */
    g_free(text);
    text = json_to_string(cut, FALSE);
    ck_assert_msg(strstr(text, "\"lent\":[{\"worker_answered\":false,\"device\":\"nvme0\"}]") !=
                      NULL,
                  "%s", text);
    json_node_unref(stats);
    json_node_unref(cut);
    g_main_loop_quit(slow.loop);
    g_main_context_wakeup(slow.ctx);
    g_thread_join(slow.thread);
    g_main_loop_unref(slow.loop);
    g_main_context_unref(slow.ctx);
    g_clear_pointer(&slow.path, g_free);
}
END_TEST

/* The fake workers answer at once: the gather finishes before it returns,
 * with each one's counters; one device asked for is that one alone. */
START_TEST(test_answered_at_once)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    JsonNode *stats = NULL;
    g_autofree char *text = NULL;

    borrow(a, b);
    ck_assert(vn_stats_gather(a, NULL, keep_stats, &stats));
    ck_assert_ptr_nonnull(stats);
    text = json_to_string(stats, FALSE);
    ck_assert_msg(strstr(text, "\"lent\":[{\"requests\":3") != NULL, "%s", text);
    json_node_unref(stats);
    stats = NULL;
    ck_assert(vn_stats_gather(a, "hosta/none", keep_stats, &stats));
    g_free(text);
    text = json_to_string(stats, FALSE);
    ck_assert_msg(strstr(text, "\"lent\":[]") != NULL, "%s", text);
    json_node_unref(stats);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* Whose counters they are is the daemon's to say: the borrower's fake
 * worker names no device, and the gathered entry names hostb's, with its
 * lender (a worker naming another device would be overwritten alike). */
START_TEST(test_daemon_names_counters)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    JsonNode *stats = NULL;
    g_autofree char *text = NULL;

    borrow(a, b);
    ck_assert(vn_stats_gather(b, NULL, keep_stats, &stats));
    ck_assert_ptr_nonnull(stats);
    text = json_to_string(stats, FALSE);
    ck_assert_msg(strstr(text, "\"borrowed\":[{\"vfio_user_messages\":7,\"device\":\"nvme0\","
                               "\"lender\":\"hosta\"}]") != NULL,
                  "%s", text);
    json_node_unref(stats);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

static Suite *stats_suite(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("stats");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_answered_at_once);
    tcase_add_test(tc, test_daemon_names_counters);
    tcase_add_test(tc, test_stats_do_not_wait);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(stats_suite());
}
