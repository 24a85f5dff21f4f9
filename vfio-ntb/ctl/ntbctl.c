/*
 * ntbctl: the operator's view of one vfio-ntbd, over its control socket
 * (docs/control.md, ntbctl(8)).
 *
 *   ntbctl [--socket PATH] [--json] [--timeout-ms N] COMMAND [ARGS] [OPTIONS]
 *
 * One command per run: connect, one request, print, exit with the code of
 * the error's class (ntbctl.h).  Each command takes only its own options
 * (and the global ones), and everything typed is checked here before
 * anything is sent, so a typo is a usage error (2), never a round trip.
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ntbctl.h"

#include "common/name.h"
#include "common/trace.h"
#include "common/util.h"
#include "config.h"
#include "client/ctl-client.h"
#include "ctl/format.h"
#include "ctl/ntbctl-top.h"
#include "ctl/ntbctl-virt.h"

#include <stdio.h>
#include <string.h>
#include <sys/un.h>

/* --timeout-ms and --grace-ms: a wait longer than a day is a typo (ms
 * taken for s), and it keeps the value an int for poll(). */
#define NTBCTL_MAX_WAIT_MS (24 * 3600 * 1000)
/* --grace-ms: the daemon's bound (VN_DAEMON_MAX_GRACE_MS). */
#define NTBCTL_MAX_GRACE_MS 600000
/* revoke without --grace-ms: the daemon's default (VN_DAEMON_REVOKE_GRACE_MS). */
#define NTBCTL_DEFAULT_GRACE_MS 5000
/* revoke waits for the grace period and this much more: the fence, the answer. */
#define NTBCTL_REVOKE_MARGIN_MS 10000
/* A UNIX socket path the daemon connects to (sun_path, with NUL). */
#define NTBCTL_MAX_PATH (sizeof(((struct sockaddr_un *)NULL)->sun_path) - 1)
/* events --count: a bound that is no bound in practice. */
#define NTBCTL_MAX_COUNT 1000000000
/* lend --allow: the daemon's bound (VN_CONF_MAX_ALLOW). */
#define NTBCTL_MAX_ALLOW 256

/* Every option's value, as typed (GOptionEntry writes here). */
static struct {
    char *socket, *timeout, *trace;
    gboolean json, help, version;
    char *grace, *domain, *qmp, *qdev_id, *alias, *bus, *check, *connect, *hosts, *to;
    gboolean config, serve_only, names, managed, follow, list, p2p;
    char *device_socket, *pci, *allow, *count, *interval;
} o;

/* Global options first: every command takes them. */
static const GOptionEntry options[] = {
    { "socket", 0, 0, G_OPTION_ARG_FILENAME, &o.socket,
      "the daemon's control socket (default $" VN_CTL_SOCKET_ENV " or " VN_CTL_DEFAULT_SOCKET ")",
      "PATH" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &o.json,
      "answer in JSON (schema 1: docs/control.md), errors included", NULL },
    { "timeout-ms", 0, 0, G_OPTION_ARG_STRING, &o.timeout,
      "how long to wait for the daemon (default 10000)", "N" },
    { "help", 'h', 0, G_OPTION_ARG_NONE, &o.help, "this command's options and an example", NULL },
    { "version", 0, 0, G_OPTION_ARG_NONE, &o.version, "print ntbctl's version", NULL },
    VN_TRACE_OPTION_ENTRY(o.trace),
    /* The commands' own. */
    { "grace-ms", 0, 0, G_OPTION_ARG_STRING, &o.grace,
      "the borrower's time to let go (default: the daemon's, 5000)", "N" },
    { "domain", 0, 0, G_OPTION_ARG_STRING, &o.domain, "the VM (its libvirt domain name)", "D" },
    { "serve-only", 0, 0, G_OPTION_ARG_NONE, &o.serve_only,
      "only serve the device's socket, for a VM libvirt does not run", NULL },
    { "qmp", 0, 0, G_OPTION_ARG_FILENAME, &o.qmp,
      "the VM's QMP socket, to unplug the device on revoke or loss (implies --serve-only)",
      "PATH" },
    { "qdev-id", 0, 0, G_OPTION_ARG_STRING, &o.qdev_id, "the device's id in that VM (with --qmp)",
      "ID" },
    { "p2p", 0, 0, G_OPTION_ARG_NONE, &o.p2p,
      "the device takes part in its VM's compositions: DMA to the BARs of the VM's other "
      "--p2p devices, lender to lender (docs/p2p.md)",
      NULL },
    { "alias", 0, 0, G_OPTION_ARG_STRING, &o.alias,
      "the device's id in the domain (default ntb-HOST-NAME)", "A" },
    { "bus", 0, 0, G_OPTION_ARG_STRING, &o.bus, "a spare pcie-root-port (pci.N)", "B" },
    { "check", 0, 0, G_OPTION_ARG_FILENAME, &o.check, "check a domain's XML file", "FILE" },
    { "connect", 0, 0, G_OPTION_ARG_STRING, &o.connect, "libvirt URI (default: libvirt's)", "URI" },
    { "config", 0, 0, G_OPTION_ARG_NONE, &o.config,
      "the domains' persistent definitions follow too", NULL },
    { "hosts", 0, 0, G_OPTION_ARG_FILENAME, &o.hosts,
      "other hosts' control sockets and libvirt URIs (default $" NTBCTL_HOSTS_ENV
      " or " NTBCTL_DEFAULT_HOSTS ")",
      "FILE" },
    { "to", 0, 0, G_OPTION_ARG_STRING, &o.to, "where to: [HOST:]DOMAIN", "TARGET" },
    { "name", 0, 0, G_OPTION_ARG_NONE, &o.names, "only the devices' names, one per line", NULL },
    { "device-socket", 0, 0, G_OPTION_ARG_FILENAME, &o.device_socket,
      "the device's vfio-user server socket", "PATH" },
    { "pci", 0, 0, G_OPTION_ARG_STRING, &o.pci, "a PCI function of this host (through VFIO)",
      "DDDD:BB:DD.F" },
    { "managed", 0, 0, G_OPTION_ARG_NONE, &o.managed,
      "bind the function to vfio-pci now, give it back at unlend", NULL },
    { "allow", 0, 0, G_OPTION_ARG_STRING, &o.allow,
      "the nodes that may borrow it (comma-separated, or '*')", "NODES" },
    { "count", 0, 0, G_OPTION_ARG_STRING, &o.count, "stop after N events (top: frames)", "N" },
    { "list", 0, 0, G_OPTION_ARG_NONE, &o.list, "list the trace events, and which are on", NULL },
    { "follow", 0, 0, G_OPTION_ARG_NONE, &o.follow,
      "go on across the daemon's restarts (the events of the gap come first)", NULL },
    { "interval-ms", 0, 0, G_OPTION_ARG_STRING, &o.interval, "time between frames (default 1000)",
      "N" },
    G_OPTION_ENTRY_NULL,
};
#define N_GLOBAL 6

