/*
 * ntbctl: the operator's view of one vfio-ntbd, over its control socket
 * (docs/control.md).
 *
 *   ntbctl [--socket PATH] [--json] [--timeout-ms N] COMMAND [ARGS]
 *
 * One command per run: connect, one request, print, exit with the code
 * docs/control.md "ntbctl exit codes" names.  Everything typed is checked
 * here before anything is sent, so a typo is a usage error (2), never a
 * round trip.
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "common/name.h"
#include "common/util.h"
#include "config.h"
#include "ctl/ctl-client.h"
#include "ctl/format.h"
#include "ctl/ntbctl-virt.h"
#include "libvirt/domxml.h"
#include "libvirt/virt.h"
#include "common/trace.h"

#include <stdio.h>
#include <string.h>
#include <sys/un.h>

/* docs/control.md "ntbctl exit codes" */
enum {
    EXIT_DONE = 0,
    EXIT_REFUSED = 1,
    EXIT_USAGE = 2,
    EXIT_UNREACHABLE = 3,
};

/* --timeout-ms and --grace-ms: a wait longer than a day is a typo (ms
 * taken for s), and it keeps the value an int for poll(). */
#define NTBCTL_MAX_WAIT_MS (24 * 3600 * 1000)
/* --grace-ms: the daemon's bound (VN_DAEMON_MAX_GRACE_MS). */
#define NTBCTL_MAX_GRACE_MS 600000
/* --qmp: a UNIX socket path the daemon connects to (sun_path, with NUL). */
#define NTBCTL_MAX_QMP (sizeof(((struct sockaddr_un *)NULL)->sun_path) - 1)

typedef enum ArgKind {
    ARG_NONE,
    ARG_DEV,
    ARG_DEV_OPTIONAL,
    ARG_PATTERNS,
} ArgKind;

/* What the user asked for, checked. */
typedef struct Invocation {
    const char *device;   /* NULL when the command takes none */
    const char *domain;   /* attach */
    const char *qmp;      /* attach, optional */
    const char *qdev_id;  /* attach, with qmp */
    gint64 grace_ms;      /* revoke, -1: the daemon's default */
    const char *node;     /* the daemon's, from its greeting */
    const char *patterns; /* trace */
} Invocation;

typedef struct Command {
    const char *name;    /* ntbctl's */
    const char *execute; /* the daemon's */
    ArgKind arg;
    bool (*format)(GString *out, const Invocation *inv, JsonNode *ret, GError **error);
} Command;

static bool fmt_nodes(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_nodes(out, ret, error);
}

static bool fmt_list(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_devices(out, ret, error);
}

static bool fmt_show(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_device(out, ret, error);
}

static bool fmt_stats(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_stats(out, ret, error);
}

static bool fmt_borrow(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_borrow(out, inv->node, ret, error);
}

static bool fmt_return(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_return(out, inv->device, ret, error);
}

static bool fmt_revoke(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_revoke(out, inv->device, ret, error);
}

static bool fmt_attach(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_attach(out, inv->domain, ret, error);
}

static bool fmt_detach(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_detach(out, inv->device, ret, error);
}

static bool fmt_unplug(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    return vn_ctl_format_unplug(out, inv->device, ret, error);
}

static bool fmt_trace(GString *out, const Invocation *inv, JsonNode *ret, GError **error)
{
    JsonObject *o = JSON_NODE_HOLDS_OBJECT(ret) ? json_node_get_object(ret) : NULL;
    const char *events = o != NULL ? vn_util_json_string(o, "events") : NULL;

    if (events == NULL || !json_object_has_member(o, "on")) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL, "trace: an answer without events");
        return false;
    }
    g_string_append_printf(
        out, "%s: %" G_GINT64_FORMAT " trace events on%s%s; %" G_GINT64_FORMAT " workers told\n",
        inv->node, json_object_get_int_member(o, "on"), *events ? ": " : "", events,
        json_object_get_int_member_with_default(o, "workers", 0));
    return true;
}

