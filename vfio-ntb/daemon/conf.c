/*
 * vfio-ntbd's configuration file (see config.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "conf.h"
#include "metrics.h"

#include "common/log.h"
#include "common/name.h"
#include "common/util.h"
#include "fabric/fabric.h"
#include "fabric/ntb.h"
#include "lending/backend.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <pwd.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool vn_conf_lend_managed(VnLendConf *l, const char *value, GError **error)
{
    bool yes = g_ascii_strcasecmp(value, "yes") == 0 || g_ascii_strcasecmp(value, "true") == 0;

    if (!yes && g_ascii_strcasecmp(value, "no") != 0 && g_ascii_strcasecmp(value, "false") != 0) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "managed = \"%.20s\": yes or no", value);
        return false;
    }
    if (yes && l->pci == NULL) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "managed = yes is for a PCI function (\"pci\"): a device server's "
                    "device has no driver of ours to change");
        return false;
    }
    l->managed = yes;
    return true;
}

static void lend_free(gpointer p);

/* UNIX socket paths: absolute (the daemon and its workers change no
 * directory, but a relative path in a config is a mistake waiting for one)
 * and short enough for sun_path. */
static bool socket_path_ok(const char *path)
{
    return path != NULL && path[0] == '/' && strlen(path) <= VN_CONF_MAX_SOCKET_PATH;
}

void vn_conf_lend_free(VnLendConf *l)
{
    lend_free(l);
}

const char *vn_conf_lend_backend(const VnLendConf *l)
{
    return l->pci != NULL ? "vfio" : "vfio-user";
}

const char *vn_conf_lend_where(const VnLendConf *l)
{
    return l->pci != NULL ? l->pci : l->socket;
}

VnLendConf *vn_conf_lend_new(const char *name, const char *socket, const char *pci,
                             const char *const *allow, GError **error)
{
    VnLendConf *l;

    if (!vn_name_valid(VN_NAME_DEVICE, name)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE, "a device name is %s",
                    vn_name_rule(VN_NAME_DEVICE));
        return NULL;
    }
    if ((socket == NULL) == (pci == NULL)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "a lent device has a \"socket\" (its vfio-user server) or a \"pci\" "
                    "address (a function of this host), not both");
        return NULL;
    }
    if (socket != NULL && !socket_path_ok(socket)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "the device server's socket must be an absolute path (at most %d bytes)",
                    VN_CONF_MAX_SOCKET_PATH);
        return NULL;
    }
    if (pci != NULL && !vn_backend_vfio_address_ok(pci)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "pci = \"%.40s\" is not a PCI address: DDDD:BB:DD.F in lower-case hex, "
                    "as lspci -D shows it",
                    pci);
        return NULL;
    }
    if (allow == NULL || allow[0] == NULL || g_strv_length((char **)allow) > VN_CONF_MAX_ALLOW) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "an access list names 1-%d nodes, or *", VN_CONF_MAX_ALLOW);
        return NULL;
    }
    for (const char *const *a = allow; *a != NULL; a++) {
        if (strcmp(*a, "*") != 0 && !vn_name_valid(VN_NAME_NODE, *a)) {
            g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                        "access list: \"%.40s\" is not a node name", *a);
            return NULL;
        }
    }
    l = g_new0(VnLendConf, 1);
    l->name = g_strdup(name);
    l->socket = g_strdup(socket);
    l->pci = g_strdup(pci);
    l->allow = g_strdupv((char **)allow);
    l->runtime = true;
    return l;
}

static void lend_free(gpointer p)
{
    VnLendConf *l = p;

    if (l == NULL) {
        return; /* taken by a reload (reload.c) */
    }
    g_free(l->name);
    g_free(l->socket);
    g_free(l->pci);
    g_strfreev(l->allow);
    g_free(l);
}

static void borrow_free(gpointer p)
{
    VnBorrowConf *b = p;

    g_free(b->name);
    g_free(b->lender);
    g_free(b->device);
    g_free(b->socket);
    g_free(b->domain);
    g_free(b);
}

