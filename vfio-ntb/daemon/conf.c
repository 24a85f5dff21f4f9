/*
 * vfio-ntbd's configuration file (see config.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "conf.h"
#include "metrics.h"

#include "common/name.h"
#include "common/util.h"
#include "fabric/fabric.h"
#include "lending/backend.h"

#include <gio/gio.h>
#include <string.h>

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
    g_clear_pointer(&c->fabric_params, g_hash_table_unref);
    g_clear_pointer(&c->lends, g_ptr_array_unref);
    g_clear_pointer(&c->borrows, g_ptr_array_unref);
    g_free(c);
}

static bool keys_known(GKeyFile *kf, const char *group, const char *const *known, GError **error)
{
    g_auto(GStrv) keys = g_key_file_get_keys(kf, group, NULL, error);

    if (keys == NULL) {
        return false;
    }
    for (char **k = keys; *k != NULL; k++) {
        if (known != NULL && !g_strv_contains(known, *k)) {
            g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_KEY_NOT_FOUND,
                        "[%s]: unknown key \"%s\"", group, *k);
            return false;
        }
    }
    return true;
}

static char *need(GKeyFile *kf, const char *group, const char *key, GError **error)
{
    g_autofree char *v = g_key_file_get_string(kf, group, key, NULL);

    if (v == NULL || v[0] == '\0') {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_KEY_NOT_FOUND,
                    "[%s]: \"%s\" is required", group, key);
        return NULL;
    }
    return g_steal_pointer(&v);
}

/* sriov-vfs = N on a physical function: 1..VN_CONF_MAX_VFS, and each VF's
 * name (NAME-vfK) must be a device name too. */
static bool parse_sriov(GKeyFile *kf, const char *group, VnLendConf *l, GError **error)
{
    g_autofree char *text = g_key_file_get_string(kf, group, "sriov-vfs", NULL);
    g_autofree char *last = NULL;
    guint64 n = 0;

    if (text == NULL ||
        !g_ascii_string_to_unsigned(g_strstrip(text), 10, 1, VN_CONF_MAX_VFS, &n, NULL)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[%s]: sriov-vfs = \"%.20s\": 1-%d virtual functions", group,
                    text != NULL ? text : "", VN_CONF_MAX_VFS);
        return false;
    }
    last = g_strdup_printf("%s-vf%u", l->name, (unsigned)n - 1);
    if (l->pci == NULL || !vn_name_valid(VN_NAME_DEVICE, last)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[%s]: sriov-vfs is for a physical function (\"pci\") whose VFs' names "
                    "(%s) are device names",
                    group, last);
        return false;
    }
    l->sriov_vfs = (unsigned)n;
    return true;
}

static bool parse_lend(GKeyFile *kf, const char *group, VnConfig *c, GError **error)
{
    static const char *const known[] = { "socket", "pci", "managed", "sriov-vfs", "allow", NULL };
    g_autofree char *socket = NULL, *pci = NULL, *managed = NULL;
    g_auto(GStrv) allow = NULL;
    VnLendConf *l;
    gsize n = 0;

    if (!keys_known(kf, group, known, error)) {
        return false;
    }
    socket = g_key_file_get_string(kf, group, "socket", NULL);
    pci = g_key_file_get_string(kf, group, "pci", NULL);
    if (socket == NULL && pci == NULL) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_KEY_NOT_FOUND,
                    "[%s]: \"socket\" (a vfio-user server's) or \"pci\" (a function of "
                    "this host, DDDD:BB:DD.F) is required",
                    group);
        return false;
    }
    /* Who may borrow is a decision, not a default: say it. */
    allow = g_key_file_get_string_list(kf, group, "allow", &n, NULL);
    if (allow == NULL || n == 0) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_KEY_NOT_FOUND,
                    "[%s]: \"allow\" is required: the nodes that may borrow it, "
                    "separated by ';', or * for any",
                    group);
        return false;
    }
    for (gsize i = 0; i < n; i++) {
        g_strstrip(allow[i]);
    }
    /* The same checks as a device lent at run time (`ntbctl lend`). */
    l = vn_conf_lend_new(group + strlen("lend "), socket, pci, (const char *const *)allow, error);
    if (l == NULL) {
        g_prefix_error(error, "[%s]: ", group);
        return false;
    }
    l->runtime = false;
    managed = g_key_file_get_string(kf, group, "managed", NULL);
    if (managed != NULL && !vn_conf_lend_managed(l, g_strstrip(managed), error)) {
        g_prefix_error(error, "[%s]: ", group);
        lend_free(l);
        return false;
    }
    if (g_key_file_has_key(kf, group, "sriov-vfs", NULL) && !parse_sriov(kf, group, l, error)) {
        lend_free(l);
        return false;
    }
    g_ptr_array_add(c->lends, l);
    return true;
}

