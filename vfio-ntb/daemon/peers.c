/*
 * The daemon-to-daemon protocol's codec (peers.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "peers.h"
#include "common/json.h"
#include "fabric/fabric.h"
#include "lending/backend.h"

#include <gio/gio.h>
#include <json-glib/json-glib.h>
#include <string.h>

/* Leases are JSON integers: at most 2^53, what any JSON reader keeps exact. */
#define VN_PEERS_MAX_LEASE (UINT64_C(1) << 53)

static const char *const type_names[] = {
    [VN_PEERS_ANNOUNCE - VN_PEERS_ANNOUNCE] = "ANNOUNCE",
    [VN_PEERS_BORROW - VN_PEERS_ANNOUNCE] = "BORROW",
    [VN_PEERS_RETURN - VN_PEERS_ANNOUNCE] = "RETURN",
    [VN_PEERS_REVOKE - VN_PEERS_ANNOUNCE] = "REVOKE",
    [VN_PEERS_P2P_SHARE - VN_PEERS_ANNOUNCE] = "P2P_SHARE",
    [VN_PEERS_P2P_ALLOW - VN_PEERS_ANNOUNCE] = "P2P_ALLOW",
};

const char *vn_peers_type_to_string(uint32_t type)
{
    if (type < VN_PEERS_ANNOUNCE || type >= VN_PEERS_TYPE_LAST) {
        return "?";
    }
    return type_names[type - VN_PEERS_ANNOUNCE];
}

/* ---- encoding ---- */

static char *finish(JsonBuilder *b)
{
    g_autoptr(JsonNode) root = json_builder_get_root(b);

    return json_to_string(root, FALSE);
}

static void add_str(JsonBuilder *b, const char *name, const char *value)
{
    json_builder_set_member_name(b, name);
    json_builder_add_string_value(b, value);
}

static void add_uint(JsonBuilder *b, const char *name, uint64_t value)
{
    json_builder_set_member_name(b, name);
    json_builder_add_int_value(b, (gint64)value);
}

static void add_segments(JsonBuilder *b, const uint64_t *segments, uint32_t n)
{
    json_builder_set_member_name(b, "segments");
    json_builder_begin_array(b);
    for (uint32_t k = 0; k < n; k++) {
        json_builder_add_int_value(b, (gint64)segments[k]);
    }
    json_builder_end_array(b);
}

char *vn_peers_announce_to_json(const VnPeersAnnounce *a)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_str(b, "node", a->node);
    if (a->version[0] != '\0') {
        add_str(b, "version", a->version);
    }
    if (a->answer) {
        json_builder_set_member_name(b, "answer");
        json_builder_add_boolean_value(b, TRUE);
    }
    json_builder_set_member_name(b, "devices");
    json_builder_begin_array(b);
    for (unsigned i = 0; i < a->n_devices; i++) {
        const VnPeersDevice *d = &a->devices[i];

        json_builder_begin_object(b);
        add_str(b, "name", d->name);
        add_str(b, "state", d->lent ? "lent" : "available");
        json_builder_set_member_name(b, "borrower");
        if (d->lent) {
            json_builder_add_string_value(b, d->borrower);
        } else {
            json_builder_add_null_value(b);
        }
        json_builder_set_member_name(b, "lease");
        if (d->lent) {
            json_builder_add_int_value(b, (gint64)d->lease);
        } else {
            json_builder_add_null_value(b);
        }
        if (d->id.known) {
            vn_peers_identity_add(b, &d->id);
        }
        if (d->denied) {
            json_builder_set_member_name(b, "denied");
            json_builder_add_boolean_value(b, TRUE);
        }
        if (d->server_down || d->server_gen > 0) {
            json_builder_set_member_name(b, "server");
            json_builder_begin_object(b);
            json_builder_set_member_name(b, "up");
            json_builder_add_boolean_value(b, !d->server_down);
            add_uint(b, "generation", d->server_gen);
            json_builder_end_object(b);
        }
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    /* The leases we hold, so each lender can end one we no longer claim. */
    json_builder_set_member_name(b, "holds");
    json_builder_begin_array(b);
    for (unsigned i = 0; i < a->n_holds; i++) {
        json_builder_begin_object(b);
        add_str(b, "lender", a->holds[i].lender);
        add_str(b, "name", a->holds[i].name);
        add_uint(b, "lease", a->holds[i].lease);
        if (a->holds[i].domain[0] != '\0') {
            add_str(b, "domain", a->holds[i].domain);
        }
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    return finish(b);
}

void vn_peers_identity_add(JsonBuilder *b, const VnIdentity *id)
{
    json_builder_set_member_name(b, "id");
    json_builder_begin_object(b);
    add_str(b, "pci", id->pci);
    add_uint(b, "vendor", id->vendor);
    add_uint(b, "device", id->device);
    add_uint(b, "class", id->class_code);
    add_str(b, "name", id->name);
    add_uint(b, "size", id->size);
    json_builder_end_object(b);
}

char *vn_peers_request_to_json(VnPeersType type, const VnPeersRequest *r)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_str(b, "device", r->device);
    if (type != VN_PEERS_BORROW) {
        add_uint(b, "lease", r->lease);
    }
    if (type == VN_PEERS_REVOKE) {
        add_uint(b, "grace_ms", r->grace_ms);
    }
    if (type == VN_PEERS_P2P_SHARE || type == VN_PEERS_P2P_ALLOW) {
        add_str(b, "node", r->node);
        add_segments(b, r->segments, r->nr_segments);
    }
    json_builder_end_object(b);
    return finish(b);
}

