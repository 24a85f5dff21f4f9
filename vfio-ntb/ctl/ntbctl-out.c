/*
 * ntbctl's answers: the --json envelope (docs/control.md "ntbctl --json"),
 * error reports and the exit code of each error class.
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ntbctl.h"

#include "config.h"
#include "client/ctl-client.h"
#include "ctl/format.h"
#include "libvirt/virt.h"

#include <stdio.h>

#define SYNOPSIS "usage: ntbctl [--socket PATH] [--json] [--timeout-ms N] COMMAND [ARGS]\n"

const char *ntbctl_error_class(const GError *error)
{
    if (error->domain == VN_VIRT_ERROR) {
        return error->code == VN_VIRT_ERROR_NO_DOMAIN ? "DomainNotFound" : "LibvirtError";
    }
    if (error->domain == VN_CTL_ERROR) {
        return vn_ctl_error_to_string((VnCtlError)error->code);
    }
    return "GenericError";
}

int ntbctl_exit_code(const GError *error)
{
    if (error->domain == VN_VIRT_ERROR) {
        return error->code == VN_VIRT_ERROR_NO_DOMAIN ? NTBCTL_EXIT_NO_DOMAIN : NTBCTL_EXIT_LIBVIRT;
    }
    if (error->domain != VN_CTL_ERROR) {
        return NTBCTL_EXIT_REFUSED;
    }
    switch ((VnCtlError)error->code) {
    case VN_CTL_ERROR_USAGE:
    case VN_CTL_ERROR_INVALID_PARAMETER:
    case VN_CTL_ERROR_COMMAND_NOT_FOUND:
        return NTBCTL_EXIT_USAGE;
    case VN_CTL_ERROR_UNREACHABLE:
    case VN_CTL_ERROR_TIMEOUT:
        return NTBCTL_EXIT_UNREACHABLE;
    case VN_CTL_ERROR_DEVICE_NOT_FOUND:
        return NTBCTL_EXIT_NO_DEVICE;
    case VN_CTL_ERROR_ACCESS_DENIED:
        return NTBCTL_EXIT_DENIED;
    case VN_CTL_ERROR_DEVICE_BUSY:
        return NTBCTL_EXIT_BUSY;
    case VN_CTL_ERROR_NOT_BORROWED:
        return NTBCTL_EXIT_NOT_BORROWED;
    case VN_CTL_ERROR_NODE_UNREACHABLE:
        return NTBCTL_EXIT_NODE_DOWN;
    case VN_CTL_ERROR_DOMAIN_NOT_FOUND:
        return NTBCTL_EXIT_NO_DOMAIN;
    case VN_CTL_ERROR_LIBVIRT:
        return NTBCTL_EXIT_LIBVIRT;
    default:
        return NTBCTL_EXIT_REFUSED;
    }
}

bool ntbctl_print_json(JsonNode *root, bool pretty)
{
    g_autoptr(GString) text = g_string_new(NULL);

    vn_ctl_format_json(text, root, pretty);
    fputs(text->str, stdout);
    return fflush(stdout) == 0;
}

static void begin_envelope(JsonBuilder *b, const Ntbctl *n)
{
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "schema");
    json_builder_add_int_value(b, NTBCTL_JSON_SCHEMA);
    json_builder_set_member_name(b, "command");
    if (n->command != NULL) {
        json_builder_add_string_value(b, n->command);
    } else {
        json_builder_add_null_value(b);
    }
}

int ntbctl_fail(const Ntbctl *n, const GError *error)
{
    g_autofree char *clean = vn_ctl_format_sanitize(error->message);

    if (n->json) {
        g_autoptr(JsonBuilder) b = json_builder_new();
        g_autoptr(JsonNode) root = NULL;

        begin_envelope(b, n);
        json_builder_set_member_name(b, "error");
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "class");
        json_builder_add_string_value(b, ntbctl_error_class(error));
        json_builder_set_member_name(b, "desc");
        json_builder_add_string_value(b, clean);
        json_builder_end_object(b);
        json_builder_end_object(b);
        root = json_builder_get_root(b);
        (void)ntbctl_print_json(root, !n->json_lines);
    }
    fprintf(stderr, "ntbctl: %s\n", clean);
    if (g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE)) {
        fprintf(stderr,
                "ntbctl: is vfio-ntbd running?  Start it with `systemctl start "
                "vfio-ntbd`, or point --socket (or $%s) at its control-socket\n",
                VN_CTL_SOCKET_ENV);
    } else if (g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_TIMEOUT)) {
        fprintf(stderr, "ntbctl: the daemon may be stuck (`systemctl status vfio-ntbd`); "
                        "--timeout-ms waits longer\n");
    } else if (g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE)) {
        fputs(SYNOPSIS, stderr);
        if (n->command != NULL) {
            fprintf(stderr, "`ntbctl help %s` shows its options and an example\n", n->command);
        } else {
            fputs("`ntbctl help` lists the commands\n", stderr);
        }
    }
    return ntbctl_exit_code(error);
}

int ntbctl_usage(const Ntbctl *n, const char *fmt, ...)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *msg = NULL;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error_literal(&error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE, msg);
    return ntbctl_fail(n, error);
}

int ntbctl_done(const Ntbctl *n, JsonNode *ret, bool changed, const char *text)
{
    if (n->json) {
        g_autoptr(JsonBuilder) b = json_builder_new();
        g_autoptr(JsonNode) root = NULL;

        begin_envelope(b, n);
        json_builder_set_member_name(b, "changed");
        json_builder_add_boolean_value(b, changed);
        json_builder_set_member_name(b, "return");
        if (ret != NULL) {
            json_builder_add_value(b, json_node_copy(ret));
        } else {
            json_builder_begin_object(b);
            json_builder_end_object(b);
        }
        json_builder_end_object(b);
        root = json_builder_get_root(b);
        return ntbctl_print_json(root, true) ? NTBCTL_EXIT_DONE : NTBCTL_EXIT_REFUSED;
    }
    if (text != NULL) {
        fputs(text, stdout);
    }
    /* stdout closed or full: the output is lost, so this is no success. */
    return fflush(stdout) == 0 ? NTBCTL_EXIT_DONE : NTBCTL_EXIT_REFUSED;
}

/* ---- version -------------------------------------------------------------- */

int ntbctl_version(const Ntbctl *n)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(n->socket_path, n->timeout_ms, &error);
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) ret = NULL;
    g_autofree char *text = NULL;

    if (c == NULL) {
        /* Ours is still worth printing: it is what the operator installed. */
        if (!n->json) {
            printf("ntbctl %s\n", VN_VERSION);
        }
        return ntbctl_fail(n, error);
    }
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "ntbctl");
    json_builder_add_string_value(b, VN_VERSION);
    json_builder_set_member_name(b, "vfio_ntbd");
    json_builder_add_string_value(b, vn_ctl_client_version(c));
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, vn_ctl_client_node(c));
    json_builder_end_object(b);
    ret = json_builder_get_root(b);
    {
        g_autofree char *ver = vn_ctl_format_sanitize(vn_ctl_client_version(c));

        text = g_strdup_printf("ntbctl %s\nvfio-ntbd %s (node %s, %s)\n", VN_VERSION, ver,
                               vn_ctl_client_node(c), n->socket_path);
    }
    return ntbctl_done(n, ret, false, text);
}
