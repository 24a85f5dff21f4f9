/*
 * Hot-plug through libvirt's QMP passthrough; see virt.h.
 */
#define G_LOG_DOMAIN "vfio-ntb.libvirt"

#include "virt.h"
#include "common/json.h"
#include "common/util.h"

#include <libvirt/libvirt-qemu.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <string.h>

/* Polling QEMU for a device's removal: often enough to see it at once,
 * rarely enough not to load a TCG guest's QEMU. */
#define VN_VIRT_POLL_MS 50

struct VnVirt {
    virConnectPtr conn;
};

G_DEFINE_QUARK(vn - virt - error - quark, vn_virt_error)

/* libvirt prints every error to stderr by default; we report ours. */
static void quiet(void *opaque, virErrorPtr err)
{}

static const char *last_error(void)
{
    virErrorPtr e = virGetLastError();

    /* Seen when the domain's QEMU exited during the call: libvirt sets no error. */
    if (e == NULL || e->code == VIR_ERR_OK || e->message == NULL) {
        return "no answer from the domain's QEMU (did it exit?)";
    }
    return e->message;
}

VnVirt *vn_virt_open(const char *uri, GError **error)
{
    VnVirt *v;
    virConnectPtr conn;

    virSetErrorFunc(NULL, quiet);
    conn = virConnectOpen(uri);
    if (conn == NULL) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_UNREACHABLE,
                    "cannot connect to libvirt%s%s: %s", uri ? " at " : "", uri ? uri : "",
                    last_error());
        return NULL;
    }
    v = g_new0(VnVirt, 1);
    v->conn = conn;
    return v;
}

void vn_virt_close(VnVirt *v)
{
    if (v != NULL) {
        virConnectClose(v->conn);
        g_free(v);
    }
}

static virDomainPtr running_domain(VnVirt *v, const char *domain, GError **error)
{
    virDomainPtr d = virDomainLookupByName(v->conn, domain);

    if (d == NULL) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_NO_DOMAIN, "libvirt has no domain %s",
                    domain);
        return NULL;
    }
    if (virDomainIsActive(d) != 1) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_NOT_RUNNING,
                    "domain %s is not running (start it, or declare the device in its XML: "
                    "ntbctl xml)",
                    domain);
        virDomainFree(d);
        return NULL;
    }
    return d;
}

bool vn_virt_domain_running(VnVirt *v, const char *domain, GError **error)
{
    virDomainPtr d = running_domain(v, domain, error);

    if (d != NULL) {
        virDomainFree(d);
    }
    return d != NULL;
}

/*
 * Run one QMP command in @domain's QEMU; the answer, which owns its
 * "return" value, is handed back in @answer_out.
 */
static JsonNode *qmp(VnVirt *v, const char *domain, const char *command, JsonNode *args,
                     JsonObject **answer_out, GError **error)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) req = NULL;
    g_autofree char *text = NULL;
    char *answer = NULL;
    virDomainPtr d;
    g_autoptr(JsonObject) o = NULL;
    int ret;

    d = running_domain(v, domain, error);
    if (d == NULL) {
        return NULL;
    }
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "execute");
    json_builder_add_string_value(b, command);
    if (args != NULL) {
        json_builder_set_member_name(b, "arguments");
        json_builder_add_value(b, json_node_copy(args));
    }
    json_builder_end_object(b);
    req = json_builder_get_root(b);
    text = json_to_string(req, FALSE);
    ret = virDomainQemuMonitorCommand(d, text, &answer, VIR_DOMAIN_QEMU_MONITOR_COMMAND_DEFAULT);
    virDomainFree(d);
    if (ret < 0) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_QMP, "domain %s: %s: %s", domain, command,
                    last_error());
        return NULL;
    }
    o = vn_json_parse_object(answer, -1, VN_VIRT_MAX_ANSWER, NULL);
    free(answer);
    if (o == NULL) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_QMP,
                    "domain %s: %s: QEMU's answer is not a JSON object (of at most %u bytes, "
                    "%u levels)",
                    domain, command, (unsigned)VN_VIRT_MAX_ANSWER, VN_MAX_JSON_DEPTH);
        return NULL;
    }
    if (json_object_has_member(o, "error")) {
        JsonNode *e = json_object_get_member(o, "error");
        const char *desc =
            vn_util_json_string(JSON_NODE_HOLDS_OBJECT(e) ? json_node_get_object(e) : NULL, "desc");

        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_QMP, "domain %s: %s: %s", domain, command,
                    desc != NULL ? desc : "no description");
        return NULL;
    }
    if (!json_object_has_member(o, "return")) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_QMP,
                    "domain %s: %s: QEMU's answer has no \"return\"", domain, command);
        return NULL;
    }
    *answer_out = json_object_ref(o);
    return json_object_get_member(o, "return");
}

