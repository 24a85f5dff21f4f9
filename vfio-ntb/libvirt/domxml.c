/*
 * vfio-ntb's libvirt domain XML convention (domxml.h): read a domain with
 * libxml2 by walking the tree (the few elements we read sit at fixed places,
 * so XPath would only add a second language to get wrong), and print the
 * snippets ntbctl xml suggests.
 */
#define G_LOG_DOMAIN "vfio-ntb.libvirt"

#include "libvirt/domxml-int.h"
#include "common/json.h"
#include "common/name.h"
#include "common/util.h"

#include "client/ctl-client.h"

#include <json-glib/json-glib.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <errno.h>
#include <gio/gio.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

/* How much of a value that failed its check an error message repeats. */
#define VN_DOMXML_SHOWN 64
/* Sets a rule violation and returns false, so that a check is one statement. */
static bool G_GNUC_PRINTF(2, 3) fail(GError **error, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_propagate_error(error,
                      g_error_new_valist(G_MARKUP_ERROR, G_MARKUP_ERROR_INVALID_CONTENT, fmt, ap));
    va_end(ap);
    return false;
}

static void dom_device_free(VnDomDevice *d)
{
    if (d == NULL) {
        return;
    }
    g_free(d->device);
    g_free(d->alias);
    g_free(d->irq_mode);
    g_free(d->socket);
    g_free(d->bus);
    g_free(d);
}

void vn_domain_free(VnDomain *dom)
{
    if (dom == NULL) {
        return;
    }
    g_free(dom->name);
    g_clear_pointer(&dom->devices, g_ptr_array_unref);
    g_free(dom);
}

const VnDomDevice *vn_domain_find(const VnDomain *dom, const char *device)
{
    for (guint i = 0; dom != NULL && device != NULL && i < dom->devices->len; i++) {
        const VnDomDevice *d = g_ptr_array_index(dom->devices, i);

        if (strcmp(d->device, device) == 0) {
            return d;
        }
    }
    return NULL;
}

/* ---- tree helpers --------------------------------------------------------- */

/* libxml2 strings are freed with xmlFree, ours with g_free: convert once. */
static char *take_xml_string(xmlChar *x)
{
    char *s = g_strdup((const char *)x);

    if (x != NULL) {
        xmlFree(x);
    }
    return s;
}

/* An attribute in no namespace (the only kind we read), or NULL. */
static char *prop(xmlNode *el, const char *name)
{
    return take_xml_string(xmlGetNoNsProp(el, (const xmlChar *)name));
}

static bool in_ns(const xmlNode *n, const char *ns)
{
    return n->type == XML_ELEMENT_NODE && n->ns != NULL && n->ns->href != NULL &&
           strcmp((const char *)n->ns->href, ns) == 0;
}

bool vn_domxml_is_element(const xmlNode *n, const char *ns, const char *name)
{
    if (n->type != XML_ELEMENT_NODE || strcmp((const char *)n->name, name) != 0) {
        return false;
    }
    return ns == NULL ? n->ns == NULL : in_ns(n, ns);
}

/* ---- <metadata>: our device list ------------------------------------------ */

/* One <vn:device> into @d; @index counts from 1, for messages before a name. */
static bool parse_device(xmlNode *el, guint index, VnDomDevice *d, GError **error)
{
    g_autoptr(GError) local = NULL;
    g_autofree char *p2p = NULL;

    for (const xmlAttr *a = el->properties; a != NULL; a = a->next) {
        const char *an = (const char *)a->name;

        if (a->ns != NULL || (strcmp(an, "name") != 0 && strcmp(an, "alias") != 0 &&
                              strcmp(an, "irq-mode") != 0 && strcmp(an, "p2p") != 0)) {
            const char *prefix =
                a->ns != NULL && a->ns->prefix != NULL ? (const char *)a->ns->prefix : NULL;

            return fail(error,
                        "<vn:device> %u: unknown attribute \"%s%s%.*s\" (name, alias, "
                        "irq-mode and p2p are known)",
                        index, prefix != NULL ? prefix : "", prefix != NULL ? ":" : "",
                        VN_DOMXML_SHOWN, an);
        }
    }
    d->device = prop(el, "name");
    d->alias = prop(el, "alias");
    d->irq_mode = prop(el, "irq-mode");
    p2p = prop(el, "p2p");
    if (d->device == NULL) {
        return fail(error, "<vn:device> %u has no name attribute (host/name)", index);
    }
    if (!vn_ctl_device_valid(d->device, &local)) {
        return fail(error, "<vn:device> %u: %s", index, local->message);
    }
    if (d->alias == NULL) {
        return fail(error, "device %s has no alias attribute (its -device id)", d->device);
    }
    if (!vn_name_valid(VN_NAME_QDEV_ID, d->alias)) {
        return fail(error, "device %s: alias \"%.*s\" is not a QEMU id: %s", d->device,
                    VN_DOMXML_SHOWN, d->alias, vn_name_rule(VN_NAME_QDEV_ID));
    }
    if (d->irq_mode != NULL && strcmp(d->irq_mode, "fd") != 0 &&
        strcmp(d->irq_mode, "relay") != 0) {
        return fail(error, "device %s: irq-mode is \"%.*s\", not fd or relay", d->device,
                    VN_DOMXML_SHOWN, d->irq_mode);
    }
    if (p2p != NULL && strcmp(p2p, "yes") != 0 && strcmp(p2p, "no") != 0) {
        return fail(error, "device %s: p2p is \"%.*s\", not yes or no", d->device, VN_DOMXML_SHOWN,
                    p2p);
    }
    d->p2p = g_strcmp0(p2p, "yes") == 0;
    return true;
}