typedef enum ArgKind {
    ARG_NONE,
    ARG_DEV,
    ARG_DEV_OPTIONAL,
    ARG_NAME,     /* a device name of this node (lend, unlend) */
    ARG_PATTERNS, /* trace */
    ARG_COMMAND,  /* help [COMMAND] */
} ArgKind;

typedef struct Command Command;
struct Command {
    const char *name;
    ArgKind arg;
    const char *synopsis; /* after "ntbctl NAME " */
    const char *summary;
    const char *example;
    const char *options; /* its own, comma-separated */
    int (*run)(const Command *cmd, Ntbctl *n, const char *arg);
    /* Commands that are one daemon request: */
    const char *execute;
    bool mutates; /* "changed" when the daemon does not say */
    bool (*format)(GString *out, const char *arg, const char *node, JsonNode *ret, GError **error);
};

static const Command commands[];
static const size_t n_commands;

/* ---- options ------------------------------------------------------------- */

static const GOptionEntry *option_named(const char *name, size_t len)
{
    for (const GOptionEntry *e = options; e->long_name != NULL; e++) {
        if (strlen(e->long_name) == len && strncmp(e->long_name, name, len) == 0) {
            return e;
        }
    }
    return NULL;
}

static bool takes(const Command *cmd, const char *option)
{
    g_auto(GStrv) names = g_strsplit(cmd->options, ",", -1);

    return g_strv_contains((const char *const *)names, option);
}

/* The first word that is no option nor an option's value: the command. */
static int find_command(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];

        if (strcmp(a, "--") == 0) {
            return i + 1 < argc ? i + 1 : -1;
        }
        if (a[0] != '-' || a[1] == '\0') {
            return i;
        }
        if (a[1] == '-' && strchr(a, '=') == NULL) {
            const GOptionEntry *e = option_named(a + 2, strlen(a + 2));

            if (e != NULL && e->arg != G_OPTION_ARG_NONE) {
                i++; /* its value */
            }
        }
    }
    return -1;
}

/* The global options and @cmd's, for GOption. */
static GOptionEntry *entries_for(const Command *cmd)
{
    GArray *a = g_array_new(TRUE, TRUE, sizeof(GOptionEntry));

    for (const GOptionEntry *e = options; e->long_name != NULL; e++) {
        if (e - options < N_GLOBAL || (cmd != NULL && takes(cmd, e->long_name))) {
            g_array_append_val(a, *e);
        }
    }
    return (GOptionEntry *)(void *)g_array_free(a, FALSE);
}

static bool parse_ms(Ntbctl *n, const char *opt, const char *text, gint64 min, gint64 max,
                     gint64 *out)
{
    guint64 v = 0;

    /* g_ascii_string_to_unsigned refuses signs, blanks and trailing junk. */
    if (!g_ascii_string_to_unsigned(text, 10, (guint64)min, (guint64)max, &v, NULL)) {
        ntbctl_usage(n, "%s wants a number, %" G_GINT64_FORMAT "-%" G_GINT64_FORMAT ", not \"%s\"",
                     opt, min, max, text);
        return false;
    }
    *out = (gint64)v;
    return true;
}

/* ---- help ----------------------------------------------------------------- */

/* @text after @indent columns already used, wrapped at HELP_WIDTH. */
#define HELP_WIDTH 100
static void append_wrapped(GString *out, size_t indent, const char *text)
{
    g_auto(GStrv) words = g_strsplit(text, " ", -1);
    size_t col = indent;

    for (char **w = words; *w != NULL; w++) {
        size_t len = strlen(*w);

        if (col > indent && col + 1 + len > HELP_WIDTH) {
            g_string_append_printf(out, "\n%*s", (int)indent, "");
            col = indent;
        } else if (col > indent) {
            g_string_append_c(out, ' ');
            col++;
        }
        g_string_append(out, *w);
        col += len;
    }
    g_string_append_c(out, '\n');
}

