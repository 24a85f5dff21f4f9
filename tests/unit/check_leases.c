/*
 * Unit tests of the lender's lease state machine (vfio-ntb/daemon/leases.c):
 * a table of event sequences and the state, holder and end each leads to,
 * hostile peers included (a node claiming, returning or dropping a lease
 * that is not its own changes nothing); the listeners hear every change
 * exactly once, with the holder and id the lease had.
 */
#include "daemon/leases.h"

#include "check-main.h"

#include <check.h>
#include <string.h>

#define TIMEOUT_MS 3000
#define T0 1000000

typedef struct Rig {
    VnLeases *ls;
    VnLease *l;
    gint64 now;
    unsigned changes;
    VnLeaseChange last;
    char last_holder[64];
    bool claim; /* what the next announcement says */
    bool ok;    /* the last call's answer */
} Rig;

static void on_change(void *opaque, const VnLeaseChange *ch)
{
    Rig *r = opaque;

    r->changes++;
    r->last = *ch;
    g_strlcpy(r->last_holder, ch->old_holder ? ch->old_holder : "", sizeof(r->last_holder));
    r->last.old_holder = r->last_holder;
}

static bool claimed(void *opaque, const char *device, uint64_t id)
{
    Rig *r = opaque;

    ck_assert_str_eq(device, "nvme0");
    return r->claim && id == r->l->id;
}

/* One step: "grant hostb", "claim hostb", "omit hostb", "down hostb",
 * "return hostb" (its id), "return-stale hostb" (id - 1), "restore hostb",
 * "revoke", "forced", "tick" (within the timeout), "late" (past it). */
static void step(Rig *r, const char *s)
{
    g_auto(GStrv) w = g_strsplit(s, " ", 2);
    const char *op = w[0], *node = w[1];

    if (strcmp(op, "grant") == 0) {
        r->ok = vn_leases_grant(r->ls, r->l, node, r->now);
    } else if (strcmp(op, "restore") == 0) {
        r->ok = vn_leases_restore(r->ls, r->l, node, 41, r->now);
    } else if (strcmp(op, "claim") == 0 || strcmp(op, "omit") == 0) {
        r->claim = op[0] == 'c';
        vn_leases_announced(r->ls, node, claimed, r, r->now);
    } else if (strcmp(op, "down") == 0) {
        vn_leases_link_down(r->ls, node, r->now);
    } else if (strcmp(op, "return") == 0) {
        r->ok = vn_leases_return(r->ls, r->l, node, r->l->id);
    } else if (strcmp(op, "return-stale") == 0) {
        r->ok = vn_leases_return(r->ls, r->l, node, r->l->id - 1);
    } else if (strcmp(op, "revoke") == 0) {
        r->ok = vn_leases_revoke(r->ls, r->l, r->now);
    } else if (strcmp(op, "forced") == 0) {
        vn_leases_end(r->ls, r->l, VN_LEASE_END_REVOKED);
    } else if (strcmp(op, "tick") == 0) {
        r->now += TIMEOUT_MS / 2 * 1000;
        vn_leases_tick(r->ls, r->now);
    } else if (strcmp(op, "late") == 0) {
        r->now += (TIMEOUT_MS + 1) * 1000;
        vn_leases_tick(r->ls, r->now);
    } else {
        ck_abort_msg("bad step %s", s);
    }
    r->now += 1000;
}

