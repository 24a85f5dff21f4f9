/*
 * vfio-ntb-libvirt-hook: libvirt's qemu hook for domains that borrow devices,
 * installed as the drop-in /etc/libvirt/hooks/qemu.d/vfio-ntb.
 *
 *   vfio-ntb NAME OP SUBOP EXTRA   < the domain's XML
 *
 *   prepare begin    borrow and attach every device the domain declares
 *                    (domxml.h), each on the socket its <qemu:commandline>
 *                    names, so the sockets exist before QEMU starts.  A
 *                    refusal undoes what this run did and fails the start
 *                    (exit 1) with a message libvirt shows the user.
 *   release end      return every declared device, and every device the
 *                    daemon served to this domain (hot-plugged ones are in
 *                    no XML), whatever the reason the domain stopped (a
 *                    return detaches first).
 *                    Failures are logged; the exit status is 0.
 *   migrate begin    refused: QEMU cannot migrate vfio-user devices.
 *   reconnect begin  (libvirtd restarted) attach again, which is a no-op for
 *                    a device the daemon still serves to this domain, so the
 *                    daemon and the domain agree on who holds what.
 *   anything else    nothing.
 *
 * Domains that declare no device are left alone without contacting the
 * daemon.  The hook talks only to vfio-ntbd's control socket
 * ($VFIO_NTB_CONTROL, else /run/vfio-ntb/control.sock) and never to libvirt:
 * libvirt waits for its hooks, so calling back would deadlock.  Output goes
 * to stderr, which libvirt logs and, for a failed start, reports.
 */
#define G_LOG_DOMAIN "vfio-ntb.libvirt"

#include "client/ctl-client.h"
#include "common/util.h"
#include "libvirt/domxml.h"
#include "common/trace.h"

#include <errno.h>
#include <gio/gio.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define HOOK "vfio-ntb hook"
/* Devices looked at in query-devices: a cluster lends a few hundred at most. */
#define VN_HOOK_MAX_DEVICES 4096u

/* Read all of stdin, at most VN_DOMXML_MAX_BYTES + 1 (so domxml sees "too big"). */
static JsonObject *device_args(const VnDomDevice *dev)
{
    JsonObject *a = json_object_new();

    json_object_set_string_member(a, "device", dev->device);
    return a;
}

static bool attach(VnCtlClient *c, const VnDomain *dom, const VnDomDevice *dev, GError **error)
{
    g_autoptr(JsonObject) a = device_args(dev);
    g_autoptr(JsonNode) ret = NULL;

    json_object_set_string_member(a, "domain", dom->name);
    json_object_set_string_member(a, "socket", dev->socket);
    json_object_set_string_member(a, "qdev-id", dev->alias);
    if (dev->irq_mode != NULL) {
        json_object_set_string_member(a, "irq-mode", dev->irq_mode);
    }
    if (dev->p2p) {
        json_object_set_boolean_member(a, "p2p", TRUE);
    }
    ret = vn_ctl_client_execute(c, "attach", a, error);
    return ret != NULL;
}

/* Give @dev back; a device this node does not hold is not an error here. */
static bool give_back(VnCtlClient *c, const VnDomDevice *dev, GError **error)
{
    g_autoptr(JsonObject) a = device_args(dev);
    g_autoptr(JsonNode) ret = vn_ctl_client_execute(c, "return", a, error);

    if (ret == NULL && g_error_matches(*error, VN_CTL_ERROR, VN_CTL_ERROR_NOT_BORROWED)) {
        g_clear_error(error);
        return true;
    }
    return ret != NULL;
}

static int prepare(VnCtlClient *c, const VnDomain *dom)
{
    for (guint i = 0; i < dom->devices->len; i++) {
        const VnDomDevice *dev = dom->devices->pdata[i];
        g_autoptr(GError) error = NULL;

        if (attach(c, dom, dev, &error)) {
            fprintf(stderr, HOOK ": domain %s: %s attached on %s\n", dom->name, dev->device,
                    dev->socket);
            continue;
        }
        fprintf(stderr, HOOK ": domain %s cannot start: %s (%s): %s\n", dom->name, dev->device,
                dev->alias, error->message);
        /* Leave nothing half-done: what this run borrowed goes back. */
        for (guint j = 0; j < i; j++) {
            g_autoptr(GError) e2 = NULL;

            if (!give_back(c, dom->devices->pdata[j], &e2)) {
                fprintf(stderr, HOOK ": domain %s: returning %s: %s\n", dom->name,
                        ((VnDomDevice *)dom->devices->pdata[j])->device, e2->message);
            }
        }
        return 1;
    }
    return 0;
}

/*
 * The devices this node serves to domain @name, declared or not: `ntbctl
 * attach` and `reassign` hot-plug devices the XML does not list.
 */
static GPtrArray *served_to(VnCtlClient *c, const char *name, GError **error)
{
    g_autoptr(JsonNode) all = vn_ctl_client_execute(c, "query-devices", NULL, error);
    g_autoptr(GPtrArray) out = g_ptr_array_new_with_free_func(g_free);
    JsonArray *arr = all && JSON_NODE_HOLDS_ARRAY(all) ? json_node_get_array(all) : NULL;

    if (arr == NULL) {
        return all == NULL ? NULL : g_steal_pointer(&out);
    }
    for (guint i = 0; i < json_array_get_length(arr) && i < VN_HOOK_MAX_DEVICES; i++) {
        JsonNode *e = json_array_get_element(arr, i);
        JsonObject *o = JSON_NODE_HOLDS_OBJECT(e) ? json_node_get_object(e) : NULL;
        const char *dev = vn_util_json_string(o, "device");
        const char *by = vn_util_json_string(o, "borrower");
        g_autoptr(JsonObject) a = NULL;
        g_autoptr(JsonNode) one = NULL;
        const char *to;

        if (dev == NULL || by == NULL || strcmp(by, vn_ctl_client_node(c)) != 0) {
            continue;
        }
        a = json_object_new();
        json_object_set_string_member(a, "device", dev);
        one = vn_ctl_client_execute(c, "query-device", a, NULL);
        to = vn_util_json_string(
            one && JSON_NODE_HOLDS_OBJECT(one) ? json_node_get_object(one) : NULL, "attached_to");
        if (to != NULL && strcmp(to, name) == 0) {
            g_ptr_array_add(out, g_strdup(dev));
        }
    }
    return g_steal_pointer(&out);
}

