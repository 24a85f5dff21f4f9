/*
 * Unit tests of the daemon core (vfio-ntb/daemon/daemon.c and its parts):
 * real daemons in this process, on a shm fabric of their own, driven by
 * iterating the one main context.  A third node ("evil", a bare fabric
 * node) sends what a hostile or confused host could.  No worker is started
 * here: attach goes to a fake VnWorkerOps that records what it was asked
 * (daemon-rig.h); the e2e suites start real workers.
 */
#include "daemon-rig.h"
#include "daemon/announce.h"
#include "daemon/cluster.h"
#include "daemon/control.h"
#include "daemon/devserver.h"
#include "daemon/fence.h"
#include "daemon/peers.h"
#include "daemon/spawn-procs.h"
#include "daemon/spawn.h"
#include "daemon/stats.h"

#include "check-main.h"

#include <stdlib.h>
#include <sys/stat.h>

START_TEST(test_borrow_return)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    uint64_t lease = borrow(a, b);
    Done r = { 0 };

    ck_assert_uint_gt(lease, 0);
    vn_cluster_return(b, vn_devices_borrowed(b, "hosta/nvme0"), on_done, &r);
    ck_assert(spin_until(is_done, &r, 3000));
    ck_assert_msg(r.klass[0] == '\0', "%s: %s", r.klass, r.msg);
    ck_assert(free_again(a));
    ck_assert_ptr_null(vn_devices_borrowed(b, "hosta/nvme0"));
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A lease's end is a fence the daemon owns: a lender worker that is not connected to its
 * port cannot say it fenced, so it is killed (and the device is free and lent again);
 * a connected one that does not say so in time is killed too, and a borrow that came
 * meanwhile waits for that instead of being refused. */
START_TEST(test_fence_at_lease_end)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    VnLocalDevice *ld = vn_devices_local(a, "nvme0");
    Done r = { 0 }, again = { 0 };
    int worker;

    borrow(a, b);
    vn_cluster_return(b, vn_devices_borrowed(b, "hosta/nvme0"), on_done, &r);
    ck_assert(spin_until(is_done, &r, 3000));
    ck_assert(free_again(a));
    ck_assert_uint_eq(fake.lend_kills, 1);
    ck_assert(!ld->fence.active);

    /* A worker on its port (the connection the daemon makes for it) that never says it
     * fenced. */
    ck_assert(d_lend_start_again(a, ld));
    worker = vn_port_pair(ld->port, NULL);
    ck_assert_int_ge(worker, 0);
    ck_assert(spin_until(port_connected, ld, 2000));
    borrow(a, b);
    r = (Done){ 0 };
    vn_cluster_return(b, vn_devices_borrowed(b, "hosta/nvme0"), on_done, &r);
    ck_assert(spin_until(is_done, &r, 3000));
    ck_assert(ld->fence.active);
    vn_cluster_borrow(b, "hosta", "nvme0", VN_JOB_OWNER_CONTROL, on_done, &again);
    spin(200);
    ck_assert(!again.done); /* waits for the fence */
    ck_assert(spin_until(is_done, &again, VN_FENCE_TIMEOUT_MS + 1000));
    ck_assert_msg(again.b != NULL, "%s: %s", again.klass, again.msg);
    ck_assert_uint_eq(fake.lend_kills, 2);
    ck_assert_str_eq(lease_of(a)->holder, "hostb");
    close(worker);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A borrow made before the lender's announcement arrived is claimed long
 * before the lease timeout (a grant never claimed would end). */
START_TEST(test_borrow_before_announcement)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    Done r = { 0 };

    vn_cluster_borrow(b, "hosta", "nvme0", VN_JOB_OWNER_CONTROL, on_done, &r);
    ck_assert(spin_until(is_done, &r, 3000));
    ck_assert_msg(r.b != NULL, "%s: %s", r.klass, r.msg);
    ck_assert(spin_until(held, a, LEASE_TIMEOUT_MS / 2));
    spin(LEASE_TIMEOUT_MS + 200);
    ck_assert_uint_eq(lease_of(a)->state, VN_LEASE_HELD);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A RETURN that never reached the lender: hostb's announcements stop
 * claiming the lease, and hosta ends it (it used to keep it for ever). */
/* A second borrow of a device while the first waits for its lender is refused at once,
 * naming the first's job (the lender would have refused it as lent to us); the first one
 * gets the device. */
START_TEST(test_second_borrow_names_the_first)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    Done first = { 0 }, second = { 0 };

    ck_assert(spin_until(knows_hosta, b, 5000));
    vn_cluster_borrow(b, "hosta", "nvme0", VN_JOB_OWNER_CONTROL, on_done, &first);
    ck_assert(!first.done);
    ck_assert_str_eq(vn_job_name(vn_cluster_borrowing(b, "hosta/nvme0")), "borrow");
    vn_cluster_borrow(b, "hosta", "nvme0", VN_JOB_OWNER_CONTROL, on_done, &second);
    ck_assert(second.done);
    ck_assert_ptr_null(second.b);
    ck_assert_str_eq(second.klass, "DeviceBusy");
    ck_assert_msg(g_str_has_prefix(second.msg, "hosta/nvme0 is being borrowed (job borrow, "), "%s",
                  second.msg);
    ck_assert(spin_until(is_done, &first, 5000));
    ck_assert_msg(first.b != NULL, "%s: %s", first.klass, first.msg);
    ck_assert_ptr_null(vn_cluster_borrowing(b, "hosta/nvme0"));
    ck_assert(spin_until(held, a, 3000));
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

