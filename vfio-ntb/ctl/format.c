/*
 * ntbctl's human output (format.h).  Tables are aligned on the display
 * width of sanitized UTF-8 text; the last column is not padded, so lines
 * carry no trailing blanks.
 */
#define G_LOG_DOMAIN "vfio-ntb.ctl"

#include "ctl/format.h"
#include "ctl/table.h"

#include "common/util.h"
#include "client/ctl-client.h"

#include <string.h>

char *vn_ctl_format_sanitize(const char *s)
{
    g_autofree char *valid = g_utf8_make_valid(s, -1);
    GString *out = g_string_sized_new(strlen(valid));

    for (const char *p = valid; *p != '\0'; p = g_utf8_next_char(p)) {
        gunichar ch = g_utf8_get_char(p);

        /* g_unichar_iscntrl covers C0, DEL and C1 (U+0080-U+009F, which some
         * terminals take as CSI and friends). */
        if (g_unichar_iscntrl(ch)) {
            g_string_append_c(out, '?');
        } else {
            g_string_append_unichar(out, ch);
        }
    }
    return g_string_free(out, FALSE);
}

void vn_ctl_format_json(GString *out, JsonNode *ret, bool pretty)
{
    g_autoptr(JsonGenerator) gen = json_generator_new();
    g_autofree char *text = NULL;

    json_generator_set_pretty(gen, pretty);
    json_generator_set_root(gen, ret);
    text = json_generator_to_data(gen, NULL);
    g_string_append(out, text);
    g_string_append_c(out, '\n');
}

/* ---- values and shapes ---------------------------------------------------- */

static void malformed(GError **error, const char *cmd, guint index, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

/* index G_MAXUINT: the answer is not a list, so there is no entry to name. */
static void malformed(GError **error, const char *cmd, guint index, const char *fmt, ...)
{
    g_autofree char *msg = NULL;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    if (index == G_MAXUINT) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL, "malformed answer to %s: %s", cmd,
                    msg);
    } else {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL,
                    "malformed answer to %s: entry %u: %s", cmd, index, msg);
    }
}

/* A value as table text: null and missing "-", booleans yes/no, arrays
 * joined with ", ", objects as compact JSON; always sanitized. */
char *vn_ctl_format_value(JsonNode *n)
{
    if (n == NULL || JSON_NODE_HOLDS_NULL(n)) {
        return g_strdup("-");
    }
    if (JSON_NODE_HOLDS_ARRAY(n)) {
        JsonArray *a = json_node_get_array(n);
        GString *s = g_string_new(NULL);

        for (guint i = 0; i < json_array_get_length(a); i++) {
            g_autofree char *t = vn_ctl_format_value(json_array_get_element(a, i));

            g_string_append_printf(s, "%s%s", i > 0 ? ", " : "", t);
        }
        if (s->len == 0) {
            g_string_append_c(s, '-');
        }
        return g_string_free(s, FALSE);
    }
    if (JSON_NODE_HOLDS_OBJECT(n)) {
        g_autofree char *json = json_to_string(n, FALSE);

        return vn_ctl_format_sanitize(json);
    }
    switch (json_node_get_value_type(n)) {
    case G_TYPE_STRING:
        return vn_ctl_format_sanitize(json_node_get_string(n));
    case G_TYPE_INT64:
        return g_strdup_printf("%" G_GINT64_FORMAT, json_node_get_int(n));
    case G_TYPE_DOUBLE:
        return g_strdup_printf("%g", json_node_get_double(n));
    case G_TYPE_BOOLEAN:
        return g_strdup(json_node_get_boolean(n) ? "yes" : "no");
    default:
        return g_strdup("?");
    }
}

/* o's member name is of type (G_TYPE_STRING, G_TYPE_INT64, G_TYPE_BOOLEAN),
 * or null / missing when nullable. */