static const Command commands[] = {
    { "nodes", "query-nodes", ARG_NONE, fmt_nodes },
    { "list", "query-devices", ARG_NONE, fmt_list },
    { "show", "query-device", ARG_DEV, fmt_show },
    { "borrow", "borrow", ARG_DEV, fmt_borrow },
    { "return", "return", ARG_DEV, fmt_return },
    { "revoke", "revoke", ARG_DEV, fmt_revoke },
    { "attach", "attach", ARG_DEV, fmt_attach },
    { "detach", "detach", ARG_DEV, fmt_detach },
    { "unplug", "unplug", ARG_DEV, fmt_unplug },
    { "stats", "query-stats", ARG_DEV_OPTIONAL, fmt_stats },
    { "trace", "trace", ARG_PATTERNS, fmt_trace },
};

#define SYNOPSIS "usage: ntbctl [--socket PATH] [--json] [--timeout-ms N] COMMAND [ARGS]\n"

static const char commands_text[] =
    "commands:\n"
    "  nodes                               fabric nodes and their links\n"
    "  list                                devices and who holds them\n"
    "  show DEV                            one device in detail\n"
    "  borrow DEV                          borrow DEV for this node\n"
    "  return DEV                          give back a device this node borrowed\n"
    "  revoke DEV [--grace-ms N]           take back a lent device (on its lender)\n"
    "  attach DEV --domain D [--alias A]   borrow DEV and hot-plug it into running libvirt\n"
    "                                      domain D (a free pcie-root-port); for a VM libvirt\n"
    "                                      does not run, serve DEV for it (prints the socket);\n"
    "                                      --qmp PATH --qdev-id ID: the VM's QMP socket and the\n"
    "                                      device's id there, for unplugging on revoke or loss\n"
    "  detach DEV [--domain D]             stop serving DEV (it stays borrowed); with --domain,\n"
    "                                      unplug it from libvirt domain D and return it\n"
    "  unplug DEV                          ask the VM to release DEV (device request; needs\n"
    "                                      the patched QEMU, qemu-patches/0003)\n"
    "  trace PATTERNS                      switch trace events in the daemon and its workers\n"
    "                                      (globs, comma-separated; -GLOB turns off)\n"
    "  stats [DEV]                         counters of this node's devices\n"
    "  reassign DEV --to [HOST:]DOMAIN     move DEV from the libvirt domain that holds it into\n"
    "                                      DOMAIN (on HOST: see --hosts), rolling back on failure\n"
    "                                      --config (also attach/detach --domain): the domains'\n"
    "                                      persistent definitions follow the move\n"
    "  xml DEV [--alias A] [--bus B]       libvirt domain XML that declares DEV (docs/libvirt.md)\n"
    "  xml --check FILE                    check a domain's vfio-ntb declarations\n"
    "DEV is host/name, e.g. hosta/nvme0.  Exit: 0 done, 1 refused, 2 usage, 3 unreachable.\n";

