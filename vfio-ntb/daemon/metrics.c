/*
 * Prometheus metrics for node_exporter's textfile collector (metrics.h):
 * the exposition text, the atomic writer, and the daemon's timer that
 * gathers the counters (stats.c, the same as query-stats) every
 * [node] metrics-interval-ms and once more at exit.
 *
 * Text format: prometheus/docs "Exposition formats", text-based format
 * 0.0.4 (HELP, TYPE, then every sample of a family together; counters end
 * in _total).  Every sample carries node="..." because several daemons may
 * write into one collector directory (the emulated fabric runs them all on
 * one machine) and node_exporter adds no label of its own per file.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "metrics.h"

#include "daemon.h"
#include "devices.h"
#include "leases.h"
#include "stats.h"

#include "common/util.h"

#include <stdlib.h>
#include <string.h>

/* ---- the snapshot -------------------------------------------------------- */

static void device_free(gpointer p)
{
    VnMetricsDevice *d = p;

    g_free(d->device);
    g_free(d->holder);
    g_free(d->domain);
    g_free(d);
}

static void peer_free(gpointer p)
{
    VnMetricsPeer *n = p;

    g_free(n->name);
    g_free(n);
}

VnMetricsSnapshot *vn_metrics_snapshot_new(const char *node)
{
    VnMetricsSnapshot *s = g_new0(VnMetricsSnapshot, 1);

    s->node = g_strdup(node);
    s->running = true;
    s->devices = g_ptr_array_new_with_free_func(device_free);
    s->peers = g_ptr_array_new_with_free_func(peer_free);
    return s;
}

void vn_metrics_snapshot_add_device(VnMetricsSnapshot *s, const char *device, bool lent,
                                    const char *state, bool attached)
{
    VnMetricsDevice *d = g_new0(VnMetricsDevice, 1);

    *d = (VnMetricsDevice){
        .device = g_strdup(device), .lent = lent, .state = state, .attached = attached
    };
    g_ptr_array_add(s->devices, d);
}

void vn_metrics_snapshot_device_holder(VnMetricsSnapshot *s, const char *holder, const char *domain)
{
    VnMetricsDevice *d = s->devices->len > 0 ? s->devices->pdata[s->devices->len - 1] : NULL;

    if (d != NULL) {
        g_free(d->holder);
        g_free(d->domain);
        d->holder = g_strdup(holder);
        d->domain = g_strdup(domain);
    }
}

void vn_metrics_snapshot_add_peer(VnMetricsSnapshot *s, const char *name, bool up)
{
    VnMetricsPeer *n = g_new0(VnMetricsPeer, 1);

    *n = (VnMetricsPeer){ .name = g_strdup(name), .up = up };
    g_ptr_array_add(s->peers, n);
}

void vn_metrics_snapshot_free(VnMetricsSnapshot *s)
{
    if (s == NULL) {
        return;
    }
    g_free(s->node);
    g_ptr_array_unref(s->devices);
    g_ptr_array_unref(s->peers);
    g_free(s);
}

const char *const *vn_metrics_lease_states(bool lent)
{
    /* leases.h's states; a borrower knows whether its lender still
     * confirms the lease (devices.h VnBorrowed: unconfirmed, lost). */
    static const char *lender[VN_LEASE_STATE_LAST + 1];
    static const char *const borrower[] = { "held", "unconfirmed", "lost", NULL };

    /* From leases.c's names: a new state cannot be missing here. */
    if (lender[0] == NULL) {
        for (VnLeaseState st = 0; st < VN_LEASE_STATE_LAST; st++) {
            lender[st] = vn_lease_state_to_string(st);
        }
    }
    return lent ? lender : borrower;
}

/* ---- the text -------------------------------------------------------------- */

enum { ROLE_LENDER = 1, ROLE_BORROWER = 2 };

/* Where a sample's value is in a worker's counters (lending/worker.c,
 * borrower.c vn_borrower_stats_json). */
