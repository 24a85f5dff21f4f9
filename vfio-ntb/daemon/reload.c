/*
 * Reading the config file again (SIGHUP, `systemctl reload`): what a
 * running daemon can change without a restart is applied, the rest is said
 * and left as it is.
 *
 * Applied: [lend] sections added (lent now), removed (unlent, unless a
 * lease holds the device: it stays lent, with a warning naming it, until a
 * later reload finds it free), their access lists changed (borrows from now
 * on are checked against the new list; a lease already granted stays), a
 * free device's socket/pci/managed changed (lent anew); [node] log-level.
 * Devices lent at run time (`lend`, runtime) are not the config's: a reload
 * leaves them alone, unless the config now names the same device, which
 * then becomes the config's.  Logged and ignored, needing a restart: the
 * rest of [node], [fabric], [borrow] sections, and an SR-IOV section's own
 * settings.  A file that does not pass the checks changes nothing.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "reload.h"

#include "announce.h"
#include "conf.h"
#include "devices-lend.h"
#include "devices.h"
#include "ending.h"
#include "leases.h"
#include "state.h"
#include "workers.h"

#include "common/log.h"

#include <string.h>

static VnLendConf *lend_named(GPtrArray *lends, const char *name)
{
    for (guint i = 0; i < lends->len; i++) {
        VnLendConf *lc = lends->pdata[i];

        if (lc != NULL && strcmp(lc->name, name) == 0) {
            return lc;
        }
    }
    return NULL;
}

static bool strv_same(char **a, char **b)
{
    guint n = a != NULL ? g_strv_length(a) : 0;

    if (n != (b != NULL ? g_strv_length(b) : 0)) {
        return false;
    }
    for (guint i = 0; i < n; i++) {
        if (!g_strv_contains((const char *const *)b, a[i])) {
            return false;
        }
    }
    return true;
}

/* The same device, reached the same way. */
static bool lend_same_place(const VnLendConf *a, const VnLendConf *b)
{
    return g_strcmp0(a->socket, b->socket) == 0 && g_strcmp0(a->pci, b->pci) == 0 &&
           a->managed == b->managed && a->sriov_vfs == b->sriov_vfs;
}

/* What only a restart changes: said once each, and left. */
static unsigned restart_only(VnDaemon *d, const VnConfig *next)
{
    const VnConfig *c = d->conf;
    const struct {
        const char *key, *now, *then;
    } node[] = {
        { "name", c->node, next->node },
        { "fabric", c->fabric, next->fabric },
        { "stats-file", c->stats_file, next->stats_file },
        { "metrics-file", c->metrics_file, next->metrics_file },
        { "state-dir", c->state_dir, next->state_dir },
        { "control-socket", c->control_socket, next->control_socket },
        { "run-dir", c->run_dir, next->run_dir },
        { "worker-user", c->worker_user, next->worker_user },
        { "qemu-user", c->qemu_user, next->qemu_user },
    };
    unsigned ignored = 0;
    GHashTableIter it;
    gpointer k, v;
    bool fabric_same =
        g_hash_table_size(c->fabric_params) == g_hash_table_size(next->fabric_params);
    bool borrows_same = c->borrows->len == next->borrows->len;

    for (size_t i = 0; i < G_N_ELEMENTS(node); i++) {
        if (g_strcmp0(node[i].now, node[i].then) != 0) {
            g_warning("node %s: reload: [node] %s changed (\"%s\" to \"%s\"): needs a restart; "
                      "ignored",
                      c->node, node[i].key, node[i].now ? node[i].now : "",
                      node[i].then ? node[i].then : "");
            ignored++;
        }
    }
    if (c->metrics_interval_ms != next->metrics_interval_ms) {
        g_warning("node %s: reload: [node] metrics-interval-ms changed (%u to %u): needs a "
                  "restart; ignored",
                  c->node, c->metrics_interval_ms, next->metrics_interval_ms);
        ignored++;
    }
    if (c->lease_timeout_ms != next->lease_timeout_ms) {
        g_warning("node %s: reload: [node] lease-timeout-ms changed (%u to %u): needs a restart; "
                  "ignored",
                  c->node, c->lease_timeout_ms, next->lease_timeout_ms);
        ignored++;
    }
    g_hash_table_iter_init(&it, c->fabric_params);
    while (fabric_same && g_hash_table_iter_next(&it, &k, &v)) {
        fabric_same = g_strcmp0(v, g_hash_table_lookup(next->fabric_params, k)) == 0;
    }
    if (!fabric_same) {
        g_warning("node %s: reload: [fabric] or fabric-dir changed: needs a restart; ignored",
                  c->node);
        ignored++;
    }
    for (guint i = 0; borrows_same && i < c->borrows->len; i++) {
        const VnBorrowConf *a = c->borrows->pdata[i], *b = next->borrows->pdata[i];

        borrows_same = strcmp(a->name, b->name) == 0 && strcmp(a->lender, b->lender) == 0 &&
                       strcmp(a->device, b->device) == 0 && strcmp(a->socket, b->socket) == 0 &&
                       a->irq_mode == b->irq_mode;
    }
    if (!borrows_same) {
        g_warning("node %s: reload: [borrow] sections changed: they take effect at the next "
                  "start; ignored",
                  c->node);
        ignored++;
    }
    return ignored;
}