START_TEST(test_unclaimed_lease_ends)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");

    borrow(a, b);
    g_ptr_array_remove(b->borrowed, vn_devices_borrowed(b, "hosta/nvme0"));
    vn_announce(b);
    ck_assert(spin_until(free_again, a, 1000));
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* The lender's daemon restarts; the holder claims the lease again, then
 * returns it, and the new daemon ends it at once. */
START_TEST(test_lender_restart_then_return)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    uint64_t lease = borrow(a, b);
    Done r = { 0 };

    vn_daemon_free(a);
    a = daemon_start("hosta");
    ck_assert_uint_eq(lease_of(a)->state, VN_LEASE_RESTORED);
    ck_assert_uint_eq(lease_of(a)->id, lease);
    ck_assert(spin_until(held, a, 4000));
    vn_cluster_return(b, vn_devices_borrowed(b, "hosta/nvme0"), on_done, &r);
    ck_assert(spin_until(is_done, &r, 3000));
    ck_assert(spin_until(free_again, a, 500));
    /* Ids go on from the restored one. */
    ck_assert_uint_ge(vn_leases_last_id(a->leases), lease);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

static void record_end(void *opaque, const VnLeaseChange *ch)
{
    if (ch->lease->state == VN_LEASE_FREE) {
        *(VnLeaseEnd *)opaque = ch->end;
    }
}

static char *control(VnDaemon *d, const char *line);

/* A revoke waiting out its grace survives the lender daemon's restart: the restored lease is
 * still being revoked (its holder's claim does not make it held again) and the holder, told
 * again once it is back, gives it back; with the holder away it ends when the grace runs out
 * (revoked), not at the lease timeout, and a second revoke meanwhile is refused saying so. */
START_TEST(test_revoke_survives_lender_restart)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    VnLeaseEnd end = VN_LEASE_END_NONE;
    g_autofree char *again = NULL, *unlend = NULL, *shown = NULL;
    gint64 t0;

    borrow(a, b);
    vn_daemon_free(b); /* away: the revoke waits out its grace */
    vn_cluster_revoke(a, vn_devices_local(a, "nvme0"), 4000, VN_JOB_OWNER_CONTROL, NULL);
    ck_assert_uint_eq(lease_of(a)->state, VN_LEASE_REVOKING);
    spin(200);
    vn_daemon_free(a);
    a = daemon_start("hosta");
    ck_assert_uint_eq(lease_of(a)->state, VN_LEASE_REVOKING);
    /* Its job is the revoke, resumed by the restart; what conflicts with it is refused
     * naming it. */
    shown = control(a, "{\"execute\":\"query-device\",\"arguments\":{\"device\":"
                       "\"hosta/nvme0\"},\"id\":1}\n");
    ck_assert_msg(strstr(shown, "\"job\":\"revoke\"") != NULL &&
                      strstr(shown, "\"job_owner\":\"restart\"") != NULL,
                  "%s", shown);
    again = control(a, "{\"execute\":\"revoke\",\"arguments\":{\"device\":\"hosta/nvme0\"},"
                       "\"id\":2}\n");
    ck_assert_msg(strstr(again, "DeviceBusy") != NULL &&
                      strstr(again, "hosta/nvme0 is being revoked (job revoke, ") != NULL,
                  "%s", again);
    unlend = control(a, "{\"execute\":\"unlend\",\"arguments\":{\"name\":\"nvme0\"},"
                        "\"id\":3}\n");
    ck_assert_msg(strstr(unlend, "hosta/nvme0 is being revoked (job revoke, ") != NULL, "%s",
                  unlend);
    vn_leases_listen(a->leases, record_end, &end);
    b = daemon_start("hostb"); /* back, and claiming it */
    ck_assert(spin_until(free_again, a, 3000));
    ck_assert_int_eq(end, VN_LEASE_END_RETURNED);
    spin(300); /* its fence */

    /* The holder stays away this time. */
    borrow(a, b);
    vn_daemon_free(b);
    t0 = g_get_monotonic_time();
    vn_cluster_revoke(a, vn_devices_local(a, "nvme0"), LEASE_TIMEOUT_MS + 1000,
                      VN_JOB_OWNER_CONTROL, NULL);
    spin(200);
    vn_daemon_free(a);
    a = daemon_start("hosta");
    end = VN_LEASE_END_NONE;
    vn_leases_listen(a->leases, record_end, &end);
    ck_assert(spin_until(free_again, a, LEASE_TIMEOUT_MS + 3000));
    ck_assert_int_eq(end, VN_LEASE_END_REVOKED);
    ck_assert_int_ge(g_get_monotonic_time() - t0, (LEASE_TIMEOUT_MS + 900) * 1000);
    vn_daemon_free(a);
}
END_TEST

/* A revoke whose holder's daemon is away when it is sent reaches the holder once it is
 * back within the grace: the holder gives the device back (returned), not the grace running
 * out on a VM that was never asked (revoked).  Told twice, the holder gives it back once. */