typedef struct Source {
    unsigned roles;
    const char *key;   /* "vfio_user.messages": a member of a member */
    const char *minus; /* subtracted (a counter that includes another), or NULL */
    const char *extra; /* one more label, or NULL */
} Source;

typedef struct Family {
    const char *name;
    const char *type;
    const char *help;
    Source src[4]; /* a key of NULL ends them */
} Family;

/* Per device, from its worker.  The same thing seen from both ends of a
 * lease has one name and a role label.  The lender counts config accesses
 * among its region accesses, the borrower apart. */
static const Family device_families[] = {
    { "vfio_ntb_forwarded_accesses_total",
      "counter",
      "Guest accesses vfio-ntb trapped and forwarded over the fabric (space: bar, config); "
      "accesses to mapped BARs never pass through vfio-ntb and are not counted",
      { { ROLE_LENDER, "region_rw", "config_rw", "space=\"bar\"" },
        { ROLE_LENDER, "config_rw", NULL, "space=\"config\"" },
        { ROLE_BORROWER, "region_forwarded", NULL, "space=\"bar\"" },
        { ROLE_BORROWER, "config_forwarded", NULL, "space=\"config\"" } } },
    { "vfio_ntb_relayed_interrupts_total",
      "counter",
      "Device interrupts relayed over the fabric (irq-mode relay); interrupts passed as "
      "eventfds (irq-mode fd) are not seen",
      { { ROLE_LENDER | ROLE_BORROWER, "relayed_irqs", NULL, NULL } } },
    { "vfio_ntb_dma_maps_total",
      "counter",
      "DMA maps the lender made (the borrower's: those it sent its lender); the device's DMA "
      "itself is not seen",
      { { ROLE_LENDER | ROLE_BORROWER, "dma_maps", NULL, NULL } } },
    { "vfio_ntb_dma_unmaps_total",
      "counter",
      "DMA unmaps the lender made (the borrower's: those it sent its lender)",
      { { ROLE_LENDER | ROLE_BORROWER, "dma_unmaps", NULL, NULL } } },
    { "vfio_ntb_dma_here_total",
      "counter",
      "DMA maps and unmaps from the VM the borrower answered without its lender: the mapping "
      "lingered at the lender (dma-unmap-linger-ms)",
      { { ROLE_BORROWER, "dma_maps_here", NULL, "op=\"map\"" },
        { ROLE_BORROWER, "dma_unmaps_here", NULL, "op=\"unmap\"" } } },
    { "vfio_ntb_dma_lingering",
      "gauge",
      "DMA mappings the VM unmapped that are still mapped at the lender (for at most "
      "dma-unmap-linger-ms)",
      { { ROLE_BORROWER, "dma_lingering", NULL, NULL } } },
    { "vfio_ntb_dma_maps_refused_total",
      "counter",
      "DMA map requests from the VM its lender refused (the borrower logs each range)",
      { { ROLE_BORROWER, "dma_maps_refused", NULL, NULL } } },
    { "vfio_ntb_lender_requests_total",
      "counter",
      "Lending-protocol requests: handled by the lender, sent by the borrower",
      { { ROLE_LENDER, "requests", NULL, NULL },
        { ROLE_BORROWER, "fabric_requests", NULL, NULL } } },
    { "vfio_ntb_config_virtualized_total",
      "counter",
      "Config-space accesses the borrower answered itself",
      { { ROLE_BORROWER, "config_virtualized", NULL, NULL } } },
    { "vfio_ntb_device_resets_total",
      "counter",
      "Device resets the lender performed",
      { { ROLE_LENDER, "resets", NULL, NULL } } },
    { "vfio_ntb_fences_total",
      "counter",
      "Borrower losses and detaches the lender cleaned up after (DMA unmapped, interrupts off)",
      { { ROLE_LENDER, "fences", NULL, NULL } } },
    { "vfio_ntb_windows_mapped",
      "gauge",
      "Fabric windows the lender has mapped for this device now",
      { { ROLE_LENDER, "windows", NULL, NULL } } },
    { "vfio_ntb_device_requests_total",
      "counter",
      "Times the lending host asked for the device back (VFIO device request)",
      { { ROLE_LENDER, "device_requests", NULL, NULL } } },
    { "vfio_ntb_device_timeouts_total",
      "counter",
      "Commands the device server did not answer in time",
      { { ROLE_LENDER, "device_timeouts", NULL, NULL } } },
    { "vfio_ntb_device_late_replies_total",
      "counter",
      "Device server answers that came after their timeout (dropped)",
      { { ROLE_LENDER, "device_late_replies", NULL, NULL } } },
    { "vfio_ntb_device_server_up",
      "gauge",
      "1 while the lent device's server answers; 0 once it died or wedged (its lease's DMA "
      "is fenced; the device is presented anew to its holder when a server answers again)",
      { { ROLE_LENDER, "device_server_up", NULL, NULL } } },
    { "vfio_ntb_device_server_losses_total",
      "counter",
      "Times the lent device's server died or wedged",
      { { ROLE_LENDER, "device_server_losses", NULL, NULL } } },
    { "vfio_ntb_unplug_requests_total",
      "counter",
      "Times the borrower asked its VM to release the device",
      { { ROLE_BORROWER, "unplug_requests", NULL, NULL } } },
    { "vfio_ntb_posted_writes_total",
      "counter",
      "Forwarded BAR writes the borrower posted (answered to the VM before the device had them)",
      { { ROLE_BORROWER, "posted_writes", NULL, NULL } } },
    { "vfio_ntb_posted_write_failures_total",
      "counter",
      "Posted writes the lender's device refused (the VM was not told, as with PCIe)",
      { { ROLE_BORROWER, "posted_write_failures", NULL, NULL } } },
    { "vfio_ntb_lender_lost",
      "gauge",
      "1 when the borrower lost its lender (reads return all-ones)",
      { { ROLE_BORROWER, "lender_lost", NULL, NULL } } },
    { "vfio_ntb_client_connected",
      "gauge",
      "1 while a QEMU is connected to the borrower's vfio-user socket",
      { { ROLE_BORROWER, "client_connected", NULL, NULL } } },
    { "vfio_ntb_vfio_user_messages_total",
      "counter",
      "vfio-user messages the borrower's server handled",
      { { ROLE_BORROWER, "vfio_user.messages", NULL, NULL } } },
    { "vfio_ntb_vfio_user_errors_total",
      "counter",
      "vfio-user messages answered with an error",
      { { ROLE_BORROWER, "vfio_user.errors", NULL, NULL } } },
    { "vfio_ntb_dma_mappings",
      "gauge",
      "DMA mappings the VM holds now",
      { { ROLE_BORROWER, "vfio_user.dma_mappings_now", NULL, NULL } } },
};

