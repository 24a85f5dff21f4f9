/*
 * ntbctl events: the daemon's event stream (docs/control.md "Events"), one
 * line per event, as text or (--json) as one JSON object per line, flushed
 * at once so a pipe sees each as it happens.
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ntbctl.h"

#include "common/util.h"
#include "ctl/ctl-client.h"
#include "ctl/format.h"

#include <stdio.h>

/* The daemon's {"seconds", "microseconds"} as RFC 3339 UTC; "-" when it
 * is not a time (a peer's numbers). */
static char *event_time(JsonObject *ev)
{
    JsonNode *tn = json_object_get_member(ev, "timestamp");
    JsonObject *t = json_node_get_object(tn);
    JsonNode *s = json_object_get_member(t, "seconds");
    JsonNode *us = json_object_get_member(t, "microseconds");
    g_autoptr(GDateTime) dt = NULL;
    g_autofree char *day_time = NULL;
    gint64 sec, usec;

    if (s == NULL || us == NULL || json_node_get_value_type(s) != G_TYPE_INT64 ||
        json_node_get_value_type(us) != G_TYPE_INT64) {
        return g_strdup("-");
    }
    sec = json_node_get_int(s);
    usec = json_node_get_int(us);
    /* Years 1970-9999: what GDateTime takes; anything else is a broken peer. */
    if (sec < 0 || sec > 253402300799 || usec < 0 || usec >= G_USEC_PER_SEC ||
        (dt = g_date_time_new_from_unix_utc(sec)) == NULL) {
        return g_strdup("-");
    }
    day_time = g_date_time_format(dt, "%FT%T");
    return g_strdup_printf("%s.%06" G_GINT64_FORMAT "Z", day_time, usec);
}

/* "device=hosta/nvme0 lease=17 node=hostb": the data's members. */
static void append_data(GString *out, JsonObject *data)
{
    g_autoptr(GList) members = json_object_get_members(data);

    for (GList *m = members; m != NULL; m = m->next) {
        g_autofree char *key = vn_ctl_format_sanitize(m->data);
        g_autofree char *val = vn_ctl_format_value(json_object_get_member(data, m->data));

        g_string_append_printf(out, " %s=%s", key, val);
    }
}

static bool print_event(const Ntbctl *n, JsonObject *ev)
{
    g_autofree char *when = event_time(ev);
    const char *name = vn_util_json_string(ev, "event");
    g_autoptr(JsonBuilder) b = NULL;
    g_autoptr(JsonNode) root = NULL;
    g_autoptr(GString) line = NULL;

    if (!n->json) {
        line = g_string_new(NULL);
        g_string_append_printf(line, "%s %s", when, name);
        append_data(line, json_object_get_object_member(ev, "data"));
        printf("%s\n", line->str);
        return fflush(stdout) == 0;
    }
    b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "schema");
    json_builder_add_int_value(b, NTBCTL_JSON_SCHEMA);
    json_builder_set_member_name(b, "event");
    json_builder_add_string_value(b, name);
    json_builder_set_member_name(b, "data");
    json_builder_add_value(b, json_node_copy(json_object_get_member(ev, "data")));
    json_builder_set_member_name(b, "timestamp");
    json_builder_add_string_value(b, when);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    return ntbctl_print_json(root, false);
}

int ntbctl_events(const Ntbctl *n, gint64 count)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(n->socket_path, n->timeout_ms, &error);
    g_autoptr(JsonNode) ok = c ? vn_ctl_client_execute(c, "subscribe-events", NULL, &error) : NULL;

    if (ok == NULL) {
        return ntbctl_fail(n, error);
    }
    for (gint64 seen = 0; count < 0 || seen < count; seen++) {
        g_autoptr(JsonObject) ev = vn_ctl_client_next_event(c, -1, &error);

        if (ev == NULL) {
            /* The daemon went away (stopped or restarted): the stream is over. */
            if (g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL)) {
                g_prefix_error(&error, "vfio-ntbd at %s: ", n->socket_path);
                error->code = VN_CTL_ERROR_UNREACHABLE;
            }
            return ntbctl_fail(n, error);
        }
        if (!print_event(n, ev)) {
            return NTBCTL_EXIT_REFUSED; /* the reader went away */
        }
    }
    return NTBCTL_EXIT_DONE;
}
