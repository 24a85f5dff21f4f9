/*
 * Unit tests of the daemon's operation (vfio-ntb/daemon/reload.c and the
 * journal fields of common/log.h): real daemons in this process on a shm
 * fabric of their own (daemon-rig.h), their config file read again as
 * SIGHUP has vfio-ntbd do it, and their log lines caught by a GLib log
 * writer as journald would get them.
 */
#include "daemon-rig.h"
#include "daemon/devices-lend.h"
#include "daemon/reload.h"

#include "check-main.h"

/* ---- journal fields ------------------------------------------------------ */

/* The fields of the first log line whose MESSAGE holds caught_text. */
static const char *caught_text;
static GHashTable *caught;

static GLogWriterOutput catch_writer(GLogLevelFlags level, const GLogField *fields, gsize n,
                                     gpointer data)
{
    const char *msg = NULL;

    for (gsize i = 0; i < n; i++) {
        if (strcmp(fields[i].key, "MESSAGE") == 0) {
            msg = fields[i].value;
        }
    }
    if (caught == NULL && msg != NULL && strstr(msg, caught_text) != NULL) {
        caught = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
        for (gsize i = 0; i < n; i++) {
            g_hash_table_insert(caught, g_strdup(fields[i].key),
                                fields[i].length < 0
                                    ? g_strdup(fields[i].value)
                                    : g_strndup(fields[i].value, (gsize)fields[i].length));
        }
    }
    return g_log_writer_default(level, fields, n, data);
}

/* hosta grants hostb a lease on nvme0: the line that says so carries the
 * node, the device (host/name), the peer and the lease as fields, which
 * `journalctl VFIO_NTB_DEVICE=hosta/nvme0` selects by. */
