/*
 * The daemon rig of the daemon's unit suites (check_daemon, check_stats,
 * check_unplug): real daemons in this process on a shm fabric of their own,
 * a fake worker launcher that records what it was asked, and helpers that
 * iterate the one main context until something holds.
 */
#ifndef VN_CHECK_DAEMON_RIG_H
#define VN_CHECK_DAEMON_RIG_H

#include "daemon/cluster-borrow.h"
#include "daemon/conf.h"
#include "daemon/daemon.h"
#include "daemon/devices.h"
#include "daemon/leases.h"
#include "daemon/port.h"
#include "daemon/workers.h"
#include "common/wctl.h"
#include "fabric/shm.h"

#include <check.h>
#include <gio/gio.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define LEASE_TIMEOUT_MS 1500

static char *tmpdir;

/* ---- a fake worker launcher ---- */

/* What the fake workers were asked, and which "run" (pids 1000 + lease). */
static struct {
    unsigned starts, stops, adopts, cancels, lend_adopts, lend_kills;
    unsigned delay_ms;   /* a start calls back this much later */
    GHashTable *running; /* pid -> socket */
    GHashTable *lenders; /* lender workers' pids */
} fake;

/* A start that calls back later (fake.delay_ms). */
typedef struct FakeStart {
    VnDaemon *d;
    VnBorrowed *b;
    VnWorkerStarted done;
    void *opaque;
    guint timer;
} FakeStart;

static inline gboolean fake_started(gpointer data)
{
    FakeStart *fs = data;

    fs->b->starting = false;
    fs->b->start_cancel = NULL;
    fs->done(fs->d, fs->b, NULL, fs->opaque);
    g_free(fs);
    return G_SOURCE_REMOVE;
}

static inline void fake_cancel(void *data)
{
    FakeStart *fs = data;
    g_autoptr(GError) error =
        g_error_new_literal(G_IO_ERROR, G_IO_ERROR_CANCELLED, "given back while starting");

    fake.cancels++;
    g_source_remove(fs->timer);
    fs->done(fs->d, NULL, error, fs->opaque);
    g_free(fs);
}

static inline void fake_start(VnDaemon *d, VnBorrowed *b, VnWorkerStarted done, void *opaque)
{
    fake.starts++;
    b->worker_pid = (GPid)(1000 + b->lease);
    g_free(b->worker_name);
    b->worker_name = g_strdup_printf("%s-w%" G_GUINT64_FORMAT, d->conf->node, b->lease);
    g_free(b->channel_path);
    b->channel_path = g_strdup_printf("%s/%s-channel.sock", d->conf->run_dir, b->worker_name);
    g_free(b->port_path);
    b->port_path = g_strdup_printf("%s/%s-port.sock", d->conf->run_dir, b->worker_name);
    g_hash_table_insert(fake.running, GINT_TO_POINTER(b->worker_pid), g_strdup(b->socket));
    if (fake.delay_ms > 0) {
        FakeStart *fs = g_new0(FakeStart, 1);

        *fs = (FakeStart){ .d = d, .b = b, .done = done, .opaque = opaque };
        fs->timer = g_timeout_add(fake.delay_ms, fake_started, fs);
        b->starting = true;
        b->start_cancel = fake_cancel;
        b->start_data = fs;
        return;
    }
    done(d, b, NULL, opaque);
}

static inline void fake_stop(VnDaemon *d, VnBorrowed *b)
{
    fake.stops++;
    g_hash_table_remove(fake.running, GINT_TO_POINTER(b->worker_pid));
    b->worker_pid = 0;
}

static inline bool fake_adopt(VnDaemon *d, VnBorrowed *b, const char *secret)
{
    const char *sock = g_hash_table_lookup(fake.running, GINT_TO_POINTER(b->worker_pid));

    fake.adopts++;
    if (sock == NULL || strcmp(sock, b->socket) != 0) {
        b->worker_pid = 0;
        return false;
    }
    return true;
}