START_TEST(test_revoke_told_when_holder_back)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    VnLeaseEnd end = VN_LEASE_END_NONE;

    borrow(a, b);
    vn_daemon_free(b); /* its link goes with it */
    spin(200);
    vn_leases_listen(a->leases, record_end, &end);
    vn_cluster_revoke(a, vn_devices_local(a, "nvme0"), 6000, VN_JOB_OWNER_CONTROL, NULL);
    ck_assert_uint_eq(lease_of(a)->state, VN_LEASE_REVOKING);
    b = daemon_start("hostb"); /* back, claiming it */
    ck_assert(spin_until(free_again, a, 4000));
    ck_assert_int_eq(end, VN_LEASE_END_RETURNED);
    spin(300); /* its fence */

    /* Heard the first time; then the link flaps during the release and it is told again. */
    borrow(a, b);
    end = VN_LEASE_END_NONE;
    vn_cluster_revoke(a, vn_devices_local(a, "nvme0"), 6000, VN_JOB_OWNER_CONTROL, NULL);
    vn_devices_local(a, "nvme0")->revoke_untold = true; /* as after a flap */
    ck_assert(spin_until(free_again, a, 4000));
    ck_assert_int_eq(end, VN_LEASE_END_RETURNED);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* The lent device's backend is its worker's: a restarted lender adopts it
 * and hands it the holder again; a lease's end is its holder going. */
START_TEST(test_lender_worker_adopted)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    VnLocalDevice *ld = vn_devices_local(a, "nvme0");
    uint64_t lease;
    GPid pid;
    Done r = { 0 };

    ck_assert_int_gt(ld->worker_pid, 0);
    ck_assert_ptr_null(vn_port_peer(ld->port));
    pid = ld->worker_pid;
    lease = borrow(a, b);
    ck_assert_str_eq(vn_port_peer(ld->port), "hostb");
    vn_daemon_free(a);
    /* Still "running": the next daemon takes it over, starts none. */
    ck_assert(g_hash_table_contains(fake.lenders, GINT_TO_POINTER(pid)));
    a = daemon_start("hosta");
    ld = vn_devices_local(a, "nvme0");
    ck_assert_uint_eq(fake.lend_adopts, 1);
    ck_assert_int_eq(ld->worker_pid, pid);
    ck_assert_uint_eq(g_hash_table_size(fake.lenders), 1);
    ck_assert_str_eq(vn_port_peer(ld->port), "hostb");
    ck_assert_uint_eq(lease_of(a)->id, lease);
    vn_cluster_return(b, vn_devices_borrowed(b, "hosta/nvme0"), on_done, &r);
    ck_assert(spin_until(is_done, &r, 3000));
    ck_assert(spin_until(free_again, a, 500));
    ck_assert_ptr_null(vn_port_peer(ld->port));
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

static bool nvme0_unlent(void *opaque)
{
    return vn_devices_local(opaque, "nvme0") == NULL;
}

/* hosta restarts with nvme0 gone from its config while hostb holds it: the
 * state file says how to reach it, so it is lent on (not yanked) until the
 * lease ends, then unlent; the next restart lends nothing. */
START_TEST(test_config_drops_lent)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    VnLocalDevice *ld;
    Done r = { 0 };

    borrow(a, b);
    vn_daemon_free(a);
    rig_hosta_lends = false;
    a = daemon_start("hosta");
    ld = vn_devices_local(a, "nvme0");
    ck_assert_ptr_nonnull(ld);
    ck_assert(ld->conf->leaving);
    ck_assert_str_eq(ld->conf->socket, "/nonexistent/dev.sock");
    ck_assert(spin_until(held, a, 4000));
    vn_cluster_return(b, vn_devices_borrowed(b, "hosta/nvme0"), on_done, &r);
    ck_assert(spin_until(is_done, &r, 3000));
    ck_assert(spin_until(nvme0_unlent, a, 1000));
    vn_daemon_free(a);
    a = daemon_start("hosta");
    ck_assert_ptr_null(vn_devices_local(a, "nvme0"));
    rig_hosta_lends = true;
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* ---- a hostile node ---- */

typedef struct Evil {
    VnFabric *fab;
    bool replied;
    int err;
    bool up;
} Evil;

static void evil_link(void *opaque, const char *peer, bool up)
{
    ((Evil *)opaque)->up = up;
}

static const VnFabricHandlers evil_handlers = { .on_link = evil_link };

static void evil_open(Evil *e, const char *name)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autofree char *dir = g_build_filename(tmpdir, "fabric", NULL);
    g_autoptr(GError) error = NULL;

    g_hash_table_insert(params, "dir", dir);
    e->fab = vn_fabric_open("shm", name, params, &evil_handlers, e, NULL, &error);
    ck_assert_msg(e->fab != NULL, "%s", error ? error->message : "");
}

static bool evil_up(void *opaque)
{
    return ((Evil *)opaque)->up;
}

static void on_evil_reply(void *opaque, VnFabricMsg *reply, int err)
{
    Evil *e = opaque;

    e->replied = true;
    e->err = err;
}

static bool evil_replied(void *opaque)
{
    return ((Evil *)opaque)->replied;
}

static int evil_request(Evil *e, const char *to, uint32_t type, const char *json)
{
    e->replied = false;
    ck_assert_int_eq(vn_fabric_request(e->fab, to, type, json, NULL, 0, on_evil_reply, e), 0);
    ck_assert(spin_until(evil_replied, e, 3000));
    return e->err;
}