/* Node counters in query-stats' "fabric" object (or at its top: "@"). */
static const struct {
    const char *key;
    const char *name;
    const char *type;
    const char *help;
} node_counters[] = {
    { "msgs_sent", "vfio_ntb_fabric_messages_sent_total", "counter",
      "Fabric messages this node sent (control, leases, forwarded accesses)" },
    { "msgs_received", "vfio_ntb_fabric_messages_received_total", "counter",
      "Fabric messages this node received" },
    { "doorbells_sent", "vfio_ntb_fabric_doorbells_sent_total", "counter",
      "Fabric doorbells this node rang (relayed interrupts)" },
    { "doorbells_received", "vfio_ntb_fabric_doorbells_received_total", "counter",
      "Fabric doorbells this node received" },
    { "doorbells_coalesced", "vfio_ntb_fabric_doorbells_coalesced_total", "counter",
      "Fabric doorbells rung beyond a peer's rate, folded into one delivery per bit" },
    { "bad_messages", "vfio_ntb_fabric_bad_messages_total", "counter",
      "Malformed fabric messages dropped" },
    { "requests_held", "vfio_ntb_fabric_requests_held_total", "counter",
      "Fabric requests this node held back until a peer answered earlier ones (it takes "
      "256 at once)" },
    { "windows_in_use", "vfio_ntb_fabric_windows_in_use", "gauge",
      "Fabric windows in use on this node, of its max-windows budget" },
    { "@state_save_errors", "vfio_ntb_state_save_errors_total", "counter",
      "Saves of the state file that failed (retried every second while failing)" },
    { "@leases_lost", "vfio_ntb_leases_lost_total", "counter",
      "Leases this node lent that ended other than by a return (expired, dropped, revoked): "
      "a guest lost its device" },
};