static void print_option(GString *out, const GOptionEntry *e)
{
    g_autofree char *left = g_strdup_printf("--%s%s%s", e->long_name, e->arg_description ? " " : "",
                                            e->arg_description ? e->arg_description : "");

    g_string_append_printf(out, "  %-22s ", left);
    append_wrapped(out, 25, e->description);
}

static void print_help(FILE *to, const Command *cmd)
{
    g_autoptr(GString) out = g_string_new(NULL);

    if (cmd == NULL) {
        g_string_append(out, "usage: ntbctl [GLOBAL OPTIONS] COMMAND [ARGS] [OPTIONS]\n\n"
                             "commands:\n");
        for (size_t i = 0; i < n_commands; i++) {
            g_string_append_printf(out, "  %-10s ", commands[i].name);
            append_wrapped(out, 13, commands[i].summary);
        }
        g_string_append(out, "\nglobal options:\n");
        for (size_t i = 0; i < N_GLOBAL; i++) {
            print_option(out, &options[i]);
        }
        g_string_append(out,
                        "\nDEV is host/name, e.g. hosta/nvme0.  `ntbctl help COMMAND` shows a "
                        "command's options and an example.\nExit: 0 done, 1 refused, 2 usage, "
                        "3 daemon unreachable, 4 no such device, 5 access denied,\n6 device "
                        "busy, 7 not borrowed, 8 node unreachable, 9 no such domain, 10 libvirt "
                        "error.\n");
    } else {
        g_auto(GStrv) names = g_strsplit(cmd->options, ",", -1);

        g_string_append_printf(out, "usage: ntbctl %s%s%s\n\n", cmd->name,
                               *cmd->synopsis ? " " : "", cmd->synopsis);
        append_wrapped(out, 0, cmd->summary);
        if (names[0] != NULL && *names[0] != '\0') {
            g_string_append(out, "\noptions:\n");
            for (char **s = names; *s != NULL; s++) {
                print_option(out, option_named(*s, strlen(*s)));
            }
        }
        g_string_append(out, "\nglobal options: --socket PATH, --json, --timeout-ms N, --trace "
                             "PATTERNS (`ntbctl --help`)\n");
        g_string_append_printf(out, "\nexample:\n  %s\n", cmd->example);
    }
    fputs(out->str, to);
}

/* ---- daemon requests ------------------------------------------------------- */

static JsonObject *request_args(const Command *cmd, const char *arg, gint64 grace_ms)
{
    JsonObject *args = json_object_new();

    if (arg != NULL && (cmd->arg == ARG_DEV || cmd->arg == ARG_DEV_OPTIONAL)) {
        json_object_set_string_member(args, "device", arg);
    } else if (arg != NULL && cmd->arg == ARG_NAME) {
        json_object_set_string_member(args, "name", arg);
    } else if (arg != NULL && cmd->arg == ARG_PATTERNS) {
        json_object_set_string_member(args, "patterns", arg);
    }
    if (grace_ms >= 0) {
        json_object_set_int_member(args, "grace-ms", grace_ms);
    }
    return args;
}

/* Execute @args (taken) as @cmd, format and answer. */
static int request(const Command *cmd, Ntbctl *n, const char *arg, JsonObject *args)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonObject) a = args;
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(n->socket_path, n->timeout_ms, &error);
    g_autoptr(JsonNode) ret = NULL;
    g_autoptr(GString) text = g_string_new(NULL);
    JsonObject *ro;
    bool changed = cmd->mutates;

    if (c == NULL) {
        return ntbctl_fail(n, error);
    }
    ret = vn_ctl_client_execute(c, cmd->execute, json_object_get_size(a) ? a : NULL, &error);
    /* Formatted with --json too: it checks the answer's shape, and an answer
     * that means "not done" (unplug's requested: false) fails either way. */
    if (ret == NULL || !cmd->format(text, arg, vn_ctl_client_node(c), ret, &error)) {
        if (g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL)) {
            g_prefix_error(&error, "vfio-ntbd at %s: ", n->socket_path);
        }
        return ntbctl_fail(n, error);
    }
    ro = JSON_NODE_HOLDS_OBJECT(ret) ? json_node_get_object(ret) : NULL;
    if (ro != NULL && json_object_has_member(ro, "changed")) {
        changed = json_object_get_boolean_member_with_default(ro, "changed", changed);
    }
    /* Done, but not in the daemon's state file: said, and still done. */
    if (ro != NULL && !json_object_get_boolean_member_with_default(ro, "saved", TRUE)) {
        fprintf(stderr,
                "ntbctl: warning: vfio-ntbd could not save its state (its log says why): "
                "a restart now would forget %s\n",
                cmd->mutates ? "this change" : "recent changes");
    }
    return ntbctl_done(n, ret, changed, text->str);
}

static int run_request(const Command *cmd, Ntbctl *n, const char *arg)
{
    gint64 grace_ms = -1;

    if (o.grace != NULL && !parse_ms(n, "--grace-ms", o.grace, 0, NTBCTL_MAX_GRACE_MS, &grace_ms)) {
        return NTBCTL_EXIT_USAGE;
    }
    return request(cmd, n, arg, request_args(cmd, arg, grace_ms));
}

/* A revoke takes its grace period: waited for, not cut short by the default
 * --timeout-ms, and said first (stderr) so nobody thinks ntbctl hangs. */
