/*
 * The lending protocol's JSON encoding (see proto.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "proto.h"
#include "common/util.h"

#include "common/json.h"
#include "common/name.h"
#include "fabric/fabric.h"

#include <gio/gio.h>
#include <json-glib/json-glib.h>
#include <string.h>

static const char *const type_names[VN_PROTO_LAST] = {
    [VN_PROTO_INVALID] = "INVALID",   [VN_PROTO_ATTACH] = "ATTACH",
    [VN_PROTO_DETACH] = "DETACH",     [VN_PROTO_REGION_RW] = "REGION_RW",
    [VN_PROTO_DMA_MAP] = "DMA_MAP",   [VN_PROTO_DMA_UNMAP] = "DMA_UNMAP",
    [VN_PROTO_SET_IRQS] = "SET_IRQS", [VN_PROTO_RESET] = "RESET",
};

const char *vn_proto_type_to_string(uint32_t type)
{
    return type < VN_PROTO_LAST ? type_names[type] : "UNKNOWN";
}

static const char *const mode_names[VN_IRQ_MODE_LAST] = {
    [VN_IRQ_MODE_FD] = "fd",
    [VN_IRQ_MODE_RELAY] = "relay",
};

const char *vn_irq_mode_to_string(VnIrqMode mode)
{
    return mode < VN_IRQ_MODE_LAST ? mode_names[mode] : "unknown";
}

bool vn_irq_mode_from_string(const char *s, VnIrqMode *mode)
{
    for (int i = 0; i < VN_IRQ_MODE_LAST; i++) {
        if (s != NULL && strcmp(s, mode_names[i]) == 0) {
            *mode = (VnIrqMode)i;
            return true;
        }
    }
    return false;
}

/* ---- decoding helpers: every member is checked, nothing is trusted ---- */

/* @json as an object (owned); it came over the fabric, so its bound is a
 * fabric message's. */
static JsonObject *parse_object(const char *json, const char *what, GError **error)
{
    JsonObject *o = vn_json_parse_object(json, -1, VN_FABRIC_MAX_PAYLOAD, error);

    if (o == NULL) {
        g_prefix_error(error, "%s: ", what);
    }
    return o;
}

/* An unsigned integer member no larger than @max.  JSON numbers are int64
 * in json-glib, so values above INT64_MAX cannot be expressed (none of ours
 * needs them: sizes and addresses are below 2^63 on x86-64). */
static bool get_uint(JsonObject *o, const char *name, uint64_t max, uint64_t *out, const char *what,
                     GError **error)
{
    JsonNode *n = json_object_get_member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
        json_node_get_int(n) < 0 || (uint64_t)json_node_get_int(n) > max) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: \"%s\" must be an integer in 0..%" G_GUINT64_FORMAT, what, name, max);
        return false;
    }
    *out = (uint64_t)json_node_get_int(n);
    return true;
}

static bool get_u32(JsonObject *o, const char *name, uint32_t max, uint32_t *out, const char *what,
                    GError **error)
{
    uint64_t v;

    if (!get_uint(o, name, max, &v, what, error)) {
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

static bool get_bool(JsonObject *o, const char *name, bool *out, const char *what, GError **error)
{
    JsonNode *n = json_object_get_member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_BOOLEAN) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: \"%s\" must be true or false",
                    what, name);
        return false;
    }
    *out = json_node_get_boolean(n);
    return true;
}

static const char *get_string(JsonObject *o, const char *name, const char *what, GError **error)
{
    JsonNode *n = json_object_get_member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: \"%s\" must be a string", what,
                    name);
        return NULL;
    }
    return json_node_get_string(n);
}

static JsonArray *get_array(JsonObject *o, const char *name, guint max, const char *what,
                            GError **error)
{
    JsonNode *n = json_object_get_member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_ARRAY(n) ||
        json_array_get_length(json_node_get_array(n)) > max) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: \"%s\" must be an array of at most %u", what, name, max);
        return NULL;
    }
    return json_node_get_array(n);
}

static JsonObject *array_object(JsonArray *a, guint i, const char *what, GError **error)
{
    JsonNode *n = json_array_get_element(a, i);

    if (!JSON_NODE_HOLDS_OBJECT(n)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: element %u is not an object",
                    what, i);
        return NULL;
    }
    return json_node_get_object(n);
}

static char *finish(JsonBuilder *b)
{
    g_autoptr(JsonNode) root = NULL;

    json_builder_end_object(b);
    root = json_builder_get_root(b);
    return json_to_string(root, FALSE);
}

static void add_uint(JsonBuilder *b, const char *name, uint64_t v)
{
    json_builder_set_member_name(b, name);
    json_builder_add_int_value(b, (gint64)v);
}