static int usage_error(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

/* Report a usage error; returns the exit code.  The command list only when
 * the command itself is what is wrong: otherwise it buries the message. */
static int usage_error(const char *fmt, ...)
{
    g_autofree char *msg = NULL;
    g_autofree char *clean = NULL;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    clean = vn_ctl_format_sanitize(msg);
    fprintf(stderr, "ntbctl: %s\n" SYNOPSIS, clean);
    if (g_str_has_prefix(msg, "no command") || g_str_has_prefix(msg, "unknown command")) {
        fputs(commands_text, stderr);
    } else {
        fputs("`ntbctl --help` lists the commands and options\n", stderr);
    }
    return EXIT_USAGE;
}

static int exit_code(const GError *error)
{
    if (error->domain == VN_VIRT_ERROR && error->code == VN_VIRT_ERROR_UNREACHABLE) {
        return EXIT_UNREACHABLE;
    }
    if (error->domain != VN_CTL_ERROR) {
        return EXIT_REFUSED;
    }
    switch (error->code) {
    case VN_CTL_ERROR_USAGE:
        return EXIT_USAGE;
    case VN_CTL_ERROR_UNREACHABLE:
    case VN_CTL_ERROR_TIMEOUT:
        return EXIT_UNREACHABLE;
    default:
        return EXIT_REFUSED;
    }
}

/* main() reports; the daemon's desc goes out verbatim (but sanitized: it is
 * a peer's text on the operator's terminal), with a hint where we have one. */
static int report(const GError *error)
{
    g_autofree char *clean = vn_ctl_format_sanitize(error->message);

    fprintf(stderr, "ntbctl: %s\n", clean);
    if (error->domain == VN_CTL_ERROR && error->code == VN_CTL_ERROR_UNREACHABLE) {
        fprintf(stderr,
                "ntbctl: is vfio-ntbd running?  Start it with `systemctl start "
                "vfio-ntbd`, or point --socket (or $%s) at its control-socket\n",
                VN_CTL_SOCKET_ENV);
    } else if (error->domain == VN_CTL_ERROR && error->code == VN_CTL_ERROR_TIMEOUT) {
        fprintf(stderr, "ntbctl: the daemon may be stuck (`systemctl status vfio-ntbd`); "
                        "--timeout-ms waits longer\n");
    }
    return exit_code(error);
}

static bool parse_ms(const char *opt, const char *text, gint64 min, gint64 *out)
{
    guint64 v = 0;

    /* g_ascii_string_to_unsigned refuses signs, blanks and trailing junk. */
    if (!g_ascii_string_to_unsigned(text, 10, (guint64)min, NTBCTL_MAX_WAIT_MS, &v, NULL)) {
        usage_error("%s wants milliseconds, %" G_GINT64_FORMAT "-%d, not \"%s\"", opt, min,
                    NTBCTL_MAX_WAIT_MS, text);
        return false;
    }
    *out = (gint64)v;
    return true;
}

static bool check_domain(const char *domain)
{
    if (!vn_name_valid(VN_NAME_DOMAIN, domain)) {
        usage_error("--domain wants the VM's name: %s", vn_name_rule(VN_NAME_DOMAIN));
        return false;
    }
    return true;
}

static bool check_qmp(const char *qmp)
{
    /* The daemon opens it, from its own working directory. */
    if (qmp[0] != '/' || strlen(qmp) > NTBCTL_MAX_QMP || !g_utf8_validate(qmp, -1, NULL)) {
        usage_error("--qmp wants the absolute path of the VM's QMP socket (at most %zu "
                    "bytes of UTF-8)",
                    NTBCTL_MAX_QMP);
        return false;
    }
    return true;
}

static JsonObject *build_arguments(const Command *cmd, const Invocation *inv)
{
    JsonObject *args = json_object_new();

    if (inv->device != NULL) {
        json_object_set_string_member(args, "device", inv->device);
    }
    if (inv->grace_ms >= 0) {
        json_object_set_int_member(args, "grace-ms", inv->grace_ms);
    }
    if (inv->domain != NULL) {
        json_object_set_string_member(args, "domain", inv->domain);
    }
    if (inv->qmp != NULL) {
        json_object_set_string_member(args, "qmp", inv->qmp);
        json_object_set_string_member(args, "qdev-id", inv->qdev_id);
    }
    if (inv->patterns != NULL) {
        json_object_set_string_member(args, "patterns", inv->patterns);
    }
    if (json_object_get_size(args) == 0) {
        json_object_unref(args);
        return NULL;
    }
    return args;
}

/* Connect, execute, print; returns the exit code. */
static int run(const Command *cmd, Invocation *inv, const char *socket_path, int timeout_ms,
               bool json)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnCtlClient) c = NULL;
    g_autoptr(JsonObject) args = build_arguments(cmd, inv);
    g_autoptr(JsonNode) ret = NULL;
    g_autoptr(GString) out = g_string_new(NULL);

    c = vn_ctl_client_connect(socket_path, timeout_ms, &error);
    if (c == NULL) {
        return report(error);
    }
    inv->node = vn_ctl_client_node(c);
    ret = vn_ctl_client_execute(c, cmd->execute, args, &error);
    if (ret == NULL) {
        return report(error);
    }
    if (json) {
        vn_ctl_format_json(out, ret);
    } else if (!cmd->format(out, inv, ret, &error)) {
        if (g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL)) {
            g_prefix_error(&error, "vfio-ntbd at %s: ", socket_path);
        }
        return report(error);
    }
    fputs(out->str, stdout);
    if (fflush(stdout) != 0) {
        return EXIT_REFUSED; /* stdout closed or full: the output is lost */
    }
    return EXIT_DONE;
}