/* The devices on PCI bus 0 (the root ports hang there on q35), from query-pci. */
static JsonArray *root_devices(JsonNode *ret)
{
    JsonArray *buses = JSON_NODE_HOLDS_ARRAY(ret) ? json_node_get_array(ret) : NULL;

    for (guint i = 0; buses != NULL && i < json_array_get_length(buses); i++) {
        JsonNode *bn = json_array_get_element(buses, i);
        JsonObject *bus = JSON_NODE_HOLDS_OBJECT(bn) ? json_node_get_object(bn) : NULL;
        JsonNode *devs = bus ? json_object_get_member(bus, "devices") : NULL;

        if (devs != NULL && JSON_NODE_HOLDS_ARRAY(devs)) {
            return json_node_get_array(devs);
        }
    }
    return NULL;
}

/* The devices behind a root port (its pci_bridge's), or NULL if it is not a bridge. */
static JsonArray *bridge_devices(JsonObject *dev)
{
    JsonNode *br = json_object_get_member(dev, "pci_bridge");
    JsonNode *devs;

    if (br == NULL || !JSON_NODE_HOLDS_OBJECT(br)) {
        return NULL;
    }
    devs = json_object_get_member(json_node_get_object(br), "devices");
    return devs != NULL && JSON_NODE_HOLDS_ARRAY(devs) ? json_node_get_array(devs) : NULL;
}

/*
 * Walk the root ports: with @want_id NULL return the first empty one's id;
 * otherwise the id of the port that holds device @want_id, or "pcie.0" when
 * it sits on the root bus itself (declared in the XML without a bus): a
 * device found nowhere is one QEMU no longer has.
 */
static char *scan_ports(VnVirt *v, const char *domain, const char *want_id, GError **error)
{
    g_autoptr(JsonObject) p = NULL;
    JsonNode *ret = qmp(v, domain, "query-pci", NULL, &p, error);
    JsonArray *devs = ret ? root_devices(ret) : NULL;

    if (ret == NULL) {
        return NULL;
    }
    for (guint i = 0; devs != NULL && i < json_array_get_length(devs); i++) {
        JsonNode *dn = json_array_get_element(devs, i);
        JsonObject *dev = JSON_NODE_HOLDS_OBJECT(dn) ? json_node_get_object(dn) : NULL;
        JsonArray *behind = dev ? bridge_devices(dev) : NULL;
        const char *port = vn_util_json_string(dev, "qdev_id");

        if (want_id != NULL && g_strcmp0(port, want_id) == 0) {
            return g_strdup("pcie.0");
        }
        if (behind == NULL || port == NULL || port[0] == '\0') {
            continue;
        }
        if (want_id == NULL && json_array_get_length(behind) == 0) {
            return g_strdup(port);
        }
        for (guint j = 0; want_id != NULL && j < json_array_get_length(behind); j++) {
            JsonNode *cn = json_array_get_element(behind, j);
            JsonObject *co = JSON_NODE_HOLDS_OBJECT(cn) ? json_node_get_object(cn) : NULL;
            const char *id = vn_util_json_string(co, "qdev_id");

            if (id != NULL && strcmp(id, want_id) == 0) {
                return g_strdup(port);
            }
        }
    }
    if (want_id == NULL) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_NO_PORT,
                    "domain %s has no free pcie-root-port: give it spare ones "
                    "(<controller type='pci' model='pcie-root-port'/>, docs/libvirt.md)",
                    domain);
    }
    return NULL;
}

