/*
 * ntbctl top (ntbctl-top.h): query-stats every interval, rates from the
 * difference of two answers.
 *
 * A frame: a line for the node and its fabric, a table with a row per
 * device (the counters an operator watches: forwarded accesses, relayed
 * interrupts, DMA maps, lending requests, each total and per second),
 * and, for one device (ntbctl top DEV), every counter of it.  A counter
 * that went down (a worker restarted) has no rate for that frame.
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ctl/ntbctl-top.h"

#include "client/ctl-client.h"
#include "ctl/format.h"
#include "ctl/table.h"
#include "common/util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- a frame --------------------------------------------------------------- */

static void malformed(GError **error, const char *what)
{
    g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL, "malformed answer to query-stats: %s",
                what);
}

/* The sum of @keys' counters (NULL-terminated); false if one is missing. */
static bool sum(JsonObject *o, const char *const *keys, gint64 *v)
{
    *v = 0;
    for (; *keys != NULL; keys++) {
        uint64_t x;

        if (!vn_util_json_counter(o, *keys, false, &x) || x > (uint64_t)(G_MAXINT64 - *v)) {
            return false;
        }
        *v += (gint64)x;
    }
    return true;
}

static char *total_text(JsonObject *o, const char *const *keys)
{
    gint64 v;

    return sum(o, keys, &v) ? g_strdup_printf("%" G_GINT64_FORMAT, v) : g_strdup("-");
}

/* Per second since @prev; "-" without a previous answer or after a drop. */
static char *rate_text(JsonObject *prev, JsonObject *cur, const char *const *keys, double seconds)
{
    gint64 a, b;

    if (prev == NULL || seconds <= 0 || !sum(prev, keys, &a) || !sum(cur, keys, &b) || b < a) {
        return g_strdup("-");
    }
    return g_strdup_printf("%.1f", (double)(b - a) / seconds);
}

/* A device's entry: its name (host/name) and role, from the entry itself
 * (lent: the node's; borrowed: its lender's). */
typedef struct Entry {
    JsonObject *o;
    bool lent;
    char *name;
} Entry;

static void entry_clear(Entry *e)
{
    g_free(e->name);
}

/* The entries of @root (a query-stats answer): NULL with @error for a
 * malformed one.  Entries a worker did not answer (null) are counted in
 * *@silent. */
static GArray *entries(JsonNode *root, const char *node, GError **error, guint *silent)
{
    static const char *const sides[] = { "lent", "borrowed" };
    g_autoptr(GArray) out = g_array_new(FALSE, TRUE, sizeof(Entry));
    JsonObject *o;

    g_array_set_clear_func(out, (GDestroyNotify)entry_clear);
    *silent = 0;
    if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
        malformed(error, "not a JSON object");
        return NULL;
    }
    o = json_node_get_object(root);
    for (guint s = 0; s < G_N_ELEMENTS(sides); s++) {
        JsonNode *n = json_object_get_member(o, sides[s]);
        JsonArray *a;

        if (n == NULL) {
            continue;
        }
        if (!JSON_NODE_HOLDS_ARRAY(n)) {
            malformed(error, s == 0 ? "\"lent\" is not a list" : "\"borrowed\" is not a list");
            return NULL;
        }
        a = json_node_get_array(n);
        for (guint i = 0; i < json_array_get_length(a); i++) {
            JsonNode *e = json_array_get_element(a, i);
            JsonObject *eo = JSON_NODE_HOLDS_OBJECT(e) ? json_node_get_object(e) : NULL;
            const char *dev = eo != NULL ? vn_util_json_string(eo, "device") : NULL;
            const char *host =
                s == 0 ? node : (eo != NULL ? vn_util_json_string(eo, "lender") : NULL);
            Entry en = { .o = eo, .lent = s == 0 };

            if (eo == NULL || dev == NULL) {
                (*silent)++;
                continue;
            }
            en.name = strchr(dev, '/') != NULL || host == NULL
                          ? g_strdup(dev)
                          : g_strdup_printf("%s/%s", host, dev);
            g_array_append_val(out, en);
        }
    }
    return g_steal_pointer(&out);
}

static JsonObject *find(GArray *list, const Entry *e)
{
    for (guint i = 0; list != NULL && i < list->len; i++) {
        const Entry *p = &g_array_index(list, Entry, i);

        if (p->lent == e->lent && strcmp(p->name, e->name) == 0) {
            return p->o;
        }
    }
    return NULL;
}

/* The watched columns: the same thing counted under each role's names. */
static const struct {
    const char *title;
    const char *const lender[3];
    const char *const borrower[3];
} columns[] = {
    { "FWD", { "region_rw", NULL }, { "region_forwarded", "config_forwarded", NULL } },
    { "IRQ", { "relayed_irqs", NULL }, { "relayed_irqs", NULL } },
    { "DMA-MAP", { "dma_maps", NULL }, { "dma_maps", NULL } },
    { "REQ", { "requests", NULL }, { "fabric_requests", NULL } },
};