static bool parse_devices(xmlNode *list, GPtrArray *devs, GError **error)
{
    for (xmlNode *n = list->children; n != NULL; n = n->next) {
        VnDomDevice *d;

        if ((n->type == XML_TEXT_NODE || n->type == XML_CDATA_SECTION_NODE) && !xmlIsBlankNode(n)) {
            return fail(error, "text inside <vn:devices>: only <vn:device> belongs there");
        }
        if (n->type != XML_ELEMENT_NODE) {
            continue; /* blanks, comments, processing instructions */
        }
        if (!vn_domxml_is_element(n, VN_DOMXML_NS, "device")) {
            return fail(error,
                        "unknown element <%.*s> inside <vn:devices>: only <vn:device> "
                        "belongs there",
                        VN_DOMXML_SHOWN, (const char *)n->name);
        }
        if (devs->len >= VN_DOMXML_MAX_DEVICES) {
            return fail(error, "more than %u devices in <vn:devices>", VN_DOMXML_MAX_DEVICES);
        }
        /* Owned by the array from here, whatever the checks find. */
        d = g_new0(VnDomDevice, 1);
        g_ptr_array_add(devs, d);
        if (!parse_device(n, devs->len, d, error)) {
            return false;
        }
        for (guint i = 0; i + 1 < devs->len; i++) {
            const VnDomDevice *e = g_ptr_array_index(devs, i);

            if (strcmp(e->alias, d->alias) == 0) {
                return fail(error, "devices %s and %s have the same alias %s", e->device, d->device,
                            d->alias);
            }
            if (strcmp(e->device, d->device) == 0) {
                return fail(error, "device %s is declared twice (aliases %s and %s)", d->device,
                            e->alias, d->alias);
            }
        }
    }
    return true;
}

static bool parse_metadata(xmlNode *root, GPtrArray *devs, GError **error)
{
    xmlNode *found = NULL;

    for (xmlNode *md = root->children; md != NULL; md = md->next) {
        if (!vn_domxml_is_element(md, NULL, "metadata")) {
            continue;
        }
        for (xmlNode *n = md->children; n != NULL; n = n->next) {
            if (!in_ns(n, VN_DOMXML_NS)) {
                continue; /* another application's metadata */
            }
            if (strcmp((const char *)n->name, "devices") != 0) {
                return fail(error,
                            "unknown element <%.*s> of namespace %s in <metadata>: "
                            "only <vn:devices> belongs there",
                            VN_DOMXML_SHOWN, (const char *)n->name, VN_DOMXML_NS);
            }
            if (found != NULL) {
                return fail(error, "more than one <vn:devices> in <metadata>: list every "
                                   "device in one");
            }
            found = n;
        }
    }
    return found == NULL || parse_devices(found, devs, error);
}

/* ---- what the devices need of the rest of the domain ---------------------- */

/* vfio-user hands guest RAM to the device as fds: it must be memfd, shared. */
static bool check_memory(xmlNode *root, GError **error)
{
    bool memfd = false, shared = false;

    for (xmlNode *mb = root->children; mb != NULL; mb = mb->next) {
        if (!vn_domxml_is_element(mb, NULL, "memoryBacking")) {
            continue;
        }
        for (xmlNode *n = mb->children; n != NULL; n = n->next) {
            if (vn_domxml_is_element(n, NULL, "source")) {
                g_autofree char *type = prop(n, "type");

                memfd = memfd || g_strcmp0(type, "memfd") == 0;
            } else if (vn_domxml_is_element(n, NULL, "access")) {
                g_autofree char *mode = prop(n, "mode");

                shared = shared || g_strcmp0(mode, "shared") == 0;
            }
        }
    }
    if (!memfd) {
        return fail(error, "vfio-user devices need guest memory QEMU can share: add "
                           "<memoryBacking><source type='memfd'/><access mode='shared'/>"
                           "</memoryBacking> to <domain>");
    }
    if (!shared) {
        return fail(error, "guest memory is memfd but not shared: add <access mode='shared'/> "
                           "to <memoryBacking>");
    }
    return true;
}