START_TEST(test_hostile_peer)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    uint64_t lease = borrow(a, b);
    g_autofree char *forged = NULL, *own = NULL, *revoke = NULL, *ret = NULL;
    Evil e = { 0 };

    evil_open(&e, "evil");
    ck_assert(vn_fabric_connect(e.fab, "hosta", NULL));
    ck_assert(vn_fabric_connect(e.fab, "hostb", NULL));
    ck_assert(spin_until(evil_up, &e, 2000));
    /* It speaks for hostb, without the lease: ignored (not hostb's link). */
    forged = g_strdup("{\"node\":\"hostb\",\"devices\":[],\"holds\":[]}");
    vn_fabric_event(e.fab, "hosta", VN_PEERS_ANNOUNCE, forged, NULL, 0);
    /* Its own announcement claims hostb's lease (and a VM of its own it
     * would be served to): that is not its lease. */
    own = g_strdup_printf("{\"node\":\"evil\",\"devices\":[],\"holds\":[{\"lender\":\"hosta\","
                          "\"name\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT
                          ",\"domain\":\"evilvm\"}]}",
                          lease);
    vn_fabric_event(e.fab, "hosta", VN_PEERS_ANNOUNCE, own, NULL, 0);
    /* A REVOKE of hosta's device sent to hostb by someone else than hosta. */
    revoke = g_strdup_printf(
        "{\"device\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT ",\"grace_ms\":0}", lease);
    vn_fabric_event(e.fab, "hostb", VN_PEERS_REVOKE, revoke, NULL, 0);
    /* Returning and borrowing what is hostb's; a message type no one has. */
    ret = g_strdup_printf("{\"device\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT "}", lease);
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_RETURN, ret), -EPERM);
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_BORROW, "{\"device\":\"nvme0\"}"), -EACCES);
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_TYPE_LAST, ret), -ENOTSUP);
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_BORROW, "{\"device\":\"../x\"}"), -EINVAL);
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_REVOKE, ret), -ENOTSUP);
    /* Having hostb's device's BAR shared with itself, or its worker map its segments:
     * neither is its lease (docs/p2p.md). */
    {
        g_autofree char *p2p = g_strdup_printf("{\"device\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT
                                               ",\"node\":\"evil\",\"segments\":[1]}",
                                               lease);

        ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_P2P_SHARE, p2p), -EPERM);
        ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_P2P_ALLOW, p2p), -EPERM);
    }
    spin(300);
    ck_assert_uint_eq(lease_of(a)->state, VN_LEASE_HELD);
    ck_assert_str_eq(lease_of(a)->holder, "hostb");
    ck_assert_uint_eq(lease_of(a)->id, lease);
    ck_assert_ptr_nonnull(vn_devices_borrowed(b, "hosta/nvme0"));
    /* Only the holder says which VM has the device (hostb serves it to none). */
    ck_assert_ptr_null(vn_devices_local(a, "nvme0")->holder_domain);
    /* The forged announcement did not replace what hostb said of itself. */
    ck_assert_ptr_nonnull(g_hash_table_lookup(a->nodes, "hostb"));
    ck_assert(((VnRemoteNode *)g_hash_table_lookup(a->nodes, "hostb"))->link_up);
    vn_fabric_close(e.fab);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* The holder itself asks a share (docs/p2p.md): only of what the device's worker exported to
 * it, and only with a host the device's access list allows; an allowance only for its own
 * lease. */
START_TEST(test_p2p_share_refused)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    uint64_t lease = borrow(a, b);
    Evil e = { .fab = b->fab }; /* hostb's own node speaks */
    g_autofree char *outsider = NULL, *notits = NULL, *other = NULL, *allow = NULL;

    outsider = g_strdup_printf("{\"device\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT
                               ",\"node\":\"evil\",\"segments\":[1]}",
                               lease);
    notits = g_strdup_printf("{\"device\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT
                             ",\"node\":\"hoste\",\"segments\":[999]}",
                             lease);
    other = g_strdup_printf("{\"device\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT
                            ",\"node\":\"hoste\",\"segments\":[1]}",
                            lease + 1);
    allow = g_strdup_printf("{\"device\":\"nvme0\",\"lease\":%" G_GUINT64_FORMAT
                            ",\"node\":\"hoste\",\"segments\":[5,6]}",
                            lease);
    /* evil is not on nvme0's access list (hostb;hoste): its device may not reach it. */
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_P2P_SHARE, outsider), -EACCES);
    /* Segment 999 is no export of nvme0's worker to hostb. */
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_P2P_SHARE, notits), -EACCES);
    /* Another lease than hostb's. */
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_P2P_SHARE, other), -EPERM);
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_P2P_ALLOW, other), -EPERM);
    /* Its own lease: its device's worker may map hoste's segments 5 and 6. */
    ck_assert_int_eq(evil_request(&e, "hosta", VN_PEERS_P2P_ALLOW, allow), 0);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

typedef struct GenSeen {
    VnDaemon *d;
    uint32_t gen;
} GenSeen;

static bool gen_seen(void *opaque)
{
    GenSeen *g = opaque;
    VnBorrowed *b = vn_devices_borrowed(g->d, "hosta/nvme0");

    return b != NULL && b->server_gen_known && b->server_gen == g->gen;
}

/* How many times a lost device server came back (the holder's VM is given the device anew
 * when it grows) survives restarts of both daemons, and a return while the lender's daemon
 * was away (its adopted worker says a higher count than the one saved) is one too. */
START_TEST(test_server_generation_survives_restarts)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    VnLocalDevice *ld;
    GenSeen g = { .gen = 0 };

    borrow(a, b);
    g.d = b;
    ck_assert(spin_until(gen_seen, &g, 3000));
    ld = vn_devices_local(a, "nvme0");
    vn_devserver_changed(ld, true, 0);
    vn_devserver_changed(ld, false, 0);
    vn_devserver_changed(ld, true, 1);
    ck_assert_uint_eq(ld->server_gen, 1);
    g.gen = 1;
    ck_assert(spin_until(gen_seen, &g, 3000));

    vn_daemon_free(a);
    vn_daemon_free(b);
    a = daemon_start("hosta");
    b = daemon_start("hostb");
    ld = vn_devices_local(a, "nvme0");
    ck_assert_uint_eq(ld->server_gen, 1);
    ck_assert_uint_eq(ld->worker_server_gen, 1);
    g.d = b;
    ck_assert(gen_seen(&g)); /* from its own state file, before any announcement */

    /* The adopted worker's server came back once more while no daemon listened. */
    vn_devserver_changed(ld, true, 2);
    ck_assert_uint_eq(ld->server_gen, 2);
    g.gen = 2;
    ck_assert(spin_until(gen_seen, &g, 3000));
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