static void fabric_line(GString *out, JsonObject *prev, JsonObject *cur, double seconds)
{
    static const char *const sent[] = { "msgs_sent", NULL }, *const recv[] = { "msgs_received",
                                                                               NULL };
    static const char *const bad[] = { "bad_messages", NULL }, *const win[] = { "windows_in_use",
                                                                                NULL };
    g_autofree char *s = total_text(cur, sent), *sr = rate_text(prev, cur, sent, seconds);
    g_autofree char *r = total_text(cur, recv), *rr = rate_text(prev, cur, recv, seconds);
    g_autofree char *b = total_text(cur, bad), *w = total_text(cur, win);

    g_string_append_printf(out,
                           "fabric: messages sent %s (%s/s), received %s (%s/s), bad %s; "
                           "windows in use %s\n",
                           s, sr, r, rr, b, w);
}

/* One COUNTER TOTAL PER-SECOND row, if @key is a counter of @cur. */
static void detail_row(VnCtlTable *t, JsonObject *prev, JsonObject *cur, const char *key,
                       double seconds)
{
    const char *keys[] = { key, NULL };
    uint64_t v;

    if (vn_util_json_counter(cur, key, false, &v)) {
        vn_ctl_table_add(t, vn_ctl_format_sanitize(key));
        vn_ctl_table_add(t, g_strdup_printf("%" G_GUINT64_FORMAT, v));
        vn_ctl_table_add(t, rate_text(prev, cur, keys, seconds));
    }
}

/* Every counter of one device: its members, and each member of a nested
 * object as "outer.inner". */
static void device_detail(GString *out, JsonObject *prev, JsonObject *cur, double seconds)
{
    static const char *const header[] = { "COUNTER", "TOTAL", "PER-SECOND" };
    g_autoptr(VnCtlTable) t = vn_ctl_table_new(G_N_ELEMENTS(header), header);
    g_autoptr(GList) names = json_object_get_members(cur);

    for (GList *l = names; l != NULL; l = l->next) {
        JsonNode *n = json_object_get_member(cur, l->data);
        g_autoptr(GList) inner = NULL;

        if (!JSON_NODE_HOLDS_OBJECT(n)) {
            detail_row(t, prev, cur, l->data, seconds);
            continue;
        }
        inner = json_object_get_members(json_node_get_object(n));
        for (GList *k = inner; k != NULL; k = k->next) {
            g_autofree char *key = g_strdup_printf("%s.%s", (char *)l->data, (char *)k->data);

            detail_row(t, prev, cur, key, seconds);
        }
    }
    g_string_append_c(out, '\n');
    vn_ctl_table_render(out, t);
}

bool ntbctl_top_render(GString *out, const char *node, JsonNode *prev, JsonNode *cur,
                       double seconds, const char *device, GError **error)
{
    static const char *const header[] = { "DEVICE", "ROLE", "FWD/s", "IRQ/s",   "DMA-MAP/s",
                                          "REQ/s",  "FWD",  "IRQ",   "DMA-MAP", "REQ" };
    g_autoptr(VnCtlTable) t = vn_ctl_table_new(G_N_ELEMENTS(header), header);
    g_autoptr(GString) text = g_string_new(NULL);
    g_autoptr(GArray) now = NULL, before = NULL;
    JsonObject *detail = NULL, *detail_prev = NULL;
    guint silent = 0, silent_prev = 0, rows = 0;

    now = entries(cur, node, error, &silent);
    if (now == NULL) {
        return false;
    }
    if (prev != NULL) {
        g_autoptr(GError) ignored = NULL;

        before = entries(prev, node, &ignored, &silent_prev);
    }
    {
        JsonNode *f = json_object_get_member(json_node_get_object(cur), "fabric");
        JsonNode *pf = prev != NULL && JSON_NODE_HOLDS_OBJECT(prev)
                           ? json_object_get_member(json_node_get_object(prev), "fabric")
                           : NULL;

        if (f != NULL && JSON_NODE_HOLDS_OBJECT(f)) {
            fabric_line(text,
                        pf != NULL && JSON_NODE_HOLDS_OBJECT(pf) ? json_node_get_object(pf) : NULL,
                        json_node_get_object(f), seconds);
        }
    }
    for (guint i = 0; i < now->len; i++) {
        const Entry *e = &g_array_index(now, Entry, i);
        JsonObject *p = find(before, e);

        if (device != NULL && strcmp(device, e->name) != 0) {
            continue;
        }
        rows++;
        vn_ctl_table_add(t, vn_ctl_format_sanitize(e->name));
        vn_ctl_table_add(t, g_strdup(e->lent ? "lender" : "borrower"));
        for (guint c = 0; c < G_N_ELEMENTS(columns); c++) {
            vn_ctl_table_add(
                t, rate_text(p, e->o, e->lent ? columns[c].lender : columns[c].borrower, seconds));
        }
        for (guint c = 0; c < G_N_ELEMENTS(columns); c++) {
            vn_ctl_table_add(t,
                             total_text(e->o, e->lent ? columns[c].lender : columns[c].borrower));
        }
        if (detail == NULL) {
            detail = e->o;
            detail_prev = p;
        }
    }
    g_string_append_c(text, '\n');
    if (rows > 0) {
        vn_ctl_table_render(text, t);
    } else {
        g_autofree char *clean = device != NULL ? vn_ctl_format_sanitize(device) : NULL;

        g_string_append_printf(text, "no counters%s%s\n", clean != NULL ? " of " : "",
                               clean != NULL ? clean : "");
    }
    if (silent > 0) {
        g_string_append_printf(text, "(%u device%s did not answer)\n", silent,
                               silent == 1 ? "'s worker" : "s' workers");
    }
    if (device != NULL && detail != NULL) {
        device_detail(text, detail_prev, detail, seconds);
    }
    g_string_append(text, "\nFWD: accesses forwarded over the fabric (config space and trapped "
                          "BARs); the data path\n(mapped BARs, DMA, eventfd interrupts) never "
                          "passes through vfio-ntb and is not counted.\n");
    g_string_append_len(out, text->str, (gssize)text->len);
    return true;
}

