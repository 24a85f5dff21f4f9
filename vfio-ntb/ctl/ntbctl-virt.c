/*
 * ntbctl's libvirt commands: xml (print or check a domain's declarations),
 * and attach / detach / reassign for running libvirt domains (hotplug.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ntbctl-virt.h"
#include "common/json.h"
#include "common/name.h"
#include "common/util.h"

#include "client/ctl-client.h"
#include "ctl/format.h"
#include "libvirt/domxml.h"
#include "libvirt/hotplug.h"
#include "libvirt/virt.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

JsonNode *ntbctl_xml_check(const char *path, GString *text, GError **error)
{
    g_autoptr(GByteArray) xml = NULL;
    g_autoptr(VnDomain) dom = NULL;
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autofree char *shown = vn_ctl_format_sanitize(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        int err = errno;

        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_GENERIC, "%s: %s", shown, g_strerror(err));
        return NULL;
    }
    /* Bounded: --check /dev/zero is refused by the size limit, not by memory. */
    xml = vn_domxml_read_fd(fd, error);
    close(fd);
    dom = xml != NULL ? vn_domxml_parse((const char *)xml->data, xml->len, error) : NULL;
    if (dom == NULL) {
        g_prefix_error(error, "%s: ", shown);
        return NULL;
    }
    g_string_append_printf(text, "%s: domain %s declares %u vfio-ntb device%s\n", shown, dom->name,
                           dom->devices->len, dom->devices->len == 1 ? "" : "s");
    json_builder_begin_object(b);
    vn_json_add_string_or_null(b, "file", path);
    vn_json_add_string_or_null(b, "domain", dom->name);
    json_builder_set_member_name(b, "devices");
    json_builder_begin_array(b);
    for (guint i = 0; i < dom->devices->len; i++) {
        const VnDomDevice *d = dom->devices->pdata[i];
        /* name, alias and bus are checked words; the socket path is any text */
        g_autofree char *sock = vn_ctl_format_sanitize(d->socket);

        g_string_append_printf(text, "  %s as %s on %s%s%s\n", d->device, d->alias, sock,
                               d->bus ? ", bus " : "", d->bus ? d->bus : "");
        json_builder_begin_object(b);
        vn_json_add_string_or_null(b, "device", d->device);
        vn_json_add_string_or_null(b, "alias", d->alias);
        vn_json_add_string_or_null(b, "socket", d->socket);
        vn_json_add_string_or_null(b, "bus", d->bus);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    return json_builder_get_root(b);
}

/* ntbctl xml DEV: the socket goes in the daemon's run-dir, named after the
 * device (one host borrows a device once, so the name is unique there).  The
 * device must exist: XML for a typo would fail only when the VM starts. */
char *ntbctl_xml_print(const char *device, const char *alias, const char *bus,
                       const char *socket_path, int timeout_ms, GError **error)
{
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(socket_path, timeout_ms, error);
    g_autoptr(JsonNode) ver = c ? vn_ctl_client_execute(c, "query-version", NULL, error) : NULL;
    g_autoptr(JsonObject) args = json_object_new();
    g_autoptr(JsonNode) known = NULL;
    g_autofree char *file = g_strdelimit(g_strdup(device), "/", '-');
    g_autofree char *dflt = vn_domxml_default_alias(device);
    g_autofree char *sock = NULL;
    JsonObject *vo;
    const char *run_dir;

    if (ver == NULL) {
        return NULL;
    }
    json_object_set_string_member(args, "device", device);
    known = vn_ctl_client_execute(c, "query-device", args, error);
    if (known == NULL) {
        return NULL;
    }
    vo = JSON_NODE_HOLDS_OBJECT(ver) ? json_node_get_object(ver) : NULL;
    run_dir = vn_util_json_string(vo, "run_dir");
    if (run_dir == NULL || run_dir[0] != '/') {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL,
                    "the daemon did not say where its sockets go (an old vfio-ntbd?)");
        return NULL;
    }
    sock = g_strdup_printf("%s/%s.sock", run_dir, file);
    if (strlen(sock) > VN_DOMXML_MAX_SOCKET) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_GENERIC, "%s is too long for a socket path",
                    sock);
        return NULL;
    }
    if (alias == NULL && !vn_name_valid(VN_NAME_QDEV_ID, dflt)) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                    "%s is too long to be the device's id: give one with --alias", dflt);
        return NULL;
    }
    return vn_domxml_snippets(device, alias ? alias : dflt, sock, bus);
}