static int run_revoke(const Command *cmd, Ntbctl *n, const char *dev)
{
    gint64 grace_ms = -1;

    if (o.grace != NULL && !parse_ms(n, "--grace-ms", o.grace, 0, NTBCTL_MAX_GRACE_MS, &grace_ms)) {
        return NTBCTL_EXIT_USAGE;
    }
    if (o.timeout == NULL) {
        n->timeout_ms =
            (int)MAX((gint64)n->timeout_ms, (grace_ms >= 0 ? grace_ms : NTBCTL_DEFAULT_GRACE_MS) +
                                                NTBCTL_REVOKE_MARGIN_MS);
    }
    if (!n->json) {
        fprintf(stderr,
                "ntbctl: revoking %s: its holder has %" G_GINT64_FORMAT
                " ms to let go, then the lender fences it\n",
                dev, grace_ms >= 0 ? grace_ms : (gint64)NTBCTL_DEFAULT_GRACE_MS);
    }
    return request(cmd, n, dev, request_args(cmd, dev, grace_ms));
}

static bool fmt_nodes(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_nodes(out, ret, e);
}

static bool fmt_list(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return o.names ? vn_ctl_format_device_names(out, ret, e) : vn_ctl_format_devices(out, ret, e);
}

static bool fmt_show(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_device(out, ret, e);
}

static bool fmt_stats(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_stats(out, ret, e);
}

static bool fmt_borrow(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_borrow(out, node, ret, e);
}

static bool fmt_return(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_return(out, arg, ret, e);
}

static bool fmt_revoke(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_revoke(out, arg, ret, e);
}

static bool fmt_attach(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_attach(out, o.domain, ret, e);
}

static bool fmt_detach(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_detach(out, arg, ret, e);
}

static bool fmt_unplug(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_unplug(out, arg, ret, e);
}

static bool fmt_lend(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_lend(out, node, arg, ret, e);
}

static bool fmt_unlend(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_unlend(out, node, arg, ret, e);
}

static bool fmt_trace(GString *out, const char *arg, const char *node, JsonNode *ret, GError **e)
{
    return vn_ctl_format_trace(out, node, ret, e);
}

static bool fmt_trace_list(GString *out, const char *arg, const char *node, JsonNode *ret,
                           GError **e)
{
    return vn_ctl_format_trace_list(out, ret, e);
}

static const Command trace_list = { .name = "trace",
                                    .execute = "query-trace",
                                    .format = fmt_trace_list };

static int run_trace(const Command *cmd, Ntbctl *n, const char *patterns)
{
    if (o.list && patterns != NULL) {
        return ntbctl_usage(n, "trace: --list, or patterns to switch: choose one");
    }
    if (o.list) {
        return request(&trace_list, n, NULL, json_object_new());
    }
    return run_request(cmd, n, patterns);
}

/* ---- commands with more to check ----------------------------------------- */

static bool check_domain(Ntbctl *n, const char *domain)
{
    if (!vn_name_valid(VN_NAME_DOMAIN, domain)) {
        ntbctl_usage(n, "--domain wants the VM's name: %s", vn_name_rule(VN_NAME_DOMAIN));
        return false;
    }
    return true;
}

static int run_list(const Command *cmd, Ntbctl *n, const char *arg)
{
    if (o.names && n->json) {
        return ntbctl_usage(n, "list: --name prints names only, --json everything: choose one");
    }
    return run_request(cmd, n, arg);
}

static int run_attach(const Command *cmd, Ntbctl *n, const char *dev)
{
    g_autoptr(GError) error = NULL;
    JsonObject *args;
    bool serve_only = o.serve_only || o.qmp != NULL;

    if (o.domain == NULL) {
        return ntbctl_usage(n, "attach: which VM? (--domain D)");
    }
    if (!check_domain(n, o.domain)) {
        return NTBCTL_EXIT_USAGE;
    }
    if (o.qmp != NULL &&
        (o.qmp[0] != '/' || strlen(o.qmp) > NTBCTL_MAX_PATH || !g_utf8_validate(o.qmp, -1, NULL))) {
        return ntbctl_usage(n,
                            "--qmp wants the absolute path of the VM's QMP socket (at most %zu "
                            "bytes of UTF-8)",
                            NTBCTL_MAX_PATH);
    }
    if ((o.qmp != NULL) != (o.qdev_id != NULL) ||
        (o.qdev_id != NULL && !vn_name_valid(VN_NAME_QDEV_ID, o.qdev_id))) {
        return ntbctl_usage(n, "--qmp and --qdev-id go together (the device's id: %s)",
                            vn_name_rule(VN_NAME_QDEV_ID));
    }
    if (o.alias != NULL && !vn_name_valid(VN_NAME_QDEV_ID, o.alias)) {
        return ntbctl_usage(n, "--alias is a QEMU id: %s", vn_name_rule(VN_NAME_QDEV_ID));
    }
    if (!serve_only && o.p2p) {
        return ntbctl_usage(n, "--p2p serves the device itself (with --serve-only or --qmp); a "
                               "libvirt domain declares it: <vn:device ... p2p='yes'/>");
    }
    if (serve_only && (o.config || o.alias != NULL || o.connect != NULL)) {
        return ntbctl_usage(n, "--config, --alias and --connect are for a libvirt domain; "
                               "--serve-only and --qmp only serve the device");
    }
    if (!serve_only) {
        /* A domain libvirt runs gets the device hot-plugged; anything else is
         * refused before the daemon hears of it: a typo in the domain's name
         * must not leave a device borrowed and served for nobody. */
        if (!ntbctl_virt_attach(dev, o.domain, o.alias, o.connect, o.config, n->socket_path,
                                n->timeout_ms, n->json ? stderr : stdout, &error)) {
            return ntbctl_fail(n, error);
        }
        return ntbctl_done(n, NULL, true, NULL);
    }
    args = request_args(cmd, dev, -1);
    json_object_set_string_member(args, "domain", o.domain);
    if (o.qmp != NULL) {
        json_object_set_string_member(args, "qmp", o.qmp);
        json_object_set_string_member(args, "qdev-id", o.qdev_id);
    }
    if (o.p2p) {
        json_object_set_boolean_member(args, "p2p", TRUE);
    }
    return request(cmd, n, dev, args);
}

