/*
 * attach / detach / reassign of borrowed devices in running libvirt
 * domains; see hotplug.h.
 */
#define G_LOG_DOMAIN "vfio-ntb.libvirt"

#include "hotplug.h"
#include "common/name.h"
#include "common/util.h"

#include "client/ctl-client.h"
#include "libvirt/domedit.h"
#include "libvirt/domxml.h"
#include "libvirt/virt.h"

#include <gio/gio.h>
#include <string.h>

/* A --hosts file is a handful of lines per host. */
#define VN_HOTPLUG_MAX_HOSTS_FILE (256u * 1024)

typedef struct Step {
    FILE *out;
    const char *what; /* "reassign hosta/nvme0" */
    gint64 t0;
} Step;

static void say(Step *s, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void say(Step *s, const char *fmt, ...)
{
    g_autofree char *text = NULL;
    va_list ap;

    if (s->out == NULL) {
        return;
    }
    va_start(ap, fmt);
    text = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    fprintf(s->out, "%s: %s (%.2f s)\n", s->what, text,
            (double)(g_get_monotonic_time() - s->t0) / G_USEC_PER_SEC);
    fflush(s->out);
}

static void host_free(gpointer p)
{
    VnHotplugHost *h = p;

    g_free((char *)h->node);
    g_free((char *)h->control);
    g_free((char *)h->libvirt_uri);
    g_free(h);
}

GHashTable *vn_hotplug_hosts_load(const char *path, GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GHashTable) hosts = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, host_free);
    g_autofree char *text = NULL;
    g_auto(GStrv) groups = NULL;
    gsize len = 0;

    if (!g_file_get_contents(path, &text, &len, error)) {
        return NULL;
    }
    if (len > VN_HOTPLUG_MAX_HOSTS_FILE || !g_key_file_load_from_data(kf, text, len, 0, error)) {
        if (error != NULL && *error == NULL) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: too large", path);
        }
        g_prefix_error(error, "%s: ", path);
        return NULL;
    }
    groups = g_key_file_get_groups(kf, NULL);
    for (char **g = groups; *g != NULL; g++) {
        VnHotplugHost *h = g_new0(VnHotplugHost, 1);

        h->node = g_strdup(*g);
        h->control = g_key_file_get_string(kf, *g, "control", NULL);
        h->libvirt_uri = g_key_file_get_string(kf, *g, "libvirt", NULL);
        g_hash_table_replace(hosts, (char *)h->node, h);
        if (h->control == NULL || h->control[0] != '/') {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "%s: [%s] needs control = /path/of/its/vfio-ntbd/control.sock", path, *g);
            return NULL;
        }
    }
    return g_steal_pointer(&hosts);
}

/* ---- one host's daemon ---- */

static JsonObject *dev_args(const char *device)
{
    JsonObject *a = json_object_new();

    json_object_set_string_member(a, "device", device);
    return a;
}

static JsonNode *call(const VnHotplugHost *h, const char *cmd, JsonObject *args, GError **error)
{
    g_autoptr(VnCtlClient) c = vn_ctl_client_connect(h->control, VN_CTL_DEFAULT_TIMEOUT_MS, error);
    JsonNode *ret = c ? vn_ctl_client_execute(c, cmd, args, error) : NULL;

    if (ret == NULL) {
        g_prefix_error(error, "%s: ", h->node);
    }
    return ret;
}

/* What the daemon on @h says about @device (query-device), or NULL. */
static JsonObject *device_state(const VnHotplugHost *h, const char *device, JsonNode **keep,
                                GError **error)
{
    g_autoptr(JsonObject) a = dev_args(device);

    *keep = call(h, "query-device", a, error);
    if (*keep == NULL) {
        return NULL;
    }
    if (!JSON_NODE_HOLDS_OBJECT(*keep)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: odd query-device answer",
                    h->node);
        return NULL;
    }
    return json_node_get_object(*keep);
}

/* Serve @device to @domain on @h (borrowing it if need be); the socket, newly allocated. */
static char *serve(const VnHotplugHost *h, const char *device, const char *domain,
                   const char *alias, GError **error)
{
    g_autoptr(JsonObject) a = dev_args(device);
    g_autoptr(JsonNode) ret = NULL;
    const char *sock;

    json_object_set_string_member(a, "domain", domain);
    json_object_set_string_member(a, "qdev-id", alias);
    ret = call(h, "attach", a, error);
    sock = vn_util_json_string(
        ret && JSON_NODE_HOLDS_OBJECT(ret) ? json_node_get_object(ret) : NULL, "socket");
    if (ret != NULL && sock == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: attach did not say where it serves %s", h->node, device);
    }
    return g_strdup(sock);
}