static bool knows_hoste(void *opaque)
{
    VnRemoteNode *n = g_hash_table_lookup(((VnDaemon *)opaque)->nodes, "hoste");

    return n != NULL && n->link_up;
}

/* 300 nodes that link and go (workers, or a scan) leave no trace in the
 * node table: a host joining after them is listed. */
START_TEST(test_transient_nodes_leave_no_trace)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb"), *e;

    ck_assert(spin_until(knows_hosta, b, 5000));
    for (int i = 0; i < 300; i++) {
        g_autofree char *name = g_strdup_printf("hostb-w%d", i);
        Evil w = { 0 };

        evil_open(&w, name);
        ck_assert(vn_fabric_connect(w.fab, "hosta", NULL));
        ck_assert(spin_until(evil_up, &w, 2000));
        vn_fabric_close(w.fab);
    }
    spin(100);
    ck_assert_uint_eq(g_hash_table_size(a->nodes), 1); /* hostb */
    e = daemon_start("hoste");
    ck_assert(spin_until(knows_hoste, a, 5000));
    vn_daemon_free(e);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A node holds at most VN_CONF_MAX_DEVICES leases: its announcements must
 * list them all. */
START_TEST(test_borrow_cap)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    Done r = { 0 };

    for (unsigned i = 0; i < VN_CONF_MAX_DEVICES; i++) {
        VnBorrowed *x = g_new0(VnBorrowed, 1);

        x->lender = g_strdup("hostc");
        x->name = g_strdup_printf("d%u", i);
        x->device = g_strdup_printf("hostc/d%u", i);
        x->lease = i + 1;
        g_ptr_array_add(b->borrowed, x);
    }
    ck_assert(spin_until(knows_hosta, b, 5000));
    vn_cluster_borrow(b, "hosta", "nvme0", VN_JOB_OWNER_CONTROL, on_done, &r);
    ck_assert(r.done);
    ck_assert_ptr_null(r.b);
    ck_assert_str_eq(r.klass, VN_ERR_BUSY);
    ck_assert_uint_eq(lease_of(a)->state, VN_LEASE_FREE);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A state file that cannot be written is reported and counted, never
 * dropped silently; the lease itself goes on. */