static bool parse_borrow(GKeyFile *kf, const char *group, VnConfig *c, GError **error)
{
    static const char *const known[] = { "lender", "device", "socket", "irq-mode", NULL };
    g_autofree char *mode = NULL;
    VnBorrowConf *b;

    if (!keys_known(kf, group, known, error)) {
        return false;
    }
    b = g_new0(VnBorrowConf, 1);
    g_ptr_array_add(c->borrows, b);
    b->name = g_strdup(group + strlen("borrow "));
    if (!(b->lender = need(kf, group, "lender", error)) ||
        !(b->socket = need(kf, group, "socket", error))) {
        return false;
    }
    if (!vn_name_valid(VN_NAME_NODE, b->lender)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[%s]: lender \"%.40s\" is not a node name", group, b->lender);
        return false;
    }
    if (!socket_path_ok(b->socket)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[%s]: socket must be an absolute path (at most %d bytes)", group,
                    VN_CONF_MAX_SOCKET_PATH);
        return false;
    }
    b->device = g_key_file_get_string(kf, group, "device", NULL);
    if (b->device == NULL) {
        b->device = g_strdup(b->name);
    }
    if (!vn_name_valid(VN_NAME_DEVICE, b->device)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[%s]: device \"%.80s\" must be %s", group, b->device,
                    vn_name_rule(VN_NAME_DEVICE));
        return false;
    }
    mode = g_key_file_get_string(kf, group, "irq-mode", NULL);
    if (mode != NULL && !vn_irq_mode_from_string(mode, &b->irq_mode)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[%s]: irq-mode must be fd or relay, not \"%s\"", group, mode);
        return false;
    }
    return true;
}