static bool give_back(const VnHotplugHost *h, const char *device, GError **error)
{
    g_autoptr(JsonObject) a = dev_args(device);
    g_autoptr(JsonNode) ret = call(h, "return", a, error);

    return ret != NULL;
}

/*
 * Take @id out of @domain, which runs on @h: through the device request when
 * its QEMU takes one (the daemon signals it: qemu-patches/0003), else with
 * QMP device_del; either way the guest's driver releases the device.  Then
 * wait until QEMU no longer has it.
 */
static bool unplug(const VnHotplugHost *h, VnVirt *v, const char *device, const char *domain,
                   const char *id, Step *s, GError **error)
{
    g_autoptr(JsonObject) a = dev_args(device);
    g_autoptr(GError) ignored = NULL; /* an older daemon: device_del does it */
    g_autoptr(JsonNode) ret = call(h, "unplug", a, &ignored);
    bool requested = ret != NULL && JSON_NODE_HOLDS_OBJECT(ret) &&
                     vn_util_json_bool(json_node_get_object(ret), "requested");

    if (!requested && !vn_virt_device_del(v, domain, id, error)) {
        return false;
    }
    if (!vn_virt_wait_removed(v, domain, id, VN_VIRT_UNPLUG_TIMEOUT_MS, error)) {
        return false;
    }
    say(s, "unplugged from %s:%s (%s)", h->node, domain,
        requested ? "device request" : "device_del");
    return true;
}

/* ---- the operations ---- */

/* Where plug_in() put a device. */
typedef struct Plugged {
    char *sock;
    char *port;
} Plugged;

static void plugged_clear(Plugged *p)
{
    g_free(p->sock);
    g_free(p->port);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Plugged, plugged_clear)

/*
 * --config: make @domain's definition on @h declare @device as @alias,
 * served on @p's socket and plugged on its port (@p NULL: not declare it).
 */
static bool persist(const VnHotplugHost *h, VnVirt *v, const char *domain, const char *device,
                    const char *alias, const Plugged *p, Step *s, GError **error)
{
    g_autofree char *xml = vn_virt_domain_config(v, domain, error);
    g_autofree char *edited = NULL;

    if (xml == NULL) {
        g_prefix_error(error, "%s:%s's configuration: ", h->node, domain);
        return false;
    }
    if (!(p != NULL ? vn_domedit_declare(xml, strlen(xml), device, alias, p->sock, p->port, &edited,
                                         error)
                    : vn_domedit_undeclare(xml, strlen(xml), device, &edited, error))) {
        g_prefix_error(error, "%s:%s's configuration: ", h->node, domain);
        return false;
    }
    if (edited == NULL) {
        say(s, "%s:%s's configuration %s it already", h->node, domain,
            p != NULL ? "declares" : "does not declare");
        return true;
    }
    if (!vn_virt_domain_define(v, domain, edited, error)) {
        g_prefix_error(error, "%s:%s's configuration: ", h->node, domain);
        return false;
    }
    say(s, "%s %s:%s's configuration", p != NULL ? "declared in" : "removed from", h->node, domain);
    return true;
}

/* Serve and plug, saying where in @where (may be NULL); on failure undo what
 * this call did. */
static bool plug_in(const VnHotplugHost *h, VnVirt *v, const char *device, const char *domain,
                    const char *alias, bool was_ours, Plugged *where, Step *s, GError **error)
{
    g_autofree char *port = vn_virt_free_root_port(v, domain, error);
    g_autofree char *sock = port ? serve(h, device, domain, alias, error) : NULL;
    g_autoptr(GError) undo = NULL;
    g_autoptr(JsonObject) a = NULL;
    g_autoptr(JsonNode) ret = NULL;

    if (sock == NULL) {
        return false;
    }
    say(s, "%s serves it on %s", h->node, sock);
    if (vn_virt_plug(v, domain, alias, port, sock, error)) {
        say(s, "plugged into %s:%s as %s on %s", h->node, domain, alias, port);
        if (where != NULL) {
            where->sock = g_steal_pointer(&sock);
            where->port = g_steal_pointer(&port);
        }
        return true;
    }
    /* Leave the device as we found it: returned if we borrowed it, else just detached. */
    a = dev_args(device);
    ret = was_ours ? call(h, "detach", a, &undo) : call(h, "return", a, &undo);
    if (ret == NULL) {
        g_prefix_error(error, "(and undoing failed too: %s) ", undo->message);
    }
    return false;
}

