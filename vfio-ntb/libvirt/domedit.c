/*
 * Declaring and undeclaring a borrowed device in a domain's XML (domedit.h),
 * on libxml2's tree.  libvirt re-formats a definition it is given, so new
 * elements go at the end of their parent and carry no indentation.
 */
#define G_LOG_DOMAIN "vfio-ntb.libvirt"

#include "libvirt/domedit.h"
#include "common/json.h"
#include "common/util.h"
#include "libvirt/domxml-int.h"

#include <json-glib/json-glib.h>
#include <libxml/parser.h>
#include <string.h>

#define X(s) ((const xmlChar *)(s))

/* The first child element of @parent called @name in @ns, or NULL. */
static xmlNode *child(xmlNode *parent, const char *ns, const char *name)
{
    for (xmlNode *n = parent->children; n != NULL; n = n->next) {
        if (vn_domxml_is_element(n, ns, name)) {
            return n;
        }
    }
    return NULL;
}

static bool has_element_children(const xmlNode *parent)
{
    for (const xmlNode *n = parent->children; n != NULL; n = n->next) {
        if (n->type == XML_ELEMENT_NODE) {
            return true;
        }
    }
    return false;
}

static void drop(xmlNode *n)
{
    xmlUnlinkNode(n);
    xmlFreeNode(n);
}

/* The document as text, checked again against the convention. */
static char *finish(xmlDoc *doc, GError **error)
{
    xmlChar *buf = NULL;
    int size = 0;
    g_autofree char *text = NULL;
    g_autoptr(VnDomain) check = NULL;

    xmlDocDumpMemory(doc, &buf, &size);
    if (buf == NULL || size <= 0) {
        g_set_error(error, G_MARKUP_ERROR, G_MARKUP_ERROR_INVALID_CONTENT,
                    "domain XML: could not write the edited document");
        xmlFree(buf);
        return NULL;
    }
    text = g_strndup((const char *)buf, (gsize)size);
    xmlFree(buf);
    check = vn_domxml_parse(text, (size_t)size, error);
    if (check == NULL) {
        g_prefix_error(error, "the edited definition would be invalid: ");
        return NULL;
    }
    return g_steal_pointer(&text);
}

/* The "id" of a JSON -device argument, newly allocated, or NULL. */
static char *device_arg_id(const char *value)
{
    g_autoptr(JsonObject) o = NULL;

    if (value == NULL || value[0] != '{') {
        return NULL;
    }
    o = vn_json_parse_object(value, -1, VN_DOMXML_MAX_BYTES, NULL);
    return g_strdup(vn_util_json_string(o, "id"));
}

static bool arg_is(xmlNode *arg, const char *value)
{
    xmlChar *v = xmlGetNoNsProp(arg, X("value"));
    bool same = v != NULL && strcmp((const char *)v, value) == 0;

    xmlFree(v);
    return same;
}

/* ---- declare -------------------------------------------------------------- */

/* <metadata><vn:devices>, made when missing. */
static xmlNode *device_list(xmlNode *root, GError **error)
{
    xmlNode *md = child(root, NULL, "metadata");
    xmlNode *list;
    xmlNs *ns;

    if (md == NULL) {
        md = xmlNewChild(root, NULL, X("metadata"), NULL);
    }
    list = md != NULL ? child(md, VN_DOMXML_NS, "devices") : NULL;
    if (list == NULL && md != NULL) {
        list = xmlNewChild(md, NULL, X("devices"), NULL);
        ns = list != NULL ? xmlNewNs(list, X(VN_DOMXML_NS), X("vn")) : NULL;
        if (ns == NULL) {
            g_set_error(error, G_MARKUP_ERROR, G_MARKUP_ERROR_INVALID_CONTENT,
                        "domain XML: could not add <vn:devices>");
            return NULL;
        }
        xmlSetNs(list, ns);
    }
    return list;
}

/* The last <qemu:commandline>, made (and the namespace declared on <domain>)
 * when missing.  The last, because libvirt joins them in order: appending
 * anywhere else could split a "-device" from its value. */
static xmlNode *commandline(xmlNode *root, GError **error)
{
    xmlNode *cl = NULL;
    xmlNs *ns;

    for (xmlNode *n = root->children; n != NULL; n = n->next) {
        cl = vn_domxml_is_element(n, VN_DOMXML_QEMU_NS, "commandline") ? n : cl;
    }
    if (cl != NULL) {
        return cl;
    }
    ns = xmlSearchNsByHref(root->doc, root, X(VN_DOMXML_QEMU_NS));
    if (ns == NULL) {
        ns = xmlNewNs(root, X(VN_DOMXML_QEMU_NS), X("qemu"));
    }
    if (ns == NULL) {
        g_set_error(error, G_MARKUP_ERROR, G_MARKUP_ERROR_INVALID_CONTENT,
                    "domain XML: the prefix \"qemu\" names another namespace on <domain>");
        return NULL;
    }
    return xmlNewChild(root, ns, X("commandline"), NULL);
}