void vn_conf_free(VnConfig *c)
{
    if (c == NULL) {
        return;
    }
    g_free(c->node);
    g_free(c->fabric);
    g_free(c->stats_file);
    g_free(c->metrics_file);
    g_free(c->state_dir);
    g_free(c->control_socket);
    g_free(c->run_dir);
    g_free(c->worker_user);
    g_free(c->qemu_user);
    g_clear_pointer(&c->fabric_params, g_hash_table_unref);
    g_clear_pointer(&c->lends, g_ptr_array_unref);
    g_clear_pointer(&c->borrows, g_ptr_array_unref);
    g_free(c);
}

/* ---- where each group and key is, for messages (and what GKeyFile lets pass) ---- */

/*
 * A config being read: the parsed file, and the line each group and key
 * ("GROUP" and "GROUP\nKEY") starts on, so every message can point at it.
 */
typedef struct ConfRead {
    GKeyFile *kf;
    GHashTable *lines; /* char* -> line number */
    const char *path;  /* NULL: "line N" */
} ConfRead;

static unsigned line_of(const ConfRead *p, const char *group, const char *key)
{
    g_autofree char *k = NULL;
    gpointer v = NULL;

    if (group == NULL) {
        return 0;
    }
    if (key != NULL) {
        k = g_strdup_printf("%s\n%s", group, key);
    }
    if (k == NULL || !g_hash_table_lookup_extended(p->lines, k, NULL, &v)) {
        v = g_hash_table_lookup(p->lines, group);
    }
    return GPOINTER_TO_UINT(v);
}

static char *where(const ConfRead *p, unsigned line)
{
    if (line == 0) {
        return p->path != NULL ? g_strdup_printf("%s: ", p->path) : g_strdup("");
    }
    return p->path != NULL ? g_strdup_printf("%s:%u: ", p->path, line)
                           : g_strdup_printf("line %u: ", line);
}

/* Prefix @error (set) with where @group's @key (or the group, or the file) is. */
static bool located(const ConfRead *p, const char *group, const char *key, GError **error)
{
    g_autofree char *at = where(p, line_of(p, group, key));

    g_prefix_error(error, "%s", at);
    return false;
}

/* The file's error at @group's @key (NULL: the group; a NULL group: the file). */
static bool fail(const ConfRead *p, GError **error, const char *group, const char *key,
                 const char *fmt, ...) G_GNUC_PRINTF(5, 6);
/* The same at @line. */
static bool fail_line(const ConfRead *p, GError **error, unsigned line, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static bool fail(const ConfRead *p, GError **error, const char *group, const char *key,
                 const char *fmt, ...)
{
    g_autofree char *msg = NULL;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error_literal(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE, msg);
    return located(p, group, key, error);
}

static bool fail_line(const ConfRead *p, GError **error, unsigned line, const char *fmt, ...)
{
    g_autofree char *msg = NULL, *at = where(p, line);
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_PARSE, "%s%s", at, msg);
    return false;
}

/*
 * A pass over the text before GKeyFile reads it, for what GKeyFile accepts
 * silently: a group or a key given twice (it merges them, the last value
 * winning, so "name = hosty" after "name = hostx" starts "hosty"), a
 * comment after a value (it is part of the value), and [fabric] dir (it
 * would override [node] fabric-dir).  It also notes each line for messages,
 * and says which line is not a group, a key or a comment (GKeyFile's own
 * message names no line).  GKeyFile's line rules: leading blanks skipped,
 * "#" starts a comment line, "[...]" a group, "key = value" with blanks
 * around "=" trimmed.
 */