/* 1..@max printable ASCII characters: what a bus name printed back may hold. */
static bool printable_word(const char *s, size_t max)
{
    size_t n = strnlen(s, max + 1);

    for (size_t i = 0; i < n; i++) {
        if (!g_ascii_isgraph(s[i])) {
            return false;
        }
    }
    return n >= 1 && n <= max;
}

/* The -device whose id is @d's alias: check it, take its socket and bus. */
static bool take_device_arg(JsonObject *o, VnDomDevice *d, GError **error)
{
    const char *driver = vn_util_json_string(o, "driver");
    const char *path = NULL, *bus = vn_util_json_string(o, "bus");
    JsonNode *sock = json_object_get_member(o, "socket");

    if (g_strcmp0(driver, "vfio-user-pci") != 0) {
        return fail(error, "its -device has driver \"%.*s\", not vfio-user-pci", VN_DOMXML_SHOWN,
                    driver != NULL ? driver : "(none)");
    }
    if (sock != NULL && JSON_NODE_HOLDS_OBJECT(sock) &&
        g_strcmp0(vn_util_json_string(json_node_get_object(sock), "type"), "unix") == 0) {
        path = vn_util_json_string(json_node_get_object(sock), "path");
    }
    if (path == NULL) {
        return fail(error, "its -device needs \"socket\":{\"type\":\"unix\",\"path\":...}");
    }
    if (path[0] != '/') {
        return fail(error, "socket path \"%.*s\" is not absolute", VN_DOMXML_SHOWN, path);
    }
    if (strlen(path) > VN_DOMXML_MAX_SOCKET) {
        return fail(error, "socket path \"%.*s...\" is longer than %u bytes (sun_path)",
                    VN_DOMXML_SHOWN, path, VN_DOMXML_MAX_SOCKET);
    }
    /* Checked as text, not resolved (the socket does not exist yet): a ".."
     * could leave the directory the path appears to name.  The path is
     * absolute, so every component follows a '/'. */
    if (strstr(path, "/../") != NULL || g_str_has_suffix(path, "/..")) {
        return fail(error, "socket path \"%s\" has a \"..\" component", path);
    }
    if (json_object_has_member(o, "bus") && bus == NULL) {
        return fail(error, "its -device has a \"bus\" that is not a string");
    }
    if (bus != NULL && !printable_word(bus, VN_MAX_QDEV_ID)) {
        return fail(error,
                    "its -device \"bus\" is not 1-%u printable characters (a root "
                    "port's alias, such as pci.1)",
                    VN_MAX_QDEV_ID);
    }
    d->socket = g_strdup(path);
    d->bus = g_strdup(bus);
    return true;
}

/* One JSON -device argument: ours when its id is one of our aliases. */
static bool match_json(const char *text, GPtrArray *devs, GError **error)
{
    g_autoptr(GError) local = NULL;
    g_autoptr(JsonObject) o = vn_json_parse_object(text, -1, VN_DOMXML_MAX_BYTES, &local);
    const char *id;

    /* QEMU would refuse it too: better said here than as a failed start. */
    if (o == NULL && local->domain == JSON_PARSER_ERROR) {
        return fail(error, "a -device argument is not JSON: %s", local->message);
    }
    if (o == NULL) {
        return fail(error, "a -device argument is refused: %s", local->message);
    }
    id = vn_util_json_string(o, "id");
    for (guint i = 0; id != NULL && i < devs->len; i++) {
        VnDomDevice *d = g_ptr_array_index(devs, i);

        if (strcmp(d->alias, id) != 0) {
            continue;
        }
        if (d->socket != NULL) {
            return fail(error, "device %s: two -device arguments have id %s", d->device, id);
        }
        if (!take_device_arg(o, d, error)) {
            g_prefix_error(error, "device %s (alias %s): ", d->device, d->alias);
            return false;
        }
    }
    return true;
}

