/*
 * The control socket's "trace": switch trace events (common/trace.h) in this daemon and in
 * its workers, as `ntbctl trace PATTERNS` asks.
 *
 * The daemon applies the patterns itself, keeps them in VN_TRACE for the workers it starts
 * later, and passes them to each running worker on its control channel without waiting for
 * the answers (a worker that does not answer is logged, nothing more).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "tracing.h"

#include "devices.h"
#include "spawn-procs.h"

#include "common/trace.h"
#include "common/util.h"

static void on_told(char *answer, const GError *error, void *opaque)
{
    g_autofree char *what = opaque;

    if (error != NULL) {
        g_info("trace: the worker of %s was not told: %s", what, error->message);
    }
    g_free(answer);
}

static void tell(GPid pid, const char *channel, const char *what, const char *command,
                 unsigned *told)
{
    if (pid == 0 || channel == NULL) {
        return;
    }
    vn_spawn_ask(pid, channel, what, command, on_told, g_strdup(what));
    (*told)++;
}

void vn_daemon_cmd_trace(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    const char *patterns = vn_util_json_string(a, "patterns");
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autofree char *command = NULL, *on = NULL;
    unsigned told = 0;
    int n;

    if (patterns == NULL) {
        vn_control_error(r, VN_ERR_PARAM, "\"patterns\" (a string of globs) is required");
        return;
    }
    n = vn_trace_enable(patterns, &error);
    if (n < 0) {
        vn_control_error(r, VN_ERR_PARAM, "%s", error->message);
        return;
    }
    vn_trace_keep(patterns); /* for the workers started from now on */
    command = g_strdup_printf("trace %s", patterns);
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = g_ptr_array_index(d->local, i);

        tell(ld->worker_pid, ld->channel_path, ld->conf->name, command, &told);
    }
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *bw = g_ptr_array_index(d->borrowed, i);

        tell(bw->worker_pid, bw->channel_path, bw->device, command, &told);
    }
    g_message("node %s: trace %s: %d events on, %u workers told", d->conf->node, patterns, n, told);
    on = vn_trace_enabled_list();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "on");
    json_builder_add_int_value(b, n);
    json_builder_set_member_name(b, "events");
    json_builder_add_string_value(b, on);
    json_builder_set_member_name(b, "workers");
    json_builder_add_int_value(b, told);
    json_builder_end_object(b);
    vn_control_return(r, json_builder_get_root(b));
}

void vn_daemon_cmd_query_trace(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_array(b);
    for (unsigned e = 0; e < vn_trace_event_count; e++) {
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "event");
        json_builder_add_string_value(b, vn_trace_events[e].name);
        json_builder_set_member_name(b, "on");
        json_builder_add_boolean_value(b, vn_trace_on(vn_trace_events[e].state));
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    vn_control_return(r, json_builder_get_root(b));
}