char *vn_peers_segments_to_json(const uint64_t *segments, uint32_t n)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_segments(b, segments, n);
    json_builder_end_object(b);
    return finish(b);
}

char *vn_peers_lease_to_json(uint64_t lease)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_uint(b, "lease", lease);
    json_builder_end_object(b);
    return finish(b);
}

/* ---- decoding ---- */

static bool bad(GError **error, const char *what, const char *member)
{
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: bad or missing \"%s\"", what,
                member);
    return false;
}

static JsonNode *member(JsonObject *o, const char *name)
{
    return o != NULL ? json_object_get_member(o, name) : NULL;
}

static bool get_name(JsonObject *o, const char *name, VnNameKind kind, char *out, size_t size,
                     const char *what, GError **error)
{
    JsonNode *n = member(o, name);
    const char *s;

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING ||
        !vn_name_valid(kind, (s = json_node_get_string(n))) || strlen(s) >= size) {
        return bad(error, what, name);
    }
    g_strlcpy(out, s, size);
    return true;
}

/* A release: "0.1.0", "1.2~rc1+deb12": [0-9A-Za-z.+~-], not empty. */
static bool get_version(JsonObject *o, char *out, size_t size)
{
    JsonNode *n = member(o, "version");
    const char *s;

    if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING) {
        return false;
    }
    s = json_node_get_string(n);
    if (*s == '\0' || strlen(s) >= size ||
        s[strspn(s, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+~-")] !=
            '\0') {
        return false;
    }
    g_strlcpy(out, s, size);
    return true;
}

/* An optional boolean member: false when absent; false returned when it is not a boolean. */
static bool get_optional_bool(JsonObject *o, const char *name, bool *out)
{
    JsonNode *n = member(o, name);

    *out = false;
    if (n == NULL) {
        return true;
    }
    if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_BOOLEAN) {
        return false;
    }
    *out = json_node_get_boolean(n);
    return true;
}

static bool get_uint(JsonObject *o, const char *name, uint64_t min, uint64_t max, uint64_t *out,
                     const char *what, GError **error)
{
    JsonNode *n = member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
        json_node_get_int(n) < 0 || (uint64_t)json_node_get_int(n) < min ||
        (uint64_t)json_node_get_int(n) > max) {
        return bad(error, what, name);
    }
    *out = (uint64_t)json_node_get_int(n);
    return true;
}

static bool is_null(JsonObject *o, const char *name)
{
    JsonNode *n = member(o, name);

    return n != NULL && JSON_NODE_HOLDS_NULL(n);
}