void vn_metrics_escape(GString *out, const char *v)
{
    for (const char *p = v; *p != '\0'; p++) {
        if (*p == '\\') {
            g_string_append(out, "\\\\");
        } else if (*p == '"') {
            g_string_append(out, "\\\"");
        } else if (*p == '\n') {
            g_string_append(out, "\\n");
        } else {
            g_string_append_c(out, *p);
        }
    }
}

/* The family's header and its samples, unless it has none. */
static void family(GString *out, const char *name, const char *type, const char *help,
                   const GString *samples)
{
    if (samples->len == 0) {
        return;
    }
    g_string_append_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    g_string_append_len(out, samples->str, (gssize)samples->len);
}

/* name{node="..."[,device="...",role="..."][,extra]} */
static void sample_start(GString *out, const char *name, const VnMetricsSnapshot *s,
                         const VnMetricsDevice *d, const char *extra)
{
    g_string_append_printf(out, "%s{node=\"", name);
    vn_metrics_escape(out, s->node);
    if (d != NULL) {
        g_string_append(out, "\",device=\"");
        vn_metrics_escape(out, d->device);
        g_string_append_printf(out, "\",role=\"%s", d->lent ? "lender" : "borrower");
    }
    g_string_append_c(out, '"');
    if (extra != NULL) {
        g_string_append_printf(out, ",%s", extra);
    }
    g_string_append(out, "} ");
}

static void device_sample(GString *samples, const char *name, const VnMetricsSnapshot *s,
                          const VnMetricsDevice *d, JsonObject *o, const Source *src)
{
    uint64_t v, minus = 0;

    if (src->key == NULL || !(src->roles & (d->lent ? ROLE_LENDER : ROLE_BORROWER)) ||
        !vn_util_json_counter(o, src->key, true, &v) ||
        (src->minus != NULL && !vn_util_json_counter(o, src->minus, true, &minus)) || minus > v) {
        return;
    }
    sample_start(samples, name, s, d, src->extra);
    g_string_append_printf(samples, "%" G_GUINT64_FORMAT "\n", v - minus);
}

/* objs[i]: the worker counters of s->devices[i], or NULL. */
static void match_devices(const VnMetricsSnapshot *s, JsonNode *stats, JsonObject **objs)
{
    JsonObject *root =
        stats != NULL && JSON_NODE_HOLDS_OBJECT(stats) ? json_node_get_object(stats) : NULL;
    JsonNode *lent = root != NULL ? json_object_get_member(root, "lent") : NULL;
    JsonNode *borrowed = root != NULL ? json_object_get_member(root, "borrowed") : NULL;
    guint next_lent = 0;

    if (lent != NULL && JSON_NODE_HOLDS_ARRAY(lent)) {
        JsonArray *a = json_node_get_array(lent);

        for (guint i = 0; i < s->devices->len; i++) {
            const VnMetricsDevice *d = s->devices->pdata[i];
            JsonNode *n;

            if (!d->lent) {
                continue;
            }
            n = next_lent < json_array_get_length(a) ? json_array_get_element(a, next_lent) : NULL;
            next_lent++;
            objs[i] = n != NULL && JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
        }
    }
    if (borrowed == NULL || !JSON_NODE_HOLDS_ARRAY(borrowed)) {
        return;
    }
    for (guint j = 0; j < json_array_get_length(json_node_get_array(borrowed)); j++) {
        JsonNode *n = json_array_get_element(json_node_get_array(borrowed), j);
        JsonObject *o = JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
        const char *dev = o != NULL ? vn_util_json_string(o, "device") : NULL;
        const char *lender = o != NULL ? vn_util_json_string(o, "lender") : NULL;
        g_autofree char *full = NULL;

        /* A borrower worker names the lender's device and the lender
         * apart (borrower.c vn_borrower_stats_json). */
        if (dev == NULL) {
            continue;
        }
        full = strchr(dev, '/') != NULL || lender == NULL ? g_strdup(dev)
                                                          : g_strdup_printf("%s/%s", lender, dev);
        for (guint i = 0; i < s->devices->len; i++) {
            const VnMetricsDevice *d = s->devices->pdata[i];

            if (!d->lent && objs[i] == NULL && strcmp(d->device, full) == 0) {
                objs[i] = o;
                break;
            }
        }
    }
}