static bool member_is(JsonObject *o, const char *name, GType type, bool nullable, const char *cmd,
                      guint index, GError **error)
{
    JsonNode *n = json_object_get_member(o, name);
    const char *tname = type == G_TYPE_STRING  ? "a string"
                        : type == G_TYPE_INT64 ? "an integer"
                                               : "a boolean";

    if (n == NULL || JSON_NODE_HOLDS_NULL(n)) {
        if (nullable) {
            return true;
        }
        malformed(error, cmd, index, "\"%s\" is missing", name);
        return false;
    }
    if (json_node_get_value_type(n) != type) {
        malformed(error, cmd, index, "\"%s\" is not %s%s", name, tname, nullable ? " or null" : "");
        return false;
    }
    return true;
}

static JsonObject *want_object(JsonNode *n, const char *cmd, guint index, GError **error)
{
    if (n == NULL || !JSON_NODE_HOLDS_OBJECT(n)) {
        malformed(error, cmd, index, "not a JSON object");
        return NULL;
    }
    return json_node_get_object(n);
}

static JsonArray *want_array(JsonNode *n, const char *cmd, GError **error)
{
    if (n == NULL || !JSON_NODE_HOLDS_ARRAY(n)) {
        malformed(error, cmd, G_MAXUINT, "not a JSON array");
        return NULL;
    }
    return json_node_get_array(n);
}

static char *member_text(JsonObject *o, const char *name)
{
    return vn_ctl_format_value(json_object_get_member(o, name));
}

/* ---- queries -------------------------------------------------------------- */

/* A device's "id" (where it is on its lender, what lspci calls it) in one
 * line: "0000:3b:00.0 1b36:0010 Non-Volatile memory controller: ... (64 GiB)",
 * or "-" when the daemon knows none (a device server's). */
static gint64 int_member(JsonObject *o, const char *name)
{
    JsonNode *n = json_object_get_member(o, name);

    return n != NULL && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_INT64
               ? json_node_get_int(n)
               : 0;
}

static char *identity_text(JsonObject *o)
{
    JsonNode *n = json_object_get_member(o, "id");
    JsonObject *id = n != NULL && JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
    g_autofree char *pci = NULL, *name = NULL, *bytes = NULL;
    gint64 size;

    if (id == NULL || !json_object_has_member(id, "vendor") ||
        !json_object_has_member(id, "device")) {
        return g_strdup("-");
    }
    pci = member_text(id, "pci");
    name = member_text(id, "name");
    size = int_member(id, "size");
    bytes = size > 0 ? vn_util_size_text((uint64_t)size) : NULL;
    return g_strdup_printf(
        "%s %04x:%04x %s%s%s%s", pci, (unsigned)(int_member(id, "vendor") & 0xffff),
        (unsigned)(int_member(id, "device") & 0xffff), name, bytes != NULL ? " (" : "",
        bytes != NULL ? bytes : "", bytes != NULL ? ")" : "");
}

/* "1.5 s ago" from milliseconds, "-" for null or missing. */
static char *ago_text(JsonObject *o, const char *name)
{
    JsonNode *n = json_object_get_member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64) {
        return g_strdup("-");
    }
    return g_strdup_printf("%.1f s ago", (double)json_node_get_int(n) / 1000.0);
}

bool vn_ctl_format_nodes(GString *out, JsonNode *ret, GError **error)
{
    static const char *const header[] = { "NODE", "LINK", "DEVICES", "LAST SEEN", "VERSION" };
    static const char cmd[] = "query-nodes";
    g_autoptr(VnCtlTable) t = vn_ctl_table_new(G_N_ELEMENTS(header), header);
    JsonArray *a = want_array(ret, cmd, error);

    if (a == NULL) {
        return false;
    }
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonObject *o = want_object(json_array_get_element(a, i), cmd, i, error);

        if (o == NULL || !member_is(o, "node", G_TYPE_STRING, false, cmd, i, error) ||
            !member_is(o, "link", G_TYPE_STRING, false, cmd, i, error) ||
            !member_is(o, "devices", G_TYPE_INT64, false, cmd, i, error) ||
            !member_is(o, "last_seen_ms", G_TYPE_INT64, true, cmd, i, error) ||
            !member_is(o, "version", G_TYPE_STRING, true, cmd, i, error)) {
            return false;
        }
        vn_ctl_table_add(t, member_text(o, "node"));
        vn_ctl_table_add(t, member_text(o, "link"));
        vn_ctl_table_add(t, member_text(o, "devices"));
        vn_ctl_table_add(t, ago_text(o, "last_seen_ms"));
        vn_ctl_table_add(t, member_text(o, "version"));
    }
    vn_ctl_table_render(out, t);
    return true;
}