bool vn_hotplug_attach(const VnHotplugHost *h, const char *device, const char *domain,
                       const char *alias, bool config, FILE *progress, GError **error)
{
    g_auto(Plugged) where = { 0 };
    g_autofree char *what = g_strdup_printf("attach %s", device);
    g_autofree char *dflt = vn_domxml_default_alias(device);
    Step s = { progress, what, g_get_monotonic_time() };
    g_autoptr(VnVirt) v = NULL;
    g_autoptr(JsonNode) keep = NULL;
    JsonObject *st;
    const char *borrower;

    if (alias == NULL && !vn_name_valid(VN_NAME_QDEV_ID, dflt)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "%s is too long to be the device's id: give one with --alias", dflt);
        return false;
    }
    v = vn_virt_open(h->libvirt_uri, error);
    if (v == NULL || !vn_virt_domain_running(v, domain, error)) {
        return false;
    }
    st = device_state(h, device, &keep, error);
    if (st == NULL) {
        return false;
    }
    /* Attached to it already: device_add would fail on the id, and the undo
     * would stop the worker the VM uses. */
    if (g_strcmp0(vn_util_json_string(st, "attached_to"), domain) == 0) {
        say(&s, "already in %s:%s", h->node, domain);
        return true;
    }
    borrower = vn_util_json_string(st, "borrower");
    return plug_in(h, v, device, domain, alias ? alias : dflt,
                   borrower != NULL && strcmp(borrower, h->node) == 0, &where, &s, error) &&
           (!config || persist(h, v, domain, device, alias ? alias : dflt, &where, &s, error));
}

bool vn_hotplug_detach(const VnHotplugHost *h, const char *device, const char *from, bool config,
                       FILE *progress, GError **error)
{
    g_autofree char *what = g_strdup_printf("detach %s", device);
    Step s = { progress, what, g_get_monotonic_time() };
    g_autoptr(VnVirt) v = NULL;
    g_autoptr(JsonNode) keep = NULL;
    JsonObject *st = device_state(h, device, &keep, error);
    const char *domain = vn_util_json_string(st, "attached_to");
    const char *id = vn_util_json_string(st, "qdev_id");

    if (st == NULL) {
        return false;
    }
    if (from != NULL && g_strcmp0(domain, from) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "%s is %s%s, not to %s: nothing changed", device,
                    domain != NULL ? "attached to " : "not attached", domain != NULL ? domain : "",
                    from);
        return false;
    }
    if (domain != NULL && id != NULL) {
        v = vn_virt_open(h->libvirt_uri, error);
        if (v == NULL || !unplug(h, v, device, domain, id, &s, error)) {
            return false;
        }
    }
    if (!give_back(h, device, error)) {
        return false;
    }
    say(&s, "returned by %s", h->node);
    /* (v is open when a libvirt domain had it) */
    return !config || v == NULL || persist(h, v, domain, device, NULL, NULL, &s, error);
}

/* Where @device is now: its holder's node, domain, id and root port. */
typedef struct Holder {
    const VnHotplugHost *host;
    char *domain;
    char *id;
    char *bus;
} Holder;

static void holder_clear(Holder *w)
{
    g_free(w->domain);
    g_free(w->id);
    g_free(w->bus);
}