static int run_detach(const Command *cmd, Ntbctl *n, const char *dev)
{
    g_autoptr(GError) error = NULL;

    if ((o.config || o.connect != NULL) && o.domain == NULL) {
        return ntbctl_usage(n, "--config and --connect are for detach --domain D");
    }
    if (o.domain == NULL) {
        return run_request(cmd, n, dev);
    }
    if (!check_domain(n, o.domain)) {
        return NTBCTL_EXIT_USAGE;
    }
    if (!ntbctl_virt_detach(dev, o.domain, o.connect, o.config, n->socket_path, n->timeout_ms,
                            n->json ? stderr : stdout, &error)) {
        return ntbctl_fail(n, error);
    }
    return ntbctl_done(n, NULL, true, NULL);
}

static int run_reassign(const Command *cmd, Ntbctl *n, const char *dev)
{
    g_autoptr(GError) error = NULL;
    const char *colon = o.to != NULL ? strchr(o.to, ':') : NULL;
    g_autofree char *as_dev = colon ? g_strdup_printf("%.*s/x", (int)(colon - o.to), o.to) : NULL;
    const char *hosts = o.hosts;

    if (o.to == NULL || o.to[0] == '\0') {
        return ntbctl_usage(n, "reassign DEV --to [HOST:]DOMAIN");
    }
    /* HOST follows the host part of device names; DOMAIN, --domain's rules. */
    if ((as_dev != NULL && !vn_ctl_device_valid(as_dev, NULL)) ||
        !vn_name_valid(VN_NAME_DOMAIN, colon ? colon + 1 : o.to)) {
        return ntbctl_usage(n, "reassign: --to HOST:DOMAIN, HOST a node name, DOMAIN %s",
                            vn_name_rule(VN_NAME_DOMAIN));
    }
    /* The default file may be absent (one host); a file named by the
     * operator must exist, or a typo would show only as an unknown host. */
    if (hosts != NULL && !g_file_test(hosts, G_FILE_TEST_EXISTS)) {
        return ntbctl_usage(n, "--hosts %s: no such file", hosts);
    }
    if (hosts == NULL) {
        hosts = g_getenv(NTBCTL_HOSTS_ENV) ? g_getenv(NTBCTL_HOSTS_ENV) : NTBCTL_DEFAULT_HOSTS;
    }
    if (!ntbctl_reassign(dev, o.to, hosts, o.connect, o.config, n->socket_path, n->timeout_ms,
                         n->json ? stderr : stdout, &error)) {
        return ntbctl_fail(n, error);
    }
    return ntbctl_done(n, NULL, true, NULL);
}

static int run_xml(const Command *cmd, Ntbctl *n, const char *dev)
{
    g_autoptr(GError) error = NULL;

    g_autoptr(GString) text = g_string_new(NULL);
    g_autoptr(JsonNode) ret = NULL;
    g_autofree char *xml = NULL;

    if (o.check != NULL) {
        if (dev != NULL || o.alias != NULL || o.bus != NULL) {
            return ntbctl_usage(n, "xml --check FILE takes nothing else");
        }
        ret = ntbctl_xml_check(o.check, text, &error);
        return ret != NULL ? ntbctl_done(n, ret, false, text->str) : ntbctl_fail(n, error);
    }
    if (dev == NULL) {
        return ntbctl_usage(n, "xml: which device? (ntbctl xml host/name [--alias A])");
    }
    if ((o.alias != NULL && !vn_name_valid(VN_NAME_QDEV_ID, o.alias)) ||
        (o.bus != NULL && !vn_name_valid(VN_NAME_QDEV_ID, o.bus))) {
        return ntbctl_usage(n, "xml: --alias and --bus are QEMU ids: %s",
                            vn_name_rule(VN_NAME_QDEV_ID));
    }
    xml = ntbctl_xml_print(dev, o.alias, o.bus, n->socket_path, n->timeout_ms, &error);
    if (xml == NULL) {
        return ntbctl_fail(n, error);
    }
    ret = json_node_new(JSON_NODE_OBJECT);
    json_node_take_object(ret, json_object_new());
    json_object_set_string_member(json_node_get_object(ret), "device", dev);
    json_object_set_string_member(json_node_get_object(ret), "xml", xml);
    return ntbctl_done(n, ret, false, xml);
}