static void add_bool(JsonBuilder *b, const char *name, bool v)
{
    json_builder_set_member_name(b, name);
    json_builder_add_boolean_value(b, v);
}

static void add_device(JsonBuilder *b, const char *device)
{
    json_builder_set_member_name(b, "device");
    json_builder_add_string_value(b, device);
}

/* Largest value we accept for an address or size: 2^63 - 1. */
#define U63 ((uint64_t)INT64_MAX)

/* ---- device description ---- */

char *vn_proto_device_to_json(const VnProtoDevice *d)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_uint(b, "flags", d->flags);
    json_builder_set_member_name(b, "regions");
    json_builder_begin_array(b);
    for (uint32_t i = 0; i < d->num_regions; i++) {
        const VnProtoRegion *r = &d->regions[i];

        json_builder_begin_object(b);
        add_uint(b, "size", r->size);
        add_uint(b, "flags", r->flags);
        add_uint(b, "segment", r->nr_segments > 0 ? r->segments[0] : 0);
        if (r->nr_segments > 1) {
            json_builder_set_member_name(b, "segments");
            json_builder_begin_array(b);
            for (uint32_t k = 0; k < r->nr_segments; k++) {
                json_builder_add_int_value(b, (gint64)r->segments[k]);
            }
            json_builder_end_array(b);
        }
        json_builder_set_member_name(b, "sparse");
        json_builder_begin_array(b);
        for (uint32_t a = 0; a < r->nr_sparse; a++) {
            json_builder_begin_object(b);
            add_uint(b, "offset", r->sparse[a].offset);
            add_uint(b, "size", r->sparse[a].size);
            json_builder_end_object(b);
        }
        json_builder_end_array(b);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "irqs");
    json_builder_begin_array(b);
    for (uint32_t i = 0; i < d->num_irqs; i++) {
        json_builder_begin_object(b);
        add_uint(b, "count", d->irq_count[i]);
        add_uint(b, "flags", d->irq_flags[i]);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    return finish(b);
}

/* "segments", when there: 2 or more ids, none 0, the first "segment". */
static bool segments_from_json(JsonObject *o, VnProtoRegion *r, const char *what, GError **error)
{
    JsonArray *a;

    if (!json_object_has_member(o, "segments")) {
        return true;
    }
    if (!(a = get_array(o, "segments", VN_PROTO_MAX_REGION_SEGMENTS, what, error))) {
        return false;
    }
    if (json_array_get_length(a) < 2 || r->nr_segments == 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: \"segments\" lists 2 or more, after a \"segment\"", what);
        return false;
    }
    for (guint k = 0; k < json_array_get_length(a); k++) {
        JsonNode *n = json_array_get_element(a, k);

        if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
            json_node_get_int(n) <= 0 ||
            (k == 0 && (uint64_t)json_node_get_int(n) != r->segments[0])) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "%s: \"segments\" element %u must be a segment id%s", what, k,
                        k == 0 ? " (\"segment\")" : "");
            return false;
        }
        r->segments[k] = (uint64_t)json_node_get_int(n);
    }
    r->nr_segments = json_array_get_length(a);
    return true;
}

static bool region_from_json(JsonObject *o, VnProtoRegion *r, GError **error)
{
    const char *what = "device description: region";
    JsonArray *sparse;

    if (!get_uint(o, "size", U63, &r->size, what, error) ||
        !get_u32(o, "flags", UINT32_MAX, &r->flags, what, error) ||
        !get_uint(o, "segment", U63, &r->segments[0], what, error)) {
        return false;
    }
    r->nr_segments = r->segments[0] != 0;
    if (!segments_from_json(o, r, what, error) ||
        !(sparse = get_array(o, "sparse", VN_MAX_SPARSE_AREAS, what, error))) {
        return false;
    }
    r->nr_sparse = json_array_get_length(sparse);
    for (uint32_t a = 0; a < r->nr_sparse; a++) {
        JsonObject *ao = array_object(sparse, a, what, error);

        if (ao == NULL || !get_uint(ao, "offset", U63, &r->sparse[a].offset, what, error) ||
            !get_uint(ao, "size", U63, &r->sparse[a].size, what, error)) {
            return false;
        }
        if (r->sparse[a].offset > r->size || r->sparse[a].size > r->size - r->sparse[a].offset) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "%s: sparse area %u lies outside the region", what, a);
            return false;
        }
    }
    return true;
}