char *vn_virt_free_root_port(VnVirt *v, const char *domain, GError **error)
{
    return scan_ports(v, domain, NULL, error);
}

char *vn_virt_device_bus(VnVirt *v, const char *domain, const char *id, GError **error)
{
    return scan_ports(v, domain, id, error);
}

bool vn_virt_plug(VnVirt *v, const char *domain, const char *id, const char *bus,
                  const char *socket, GError **error)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) args = NULL;
    g_autoptr(JsonObject) p = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "driver");
    json_builder_add_string_value(b, "vfio-user-pci");
    json_builder_set_member_name(b, "id");
    json_builder_add_string_value(b, id);
    json_builder_set_member_name(b, "bus");
    json_builder_add_string_value(b, bus);
    json_builder_set_member_name(b, "socket");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "type");
    json_builder_add_string_value(b, "unix");
    json_builder_set_member_name(b, "path");
    json_builder_add_string_value(b, socket);
    json_builder_end_object(b);
    json_builder_end_object(b);
    args = json_builder_get_root(b);
    return qmp(v, domain, "device_add", args, &p, error) != NULL;
}

bool vn_virt_device_del(VnVirt *v, const char *domain, const char *id, GError **error)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) args = NULL;
    g_autoptr(JsonObject) p = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "id");
    json_builder_add_string_value(b, id);
    json_builder_end_object(b);
    args = json_builder_get_root(b);
    return qmp(v, domain, "device_del", args, &p, error) != NULL;
}

bool vn_virt_wait_removed(VnVirt *v, const char *domain, const char *id, int timeout_ms,
                          GError **error)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;

    /* An unplug only asks the guest; the device is gone when QEMU no longer lists it. */
    for (;;) {
        g_autoptr(GError) local = NULL;
        g_autofree char *bus = vn_virt_device_bus(v, domain, id, &local);

        if (bus == NULL && local == NULL) {
            return true;
        }
        if (local != NULL) {
            g_propagate_error(error, g_steal_pointer(&local));
            return false;
        }
        if (g_get_monotonic_time() >= deadline) {
            g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_TIMEOUT,
                        "domain %s: the guest did not release %s within %d ms", domain, id,
                        timeout_ms);
            return false;
        }
        g_usleep(VN_VIRT_POLL_MS * 1000);
    }
}

char *vn_virt_domain_config(VnVirt *v, const char *domain, GError **error)
{
    virDomainPtr d = virDomainLookupByName(v->conn, domain);
    char *xml = NULL, *copy;
    int persistent;

    if (d == NULL) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_NO_DOMAIN, "libvirt has no domain %s",
                    domain);
        return NULL;
    }
    persistent = virDomainIsPersistent(d);
    if (persistent == 1) {
        /* SECURE: what a define must get back (passwords of graphics, say). */
        xml = virDomainGetXMLDesc(d, VIR_DOMAIN_XML_INACTIVE | VIR_DOMAIN_XML_SECURE);
    }
    virDomainFree(d);
    if (persistent == 0) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_TRANSIENT,
                    "domain %s is transient: it has no definition to change", domain);
        return NULL;
    }
    if (xml == NULL) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_DEFINE, "domain %s: its definition: %s",
                    domain, last_error());
        return NULL;
    }
    copy = g_strdup(xml);
    free(xml);
    return copy;
}

bool vn_virt_domain_define(VnVirt *v, const char *domain, const char *xml, GError **error)
{
    virDomainPtr d = virDomainDefineXML(v->conn, xml);

    if (d == NULL) {
        g_set_error(error, VN_VIRT_ERROR, VN_VIRT_ERROR_DEFINE,
                    "domain %s: libvirt refused its new definition: %s", domain, last_error());
        return false;
    }
    virDomainFree(d);
    return true;
}