static bool scan(const char *text, ConfRead *p, GError **error)
{
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    const char *group = NULL;

    for (unsigned i = 0; lines[i] != NULL; i++) {
        unsigned n = i + 1, first;
        char *s = g_strstrip(lines[i]); /* also the '\r' of a CRLF file */
        char *eq, *value, *hash;
        g_autofree char *k = NULL;

        if (*s == '\0' || *s == '#') {
            continue;
        }
        if (*s == '[') {
            char *close = strchr(s, ']');

            if (close == NULL || close[1] != '\0' || close == s + 1) {
                return fail_line(p, error, n, "\"%.60s\" is not a [group] header", s);
            }
            *close = '\0';
            first = GPOINTER_TO_UINT(g_hash_table_lookup(p->lines, s + 1));
            if (first != 0) {
                return fail_line(p, error, n,
                                 "[%.60s] again (first at line %u): a group is written once", s + 1,
                                 first);
            }
            g_hash_table_insert(p->lines, g_strdup(s + 1), GUINT_TO_POINTER(n));
            /* The table's own copy of the name: it outlives @lines. */
            g_hash_table_lookup_extended(p->lines, s + 1, (gpointer *)&group, NULL);
            continue;
        }
        eq = strchr(s, '=');
        if (eq == NULL || eq == s) {
            return fail_line(p, error, n,
                             "\"%.60s\" is not \"key = value\", a [group] or a # comment", s);
        }
        if (group == NULL) {
            return fail_line(p, error, n, "\"%.60s\" comes before any [group]", s);
        }
        *eq = '\0';
        value = g_strchug(eq + 1);
        g_strchomp(s);
        k = g_strdup_printf("%s\n%s", group, s);
        first = GPOINTER_TO_UINT(g_hash_table_lookup(p->lines, k));
        if (first != 0) {
            return fail_line(p, error, n,
                             "[%.60s] %.60s = \"%.60s\": \"%.60s\" again (first at line %u): "
                             "a key is given once",
                             group, s, value, s, first);
        }
        /* A '#' that starts the value or follows a blank starts a comment
         * the author meant; one inside a word ("/run/a#b.sock") is text. */
        for (hash = strchr(value, '#'); hash != NULL; hash = strchr(hash + 1, '#')) {
            if (hash == value || hash[-1] == ' ' || hash[-1] == '\t') {
                return fail_line(p, error, n,
                                 "[%.60s] %.60s = \"%.60s\": a comment after a value (\"%.40s\"); "
                                 "a comment is a whole line starting with #",
                                 group, s, value, hash);
            }
        }
        if (strcmp(group, "fabric") == 0 && strcmp(s, "dir") == 0) {
            return fail_line(p, error, n,
                             "[fabric] dir = \"%.60s\": the shm fabric's directory is "
                             "[node] fabric-dir",
                             value);
        }
        g_hash_table_insert(p->lines, g_steal_pointer(&k), GUINT_TO_POINTER(n));
    }
    return true;
}

static bool keys_known(const ConfRead *p, const char *group, const char *const *known,
                       GError **error)
{
    g_auto(GStrv) keys = g_key_file_get_keys(p->kf, group, NULL, error);

    if (keys == NULL) {
        return false;
    }
    for (char **k = keys; *k != NULL; k++) {
        if (known != NULL && !g_strv_contains(known, *k)) {
            return fail(p, error, group, *k, "[%s]: unknown key \"%s\"", group, *k);
        }
    }
    return true;
}

static char *need(const ConfRead *p, const char *group, const char *key, GError **error)
{
    g_autofree char *v = g_key_file_get_string(p->kf, group, key, NULL);

    if (v == NULL || v[0] == '\0') {
        fail(p, error, group, key, "[%s]: \"%s\" is required", group, key);
        return NULL;
    }
    return g_steal_pointer(&v);
}

/* sriov-vfs = N on a physical function: 1..VN_CONF_MAX_VFS, and each VF's
 * name (NAME-vfK) must be a device name too. */
static bool parse_sriov(const ConfRead *p, const char *group, VnLendConf *l, GError **error)
{
    g_autofree char *text = g_key_file_get_string(p->kf, group, "sriov-vfs", NULL);
    g_autofree char *last = NULL;
    guint64 n = 0;

    if (text == NULL ||
        !g_ascii_string_to_unsigned(g_strstrip(text), 10, 1, VN_CONF_MAX_VFS, &n, NULL)) {
        return fail(p, error, group, "sriov-vfs",
                    "[%s]: sriov-vfs = \"%.20s\": 1-%d virtual functions", group,
                    text != NULL ? text : "", VN_CONF_MAX_VFS);
    }
    last = g_strdup_printf("%s-vf%u", l->name, (unsigned)n - 1);
    if (l->pci == NULL || !vn_name_valid(VN_NAME_DEVICE, last)) {
        return fail(p, error, group, "sriov-vfs",
                    "[%s]: sriov-vfs is for a physical function (\"pci\") whose VFs' names "
                    "(%s) are device names",
                    group, last);
    }
    l->sriov_vfs = (unsigned)n;
    return true;
}