static void node_families(GString *out, const VnMetricsSnapshot *s, JsonNode *stats)
{
    JsonObject *root =
        stats != NULL && JSON_NODE_HOLDS_OBJECT(stats) ? json_node_get_object(stats) : NULL;
    JsonNode *fab = root != NULL ? json_object_get_member(root, "fabric") : NULL;
    g_autoptr(GString) samples = g_string_new(NULL);

    sample_start(samples, "vfio_ntb_up", s, NULL, NULL);
    g_string_append_printf(samples, "%d\n", s->running ? 1 : 0);
    family(out, "vfio_ntb_up", "gauge", "1 while vfio-ntbd runs; 0 in the file it writes at exit",
           samples);
    g_string_truncate(samples, 0);
    sample_start(samples, "vfio_ntb_metrics_timestamp_seconds", s, NULL, NULL);
    g_string_append_printf(samples, "%" G_GINT64_FORMAT ".%03d\n", s->unix_ms / 1000,
                           (int)(s->unix_ms % 1000));
    family(out, "vfio_ntb_metrics_timestamp_seconds", "gauge",
           "When vfio-ntbd wrote this file (Unix time)", samples);
    for (size_t i = 0; i < G_N_ELEMENTS(node_counters); i++) {
        const char *key = node_counters[i].key;
        JsonNode *where = key[0] == '@' ? stats : fab;
        uint64_t v;

        g_string_truncate(samples, 0);
        if (where != NULL && JSON_NODE_HOLDS_OBJECT(where) &&
            vn_util_json_counter(json_node_get_object(where), key[0] == '@' ? key + 1 : key, true,
                                 &v)) {
            sample_start(samples, node_counters[i].name, s, NULL, NULL);
            g_string_append_printf(samples, "%" G_GUINT64_FORMAT "\n", v);
        }
        family(out, node_counters[i].name, node_counters[i].type, node_counters[i].help, samples);
    }
    g_string_truncate(samples, 0);
    for (guint i = 0; i < s->peers->len; i++) {
        const VnMetricsPeer *p = s->peers->pdata[i];
        g_autoptr(GString) extra = g_string_new("peer=\"");

        vn_metrics_escape(extra, p->name);
        g_string_append_c(extra, '"');
        sample_start(samples, "vfio_ntb_peer_link_up", s, NULL, extra->str);
        g_string_append_printf(samples, "%d\n", p->up ? 1 : 0);
    }
    family(out, "vfio_ntb_peer_link_up", "gauge", "1 while the fabric link to the peer node is up",
           samples);
}