static int run_lend(const Command *cmd, Ntbctl *n, const char *name)
{
    g_auto(GStrv) allow = NULL;
    JsonArray *list;
    JsonObject *args;

    if ((o.device_socket == NULL) == (o.pci == NULL)) {
        return ntbctl_usage(n, "lend: the device is --device-socket PATH or --pci DDDD:BB:DD.F");
    }
    if (o.device_socket != NULL &&
        (o.device_socket[0] != '/' || strlen(o.device_socket) > NTBCTL_MAX_PATH)) {
        return ntbctl_usage(n, "--device-socket wants an absolute path (at most %zu bytes)",
                            NTBCTL_MAX_PATH);
    }
    if (o.managed && o.pci == NULL) {
        return ntbctl_usage(n, "--managed is for --pci");
    }
    if (o.allow == NULL) {
        return ntbctl_usage(n, "lend: who may borrow it? (--allow NODE,NODE or --allow '*')");
    }
    allow = vn_name_split_list(o.allow); /* ',' or ';', as in the config */
    if (g_strv_length(allow) > NTBCTL_MAX_ALLOW) {
        return ntbctl_usage(n, "--allow names at most %d nodes", NTBCTL_MAX_ALLOW);
    }
    list = json_array_new();
    for (char **s = allow; *s != NULL; s++) {
        if (strcmp(*s, "*") != 0 && !vn_name_valid(VN_NAME_NODE, *s)) {
            json_array_unref(list);
            return ntbctl_usage(n, "--allow: \"%s\" is not a node name (%s) nor '*'", *s,
                                vn_name_rule(VN_NAME_NODE));
        }
        json_array_add_string_element(list, *s);
    }
    args = request_args(cmd, name, -1);
    json_object_set_array_member(args, "allow", list);
    if (o.device_socket != NULL) {
        json_object_set_string_member(args, "socket", o.device_socket);
    } else {
        json_object_set_string_member(args, "pci", o.pci);
        json_object_set_boolean_member(args, "managed", o.managed);
    }
    return request(cmd, n, name, args);
}

static int run_events(const Command *cmd, Ntbctl *n, const char *arg)
{
    gint64 count = -1;

    n->json_lines = true;
    if (o.count != NULL && !parse_ms(n, "--count", o.count, 1, NTBCTL_MAX_COUNT, &count)) {
        return NTBCTL_EXIT_USAGE;
    }
    return ntbctl_events(n, count, o.follow);
}

static int run_top(const Command *cmd, Ntbctl *n, const char *dev)
{
    g_autoptr(GError) error = NULL;
    gint64 interval = NTBCTL_TOP_DEFAULT_INTERVAL_MS, count = 0;

    if (n->json) {
        return ntbctl_usage(n, "top is for a terminal; `ntbctl --json stats` is its data");
    }
    if ((o.interval != NULL && !parse_ms(n, "--interval-ms", o.interval, NTBCTL_TOP_MIN_INTERVAL_MS,
                                         NTBCTL_TOP_MAX_INTERVAL_MS, &interval)) ||
        (o.count != NULL && !parse_ms(n, "--count", o.count, 1, NTBCTL_TOP_MAX_COUNT, &count))) {
        return NTBCTL_EXIT_USAGE;
    }
    if (ntbctl_top(n->socket_path, n->timeout_ms, dev, (int)interval, (int)count, &error) != 0) {
        return ntbctl_fail(n, error);
    }
    return NTBCTL_EXIT_DONE;
}

static int run_version(const Command *cmd, Ntbctl *n, const char *arg)
{
    return ntbctl_version(n);
}

static const Command *command_named(const char *name);

static int run_help(const Command *cmd, Ntbctl *n, const char *arg)
{
    if (arg != NULL && command_named(arg) == NULL) {
        return ntbctl_usage(n, "help: no command \"%s\" (`ntbctl help` lists them)", arg);
    }
    print_help(stdout, arg != NULL ? command_named(arg) : NULL);
    return NTBCTL_EXIT_DONE;
}