static JsonArray *get_array(JsonObject *o, const char *name, const char *what, GError **error)
{
    JsonNode *n = member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_ARRAY(n)) {
        bad(error, what, name);
        return NULL;
    }
    if (json_array_get_length(json_node_get_array(n)) > VN_CONF_MAX_DEVICES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: \"%s\" lists %u entries, more than a node has (%d)", what, name,
                    json_array_get_length(json_node_get_array(n)), VN_CONF_MAX_DEVICES);
        return NULL;
    }
    return json_node_get_array(n);
}

static JsonObject *element(JsonArray *a, guint i)
{
    JsonNode *e = json_array_get_element(a, i);

    return JSON_NODE_HOLDS_OBJECT(e) ? json_node_get_object(e) : NULL;
}

/* A peer's "id": bounded numbers, a PCI address, printable text. */
static bool identity_from_json(JsonObject *o, VnIdentity *id, const char *what, GError **error)
{
    JsonNode *pn = member(o, "pci"), *nn = member(o, "name");
    uint64_t v, dv, c;
    const char *s;

    if (o == NULL || pn == NULL || !JSON_NODE_HOLDS_VALUE(pn) ||
        json_node_get_value_type(pn) != G_TYPE_STRING ||
        !vn_backend_vfio_address_ok((s = json_node_get_string(pn))) || nn == NULL ||
        !JSON_NODE_HOLDS_VALUE(nn) || json_node_get_value_type(nn) != G_TYPE_STRING ||
        strlen(json_node_get_string(nn)) > VN_IDENTITY_MAX_NAME) {
        return bad(error, what, "id");
    }
    if (!get_uint(o, "vendor", 0, 0xffff, &v, what, error) ||
        !get_uint(o, "device", 0, 0xffff, &dv, what, error) ||
        !get_uint(o, "class", 0, 0xffffff, &c, what, error) ||
        !get_uint(o, "size", 0, INT64_MAX, &id->size, what, error)) {
        return false;
    }
    g_strlcpy(id->pci, s, sizeof(id->pci));
    g_strlcpy(id->name, json_node_get_string(nn), sizeof(id->name));
    vn_identity_clean_name(id->name);
    id->vendor = (uint16_t)v;
    id->device = (uint16_t)dv;
    id->class_code = (uint32_t)c;
    id->known = true;
    return true;
}

static bool device_from_json(JsonObject *o, VnPeersDevice *d, GError **error)
{
    const char *what = "announcement device";
    JsonNode *st = member(o, "state");
    const char *state;

    if (o == NULL) {
        return bad(error, what, "devices");
    }
    if (!get_name(o, "name", VN_NAME_DEVICE, d->name, sizeof(d->name), what, error)) {
        return false;
    }
    memset(&d->id, 0, sizeof(d->id));
    if (member(o, "id") != NULL && !identity_from_json(JSON_NODE_HOLDS_OBJECT(member(o, "id"))
                                                           ? json_node_get_object(member(o, "id"))
                                                           : NULL,
                                                       &d->id, what, error)) {
        return false;
    }
    if (st == NULL || !JSON_NODE_HOLDS_VALUE(st) || json_node_get_value_type(st) != G_TYPE_STRING) {
        return bad(error, what, "state");
    }
    /* Optional: "you may not borrow it" (its access list does not name you). */
    if (!get_optional_bool(o, "denied", &d->denied)) {
        return bad(error, what, "denied");
    }
    /* Optional: its device server, when it was ever lost. */
    d->server_down = false;
    d->server_gen = 0;
    if (member(o, "server") != NULL) {
        JsonNode *sn = member(o, "server");
        JsonObject *so = JSON_NODE_HOLDS_OBJECT(sn) ? json_node_get_object(sn) : NULL;
        JsonNode *up = so != NULL ? member(so, "up") : NULL;
        uint64_t gen;

        if (up == NULL || !JSON_NODE_HOLDS_VALUE(up) ||
            json_node_get_value_type(up) != G_TYPE_BOOLEAN) {
            return bad(error, what, "server");
        }
        if (!get_uint(so, "generation", 0, G_MAXUINT32, &gen, what, error)) {
            return false;
        }
        d->server_down = !json_node_get_boolean(up);
        d->server_gen = (uint32_t)gen;
    }
    state = json_node_get_string(st);
    d->lent = strcmp(state, "lent") == 0;
    if (!d->lent && strcmp(state, "available") != 0) {
        return bad(error, what, "state");
    }
    if (!d->lent) {
        d->borrower[0] = '\0';
        d->lease = 0;
        /* absent or null: both mean none */
        return (member(o, "borrower") == NULL || is_null(o, "borrower")) &&
                       (member(o, "lease") == NULL || is_null(o, "lease"))
                   ? true
                   : bad(error, what, "borrower");
    }
    return get_name(o, "borrower", VN_NAME_NODE, d->borrower, sizeof(d->borrower), what, error) &&
           get_uint(o, "lease", 1, VN_PEERS_MAX_LEASE, &d->lease, what, error);
}

