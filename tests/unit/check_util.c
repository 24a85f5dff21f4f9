/*
 * Unit tests of the helpers every module shares (vfio-ntb/common/util.c).
 */
#include "common/json.h"
#include "common/util.h"

#include "check-main.h"

#include <check.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* Peer JSON whose member is of the wrong type is "no such string", never a
 * critical (json-glib's own getter emits one for arrays and objects). */
START_TEST(test_json_string_member)
{
    const char *names[] = { "n", "a", "o", "z", "s", "b", "missing" };
    g_autoptr(JsonObject) o = NULL;

    g_log_set_always_fatal(G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_WARNING);
    o = vn_json_parse_object("{\"n\":1,\"a\":[1],\"o\":{},\"z\":null,\"s\":\"x\",\"b\":true}", -1,
                             4096, NULL);
    ck_assert_ptr_nonnull(o);
    for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
        const char *v = vn_util_json_string(o, names[i]);

        if (strcmp(names[i], "s") == 0) {
            ck_assert_str_eq(v, "x");
        } else {
            ck_assert_ptr_null(v);
        }
    }
    ck_assert_ptr_null(vn_util_json_string(NULL, "s"));
}
END_TEST

/* A snapshot replaces the file whole and leaves no temporary behind. */
START_TEST(test_snapshot_replaces)
{
    g_autofree char *dir = g_dir_make_tmp("vn-util-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "stats.json", NULL);
    g_autofree char *tmp = g_strconcat(path, ".tmp", NULL);
    g_autofree char *first = NULL;
    g_autofree char *second = NULL;
    g_autoptr(GError) error = NULL;

    ck_assert_ptr_nonnull(dir);
    ck_assert(vn_util_write_snapshot(path, "{\"n\":1,\"longer\":true}", &error));
    ck_assert(g_file_get_contents(path, &first, NULL, NULL));
    ck_assert_str_eq(first, "{\"n\":1,\"longer\":true}");
    ck_assert(vn_util_write_snapshot(path, "{\"n\":2}", &error));
    ck_assert(g_file_get_contents(path, &second, NULL, NULL));
    ck_assert_str_eq(second, "{\"n\":2}");
    ck_assert(!g_file_test(tmp, G_FILE_TEST_EXISTS));
    g_unlink(path);
    g_rmdir(dir);
}
END_TEST

/* A directory that does not exist is an error with a message, not a crash. */
START_TEST(test_snapshot_error)
{
    g_autoptr(GError) error = NULL;

    ck_assert(!vn_util_write_snapshot("/nonexistent-vn-dir/stats.json", "{}", &error));
    ck_assert_ptr_nonnull(error);
    ck_assert_ptr_nonnull(strstr(error->message, "nonexistent-vn-dir"));
}
END_TEST

/* Sizes in messages are ASCII: GLib's no-break space becomes a plain one. */
static char *counter_json(void *opaque)
{
    return g_strdup_printf("{\"n\":%d}", ++*(int *)opaque);
}

/* The stats file: written at each SIGUSR1, and a last time at the stop; then no more. */
START_TEST(test_stats_file)
{
    g_autofree char *dir = g_dir_make_tmp("vn-util-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "stats.json", NULL);
    g_autofree char *text = NULL;
    VnUtilStatsFile f;
    int n = 0;

    vn_util_stats_file_start(&f, path, counter_json, &n);
    ck_assert_int_eq(kill(getpid(), SIGUSR1), 0);
    for (int i = 0; i < 200 && n == 0; i++) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    ck_assert(g_file_get_contents(path, &text, NULL, NULL));
    ck_assert_str_eq(text, "{\"n\":1}");
    vn_util_stats_file_stop(&f);
    g_clear_pointer(&text, g_free);
    ck_assert(g_file_get_contents(path, &text, NULL, NULL));
    ck_assert_str_eq(text, "{\"n\":2}");
    ck_assert_int_eq(f.usr1, 0);
    g_unlink(path);
    g_rmdir(dir);
}
END_TEST

START_TEST(test_size_text)
{
    g_autofree char *mib = vn_util_size_text(256u << 20);
    g_autofree char *gib = vn_util_size_text(UINT64_C(1) << 30);
    g_autofree char *bytes = vn_util_size_text(100);

    ck_assert_str_eq(mib, "256.0 MiB");
    ck_assert_str_eq(gib, "1.0 GiB");
    ck_assert_str_eq(bytes, "100 bytes");
}
END_TEST

static Suite *util_suite(void)
{
    Suite *s = suite_create("util");
    TCase *tc;

    tc = tcase_create("json");
    tcase_add_test(tc, test_json_string_member);
    suite_add_tcase(s, tc);

    tc = tcase_create("snapshot");
    tcase_add_test(tc, test_snapshot_replaces);
    tcase_add_test(tc, test_snapshot_error);
    tcase_add_test(tc, test_stats_file);
    suite_add_tcase(s, tc);

    tc = tcase_create("size");
    tcase_add_test(tc, test_size_text);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(util_suite());
}
