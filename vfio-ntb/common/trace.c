/*
 * Trace points: switching and logging (see trace.h).
 */
#include "trace.h"
#include "log.h"

#include <gio/gio.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Fields of one event: ours four, and at most one per named argument. */
#define VN_TRACE_MAX_FIELDS 16

static bool pattern_valid(const char *p)
{
    if (*p == '-') {
        p++;
    }
    if (*p == '\0') {
        return false;
    }
    for (; *p != '\0'; p++) {
        if (!g_ascii_islower(*p) && !g_ascii_isdigit(*p) && *p != '_' && *p != '*' && *p != '?') {
            return false;
        }
    }
    return true;
}

int vn_trace_enable(const char *patterns, GError **error)
{
    g_auto(GStrv) list = NULL;
    int on = 0;

    if (patterns == NULL || *patterns == '\0' || strlen(patterns) > VN_TRACE_MAX_PATTERNS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "trace patterns: empty or longer than %d characters", VN_TRACE_MAX_PATTERNS);
        return -1;
    }
    list = g_strsplit(patterns, ",", -1);
    for (unsigned i = 0; list[i] != NULL; i++) {
        g_autoptr(GPatternSpec) spec = NULL;
        bool matches = false;

        if (!pattern_valid(list[i])) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "trace pattern '%s': globs of [a-z0-9_*?], '-' in front to turn off",
                        list[i]);
            return -1;
        }
        /* A typo would switch nothing and look like a quiet program. */
        spec = g_pattern_spec_new(list[i] + (list[i][0] == '-' ? 1 : 0));
        for (unsigned e = 0; e < vn_trace_event_count && !matches; e++) {
            matches = g_pattern_spec_match_string(spec, vn_trace_events[e].name);
        }
        if (!matches) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "trace pattern '%s' matches no trace event (`ntbctl trace --list` "
                        "lists them)",
                        list[i]);
            return -1;
        }
    }
    for (unsigned i = 0; list[i] != NULL; i++) {
        bool off = list[i][0] == '-';
        g_autoptr(GPatternSpec) spec = g_pattern_spec_new(list[i] + (off ? 1 : 0));

        for (unsigned e = 0; e < vn_trace_event_count; e++) {
            if (g_pattern_spec_match_string(spec, vn_trace_events[e].name)) {
                __atomic_store_n(vn_trace_events[e].state, off ? 0 : 1, __ATOMIC_RELAXED);
            }
        }
    }
    for (unsigned e = 0; e < vn_trace_event_count; e++) {
        on += vn_trace_on(vn_trace_events[e].state);
    }
    return on;
}

bool vn_trace_setup(const char *option, bool verbose, GError **error)
{
    const char *env = g_getenv("VN_TRACE");

    if (verbose) {
        g_setenv("G_MESSAGES_DEBUG", "all", TRUE);
        option = option != NULL ? option : "*";
    }
    if (env != NULL && *env != '\0' && vn_trace_enable(env, error) < 0) {
        g_prefix_error(error, "VN_TRACE: ");
        return false;
    }
    if (option == NULL) {
        return true;
    }
    if (vn_trace_enable(option, error) < 0) {
        g_prefix_error(error, "--trace: ");
        return false;
    }
    vn_trace_keep(option);
    return true;
}

void vn_trace_keep(const char *patterns)
{
    const char *env = g_getenv("VN_TRACE");
    g_autofree char *both =
        env != NULL && *env != '\0' ? g_strdup_printf("%s,%s", env, patterns) : g_strdup(patterns);
    g_autofree char *on = NULL;

    if (strlen(both) <= VN_TRACE_MAX_PATTERNS) {
        g_setenv("VN_TRACE", both, TRUE);
        return;
    }
    on = vn_trace_enabled_list();
    if (strlen(on) <= VN_TRACE_MAX_PATTERNS) {
        g_setenv("VN_TRACE", *on != '\0' ? on : "-*", TRUE);
        return;
    }
    g_warning("trace: the events on are too many to pass on in VN_TRACE");
}

char *vn_trace_enabled_list(void)
{
    g_autoptr(GString) s = g_string_new(NULL);

    for (unsigned e = 0; e < vn_trace_event_count; e++) {
        if (vn_trace_on(vn_trace_events[e].state)) {
            g_string_append_printf(s, "%s%s", s->len ? "," : "", vn_trace_events[e].name);
        }
    }
    return g_string_free(g_steal_pointer(&s), FALSE);
}

char *vn_trace_command(const char *patterns, GError **error)
{
    int on = vn_trace_enable(patterns, error);

    return on < 0 ? NULL : g_strdup_printf("{\"on\":%d}", on);
}

void vn_trace_emit(const char *event, const GLogField *fields, size_t n_fields, const char *fmt,
                   ...)
{
    GLogField all[VN_TRACE_MAX_FIELDS];
    g_autofree char *msg = NULL;
    size_t n = 0;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    all[n++] = (GLogField){ "MESSAGE", msg, -1 };
    all[n++] = (GLogField){ "PRIORITY", "7", -1 };
    all[n++] = (GLogField){ "GLIB_DOMAIN", "vfio-ntb.trace", -1 };
    all[n++] = (GLogField){ "VFIO_NTB_EVENT", event, -1 };
    for (size_t i = 0; i < n_fields && n < VN_TRACE_MAX_FIELDS; i++) {
        all[n++] = fields[i];
    }
    /* Not through g_log's default writer: it would drop debug messages unless
     * G_MESSAGES_DEBUG asks for them (the switch is the event's own), and would print them
     * on stdout, which is ntbctl's answer. */
    vn_log_write_fields(G_LOG_LEVEL_DEBUG, all, n);
}