static inline VnWctlCall *fake_stats(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque)
{
    done(g_strdup("{\"vfio_user_messages\":7}"), NULL, opaque);
    return NULL;
}

static inline VnWctlCall *fake_no_unplug(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque)
{
    done(g_strdup("{\"requested\":false}"), NULL, opaque);
    return NULL;
}

static inline VnClientState fake_client_gone(VnDaemon *d, VnBorrowed *b, gint64 since_us)
{
    return VN_CLIENT_GONE;
}

/* Lender workers: a pid that lives in fake.lenders as long as it "runs". */
static inline bool fake_lend_start(VnDaemon *d, VnLocalDevice *ld, GError **error)
{
    static GPid next = 20000;

    ld->worker_pid = next++;
    g_hash_table_add(fake.lenders, GINT_TO_POINTER(ld->worker_pid));
    return true;
}

static inline void fake_lend_stop(VnDaemon *d, VnLocalDevice *ld)
{
    g_hash_table_remove(fake.lenders, GINT_TO_POINTER(ld->worker_pid));
    ld->worker_pid = 0;
}

static inline bool fake_lend_kill(VnDaemon *d, VnLocalDevice *ld)
{
    fake.lend_kills++;
    g_hash_table_remove(fake.lenders, GINT_TO_POINTER(ld->worker_pid));
    ld->worker_pid = 0;
    return false;
}

static inline bool fake_lend_adopt(VnDaemon *d, VnLocalDevice *ld, const char *secret)
{
    fake.lend_adopts++;
    if (!g_hash_table_contains(fake.lenders, GINT_TO_POINTER(ld->worker_pid))) {
        ld->worker_pid = 0;
        return false;
    }
    return true;
}

static inline VnWctlCall *fake_lend_stats(VnDaemon *d, VnLocalDevice *ld, VnWctlDone done,
                                          void *opaque)
{
    done(g_strdup("{\"requests\":3,\"device_server\":\"answering\"}"), NULL, opaque);
    return NULL;
}

static const VnWorkerOps fake_ops = {
    .name = "fake",
    .lend_start = fake_lend_start,
    .lend_stop = fake_lend_stop,
    .lend_kill = fake_lend_kill,
    .lend_adopt = fake_lend_adopt,
    .lend_stats = fake_lend_stats,
    .start = fake_start,
    .stop = fake_stop,
    .adopt = fake_adopt,
    .stats = fake_stats,
    .request_unplug = fake_no_unplug,
    .client_state = fake_client_gone,
};

static inline void setup(void)
{
    memset(&fake, 0, sizeof(fake));
    fake.running = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    fake.lenders = g_hash_table_new(g_direct_hash, g_direct_equal);
    tmpdir = g_dir_make_tmp("vn-check-daemon-XXXXXX", NULL);
    ck_assert_ptr_nonnull(tmpdir);
}

static inline void teardown(void)
{
    g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", tmpdir);

    ck_assert_int_eq(system(cmd), 0);
    g_clear_pointer(&tmpdir, g_free);
    g_clear_pointer(&fake.running, g_hash_table_unref);
    g_clear_pointer(&fake.lenders, g_hash_table_unref);
}

/* hosta lends nvme0 to hostb and hoste (unless a test took it out of its
 * config); the others lend nothing. */
static const VnWorkerOps *ops_in_use = &fake_ops;
static bool rig_hosta_lends = true;