/* What the daemon itself knows of each device, worker or not. */
static void state_families(GString *out, const VnMetricsSnapshot *s, JsonObject **objs)
{
    g_autoptr(GString) samples = g_string_new(NULL);

    for (guint i = 0; i < s->devices->len; i++) {
        const VnMetricsDevice *d = s->devices->pdata[i];

        for (const char *const *st = vn_metrics_lease_states(d->lent); *st != NULL; st++) {
            g_autoptr(GString) extra = g_string_new(NULL);

            g_string_printf(extra, "state=\"%s\"", *st);
            /* Who uses it, on the lender: one query answers "which VM on
             * which host has hosta/nvme0". */
            if (d->holder != NULL) {
                g_string_append(extra, ",borrower=\"");
                vn_metrics_escape(extra, d->holder);
                g_string_append_c(extra, '"');
            }
            if (d->domain != NULL) {
                g_string_append(extra, ",domain=\"");
                vn_metrics_escape(extra, d->domain);
                g_string_append_c(extra, '"');
            }

            sample_start(samples, "vfio_ntb_lease_state", s, d, extra->str);
            g_string_append_printf(samples, "%d\n", strcmp(*st, d->state) == 0 ? 1 : 0);
        }
    }
    family(out, "vfio_ntb_lease_state", "gauge",
           "The device's lease: 1 for its current state (lender: free, granted, held, orphaned, "
           "restored, revoking; borrower: held, unconfirmed, lost)",
           samples);
    g_string_truncate(samples, 0);
    for (guint i = 0; i < s->devices->len; i++) {
        const VnMetricsDevice *d = s->devices->pdata[i];

        if (!d->lent) {
            sample_start(samples, "vfio_ntb_attached", s, d, NULL);
            g_string_append_printf(samples, "%d\n", d->attached ? 1 : 0);
        }
    }
    family(out, "vfio_ntb_attached", "gauge",
           "1 while the borrowed device is served to a VM (its worker runs)", samples);
    g_string_truncate(samples, 0);
    for (guint i = 0; i < s->devices->len; i++) {
        sample_start(samples, "vfio_ntb_worker_counters", s, s->devices->pdata[i], NULL);
        g_string_append_printf(samples, "%d\n", objs[i] != NULL ? 1 : 0);
    }
    family(out, "vfio_ntb_worker_counters", "gauge",
           "1 when the device's worker answered for its counters; 0: they are left out of "
           "this file (no worker runs, it did not answer, or vfio-ntbd was stopping)",
           samples);
}

char *vn_metrics_text(const VnMetricsSnapshot *s, JsonNode *stats)
{
    GString *out = g_string_new(NULL);
    g_autoptr(GString) samples = g_string_new(NULL);
    g_autofree JsonObject **objs = g_new0(JsonObject *, s->devices->len + 1);

    match_devices(s, stats, objs);
    node_families(out, s, stats);
    state_families(out, s, objs);
    for (size_t f = 0; f < G_N_ELEMENTS(device_families); f++) {
        const Family *fam = &device_families[f];

        g_string_truncate(samples, 0);
        for (guint i = 0; i < s->devices->len; i++) {
            if (objs[i] == NULL) {
                continue;
            }
            for (size_t k = 0; k < G_N_ELEMENTS(fam->src); k++) {
                device_sample(samples, fam->name, s, s->devices->pdata[i], objs[i], &fam->src[k]);
            }
        }
        family(out, fam->name, fam->type, fam->help, samples);
    }
    return g_string_free(out, FALSE);
}

/* ---- the file ------------------------------------------------------------- */

bool vn_metrics_write(const char *path, const char *text, GError **error)
{
    /* Written aside and renamed over: node_exporter never reads half a file. */
    return vn_util_write_snapshot(path, text, error);
}

/* ---- the daemon's timer --------------------------------------------------- */

typedef struct Pending Pending;

struct VnMetrics {
    guint timer;
    Pending *inflight; /* the gather under way, at most one */
    bool failing;      /* the last write failed (logged once per streak) */
};