/* Every VnLocalDevice lc stands for: itself, or an SR-IOV section's VFs. */
static GPtrArray *devices_of(VnDaemon *d, const VnLendConf *lc)
{
    GPtrArray *out = g_ptr_array_new();

    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (ld->conf == lc ||
            (lc->sriov_vfs > 0 && ld->conf->vf && g_str_has_prefix(ld->conf->name, lc->name) &&
             g_str_has_prefix(ld->conf->name + strlen(lc->name), "-vf"))) {
            g_ptr_array_add(out, ld);
        }
    }
    return out;
}

/* Lend @lc (d->conf->lends takes it) and start its worker, as `lend` does. */
static bool lend_now(VnDaemon *d, VnLendConf *lc)
{
    g_autoptr(GError) error = NULL;
    VnLocalDevice *ld;

    if (vn_ending_busy(d, lc->name)) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, lc->name, NULL, 0,
               "node %s: reload: the last lender worker of %s is still stopping; reload "
               "again to lend it",
               d->conf->node, lc->name);
        vn_conf_lend_free(lc);
        return false;
    }
    g_ptr_array_add(d->conf->lends, lc);
    if (lc->sriov_vfs > 0) {
        if (!vn_devices_lend_vfs(d, lc, &error)) {
            g_warning("node %s: reload: %s", d->conf->node, error->message);
            return false;
        }
        g_autoptr(GPtrArray) vfs = devices_of(d, lc);

        for (guint i = 0; i < vfs->len; i++) {
            ld = vfs->pdata[i];
            /* Its own VFs only, and only those without a worker or one due
             * (a respawn timer starts that one). */
            if (ld->worker_pid == 0 && ld->respawn_timer == 0 &&
                !d->workers->lend_start(d, ld, &error)) {
                g_warning("node %s: reload: lending %s: %s", d->conf->node, ld->conf->name,
                          error->message);
                g_clear_error(&error);
            }
        }
        return true;
    }
    ld = vn_devices_lend(d, lc, &error);
    if (ld == NULL) {
        g_ptr_array_remove(d->conf->lends, lc);
        g_warning("node %s: reload: %s", d->conf->node, error->message);
        return false;
    }
    if (!d->workers->lend_start(d, ld, &error)) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, ld->conf->name, NULL, 0,
               "node %s: reload: lending %s: %s", d->conf->node, ld->conf->name, error->message);
        vn_devices_unlend(d, ld);
        return false;
    }
    return true;
}

/* Stop lending @ld unless a lease holds it (then it stays, said, and
 * @after says what happens when the lease ends). */
static bool unlend_if_free(VnDaemon *d, VnLocalDevice *ld, const char *why, const char *after)
{
    if (vn_lease_lent(ld->lease)) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, ld->conf->name, ld->lease->holder, ld->lease->id,
               "node %s: reload: %s %s, but it is lent to %s (lease %" G_GUINT64_FORMAT
               "): it stays as it is until the lease ends (revoke it to end it now), then %s",
               d->conf->node, ld->conf->name, why, ld->lease->holder, ld->lease->id, after);
        return false;
    }
    vn_devices_unlend(d, ld);
    return true;
}

/* A new access list for @lc (and its VFs); a holder it no longer names keeps
 * its lease until it ends. */
static void set_allow(VnDaemon *d, VnLendConf *lc, char **allow)
{
    g_autoptr(GPtrArray) lds = devices_of(d, lc);
    g_autofree char *list = g_strjoinv(";", allow);

    g_strfreev(lc->allow);
    lc->allow = g_strdupv(allow);
    for (guint i = 0; i < lds->len; i++) {
        VnLocalDevice *ld = lds->pdata[i];

        if (ld->conf != lc) {
            g_strfreev(ld->conf->allow);
            ld->conf->allow = g_strdupv(allow);
        }
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, ld->conf->name, NULL, 0,
               "node %s: reload: %s may be borrowed by %.200s now", d->conf->node, ld->conf->name,
               strcmp(list, "*") == 0 ? "any node" : list);
        if (vn_lease_lent(ld->lease) && !vn_lend_conf_allows(ld->conf, ld->lease->holder)) {
            vn_log(G_LOG_LEVEL_WARNING, d->conf->node, ld->conf->name, ld->lease->holder,
                   ld->lease->id,
                   "node %s: reload: %s is lent to %s, whom its new access list does not name: "
                   "the lease stays until it ends (revoke it to end it now)",
                   d->conf->node, ld->conf->name, ld->lease->holder);
        }
    }
}

typedef struct Counts {
    unsigned added, removed, kept, changed;
} Counts;

