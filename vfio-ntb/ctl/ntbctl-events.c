/*
 * ntbctl events: the daemon's event stream (docs/control.md "Events"), one
 * line per event, as text or (--json) as one JSON object per line, flushed
 * at once so a pipe sees each as it happens.
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ntbctl.h"

#include "common/util.h"
#include "client/ctl-client.h"
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

/* The event's time in microseconds (0 when it has none). */
static gint64 event_us(JsonObject *ev)
{
    JsonNode *tn = json_object_get_member(ev, "timestamp");
    JsonObject *t = tn != NULL && JSON_NODE_HOLDS_OBJECT(tn) ? json_node_get_object(tn) : NULL;
    JsonNode *s = t != NULL ? json_object_get_member(t, "seconds") : NULL;
    JsonNode *us = t != NULL ? json_object_get_member(t, "microseconds") : NULL;

    if (s == NULL || us == NULL || json_node_get_value_type(s) != G_TYPE_INT64 ||
        json_node_get_value_type(us) != G_TYPE_INT64 || json_node_get_int(s) < 0 ||
        json_node_get_int(s) > G_MAXINT64 / G_USEC_PER_SEC - 1) {
        return 0;
    }
    return json_node_get_int(s) * G_USEC_PER_SEC + CLAMP(json_node_get_int(us), 0, 999999);
}

/* Subscribed (to what came after @since_us, if not 0), or NULL. */
static VnCtlClient *subscribe(const Ntbctl *n, gint64 since_us, GError **error)
{
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(n->socket_path, n->timeout_ms, error);
    g_autoptr(JsonObject) args = json_object_new();
    g_autoptr(JsonNode) ok = NULL;

    if (c == NULL) {
        return NULL;
    }
    if (since_us > 0) {
        json_object_set_int_member(args, "since", since_us);
    }
    ok = vn_ctl_client_execute(c, "subscribe-events", since_us > 0 ? args : NULL, error);
    return ok != NULL ? g_steal_pointer(&c) : NULL;
}

/* How often --follow tries a daemon that is away. */
#define NTBCTL_FOLLOW_RETRY_MS 500

int ntbctl_events(const Ntbctl *n, gint64 count, bool follow)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnCtlClient) c = subscribe(n, 0, &error);
    gint64 last_us = 0;
    bool said = false;

    if (c == NULL) {
        return ntbctl_fail(n, error);
    }
    for (gint64 seen = 0; count < 0 || seen < count;) {
        g_autoptr(JsonObject) ev = c != NULL ? vn_ctl_client_next_event(c, -1, &error) : NULL;

        if (ev == NULL && follow) {
            /* Away (stopped or restarting): again, from the last event seen. */
            if (!said) {
                fprintf(stderr, "ntbctl: vfio-ntbd at %s went away; waiting for it\n",
                        n->socket_path);
                said = true;
            }
            g_clear_pointer(&c, vn_ctl_client_free);
            g_clear_error(&error);
            g_usleep(NTBCTL_FOLLOW_RETRY_MS * 1000);
            c = subscribe(n, last_us, &error);
            if (c != NULL) {
                fprintf(stderr, "ntbctl: vfio-ntbd at %s is back\n", n->socket_path);
                said = false;
            }
            continue;
        }
        if (ev == NULL) {
            /* The daemon went away (stopped or restarted): the stream is over. */
            if (g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL)) {
                g_prefix_error(&error, "vfio-ntbd at %s: ", n->socket_path);
                error->code = VN_CTL_ERROR_UNREACHABLE;
            }
            return ntbctl_fail(n, error);
        }
        last_us = MAX(last_us, event_us(ev));
        if (!print_event(n, ev)) {
            return NTBCTL_EXIT_REFUSED; /* the reader went away */
        }
        seen++;
    }
    return NTBCTL_EXIT_DONE;
}