/* Which key of a [lend] section vn_conf_lend_new()'s refusal is about. */
static const char *lend_key(const GError *e)
{
    if (strstr(e->message, "socket") != NULL && strstr(e->message, "not both") == NULL) {
        return "socket";
    }
    if (strstr(e->message, "PCI address") != NULL) {
        return "pci";
    }
    return strstr(e->message, "access list") != NULL ? "allow" : NULL;
}

static bool parse_lend(const ConfRead *p, const char *group, VnConfig *c, GError **error)
{
    static const char *const known[] = { "socket", "pci", "managed", "sriov-vfs", "allow", NULL };
    g_autofree char *socket = NULL, *pci = NULL, *managed = NULL, *value = NULL;
    g_auto(GStrv) allow = NULL;
    VnLendConf *l;

    if (!keys_known(p, group, known, error)) {
        return false;
    }
    socket = g_key_file_get_string(p->kf, group, "socket", NULL);
    pci = g_key_file_get_string(p->kf, group, "pci", NULL);
    if (socket == NULL && pci == NULL) {
        return fail(p, error, group, NULL,
                    "[%s]: \"socket\" (a vfio-user server's) or \"pci\" (a function of "
                    "this host, DDDD:BB:DD.F) is required",
                    group);
    }
    /* Who may borrow is a decision, not a default: say it. */
    /* Separated as on ntbctl's command line (',') or as key files do (';'). */
    value = g_key_file_get_value(p->kf, group, "allow", NULL);
    allow = vn_name_split_list(value);
    if (allow[0] == NULL) {
        return fail(p, error, group, NULL,
                    "[%s]: \"allow\" is required: the nodes that may borrow it, "
                    "separated by ',' or ';', or * for any",
                    group);
    }
    /* The same checks as a device lent at run time (`ntbctl lend`). */
    l = vn_conf_lend_new(group + strlen("lend "), socket, pci, (const char *const *)allow, error);
    if (l == NULL) {
        g_prefix_error(error, "[%s]: ", group);
        return located(p, group, lend_key(*error), error);
    }
    l->runtime = false;
    managed = g_key_file_get_string(p->kf, group, "managed", NULL);
    if (managed != NULL && !vn_conf_lend_managed(l, g_strstrip(managed), error)) {
        g_prefix_error(error, "[%s]: ", group);
        lend_free(l);
        return located(p, group, "managed", error);
    }
    if (g_key_file_has_key(p->kf, group, "sriov-vfs", NULL) && !parse_sriov(p, group, l, error)) {
        lend_free(l);
        return false;
    }
    g_ptr_array_add(c->lends, l);
    return true;
}

/* "yes"/"true" or "no"/"false", any case: whether it is one, the answer in @out. */
static bool yes_or_no(const char *value, bool *out)
{
    bool yes = g_ascii_strcasecmp(value, "yes") == 0 || g_ascii_strcasecmp(value, "true") == 0;

    if (!yes && g_ascii_strcasecmp(value, "no") != 0 && g_ascii_strcasecmp(value, "false") != 0) {
        return false;
    }
    *out = yes;
    return true;
}

static bool parse_borrow(const ConfRead *p, const char *group, VnConfig *c, GError **error)
{
    static const char *const known[] = { "lender", "device", "socket", "irq-mode",
                                         "domain", "p2p",    NULL };
    g_autofree char *mode = NULL, *p2p = NULL;
    VnBorrowConf *b;

    if (!keys_known(p, group, known, error)) {
        return false;
    }
    b = g_new0(VnBorrowConf, 1);
    g_ptr_array_add(c->borrows, b);
    b->name = g_strdup(group + strlen("borrow "));
    if (!(b->lender = need(p, group, "lender", error)) ||
        !(b->socket = need(p, group, "socket", error))) {
        return false;
    }
    if (!vn_name_valid(VN_NAME_NODE, b->lender)) {
        return fail(p, error, group, "lender", "[%s]: lender \"%.40s\" is not a node name", group,
                    b->lender);
    }
    if (!socket_path_ok(b->socket)) {
        return fail(p, error, group, "socket",
                    "[%s]: socket must be an absolute path (at most %d bytes), not \"%.60s\"",
                    group, VN_CONF_MAX_SOCKET_PATH, b->socket);
    }
    b->device = g_key_file_get_string(p->kf, group, "device", NULL);
    if (b->device == NULL) {
        b->device = g_strdup(b->name);
    }
    if (!vn_name_valid(VN_NAME_DEVICE, b->device)) {
        return fail(p, error, group, "device", "[%s]: device \"%.80s\" must be %s", group,
                    b->device, vn_name_rule(VN_NAME_DEVICE));
    }
    b->domain = g_key_file_get_string(p->kf, group, "domain", NULL);
    if (b->domain == NULL) {
        b->domain = g_strdup(b->name);
    }
    if (!vn_name_valid(VN_NAME_DOMAIN, b->domain)) {
        return fail(p, error, group, "domain", "[%s]: domain \"%.80s\" must be %s", group,
                    b->domain, vn_name_rule(VN_NAME_DOMAIN));
    }
    p2p = g_key_file_get_string(p->kf, group, "p2p", NULL);
    if (p2p != NULL && !yes_or_no(g_strstrip(p2p), &b->p2p)) {
        return fail(p, error, group, "p2p", "[%s]: p2p = \"%.20s\": yes or no", group, p2p);
    }
    mode = g_key_file_get_string(p->kf, group, "irq-mode", NULL);
    if (mode != NULL && !vn_irq_mode_from_string(mode, &b->irq_mode)) {
        return fail(p, error, group, "irq-mode",
                    "[%s]: irq-mode must be fd or relay, not \"%.40s\"", group, mode);
    }
    return true;
}