static int release(VnCtlClient *c, const char *name, const VnDomain *dom)
{
    g_autoptr(GError) qerr = NULL;
    g_autoptr(GPtrArray) hot = served_to(c, name, &qerr);
    g_autoptr(GPtrArray) all = g_ptr_array_new();

    for (guint i = 0; i < dom->devices->len; i++) {
        g_ptr_array_add(all, ((VnDomDevice *)dom->devices->pdata[i])->device);
    }
    for (guint i = 0; hot != NULL && i < hot->len; i++) {
        if (vn_domain_find(dom, hot->pdata[i]) == NULL) {
            g_ptr_array_add(all, hot->pdata[i]);
        }
    }
    if (hot == NULL) {
        fprintf(stderr, HOOK ": domain %s: which devices it was served: %s\n", name, qerr->message);
    }
    for (guint i = 0; i < all->len; i++) {
        VnDomDevice dev = { .device = all->pdata[i] };
        g_autoptr(GError) error = NULL;

        if (give_back(c, &dev, &error)) {
            fprintf(stderr, HOOK ": domain %s: %s returned\n", name, dev.device);
        } else {
            fprintf(stderr, HOOK ": domain %s: returning %s failed: %s\n", name, dev.device,
                    error->message);
        }
    }
    return 0;
}

static int reconnect(VnCtlClient *c, const VnDomain *dom)
{
    for (guint i = 0; i < dom->devices->len; i++) {
        const VnDomDevice *dev = dom->devices->pdata[i];
        g_autoptr(GError) error = NULL;

        if (!attach(c, dom, dev, &error)) {
            fprintf(stderr, HOOK ": domain %s: %s is not served to it any more: %s\n", dom->name,
                    dev->device, error->message);
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GByteArray) xml = NULL;
    g_autoptr(VnDomain) dom = NULL;
    g_autoptr(VnCtlClient) c = NULL;
    const char *name, *op, *subop;
    bool starting;

    if (argc != 5) {
        fprintf(stderr, HOOK ": expected NAME OP SUBOP EXTRA from libvirt, got %d argument%s\n",
                argc - 1, argc == 2 ? "" : "s");
        return 1;
    }
    /* libvirt runs hooks with fixed arguments: tracing comes from VN_TRACE only. */
    if (!vn_trace_setup(NULL, false, &error)) {
        fprintf(stderr, HOOK ": %s\n", error->message);
        return 1;
    }
    name = argv[1];
    op = argv[2];
    subop = argv[3];
    starting = strcmp(op, "prepare") == 0 && strcmp(subop, "begin") == 0;
    /* Read the XML even for events we ignore: libvirt writes all of it, and a
     * large domain's XML does not fit in a pipe we never read. */
    xml = vn_domxml_read_fd(STDIN_FILENO, &error);
    if (!(starting || (strcmp(op, "release") == 0 && strcmp(subop, "end") == 0) ||
          (strcmp(op, "migrate") == 0 && strcmp(subop, "begin") == 0) ||
          (strcmp(op, "reconnect") == 0 && strcmp(subop, "begin") == 0))) {
        return 0;
    }
    dom = xml ? vn_domxml_parse((const char *)xml->data, xml->len, &error) : NULL;
    if (dom == NULL) {
        g_autofree char *named = g_strdup_printf("domain %s: ", name);

        /* domxml names the domain itself once it has read <name>. */
        if (g_str_has_prefix(error->message, named)) {
            fprintf(stderr, HOOK ": %s\n", error->message);
        } else {
            fprintf(stderr, HOOK ": domain %s: %s\n", name, error->message);
        }
        return starting ? 1 : 0;
    }
    /* Undeclared devices can only have been hot-plugged while it ran: ask at release. */
    if (dom->devices->len == 0 && strcmp(op, "release") != 0) {
        return 0;
    }
    if (strcmp(dom->name, name) != 0) {
        fprintf(stderr, HOOK ": called for domain %s with the XML of domain %s\n", name, dom->name);
        return starting ? 1 : 0;
    }
    if (strcmp(op, "migrate") == 0) {
        fprintf(stderr,
                HOOK ": domain %s cannot migrate: it uses %u borrowed device%s (%s%s) "
                     "and QEMU cannot migrate vfio-user devices; detach them first\n",
                name, dom->devices->len, dom->devices->len == 1 ? "" : "s",
                ((VnDomDevice *)dom->devices->pdata[0])->device,
                dom->devices->len > 1 ? ", ..." : "");
        return 1;
    }
    c = vn_ctl_client_connect(vn_ctl_default_socket(), VN_CTL_DEFAULT_TIMEOUT_MS, &error);
    if (c == NULL) {
        /* No daemon and nothing declared: nothing of ours can be in this domain. */
        if (dom->devices->len > 0) {
            fprintf(stderr, HOOK ": domain %s: %s\n", name, error->message);
        }
        return starting ? 1 : 0;
    }
    if (starting) {
        return prepare(c, dom);
    }
    return strcmp(op, "release") == 0 ? release(c, name, dom) : reconnect(c, dom);
}