#define DEV_EXAMPLE "hosta/nvme0"
static const Command commands[] = {
    { "nodes", ARG_NONE, "", "the fabric's nodes: link, devices, last seen, version",
      "ntbctl nodes", "", run_request, "query-nodes", false, fmt_nodes },
    { "list", ARG_NONE, "[--name]",
      "every device: state, holder, lease, the domain it is attached to, time left on a lease "
      "whose holder is down",
      "ntbctl list --name", "name", run_list, "query-devices", false, fmt_list },
    { "show", ARG_DEV, "DEV", "one device in detail", "ntbctl show " DEV_EXAMPLE, "", run_request,
      "query-device", false, fmt_show },
    { "borrow", ARG_DEV, "DEV", "borrow DEV for this node", "ntbctl borrow " DEV_EXAMPLE, "",
      run_request, "borrow", true, fmt_borrow },
    { "return", ARG_DEV, "DEV", "give back a device this node borrowed (detaching it first)",
      "ntbctl return " DEV_EXAMPLE, "", run_request, "return", true, fmt_return },
    { "revoke", ARG_DEV, "DEV [--grace-ms N]",
      "take back a lent device, on its lender; the borrower gets the grace period to let go",
      "ntbctl revoke " DEV_EXAMPLE " --grace-ms 2000", "grace-ms", run_revoke, "revoke", true,
      fmt_revoke },
    { "attach", ARG_DEV,
      "DEV --domain D [--alias A] [--config] [--connect URI] | DEV --domain D --serve-only "
      "[--qmp PATH --qdev-id ID] [--p2p]",
      "borrow DEV and hot-plug it into running libvirt domain D (a free pcie-root-port); with "
      "--serve-only, serve it on a socket for a VM you start yourself (prints the socket)",
      "ntbctl attach " DEV_EXAMPLE " --domain vm1",
      "domain,alias,config,connect,serve-only,qmp,qdev-id,p2p", run_attach, "attach", true,
      fmt_attach },
    { "detach", ARG_DEV, "DEV [--domain D [--config] [--connect URI]]",
      "stop serving DEV (it stays borrowed); with --domain, unplug it from libvirt domain D and "
      "return it",
      "ntbctl detach " DEV_EXAMPLE " --domain vm1", "domain,config,connect", run_detach, "detach",
      true, fmt_detach },
    { "unplug", ARG_DEV, "DEV",
      "ask the VM to release DEV (device request; needs the patched QEMU, qemu-patches/0003)",
      "ntbctl unplug " DEV_EXAMPLE, "", run_request, "unplug", true, fmt_unplug },
    { "reassign", ARG_DEV, "DEV --to [HOST:]DOMAIN [--hosts FILE] [--config] [--connect URI]",
      "move DEV from the libvirt domain that holds it into DOMAIN (on HOST: see --hosts), "
      "rolling back on failure",
      "ntbctl reassign " DEV_EXAMPLE " --to hostc:vm7", "to,hosts,config,connect", run_reassign,
      NULL, true, NULL },
    { "lend", ARG_NAME,
      "NAME (--device-socket PATH | --pci DDDD:BB:DD.F [--managed]) --allow NODES",
      "lend one more device of this node (kept across restarts in the state file)",
      "ntbctl lend nvme1 --pci 0000:03:00.0 --managed --allow hostb,hostc",
      "device-socket,pci,managed,allow", run_lend, "lend", true, fmt_lend },
    { "unlend", ARG_NAME, "NAME", "stop lending a device that is not lent (revoke it first)",
      "ntbctl unlend nvme1", "", run_request, "unlend", true, fmt_unlend },
    { "stats", ARG_DEV_OPTIONAL, "[DEV]", "counters of this node's devices and its fabric",
      "ntbctl stats " DEV_EXAMPLE, "", run_request, "query-stats", false, fmt_stats },
    { "top", ARG_DEV_OPTIONAL, "[DEV] [--interval-ms N] [--count N]",
      "a live view of this node's devices: forwarded accesses, interrupts, DMA maps and requests "
      "per second (until interrupted, or N frames)",
      "ntbctl top --interval-ms 2000", "interval-ms,count", run_top, NULL, false, NULL },
    { "events", ARG_NONE, "[--count N] [--follow]",
      "the daemon's events as they happen (leases, attach and detach, lost devices, links)",
      "ntbctl events --follow --json", "count,follow", run_events, NULL, false, NULL },
    { "trace", ARG_PATTERNS, "PATTERNS | --list",
      "switch trace events in the daemon and its workers (globs, comma-separated; -GLOB turns "
      "off; a glob that matches no event is refused)",
      "ntbctl trace 'lender_*,-lender_dma*'", "list", run_trace, "trace", true, fmt_trace },
    { "xml", ARG_DEV_OPTIONAL, "DEV [--alias A] [--bus B] | --check FILE",
      "libvirt domain XML that declares DEV (docs/libvirt.md), or check a domain's declarations",
      "ntbctl xml " DEV_EXAMPLE " --alias ntb0", "alias,bus,check", run_xml, NULL, false, NULL },
    { "version", ARG_NONE, "", "this ntbctl's version and the daemon's", "ntbctl version", "",
      run_version, NULL, false, NULL },
    { "help", ARG_COMMAND, "[COMMAND]", "the commands, or one command's options and an example",
      "ntbctl help attach", "", run_help, NULL, false, NULL },
};
static const size_t n_commands = G_N_ELEMENTS(commands);

static const Command *command_named(const char *name)
{
    for (size_t i = 0; i < n_commands; i++) {
        if (strcmp(commands[i].name, name) == 0) {
            return &commands[i];
        }
    }
    return NULL;
}

/* The positional argument, checked; false after a usage error. */
static bool check_arg(const Command *cmd, Ntbctl *n, int argc, char **argv, const char **arg)
{
    g_autoptr(GError) error = NULL;
    bool optional = cmd->arg == ARG_DEV_OPTIONAL || cmd->arg == ARG_COMMAND;

    *arg = argc > 2 ? argv[2] : NULL;
    if (argc > 3 || (argc == 3 && cmd->arg == ARG_NONE)) {
        ntbctl_usage(n, "%s: unexpected argument \"%s\"", cmd->name,
                     argv[cmd->arg == ARG_NONE ? 2 : 3]);
        return false;
    }
    if (*arg == NULL && !optional && cmd->arg != ARG_NONE &&
        !(cmd->arg == ARG_PATTERNS && o.list)) {
        ntbctl_usage(n, "%s: %s", cmd->name,
                     cmd->arg == ARG_DEV    ? "which device? (host/name, e.g. hosta/nvme0)"
                     : cmd->arg == ARG_NAME ? "which device? (its name on this node, e.g. nvme1)"
                                            : "which events? (globs, e.g. 'lender_*,borrower_*')");
        return false;
    }
    if (*arg != NULL && (cmd->arg == ARG_DEV || cmd->arg == ARG_DEV_OPTIONAL) &&
        !vn_ctl_device_valid(*arg, &error)) {
        ntbctl_usage(n, "%s: %s", cmd->name, error->message);
        return false;
    }
    if (*arg != NULL && cmd->arg == ARG_NAME && !vn_name_valid(VN_NAME_DEVICE, *arg)) {
        ntbctl_usage(n, "%s: a device name is %s", cmd->name, vn_name_rule(VN_NAME_DEVICE));
        return false;
    }
    return true;
}

