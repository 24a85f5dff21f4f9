/*
 * A lender's counters and how its device server is doing (lender.h: vn_lender_stats,
 * vn_lender_stats_json, ...); the stalls that feed them are counted where they are heard
 * (lender-server.c).
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"

#include <inttypes.h>
#include <string.h>
#include <json-glib/json-glib.h>

/* ---- counters ---------------------------------------------------------- */

void vn_lender_stats(VnLender *l, VnLenderStats *out)
{
    *out = l->stats;
    out->windows = l->windows->len;
    out->device_stalled = (l->device != NULL && l->ops->stalled(l->device)) ||
                          (l->spare != NULL && l->ops->stalled(l->spare));
}

const char *vn_lender_device_state(VnLender *l)
{
    VnLenderStats st;

    if (!l->server_up) {
        return l->stats.server_losses > 0 ? "lost" : "not answering";
    }
    if (l->device == NULL && l->spare == NULL) {
        return "not connected";
    }
    vn_lender_stats(l, &st);
    return st.device_stalled ? "stalled (its last command got no answer)" : "answering";
}

const char *vn_lender_last_stall(VnLender *l)
{
    return l->last_stall[0] != '\0' ? l->last_stall : NULL;
}

static void add_counter(JsonBuilder *b, const char *name, uint64_t v)
{
    json_builder_set_member_name(b, name);
    json_builder_add_int_value(b, (gint64)MIN(v, (uint64_t)G_MAXINT64));
}

/* The device's mappings onto another node's segment (peer-to-peer targets, docs/p2p.md):
 * where the device's DMA goes without passing through its borrower. */
static void p2p_table(VnLender *l, JsonBuilder *b)
{
    json_builder_set_member_name(b, "p2p_mappings");
    json_builder_begin_array(b);
    for (guint i = 0; i < l->maps->len; i++) {
        const VnLenderMap *m = &g_array_index(l->maps, VnLenderMap, i);
        const VnFabricWindow *w = m->window->w;

        if (l->borrower != NULL && strcmp(w->peer, l->borrower) == 0) {
            continue;
        }
        json_builder_begin_object(b);
        add_counter(b, "iova", m->iova);
        add_counter(b, "size", m->size);
        json_builder_set_member_name(b, "peer");
        json_builder_add_string_value(b, w->peer);
        add_counter(b, "segment", w->segment);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
}

char *vn_lender_stats_json(VnLender *l)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    VnLenderStats st;

    vn_lender_stats(l, &st);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "device");
    json_builder_add_string_value(b, l->name);
    json_builder_set_member_name(b, "borrower");
    if (l->borrower != NULL) {
        json_builder_add_string_value(b, l->borrower);
    } else {
        json_builder_add_null_value(b);
    }
    add_counter(b, "requests", st.requests);
    add_counter(b, "requests_queued", st.queued);
    add_counter(b, "requests_refused_busy", st.refused_busy);
    add_counter(b, "region_rw", st.region_rw);
    add_counter(b, "config_rw", st.config_rw);
    add_counter(b, "relayed_irqs", st.relayed_irqs);
    add_counter(b, "dma_maps", st.dma_maps);
    add_counter(b, "p2p_maps", st.p2p_maps);
    add_counter(b, "dma_unmaps", st.dma_unmaps);
    add_counter(b, "resets", st.resets);
    add_counter(b, "fences", st.fences);
    add_counter(b, "bar_withholds", st.bar_withholds);
    json_builder_set_member_name(b, "bars_withheld");
    json_builder_add_boolean_value(b, l->bars_withheld);
    add_counter(b, "windows", st.windows);
    add_counter(b, "device_requests", st.device_requests);
    add_counter(b, "device_timeouts", st.device_timeouts);
    add_counter(b, "device_late_replies", st.device_late);
    add_counter(b, "device_server_losses", st.server_losses);
    add_counter(b, "device_server_returns", st.server_returns);
    add_counter(b, "device_server_generation", l->server_gen);
    json_builder_set_member_name(b, "device_server_up");
    json_builder_add_boolean_value(b, l->server_up);
    p2p_table(l, b);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    return json_to_string(root, FALSE);
}