int main(int argc, char **argv)
{
    g_autofree char *trace = NULL;
    g_autofree char *socket_path = NULL;
    g_autofree char *timeout_text = NULL;
    g_autofree char *grace_text = NULL;
    g_autofree char *domain = NULL;
    g_autofree char *qmp = NULL;
    g_autofree char *qdev_id = NULL;
    g_autofree char *alias = NULL;
    g_autofree char *bus = NULL;
    g_autofree char *check = NULL;
    g_autofree char *connect_uri = NULL;
    g_autofree char *hosts = NULL;
    g_autofree char *to = NULL;
    gboolean json = FALSE;
    gboolean version = FALSE;
    gboolean config = FALSE;
    const GOptionEntry entries[] = {
        { "socket", 0, 0, G_OPTION_ARG_FILENAME, &socket_path,
          "the daemon's control socket (default $" VN_CTL_SOCKET_ENV " or " VN_CTL_DEFAULT_SOCKET
          ")",
          "PATH" },
        { "json", 0, 0, G_OPTION_ARG_NONE, &json, "print the daemon's answer as JSON", NULL },
        { "timeout-ms", 0, 0, G_OPTION_ARG_STRING, &timeout_text,
          "how long to wait for the daemon (default 10000)", "N" },
        { "grace-ms", 0, 0, G_OPTION_ARG_STRING, &grace_text,
          "revoke: the borrower's time to let go (default: the daemon's, 5000)", "N" },
        { "domain", 0, 0, G_OPTION_ARG_STRING, &domain, "attach: the libvirt domain", "D" },
        { "qmp", 0, 0, G_OPTION_ARG_FILENAME, &qmp, "attach: the VM's QMP socket", "PATH" },
        { "qdev-id", 0, 0, G_OPTION_ARG_STRING, &qdev_id, "attach: the device's id in the VM",
          "ID" },
        { "alias", 0, 0, G_OPTION_ARG_STRING, &alias,
          "xml: the device's id in the domain (default ntb-HOST-NAME)", "A" },
        { "bus", 0, 0, G_OPTION_ARG_STRING, &bus, "xml: a spare pcie-root-port (pci.N)", "B" },
        { "check", 0, 0, G_OPTION_ARG_FILENAME, &check, "xml: check a domain's XML file", "FILE" },
        { "connect", 0, 0, G_OPTION_ARG_STRING, &connect_uri,
          "libvirt URI for attach, detach and reassign (default: libvirt's)", "URI" },
        { "hosts", 0, 0, G_OPTION_ARG_FILENAME, &hosts,
          "reassign: other hosts' control sockets and libvirt URIs (default $" NTBCTL_HOSTS_ENV
          " or " NTBCTL_DEFAULT_HOSTS ")",
          "FILE" },
        { "to", 0, 0, G_OPTION_ARG_STRING, &to, "reassign: [HOST:]DOMAIN", "TARGET" },
        { "config", 0, 0, G_OPTION_ARG_NONE, &config,
          "attach, detach --domain, reassign: the domains' persistent definitions follow", NULL },
        { "version", 0, 0, G_OPTION_ARG_NONE, &version, "print ntbctl's version", NULL },
        VN_TRACE_OPTION_ENTRY(trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) ctx = g_option_context_new("COMMAND [ARGS]");
    g_autoptr(GError) error = NULL;
    Invocation inv = { .grace_ms = -1 };
    const Command *cmd = NULL;
    gint64 timeout_ms = VN_CTL_DEFAULT_TIMEOUT_MS;

    /* stdout carries tables and --json only; any log line goes to stderr. */
    g_log_writer_default_set_use_stderr(TRUE);
    g_option_context_add_main_entries(ctx, entries, NULL);
    g_option_context_set_description(ctx, commands_text);
    if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
        return usage_error("%s", error->message);
    }
    if (!vn_trace_setup(trace, false, &error)) {
        return usage_error("%s", error->message);
    }
    if (version) {
        printf("ntbctl %s\n", VN_VERSION);
        return EXIT_DONE;
    }
    if (argc < 2) {
        return usage_error("no command given");
    }
    if ((bus != NULL || check != NULL) && strcmp(argv[1], "xml") != 0) {
        return usage_error("--bus and --check are for xml, not %s", argv[1]);
    }
    if (alias != NULL && strcmp(argv[1], "xml") != 0 && strcmp(argv[1], "attach") != 0) {
        return usage_error("--alias is for xml and attach, not %s", argv[1]);
    }
    if (alias != NULL && !vn_name_valid(VN_NAME_QDEV_ID, alias)) {
        return usage_error("--alias is a QEMU id: %s", vn_name_rule(VN_NAME_QDEV_ID));
    }
    if (socket_path == NULL) {
        socket_path = g_strdup(vn_ctl_default_socket());
    }
    if (*socket_path == '\0') {
        return usage_error("--socket wants a path");
    }
    if ((to != NULL || hosts != NULL) && strcmp(argv[1], "reassign") != 0) {
        return usage_error("--to and --hosts are for reassign, not %s", argv[1]);
    }
    if (config && strcmp(argv[1], "reassign") != 0 &&
        ((strcmp(argv[1], "attach") != 0 && strcmp(argv[1], "detach") != 0) || domain == NULL ||
         qmp != NULL)) {
        return usage_error("--config is for reassign, and attach or detach with --domain of a "
                           "libvirt domain");
    }
    if (strcmp(argv[1], "reassign") == 0) {
        if (argc != 3 || to == NULL || to[0] == '\0') {
            return usage_error("reassign DEV --to [HOST:]DOMAIN");
        }
        if (!vn_ctl_device_valid(argv[2], &error)) {
            return usage_error("reassign: %s", error->message);
        }
        {
            /* HOST follows the host part of device names; DOMAIN, --domain's rules. */
            const char *colon = strchr(to, ':');
            g_autofree char *as_dev =
                colon ? g_strdup_printf("%.*s/x", (int)(colon - to), to) : NULL;

            if ((as_dev != NULL && !vn_ctl_device_valid(as_dev, NULL)) ||
                !vn_name_valid(VN_NAME_DOMAIN, colon ? colon + 1 : to)) {
                return usage_error("reassign: --to HOST:DOMAIN, HOST a node name, DOMAIN %s",
                                   vn_name_rule(VN_NAME_DOMAIN));
            }
        }
        if (timeout_text != NULL && !parse_ms("--timeout-ms", timeout_text, 1, &timeout_ms)) {
            return EXIT_USAGE;
        }
        if (hosts == NULL) {
            hosts = g_strdup(g_getenv(NTBCTL_HOSTS_ENV) ? g_getenv(NTBCTL_HOSTS_ENV)
                                                        : NTBCTL_DEFAULT_HOSTS);
        }
        return ntbctl_reassign(argv[2], to, hosts, connect_uri, config, socket_path,
                               (int)timeout_ms, &error)
                   ? EXIT_DONE
                   : report(error);
    }
    if (strcmp(argv[1], "xml") == 0) {
        if (check != NULL) {
            return argc == 2 && alias == NULL && bus == NULL
                       ? ntbctl_xml_check(check)
                       : usage_error("xml --check FILE takes nothing else");
        }
        if (argc != 3) {
            return usage_error("xml: which device? (ntbctl xml host/name [--alias A])");
        }
        if (!vn_ctl_device_valid(argv[2], &error)) {
            return usage_error("xml: %s", error->message);
        }
        if ((alias != NULL && !vn_name_valid(VN_NAME_QDEV_ID, alias)) ||
            (bus != NULL && !vn_name_valid(VN_NAME_QDEV_ID, bus))) {
            return usage_error("xml: --alias and --bus are QEMU ids: %s",
                               vn_name_rule(VN_NAME_QDEV_ID));
        }
        if ((timeout_text != NULL && !parse_ms("--timeout-ms", timeout_text, 1, &timeout_ms))) {
            return EXIT_USAGE;
        }
        return ntbctl_xml_print(argv[2], alias, bus, socket_path, (int)timeout_ms, &error)
                   ? EXIT_DONE
                   : report(error);
    }
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++) {
        if (strcmp(argv[1], commands[i].name) == 0) {
            cmd = &commands[i];
        }
    }
    if (cmd == NULL) {
        return usage_error("unknown command \"%s\"", argv[1]);
    }
    if (argc > 3 || (argc == 3 && cmd->arg == ARG_NONE)) {
        return usage_error("%s: unexpected argument \"%s\"", cmd->name,
                           argv[cmd->arg == ARG_NONE ? 2 : 3]);
    }
    if (argc == 2 && cmd->arg == ARG_DEV) {
        return usage_error("%s: which device? (host/name, e.g. hosta/nvme0)", cmd->name);
    }
    if (cmd->arg == ARG_PATTERNS) {
        if (argc != 3) {
            return usage_error("trace: which events? (globs, e.g. 'lender_*,borrower_*')");
        }
        inv.patterns = argv[2];
    } else if (argc == 3) {
        if (!vn_ctl_device_valid(argv[2], &error)) {
            return usage_error("%s: %s", cmd->name, error->message);
        }
        inv.device = argv[2];
    }
    if (grace_text != NULL && strcmp(cmd->name, "revoke") != 0) {
        return usage_error("--grace-ms is for revoke, not %s", cmd->name);
    }
    if ((qmp != NULL || qdev_id != NULL) && strcmp(cmd->name, "attach") != 0) {
        return usage_error("--qmp is for attach, not %s", cmd->name);
    }
    if (domain != NULL && strcmp(cmd->name, "attach") != 0 && strcmp(cmd->name, "detach") != 0) {
        return usage_error("--domain is for attach and detach, not %s", cmd->name);
    }
    if (connect_uri != NULL && strcmp(cmd->name, "attach") != 0 &&
        strcmp(cmd->name, "detach") != 0) {
        return usage_error("--connect is for attach, detach and reassign, not %s", cmd->name);
    }
    if (strcmp(cmd->name, "attach") == 0) {
        if (domain == NULL) {
            return usage_error("attach: which VM? (--domain D)");
        }
        if (!check_domain(domain) || (qmp != NULL && !check_qmp(qmp))) {
            return EXIT_USAGE;
        }
        if ((qmp != NULL) != (qdev_id != NULL) ||
            (qdev_id != NULL && !vn_name_valid(VN_NAME_QDEV_ID, qdev_id))) {
            return usage_error("--qmp and --qdev-id go together (the device's id: %s)",
                               vn_name_rule(VN_NAME_QDEV_ID));
        }
        inv.domain = domain;
        inv.qmp = qmp;
        inv.qdev_id = qdev_id;
    }
    if ((grace_text != NULL && !parse_ms("--grace-ms", grace_text, 0, &inv.grace_ms)) ||
        (timeout_text != NULL && !parse_ms("--timeout-ms", timeout_text, 1, &timeout_ms))) {
        return EXIT_USAGE;
    }
    if (inv.grace_ms > NTBCTL_MAX_GRACE_MS) {
        return usage_error("--grace-ms is at most %d", NTBCTL_MAX_GRACE_MS);
    }
    /* A domain libvirt runs gets the device hot-plugged; any other VM is served only. */
    if (strcmp(cmd->name, "attach") == 0 && qmp == NULL) {
        int r = ntbctl_virt_attach(inv.device, domain, alias, connect_uri, config, socket_path,
                                   (int)timeout_ms, &error);

        if (r == NTBCTL_VIRT_DONE) {
            return EXIT_DONE;
        }
        if (r == NTBCTL_VIRT_FAILED) {
            return report(error);
        }
        if (config) {
            return usage_error("--config: libvirt runs no domain %s here", domain);
        }
    }
    if (strcmp(cmd->name, "detach") == 0 && domain != NULL) {
        if (!check_domain(domain)) {
            return EXIT_USAGE;
        }
        return ntbctl_virt_detach(inv.device, domain, connect_uri, config, socket_path,
                                  (int)timeout_ms, &error)
                   ? EXIT_DONE
                   : report(error);
    }
    return run(cmd, &inv, socket_path, (int)timeout_ms, json);
}
