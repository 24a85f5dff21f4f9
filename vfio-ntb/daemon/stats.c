/*
 * This node's counters (stats.h): the daemon's own, and
 * what each of its workers says, asked of every worker at once without
 * waiting.  A worker that does not answer within VN_SPAWN_STATS_TIMEOUT_MS
 * shows as {"device", "worker_answered": false} (lent) or is left out
 * (borrowed); the loop serves
 * everything else meanwhile, so one hung worker delays only its caller's
 * answer, and a hundred of them no more than one.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "stats.h"

#include "devices.h"
#include "spawn-procs.h"
#include "workers.h"

#include "common/json.h"
#include "common/wctl.h"

#include <string.h>

typedef struct Gather Gather;

/* One worker's answer. */
typedef struct Slot {
    Gather *g;
    bool lent;
    void *device; /* its VnLocalDevice (lent) or VnBorrowed, while asking */
    /* Whose counters these are, as the daemon knows it: the device's name
     * (the lender's, for a borrowed one) and, borrowed, its lender. */
    char *name;
    char *lender;
    char *text;
    VnWctlCall *call;
} Slot;

struct Gather {
    VnDaemon *d;
    Slot *slots;
    guint n;
    guint pending;
    bool asking; /* still handing out questions */
    VnStatsReady ready;
    void *opaque;
};

/* Counters a worker wrote (untrusted): added parsed, else (no answer, or
 * not an object) as {"device", "worker_answered": false}, so that a client
 * still reads one device per entry.  Which device they are of is the
 * daemon's to say, not the worker's: "device" and "lender" are set from @s
 * (what an honest worker writes anyway), so that no worker's counters can
 * pass as another device's. */
static void add_json_text(JsonBuilder *b, const Slot *s)
{
    JsonNode *n = vn_json_parse(s->text, -1, VN_SPAWN_MAX_STATS, NULL);

    if (n == NULL || !JSON_NODE_HOLDS_OBJECT(n)) {
        g_clear_pointer(&n, json_node_unref);
        n = json_node_new(JSON_NODE_OBJECT);
        json_node_take_object(n, json_object_new());
        json_object_set_boolean_member(json_node_get_object(n), "worker_answered", FALSE);
    }
    json_object_set_string_member(json_node_get_object(n), "device", s->name);
    if (s->lender != NULL) {
        json_object_set_string_member(json_node_get_object(n), "lender", s->lender);
    }
    json_builder_add_value(b, n);
}

static JsonNode *build(VnDaemon *d, const Gather *g)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    VnFabricStats fs;
    const struct {
        const char *name;
        uint64_t *v;
    } fields[] = {
        { "msgs_sent", &fs.msgs_sent },
        { "msgs_received", &fs.msgs_received },
        { "doorbells_sent", &fs.doorbells_sent },
        { "doorbells_received", &fs.doorbells_received },
        { "doorbells_coalesced", &fs.doorbells_coalesced },
        { "bad_messages", &fs.bad_messages },
        { "requests_held", &fs.requests_held },
    };

    vn_fabric_stats(d->fab, &fs);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, d->conf->node);
    /* Leases changed but not in the state file (the log says why). */
    json_builder_set_member_name(b, "state_save_errors");
    json_builder_add_int_value(b, (gint64)d->save_errors);
    json_builder_set_member_name(b, "leases_lost");
    json_builder_add_int_value(b, (gint64)d->leases_lost);
    json_builder_set_member_name(b, "state_saved");
    json_builder_add_boolean_value(b, !d->unsaved);
    json_builder_set_member_name(b, "fabric");
    json_builder_begin_object(b);
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        json_builder_set_member_name(b, fields[i].name);
        json_builder_add_int_value(b, (gint64)*fields[i].v);
    }
    /* Of the host's budget (max-windows): what a large BAR or a new
     * borrow needs to know is left. */
    json_builder_set_member_name(b, "windows_in_use");
    json_builder_add_int_value(b, vn_fabric_windows_in_use(d->fab));
    json_builder_end_object(b);
    json_builder_set_member_name(b, "lent");
    json_builder_begin_array(b);
    for (guint i = 0; i < g->n; i++) {
        if (g->slots[i].lent) {
            add_json_text(b, &g->slots[i]);
        }
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "borrowed");
    json_builder_begin_array(b);
    for (guint i = 0; i < g->n; i++) {
        if (!g->slots[i].lent && g->slots[i].text != NULL) {
            add_json_text(b, &g->slots[i]);
        }
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    return json_builder_get_root(b);
}

/* Every answer is in (or the daemon stops): build, hand over, free. */
static void finish(Gather *g)
{
    VnDaemon *d = g->d;

    g_ptr_array_remove_fast(d->gathers, g);
    for (guint i = 0; i < g->n; i++) {
        vn_wctl_call_cancel(g->slots[i].call);
    }
    g->ready(d, build(d, g), g->opaque);
    for (guint i = 0; i < g->n; i++) {
        g_free(g->slots[i].text);
        g_free(g->slots[i].name);
        g_free(g->slots[i].lender);
    }
    g_free(g->slots);
    g_free(g);
}

static void on_answer(char *answer, const GError *error, void *opaque)
{
    Slot *s = opaque;
    Gather *g = s->g;

    s->call = NULL;
    s->text = answer;
    g->pending--;
    if (g->pending == 0 && !g->asking) {
        finish(g);
    }
}

bool vn_stats_gather(VnDaemon *d, const char *only, VnStatsReady ready, void *opaque)
{
    Gather *g;
    guint n = 0;

    if (d->gathers->len >= VN_STATS_MAX_GATHERS) {
        return false;
    }
    g = g_new0(Gather, 1);
    *g = (Gather){ .d = d, .ready = ready, .opaque = opaque, .asking = true };
    g->slots = g_new0(Slot, d->local->len + d->borrowed->len);
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];
        g_autofree char *dev = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);

        if (only == NULL || strcmp(only, dev) == 0) {
            g->slots[n++] =
                (Slot){ .g = g, .lent = true, .device = ld, .name = g_strdup(ld->conf->name) };
        }
    }
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];

        if (only == NULL || strcmp(only, b->device) == 0) {
            g->slots[n++] = (Slot){ .g = g,
                                    .lent = false,
                                    .device = b,
                                    .name = g_strdup(b->name),
                                    .lender = g_strdup(b->lender) };
        }
    }
    g->n = n;
    g_ptr_array_add(d->gathers, g);
    /* Every question first (an answer may come at once), then: done? */
    g->pending = g->n;
    for (guint i = 0; i < g->n; i++) {
        Slot *s = &g->slots[i];
        void *device = g_steal_pointer(&s->device);

        s->call = s->lent ? d->workers->lend_stats(d, device, on_answer, s)
                          : d->workers->stats(d, device, on_answer, s);
    }
    g->asking = false;
    if (g->pending == 0) {
        finish(g);
    }
    return true;
}

GPtrArray *vn_stats_gathers_new(void)
{
    return g_ptr_array_new();
}

void vn_stats_gathers_free(VnDaemon *d)
{
    if (d->gathers == NULL) {
        return;
    }
    /* Each caller gets what came in so far. */
    while (d->gathers->len > 0) {
        finish(d->gathers->pdata[0]);
    }
    g_clear_pointer(&d->gathers, g_ptr_array_unref);
}
