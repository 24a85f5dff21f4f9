/*
 * Bounded JSON parsing (see json.h).
 */
#include "json.h"

#include <gio/gio.h>
#include <string.h>

bool vn_json_depth_ok(const char *s, size_t len, unsigned max)
{
    bool in_string = false;
    unsigned depth = 0;

    for (size_t i = 0; i < len; i++) {
        char c = s[i];

        if (in_string) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if ((c == '{' || c == '[') && ++depth > max) {
            return false;
        } else if ((c == '}' || c == ']') && depth > 0) {
            depth--;
        }
    }
    return true;
}

/*
 * @s is one object or array and then only whitespace (an unclosed one is
 * left to the parser to refuse).  json-glib 1.6 keeps, and leaks, the value
 * it parsed when more text follows ("{} x", "[1] [2]", "7{}"): a peer
 * repeating that would grow us without bound.
 */
static bool json_single(const char *s, size_t len)
{
    bool in_string = false;
    unsigned depth = 0;
    size_t i = 0;

    while (i < len && g_ascii_isspace(s[i])) {
        i++;
    }
    if (i == len || (s[i] != '{' && s[i] != '[')) {
        return false;
    }
    for (; i < len; i++) {
        char c = s[i];

        if (in_string) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            break;
        }
    }
    while (++i < len) {
        if (!g_ascii_isspace(s[i])) {
            return false;
        }
    }
    return true;
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
    if (!vn_json_depth_ok(text, n, VN_MAX_JSON_DEPTH)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE,
                    "JSON nested deeper than %u levels", VN_MAX_JSON_DEPTH);
        return NULL;
    }
    if (!json_single(text, n)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "not one JSON object or array");
        return NULL;
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