/* Member @name of @o when it is of @type, else NULL. */
static JsonNode *member_typed(JsonObject *o, const char *name, GType type)
{
    JsonNode *n = json_object_get_member(o, name);

    return n != NULL && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == type ? n : NULL;
}

/* The device's job as a user reads it: "revoke (2.1 s, asked by kernel)" (@owner: who
 * asked, else "revoke, 2.1 s" for a table's cell), or NULL. */
static char *job_text(JsonObject *o, bool with_owner)
{
    JsonNode *job = member_typed(o, "job", G_TYPE_STRING);
    JsonNode *ms = member_typed(o, "job_ms", G_TYPE_INT64);
    JsonNode *owner = member_typed(o, "job_owner", G_TYPE_STRING);
    g_autofree char *name = NULL, *by = NULL;

    if (job == NULL) {
        return NULL;
    }
    name = vn_ctl_format_sanitize(json_node_get_string(job));
    by = owner != NULL ? vn_ctl_format_sanitize(json_node_get_string(owner)) : NULL;
    if (ms == NULL) {
        return g_steal_pointer(&name);
    }
    if (!with_owner) {
        return g_strdup_printf("%s, %.1f s", name, (double)json_node_get_int(ms) / 1000.0);
    }
    return g_strdup_printf("%s (%.1f s%s%s)", name, (double)json_node_get_int(ms) / 1000.0,
                           by != NULL && by[0] != '\0' ? ", asked by " : "", by != NULL ? by : "");
}

/* "lent", or "lent (holder down, ends in 7.5 s)" while its lease runs out, "lent (revoked,
 * ends in 3.0 s)" while a revoke waits out its grace; "degraded (lender down, ends in
 * 2.0 s)" on a borrower whose lender is away; "lent (attach, 0.4 s)" while another job
 * runs. */
static char *state_text(JsonObject *o)
{
    g_autofree char *state = member_text(o, "state");
    JsonNode *n = member_typed(o, "expires_in_ms", G_TYPE_INT64);
    JsonNode *job = member_typed(o, "job", G_TYPE_STRING);
    bool revoke = job != NULL && strcmp(json_node_get_string(job), "revoke") == 0;

    if (n == NULL) {
        g_autofree char *what = job_text(o, false);

        return what != NULL ? g_strdup_printf("%s (%s)", state, what) : g_steal_pointer(&state);
    }
    return g_strdup_printf("%s (%s, ends in %.1f s)", state,
                           revoke                           ? "revoked"
                           : strcmp(state, "degraded") == 0 ? "lender down"
                                                            : "holder down",
                           (double)json_node_get_int(n) / 1000.0);
}

bool vn_ctl_format_devices(GString *out, JsonNode *ret, GError **error)
{
    static const char *const header[] = { "DEVICE", "STATE",    "BORROWER",
                                          "LEASE",  "ATTACHED", "IDENTITY" };
    static const char cmd[] = "query-devices";
    g_autoptr(VnCtlTable) t = vn_ctl_table_new(G_N_ELEMENTS(header), header);
    JsonArray *a = want_array(ret, cmd, error);

    if (a == NULL) {
        return false;
    }
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonObject *o = want_object(json_array_get_element(a, i), cmd, i, error);

        if (o == NULL || !member_is(o, "device", G_TYPE_STRING, false, cmd, i, error) ||
            !member_is(o, "state", G_TYPE_STRING, false, cmd, i, error) ||
            !member_is(o, "borrower", G_TYPE_STRING, true, cmd, i, error) ||
            !member_is(o, "lease", G_TYPE_INT64, true, cmd, i, error) ||
            !member_is(o, "attached_to", G_TYPE_STRING, true, cmd, i, error) ||
            !member_is(o, "expires_in_ms", G_TYPE_INT64, true, cmd, i, error) ||
            !member_is(o, "job", G_TYPE_STRING, true, cmd, i, error)) {
            return false;
        }
        vn_ctl_table_add(t, member_text(o, "device"));
        vn_ctl_table_add(t, state_text(o));
        vn_ctl_table_add(t, member_text(o, "borrower"));
        vn_ctl_table_add(t, member_text(o, "lease"));
        vn_ctl_table_add(t, member_text(o, "attached_to"));
        vn_ctl_table_add(t, identity_text(o));
    }
    vn_ctl_table_render(out, t);
    return true;
}