bool vn_proto_device_from_json(const char *json, VnProtoDevice *d, GError **error)
{
    const char *what = "device description";
    g_autoptr(JsonObject) o = parse_object(json, what, error);
    JsonArray *regions, *irqs;

    memset(d, 0, sizeof(*d));
    if (o == NULL || !get_u32(o, "flags", UINT32_MAX, &d->flags, what, error) ||
        !(regions = get_array(o, "regions", VN_MAX_REGIONS, what, error)) ||
        !(irqs = get_array(o, "irqs", VN_MAX_IRQ_INDEXES, what, error))) {
        return false;
    }
    d->num_regions = json_array_get_length(regions);
    for (uint32_t i = 0; i < d->num_regions; i++) {
        JsonObject *ro = array_object(regions, i, what, error);

        if (ro == NULL || !region_from_json(ro, &d->regions[i], error)) {
            return false;
        }
    }
    d->num_irqs = json_array_get_length(irqs);
    for (uint32_t i = 0; i < d->num_irqs; i++) {
        JsonObject *io = array_object(irqs, i, what, error);

        if (io == NULL ||
            !get_u32(io, "count", VN_MAX_IRQ_VECTORS, &d->irq_count[i], what, error) ||
            !get_u32(io, "flags", UINT32_MAX, &d->irq_flags[i], what, error)) {
            return false;
        }
    }
    return true;
}

/* ---- requests ---- */

char *vn_proto_device_only_to_json(const char *device)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_device(b, device);
    return finish(b);
}

static bool corr_valid(const char *corr)
{
    size_t n = 0;

    for (; corr[n] != '\0'; n++) {
        if (n >= VN_TRACE_MAX_CORR - 1 ||
            !(g_ascii_isalnum(corr[n]) || strchr("._:-", corr[n]) != NULL)) {
            return false;
        }
    }
    return n > 0;
}

char *vn_proto_with_corr(const char *json, const char *corr)
{
    if (json == NULL || json[0] != '{' || !corr_valid(corr)) {
        return g_strdup(json);
    }
    return json[1] == '}' ? g_strdup_printf("{\"corr\":\"%s\"}", corr)
                          : g_strdup_printf("{\"corr\":\"%s\",%s", corr, json + 1);
}

bool vn_proto_device_name(const char *json, char out[VN_MAX_DEVICE_NAME + 1], GError **error)
{
    return vn_proto_device_and_corr(json, out, NULL, error);
}

bool vn_proto_device_and_corr(const char *json, char out[VN_MAX_DEVICE_NAME + 1],
                              char corr[VN_TRACE_MAX_CORR], GError **error)
{
    const char *what = "request";
    g_autoptr(JsonObject) o = parse_object(json, what, error);
    const char *dev, *c;

    if (o == NULL || !(dev = get_string(o, "device", what, error))) {
        return false;
    }
    if (corr != NULL) {
        c = vn_util_json_string(o, "corr");
        g_strlcpy(corr, c != NULL && corr_valid(c) ? c : "-", VN_TRACE_MAX_CORR);
    }
    if (!vn_name_valid(VN_NAME_DEVICE, dev)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: device name must be %s", what,
                    vn_name_rule(VN_NAME_DEVICE));
        return false;
    }
    g_strlcpy(out, dev, VN_MAX_DEVICE_NAME + 1);
    return true;
}

char *vn_proto_attach_to_json(const VnProtoAttach *a)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "device");
    json_builder_add_string_value(b, a->device);
    json_builder_set_member_name(b, "irq_mode");
    json_builder_add_string_value(b, vn_irq_mode_to_string(a->irq_mode));
    if (a->max_window != 0) {
        add_uint(b, "max_window", a->max_window);
    }
    if (a->resume) {
        json_builder_set_member_name(b, "resume");
        json_builder_add_boolean_value(b, TRUE);
    }
    return finish(b);
}

bool vn_proto_attach_from_json(const char *json, VnProtoAttach *a, GError **error)
{
    const char *what = "ATTACH";
    g_autoptr(JsonObject) o = parse_object(json, what, error);
    const char *dev, *mode;

    if (o == NULL || !(dev = get_string(o, "device", what, error)) ||
        !(mode = get_string(o, "irq_mode", what, error))) {
        return false;
    }
    if (!vn_name_valid(VN_NAME_DEVICE, dev)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: device name must be %s", what,
                    vn_name_rule(VN_NAME_DEVICE));
        return false;
    }
    if (!vn_irq_mode_from_string(mode, &a->irq_mode)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: irq_mode must be \"fd\" or \"relay\"", what);
        return false;
    }
    a->max_window = 0;
    if (json_object_has_member(o, "max_window") &&
        !get_uint(o, "max_window", U63, &a->max_window, what, error)) {
        return false;
    }
    a->resume = false;
    if (json_object_has_member(o, "resume") && !get_bool(o, "resume", &a->resume, what, error)) {
        return false;
    }
    g_strlcpy(a->device, dev, sizeof(a->device));
    return true;
}

char *vn_proto_region_rw_to_json(const char *device, const VnProtoRegionRw *r)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_device(b, device);
    add_uint(b, "region", r->region);
    add_uint(b, "offset", r->offset);
    add_uint(b, "count", r->count);
    add_bool(b, "write", r->write);
    return finish(b);
}