bool vn_peers_announce_from_json(const char *json, const char *from, VnPeersAnnounce *out,
                                 GError **error)
{
    g_autoptr(JsonObject) o = vn_json_parse_object(json, -1, VN_FABRIC_MAX_PAYLOAD, error);
    const char *what = "announcement";
    JsonArray *devs, *holds = NULL;

    if (o == NULL) {
        g_prefix_error(error, "%s: ", what);
        return false;
    }
    if (!get_name(o, "node", VN_NAME_NODE, out->node, sizeof(out->node), what, error)) {
        return false;
    }
    if (strcmp(out->node, from) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: %s speaks for another node (%s)", what, from, out->node);
        return false;
    }
    if ((devs = get_array(o, "devices", what, error)) == NULL) {
        return false;
    }
    /* "version" is optional (older daemons send none); shown, never acted on. */
    if (member(o, "version") != NULL && !get_version(o, out->version, sizeof(out->version))) {
        return bad(error, what, "version");
    }
    if (!get_optional_bool(o, "answer", &out->answer)) {
        return bad(error, what, "answer");
    }
    /* "holds" is optional: an announcement from before leases were claimed. */
    if (member(o, "holds") != NULL && (holds = get_array(o, "holds", what, error)) == NULL) {
        return false;
    }
    out->n_devices = json_array_get_length(devs);
    for (unsigned i = 0; i < out->n_devices; i++) {
        if (!device_from_json(element(devs, i), &out->devices[i], error)) {
            return false;
        }
        for (unsigned j = 0; j < i; j++) {
            if (strcmp(out->devices[j].name, out->devices[i].name) == 0) {
                return bad(error, what, "devices"); /* listed twice */
            }
        }
    }
    out->n_holds = holds != NULL ? json_array_get_length(holds) : 0;
    for (unsigned i = 0; i < out->n_holds; i++) {
        JsonObject *h = element(holds, i);
        VnPeersHold *x = &out->holds[i];

        if (h == NULL ||
            !get_name(h, "lender", VN_NAME_NODE, x->lender, sizeof(x->lender), what, error) ||
            !get_name(h, "name", VN_NAME_DEVICE, x->name, sizeof(x->name), what, error) ||
            !get_uint(h, "lease", 1, VN_PEERS_MAX_LEASE, &x->lease, what, error)) {
            return h == NULL ? bad(error, what, "holds") : false;
        }
        /* Optional: where the holder serves it (shown by the lender). */
        if (member(h, "domain") != NULL &&
            !get_name(h, "domain", VN_NAME_DOMAIN, x->domain, sizeof(x->domain), what, error)) {
            return false;
        }
    }
    return true;
}

static bool get_segments(JsonObject *o, uint64_t *segments, uint32_t *n, const char *what,
                         GError **error);