/* [fabric]: the backend's parameters, checked as opening the fabric would
 * check them, without opening it (a bad one is a config error, exit 2,
 * not a start that fails, exit 1, and restarts in a loop). */
/* On an NTB each port names the node cabled to it (PORT=NODE): a peer that named itself
 * could take the name of a host that is down, and its leases with it. */
static bool ports_named(const ConfRead *p, VnConfig *c, GError **error)
{
    const char *ports = g_hash_table_lookup(c->fabric_params, "ports");
    g_auto(GStrv) each = NULL;

    if (strcmp(c->fabric, "ntb") != 0 || ports == NULL) {
        return true;
    }
    each = g_strsplit(ports, ",", -1);
    for (char **port = each; *port != NULL; port++) {
        if (strchr(*port, '=') == NULL) {
            return fail(p, error, "fabric", "ports",
                        "[fabric] ports: \"%.60s\" must name the node cabled to it "
                        "(PORT=NODE): a peer that names itself could take the name of a host "
                        "that is down",
                        g_strstrip(*port));
        }
    }
    return true;
}

static bool parse_fabric(const ConfRead *p, VnConfig *c, GError **error)
{
    g_auto(GStrv) keys = g_key_file_get_keys(p->kf, "fabric", NULL, NULL);
    g_autoptr(GError) local = NULL;
    const char *bad = NULL;

    for (char **k = keys; k != NULL && *k != NULL; k++) {
        g_hash_table_insert(c->fabric_params, g_strdup(*k),
                            g_key_file_get_string(p->kf, "fabric", *k, NULL));
    }
    /* A daemon's NTB sessions outlive its restarts (fabric/ntb-resume.c) unless told not. */
    if (strcmp(c->fabric, "ntb") == 0 && !g_hash_table_contains(c->fabric_params, "keep-ms")) {
        g_hash_table_insert(c->fabric_params, g_strdup("keep-ms"),
                            g_strdup_printf("%u", VN_NTB_DEFAULT_KEEP_MS));
    }
    if (vn_fabric_params_check(c->fabric, c->fabric_params, &bad, &local)) {
        return ports_named(p, c, error);
    }
    /* No such backend (a missing file a parameter names is that parameter's fault). */
    if (bad == NULL && g_error_matches(local, G_IO_ERROR, G_IO_ERROR_NOT_FOUND)) {
        return fail(p, error, "node", "fabric", "[node] fabric = \"%.40s\": %s", c->fabric,
                    local->message);
    }
    if (bad != NULL && strcmp(bad, "dir") == 0) {
        return fail(p, error, "node", "fabric-dir", "[node] fabric-dir: %s", local->message);
    }
    if (bad != NULL) {
        return fail(p, error, "fabric", bad, "[fabric] %s = \"%.60s\": %s", bad,
                    (const char *)g_hash_table_lookup(c->fabric_params, bad), local->message);
    }
    return fail(p, error, g_key_file_has_group(p->kf, "fabric") ? "fabric" : "node", NULL,
                "[fabric]: %s", local->message);
}

