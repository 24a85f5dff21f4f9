/*
 * Unit tests of ntbctl top (vfio-ntb/ctl/ntbctl-top.c): a frame's rates
 * from two answers, its shape checks and sanitizing, and the loop against
 * a fake daemon (frames on a pipe are plain blocks, no terminal escapes).
 */
#include "client/ctl-client.h"
#include "ctl/ntbctl-top.h"

#include "check-main.h"
#include "common/json.h"
#include "ctl-fake.h"

static JsonNode *json(const char *text)
{
    g_autoptr(GError) error = NULL;
    JsonNode *n = vn_json_parse(text, -1, 65536, &error);

    ck_assert_msg(n != NULL, "%s", error ? error->message : "");
    return n;
}

#define ck_assert_has(text, part) \
    ck_assert_msg(strstr(text, part) != NULL, "no %s in:\n%s", part, text)

static const char first[] =
    "{\"node\": \"hosta\", \"fabric\": {\"msgs_sent\": 100, \"msgs_received\": 90,"
    " \"bad_messages\": 0, \"windows_in_use\": 2},"
    " \"lent\": [{\"device\": \"nvme0\", \"region_rw\": 50, \"config_rw\": 10,"
    "  \"relayed_irqs\": 4, \"dma_maps\": 1, \"requests\": 60, \"device_server\": \"ok\"}, null],"
    " \"borrowed\": [{\"device\": \"disk\", \"lender\": \"hostc\", \"region_forwarded\": 5,"
    "  \"config_forwarded\": 5, \"relayed_irqs\": 0, \"dma_maps\": 2, \"fabric_requests\": 12,"
    "  \"vfio_user\": {\"messages\": 40, \"region_rw\": {\"0\": 3}}}]}";
/* Two seconds later: nvme0's worker restarted (requests went down). */
static const char second[] =
    "{\"node\": \"hosta\", \"fabric\": {\"msgs_sent\": 140, \"msgs_received\": 100,"
    " \"bad_messages\": 0, \"windows_in_use\": 2},"
    " \"lent\": [{\"device\": \"nvme0\", \"region_rw\": 250, \"config_rw\": 10,"
    "  \"relayed_irqs\": 24, \"dma_maps\": 1, \"requests\": 3}, null],"
    " \"borrowed\": [{\"device\": \"disk\", \"lender\": \"hostc\", \"region_forwarded\": 8,"
    "  \"config_forwarded\": 6, \"relayed_irqs\": 0, \"dma_maps\": 3, \"fabric_requests\": 20,"
    "  \"vfio_user\": {\"messages\": 50}}]}";

START_TEST(test_rates)
{
    g_autoptr(JsonNode) a = json(first);
    g_autoptr(JsonNode) b = json(second);
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    /* The first frame: totals, no rates yet. */
    ck_assert(ntbctl_top_render(out, "hosta", NULL, a, 0, NULL, &error));
    ck_assert_has(out->str, "fabric: messages sent 100 (-/s), received 90 (-/s), bad 0; "
                            "windows in use 2\n");
    ck_assert_has(out->str, "DEVICE       ROLE      FWD/s  IRQ/s  DMA-MAP/s  REQ/s  FWD  IRQ  "
                            "DMA-MAP  REQ\n");
    ck_assert_has(out->str, "hosta/nvme0  lender    -      -      -          -      50   4    "
                            "1        60\n");
    ck_assert_has(out->str, "hostc/disk   borrower  -      -      -          -      10   0    "
                            "2        12\n");
    ck_assert_has(out->str, "(1 device's worker did not answer)\n");
    ck_assert_has(out->str, "never passes through vfio-ntb and is not counted");
    g_string_truncate(out, 0);
    /* Two seconds later: per second; a counter that went down has none. */
    ck_assert(ntbctl_top_render(out, "hosta", a, b, 2.0, NULL, &error));
    ck_assert_has(out->str, "messages sent 140 (20.0/s), received 100 (5.0/s)");
    ck_assert_has(out->str, "hosta/nvme0  lender    100.0  10.0   0.0        -      250  24   "
                            "1        3\n");
    ck_assert_has(out->str, "hostc/disk   borrower  2.0    0.0    0.5        4.0    14   0    "
                            "3        20\n");
    ck_assert_msg(strstr(out->str, " \n") == NULL, "trailing blanks:\n%s", out->str);
}
END_TEST

START_TEST(test_one_device)
{
    g_autoptr(JsonNode) a = json(first);
    g_autoptr(JsonNode) b = json(second);
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(ntbctl_top_render(out, "hosta", a, b, 2.0, "hostc/disk", &error));
    ck_assert_msg(strstr(out->str, "hosta/nvme0") == NULL, "%s", out->str);
    ck_assert_has(out->str, "hostc/disk  borrower  2.0");
    /* Every counter of it, nested ones too, with its rate. */
    ck_assert_has(out->str, "COUNTER             TOTAL  PER-SECOND\n");
    ck_assert_has(out->str, "region_forwarded    8      1.5\n");
    ck_assert_has(out->str, "vfio_user.messages  50     5.0\n");
    ck_assert_msg(strstr(out->str, "lender  ") == NULL, "strings are no counters: %s", out->str);
    g_string_truncate(out, 0);
    ck_assert(ntbctl_top_render(out, "hosta", a, b, 2.0, "hostz/none", &error));
    ck_assert_has(out->str, "no counters of hostz/none\n");
}
END_TEST