bool vn_peers_request_from_json(VnPeersType type, const char *json, VnPeersRequest *out,
                                GError **error)
{
    g_autoptr(JsonObject) o = vn_json_parse_object(json, -1, VN_FABRIC_MAX_PAYLOAD, error);
    const char *what = vn_peers_type_to_string(type);
    uint64_t grace = 0;

    memset(out, 0, sizeof(*out));
    if (o == NULL) {
        g_prefix_error(error, "%s: ", what);
        return false;
    }
    if (type == VN_PEERS_ANNOUNCE || type < VN_PEERS_ANNOUNCE || type >= VN_PEERS_TYPE_LAST) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "not a request type: 0x%x", type);
        return false;
    }
    if (!get_name(o, "device", VN_NAME_DEVICE, out->device, sizeof(out->device), what, error)) {
        return false;
    }
    if (type != VN_PEERS_BORROW &&
        !get_uint(o, "lease", 1, VN_PEERS_MAX_LEASE, &out->lease, what, error)) {
        return false;
    }
    if (type == VN_PEERS_REVOKE) {
        if (!get_uint(o, "grace_ms", 0, VN_PEERS_MAX_GRACE_MS, &grace, what, error)) {
            return false;
        }
        out->grace_ms = (uint32_t)grace;
    }
    if (type == VN_PEERS_P2P_SHARE || type == VN_PEERS_P2P_ALLOW) {
        return get_name(o, "node", VN_NAME_NODE, out->node, sizeof(out->node), what, error) &&
               get_segments(o, out->segments, &out->nr_segments, what, error);
    }
    return true;
}

/* "segments": 1..VN_PEERS_MAX_SEGMENTS ids, each > 0 and a JSON-exact integer. */
static bool get_segments(JsonObject *o, uint64_t *segments, uint32_t *n, const char *what,
                         GError **error)
{
    JsonNode *node = member(o, "segments");
    JsonArray *a;

    if (node == NULL || !JSON_NODE_HOLDS_ARRAY(node)) {
        return bad(error, what, "segments");
    }
    a = json_node_get_array(node);
    *n = json_array_get_length(a);
    if (*n == 0 || *n > VN_PEERS_MAX_SEGMENTS) {
        return bad(error, what, "segments");
    }
    for (uint32_t k = 0; k < *n; k++) {
        JsonNode *e = json_array_get_element(a, k);

        if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_INT64 ||
            json_node_get_int(e) <= 0 || (uint64_t)json_node_get_int(e) > VN_PEERS_MAX_LEASE) {
            return bad(error, what, "segments");
        }
        segments[k] = (uint64_t)json_node_get_int(e);
    }
    return true;
}

bool vn_peers_segments_from_json(const char *json, uint64_t *segments, uint32_t n, GError **error)
{
    g_autoptr(JsonObject) o = vn_json_parse_object(json, -1, VN_FABRIC_MAX_PAYLOAD, error);
    uint64_t got[VN_PEERS_MAX_SEGMENTS];
    uint32_t count = 0;

    if (o == NULL) {
        g_prefix_error(error, "P2P_SHARE reply: ");
        return false;
    }
    if (!get_segments(o, got, &count, "P2P_SHARE reply", error)) {
        return false;
    }
    if (count != n) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "P2P_SHARE reply: %u segments for %u asked", count, n);
        return false;
    }
    memcpy(segments, got, n * sizeof(got[0]));
    return true;
}

bool vn_peers_lease_from_json(const char *json, uint64_t *lease, GError **error)
{
    g_autoptr(JsonObject) o = vn_json_parse_object(json, -1, VN_FABRIC_MAX_PAYLOAD, error);

    if (o == NULL) {
        g_prefix_error(error, "BORROW reply: ");
        return false;
    }
    return get_uint(o, "lease", 1, VN_PEERS_MAX_LEASE, lease, "BORROW reply", error);
}

bool vn_peers_announce_holds(const VnPeersAnnounce *a, const char *lender, const char *name,
                             uint64_t lease)
{
    for (unsigned i = 0; i < a->n_holds; i++) {
        if (a->holds[i].lease == lease && strcmp(a->holds[i].lender, lender) == 0 &&
            strcmp(a->holds[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}