/* [node] @key, milliseconds in @min..@max; @dflt when absent. */
static bool get_ms(const ConfRead *p, const char *key, gint64 min, gint64 max, uint32_t dflt,
                   uint32_t *out, GError **error)
{
    g_autoptr(GError) local = NULL;
    g_autofree char *text = g_key_file_get_string(p->kf, "node", key, NULL);
    gint64 v;

    *out = dflt;
    if (text == NULL) {
        return true;
    }
    v = g_key_file_get_int64(p->kf, "node", key, &local);
    if (local != NULL || v < min || v > max) {
        return fail(p, error, "node", key,
                    "[node]: %s = \"%.20s\": %s must be %" G_GINT64_FORMAT "..%" G_GINT64_FORMAT,
                    key, text, key, min, max);
    }
    *out = (uint32_t)v;
    return true;
}

/* [node] @key, a user of this host who is not root, else @dflt when this host has that
 * user, else nobody (*@name stays NULL). */
static bool node_user(const ConfRead *p, const char *key, const char *dflt,
                      const char *why_not_root, char **name, uid_t *uid, gid_t *gid, GError **error)
{
    g_autofree char *given = g_key_file_get_string(p->kf, "node", key, NULL);
    struct passwd pw, *found = NULL;
    char buf[4096];

    getpwnam_r(given != NULL ? given : dflt, &pw, buf, sizeof(buf), &found);
    if (found == NULL && given != NULL) {
        return fail(p, error, "node", key, "[node] %s = \"%.40s\": no such user on this host", key,
                    given);
    }
    if (found != NULL && found->pw_uid == 0) {
        return fail(p, error, "node", key, "[node] %s = \"%.40s\": %s", key, found->pw_name,
                    why_not_root);
    }
    if (found != NULL) {
        *name = g_strdup(found->pw_name);
        *uid = found->pw_uid;
        *gid = found->pw_gid;
    }
    return true;
}

/* Who the borrower workers serve as ([node] worker-user, else VN_CONF_WORKER_USER when this
 * host has that user, else nobody else: they stay the daemon's user, and the daemon says so
 * when it starts), and whose the sockets for QEMU are ([node] qemu-user, else
 * VN_CONF_QEMU_USER where it exists, else root's). */
static bool node_users(const ConfRead *p, VnConfig *c, GError **error)
{
    return node_user(p, "worker-user", VN_CONF_WORKER_USER,
                     "uid 0 keeps every capability; name the unprivileged user workers serve as",
                     &c->worker_user, &c->worker_uid, &c->worker_gid, error) &&
           node_user(p, "qemu-user", VN_CONF_QEMU_USER,
                     "root's sockets are the default; name the user QEMU runs as", &c->qemu_user,
                     &c->qemu_uid, &c->qemu_gid, error);
}