static bool match_args(xmlNode *root, GPtrArray *devs, GError **error)
{
    g_autoptr(GPtrArray) args = g_ptr_array_new_with_free_func(g_free);

    /* libvirt appends every <qemu:commandline>'s args in order: read them so. */
    for (xmlNode *cl = root->children; cl != NULL; cl = cl->next) {
        if (!vn_domxml_is_element(cl, VN_DOMXML_QEMU_NS, "commandline")) {
            continue;
        }
        for (xmlNode *a = cl->children; a != NULL; a = a->next) {
            char *value;

            if (!vn_domxml_is_element(a, VN_DOMXML_QEMU_NS, "arg")) {
                continue;
            }
            if (args->len >= VN_DOMXML_MAX_ARGS) {
                return fail(error, "more than %u <qemu:arg> elements", VN_DOMXML_MAX_ARGS);
            }
            value = prop(a, "value");
            g_ptr_array_add(args, value != NULL ? value : g_strdup(""));
        }
    }
    for (guint i = 0; i + 1 < args->len; i++) {
        const char *next = g_ptr_array_index(args, i + 1);

        if (strcmp(g_ptr_array_index(args, i), "-device") == 0 && next[0] == '{') {
            i++;
            if (!match_json(next, devs, error)) {
                return false;
            }
        }
    }
    for (guint i = 0; i < devs->len; i++) {
        const VnDomDevice *d = g_ptr_array_index(devs, i);

        if (d->socket == NULL) {
            return fail(error,
                        "no <qemu:arg> -device has id %s (device %s): `ntbctl xml %s "
                        "--alias %s` prints one",
                        d->alias, d->device, d->device, d->alias);
        }
        for (guint j = 0; j < i; j++) {
            const VnDomDevice *e = g_ptr_array_index(devs, j);

            if (strcmp(e->socket, d->socket) == 0) {
                return fail(error, "devices %s and %s use the same socket %s", e->device, d->device,
                            d->socket);
            }
        }
    }
    return true;
}

/* ---- the domain ----------------------------------------------------------- */

static bool parse_root(xmlNode *root, VnDomain *dom, GError **error)
{
    xmlNode *name = NULL;

    if (root == NULL || !vn_domxml_is_element(root, NULL, "domain")) {
        return fail(error, "domain XML: the root element is <%.*s>%s, not <domain>",
                    VN_DOMXML_SHOWN, root != NULL ? (const char *)root->name : "",
                    root != NULL && root->ns != NULL ? " in a namespace" : "");
    }
    for (xmlNode *n = root->children; n != NULL && name == NULL; n = n->next) {
        name = vn_domxml_is_element(n, NULL, "name") ? n : NULL;
    }
    dom->name = name != NULL ? take_xml_string(xmlNodeGetContent(name)) : NULL;
    if (!vn_name_valid(VN_NAME_DOMAIN, dom->name)) {
        return fail(error, "domain XML: the <name> \"%.*s\" is not %s", VN_DOMXML_SHOWN,
                    dom->name != NULL ? dom->name : "", vn_name_rule(VN_NAME_DOMAIN));
    }
    /* No devices of ours: nothing else to require (hooks see every domain). */
    if (!parse_metadata(root, dom->devices, error) ||
        (dom->devices->len > 0 &&
         (!check_memory(root, error) || !match_args(root, dom->devices, error)))) {
        g_prefix_error(error, "domain %s: ", dom->name);
        return false;
    }
    return true;
}

GByteArray *vn_domxml_read_fd(int fd, GError **error)
{
    g_autoptr(GByteArray) in = g_byte_array_new();
    guint8 buf[65536];

    while (in->len <= VN_DOMXML_MAX_BYTES) {
        ssize_t n = read(fd, buf, sizeof(buf));

        if (n == 0) {
            break;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                        "reading the domain XML: %s", g_strerror(errno));
            return NULL;
        }
        g_byte_array_append(in, buf, (guint)MIN((size_t)n, VN_DOMXML_MAX_BYTES + 1 - in->len));
    }
    return g_steal_pointer(&in);
}

