/*
 * Bounded JSON parsing (see json.h).
 */
#include "json.h"

#include <gio/gio.h>
#include <string.h>

/* Whether @c may stand outside a string: structure, whitespace, numbers, and the letters of
 * true, false and null (any lowercase letter: the parser checks the words). */
static bool outside_string(char c)
{
    return strchr("{}[]:,-+.eE \t\n\r", c) != NULL || g_ascii_isdigit(c) || (c >= 'a' && c <= 'z');
}

VnJsonShape vn_json_shape(const char *s, size_t len, unsigned max_depth)
{
    bool in_string = false;
    unsigned depth = 0;
    size_t i = 0;

    while (i < len && g_ascii_isspace(s[i])) {
        i++;
    }
    if (i == len || (s[i] != '{' && s[i] != '[')) {
        return VN_JSON_NOT_ONE;
    }
    for (; i < len; i++) {
        char c = s[i];

        if (c == '\0' || (in_string && (unsigned char)c < 0x20) ||
            (!in_string && c != '"' && !outside_string(c))) {
            return VN_JSON_NOT_JSON;
        }
        if (in_string) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > max_depth) {
                return VN_JSON_TOO_DEEP;
            }
        } else if ((c == '}' || c == ']') && --depth == 0) {
            break;
        }
    }
    /* Unclosed: the parser refuses it.  Closed: only whitespace may follow. */
    while (++i < len) {
        if (!g_ascii_isspace(s[i])) {
            return VN_JSON_NOT_ONE;
        }
    }
    return VN_JSON_ONE;
}

JsonNode *vn_json_parse(const char *text, gssize len, size_t max_len, GError **error)
{
    g_autoptr(JsonParser) parser = NULL;
    size_t n;

    if (text == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "no JSON text");
        return NULL;
    }
    /* Never look further than the bound, even for a NUL-terminated text. */
    n = len >= 0 ? (size_t)len : strnlen(text, max_len + 1);
    if (n > max_len) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE,
                    "JSON text longer than %zu bytes", max_len);
        return NULL;
    }
    switch (vn_json_shape(text, n, VN_MAX_JSON_DEPTH)) {
    case VN_JSON_TOO_DEEP:
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE,
                    "JSON nested deeper than %u levels", VN_MAX_JSON_DEPTH);
        return NULL;
    case VN_JSON_NOT_ONE:
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "not one JSON object or array");
        return NULL;
    case VN_JSON_NOT_JSON:
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "not JSON: a byte JSON does not allow where it is");
        return NULL;
    default:
        break;
    }
    parser = json_parser_new();
    if (!json_parser_load_from_data(parser, text, (gssize)n, error)) {
        return NULL;
    }
    if (json_parser_get_root(parser) == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "empty JSON text");
        return NULL;
    }
    return json_parser_steal_root(parser);
}

JsonObject *vn_json_parse_object(const char *text, gssize len, size_t max_len, GError **error)
{
    g_autoptr(GError) local = NULL;
    g_autoptr(JsonNode) root = vn_json_parse(text, len, max_len, &local);

    if (root == NULL && !g_error_matches(local, G_IO_ERROR, G_IO_ERROR_INVALID_DATA)) {
        g_propagate_error(error, g_steal_pointer(&local));
        return NULL;
    }
    if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "not a JSON object");
        return NULL;
    }
    return json_node_dup_object(root);
}

void vn_json_add_string_or_null(JsonBuilder *b, const char *member, const char *value)
{
    json_builder_set_member_name(b, member);
    if (value != NULL) {
        json_builder_add_string_value(b, value);
    } else {
        json_builder_add_null_value(b);
    }
}
