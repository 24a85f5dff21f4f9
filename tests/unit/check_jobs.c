/*
 * Unit tests of one job per device (vfio-ntb/daemon/jobs.c): which operation each job lets
 * through, what a refusal says (the device, what it is doing, the job and its age), that
 * an end only ends the job it names, and that an owner is bounded.
 */
#include "daemon/jobs.h"

#include "check-main.h"

#include <check.h>
#include <gio/gio.h>
#include <string.h>

static const struct {
    VnJobKind kind;
    VnJobOp op;
    bool allowed;
} cases[] = {
    { VN_JOB_NONE, VN_JOB_OP_ATTACH, true },     { VN_JOB_NONE, VN_JOB_OP_REVOKE, true },
    { VN_JOB_BORROW, VN_JOB_OP_BORROW, false },  { VN_JOB_BORROW, VN_JOB_OP_ATTACH, false },
    { VN_JOB_BORROW, VN_JOB_OP_RETURN, true },   { VN_JOB_ATTACH, VN_JOB_OP_ATTACH, false },
    { VN_JOB_ATTACH, VN_JOB_OP_UNPLUG, false },  { VN_JOB_ATTACH, VN_JOB_OP_DETACH, true },
    { VN_JOB_ATTACH, VN_JOB_OP_RETURN, true },   { VN_JOB_RELEASE, VN_JOB_OP_ATTACH, false },
    { VN_JOB_RELEASE, VN_JOB_OP_UNPLUG, false }, { VN_JOB_RELEASE, VN_JOB_OP_RETURN, true },
    { VN_JOB_REPLUG, VN_JOB_OP_UNPLUG, false },  { VN_JOB_REPLUG, VN_JOB_OP_DETACH, true },
    { VN_JOB_REVOKE, VN_JOB_OP_REVOKE, false },  { VN_JOB_REVOKE, VN_JOB_OP_UNLEND, false },
    { VN_JOB_REVOKE, VN_JOB_OP_RETURN, true },   { VN_JOB_REVOKE, VN_JOB_OP_BORROW, true },
    { VN_JOB_LAST, VN_JOB_OP_ATTACH, false },    { VN_JOB_NONE, VN_JOB_OP_LAST, false },
};

START_TEST(test_table)
{
    VnJob j = { .kind = cases[_i].kind };
    g_autoptr(GError) error = NULL;
    bool refused = vn_job_refuses(&j, cases[_i].op, "hosta/nvme0", &error);

    ck_assert_msg(vn_job_allows(&j, cases[_i].op) == cases[_i].allowed, "job %s, op %s",
                  vn_job_kind_to_string(cases[_i].kind), vn_job_op_to_string(cases[_i].op));
    ck_assert(refused == !cases[_i].allowed);
    ck_assert(refused == (error != NULL));
    if (refused) {
        ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_BUSY));
        ck_assert(g_str_has_prefix(error->message, "hosta/nvme0 is "));
    }
}
END_TEST

/* The refusal a user sees names the device, what it is doing, the job and how long. */
START_TEST(test_refusal_names_job)
{
    VnJob j;
    g_autoptr(GError) error = NULL;

    vn_job_start(&j, VN_JOB_REVOKE, VN_JOB_OWNER_KERNEL);
    j.since_us -= 2100 * 1000; /* started 2.1 s ago */
    ck_assert(vn_job_refuses(&j, VN_JOB_OP_REVOKE, "hosta/nvme0", &error));
    ck_assert_str_eq(error->message, "hosta/nvme0 is being revoked (job revoke, 2.1 s)");
    ck_assert_str_eq(vn_job_name(&j), "revoke");
    ck_assert_str_eq(j.owner, "kernel");
    ck_assert_int_ge(vn_job_ms(&j), 2100);
    ck_assert_int_lt(vn_job_ms(&j), 3100);
    g_clear_error(&error);
    vn_job_start(&j, VN_JOB_ATTACH, "hostb");
    ck_assert(vn_job_refuses(&j, VN_JOB_OP_ATTACH, "hosta/nvme0", &error));
    ck_assert_str_eq(error->message, "hosta/nvme0 is being attached (job attach, 0.0 s)");
}
END_TEST

/* An end ends only the job it names: a release's timer firing after a replug began does not
 * end the replug. */
START_TEST(test_end_only_its_own)
{
    VnJob j = { 0 };

    ck_assert_ptr_null(vn_job_name(&j));
    ck_assert_int_eq(vn_job_ms(&j), 0);
    vn_job_start(&j, VN_JOB_REPLUG, VN_JOB_OWNER_DEVSERVER);
    vn_job_end(&j, VN_JOB_RELEASE);
    ck_assert_str_eq(vn_job_name(&j), "replug");
    vn_job_end(&j, VN_JOB_REPLUG);
    ck_assert_ptr_null(vn_job_name(&j));
    ck_assert_str_eq(j.owner, "");
    ck_assert(vn_job_allows(&j, VN_JOB_OP_UNPLUG));
}
END_TEST

/* A peer's name is bounded; a kind out of range is no job. */
START_TEST(test_owner_bounded)
{
    g_autofree char *long_name = g_strnfill(300, 'x');
    VnJob j;

    vn_job_start(&j, VN_JOB_BORROW, long_name);
    ck_assert_uint_eq(strlen(j.owner), VN_JOB_MAX_OWNER);
    vn_job_start(&j, VN_JOB_LAST + 3, NULL);
    ck_assert_ptr_null(vn_job_name(&j));
    ck_assert_str_eq(vn_job_kind_to_string(VN_JOB_LAST), "?");
    ck_assert_str_eq(vn_job_op_to_string(VN_JOB_OP_LAST), "?");
}
END_TEST

static Suite *jobs_suite(void)
{
    Suite *s = suite_create("jobs");
    TCase *tc = tcase_create("table");

    tcase_add_loop_test(tc, test_table, 0, G_N_ELEMENTS(cases));
    suite_add_tcase(s, tc);
    tc = tcase_create("job");
    tcase_add_test(tc, test_refusal_names_job);
    tcase_add_test(tc, test_end_only_its_own);
    tcase_add_test(tc, test_owner_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(jobs_suite());
}
