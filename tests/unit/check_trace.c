/*
 * Trace points (common/trace.c and scripts/tracetool's output): the switches by pattern, what
 * a bad pattern does (nothing), VN_TRACE and --trace together, the structured line an event
 * writes, a worker's "trace" command; and the correlation id a request carries
 * (lending/proto.c), whose peer-given form is checked.
 */
#include "common/trace.h"
#include "lending/proto.h"
#include "trace-fabric.h"
#include "trace-lending.h"

#include "check-main.h"

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int count_matching(const char *glob)
{
    int n = 0;

    for (unsigned i = 0; i < vn_trace_event_count; i++) {
        n += g_pattern_match_simple(glob, vn_trace_events[i].name);
    }
    return n;
}

static void all_off(void)
{
    ck_assert_int_eq(vn_trace_enable("-*", NULL), 0);
}

START_TEST(test_patterns)
{
    g_autofree char *on = NULL;
    int n;

    all_off();
    n = vn_trace_enable("fabric_window_*", NULL);
    ck_assert_int_eq(n, 2);
    ck_assert(trace_fabric_window_map_enabled());
    ck_assert(!trace_fabric_send_enabled());
    /* Left to right: on, then one of them off again. */
    n = vn_trace_enable("lender_*,-lender_dma_*", NULL);
    ck_assert(trace_lender_request_enabled());
    ck_assert(!trace_lender_dma_map_enabled());
    on = vn_trace_enabled_list();
    ck_assert_ptr_nonnull(strstr(on, "fabric_window_unmap"));
    ck_assert_ptr_null(strstr(on, "lender_dma_map"));
    ck_assert_int_eq(n, 2 + count_matching("lender_*") - count_matching("lender_dma_*"));
    ck_assert_int_eq(vn_trace_enable("*", NULL), (int)vn_trace_event_count);
    all_off();
}
END_TEST

static const char *const bad_patterns[] = {
    "", ",", "fabric_*,", "Fabric_*", "fabric send", "-", "lender_*;rm", "a/b", "--x",
};

START_TEST(test_bad_patterns)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *before = NULL, *after = NULL;

    all_off();
    ck_assert_int_gt(vn_trace_enable("fabric_send", NULL), 0);
    before = vn_trace_enabled_list();
    ck_assert_int_eq(vn_trace_enable(bad_patterns[_i], &error), -1);
    ck_assert_ptr_nonnull(error);
    after = vn_trace_enabled_list();
    ck_assert_str_eq(before, after);
    all_off();
}
END_TEST

START_TEST(test_too_long)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *many = g_strnfill(VN_TRACE_MAX_PATTERNS + 1, 'a');

    ck_assert_int_eq(vn_trace_enable(many, &error), -1);
    ck_assert_ptr_nonnull(error);
}
END_TEST

/* VN_TRACE first, --trace after; both left in VN_TRACE for the processes started later. */
START_TEST(test_setup)
{
    g_autoptr(GError) error = NULL;

    all_off();
    g_setenv("VN_TRACE", "lender_*", TRUE);
    ck_assert(vn_trace_setup("-lender_request,fabric_send", false, &error));
    ck_assert(trace_lender_dma_map_enabled());
    ck_assert(!trace_lender_request_enabled());
    ck_assert(trace_fabric_send_enabled());
    ck_assert_str_eq(g_getenv("VN_TRACE"), "lender_*,-lender_request,fabric_send");
    ck_assert(!vn_trace_setup("Bad", false, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "--trace"));
    g_clear_error(&error);
    g_setenv("VN_TRACE", "x y", TRUE);
    ck_assert(!vn_trace_setup(NULL, false, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "VN_TRACE"));
    g_unsetenv("VN_TRACE");
    all_off();
}
END_TEST