static bool parse(GKeyFile *kf, VnConfig *c, GError **error)
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
                                             NULL };
    g_auto(GStrv) groups = g_key_file_get_groups(kf, NULL);
    g_autofree char *dir = NULL;

    if (!g_key_file_has_group(kf, "node")) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_GROUP_NOT_FOUND,
                    "[node] is required");
        return false;
    }
    if (!keys_known(kf, "node", node_keys, error) || !(c->node = need(kf, "node", "name", error))) {
        return false;
    }
    c->fabric = g_key_file_get_string(kf, "node", "fabric", NULL);
    if (c->fabric == NULL) {
        c->fabric = g_strdup("shm");
    }
    /* The shm fabric is a directory; an NTB's is its adapters ([fabric] ports). */
    if (strcmp(c->fabric, "shm") == 0 && !(dir = need(kf, "node", "fabric-dir", error))) {
        return false;
    }
    if (strcmp(c->fabric, "shm") != 0 && g_key_file_has_key(kf, "node", "fabric-dir", NULL)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[node]: fabric-dir is the shm fabric's; the %.20s fabric has none", c->fabric);
        return false;
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
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[node]: control-socket must be an absolute path (at most %d bytes)",
                    VN_CONF_MAX_SOCKET_PATH);
        return false;
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
                g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                            "[node]: %s \"%.60s\" must be an absolute path", paths[i].key,
                            paths[i].value);
                return false;
            }
        }
    }
    c->lease_timeout_ms = 10000;
    if (g_key_file_has_key(kf, "node", "lease-timeout-ms", NULL)) {
        g_autoptr(GError) local = NULL;
        gint64 v = g_key_file_get_int64(kf, "node", "lease-timeout-ms", &local);

        /* Bounded: 0 would expire leases on every blip, a day is surely a typo. */
        if (local != NULL || v < 100 || v > 86400000) {
            g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                        "[node]: lease-timeout-ms must be 100..86400000");
            return false;
        }
        c->lease_timeout_ms = (uint32_t)v;
    }
    c->metrics_interval_ms = VN_METRICS_DEFAULT_INTERVAL_MS;
    if (g_key_file_has_key(kf, "node", "metrics-interval-ms", NULL)) {
        g_autoptr(GError) local = NULL;
        gint64 v = g_key_file_get_int64(kf, "node", "metrics-interval-ms", &local);

        /* Bounded (metrics.h): faster than any scrape only costs, slower
         * than an hour is not monitoring. */
        if (local != NULL || v < VN_METRICS_MIN_INTERVAL_MS || v > VN_METRICS_MAX_INTERVAL_MS) {
            g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                        "[node]: metrics-interval-ms must be %d..%d", VN_METRICS_MIN_INTERVAL_MS,
                        VN_METRICS_MAX_INTERVAL_MS);
            return false;
        }
        c->metrics_interval_ms = (uint32_t)v;
    }
    if (!vn_name_valid(VN_NAME_NODE, c->node)) {
        g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                    "[node]: name \"%.80s\" must be %s", c->node, vn_name_rule(VN_NAME_NODE));
        return false;
    }
    if (dir != NULL) {
        g_hash_table_insert(c->fabric_params, g_strdup("dir"), g_steal_pointer(&dir));
    }

    for (char **g = groups; *g != NULL; g++) {
        const char *name = strchr(*g, ' ') ? strchr(*g, ' ') + 1 : "";

        if (strcmp(*g, "node") == 0) {
            continue;
        }
        if (strcmp(*g, "fabric") == 0) {
            g_auto(GStrv) keys = g_key_file_get_keys(kf, *g, NULL, NULL);

            for (char **k = keys; k != NULL && *k != NULL; k++) {
                g_hash_table_insert(c->fabric_params, g_strdup(*k),
                                    g_key_file_get_string(kf, *g, *k, NULL));
            }
            continue;
        }
        if (c->lends->len + c->borrows->len >= VN_CONF_MAX_DEVICES) {
            g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                        "more than %d devices", VN_CONF_MAX_DEVICES);
            return false;
        }
        if ((g_str_has_prefix(*g, "lend ") || g_str_has_prefix(*g, "borrow ")) &&
            !vn_name_valid(VN_NAME_DEVICE, name)) {
            /* A name lent here must be one every peer can borrow. */
            g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_INVALID_VALUE,
                        "[%.80s]: the device name must be %s", *g, vn_name_rule(VN_NAME_DEVICE));
            return false;
        }
        if (g_str_has_prefix(*g, "lend ")) {
            if (!parse_lend(kf, *g, c, error)) {
                return false;
            }
        } else if (g_str_has_prefix(*g, "borrow ")) {
            if (!parse_borrow(kf, *g, c, error)) {
                return false;
            }
        } else {
            g_set_error(error, G_KEY_FILE_ERROR, G_KEY_FILE_ERROR_GROUP_NOT_FOUND,
                        "unknown group [%s] (expected [node], [fabric], [lend NAME], "
                        "[borrow NAME])",
                        *g);
            return false;
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

VnConfig *vn_conf_parse(const char *text, GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(VnConfig) c = config_new();

    if (!g_key_file_load_from_data(kf, text, (gsize)-1, G_KEY_FILE_NONE, error) ||
        !parse(kf, c, error)) {
        return NULL;
    }
    return g_steal_pointer(&c);
}

VnConfig *vn_conf_load(const char *path, GError **error)
{
    g_autofree char *text = NULL;
    gsize len;
    VnConfig *c;

    /* A config file is small; a huge one is a mistake, not a config. */
    if (!g_file_get_contents(path, &text, &len, error)) {
        return NULL;
    }
    if (len > 1024 * 1024) {
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "%s: larger than 1 MiB", path);
        return NULL;
    }
    c = vn_conf_parse(text, error);
    if (c == NULL) {
        g_prefix_error(error, "%s: ", path);
    }
    return c;
}