static bool find_holder(GHashTable *hosts, const VnHotplugHost *to, const char *device, Holder *w,
                        GError **error)
{
    g_autoptr(JsonNode) k1 = NULL, k2 = NULL;
    JsonObject *st = device_state(to, device, &k1, error);
    const char *node = vn_util_json_string(st, "borrower");
    g_autoptr(VnVirt) v = NULL;

    if (st == NULL) {
        return false;
    }
    if (node == NULL) {
        return true; /* nobody holds it */
    }
    w->host = strcmp(node, to->node) == 0 ? to : hosts ? g_hash_table_lookup(hosts, node) : NULL;
    if (w->host == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND,
                    "%s is held by %s, which the --hosts file does not list", device, node);
        return false;
    }
    st = device_state(w->host, device, &k2, error);
    if (st == NULL) {
        return false;
    }
    w->domain = g_strdup(vn_util_json_string(st, "attached_to"));
    w->id = g_strdup(vn_util_json_string(st, "qdev_id"));
    if (w->domain != NULL && w->id != NULL) {
        g_autoptr(GError) local = NULL;

        /* A NULL bus without an error: attached, but not plugged into the domain. */
        v = vn_virt_open(w->host->libvirt_uri, &local);
        w->bus = v ? vn_virt_device_bus(v, w->domain, w->id, &local) : NULL;
        if (local != NULL) {
            g_propagate_error(error, g_steal_pointer(&local));
            return false;
        }
    }
    return true;
}

bool vn_hotplug_reassign(GHashTable *hosts, const VnHotplugHost *to, const char *device,
                         const char *domain, bool config, FILE *progress, GError **error)
{
    g_auto(Plugged) where = { 0 };
    g_autofree char *what = g_strdup_printf("reassign %s", device);
    g_autofree char *dflt = vn_domxml_default_alias(device);
    Step s = { progress, what, g_get_monotonic_time() };
    g_autoptr(VnVirt) tv = vn_virt_open(to->libvirt_uri, error);
    g_autoptr(VnVirt) fv = NULL;
    g_autofree char *port = NULL;
    g_autoptr(GError) failure = NULL;
    Holder w = { 0 };
    bool ok = false;

    /* Check the target first: until the source lets go, nothing has changed. */
    if (!vn_name_valid(VN_NAME_QDEV_ID, dflt)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "%s is too long to be the device's id in %s", dflt, domain);
        goto out;
    }
    if (tv == NULL || !vn_virt_domain_running(tv, domain, error) ||
        (port = vn_virt_free_root_port(tv, domain, error)) == NULL ||
        !find_holder(hosts, to, device, &w, error)) {
        goto out;
    }
    say(&s, "%s:%s has a free root port (%s); %s is %s%s%s%s", to->node, domain, port, device,
        w.host ? "held by " : "available", w.host ? w.host->node : "", w.domain ? ":" : "",
        w.domain ? w.domain : "");
    if (w.host != NULL && w.domain != NULL && strcmp(w.host->node, to->node) == 0 &&
        strcmp(w.domain, domain) == 0) {
        say(&s, "already there");
        ok = true;
        goto out;
    }
    if (w.host != NULL && w.bus != NULL) {
        fv = vn_virt_open(w.host->libvirt_uri, error);
        if (fv == NULL || !unplug(w.host, fv, device, w.domain, w.id, &s, error)) {
            goto out;
        }
    }
    if (w.host != NULL) {
        if (!give_back(w.host, device, error)) {
            goto rollback_source;
        }
        say(&s, "returned by %s", w.host->node);
    }
    if (plug_in(to, tv, device, domain, dflt, false, &where, &s, &failure)) {
        /* Live, it has moved: from here on a failure is reported, not rolled back. */
        ok = !config || ((w.domain == NULL || fv == NULL ||
                          persist(w.host, fv, w.domain, device, NULL, NULL, &s, error)) &&
                         persist(to, tv, domain, device, dflt, &where, &s, error));
        goto out;
    }
    g_propagate_error(error, g_steal_pointer(&failure));
    /* Back where it was: borrowed, served and plugged as before. */
rollback_source:
    if (w.host != NULL && w.bus != NULL && fv != NULL) {
        g_autoptr(GError) e2 = NULL;
        g_autofree char *sock = serve(w.host, device, w.domain, w.id, &e2);

        if (sock == NULL || !vn_virt_plug(fv, w.domain, w.id, w.bus, sock, &e2)) {
            g_prefix_error(error, "rollback failed too (%s); ", e2->message);
        } else {
            say(&s, "rolled back: in %s:%s again", w.host->node, w.domain);
            g_prefix_error(error, "rolled back to %s:%s: ", w.host->node, w.domain);
        }
    }
out:
    if (ok) {
        say(&s, "done");
    }
    holder_clear(&w);
    return ok;
}