START_TEST(test_save_error_counted)
{
    g_autofree char *blocker = g_build_filename(tmpdir, "hosta.state", NULL);
    VnDaemon *a, *b;
    g_autoptr(JsonNode) stats = NULL;
    g_autofree char *text = NULL;

    /* hosta's state dir is a file: every save fails. */
    ck_assert(g_file_set_contents(blocker, "not a directory", -1, NULL));
    a = daemon_start("hosta");
    b = daemon_start("hostb");
    borrow(a, b);
    ck_assert_uint_ge(a->save_errors, 1);
    ck_assert(vn_stats_gather(a, NULL, keep_stats, &stats));
    ck_assert_ptr_nonnull(stats); /* the fake workers answer at once */
    text = json_to_string(stats, FALSE);
    ck_assert_msg(strstr(text, "\"state_save_errors\":0") == NULL &&
                      strstr(text, "\"state_save_errors\":") != NULL,
                  "%s", text);
    ck_assert_uint_eq(b->save_errors, 0);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A second daemon on a live one's control socket refuses to start. */
START_TEST(test_second_daemon_refused)
{
    VnDaemon *a = daemon_start("hosta");
    g_autoptr(GError) error = NULL;
    g_autofree char *text =
        g_strdup_printf("[node]\nname = hostz\nfabric = shm\nfabric-dir = %s/fabric\n"
                        "control-socket = %s/hosta.control\n",
                        tmpdir, tmpdir);
    VnConfig *conf = vn_conf_parse(text, &error);

    ck_assert_ptr_nonnull(conf);
    ck_assert_ptr_null(vn_daemon_new(conf, NULL, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_ADDRESS_IN_USE));
    vn_daemon_free(a);
}
END_TEST

/* ---- the control socket ---- */

/* Send one request line to @d's control socket; the reply line (owned),
 * after the greeting. */
static char *control(VnDaemon *d, const char *line)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    GString *reply = g_string_new(NULL);
    gint64 deadline = g_get_monotonic_time() + 5 * G_USEC_PER_SEC;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    char c;

    g_strlcpy(addr.sun_path, d->conf->control_socket, sizeof(addr.sun_path));
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    while (g_get_monotonic_time() < deadline) {
        ssize_t n = read(fd, &c, 1);

        if (n == 1 && c == '\n') {
            if (g_str_has_prefix(reply->str, "{\"vfio-ntbd\"")) {
                g_string_truncate(reply, 0); /* the greeting */
                continue;
            }
            break;
        }
        if (n == 1) {
            g_string_append_c(reply, c);
            continue;
        }
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    close(fd);
    return g_string_free(reply, FALSE);
}

/* attach borrows and starts a worker; a restarted daemon adopts it (and
 * not a worker that is gone); detach stops it and saves that at once. */
START_TEST(test_attach_adopt_detach)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    g_autofree char *att = NULL, *show = NULL, *det = NULL, *again = NULL, *state = NULL;
    g_autofree char *same = NULL, *other = NULL;
    g_autofree char *path = g_build_filename(tmpdir, "hostb.state", "state.json", NULL);

    ck_assert(spin_until(knows_hosta, b, 5000));
    att = control(b, "{\"execute\":\"attach\",\"arguments\":{\"device\":\"hosta/nvme0\","
                     "\"domain\":\"vm1\",\"qmp\":\"/run/x/vm1.qmp\",\"qdev-id\":\"ntb0\"},"
                     "\"id\":1}\n");
    ck_assert_msg(strstr(att, "\"return\"") != NULL && strstr(att, ".sock") != NULL, "%s", att);
    ck_assert_uint_eq(fake.starts, 1);
    ck_assert(spin_until(held, a, 2000));
    /* A restart of hostb's daemon: the worker is adopted, the lease kept. */
    vn_daemon_free(b);
    ck_assert_uint_eq(fake.stops, 0); /* workers outlive their daemon */
    b = daemon_start("hostb");
    ck_assert_uint_eq(fake.adopts, 1);
    ck_assert(spin_until(knows_hosta, b, 5000));
    show = control(b, "{\"execute\":\"query-device\",\"arguments\":{\"device\":"
                      "\"hosta/nvme0\"},\"id\":2}\n");
    ck_assert_msg(strstr(show, "\"attached_to\":\"vm1\"") != NULL, "%s", show);
    /* what the attach asked for survived the restart: the same attach again
     * changes nothing, another qdev-id is refused */
    ck_assert_msg(strstr(show, "\"qdev_id\":\"ntb0\"") != NULL, "%s", show);
    same = control(b, "{\"execute\":\"attach\",\"arguments\":{\"device\":\"hosta/nvme0\","
                      "\"domain\":\"vm1\",\"qmp\":\"/run/x/vm1.qmp\",\"qdev-id\":\"ntb0\"},"
                      "\"id\":6}\n");
    ck_assert_msg(strstr(same, "\"changed\":false") != NULL, "%s", same);
    other = control(b, "{\"execute\":\"attach\",\"arguments\":{\"device\":\"hosta/nvme0\","
                       "\"domain\":\"vm1\",\"qmp\":\"/run/x/vm1.qmp\",\"qdev-id\":\"ntb1\"},"
                       "\"id\":7}\n");
    ck_assert_msg(strstr(other, "\"DeviceBusy\"") != NULL, "%s", other);
    ck_assert_uint_eq(fake.starts, 1);
    det = control(b, "{\"execute\":\"detach\",\"arguments\":{\"device\":\"hosta/nvme0\"},"
                     "\"id\":3}\n");
    ck_assert_msg(strstr(det, "\"return\"") != NULL, "%s", det);
    ck_assert_uint_eq(fake.stops, 1);
    ck_assert(g_file_get_contents(path, &state, NULL, NULL));
    ck_assert_msg(strstr(state, "\"worker\"") == NULL, "%s", state);
    /* Attached again, and the worker dies while the daemon is away: the new
     * daemon does not adopt what is gone. */
    g_free(att);
    att = control(b, "{\"execute\":\"attach\",\"arguments\":{\"device\":\"hosta/nvme0\","
                     "\"domain\":\"vm2\"},\"id\":4}\n");
    ck_assert_msg(strstr(att, "\"return\"") != NULL, "%s", att);
    vn_daemon_free(b);
    g_hash_table_remove_all(fake.running);
    b = daemon_start("hostb");
    ck_assert(spin_until(knows_hosta, b, 5000));
    again = control(b, "{\"execute\":\"query-device\",\"arguments\":{\"device\":"
                       "\"hosta/nvme0\"},\"id\":5}\n");
    ck_assert_msg(strstr(again, "\"attached_to\":null") != NULL, "%s", again);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A worker's start does not hold up the daemon: meanwhile it answers other
 * requests, refuses a second attach of the device, and a return ends the
 * start (its attach gets an error, the lease goes back). */
START_TEST(test_attach_waits_without_blocking)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    g_autofree char *nodes = NULL, *second = NULL, *first = NULL, *ret = NULL, *shown = NULL;
    g_autofree char *unplug = NULL;
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    const char *att = "{\"execute\":\"attach\",\"arguments\":{\"device\":\"hosta/nvme0\","
                      "\"domain\":\"vm1\"},\"id\":1}\n";
    GString *line = g_string_new(NULL);
    gint64 deadline;
    int fd;
    char c;

    ck_assert(spin_until(knows_hosta, b, 5000));
    fake.delay_ms = 60000; /* a start that never finishes by itself */
    /* The first attach, on a connection of its own, waits for its worker. */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    g_strlcpy(addr.sun_path, b->conf->control_socket, sizeof(addr.sun_path));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(write(fd, att, strlen(att)), (ssize_t)strlen(att));
    ck_assert(spin_until(held, a, 2000));
    ck_assert_uint_eq(fake.starts, 1);
    nodes = control(b, "{\"execute\":\"query-nodes\",\"id\":2}\n");
    ck_assert_msg(strstr(nodes, "\"return\"") != NULL, "%s", nodes);
    /* Every conflict is refused naming the job that holds the device. */
    second = control(b, att);
    ck_assert_msg(strstr(second, "DeviceBusy") != NULL &&
                      strstr(second, "hosta/nvme0 is being attached (job attach, ") != NULL,
                  "%s", second);
    unplug = control(b, "{\"execute\":\"unplug\",\"arguments\":{\"device\":"
                        "\"hosta/nvme0\"},\"id\":5}\n");
    ck_assert_msg(strstr(unplug, "is being attached (job attach, ") != NULL, "%s", unplug);
    /* The device's job says what it waits for, since when and for whom. */
    shown = control(b, "{\"execute\":\"query-device\",\"arguments\":{\"device\":"
                       "\"hosta/nvme0\"},\"id\":4}\n");
    ck_assert_msg(strstr(shown, "\"job\":\"attach\"") != NULL &&
                      strstr(shown, "\"job_ms\":") != NULL &&
                      strstr(shown, "\"job_owner\":\"control\"") != NULL,
                  "%s", shown);
    ret = control(b, "{\"execute\":\"return\",\"arguments\":{\"device\":\"hosta/nvme0\"},"
                     "\"id\":3}\n");
    ck_assert_msg(strstr(ret, "\"return\"") != NULL, "%s", ret);
    ck_assert_uint_eq(fake.cancels, 1);
    /* The first attach was answered: with an error. */
    deadline = g_get_monotonic_time() + 3 * G_USEC_PER_SEC;
    while (g_get_monotonic_time() < deadline) {
        if (read(fd, &c, 1) == 1) {
            if (c != '\n') {
                g_string_append_c(line, c);
            } else if (g_str_has_prefix(line->str, "{\"vfio-ntbd\"")) {
                g_string_truncate(line, 0);
            } else {
                break;
            }
            continue;
        }
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    first = g_string_free(line, FALSE);
    ck_assert_msg(strstr(first, "given back while starting") != NULL, "%s", first);
    ck_assert(spin_until(free_again, a, 2000));
    close(fd);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

START_TEST(test_worker_ops_valid)
{
    VnWorkerOps ops = fake_ops;
    g_autoptr(GError) error = NULL;

    ck_assert(vn_worker_ops_valid(&fake_ops, NULL));
    ck_assert(vn_worker_ops_valid(&vn_spawn_ops, NULL));
    ops.adopt = NULL;
    ck_assert(!vn_worker_ops_valid(&ops, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "adopt"));
    ck_assert(!vn_worker_ops_valid(NULL, NULL));
}
END_TEST

/* An executable @name in @dir; @mode 0644 makes a file that is not one. */
static void put_tool(const char *dir, const char *name, int mode)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);

    ck_assert(g_file_set_contents(path, "#!/bin/sh\n", -1, NULL));
    ck_assert_int_eq(chmod(path, mode), 0);
}