/* The config's [lend] sections no longer in @next. */
static void removed_lends(VnDaemon *d, VnConfig *next, Counts *n)
{
    for (guint i = d->conf->lends->len; i-- > 0;) {
        VnLendConf *lc = d->conf->lends->pdata[i];
        g_autoptr(GPtrArray) lds = NULL;
        bool all = true;

        if (lc->runtime || lc->vf || lend_named(next->lends, lc->name) != NULL) {
            continue;
        }
        lds = devices_of(d, lc);
        for (guint j = 0; j < lds->len; j++) {
            VnLocalDevice *ld = lds->pdata[j];

            if (ld->conf != lc) {
                /* A VF: its conf goes with its device. */
                all &= unlend_if_free(d, ld, "is no longer in the config", "reload again");
            }
        }
        if (lc->sriov_vfs == 0 && lds->len == 1) {
            /* unlending frees lc too; a lent one goes when its lease ends */
            if (!unlend_if_free(d, lds->pdata[0], "is no longer in the config", "is unlent")) {
                lc->leaving = true;
                all = false;
            }
        } else if (all) {
            g_ptr_array_remove_index(d->conf->lends, i); /* an SR-IOV section's own conf */
        }
        n->removed += all;
        n->kept += !all;
    }
}

/* @next's [lend] sections: new ones lent, changed ones changed. */
static void added_lends(VnDaemon *d, VnConfig *next, Counts *n)
{
    for (guint i = 0; i < next->lends->len; i++) {
        VnLendConf *want = next->lends->pdata[i];
        VnLendConf *cur = lend_named(d->conf->lends, want->name);
        VnLocalDevice *ld = cur != NULL ? vn_devices_local(d, cur->name) : NULL;

        if (cur == NULL) {
            next->lends->pdata[i] = NULL; /* ours now */
            n->added += lend_now(d, want);
            continue;
        }
        if (cur->vf) {
            g_warning("node %s: reload: [lend %s] names one of an SR-IOV section's functions: "
                      "ignored",
                      d->conf->node, want->name);
            continue;
        }
        if (cur->runtime) {
            if (!lend_same_place(cur, want)) {
                vn_log(G_LOG_LEVEL_WARNING, d->conf->node, cur->name, NULL, 0,
                       "node %s: reload: [lend %s] names a device lent with `lend` as %s: "
                       "that one stays; unlend it and reload to lend the config's",
                       d->conf->node, want->name, vn_conf_lend_where(cur));
                continue;
            }
            cur->runtime = false; /* the config's from now on */
        }
        if (cur->leaving) {
            vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, cur->name, NULL, 0,
                   "node %s: reload: %s is in the config again: it stays lent after its lease",
                   d->conf->node, cur->name);
            cur->leaving = false;
        }
        if (!lend_same_place(cur, want)) {
            if (cur->sriov_vfs > 0 || want->sriov_vfs > 0 || ld == NULL) {
                g_warning("node %s: reload: [lend %s]: an SR-IOV section's functions change "
                          "at the next start; ignored",
                          d->conf->node, want->name);
                continue;
            }
            if (unlend_if_free(d, ld, "changed", "reload again")) {
                next->lends->pdata[i] = NULL;
                n->changed += lend_now(d, want);
            }
            continue;
        }
        if (!strv_same(cur->allow, want->allow)) {
            set_allow(d, cur, want->allow);
            n->changed++;
        }
    }
}

bool vn_daemon_reload(VnDaemon *d, const char *path, char **summary, GError **error)
{
    g_autoptr(VnConfig) next = vn_conf_load(path, error);
    Counts n = { 0 };
    unsigned ignored;

    if (next == NULL) {
        return false;
    }
    ignored = restart_only(d, next);
    d->conf->dma_unmap_linger_ms = next->dma_unmap_linger_ms; /* workers started from now */
    d->conf->log_level = next->log_level;
    d->conf->log_level_set = next->log_level_set;
    removed_lends(d, next, &n);
    added_lends(d, next, &n);
    vn_state_save_or_report(d);
    vn_announce(d);
    g_autofree char *line = g_strdup_printf(
        "reloaded %s: %u lent device%s added, %u removed, %u changed, %u kept (lent), %u "
        "change%s needing a restart ignored",
        path, n.added, n.added == 1 ? "" : "s", n.removed, n.changed, n.kept, ignored,
        ignored == 1 ? "" : "s");
    g_message("node %s: %s", d->conf->node, line);
    if (summary != NULL) {
        *summary = g_steal_pointer(&line);
    }
    return true;
}

char *vn_daemon_status(VnDaemon *d)
{
    unsigned lent = 0, up = 0;
    GHashTableIter it;
    gpointer v;

    for (guint i = 0; i < d->local->len; i++) {
        lent += vn_lease_lent(((VnLocalDevice *)d->local->pdata[i])->lease);
    }
    g_hash_table_iter_init(&it, d->nodes);
    while (g_hash_table_iter_next(&it, NULL, &v)) {
        up += ((VnRemoteNode *)v)->link_up;
    }
    return g_strdup_printf("lending %u (%u lent), borrowing %u, %u node%s up", d->local->len, lent,
                           d->borrowed->len, up, up == 1 ? "" : "s");
}

void vn_daemon_set_reload(VnDaemon *d, VnReloadFn fn, void *data)
{
    d->reload = fn;
    d->reload_data = data;
}