static const struct {
    const char *steps; /* ';'-separated */
    VnLeaseState state;
    const char *holder; /* NULL: none */
    VnLeaseEnd end;     /* of the last change */
    bool ok;            /* the last call's answer (grant/return/revoke) */
    unsigned changes;
} cases[] = {
    /* The ordinary life of a lease. */
    { "grant hostb", VN_LEASE_GRANTED, "hostb", VN_LEASE_END_NONE, true, 1 },
    { "grant hostb;claim hostb", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE, true, 2 },
    { "grant hostb;claim hostb;return hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_RETURNED, true, 3 },
    { "grant hostb;return hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_RETURNED, true, 2 },
    { "grant hostb;grant hostc", VN_LEASE_GRANTED, "hostb", VN_LEASE_END_NONE, false, 1 },
    /* An announcement built before the grant's reply: kept, until the timeout. */
    { "grant hostb;omit hostb", VN_LEASE_GRANTED, "hostb", VN_LEASE_END_NONE, true, 1 },
    { "grant hostb;omit hostb;tick", VN_LEASE_GRANTED, "hostb", VN_LEASE_END_NONE, true, 1 },
    { "grant hostb;omit hostb;late", VN_LEASE_FREE, NULL, VN_LEASE_END_EXPIRED, true, 2 },
    /* Claimed, then let go without a RETURN reaching us (the stuck lease). */
    { "grant hostb;claim hostb;omit hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_DROPPED, true, 3 },
    { "grant hostb;claim hostb;late", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE, true, 2 },
    /* The holder's link goes down: it has the timeout to come back. */
    { "grant hostb;claim hostb;down hostb", VN_LEASE_ORPHANED, "hostb", VN_LEASE_END_NONE, true,
      3 },
    { "grant hostb;claim hostb;down hostb;tick", VN_LEASE_ORPHANED, "hostb", VN_LEASE_END_NONE,
      true, 3 },
    { "grant hostb;claim hostb;down hostb;late", VN_LEASE_FREE, NULL, VN_LEASE_END_EXPIRED, true,
      4 },
    { "grant hostb;claim hostb;down hostb;claim hostb", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE,
      true, 4 },
    { "grant hostb;claim hostb;down hostb;omit hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_DROPPED,
      true, 4 },
    { "grant hostb;claim hostb;down hostb;claim hostb;late", VN_LEASE_HELD, "hostb",
      VN_LEASE_END_NONE, true, 4 },
    /* Our own restart: the holder's first announcement decides. */
    { "restore hostb", VN_LEASE_RESTORED, "hostb", VN_LEASE_END_NONE, true, 1 },
    { "restore hostb;claim hostb", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE, true, 2 },
    { "restore hostb;omit hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_DROPPED, true, 2 },
    { "restore hostb;late", VN_LEASE_FREE, NULL, VN_LEASE_END_EXPIRED, true, 2 },
    { "restore hostb;claim hostb;return hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_RETURNED, true,
      3 },
    { "grant hostb;restore hostc", VN_LEASE_GRANTED, "hostb", VN_LEASE_END_NONE, false, 1 },
    /* Revoke: a claim keeps it revoking; a return or the grace period ends it. */
    { "grant hostb;claim hostb;revoke", VN_LEASE_REVOKING, "hostb", VN_LEASE_END_NONE, true, 3 },
    { "grant hostb;claim hostb;revoke;claim hostb", VN_LEASE_REVOKING, "hostb", VN_LEASE_END_NONE,
      true, 3 },
    { "grant hostb;claim hostb;revoke;revoke", VN_LEASE_REVOKING, "hostb", VN_LEASE_END_NONE, false,
      3 },
    { "grant hostb;claim hostb;revoke;return hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_RETURNED,
      true, 4 },
    { "grant hostb;claim hostb;revoke;forced", VN_LEASE_FREE, NULL, VN_LEASE_END_REVOKED, true, 4 },
    { "grant hostb;claim hostb;revoke;omit hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_DROPPED, true,
      4 },
    { "grant hostb;revoke;omit hostb", VN_LEASE_REVOKING, "hostb", VN_LEASE_END_NONE, true, 2 },
    { "grant hostb;claim hostb;revoke;late", VN_LEASE_REVOKING, "hostb", VN_LEASE_END_NONE, true,
      3 },
    { "revoke", VN_LEASE_FREE, NULL, VN_LEASE_END_NONE, false, 0 },
    { "forced", VN_LEASE_FREE, NULL, VN_LEASE_END_NONE, true, 0 },
    /* Hostile or confused peers change nothing. */
    { "grant hostb;claim hostb;return hostc", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE, false, 2 },
    { "grant hostb;claim hostb;return-stale hostb", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE,
      false, 2 },
    { "grant hostb;claim hostb;omit hostc", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE, true, 2 },
    { "grant hostb;claim hostc", VN_LEASE_GRANTED, "hostb", VN_LEASE_END_NONE, true, 1 },
    { "grant hostb;claim hostb;down hostc", VN_LEASE_HELD, "hostb", VN_LEASE_END_NONE, true, 2 },
    { "return hostb", VN_LEASE_FREE, NULL, VN_LEASE_END_NONE, false, 0 },
    { "claim hostb;omit hostb;down hostb;late", VN_LEASE_FREE, NULL, VN_LEASE_END_NONE, true, 0 },
};

START_TEST(test_transitions)
{
    Rig r = { .ls = vn_leases_new(TIMEOUT_MS), .now = T0, .ok = true };
    g_auto(GStrv) steps = g_strsplit(cases[_i].steps, ";", -1);

    vn_leases_listen(r.ls, on_change, &r);
    r.l = vn_leases_add(r.ls, "nvme0", NULL);
    for (char **s = steps; *s != NULL; s++) {
        step(&r, *s);
    }
    ck_assert_msg(r.l->state == cases[_i].state, "%s: state %s, expected %s", cases[_i].steps,
                  vn_lease_state_to_string(r.l->state), vn_lease_state_to_string(cases[_i].state));
    ck_assert_msg(g_strcmp0(r.l->holder, cases[_i].holder) == 0, "%s: holder %s", cases[_i].steps,
                  r.l->holder ? r.l->holder : "(none)");
    ck_assert_msg((r.l->id == 0) == (r.l->holder == NULL), "%s: id %" G_GUINT64_FORMAT,
                  cases[_i].steps, r.l->id);
    ck_assert_msg(r.changes == cases[_i].changes, "%s: %u changes, expected %u", cases[_i].steps,
                  r.changes, cases[_i].changes);
    if (r.changes > 0) {
        ck_assert_msg(r.last.end == cases[_i].end, "%s: end %s", cases[_i].steps,
                      vn_lease_end_to_string(r.last.end));
    }
    ck_assert_msg(r.ok == cases[_i].ok, "%s: last call answered %d", cases[_i].steps, r.ok);
    vn_leases_free(r.ls);
}
END_TEST

/* A lease that ends tells its listeners whose it was, and its id. */
START_TEST(test_end_names_holder)
{
    Rig r = { .ls = vn_leases_new(TIMEOUT_MS), .now = T0 };
    uint64_t id;

    vn_leases_listen(r.ls, on_change, &r);
    r.l = vn_leases_add(r.ls, "nvme0", NULL);
    ck_assert(vn_leases_grant(r.ls, r.l, "hostb", r.now));
    id = r.l->id;
    ck_assert_uint_eq(r.last.from, VN_LEASE_FREE);
    ck_assert_str_eq(r.last_holder, "hostb");
    ck_assert(vn_leases_return(r.ls, r.l, "hostb", id));
    ck_assert_uint_eq(r.last.from, VN_LEASE_GRANTED);
    ck_assert_uint_eq(r.last.old_id, id);
    ck_assert_str_eq(r.last_holder, "hostb");
    ck_assert_ptr_null(r.l->holder);
    vn_leases_free(r.ls);
}
END_TEST

/* Ids are never reused: not after a return, not after a restore. */
START_TEST(test_ids_monotonic)
{
    g_autoptr(VnLeases) ls = vn_leases_new(TIMEOUT_MS);
    VnLease *a = vn_leases_add(ls, "nvme0", NULL), *b = vn_leases_add(ls, "nvme1", NULL);
    uint64_t first;

    ck_assert(vn_leases_restore(ls, a, "hostb", 41, T0));
    ck_assert(vn_leases_grant(ls, b, "hostc", T0));
    ck_assert_uint_eq(b->id, 42);
    first = b->id;
    ck_assert(vn_leases_return(ls, b, "hostc", first));
    ck_assert(vn_leases_grant(ls, b, "hostc", T0));
    ck_assert_uint_gt(b->id, first);
    vn_leases_set_last_id(ls, 7); /* never goes back */
    ck_assert_uint_eq(vn_leases_last_id(ls), b->id);
    ck_assert(!vn_leases_restore(ls, a, "hostb", 50, T0)); /* lent already */
    ck_assert_ptr_eq(vn_leases_lookup(ls, "nvme1"), b);
    ck_assert_ptr_null(vn_leases_lookup(ls, "nvme2"));
}
END_TEST

/* Each holder's announcement judges its own leases only. */
START_TEST(test_announcement_per_holder)
{
    Rig r = { .ls = vn_leases_new(TIMEOUT_MS), .now = T0 };
    VnLease *other;

    vn_leases_listen(r.ls, on_change, &r);
    r.l = vn_leases_add(r.ls, "nvme0", NULL);
    other = vn_leases_add(r.ls, "nvme1", NULL);
    ck_assert(vn_leases_grant(r.ls, r.l, "hostb", r.now));
    ck_assert(vn_leases_restore(r.ls, other, "hostc", 99, r.now));
    r.claim = true;
    vn_leases_announced(r.ls, "hostb", claimed, &r, r.now);
    ck_assert_uint_eq(r.l->state, VN_LEASE_HELD);
    ck_assert_uint_eq(other->state, VN_LEASE_RESTORED);
    vn_leases_link_down(r.ls, "hostb", r.now);
    ck_assert_uint_eq(other->state, VN_LEASE_RESTORED);
    /* Unlending ends the lease first, so the listeners fence and announce. */
    vn_leases_remove(r.ls, other);
    ck_assert_uint_eq(r.last.end, VN_LEASE_END_UNLENT);
    ck_assert_str_eq(r.last_holder, "hostc");
    ck_assert_uint_eq(vn_leases_count(r.ls), 1);
    vn_leases_free(r.ls);
}
END_TEST

/* A listener may change the table: the second listener sees both changes. */
typedef struct Chain {
    VnLeases *ls;
    unsigned seen;
} Chain;

static void end_on_grant(void *opaque, const VnLeaseChange *ch)
{
    Chain *c = opaque;

    if (ch->lease->state == VN_LEASE_GRANTED) {
        vn_leases_end(c->ls, (VnLease *)ch->lease, VN_LEASE_END_REVOKED);
    }
}

static void count(void *opaque, const VnLeaseChange *ch)
{
    ((Chain *)opaque)->seen++;
}

START_TEST(test_listener_reenters)
{
    g_autoptr(VnLeases) ls = vn_leases_new(TIMEOUT_MS);
    Chain c = { .ls = ls };
    VnLease *l = vn_leases_add(ls, "nvme0", NULL);

    vn_leases_listen(ls, end_on_grant, &c);
    vn_leases_listen(ls, count, &c);
    ck_assert(vn_leases_grant(ls, l, "hostb", T0));
    ck_assert_uint_eq(l->state, VN_LEASE_FREE);
    ck_assert_uint_eq(c.seen, 2);
}
END_TEST

static Suite *leases_suite(void)
{
    Suite *s = suite_create("leases");
    TCase *tc = tcase_create("transitions");

    tcase_add_loop_test(tc, test_transitions, 0, G_N_ELEMENTS(cases));
    suite_add_tcase(s, tc);
    tc = tcase_create("table");
    tcase_add_test(tc, test_end_names_holder);
    tcase_add_test(tc, test_ids_monotonic);
    tcase_add_test(tc, test_announcement_per_holder);
    tcase_add_test(tc, test_listener_reenters);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(leases_suite());
}
