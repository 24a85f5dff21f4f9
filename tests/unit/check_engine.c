/*
 * Unit tests of the simulated device's polling thread (vfio-ntb/simdev/
 * engine.c): it polls, backs off when dormant, wakes on a kick and stops.
 * Timing bounds are loose on purpose: the machines running this are shared.
 */
#include "simdev/engine.h"

#include "check-main.h"

#include <check.h>

typedef struct Probe {
    gint calls;
    gint busy_left; /* BUSY answers still to give */
    gint seen_flag; /* the test's flag as the poll last saw it */
    gint flag;
    VnEnginePoll idle_answer;
} Probe;

static VnEnginePoll probe_poll(void *opaque)
{
    Probe *p = opaque;

    g_atomic_int_inc(&p->calls);
    g_atomic_int_set(&p->seen_flag, g_atomic_int_get(&p->flag));
    if (g_atomic_int_get(&p->busy_left) > 0) {
        g_atomic_int_add(&p->busy_left, -1);
        return VN_ENGINE_BUSY;
    }
    return p->idle_answer;
}

START_TEST(test_busy_then_dormant)
{
    g_autoptr(GError) error = NULL;
    Probe p = { .busy_left = 100, .idle_answer = VN_ENGINE_DORMANT };
    VnEngine *e = vn_engine_new("test", probe_poll, &p, &error);
    gint before, after;

    ck_assert_msg(e != NULL, "%s", error ? error->message : "");
    g_usleep(100 * 1000); /* past the 2 ms spin */
    before = g_atomic_int_get(&p.calls);
    g_usleep(200 * 1000);
    after = g_atomic_int_get(&p.calls);
    /* Dormant: sleeps grow to 20 ms, so ~10 polls in 200 ms, not thousands. */
    ck_assert_int_lt(after - before, 60);
    ck_assert_int_gt(after - before, 0);
    vn_engine_free(e);
    ck_assert_int_ge(g_atomic_int_get(&p.calls), 101);
}
END_TEST

START_TEST(test_kick_and_stop)
{
    g_autoptr(GError) error = NULL;
    Probe p = { .idle_answer = VN_ENGINE_DORMANT };
    VnEngine *e = vn_engine_new("test", probe_poll, &p, &error);
    VnEngineStats st;
    gint64 deadline;
    gint calls;

    ck_assert_ptr_nonnull(e);
    g_usleep(50 * 1000);
    g_atomic_int_set(&p.flag, 1);
    vn_engine_kick(e);
    deadline = g_get_monotonic_time() + G_USEC_PER_SEC;
    while (g_atomic_int_get(&p.seen_flag) != 1 && g_get_monotonic_time() < deadline) {
        g_usleep(1000);
    }
    ck_assert_int_eq(g_atomic_int_get(&p.seen_flag), 1);
    vn_engine_stats(e, &st);
    ck_assert_uint_ge(st.kicks, 1);
    vn_engine_free(e);
    /* Stopped means stopped: no poll after free returned. */
    calls = g_atomic_int_get(&p.calls);
    g_usleep(30 * 1000);
    ck_assert_int_eq(g_atomic_int_get(&p.calls), calls);
}
END_TEST

START_TEST(test_idle_spins_then_sleeps)
{
    g_autoptr(GError) error = NULL;
    Probe p = { .busy_left = 1, .idle_answer = VN_ENGINE_IDLE };
    VnEngine *e = vn_engine_new("test", probe_poll, &p, &error);
    gint before, after;

    ck_assert_ptr_nonnull(e);
    g_usleep(100 * 1000);
    before = g_atomic_int_get(&p.calls);
    g_usleep(200 * 1000);
    after = g_atomic_int_get(&p.calls);
    /* Idle: 2 ms sleeps, ~100 polls in 200 ms; far from a spinning core. */
    ck_assert_int_lt(after - before, 400);
    vn_engine_free(e);
    ck_assert_str_eq(vn_engine_poll_to_string(VN_ENGINE_DORMANT), "dormant");
    ck_assert_str_eq(vn_engine_poll_to_string((VnEnginePoll)42), "unknown");
}
END_TEST

static Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("backoff");

    tcase_add_test(tc, test_busy_then_dormant);
    tcase_add_test(tc, test_kick_and_stop);
    tcase_add_test(tc, test_idle_spins_then_sleeps);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(engine_suite());
}