/* GOption's error, but an option of another command says whose it is. */
static int unknown_option(Ntbctl *n, const Command *cmd, const GError *error)
{
    const char *opt = strstr(error->message, "--");

    if (cmd != NULL && opt != NULL &&
        g_error_matches(error, G_OPTION_ERROR, G_OPTION_ERROR_UNKNOWN_OPTION)) {
        size_t len = strcspn(opt + 2, "= ");
        g_autoptr(GString) whose = g_string_new(NULL);

        for (size_t i = 0; i < n_commands; i++) {
            g_autofree char *name = g_strndup(opt + 2, len);

            if (takes(&commands[i], name)) {
                g_string_append_printf(whose, "%s%s", whose->len ? ", " : "", commands[i].name);
            }
        }
        if (whose->len > 0) {
            return ntbctl_usage(n, "%s: --%.*s is an option of %s, not of %s", cmd->name, (int)len,
                                opt + 2, whose->str, cmd->name);
        }
        return ntbctl_usage(n, "%s: no option --%.*s", cmd->name, (int)len, opt + 2);
    }
    return ntbctl_usage(n, "%s", error->message);
}

/* Take out of argv what follows the command at @ci and starts with a single
 * '-' (not "-h"): trace patterns GOption would call unknown options.  The
 * strings stay argv's; the array (NULL-terminated) is the caller's. */
static char **stash_patterns(int *argc, char **argv, int ci)
{
    char **out = g_new0(char *, (gsize)*argc + 1);
    int kept = 0, taken = 0;

    for (int i = 0; i < *argc; i++) {
        if (i > ci && ci > 0 && argv[i][0] == '-' && argv[i][1] != '-' && argv[i][1] != '\0' &&
            strcmp(argv[i], "-h") != 0) {
            out[taken++] = argv[i];
        } else {
            argv[kept++] = argv[i];
        }
    }
    argv[kept] = NULL;
    *argc = kept;
    return out;
}

int main(int argc, char **argv)
{
    g_autofree GOptionEntry *entries = NULL;
    g_autoptr(GOptionContext) ctx = g_option_context_new(NULL);
    g_autoptr(GError) error = NULL;
    const Command *cmd = NULL;
    const char *arg = NULL;
    Ntbctl n = { .timeout_ms = VN_CTL_DEFAULT_TIMEOUT_MS };
    gint64 timeout_ms = VN_CTL_DEFAULT_TIMEOUT_MS;
    int ci = find_command(argc, argv);
    g_autofree char **stashed = NULL;

    /* stdout carries answers only; any log line goes to stderr. */
    g_log_writer_default_set_use_stderr(TRUE);
    for (int i = 1; i < argc && (ci < 0 || i < ci); i++) {
        n.json |= strcmp(argv[i], "--json") == 0; /* so that an early error is JSON too */
    }
    if (ci > 0) {
        cmd = command_named(argv[ci]);
        if (cmd == NULL) {
            ntbctl_usage(&n, "unknown command \"%s\"", argv[ci]);
            print_help(stderr, NULL);
            return NTBCTL_EXIT_USAGE;
        }
        n.command = cmd->name;
    }
    entries = entries_for(cmd);
    g_option_context_set_help_enabled(ctx, FALSE);
    g_option_context_add_main_entries(ctx, entries, NULL);
    /* trace's patterns may start with '-' ('-*', '-lender_*'): not options. */
    stashed = cmd != NULL && cmd->arg == ARG_PATTERNS ? stash_patterns(&argc, argv, ci) : NULL;
    if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
        return unknown_option(&n, cmd, error);
    }
    for (char **p = stashed; p != NULL && *p != NULL; p++) {
        argv[argc++] = *p; /* room: they were there before */
    }
    n.json = o.json;
    if (!vn_trace_setup(o.trace, false, &error)) {
        return ntbctl_usage(&n, "%s", error->message);
    }
    if (o.version && cmd == NULL) {
        printf("ntbctl %s\n", VN_VERSION);
        return NTBCTL_EXIT_DONE;
    }
    if (o.help) {
        print_help(stdout, cmd);
        return NTBCTL_EXIT_DONE;
    }
    if (cmd == NULL) {
        ntbctl_usage(&n, "no command given");
        print_help(stderr, NULL);
        return NTBCTL_EXIT_USAGE;
    }
    /* GOption left argv[0], the command and its positional arguments. */
    if (argc < 2 || strcmp(argv[1], cmd->name) != 0) {
        return ntbctl_usage(&n, "%s: options go after the command's name", cmd->name);
    }
    if (!check_arg(cmd, &n, argc, argv, &arg)) {
        return NTBCTL_EXIT_USAGE;
    }
    n.socket_path = o.socket != NULL ? o.socket : vn_ctl_default_socket();
    if (*n.socket_path == '\0') {
        return ntbctl_usage(&n, "--socket wants a path");
    }
    if (o.timeout != NULL &&
        !parse_ms(&n, "--timeout-ms", o.timeout, 1, NTBCTL_MAX_WAIT_MS, &timeout_ms)) {
        return NTBCTL_EXIT_USAGE;
    }
    n.timeout_ms = (int)timeout_ms;
    return cmd->run(cmd, &n, arg);
}
