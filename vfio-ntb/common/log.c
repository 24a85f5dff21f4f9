/*
 * Log lines with journal fields, and the log level (see log.h).
 */
#include "log.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* MESSAGE, PRIORITY, GLIB_DOMAIN, CODE_FILE, CODE_LINE, CODE_FUNC and ours four. */
#define VN_LOG_MAX_FIELDS 10

static const char *priority(GLogLevelFlags level)
{
    if (level & G_LOG_LEVEL_ERROR) {
        return "3";
    }
    if (level & (G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_WARNING)) {
        return "4";
    }
    if (level & G_LOG_LEVEL_MESSAGE) {
        return "5";
    }
    return (level & G_LOG_LEVEL_INFO) ? "6" : "7";
}

static const char *const level_names[VN_LOG__LAST] = { "error", "warning", "notice", "info",
                                                       "debug" };
static int current_level = VN_LOG_NOTICE;

const char *vn_log_level_to_string(VnLogLevel l)
{
    return l < VN_LOG__LAST ? level_names[l] : "?";
}

bool vn_log_level_from_string(const char *s, VnLogLevel *out)
{
    for (int i = 0; s != NULL && i < VN_LOG__LAST; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (VnLogLevel)i;
            return true;
        }
    }
    return false;
}

static VnLogLevel level_of(GLogLevelFlags flags)
{
    if (flags & (G_LOG_LEVEL_ERROR | G_LOG_LEVEL_CRITICAL)) {
        return VN_LOG_ERROR;
    }
    if (flags & G_LOG_LEVEL_WARNING) {
        return VN_LOG_WARNING;
    }
    if (flags & G_LOG_LEVEL_MESSAGE) {
        return VN_LOG_NOTICE;
    }
    return (flags & G_LOG_LEVEL_INFO) ? VN_LOG_INFO : VN_LOG_DEBUG;
}

static const char *domain_of(const GLogField *fields, gsize n)
{
    for (gsize i = 0; i < n; i++) {
        if (strcmp(fields[i].key, "GLIB_DOMAIN") == 0 && fields[i].length < 0) {
            return fields[i].value;
        }
    }
    return NULL;
}

void vn_log_write_fields(GLogLevelFlags flags, const GLogField *fields, gsize n)
{
    g_autofree char *line = NULL;

    if (g_log_writer_is_journald(fileno(stderr)) &&
        g_log_writer_journald(flags, fields, n, NULL) == G_LOG_WRITER_HANDLED) {
        return;
    }
    line =
        g_log_writer_format_fields(flags, fields, n, g_log_writer_supports_color(fileno(stderr)));
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

static GLogWriterOutput writer(GLogLevelFlags flags, const GLogField *fields, gsize n,
                               gpointer data)
{
    if ((int)level_of(flags) > __atomic_load_n(&current_level, __ATOMIC_RELAXED) &&
        !(flags & G_LOG_FLAG_FATAL) &&
        (!(flags & (G_LOG_LEVEL_INFO | G_LOG_LEVEL_DEBUG)) ||
         g_log_writer_default_would_drop(flags, domain_of(fields, n)))) {
        /* Below the level, and not an info or debug line G_MESSAGES_DEBUG
         * asks for (that keeps working as it did: a domain's debug lines). */
        return G_LOG_WRITER_HANDLED;
    }
    vn_log_write_fields(flags, fields, n);
    return G_LOG_WRITER_HANDLED;
}

void vn_log_setup(VnLogLevel level)
{
    vn_log_set_level(level);
    g_log_set_writer_func(writer, NULL, NULL);
}

void vn_log_set_level(VnLogLevel level)
{
    __atomic_store_n(&current_level, (int)MIN(level, VN_LOG_DEBUG), __ATOMIC_RELAXED);
}

VnLogLevel vn_log_get_level(void)
{
    return (VnLogLevel)__atomic_load_n(&current_level, __ATOMIC_RELAXED);
}

void vn_log_fields(const char *domain, GLogLevelFlags level, const char *file, const char *line,
                   const char *func, const char *node, const char *device, const char *peer,
                   uint64_t lease, const char *fmt, ...)
{
    GLogField f[VN_LOG_MAX_FIELDS];
    g_autofree char *msg = NULL, *dev = NULL;
    char lease_text[24];
    gsize n = 0;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    f[n++] = (GLogField){ "MESSAGE", msg, -1 };
    /* syslog's priorities, as g_log_structured() gives them. */
    f[n++] = (GLogField){ "PRIORITY", priority(level), -1 };
    f[n++] = (GLogField){ "GLIB_DOMAIN", domain, -1 };
    f[n++] = (GLogField){ "CODE_FILE", file, -1 };
    f[n++] = (GLogField){ "CODE_LINE", line, -1 };
    f[n++] = (GLogField){ "CODE_FUNC", func, -1 };
    if (node != NULL) {
        f[n++] = (GLogField){ "VFIO_NTB_NODE", node, -1 };
    }
    if (device != NULL) {
        dev = strchr(device, '/') != NULL || node == NULL ? g_strdup(device)
                                                          : g_strdup_printf("%s/%s", node, device);
        f[n++] = (GLogField){ "VFIO_NTB_DEVICE", dev, -1 };
    }
    if (peer != NULL) {
        f[n++] = (GLogField){ "VFIO_NTB_PEER", peer, -1 };
    }
    if (lease != 0) {
        g_snprintf(lease_text, sizeof(lease_text), "%" G_GUINT64_FORMAT, lease);
        f[n++] = (GLogField){ "VFIO_NTB_LEASE", lease_text, -1 };
    }
    g_log_structured_array(level, f, n);
}