bool vn_proto_region_rw_from_json(const char *json, VnProtoRegionRw *r, GError **error)
{
    const char *what = "REGION_RW";
    g_autoptr(JsonObject) o = parse_object(json, what, error);

    return o != NULL && get_u32(o, "region", VN_MAX_REGIONS - 1, &r->region, what, error) &&
           get_uint(o, "offset", U63, &r->offset, what, error) &&
           get_u32(o, "count", VN_MAX_DATA_XFER, &r->count, what, error) &&
           get_bool(o, "write", &r->write, what, error);
}

char *vn_proto_dma_map_to_json(const char *device, const VnProtoDmaMap *m)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_device(b, device);
    add_uint(b, "iova", m->iova);
    add_uint(b, "size", m->size);
    add_uint(b, "segment", m->segment);
    add_uint(b, "offset", m->offset);
    add_uint(b, "prot", m->prot);
    if (m->peer[0] != '\0') {
        json_builder_set_member_name(b, "peer");
        json_builder_add_string_value(b, m->peer);
    }
    return finish(b);
}

bool vn_proto_dma_map_from_json(const char *json, VnProtoDmaMap *m, GError **error)
{
    const char *what = "DMA_MAP";
    g_autoptr(JsonObject) o = parse_object(json, what, error);

    if (o == NULL || !get_uint(o, "iova", U63, &m->iova, what, error) ||
        !get_uint(o, "size", U63, &m->size, what, error) ||
        !get_uint(o, "segment", U63, &m->segment, what, error) ||
        !get_uint(o, "offset", U63, &m->offset, what, error) ||
        !get_u32(o, "prot", VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, &m->prot, what,
                 error)) {
        return false;
    }
    m->peer[0] = '\0';
    if (json_object_has_member(o, "peer")) {
        const char *peer = get_string(o, "peer", what, error);

        if (peer == NULL) {
            return false;
        }
        if (!vn_name_valid(VN_NAME_NODE, peer)) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: \"peer\": %s", what,
                        vn_name_rule(VN_NAME_NODE));
            return false;
        }
        g_strlcpy(m->peer, peer, sizeof(m->peer));
    }
    if (m->size == 0 || m->iova + m->size < m->iova || m->offset + m->size < m->offset) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: empty or wrapping range",
                    what);
        return false;
    }
    return true;
}

char *vn_proto_dma_unmap_to_json(const char *device, const VnProtoDmaUnmap *u)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_device(b, device);
    add_uint(b, "iova", u->iova);
    add_uint(b, "size", u->size);
    add_bool(b, "all", u->all);
    return finish(b);
}

bool vn_proto_dma_unmap_from_json(const char *json, VnProtoDmaUnmap *u, GError **error)
{
    const char *what = "DMA_UNMAP";
    g_autoptr(JsonObject) o = parse_object(json, what, error);

    return o != NULL && get_uint(o, "iova", U63, &u->iova, what, error) &&
           get_uint(o, "size", U63, &u->size, what, error) &&
           get_bool(o, "all", &u->all, what, error);
}

char *vn_proto_set_irqs_to_json(const char *device, const VnProtoSetIrqs *s)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    add_device(b, device);
    add_uint(b, "flags", s->flags);
    add_uint(b, "index", s->index);
    add_uint(b, "start", s->start);
    add_uint(b, "count", s->count);
    add_bool(b, "relay", s->relay);
    add_uint(b, "doorbell", s->doorbell);
    return finish(b);
}

bool vn_proto_set_irqs_from_json(const char *json, VnProtoSetIrqs *s, GError **error)
{
    const char *what = "SET_IRQS";
    g_autoptr(JsonObject) o = parse_object(json, what, error);

    if (o == NULL ||
        !get_u32(o, "flags", VFIO_IRQ_SET_DATA_TYPE_MASK | VFIO_IRQ_SET_ACTION_TYPE_MASK, &s->flags,
                 what, error) ||
        !get_u32(o, "index", VN_MAX_IRQ_INDEXES - 1, &s->index, what, error) ||
        !get_u32(o, "start", VN_MAX_IRQ_VECTORS, &s->start, what, error) ||
        !get_u32(o, "count", VN_MAX_IRQ_VECTORS, &s->count, what, error) ||
        !get_bool(o, "relay", &s->relay, what, error) ||
        !get_u32(o, "doorbell", VN_FABRIC_MAX_DOORBELLS - 1, &s->doorbell, what, error)) {
        return false;
    }
    if ((uint64_t)s->start + s->count > VN_MAX_IRQ_VECTORS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: start + count above %u", what,
                    VN_MAX_IRQ_VECTORS);
        return false;
    }
    return true;
}