bool vn_ctl_format_device_names(GString *out, JsonNode *ret, GError **error)
{
    static const char cmd[] = "query-devices";
    JsonArray *a = want_array(ret, cmd, error);

    if (a == NULL) {
        return false;
    }
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonObject *o = want_object(json_array_get_element(a, i), cmd, i, error);
        g_autofree char *dev = NULL;

        if (o == NULL || !member_is(o, "device", G_TYPE_STRING, false, cmd, i, error)) {
            return false;
        }
        dev = member_text(o, "device");
        g_string_append_printf(out, "%s\n", dev);
    }
    return true;
}

/* Members shown in the job's line, not on their own. */
static bool in_job_line(const char *name)
{
    return strcmp(name, "job_ms") == 0 || strcmp(name, "job_owner") == 0;
}

bool vn_ctl_format_device(GString *out, JsonNode *ret, GError **error)
{
    static const char cmd[] = "query-device";
    JsonObject *o = want_object(ret, cmd, G_MAXUINT, error);
    g_autoptr(GList) names = NULL;
    glong width = 0;

    if (o == NULL || !member_is(o, "device", G_TYPE_STRING, false, cmd, G_MAXUINT, error) ||
        !member_is(o, "state", G_TYPE_STRING, false, cmd, G_MAXUINT, error) ||
        !member_is(o, "borrower", G_TYPE_STRING, true, cmd, G_MAXUINT, error) ||
        !member_is(o, "lease", G_TYPE_INT64, true, cmd, G_MAXUINT, error)) {
        return false;
    }
    /* Every member, in the daemon's order: what it adds later shows up
     * without a new ntbctl. */
    names = json_object_get_members(o);
    for (GList *l = names; l != NULL; l = l->next) {
        g_autofree char *key = vn_ctl_format_sanitize(l->data);

        if (!in_job_line(l->data)) {
            width = MAX(width, g_utf8_strlen(key, -1));
        }
    }
    for (GList *l = names; l != NULL; l = l->next) {
        g_autofree char *key =
            vn_ctl_format_sanitize(strcmp(l->data, "id") == 0 ? "identity" : l->data);
        g_autofree char *val =
            strcmp(l->data, "id") == 0 ? identity_text(o)
            : strcmp(l->data, "job") == 0 && member_typed(o, "job", G_TYPE_STRING)
                ? job_text(o, true)
                : member_text(o, l->data);

        if (in_job_line(l->data)) {
            continue;
        }

        g_string_append_printf(out, "%s:%*s %s\n", key, (int)(width - g_utf8_strlen(key, -1)), "",
                               val);
    }
    return true;
}

/* One counters row per member of o but "device"; nested objects (the
 * vfio-user server's counters) become "prefix.name" rows. */
static void stats_rows(VnCtlTable *t, JsonObject *o, const char *prefix)
{
    g_autoptr(GList) names = json_object_get_members(o);

    for (GList *l = names; l != NULL; l = l->next) {
        const char *name = l->data;
        JsonNode *n = json_object_get_member(o, name);
        g_autofree char *full =
            prefix != NULL ? g_strdup_printf("%s.%s", prefix, name) : g_strdup(name);

        if (prefix == NULL && strcmp(name, "device") == 0) {
            continue;
        }
        if (JSON_NODE_HOLDS_OBJECT(n)) {
            stats_rows(t, json_node_get_object(n), full);
            continue;
        }
        vn_ctl_table_add(t, vn_ctl_format_sanitize(full));
        vn_ctl_table_add(t, vn_ctl_format_value(n));
    }
}