/* What an event writes, on stderr here (no journal): its message, nothing when off. */
START_TEST(test_emit)
{
    char path[] = "/tmp/vn-trace-XXXXXX";
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    g_autofree char *text = NULL;

    ck_assert_int_ge(fd, 0);
    all_off();
    ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
    trace_lender_request("nvme0", "hostb:7", "REGION_RW", 3, "hostb", 4);
    vn_trace_enable("lender_request", NULL);
    trace_lender_request("nvme0", "hostb:8", "REGION_RW", 4, "hostb", 4);
    fflush(stderr);
    ck_assert_int_ge(dup2(saved, STDERR_FILENO), 0);
    close(saved);
    ck_assert(g_file_get_contents(path, &text, NULL, NULL));
    unlink(path);
    close(fd);
    ck_assert_ptr_null(strstr(text, "hostb:7"));
    ck_assert_ptr_nonnull(strstr(text, "lender nvme0: request hostb:8: REGION_RW (token 4)"));
    all_off();
}
END_TEST

START_TEST(test_worker_command)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *answer = NULL;

    all_off();
    answer = vn_trace_command("fabric_route_*", &error);
    ck_assert_str_eq(answer, "{\"on\":4}");
    ck_assert_ptr_null(vn_trace_command("", &error));
    ck_assert_ptr_nonnull(error);
    all_off();
}
END_TEST

START_TEST(test_corr)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *with = vn_proto_with_corr("{\"device\":\"nvme0\"}", "hostb:12");
    g_autofree char *empty = vn_proto_with_corr("{}", "hostb:1");
    g_autofree char *refused = vn_proto_with_corr("{\"device\":\"nvme0\"}", "a\"b");
    char device[VN_MAX_DEVICE_NAME + 1], corr[VN_TRACE_MAX_CORR];

    ck_assert_str_eq(with, "{\"corr\":\"hostb:12\",\"device\":\"nvme0\"}");
    ck_assert_str_eq(empty, "{\"corr\":\"hostb:1\"}");
    ck_assert_str_eq(refused, "{\"device\":\"nvme0\"}");
    ck_assert(vn_proto_device_and_corr(with, device, corr, &error));
    ck_assert_str_eq(device, "nvme0");
    ck_assert_str_eq(corr, "hostb:12");
}
END_TEST

/* A peer's correlation id is only shown when it is one: otherwise "-", and the request
 * still goes on. */
static const char *const bad_corr[] = {
    "{\"device\":\"nvme0\",\"corr\":\"a b\"}",
    "{\"device\":\"nvme0\",\"corr\":\"\\n\"}",
    "{\"device\":\"nvme0\",\"corr\":\"\"}",
    "{\"device\":\"nvme0\",\"corr\":7}",
    "{\"device\":\"nvme0\",\"corr\":{\"x\":1}}",
    "{\"device\":\"nvme0\",\"corr\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
    "{\"device\":\"nvme0\"}",
};

START_TEST(test_bad_corr)
{
    g_autoptr(GError) error = NULL;
    char device[VN_MAX_DEVICE_NAME + 1], corr[VN_TRACE_MAX_CORR];

    ck_assert(vn_proto_device_and_corr(bad_corr[_i], device, corr, &error));
    ck_assert_str_eq(device, "nvme0");
    ck_assert_str_eq(corr, "-");
}
END_TEST

static Suite *trace_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc;

    tc = tcase_create("switches");
    tcase_add_test(tc, test_patterns);
    tcase_add_loop_test(tc, test_bad_patterns, 0, G_N_ELEMENTS(bad_patterns));
    tcase_add_test(tc, test_too_long);
    tcase_add_test(tc, test_setup);
    tcase_add_test(tc, test_worker_command);
    suite_add_tcase(s, tc);

    tc = tcase_create("emit");
    tcase_add_test(tc, test_emit);
    suite_add_tcase(s, tc);

    tc = tcase_create("correlation");
    tcase_add_test(tc, test_corr);
    tcase_add_loop_test(tc, test_bad_corr, 0, G_N_ELEMENTS(bad_corr));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(trace_suite());
}
