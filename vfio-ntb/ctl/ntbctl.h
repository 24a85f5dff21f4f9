/*
 * ntbctl's parts (ntbctl.c parses and dispatches; ntbctl-out.c answers
 * and maps errors to exit codes; ntbctl-events.c streams events; ntbctl-virt.c
 * drives libvirt).  Only the ntbctl binary links them.
 */
#ifndef NTBCTL_H
#define NTBCTL_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

/* docs/control.md "ntbctl exit codes": one per error class, so a script can
 * tell a typo from a busy device without reading the message. */
enum {
    NTBCTL_EXIT_DONE = 0,
    NTBCTL_EXIT_REFUSED = 1,      /* GenericError, or a refusal without a class of its own */
    NTBCTL_EXIT_USAGE = 2,        /* UsageError, InvalidParameter, CommandNotFound */
    NTBCTL_EXIT_UNREACHABLE = 3,  /* DaemonUnreachable, Timeout */
    NTBCTL_EXIT_NO_DEVICE = 4,    /* DeviceNotFound */
    NTBCTL_EXIT_DENIED = 5,       /* AccessDenied */
    NTBCTL_EXIT_BUSY = 6,         /* DeviceBusy */
    NTBCTL_EXIT_NOT_BORROWED = 7, /* NotBorrowed */
    NTBCTL_EXIT_NODE_DOWN = 8,    /* NodeUnreachable */
    NTBCTL_EXIT_NO_DOMAIN = 9,    /* DomainNotFound */
    NTBCTL_EXIT_LIBVIRT = 10,     /* LibvirtError */
};

/* --json's schema version (docs/control.md "ntbctl --json"). */
#define NTBCTL_JSON_SCHEMA 1

/* What one run was asked, for the answer's envelope and messages. */
typedef struct Ntbctl {
    const char *command; /* ntbctl's command name */
    bool json;
    bool json_lines; /* one JSON object per line (events), not pretty */
    const char *socket_path;
    int timeout_ms;
} Ntbctl;

/* The error's class as --json names it ("DeviceBusy", "UsageError", ...). */
const char *ntbctl_error_class(const GError *error);
int ntbctl_exit_code(const GError *error);

/*
 * Report @error (its message sanitized: a daemon's text on the operator's
 * terminal) on stderr, with a hint where there is one, and with --json the
 * error envelope on stdout.  Returns the exit code.
 */
int ntbctl_fail(const Ntbctl *n, const GError *error);
/* A usage error: as ntbctl_fail() for a UsageError, plus the synopsis. */
int ntbctl_usage(const Ntbctl *n, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/*
 * Success: with --json the envelope {"schema", "command", "changed",
 * "return": @ret} on stdout (@ret may be NULL: {}), else @text.  Returns
 * the exit code (REFUSED when stdout cannot take it).
 */
int ntbctl_done(const Ntbctl *n, JsonNode *ret, bool changed, const char *text);

/* @root as JSON on stdout (see vn_ctl_format_json); false when stdout
 * cannot take it. */
bool ntbctl_print_json(JsonNode *root, bool pretty);

/* ntbctl events [--count N] [--follow]: prints events until interrupted (or N). */
/* @follow: across the daemon's restarts, reconnecting until interrupted;
 * the events it kept since the last one seen come first. */
int ntbctl_events(const Ntbctl *n, gint64 count, bool follow);
/* ntbctl version: this ntbctl's and the daemon's. */
int ntbctl_version(const Ntbctl *n);

#endif /* NTBCTL_H */