static void stats_block(GString *out, const char *title, JsonObject *o)
{
    static const char *const header[] = { "COUNTER", "VALUE" };
    g_autoptr(VnCtlTable) t = vn_ctl_table_new(G_N_ELEMENTS(header), header);
    g_autofree char *clean = vn_ctl_format_sanitize(title);

    if (out->len > 0) {
        g_string_append_c(out, '\n'); /* a blank line between blocks */
    }
    g_string_append_printf(out, "%s\n", clean);
    stats_rows(t, o, NULL);
    vn_ctl_table_render(out, t);
}

/* A list of per-device counter objects; side ("lent") goes in the titles. */
static bool stats_devices(GString *out, JsonNode *list, const char *side, GError **error)
{
    static const char cmd[] = "query-stats";
    JsonArray *a = want_array(list, cmd, error);

    if (a == NULL) {
        return false;
    }
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonObject *o = want_object(json_array_get_element(a, i), cmd, i, error);
        g_autofree char *title = NULL;
        const char *dev;

        if (o == NULL || !member_is(o, "device", G_TYPE_STRING, false, cmd, i, error)) {
            return false;
        }
        dev = json_object_get_string_member(o, "device");
        title = side != NULL ? g_strdup_printf("%s (%s)", dev, side) : g_strdup(dev);
        stats_block(out, title, o);
    }
    return true;
}

/* Counters that stay at 0 while a guest works hard are right, not broken:
 * say why, under every answer (docs/operations.md "Metrics"). */
#define VN_CTL_STATS_NOTE                                                                     \
    "\n"                                                                                      \
    "Counted: what passes through vfio-ntb: fabric and lease messages, the accesses it\n"     \
    "forwards (config space, and BAR accesses only where it traps them), interrupts it\n"     \
    "relays (irq-mode relay), DMA map and unmap requests, resets.\n"                          \
    "Not counted: data-path I/O, which never passes through vfio-ntb: the guest's accesses\n" \
    "to mapped BARs, the device's DMA, and interrupts delivered as eventfds (irq-mode fd).\n"

/*
 * docs/control.md leaves the shape open ("counters per local device, lender
 * and borrower side"); accept what the daemon's stats file holds
 * ({"node", "fabric": {...}, "lent": [...], "borrowed": [...]}), a bare
 * list of per-device objects, or one device's object.
 */
bool vn_ctl_format_stats(GString *out, JsonNode *ret, GError **error)
{
    static const char cmd[] = "query-stats";
    g_autoptr(GString) text = g_string_new(NULL);
    JsonObject *o;
    JsonNode *n;
    bool known = false;

    if (ret != NULL && JSON_NODE_HOLDS_ARRAY(ret)) {
        if (!stats_devices(text, ret, NULL, error)) {
            return false;
        }
        known = true;
    } else if ((o = want_object(ret, cmd, G_MAXUINT, error)) == NULL) {
        return false;
    } else if (json_object_has_member(o, "device")) {
        if (!member_is(o, "device", G_TYPE_STRING, false, cmd, G_MAXUINT, error)) {
            return false;
        }
        stats_block(text, json_object_get_string_member(o, "device"), o);
        known = true;
    } else {
        /* The node's own: whether its state file is up to date. */
        g_autoptr(JsonObject) node = json_object_new();

        for (const char *const *k =
                 (const char *const[]){ "state_save_errors", "state_saved", "leases_lost", NULL };
             *k != NULL; k++) {
            if ((n = json_object_get_member(o, *k)) != NULL && JSON_NODE_HOLDS_VALUE(n)) {
                json_object_set_member(node, *k, json_node_copy(n));
            }
        }
        if (json_object_get_size(node) > 0) {
            stats_block(text, "node", node);
        }
        if ((n = json_object_get_member(o, "fabric")) != NULL) {
            if (!JSON_NODE_HOLDS_OBJECT(n)) {
                malformed(error, cmd, G_MAXUINT, "\"fabric\" is not an object");
                return false;
            }
            stats_block(text, "fabric", json_node_get_object(n));
            known = true;
        }
        if ((n = json_object_get_member(o, "lent")) != NULL) {
            if (!stats_devices(text, n, "lent", error)) {
                return false;
            }
            known = true;
        }
        if ((n = json_object_get_member(o, "borrowed")) != NULL) {
            if (!stats_devices(text, n, "borrowed", error)) {
                return false;
            }
            known = true;
        }
    }
    if (!known) {
        malformed(error, cmd, G_MAXUINT, "no \"device\", \"fabric\", \"lent\" or \"borrowed\"");
        return false;
    }
    if (text->len == 0) {
        g_string_append(text, "no counters\n");
    }
    g_string_append_len(out, text->str, (gssize)text->len);
    g_string_append(out, VN_CTL_STATS_NOTE);
    return true;
}