xmlDoc *vn_domxml_read(const char *xml, size_t len, GError **error)
{
    g_autoptr(xmlDoc) doc = NULL;

    if (len > VN_DOMXML_MAX_BYTES) {
        fail(error, "domain XML is %zu bytes, more than the %u accepted", len, VN_DOMXML_MAX_BYTES);
        return NULL;
    }
    /* No NOENT, no DTDLOAD: entities stay unexpanded and nothing is fetched. */
    xmlResetLastError();
    doc = xmlReadMemory(xml, (int)len, "domain.xml", NULL,
                        XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (doc == NULL) {
        const xmlError *e = xmlGetLastError();
        g_autofree char *msg = g_strdup(e != NULL && e->message ? e->message : "no XML document");

        g_set_error(error, G_MARKUP_ERROR, G_MARKUP_ERROR_PARSE,
                    "domain XML does not parse: line %d: %s", e != NULL ? e->line : 0,
                    g_strchomp(msg));
        return NULL;
    }
    /* libvirt never writes one; refusing it means no entity is ever expanded,
     * not even by xmlGetNoNsProp or xmlNodeGetContent. */
    if (doc->intSubset != NULL || doc->extSubset != NULL) {
        fail(error, "domain XML: a <!DOCTYPE> is not accepted");
        return NULL;
    }
    return g_steal_pointer(&doc);
}

VnDomain *vn_domxml_parse_doc(xmlDoc *doc, GError **error)
{
    g_autoptr(VnDomain) dom = g_new0(VnDomain, 1);

    dom->devices = g_ptr_array_new_with_free_func((GDestroyNotify)dom_device_free);
    if (!parse_root(xmlDocGetRootElement(doc), dom, error)) {
        return NULL;
    }
    return g_steal_pointer(&dom);
}

VnDomain *vn_domxml_parse(const char *xml, size_t len, GError **error)
{
    g_autoptr(xmlDoc) doc = vn_domxml_read(xml, len, error);

    return doc != NULL ? vn_domxml_parse_doc(doc, error) : NULL;
}

/* ---- ntbctl xml ----------------------------------------------------------- */

char *vn_domxml_default_alias(const char *device)
{
    g_autofree char *flat = g_strdelimit(g_strdup(device), "/", '-');

    return g_strdup_printf("ntb-%s", flat);
}

/*
 * For a value in single quotes: escape what XML requires there, and keep the
 * JSON's double quotes readable (g_markup_escape_text would turn every one
 * into &quot;).
 */
static char *attr_escape(const char *text)
{
    GString *out = g_string_new(NULL);

    for (const char *p = text; *p != '\0'; p++) {
        switch (*p) {
        case '&':
            g_string_append(out, "&amp;");
            break;
        case '<':
            g_string_append(out, "&lt;");
            break;
        case '>':
            g_string_append(out, "&gt;");
            break;
        case '\'':
            g_string_append(out, "&apos;");
            break;
        default:
            g_string_append_c(out, *p);
        }
    }
    return g_string_free(out, FALSE);
}

char *vn_domxml_device_arg(const char *alias, const char *socket, const char *bus)
{
    g_autoptr(JsonObject) arg = json_object_new();
    g_autoptr(JsonObject) sock = json_object_new();
    g_autoptr(JsonNode) root = json_node_new(JSON_NODE_OBJECT);
    g_autoptr(JsonGenerator) gen = json_generator_new();

    /* Built, not printed, so that any socket path comes out as valid JSON. */
    json_object_set_string_member(arg, "driver", "vfio-user-pci");
    json_object_set_string_member(arg, "id", alias);
    if (bus != NULL) {
        json_object_set_string_member(arg, "bus", bus);
    }
    json_object_set_string_member(sock, "type", "unix");
    json_object_set_string_member(sock, "path", socket);
    json_object_set_object_member(arg, "socket", g_steal_pointer(&sock));
    json_node_set_object(root, arg);
    json_generator_set_root(gen, root);
    return json_generator_to_data(gen, NULL);
}

char *vn_domxml_snippets(const char *device, const char *alias, const char *socket, const char *bus)
{
    g_autofree char *json = vn_domxml_device_arg(alias, socket, bus);
    g_autofree char *json_attr = attr_escape(json);
    g_autofree char *entry =
        g_markup_printf_escaped("<vn:device name='%s' alias='%s'/>", device, alias);

    return g_strdup_printf(
        "<!-- Inside <domain>.  If it has a <metadata> already, put <vn:devices> inside\n"
        "     that <metadata>; if it has a <vn:devices>, add just the <vn:device>. -->\n"
        "<metadata>\n"
        "  <vn:devices xmlns:vn='" VN_DOMXML_NS "'>\n"
        "    %s\n"
        "  </vn:devices>\n"
        "</metadata>\n"
        "<!-- Inside <domain>, once: vfio-user shares guest memory with the device. -->\n"
        "<memoryBacking>\n"
        "  <source type='memfd'/>\n"
        "  <access mode='shared'/>\n"
        "</memoryBacking>\n"
        "<!-- Inside <domain>, and the <domain> element needs\n"
        "     xmlns:qemu='" VN_DOMXML_QEMU_NS "'. -->\n"
        "<qemu:commandline>\n"
        "  <qemu:arg value='-device'/>\n"
        "  <qemu:arg value='%s'/>\n"
        "</qemu:commandline>\n",
        entry, json_attr);
}