bool vn_domedit_declare(const char *xml, size_t len, const char *device, const char *alias,
                        const char *socket, const char *bus, char **out, GError **error)
{
    /* Read once: checked as it is, then edited. */
    g_autoptr(xmlDoc) doc = vn_domxml_read(xml, len, error);
    g_autoptr(VnDomain) dom = doc != NULL ? vn_domxml_parse_doc(doc, error) : NULL;
    g_autofree char *json = NULL;
    xmlNode *root, *list, *cl, *entry, *flag, *arg;

    *out = NULL;
    if (dom == NULL) {
        return false;
    }
    if (vn_domain_find(dom, device) != NULL) {
        return true;
    }
    for (guint i = 0; i < dom->devices->len; i++) {
        const VnDomDevice *d = g_ptr_array_index(dom->devices, i);

        if (strcmp(d->alias, alias) == 0) {
            g_set_error(error, G_MARKUP_ERROR, G_MARKUP_ERROR_INVALID_CONTENT,
                        "domain %s: alias %s is %s's already", dom->name, alias, d->device);
            return false;
        }
    }
    root = xmlDocGetRootElement(doc);
    list = device_list(root, error);
    cl = list != NULL ? commandline(root, error) : NULL;
    if (cl == NULL) {
        return false;
    }
    entry = xmlNewChild(list, list->ns, X("device"), NULL);
    json = vn_domxml_device_arg(alias, socket, bus);
    flag = xmlNewChild(cl, cl->ns, X("arg"), NULL);
    arg = xmlNewChild(cl, cl->ns, X("arg"), NULL);
    /* xmlNewProp escapes on output; the JSON needs no escaping of ours. */
    if (entry == NULL || flag == NULL || arg == NULL ||
        xmlNewProp(entry, X("name"), X(device)) == NULL ||
        xmlNewProp(entry, X("alias"), X(alias)) == NULL ||
        xmlNewProp(flag, X("value"), X("-device")) == NULL ||
        xmlNewProp(arg, X("value"), X(json)) == NULL) {
        g_set_error(error, G_MARKUP_ERROR, G_MARKUP_ERROR_INVALID_CONTENT,
                    "domain %s: could not add %s", dom->name, device);
        return false;
    }
    *out = finish(doc, error);
    return *out != NULL;
}

/* ---- undeclare ------------------------------------------------------------ */

/* Drop the <vn:device name=@device> entries, and <vn:devices> if it empties. */
static void drop_entry(xmlNode *root, const char *device)
{
    xmlNode *md = child(root, NULL, "metadata");
    xmlNode *list = md != NULL ? child(md, VN_DOMXML_NS, "devices") : NULL;
    xmlNode *next;

    if (list == NULL) {
        return;
    }
    for (xmlNode *n = list->children; n != NULL; n = next) {
        xmlChar *name = NULL;

        next = n->next;
        if (vn_domxml_is_element(n, VN_DOMXML_NS, "device") &&
            (name = xmlGetNoNsProp(n, X("name"))) != NULL &&
            strcmp((const char *)name, device) == 0) {
            drop(n);
        }
        xmlFree(name);
    }
    if (!has_element_children(list)) {
        drop(list);
    }
}

/* Drop each "-device" pair whose JSON id is @alias, and the commandlines
 * that empties.  libvirt joins every commandline's args in order, so a pair
 * may straddle two. */
static void drop_args(xmlNode *root, const char *alias)
{
    xmlNode *prev = NULL, *next_cl;

    for (xmlNode *cl = root->children; cl != NULL; cl = next_cl) {
        xmlNode *next;

        next_cl = cl->next;
        if (!vn_domxml_is_element(cl, VN_DOMXML_QEMU_NS, "commandline")) {
            continue;
        }
        for (xmlNode *a = cl->children; a != NULL; a = next) {
            next = a->next;
            if (!vn_domxml_is_element(a, VN_DOMXML_QEMU_NS, "arg")) {
                continue;
            }
            if (prev != NULL && arg_is(prev, "-device")) {
                xmlChar *v = xmlGetNoNsProp(a, X("value"));
                g_autofree char *id = device_arg_id((const char *)v);

                xmlFree(v);
                if (g_strcmp0(id, alias) == 0) {
                    xmlNode *prev_cl = prev->parent;

                    drop(prev);
                    drop(a);
                    if (prev_cl != cl && !has_element_children(prev_cl)) {
                        drop(prev_cl);
                    }
                    prev = NULL;
                    continue;
                }
            }
            prev = a;
        }
        if (!has_element_children(cl)) {
            drop(cl);
        }
    }
}

bool vn_domedit_undeclare(const char *xml, size_t len, const char *device, char **out,
                          GError **error)
{
    /* Read once: checked as it is, then edited. */
    g_autoptr(xmlDoc) doc = vn_domxml_read(xml, len, error);
    g_autoptr(VnDomain) dom = doc != NULL ? vn_domxml_parse_doc(doc, error) : NULL;
    const VnDomDevice *d;
    xmlNode *root;

    *out = NULL;
    if (dom == NULL) {
        return false;
    }
    d = vn_domain_find(dom, device);
    if (d == NULL) {
        return true;
    }
    root = xmlDocGetRootElement(doc);
    drop_entry(root, device);
    drop_args(root, d->alias);
    *out = finish(doc, error);
    return *out != NULL;
}