/* ---- actions ------------------------------------------------------------ */

/* The daemon says an action found nothing to do ("changed": false). */
static bool unchanged(JsonObject *o)
{
    JsonNode *n = json_object_get_member(o, "changed");

    return n != NULL && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_BOOLEAN &&
           !json_node_get_boolean(n);
}

bool vn_ctl_format_borrow(GString *out, const char *node, JsonNode *ret, GError **error)
{
    static const char cmd[] = "borrow";
    JsonObject *o = want_object(ret, cmd, G_MAXUINT, error);
    g_autofree char *dev = NULL;

    if (o == NULL || !member_is(o, "device", G_TYPE_STRING, false, cmd, G_MAXUINT, error) ||
        !member_is(o, "lease", G_TYPE_INT64, false, cmd, G_MAXUINT, error)) {
        return false;
    }
    dev = member_text(o, "device");
    g_string_append_printf(out, "%s %s %s (lease %" G_GINT64_FORMAT ")\n", node,
                           unchanged(o) ? "already holds" : "holds", dev,
                           json_object_get_int_member(o, "lease"));
    return true;
}

bool vn_ctl_format_attach(GString *out, const char *domain, JsonNode *ret, GError **error)
{
    static const char cmd[] = "attach";
    JsonObject *o = want_object(ret, cmd, G_MAXUINT, error);
    g_autofree char *dev = NULL;
    g_autofree char *sock = NULL;
    g_autofree char *dom = NULL;

    if (o == NULL || !member_is(o, "device", G_TYPE_STRING, false, cmd, G_MAXUINT, error) ||
        !member_is(o, "lease", G_TYPE_INT64, false, cmd, G_MAXUINT, error) ||
        !member_is(o, "socket", G_TYPE_STRING, false, cmd, G_MAXUINT, error)) {
        return false;
    }
    dev = member_text(o, "device");
    sock = member_text(o, "socket");
    dom = vn_ctl_format_sanitize(domain);
    g_string_append_printf(out,
                           "%s %s for %s (lease %" G_GINT64_FORMAT "): QEMU socket %s\n"
                           "(give the VM: -device "
                           "'{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\","
                           "\"path\":\"%s\"}}')\n",
                           unchanged(o) ? "already serving" : "serving", dev, dom,
                           json_object_get_int_member(o, "lease"), sock, sock);
    return true;
}

bool vn_ctl_format_revoke(GString *out, const char *device, JsonNode *ret, GError **error)
{
    static const char cmd[] = "revoke";
    JsonObject *o = want_object(ret, cmd, G_MAXUINT, error);

    if (o == NULL || !member_is(o, "forced", G_TYPE_BOOLEAN, false, cmd, G_MAXUINT, error)) {
        return false;
    }
    if (json_object_get_boolean_member(o, "forced")) {
        g_string_append_printf(out,
                               "revoked %s: the borrower did not let go within the "
                               "grace period, so the lender fenced it\n",
                               device);
    } else {
        g_string_append_printf(out, "revoked %s: the borrower let go\n", device);
    }
    return true;
}

bool vn_ctl_format_return(GString *out, const char *device, JsonNode *ret, GError **error)
{
    JsonObject *o = want_object(ret, "return", G_MAXUINT, error);

    if (o == NULL) {
        return false;
    }
    if (unchanged(o)) {
        g_string_append_printf(out, "%s was not borrowed here: nothing to return\n", device);
    } else {
        g_string_append_printf(out, "returned %s\n", device);
    }
    return true;
}