static bool parse(const ConfRead *p, VnConfig *c, GError **error)
{
    static const char *const node_keys[] = { "name",
                                             "fabric",
                                             "fabric-dir",
                                             "stats-file",
                                             "metrics-file",
                                             "metrics-interval-ms",
                                             "state-dir",
                                             "control-socket",
                                             "run-dir",
                                             "lease-timeout-ms",
                                             "log-level",
                                             "worker-user",
                                             "qemu-user",
                                             "dma-unmap-linger-ms",
                                             NULL };
    GKeyFile *kf = p->kf;
    g_auto(GStrv) groups = g_key_file_get_groups(kf, NULL);
    g_autofree char *dir = NULL, *level = NULL;

    if (!g_key_file_has_group(kf, "node")) {
        return fail(p, error, NULL, NULL, "[node] is required");
    }
    if (!keys_known(p, "node", node_keys, error) || !(c->node = need(p, "node", "name", error))) {
        return false;
    }
    c->fabric = g_key_file_get_string(kf, "node", "fabric", NULL);
    if (c->fabric == NULL) {
        c->fabric = g_strdup("shm");
    }
    /* The shm fabric is a directory; an NTB's is its adapters ([fabric] ports). */
    if (strcmp(c->fabric, "shm") == 0 && !(dir = need(p, "node", "fabric-dir", error))) {
        return false;
    }
    if (strcmp(c->fabric, "shm") != 0 && g_key_file_has_key(kf, "node", "fabric-dir", NULL)) {
        return fail(p, error, "node", "fabric-dir",
                    "[node]: fabric-dir is the shm fabric's; the %.20s fabric has none", c->fabric);
    }
    c->stats_file = g_key_file_get_string(kf, "node", "stats-file", NULL);
    c->metrics_file = g_key_file_get_string(kf, "node", "metrics-file", NULL);
    c->state_dir = g_key_file_get_string(kf, "node", "state-dir", NULL);
    c->control_socket = g_key_file_get_string(kf, "node", "control-socket", NULL);
    if (c->control_socket == NULL) {
        c->control_socket = g_strdup("/run/vfio-ntb/control.sock");
    }
    c->run_dir = g_key_file_get_string(kf, "node", "run-dir", NULL);
    if (c->run_dir == NULL) {
        c->run_dir = g_strdup("/run/vfio-ntb");
    }
    if (!socket_path_ok(c->control_socket)) {
        return fail(p, error, "node", "control-socket",
                    "[node]: control-socket must be an absolute path (at most %d bytes), not "
                    "\"%.60s\"",
                    VN_CONF_MAX_SOCKET_PATH, c->control_socket);
    }
    {
        /* The daemon confines QEMU's sockets to run-dir by comparing paths:
         * every place it is told about must be absolute. */
        const struct {
            const char *key, *value;
        } paths[] = { { "fabric-dir", dir },
                      { "run-dir", c->run_dir },
                      { "state-dir", c->state_dir },
                      { "stats-file", c->stats_file },
                      { "metrics-file", c->metrics_file } };

        for (size_t i = 0; i < G_N_ELEMENTS(paths); i++) {
            if (paths[i].value != NULL && paths[i].value[0] != '/') {
                return fail(p, error, "node", paths[i].key,
                            "[node]: %s \"%.60s\" must be an absolute path", paths[i].key,
                            paths[i].value);
            }
        }
    }
    /* Bounded: 0 would expire leases on every blip, a day is surely a typo. */
    if (!get_ms(p, "lease-timeout-ms", 100, 86400000, VN_CONF_LEASE_TIMEOUT_MS,
                &c->lease_timeout_ms, error)) {
        return false;
    }
    /* Bounded by what a worker takes: a guest's unmapped page stays within the device's
     * reach for at most a second (borrower/borrower.h). */
    c->dma_unmap_linger_ms = -1;
    if (g_key_file_has_key(kf, "node", "dma-unmap-linger-ms", NULL)) {
        uint32_t ms;

        if (!get_ms(p, "dma-unmap-linger-ms", 0, 1000, 0, &ms, error)) {
            return false;
        }
        c->dma_unmap_linger_ms = (gint32)ms;
    }
    level = g_key_file_get_string(kf, "node", "log-level", NULL);
    c->log_level = VN_LOG_NOTICE;
    if (level != NULL && !(c->log_level_set = vn_log_level_from_string(level, &c->log_level))) {
        return fail(p, error, "node", "log-level",
                    "[node] log-level = \"%.20s\": error, warning, notice, info or debug", level);
    }
    /* Bounded (metrics.h): faster than any scrape only costs, slower than an
     * hour is not monitoring. */
    if (!get_ms(p, "metrics-interval-ms", VN_METRICS_MIN_INTERVAL_MS, VN_METRICS_MAX_INTERVAL_MS,
                VN_METRICS_DEFAULT_INTERVAL_MS, &c->metrics_interval_ms, error)) {
        return false;
    }
    if (!vn_name_valid(VN_NAME_NODE, c->node)) {
        return fail(p, error, "node", "name", "[node]: name \"%.80s\" must be %s", c->node,
                    vn_name_rule(VN_NAME_NODE));
    }
    if (!node_users(p, c, error)) {
        return false;
    }
    if (dir != NULL) {
        g_hash_table_insert(c->fabric_params, g_strdup("dir"), g_steal_pointer(&dir));
    }
    if (!parse_fabric(p, c, error)) {
        return false;
    }

    for (char **g = groups; *g != NULL; g++) {
        const char *name = strchr(*g, ' ') ? strchr(*g, ' ') + 1 : "";

        if (strcmp(*g, "node") == 0 || strcmp(*g, "fabric") == 0) {
            continue;
        }
        if (c->lends->len + c->borrows->len >= VN_CONF_MAX_DEVICES) {
            return fail(p, error, *g, NULL, "more than %d devices", VN_CONF_MAX_DEVICES);
        }
        if ((g_str_has_prefix(*g, "lend ") || g_str_has_prefix(*g, "borrow ")) &&
            !vn_name_valid(VN_NAME_DEVICE, name)) {
            /* A name lent here must be one every peer can borrow. */
            return fail(p, error, *g, NULL, "[%.80s]: the device name must be %s", *g,
                        vn_name_rule(VN_NAME_DEVICE));
        }
        if (g_str_has_prefix(*g, "lend ")) {
            if (!parse_lend(p, *g, c, error)) {
                return false;
            }
        } else if (g_str_has_prefix(*g, "borrow ")) {
            if (!parse_borrow(p, *g, c, error)) {
                return false;
            }
        } else {
            return fail(p, error, *g, NULL,
                        "unknown group [%s] (expected [node], [fabric], [lend NAME], "
                        "[borrow NAME])",
                        *g);
        }
    }
    return true;
}

