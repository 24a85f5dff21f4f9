/*
 * ntbctl's libvirt commands: xml (print or check a domain's declarations),
 * and attach / detach / reassign for running libvirt domains (hotplug.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ntbctl-virt.h"
#include "common/name.h"
#include "common/util.h"

#include "ctl/ctl-client.h"
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

/* ntbctl xml --check FILE: exit 0 and a summary, or 1 and what is wrong. */
int ntbctl_xml_check(const char *path)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GByteArray) text = NULL;
    g_autoptr(VnDomain) dom = NULL;
    g_autofree char *shown = vn_ctl_format_sanitize(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        fprintf(stderr, "ntbctl: %s: %s\n", shown, g_strerror(errno));
        return 1;
    }
    /* Bounded: --check /dev/zero is refused by the size limit, not by memory. */
    text = vn_domxml_read_fd(fd, &error);
    close(fd);
    dom = text != NULL ? vn_domxml_parse((const char *)text->data, text->len, &error) : NULL;
    if (dom == NULL) {
        g_autofree char *msg = vn_ctl_format_sanitize(error->message);

        fprintf(stderr, "ntbctl: %s: %s\n", shown, msg);
        return 1;
    }
    printf("%s: domain %s declares %u vfio-ntb device%s\n", shown, dom->name, dom->devices->len,
           dom->devices->len == 1 ? "" : "s");
    for (guint i = 0; i < dom->devices->len; i++) {
        const VnDomDevice *d = dom->devices->pdata[i];
        /* name, alias and bus are checked words; the socket path is any text */
        g_autofree char *sock = vn_ctl_format_sanitize(d->socket);

        printf("  %s as %s on %s%s%s\n", d->device, d->alias, sock, d->bus ? ", bus " : "",
               d->bus ? d->bus : "");
    }
    return 0;
}

/* ntbctl xml DEV: the socket goes in the daemon's run-dir, named after the
 * device (one host borrows a device once, so the name is unique there). */
bool ntbctl_xml_print(const char *device, const char *alias, const char *bus,
                      const char *socket_path, int timeout_ms, GError **error)
{
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(socket_path, timeout_ms, error);
    g_autoptr(JsonNode) ver = c ? vn_ctl_client_execute(c, "query-version", NULL, error) : NULL;
    g_autofree char *file = g_strdelimit(g_strdup(device), "/", '-');
    g_autofree char *dflt = vn_domxml_default_alias(device);
    g_autofree char *sock = NULL, *text = NULL;
    const char *run_dir;

    if (ver == NULL) {
        return false;
    }
    run_dir = vn_util_json_string(JSON_NODE_HOLDS_OBJECT(ver) ? json_node_get_object(ver) : NULL,
                                  "run-dir");
    if (run_dir == NULL || run_dir[0] != '/') {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "the daemon did not say where its sockets go (an old vfio-ntbd?)");
        return false;
    }
    sock = g_strdup_printf("%s/%s.sock", run_dir, file);
    if (strlen(sock) > VN_DOMXML_MAX_SOCKET) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "%s is too long for a socket path", sock);
        return false;
    }
    if (alias == NULL && !vn_name_valid(VN_NAME_QDEV_ID, dflt)) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                    "%s is too long to be the device's id: give one with --alias", dflt);
        return false;
    }
    text = vn_domxml_snippets(device, alias ? alias : dflt, sock, bus);
    fputs(text, stdout);
    return true;
}

/* The node name of the daemon at @socket_path (its greeting says it). */
static char *local_node(const char *socket_path, int timeout_ms, GError **error)
{
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(socket_path, timeout_ms, error);

    return c ? g_strdup(vn_ctl_client_node(c)) : NULL;
}

int ntbctl_virt_attach(const char *device, const char *domain, const char *alias, const char *uri,
                       bool config, const char *socket_path, int timeout_ms, GError **error)
{
    g_autoptr(GError) probe = NULL;
    g_autoptr(VnVirt) v = vn_virt_open(uri, &probe);
    g_autofree char *node = NULL;
    VnHotplugHost h = { NULL, socket_path, uri };

    /* A libvirt named with --connect must answer: a typo must not turn a
     * hot-plug into only serving the device. */
    if (v == NULL && uri != NULL) {
        g_propagate_error(error, g_steal_pointer(&probe));
        return NTBCTL_VIRT_FAILED;
    }
    /* A VM libvirt does not run (or no libvirt here): the daemon only serves it. */
    if (v == NULL || (!vn_virt_domain_running(v, domain, &probe) &&
                      g_error_matches(probe, VN_VIRT_ERROR, VN_VIRT_ERROR_NO_DOMAIN))) {
        return NTBCTL_VIRT_NOT_LIBVIRT;
    }
    g_clear_pointer(&v, vn_virt_close);
    node = local_node(socket_path, timeout_ms, error);
    if (node == NULL) {
        return NTBCTL_VIRT_FAILED;
    }
    h.node = node;
    return vn_hotplug_attach(&h, device, domain, alias, config, stdout, error) ? NTBCTL_VIRT_DONE
                                                                               : NTBCTL_VIRT_FAILED;
}

bool ntbctl_virt_detach(const char *device, const char *domain, const char *uri, bool config,
                        const char *socket_path, int timeout_ms, GError **error)
{
    g_autofree char *node = local_node(socket_path, timeout_ms, error);
    VnHotplugHost h = { node, socket_path, uri };

    return node != NULL && vn_hotplug_detach(&h, device, domain, config, stdout, error);
}

bool ntbctl_reassign(const char *device, const char *to, const char *hosts_file, const char *uri,
                     bool config, const char *socket_path, int timeout_ms, GError **error)
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
    return vn_hotplug_reassign(hosts, target, device, domain, config, stdout, error);
}