/*
 * Where the daemon finds its workers: the first directory that has the
 * binary executable (an installed daemon: its own sbin, then libexec), PATH
 * after those, and an error naming every place when none has it.
 */
START_TEST(test_worker_binary_found)
{
    g_autofree char *top = g_dir_make_tmp("vn-spawn-XXXXXX", NULL);
    g_autofree char *self = g_build_filename(top, "sbin", NULL);
    g_autofree char *libexec = g_build_filename(top, "libexec", NULL);
    g_autofree char *bin = g_build_filename(top, "bin", NULL);
    g_autofree char *old_path = g_strdup(g_getenv("PATH"));
    g_autofree char *in_self = g_build_filename(self, "vfio-ntb-lender", NULL);
    g_autofree char *in_libexec = g_build_filename(libexec, "vfio-ntb-lender", NULL);
    g_autofree char *in_bin = g_build_filename(bin, "vfio-ntb-lender", NULL);
    const char *dirs[] = { self, libexec, NULL };
    g_autoptr(GError) error = NULL;
    g_autofree char *found = NULL;
    g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", top);

    ck_assert_int_eq(g_mkdir(self, 0755) | g_mkdir(libexec, 0755) | g_mkdir(bin, 0755), 0);
    g_setenv("PATH", bin, TRUE);

    /* In none: the error names each directory and PATH. */
    ck_assert_ptr_null(vn_spawn_find("vfio-ntb-lender", dirs, &error));
    ck_assert_int_eq(error->code, G_IO_ERROR_NOT_FOUND);
    ck_assert_msg(strstr(error->message, libexec) && strstr(error->message, self) &&
                      strstr(error->message, "PATH"),
                  "%s", error->message);
    g_clear_error(&error);

    /* On PATH only. */
    put_tool(bin, "vfio-ntb-lender", 0755);
    found = vn_spawn_find("vfio-ntb-lender", dirs, &error);
    ck_assert_str_eq(found, in_bin);
    g_clear_pointer(&found, g_free);

    /* libexec comes before PATH; a file there that is not executable does not count. */
    put_tool(libexec, "vfio-ntb-lender", 0644);
    found = vn_spawn_find("vfio-ntb-lender", dirs, &error);
    ck_assert_str_eq(found, in_bin);
    g_clear_pointer(&found, g_free);
    put_tool(libexec, "vfio-ntb-lender", 0755);
    found = vn_spawn_find("vfio-ntb-lender", dirs, &error);
    ck_assert_str_eq(found, in_libexec);
    g_clear_pointer(&found, g_free);

    /* The binary's own directory (the build tree) comes before libexec. */
    put_tool(self, "vfio-ntb-lender", 0755);
    found = vn_spawn_find("vfio-ntb-lender", dirs, &error);
    ck_assert_str_eq(found, in_self);
    ck_assert_ptr_null(error);

    g_setenv("PATH", old_path, TRUE);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* An idle cluster's announcements: a host we share a lease with every
 * VN_DAEMON_ANNOUNCE_EVERY beats; any other once each VN_DAEMON_REFRESH_EVERY,
 * at its own beat; one whose last send failed at the next beat. */
START_TEST(test_announcement_schedule)
{
    guint partner = 0, third[2] = { 0 }, owed = 0;

    for (guint beat = 1; beat <= 2 * VN_DAEMON_REFRESH_EVERY; beat++) {
        partner += vn_announce_due(beat, 7, false, beat % VN_DAEMON_ANNOUNCE_EVERY == 0);
        third[0] += vn_announce_due(beat, 7, false, false);
        third[1] +=
            vn_announce_due(beat, 8, false, false) && !vn_announce_due(beat, 7, false, false);
        owed += vn_announce_due(beat, 7, true, false);
    }
    ck_assert_uint_ge(partner, 2 * VN_DAEMON_REFRESH_EVERY / VN_DAEMON_ANNOUNCE_EVERY);
    ck_assert_uint_eq(third[0], 2);
    ck_assert_uint_eq(third[1], 2); /* another phase: other beats, not the same burst */
    ck_assert_uint_eq(owed, 2 * VN_DAEMON_REFRESH_EVERY);
}
END_TEST

/* One side of a link can see it go and come back alone (a connection the other side refused
 * before it knew it, a tie-break).  That side has lost what the other announced meanwhile and
 * the other does not know: told so ("answer"), it announces again at once, not at its next
 * refresh (up to VN_DAEMON_REFRESH_EVERY beats later); one announcement each way, no more. */
START_TEST(test_flap_seen_by_one_side)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    VnFabricStats before, after;

    ck_assert(spin_until(knows_hosta, b, 5000));
    spin(300);
    vn_fabric_stats(a->fab, &before);
    vn_cluster_link(b, "hosta", false); /* b's fabric says so; a's link never went */
    ck_assert(!knows_hosta(b));
    vn_cluster_link(b, "hosta", true);
    ck_assert(spin_until(knows_hosta, b, 500));
    spin(300);
    vn_fabric_stats(a->fab, &after);
    /* b's with "answer", a's answer (a beat's refresh may fall in here too); not a
     * ping-pong of answers */
    ck_assert_uint_ge(after.msgs_received - before.msgs_received, 1);
    ck_assert_uint_le(after.msgs_received - before.msgs_received, 2);
    ck_assert_uint_ge(after.msgs_sent - before.msgs_sent, 1);
    ck_assert_uint_le(after.msgs_sent - before.msgs_sent, 2);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* A peer that asks for an answer in every announcement (50 in a row) gets at most one a
 * beat: its flood does not make us send as much back. */
START_TEST(test_answer_flood_bounded)
{
    VnDaemon *a = daemon_start("hosta");
    Evil e = { 0 };
    VnFabricStats before, after;

    evil_open(&e, "evil");
    ck_assert(vn_fabric_connect(e.fab, "hosta", NULL));
    ck_assert(spin_until(evil_up, &e, 2000));
    spin(300);
    vn_fabric_stats(a->fab, &before);
    for (int i = 0; i < 50; i++) {
        ck_assert_int_eq(vn_fabric_event(e.fab, "hosta", VN_PEERS_ANNOUNCE,
                                         "{\"node\":\"evil\",\"answer\":true,\"devices\":[]}", NULL,
                                         0),
                         0);
    }
    spin(500);
    vn_fabric_stats(a->fab, &after);
    ck_assert_uint_eq(after.msgs_received - before.msgs_received, 50);
    /* one answer, one more if a beat fell in here, and its periodic announcement at most */
    ck_assert_uint_le(after.msgs_sent - before.msgs_sent, 3);
    ck_assert_uint_ge(after.msgs_sent - before.msgs_sent, 1);
    vn_fabric_close(e.fab);
    vn_daemon_free(a);
}
END_TEST

static Suite *daemon_suite(void)
{
    Suite *s = suite_create("daemon");
    TCase *tc = tcase_create("leases");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_borrow_return);
    tcase_add_test(tc, test_announcement_schedule);
    tcase_add_test(tc, test_flap_seen_by_one_side);
    tcase_add_test(tc, test_answer_flood_bounded);
    tcase_add_test(tc, test_fence_at_lease_end);
    tcase_add_test(tc, test_unclaimed_lease_ends);
    tcase_add_test(tc, test_borrow_before_announcement);
    tcase_add_test(tc, test_lender_restart_then_return);
    tcase_add_test(tc, test_revoke_survives_lender_restart);
    tcase_add_test(tc, test_revoke_told_when_holder_back);
    tcase_add_test(tc, test_server_generation_survives_restarts);
    tcase_add_test(tc, test_lender_worker_adopted);
    tcase_add_test(tc, test_config_drops_lent);
    tcase_add_test(tc, test_borrow_cap);
    tcase_add_test(tc, test_save_error_counted);
    suite_add_tcase(s, tc);
    tc = tcase_create("workers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_attach_adopt_detach);
    tcase_add_test(tc, test_attach_waits_without_blocking);
    tcase_add_test(tc, test_second_borrow_names_the_first);
    tcase_add_test(tc, test_worker_ops_valid);
    tcase_add_test(tc, test_worker_binary_found);
    suite_add_tcase(s, tc);
    tc = tcase_create("peers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hostile_peer);
    tcase_add_test(tc, test_p2p_share_refused);
    tcase_add_test(tc, test_transient_nodes_leave_no_trace);
    tcase_add_test(tc, test_second_daemon_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(daemon_suite());
}