START_TEST(test_lease_line_fields)
{
    VnDaemon *a, *b;
    uint64_t lease;
    g_autofree char *id = NULL;

    caught_text = "lent nvme0 to hostb";
    g_log_set_writer_func(catch_writer, NULL, NULL);
    a = daemon_start("hosta");
    b = daemon_start("hostb");
    lease = borrow(a, b);
    id = g_strdup_printf("%" G_GUINT64_FORMAT, lease);
    ck_assert_msg(caught != NULL, "no log line says \"%s\"", caught_text);
    ck_assert_str_eq(g_hash_table_lookup(caught, "VFIO_NTB_NODE"), "hosta");
    ck_assert_str_eq(g_hash_table_lookup(caught, "VFIO_NTB_DEVICE"), "hosta/nvme0");
    ck_assert_str_eq(g_hash_table_lookup(caught, "VFIO_NTB_PEER"), "hostb");
    ck_assert_str_eq(g_hash_table_lookup(caught, "VFIO_NTB_LEASE"), id);
    ck_assert_str_eq(g_hash_table_lookup(caught, "PRIORITY"), "5"); /* notice */
    ck_assert_str_eq(g_hash_table_lookup(caught, "GLIB_DOMAIN"), "vfio-ntb.daemon");
    /* The text is what it was. */
    ck_assert(g_str_has_prefix(g_hash_table_lookup(caught, "MESSAGE"), "node hosta: lent nvme0"));
    g_clear_pointer(&caught, g_hash_table_unref);
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

/* Levels: names both ways, anything else refused. */
START_TEST(test_levels)
{
    VnLogLevel l;

    for (int i = 0; i < VN_LOG__LAST; i++) {
        ck_assert(vn_log_level_from_string(vn_log_level_to_string((VnLogLevel)i), &l));
        ck_assert_int_eq(l, i);
    }
    ck_assert(!vn_log_level_from_string("verbose", &l));
    ck_assert(!vn_log_level_from_string("INFO", &l));
    ck_assert(!vn_log_level_from_string(NULL, &l));
}
END_TEST

/* ---- reload ---------------------------------------------------------------- */

static char *conf_path;

/* hosta's config as daemon_start() writes it, with @lends instead of its
 * nvme0, written where a reload reads it. */
static void write_conf(const char *lends)
{
    g_autofree char *text = g_strdup_printf(
        "[node]\nname = hosta\nfabric = shm\nfabric-dir = %s/fabric\n"
        "control-socket = %s/hosta.control\nstate-dir = %s/hosta.state\nrun-dir = %s/hosta.run\n"
        "lease-timeout-ms = %d\n%s",
        tmpdir, tmpdir, tmpdir, tmpdir, LEASE_TIMEOUT_MS, lends);

    g_free(conf_path);
    conf_path = g_build_filename(tmpdir, "hosta.conf", NULL);
    ck_assert(g_file_set_contents(conf_path, text, -1, NULL));
}

#define NVME0 "[lend nvme0]\nsocket = /nonexistent/dev.sock\nallow = hostb;hoste\n"
#define NVME1 "[lend nvme1]\nsocket = /nonexistent/dev1.sock\nallow = hostc\n"

static bool lends(VnDaemon *d, const char *name)
{
    return vn_devices_local(d, name) != NULL;
}

/* Added, removed, access list changed; the config of the running daemon is
 * the new one's where it matters. */
START_TEST(test_reload_lends)
{
    VnDaemon *a = daemon_start("hosta");
    g_autoptr(GError) error = NULL;

    write_conf(NVME0 NVME1);
    ck_assert_msg(vn_daemon_reload(a, conf_path, NULL, &error), "%s", error ? error->message : "");
    ck_assert(lends(a, "nvme0") && lends(a, "nvme1"));
    ck_assert(vn_devices_local(a, "nvme1")->worker_pid > 0); /* its worker started */
    ck_assert(!vn_devices_local(a, "nvme1")->conf->runtime);
    /* nvme0 gone, nvme1 now for hostd only */
    write_conf("[lend nvme1]\nsocket = /nonexistent/dev1.sock\nallow = hostd\n");
    ck_assert(vn_daemon_reload(a, conf_path, NULL, &error));
    ck_assert(!lends(a, "nvme0"));
    ck_assert(vn_lend_conf_allows(vn_devices_local(a, "nvme1")->conf, "hostd"));
    ck_assert(!vn_lend_conf_allows(vn_devices_local(a, "nvme1")->conf, "hostc"));
    /* the same file again changes nothing */
    ck_assert(vn_daemon_reload(a, conf_path, NULL, &error));
    ck_assert(lends(a, "nvme1") && a->local->len == 1);
    vn_daemon_free(a);
    g_clear_pointer(&conf_path, g_free);
}
END_TEST

/* A bad file changes nothing, and says why as --check-config does. */
START_TEST(test_reload_bad_file)
{
    VnDaemon *a = daemon_start("hosta");
    g_autoptr(GError) error = NULL;
    g_autofree char *want = NULL;

    write_conf(NVME1 "allow = hoste\n");
    want = g_strdup_printf("%s:12: [lend nvme1] allow = \"hoste\"", conf_path);
    ck_assert(!vn_daemon_reload(a, conf_path, NULL, &error));
    ck_assert_msg(g_str_has_prefix(error->message, want), "%s", error->message);
    ck_assert(lends(a, "nvme0") && !lends(a, "nvme1") && a->local->len == 1);
    ck_assert(vn_lend_conf_allows(vn_devices_local(a, "nvme0")->conf, "hostb"));
    vn_daemon_free(a);
    g_clear_pointer(&conf_path, g_free);
}
END_TEST

/* A lent device the new config drops stays lent (with a warning); a device
 * lent at run time (`lend`) is not the config's and stays too. */
START_TEST(test_reload_keeps_lent_and_runtime)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    const char *any[] = { "*", NULL };
    g_autoptr(GError) error = NULL;
    VnLendConf *rt = vn_conf_lend_new("rt0", "/nonexistent/rt.sock", NULL, any, &error);
    uint64_t lease = borrow(a, b);

    ck_assert_ptr_nonnull(rt);
    g_ptr_array_add(a->conf->lends, rt);
    ck_assert_ptr_nonnull(vn_devices_lend(a, rt, &error));
    write_conf(NVME1);
    ck_assert(vn_daemon_reload(a, conf_path, NULL, &error));
    ck_assert(lends(a, "nvme0") && lends(a, "nvme1") && lends(a, "rt0"));
    ck_assert_uint_eq(lease_of(a)->id, lease);
    ck_assert_str_eq(lease_of(a)->holder, "hostb");
    ck_assert(vn_devices_local(a, "rt0")->conf->runtime);
    /* returned: the next reload lets it go; rt0 still stays */
    {
        Done r = { 0 };

        vn_cluster_return(b, vn_devices_borrowed(b, "hosta/nvme0"), on_done, &r);
        ck_assert(spin_until(is_done, &r, 3000));
    }
    ck_assert(vn_daemon_reload(a, conf_path, NULL, &error));
    ck_assert(!lends(a, "nvme0") && lends(a, "nvme1") && lends(a, "rt0"));
    vn_daemon_free(b);
    vn_daemon_free(a);
    g_clear_pointer(&conf_path, g_free);
}
END_TEST

