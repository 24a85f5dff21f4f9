/*
 * The name rule (see name.h).
 */
#include "name.h"

#include <glib.h>
#include <string.h>

typedef struct Rule {
    const char *what;
    unsigned max;
    bool lower_only; /* [a-z0-9-] only */
    bool letter_first;
    const char *suffix; /* required ending, or NULL */
    const char *words;
} Rule;

#define STR_(x) #x
#define STR(x) STR_(x)

static const Rule rules[VN_NAME_LAST] = {
    [VN_NAME_NODE] = { "node", VN_MAX_NODE_NAME, true, false, NULL,
                       "1-" STR(VN_MAX_NODE_NAME) " of [a-z0-9-], not starting with '-'" },
    [VN_NAME_DEVICE] = { "device", VN_MAX_DEVICE_NAME, false, false, NULL,
                         "1-" STR(VN_MAX_DEVICE_NAME) " of [A-Za-z0-9_.-], not . or .." },
    [VN_NAME_DOMAIN] = { "domain", VN_MAX_DOMAIN_NAME, false, false, NULL,
                         "1-" STR(VN_MAX_DOMAIN_NAME) " of [A-Za-z0-9_.-], not . or .." },
    [VN_NAME_QDEV_ID] = { "qdev id", VN_MAX_QDEV_ID, false, true, NULL,
                          "1-" STR(VN_MAX_QDEV_ID) " of [A-Za-z0-9_.-], a letter first" },
    [VN_NAME_SOCKET] = { "socket", VN_MAX_SOCKET_NAME, false, false, ".sock",
                         "1-" STR(VN_MAX_SOCKET_NAME) " of [A-Za-z0-9_.-] ending in .sock" },
};

/* The one set of characters a name may have. */
static bool char_ok(const Rule *r, char c)
{
    if (r->lower_only) {
        return g_ascii_islower(c) || g_ascii_isdigit(c) || c == '-';
    }
    return g_ascii_isalnum(c) || c == '_' || c == '.' || c == '-';
}

bool vn_name_valid(VnNameKind kind, const char *s)
{
    const Rule *r;
    size_t n;

    if (kind >= VN_NAME_LAST || s == NULL) {
        return false;
    }
    r = &rules[kind];
    n = strnlen(s, r->max + 1);
    if (n == 0 || n > r->max) {
        return false;
    }
    /* They become file names: never the directory itself or its parent. */
    if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0) {
        return false;
    }
    if ((r->lower_only && s[0] == '-') || (r->letter_first && !g_ascii_isalpha(s[0]))) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!char_ok(r, s[i])) {
            return false;
        }
    }
    /* (".sock" alone is a hidden file, not a socket's name) */
    return r->suffix == NULL || (n > strlen(r->suffix) && g_str_has_suffix(s, r->suffix));
}

const char *vn_name_rule(VnNameKind kind)
{
    return kind < VN_NAME_LAST ? rules[kind].words : "no name";
}

const char *vn_name_kind_to_string(VnNameKind kind)
{
    return kind < VN_NAME_LAST ? rules[kind].what : "unknown";
}

char **vn_name_split_list(const char *text)
{
    g_auto(GStrv) parts = g_strsplit_set(text != NULL ? text : "", ",;", -1);
    GPtrArray *out = g_ptr_array_new();

    for (char **p = parts; *p != NULL; p++) {
        g_strstrip(*p);
        if ((*p)[0] != '\0') {
            g_ptr_array_add(out, g_strdup(*p));
        }
    }
    g_ptr_array_add(out, NULL);
    return (char **)g_ptr_array_free(out, FALSE);
}