/* The node name of the daemon at @socket_path (its greeting says it). */
static char *local_node(const char *socket_path, int timeout_ms, GError **error)
{
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(socket_path, timeout_ms, error);

    return c ? g_strdup(vn_ctl_client_node(c)) : NULL;
}

bool ntbctl_virt_attach(const char *device, const char *domain, const char *alias, const char *uri,
                        bool config, const char *socket_path, int timeout_ms, FILE *out,
                        GError **error)
{
    g_autoptr(GError) probe = NULL;
    g_autoptr(VnVirt) v = vn_virt_open(uri, &probe);
    g_autofree char *node = NULL;
    VnHotplugHost h = { NULL, socket_path, uri };

    /* Nothing is borrowed until libvirt confirms the domain runs: a typo in
     * its name must not leave a device served for no VM. */
    if (v == NULL) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_LIBVIRT,
                    "attach %s --domain %s: cannot reach libvirt (%s); nothing changed. For a VM "
                    "libvirt does not run, --serve-only serves the device on a socket",
                    device, domain, probe->message);
        return false;
    }
    if (!vn_virt_domain_running(v, domain, &probe)) {
        g_set_error(error, VN_CTL_ERROR,
                    g_error_matches(probe, VN_VIRT_ERROR, VN_VIRT_ERROR_NO_DOMAIN)
                        ? VN_CTL_ERROR_DOMAIN_NOT_FOUND
                        : VN_CTL_ERROR_LIBVIRT,
                    "attach %s --domain %s: %s; nothing changed. For a VM libvirt does not run, "
                    "--serve-only serves the device on a socket",
                    device, domain, probe->message);
        return false;
    }
    g_clear_pointer(&v, vn_virt_close);
    node = local_node(socket_path, timeout_ms, error);
    if (node == NULL) {
        return false;
    }
    h.node = node;
    return vn_hotplug_attach(&h, device, domain, alias, config, out, error);
}

bool ntbctl_virt_detach(const char *device, const char *domain, const char *uri, bool config,
                        const char *socket_path, int timeout_ms, FILE *out, GError **error)
{
    g_autofree char *node = local_node(socket_path, timeout_ms, error);
    VnHotplugHost h = { node, socket_path, uri };

    return node != NULL && vn_hotplug_detach(&h, device, domain, config, out, error);
}

bool ntbctl_reassign(const char *device, const char *to, const char *hosts_file, const char *uri,
                     bool config, const char *socket_path, int timeout_ms, FILE *out,
                     GError **error)
{
    g_autoptr(GHashTable) hosts = NULL;
    g_autofree char *node = local_node(socket_path, timeout_ms, error);
    g_autofree char *host = NULL;
    const char *colon = strchr(to, ':');
    const char *domain = colon ? colon + 1 : to;
    VnHotplugHost local = { node, socket_path, uri };
    const VnHotplugHost *target = &local;

    if (node == NULL) {
        return false;
    }
    if (hosts_file != NULL && g_file_test(hosts_file, G_FILE_TEST_EXISTS)) {
        hosts = vn_hotplug_hosts_load(hosts_file, error);
        if (hosts == NULL) {
            return false;
        }
    }
    host = colon ? g_strndup(to, (gsize)(colon - to)) : g_strdup(node);
    if (strcmp(host, node) != 0) {
        target = hosts ? g_hash_table_lookup(hosts, host) : NULL;
        if (target == NULL) {
            g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                        "--to %s: host %s is not in the hosts file (%s)", to, host,
                        hosts_file ? hosts_file : "none");
            return false;
        }
    }
    return vn_hotplug_reassign(hosts, target, device, domain, config, out, error);
}