/* A changed access list is what the next borrow is checked against. */
START_TEST(test_reload_allow_applies)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    g_autoptr(GError) error = NULL;
    Done r = { 0 };

    write_conf("[lend nvme0]\nsocket = /nonexistent/dev.sock\nallow = hoste\n");
    ck_assert(vn_daemon_reload(a, conf_path, NULL, &error));
    ck_assert(spin_until(knows_hosta, b, 5000));
    vn_cluster_borrow(b, "hosta", "nvme0", VN_JOB_OWNER_CONTROL, on_done, &r);
    ck_assert(spin_until(is_done, &r, 5000));
    ck_assert_ptr_null(r.b);
    ck_assert_str_eq(r.klass, "AccessDenied");
    vn_daemon_free(b);
    vn_daemon_free(a);
    g_clear_pointer(&conf_path, g_free);
}
END_TEST

/* [node] changes but log-level need a restart: the running daemon keeps its
 * own; log-level is taken. */
START_TEST(test_reload_node_ignored)
{
    VnDaemon *a = daemon_start("hosta");
    g_autoptr(GError) error = NULL;

    write_conf(NVME0); /* for conf_path */
    {
        g_autofree char *changed =
            g_strdup_printf("[node]\nname = hosta\nfabric = shm\nfabric-dir = %s/fabric\n"
                            "control-socket = %s/other.control\nstate-dir = %s/hosta.state\n"
                            "run-dir = %s/hosta.run\nlease-timeout-ms = 5000\nlog-level = info\n"
                            "stats-file = %s/s.json\n" NVME0,
                            tmpdir, tmpdir, tmpdir, tmpdir, tmpdir);

        ck_assert(g_file_set_contents(conf_path, changed, -1, NULL));
    }
    ck_assert_msg(vn_daemon_reload(a, conf_path, NULL, &error), "%s", error ? error->message : "");
    ck_assert_uint_eq(a->conf->lease_timeout_ms, LEASE_TIMEOUT_MS);
    ck_assert_ptr_null(a->conf->stats_file);
    ck_assert(g_str_has_suffix(a->conf->control_socket, "/hosta.control"));
    ck_assert(a->conf->log_level_set);
    ck_assert_int_eq(a->conf->log_level, VN_LOG_INFO);
    ck_assert(lends(a, "nvme0") && a->local->len == 1);
    vn_daemon_free(a);
    g_clear_pointer(&conf_path, g_free);
}
END_TEST

/* What systemd's STATUS= says. */
START_TEST(test_status_line)
{
    VnDaemon *a = daemon_start("hosta"), *b = daemon_start("hostb");
    g_autofree char *before = vn_daemon_status(a);
    g_autofree char *after = NULL;

    ck_assert_str_eq(before, "lending 1 (0 lent), borrowing 0, 0 nodes up");
    borrow(a, b);
    after = vn_daemon_status(b);
    ck_assert_str_eq(after, "lending 0 (0 lent), borrowing 1, 1 node up");
    g_free(after);
    after = vn_daemon_status(a);
    ck_assert_str_eq(after, "lending 1 (1 lent), borrowing 0, 1 node up");
    vn_daemon_free(b);
    vn_daemon_free(a);
}
END_TEST

static Suite *daemon_ops_suite(void)
{
    Suite *s = suite_create("daemon-ops");
    TCase *tc;

    tc = tcase_create("log");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_lease_line_fields);
    tcase_add_test(tc, test_levels);
    suite_add_tcase(s, tc);
    tc = tcase_create("reload");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_reload_lends);
    tcase_add_test(tc, test_reload_bad_file);
    tcase_add_test(tc, test_reload_keeps_lent_and_runtime);
    tcase_add_test(tc, test_reload_allow_applies);
    tcase_add_test(tc, test_reload_node_ignored);
    tcase_add_test(tc, test_status_line);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(daemon_ops_suite());
}