bool vn_ctl_format_detach(GString *out, const char *device, JsonNode *ret, GError **error)
{
    JsonObject *o = want_object(ret, "detach", G_MAXUINT, error);

    if (o == NULL) {
        return false;
    }
    if (unchanged(o)) {
        g_string_append_printf(out, "%s was not attached here: nothing to detach\n", device);
        return true;
    }
    g_string_append_printf(out,
                           "detached %s (still borrowed: `ntbctl return %s` gives it "
                           "back)\n",
                           device, device);
    return true;
}

bool vn_ctl_format_unplug(GString *out, const char *device, JsonNode *ret, GError **error)
{
    static const char cmd[] = "unplug";
    JsonObject *o = want_object(ret, cmd, G_MAXUINT, error);

    if (o == NULL || !member_is(o, "requested", G_TYPE_BOOLEAN, false, cmd, G_MAXUINT, error)) {
        return false;
    }
    if (!json_object_get_boolean_member(o, "requested")) {
        /* Not done, so not a success: a script can fall back on the exit code. */
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_GENERIC,
                    "%s: its QEMU takes no device requests, nothing was sent; unplug it with "
                    "QMP device_del (under libvirt: `ntbctl detach %s --domain D`)",
                    device, device);
        return false;
    }
    g_string_append_printf(out,
                           "asked the VM to release %s (device request); it is out once "
                           "the guest lets go\n",
                           device);
    return true;
}

bool vn_ctl_format_lend(GString *out, const char *node, const char *name, JsonNode *ret,
                        GError **error)
{
    if (want_object(ret, "lend", G_MAXUINT, error) == NULL) {
        return false;
    }
    g_string_append_printf(out, "%s lends %s/%s (`ntbctl unlend %s` stops it)\n", node, node, name,
                           name);
    return true;
}

bool vn_ctl_format_unlend(GString *out, const char *node, const char *name, JsonNode *ret,
                          GError **error)
{
    if (want_object(ret, "unlend", G_MAXUINT, error) == NULL) {
        return false;
    }
    g_string_append_printf(out, "%s no longer lends %s/%s\n", node, node, name);
    return true;
}

bool vn_ctl_format_trace(GString *out, const char *node, JsonNode *ret, GError **error)
{
    static const char cmd[] = "trace";
    JsonObject *o = want_object(ret, cmd, G_MAXUINT, error);
    g_autofree char *events = NULL;

    if (o == NULL || !member_is(o, "events", G_TYPE_STRING, false, cmd, G_MAXUINT, error) ||
        !member_is(o, "on", G_TYPE_INT64, false, cmd, G_MAXUINT, error) ||
        !member_is(o, "workers", G_TYPE_INT64, true, cmd, G_MAXUINT, error)) {
        return false;
    }
    events = member_text(o, "events");
    g_string_append_printf(
        out, "%s: %" G_GINT64_FORMAT " trace events on%s%s; %" G_GINT64_FORMAT " workers told\n",
        node, json_object_get_int_member(o, "on"), *events != '\0' ? ": " : "", events,
        json_object_get_int_member_with_default(o, "workers", 0));
    return true;
}

bool vn_ctl_format_trace_list(GString *out, JsonNode *ret, GError **error)
{
    static const char cmd[] = "query-trace";
    static const char *const header[] = { "EVENT", "ON" };
    JsonArray *a = want_array(ret, cmd, error);
    g_autoptr(VnCtlTable) t = vn_ctl_table_new(G_N_ELEMENTS(header), header);

    if (a == NULL) {
        return false;
    }
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonObject *o = want_object(json_array_get_element(a, i), cmd, i, error);

        if (o == NULL || !member_is(o, "event", G_TYPE_STRING, false, cmd, i, error) ||
            !member_is(o, "on", G_TYPE_BOOLEAN, false, cmd, i, error)) {
            return false;
        }
        vn_ctl_table_add(t, vn_ctl_format_sanitize(json_object_get_string_member(o, "event")));
        vn_ctl_table_add(t, g_strdup(json_object_get_boolean_member(o, "on") ? "yes" : "no"));
    }
    vn_ctl_table_render(out, t);
    return true;
}