/* ---- the loop --------------------------------------------------------------- */

/* One query-stats answer; a dropped connection is made again once. */
static JsonNode *sample(VnCtlClient **c, const char *socket_path, int timeout_ms, JsonObject *args,
                        GError **error)
{
    for (int attempt = 0;; attempt++) {
        g_autoptr(GError) local = NULL;
        JsonNode *ret;

        if (*c == NULL && (*c = vn_ctl_client_connect(socket_path, timeout_ms, error)) == NULL) {
            return NULL;
        }
        ret = vn_ctl_client_execute(*c, "query-stats", args, &local);
        if (ret != NULL) {
            return ret;
        }
        /* After these the stream is in an unknown state: connect again. */
        if (attempt > 0 || (!g_error_matches(local, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL) &&
                            !g_error_matches(local, VN_CTL_ERROR, VN_CTL_ERROR_TIMEOUT))) {
            g_propagate_error(error, g_steal_pointer(&local));
            return NULL;
        }
        g_clear_pointer(c, vn_ctl_client_free);
    }
}

int ntbctl_top(const char *socket_path, int timeout_ms, const char *device, int interval_ms,
               int count, GError **error)
{
    g_autoptr(VnCtlClient) c = NULL;
    g_autoptr(JsonObject) args = json_object_new();
    g_autoptr(JsonNode) prev = NULL;
    g_autofree char *node = NULL;
    bool tty = isatty(STDOUT_FILENO) == 1;
    gint64 prev_us = 0;

    if (interval_ms == 0) {
        interval_ms = NTBCTL_TOP_DEFAULT_INTERVAL_MS;
    }
    if (interval_ms < NTBCTL_TOP_MIN_INTERVAL_MS || interval_ms > NTBCTL_TOP_MAX_INTERVAL_MS ||
        count < 0 || count > NTBCTL_TOP_MAX_COUNT) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                    "top: --interval-ms is %d..%d, --count 0 (until interrupted)..%d",
                    NTBCTL_TOP_MIN_INTERVAL_MS, NTBCTL_TOP_MAX_INTERVAL_MS, NTBCTL_TOP_MAX_COUNT);
        return -1;
    }
    if (device != NULL) {
        if (!vn_ctl_device_valid(device, error)) {
            return -1;
        }
        json_object_set_string_member(args, "device", device);
    }
    for (int frame = 0; count == 0 || frame < count; frame++) {
        g_autoptr(JsonNode) cur = NULL;
        g_autoptr(GString) out = g_string_new(NULL);
        g_autoptr(GDateTime) when = g_date_time_new_now_local();
        g_autofree char *stamp = g_date_time_format(when, "%Y-%m-%d %H:%M:%S");
        g_autofree char *clean = NULL;
        gint64 now_us;

        if (frame > 0) {
            g_usleep((gulong)interval_ms * 1000);
        }
        cur = sample(&c, socket_path, timeout_ms, args, error);
        if (cur == NULL) {
            return -1;
        }
        now_us = g_get_monotonic_time();
        if (node == NULL) {
            node = g_strdup(vn_ctl_client_node(c));
        }
        clean = vn_ctl_format_sanitize(node);
        g_string_append_printf(out, "%sntbctl top: %s, %s, every %g s%s\n",
                               tty ? "\033[H\033[2J" : (frame > 0 ? "\n" : ""), clean, stamp,
                               interval_ms / 1000.0, count > 0 ? "" : " (Ctrl-C to stop)");
        if (!ntbctl_top_render(out, node, prev, cur,
                               prev != NULL ? (double)(now_us - prev_us) / 1e6 : 0, device,
                               error)) {
            return -1;
        }
        fputs(out->str, stdout);
        fflush(stdout);
        g_clear_pointer(&prev, json_node_unref);
        prev = g_steal_pointer(&cur);
        prev_us = now_us;
    }
    return 0;
}
