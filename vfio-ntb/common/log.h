/*
 * Log lines with journal fields, and the log level a program runs at.
 *
 * vn_log() is g_log_structured() with the fields an operator filters on:
 * VFIO_NTB_NODE (the node logging), VFIO_NTB_DEVICE ("host/name"; a bare
 * name is taken as the logging node's own device), VFIO_NTB_PEER (the other
 * node) and VFIO_NTB_LEASE (a decimal id), each only when given (NULL or 0
 * leave it out).  With the journal as stderr (systemd), GLib's writers send
 * them as fields, so `journalctl VFIO_NTB_DEVICE=hosta/nvme0` finds every
 * line about that device; elsewhere they print as plain lines.  Message
 * texts start with the object they are about, as everywhere.
 *
 * Levels, the most to the least: error (g_critical, g_warning's errors),
 * warning, notice (g_message), info (lease, attach and link changes), debug
 * (everything, the trace events too when they are on).  GLib's own default
 * writer drops info and debug unless G_MESSAGES_DEBUG names them;
 * vn_log_setup() installs a writer that filters by the level instead (and
 * still shows what G_MESSAGES_DEBUG asks for, as GLib's did).
 *
 * Threads: vn_log() from any thread; the level is an atomic int.
 */
#ifndef VN_LOG_H
#define VN_LOG_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum VnLogLevel {
    VN_LOG_ERROR,
    VN_LOG_WARNING,
    VN_LOG_NOTICE,
    VN_LOG_INFO,
    VN_LOG_DEBUG,
    VN_LOG__LAST
} VnLogLevel;

const char *vn_log_level_to_string(VnLogLevel l);
/* "error", "warning", "notice", "info" or "debug"; false for anything else. */
bool vn_log_level_from_string(const char *s, VnLogLevel *out);

/*
 * Install the level-filtering writer (once per process: GLib allows one
 * writer) at @level: lines above it are dropped, the rest go to the journal
 * when stderr is it, else to stderr (never stdout: it is some programs'
 * answer).  Trace events have their own switch (common/trace.h) and are not
 * filtered here.
 */
void vn_log_setup(VnLogLevel level);
/* Change the level of an installed writer (a reload). */
void vn_log_set_level(VnLogLevel level);
VnLogLevel vn_log_get_level(void);

void vn_log_fields(const char *domain, GLogLevelFlags level, const char *file, const char *line,
                   const char *func, const char *node, const char *device, const char *peer,
                   uint64_t lease, const char *fmt, ...) G_GNUC_PRINTF(10, 11);

#define vn_log(level, node, device, peer, lease, ...)                                        \
    vn_log_fields(G_LOG_DOMAIN, (level), __FILE__, G_STRINGIFY(__LINE__), G_STRFUNC, (node), \
                  (device), (peer), (lease), __VA_ARGS__)

/* @fields to the journal when stderr is it, else as a line on stderr:
 * where the daemon's log lines and trace events go (never stdout, which
 * is ntbctl's answer). */
void vn_log_write_fields(GLogLevelFlags flags, const GLogField *fields, gsize n);

#endif /* VN_LOG_H */