struct Pending {
    VnMetrics *m; /* NULL once cancelled: the daemon stopped first */
    VnMetricsSnapshot *snap;
};

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static VnMetricsSnapshot *snapshot(VnDaemon *d, bool running)
{
    VnMetricsSnapshot *s = vn_metrics_snapshot_new(d->conf->node);
    g_autofree gpointer *names = NULL;
    guint n = 0;

    s->running = running;
    /* The order vn_stats_gather() asks in: its "lent" entries are these. */
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];
        g_autofree char *dev = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);

        vn_metrics_snapshot_add_device(s, dev, true, vn_lease_state_to_string(ld->lease->state),
                                       false);
        if (vn_lease_lent(ld->lease)) {
            vn_metrics_snapshot_device_holder(s, ld->lease->holder, ld->holder_domain);
        }
    }
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];
        const char *state = b->lost ? "lost" : b->unconfirmed ? "unconfirmed" : "held";

        vn_metrics_snapshot_add_device(s, b->device, false, state, b->worker_pid > 0);
    }
    /* Sorted, so the file reads the same from one write to the next. */
    names = g_hash_table_get_keys_as_array(d->nodes, &n);
    qsort(names, n, sizeof(*names), by_name);
    for (guint i = 0; i < n; i++) {
        VnRemoteNode *r = g_hash_table_lookup(d->nodes, names[i]);

        vn_metrics_snapshot_add_peer(s, r->name, r->link_up);
    }
    return s;
}

static void write_now(VnDaemon *d, VnMetrics *m, VnMetricsSnapshot *s, JsonNode *root)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;

    s->unix_ms = g_get_real_time() / 1000;
    text = vn_metrics_text(s, root);
    if (!vn_metrics_write(d->conf->metrics_file, text, &error)) {
        if (m == NULL || !m->failing) {
            g_warning("node %s: metrics file: %s", d->conf->node, error->message);
        }
    } else if (m != NULL && m->failing) {
        g_message("node %s: metrics file %s written again", d->conf->node, d->conf->metrics_file);
    }
    if (m != NULL) {
        m->failing = error != NULL;
    }
}

static void gathered(VnDaemon *d, JsonNode *root, void *opaque)
{
    g_autoptr(JsonNode) owned = root;
    Pending *p = opaque;

    if (p->m != NULL) {
        p->m->inflight = NULL;
        write_now(d, p->m, p->snap, root);
    }
    vn_metrics_snapshot_free(p->snap);
    g_free(p);
}

static gboolean on_tick(gpointer data)
{
    VnDaemon *d = data;
    VnMetrics *m = d->metrics;
    Pending *p;

    /* A worker slower than the interval: its answer is still awaited. */
    if (m->inflight != NULL) {
        return G_SOURCE_CONTINUE;
    }
    p = g_new0(Pending, 1);
    *p = (Pending){ .m = m, .snap = snapshot(d, true) };
    m->inflight = p;
    if (!vn_stats_gather(d, NULL, gathered, p)) {
        /* Control clients' queries fill the table: next time. */
        m->inflight = NULL;
        vn_metrics_snapshot_free(p->snap);
        g_free(p);
    }
    return G_SOURCE_CONTINUE;
}

void vn_metrics_start(VnDaemon *d)
{
    if (d->conf->metrics_file == NULL || d->metrics != NULL) {
        return;
    }
    d->metrics = g_new0(VnMetrics, 1);
    d->metrics->timer = g_timeout_add(d->conf->metrics_interval_ms, on_tick, d);
    on_tick(d);
}

/* The file written at exit (takes @opaque, its snapshot). */
static void gathered_final(VnDaemon *d, JsonNode *root, void *opaque)
{
    g_autoptr(JsonNode) owned = root;
    g_autoptr(VnMetricsSnapshot) s = opaque;

    write_now(d, NULL, s, root);
}

void vn_metrics_stop(VnDaemon *d)
{
    VnMetrics *m = d->metrics;
    VnMetricsSnapshot *s;

    if (m == NULL) {
        return;
    }
    g_source_remove(m->timer);
    if (m->inflight != NULL) {
        m->inflight->m = NULL; /* answered as the daemon ends: dropped */
    }
    /* The last file says the daemon stopped.  The loop has stopped too, so
     * no worker would answer: a device name none has asks none of them, and
     * the daemon's own counters come at once. */
    s = snapshot(d, false);
    if (!vn_stats_gather(d, "", gathered_final, s)) {
        write_now(d, NULL, s, NULL);
        vn_metrics_snapshot_free(s);
    }
    g_clear_pointer(&d->metrics, g_free);
}