static inline VnDaemon *daemon_start(const char *node)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *text = g_strdup_printf(
        "[node]\nname = %s\nfabric = shm\nfabric-dir = %s/fabric\n"
        "control-socket = %s/%s.control\nstate-dir = %s/%s.state\nrun-dir = %s/%s.run\n"
        "lease-timeout-ms = %d\n%s",
        node, tmpdir, tmpdir, node, tmpdir, node, tmpdir, node, LEASE_TIMEOUT_MS,
        strcmp(node, "hosta") == 0 && rig_hosta_lends
            ? "\n[lend nvme0]\nsocket = /nonexistent/dev.sock\nallow = hostb;hoste\n"
            : "");
    g_autofree char *fabric = g_build_filename(tmpdir, "fabric", NULL);
    VnConfig *conf = vn_conf_parse(text, &error);
    VnDaemon *d;

    ck_assert_msg(conf != NULL, "%s", error ? error->message : "");
    g_mkdir_with_parents(fabric, 0700);
    d = vn_daemon_new(conf, ops_in_use, &error);
    ck_assert_msg(d != NULL, "%s", error ? error->message : "");
    return d;
}

typedef bool (*Cond)(void *opaque);

/* Run the loop until @cond holds or @ms pass; its last answer. */
static inline bool spin_until(Cond cond, void *opaque, int ms)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)ms * 1000;

    while (!cond(opaque) && g_get_monotonic_time() < deadline) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
    return cond(opaque);
}

static inline void spin(int ms)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)ms * 1000;

    while (g_get_monotonic_time() < deadline) {
        g_main_context_iteration(NULL, FALSE);
        g_usleep(1000);
    }
}

typedef struct Pair {
    VnDaemon *a, *b;
} Pair;

static inline bool knows_hosta(void *opaque)
{
    VnDaemon *b = opaque;
    VnRemoteNode *n = g_hash_table_lookup(b->nodes, "hosta");

    return n != NULL && n->link_up && n->ann != NULL;
}

/* A lender worker for @ld again (the fake's), as the daemon's respawn would. */
static inline bool d_lend_start_again(VnDaemon *d, VnLocalDevice *ld)
{
    return ld->worker_pid == 0 && d->workers->lend_start(d, ld, NULL);
}

static inline bool port_connected(void *opaque)
{
    return vn_port_connected(((VnLocalDevice *)opaque)->port);
}

static inline VnLease *lease_of(VnDaemon *a)
{
    return vn_devices_local(a, "nvme0")->lease;
}

static inline bool held(void *opaque)
{
    return lease_of(opaque)->state == VN_LEASE_HELD;
}

static inline bool free_again(void *opaque)
{
    return lease_of(opaque)->state == VN_LEASE_FREE;
}

typedef struct Done {
    bool done;
    VnBorrowed *b;
    char klass[64];
    char msg[256];
} Done;

static inline void on_done(VnDaemon *d, VnBorrowed *b, const char *klass, const char *msg,
                           void *opaque)
{
    Done *r = opaque;

    r->done = true;
    r->b = b;
    g_strlcpy(r->klass, klass ? klass : "", sizeof(r->klass));
    g_strlcpy(r->msg, msg ? msg : "", sizeof(r->msg));
}

static inline bool is_done(void *opaque)
{
    return ((Done *)opaque)->done;
}

/* hostb borrows hosta/nvme0; the lease is held (claimed) when this returns. */
static inline uint64_t borrow(VnDaemon *a, VnDaemon *b)
{
    Done r = { 0 };

    ck_assert(spin_until(knows_hosta, b, 5000));
    vn_cluster_borrow(b, "hosta", "nvme0", VN_JOB_OWNER_CONTROL, on_done, &r);
    ck_assert(spin_until(is_done, &r, 5000));
    ck_assert_msg(r.b != NULL, "%s: %s", r.klass, r.msg);
    ck_assert_uint_eq(r.b->lease, lease_of(a)->id);
    ck_assert_str_eq(lease_of(a)->holder, "hostb");
    /* hostb's next announcement claims it. */
    ck_assert(spin_until(held, a, 2000));
    return r.b->lease;
}

static inline void keep_stats(VnDaemon *d, JsonNode *root, void *opaque)
{
    *(JsonNode **)opaque = root;
}

#endif /* VN_CHECK_DAEMON_RIG_H */