static VnConfig *config_new(void)
{
    VnConfig *c = g_new0(VnConfig, 1);

    c->fabric_params = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    c->lends = g_ptr_array_new_with_free_func(lend_free);
    c->borrows = g_ptr_array_new_with_free_func(borrow_free);
    return c;
}

bool vn_lend_conf_allows(const VnLendConf *l, const char *node)
{
    for (char **a = l->allow; a != NULL && *a != NULL; a++) {
        if (strcmp(*a, "*") == 0 || strcmp(*a, node) == 0) {
            return true;
        }
    }
    return false;
}

static VnConfig *conf_read(const char *text, const char *path, GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GHashTable) lines = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_autoptr(VnConfig) c = config_new();
    ConfRead p = { .kf = kf, .lines = lines, .path = path };

    if (!scan(text, &p, error)) {
        return NULL;
    }
    if (!g_key_file_load_from_data(kf, text, (gsize)-1, G_KEY_FILE_NONE, error)) {
        located(&p, NULL, NULL, error);
        return NULL;
    }
    if (!parse(&p, c, error)) {
        return NULL;
    }
    return g_steal_pointer(&c);
}

VnConfig *vn_conf_parse(const char *text, GError **error)
{
    return conf_read(text, NULL, error);
}

/* A config file is small; a larger one is a mistake, not a config. */
#define VN_CONF_MAX_FILE (1024 * 1024)

/* @path's text, if it is a regular file of at most VN_CONF_MAX_FILE bytes:
 * checked before anything is read (a FIFO, /dev/zero or a huge file given
 * to --config or left for a reload must not block or fill the daemon), and
 * read with that cap in case it grows meanwhile. */
static char *read_file(const char *path, gsize *len_out, GError **error)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    g_autofree char *text = NULL;
    struct stat st;
    gsize len = 0;
    int err;

    if (fd < 0) {
        err = errno;
        g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(err), "%s: %s", path,
                    g_strerror(err));
        return NULL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > VN_CONF_MAX_FILE) {
        close(fd);
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED,
                    "%s: not a regular file of at most 1 MiB", path);
        return NULL;
    }
    text = g_malloc(VN_CONF_MAX_FILE + 2);
    for (ssize_t n = 1; n != 0 && len <= VN_CONF_MAX_FILE; len += n > 0 ? (gsize)n : 0) {
        n = read(fd, text + len, VN_CONF_MAX_FILE + 1 - len);
        if (n < 0 && errno != EINTR) {
            err = errno;
            close(fd);
            g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(err), "%s: %s", path,
                        g_strerror(err));
            return NULL;
        }
    }
    close(fd);
    if (len > VN_CONF_MAX_FILE) {
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "%s: larger than 1 MiB", path);
        return NULL;
    }
    text[len] = '\0';
    *len_out = len;
    return g_steal_pointer(&text);
}

VnConfig *vn_conf_load(const char *path, GError **error)
{
    g_autofree char *text = NULL;
    gsize len = 0;

    if ((text = read_file(path, &len, error)) == NULL) {
        return NULL;
    }
    if (memchr(text, '\0', len) != NULL) {
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "%s: not a text file", path);
        return NULL;
    }
    return conf_read(text, path, error);
}