/* The daemon is a peer: a malformed answer fails, appending nothing; its
 * text cannot drive the terminal; a hostile counter shows as "-". */
static const char *const malformed[] = {
    "[1]",
    "{\"lent\": 3}",
    "{\"borrowed\": {\"device\": \"x\"}}",
};

START_TEST(test_malformed)
{
    g_autoptr(JsonNode) bad = json(malformed[_i]);
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(!ntbctl_top_render(out, "hosta", NULL, bad, 0, NULL, &error));
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL));
    ck_assert_uint_eq(out->len, 0);
}
END_TEST

START_TEST(test_hostile_text)
{
    g_autoptr(JsonNode) a = json("{\"lent\": [{\"device\": \"nv\\u001b[2Jme\", \"region_rw\": -4,"
                                 " \"relayed_irqs\": 1.5, \"dma_maps\": \"7\"}]}");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(ntbctl_top_render(out, "ho\x1bst", NULL, a, 0, NULL, &error));
    ck_assert_msg(strchr(out->str, '\x1b') == NULL, "%s", out->str);
    ck_assert_has(out->str, "ho?st/nv?[2Jme  lender  -      -      -          -      -    -    "
                            "-        -\n");
}
END_TEST

/* Run ntbctl_top with stdout on a file; its output. */
static char *top_output(const char *path, const char *device, int interval_ms, int count, int *ret,
                        GError **error)
{
    g_autofree char *file = NULL;
    char tmpl[] = "/tmp/vn-top-XXXXXX";
    int fd = mkstemp(tmpl), saved = dup(STDOUT_FILENO);
    char *text = NULL;

    ck_assert_int_ge(fd, 0);
    fflush(stdout);
    ck_assert_int_ge(dup2(fd, STDOUT_FILENO), 0);
    *ret = ntbctl_top(path, 2000, device, interval_ms, count, error);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(fd);
    ck_assert(g_file_get_contents(tmpl, &text, NULL, NULL));
    g_unlink(tmpl);
    return text;
}

START_TEST(test_loop)
{
    g_autofree char *answer = g_strdup_printf("{\"return\": %s, \"id\": %%ID%%}\n", first);
    const char *const answers[] = { answer, NULL };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;
    gint64 t0 = g_get_monotonic_time();
    int ret;

    f->answers = answers;
    ctl_fake_start(f);
    /* The fake closes each connection after one answer: top connects again. */
    text = top_output(f->path, "hostb/nvme0", 200, 3, &ret, &error);
    ctl_fake_stop(f);
    ck_assert_msg(ret == 0, "%s", error ? error->message : "");
    /* Three frames, 200 ms apart; plain blocks on a pipe. */
    ck_assert_int_ge(g_get_monotonic_time() - t0, 400 * 1000);
    ck_assert_msg(strchr(text, '\x1b') == NULL, "%s", text);
    ck_assert(g_str_has_prefix(text, "ntbctl top: hostb, "));
    ck_assert_has(text, "every 0.2 s\n");
    ck_assert_has(text, "\n\nntbctl top: hostb, ");
    ck_assert_uint_eq(f->requests->len, 3);
    for (guint i = 0; i < f->requests->len; i++) {
        const char *req = f->requests->pdata[i];

        ck_assert_has(req, "\"query-stats\"");
        ck_assert_has(req, "\"device\":\"hostb/nvme0\"");
    }
    /* The same counters each time: rates of 0. */
    ck_assert_has(text, "hostb/nvme0  lender  0.0    0.0    0.0        0.0    50");
}
END_TEST

START_TEST(test_refused)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    const char *const answers[] = {
        "{\"error\": {\"class\": \"DeviceNotFound\", \"desc\": \"no hosta/nvme9\"}, \"id\": %ID%}\n",
        NULL
    };
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;
    int ret;

    ck_assert_int_eq(ntbctl_top(f->path, 1000, NULL, 50, 1, &error), -1);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE));
    g_clear_error(&error);
    ck_assert_int_eq(ntbctl_top(f->path, 1000, NULL, 1000, -1, &error), -1);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE));
    g_clear_error(&error);
    ck_assert_int_eq(ntbctl_top(f->path, 1000, "HostA//x", 1000, 1, &error), -1);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE));
    g_clear_error(&error);
    ck_assert_int_eq(ntbctl_top("/nonexistent/control.sock", 1000, NULL, 1000, 1, &error), -1);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE));
    g_clear_error(&error);
    f->answers = answers;
    ctl_fake_start(f);
    text = top_output(f->path, "hosta/nvme9", 100, 2, &ret, &error);
    ctl_fake_stop(f);
    ck_assert_int_eq(ret, -1);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_DEVICE_NOT_FOUND));
    ck_assert_str_eq(text, "");
}
END_TEST

static Suite *top_suite(void)
{
    Suite *s = suite_create("top");
    TCase *tc = tcase_create("frame");

    tcase_add_test(tc, test_rates);
    tcase_add_test(tc, test_one_device);
    tcase_add_loop_test(tc, test_malformed, 0, G_N_ELEMENTS(malformed));
    tcase_add_test(tc, test_hostile_text);
    suite_add_tcase(s, tc);
    tc = tcase_create("loop");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_loop);
    tcase_add_test(tc, test_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(top_suite());
}
