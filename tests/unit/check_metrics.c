/*
 * Unit tests of the Prometheus metrics (vfio-ntb/daemon/metrics.c): the
 * exposition text (families whole, HELP and TYPE first, counters _total,
 * label values escaped, worker counters that are not counters left out),
 * the atomic write (mode 0644 whatever the umask, no temporary file left,
 * never through a link), the config keys, and daemons that write the file
 * on their timer and once more at exit.
 */
#include "daemon-rig.h"
#include "daemon/metrics.h"

#include "check-main.h"
#include "common/json.h"

#include <sys/stat.h>

static JsonNode *json(const char *text)
{
    g_autoptr(GError) error = NULL;
    JsonNode *n = vn_json_parse(text, -1, 65536, &error);

    ck_assert_msg(n != NULL, "%s", error ? error->message : "");
    return n;
}

/*
 * What a scraper relies on, checked line by line: every sample belongs to
 * the family of the last TYPE line (one family's samples together, each
 * family once), has HELP and TYPE before it, a counter's name ends in
 * _total, and every value is a number.  Returns the number of samples.
 */
static unsigned check_exposition(const char *text)
{
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    g_autoptr(GHashTable) seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_autofree char *help = NULL, *family = NULL, *type = NULL;
    unsigned samples = 0;

    ck_assert(g_str_has_suffix(text, "\n"));
    for (char **l = lines; *l != NULL; l++) {
        if ((*l)[0] == '\0') {
            ck_assert_ptr_null(l[1]); /* only after the last newline */
            continue;
        }
        if (g_str_has_prefix(*l, "# HELP ")) {
            g_auto(GStrv) w = g_strsplit(*l + 7, " ", 2);

            ck_assert_msg(!g_hash_table_contains(seen, w[0]), "family %s twice", w[0]);
            g_hash_table_add(seen, g_strdup(w[0]));
            g_free(help);
            help = g_strdup(w[0]);
            ck_assert(g_str_has_prefix(w[0], "vfio_ntb_"));
            ck_assert(w[1] != NULL && strlen(w[1]) > 10);
            continue;
        }
        if (g_str_has_prefix(*l, "# TYPE ")) {
            g_auto(GStrv) w = g_strsplit(*l + 7, " ", -1);

            ck_assert_str_eq(w[0], help); /* right after its HELP */
            ck_assert(strcmp(w[1], "counter") == 0 || strcmp(w[1], "gauge") == 0);
            ck_assert_int_eq(g_str_has_suffix(w[0], "_total"), strcmp(w[1], "counter") == 0);
            g_free(family);
            g_free(type);
            family = g_strdup(w[0]);
            type = g_strdup(w[1]);
            continue;
        }
        {
            const char *brace = strchr(*l, '{'), *end = strrchr(*l, '}');
            g_autofree char *name = brace ? g_strndup(*l, (gsize)(brace - *l)) : NULL;
            char *rest = NULL;

            ck_assert_msg(name != NULL && end != NULL && end[1] == ' ', "line: %s", *l);
            ck_assert_msg(family != NULL && strcmp(name, family) == 0, "%s outside its family",
                          name);
            ck_assert(g_str_has_prefix(brace, "{node=\""));
            (void)g_ascii_strtod(end + 2, &rest);
            ck_assert_msg(rest != end + 2 && *rest == '\0', "value of: %s", *l);
            samples++;
        }
    }
    return samples;
}

static bool has_line(const char *text, const char *line)
{
    g_autofree char *needle = g_strdup_printf("\n%s\n", line);
    g_autofree char *framed = g_strdup_printf("\n%s", text);

    return strstr(framed, needle) != NULL;
}

#define ck_assert_line(text, line) ck_assert_msg(has_line(text, line), "no line: %s", line)
#define ck_assert_no(text, part) ck_assert_msg(strstr(text, part) == NULL, "has: %s", part)

static VnMetricsSnapshot *snapshot_abc(void)
{
    VnMetricsSnapshot *s = vn_metrics_snapshot_new("hosta");

    s->unix_ms = 1764782400123;
    vn_metrics_snapshot_add_device(s, "hosta/nvme0", true, "held", false);
    vn_metrics_snapshot_add_device(s, "hosta/nvme1", true, "free", false);
    vn_metrics_snapshot_add_device(s, "hostc/disk", false, "held", true);
    vn_metrics_snapshot_add_peer(s, "hostb", true);
    vn_metrics_snapshot_add_peer(s, "hostc", false);
    return s;
}

/* The shape of query-stats (stats.c) with one lender's and one borrower's
 * counters, as the workers write them. */
static const char stats_abc[] =
    "{\"node\": \"hosta\", \"state_save_errors\": 2,"
    " \"fabric\": {\"msgs_sent\": 31, \"msgs_received\": 29, \"doorbells_sent\": 0,"
    "  \"doorbells_received\": 4, \"bad_messages\": 1, \"windows_in_use\": 3},"
    " \"lent\": [{\"device\": \"nvme0\", \"borrower\": \"hostb\", \"requests\": 120,"
    "  \"region_rw\": 50, \"config_rw\": 20, \"relayed_irqs\": 7, \"dma_maps\": 5,"
    "  \"dma_unmaps\": 4, \"resets\": 1, \"fences\": 0, \"windows\": 2,"
    "  \"device_requests\": 0, \"device_timeouts\": 0, \"device_late_replies\": 0,"
    "  \"device_server_up\": false, \"device_server_losses\": 2,"
    "  \"device_server\": \"lost\"}, null],"
    " \"borrowed\": [{\"device\": \"disk\", \"lender\": \"hostc\", \"irq_mode\": \"fd\","
    "  \"lender_lost\": false, \"client_connected\": true, \"region_forwarded\": 11,"
    "  \"config_forwarded\": 13, \"config_virtualized\": 40, \"relayed_irqs\": 0,"
    "  \"fabric_requests\": 30, \"dma_maps\": 6, \"dma_unmaps\": 2, \"unplug_requests\": 0,"
    "  \"vfio_user\": {\"messages\": 90, \"errors\": 1, \"dma_mappings_now\": 4}}]}";

START_TEST(test_text)
{
    g_autoptr(VnMetricsSnapshot) s = snapshot_abc();
    g_autoptr(JsonNode) stats = json(stats_abc);
    g_autofree char *t = vn_metrics_text(s, stats);

    ck_assert_uint_gt(check_exposition(t), 40);
    ck_assert_line(t, "vfio_ntb_up{node=\"hosta\"} 1");
    ck_assert_line(t, "vfio_ntb_metrics_timestamp_seconds{node=\"hosta\"} 1764782400.123");
    ck_assert_line(t, "# TYPE vfio_ntb_fabric_messages_sent_total counter");
    ck_assert_line(t, "vfio_ntb_fabric_messages_sent_total{node=\"hosta\"} 31");
    ck_assert_line(t, "vfio_ntb_fabric_bad_messages_total{node=\"hosta\"} 1");
    ck_assert_line(t, "vfio_ntb_fabric_windows_in_use{node=\"hosta\"} 3");
    ck_assert_line(t, "vfio_ntb_state_save_errors_total{node=\"hosta\"} 2");
    ck_assert_line(t, "vfio_ntb_peer_link_up{node=\"hosta\",peer=\"hostb\"} 1");
    ck_assert_line(t, "vfio_ntb_peer_link_up{node=\"hosta\",peer=\"hostc\"} 0");
    /* Lease state: one series per state, 1 for the current one. */
    ck_assert_line(t, "vfio_ntb_lease_state{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\",state=\"held\"} 1");
    ck_assert_line(t, "vfio_ntb_lease_state{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\",state=\"free\"} 0");
    ck_assert_line(t, "vfio_ntb_lease_state{node=\"hosta\",device=\"hosta/nvme1\","
                      "role=\"lender\",state=\"free\"} 1");
    ck_assert_line(t, "vfio_ntb_lease_state{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\",state=\"held\"} 1");
    ck_assert_line(t, "vfio_ntb_lease_state{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\",state=\"lost\"} 0");
    ck_assert_line(t, "vfio_ntb_attached{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 1");
    /* The lender counts config among its region accesses. */
    ck_assert_line(t, "vfio_ntb_forwarded_accesses_total{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\",space=\"bar\"} 30");
    ck_assert_line(t, "vfio_ntb_forwarded_accesses_total{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\",space=\"config\"} 20");
    ck_assert_line(t, "vfio_ntb_forwarded_accesses_total{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\",space=\"bar\"} 11");
    ck_assert_line(t, "vfio_ntb_forwarded_accesses_total{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\",space=\"config\"} 13");
    ck_assert_line(t, "vfio_ntb_relayed_interrupts_total{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\"} 7");
    ck_assert_line(t, "vfio_ntb_dma_maps_total{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 6");
    ck_assert_line(t, "vfio_ntb_lender_requests_total{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\"} 120");
    ck_assert_line(t, "vfio_ntb_lender_requests_total{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 30");
    ck_assert_line(t, "vfio_ntb_client_connected{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 1");
    ck_assert_line(t, "vfio_ntb_lender_lost{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 0");
    /* Its device server died (twice): the gauge an alert fires on. */
    ck_assert_line(t, "vfio_ntb_device_server_up{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\"} 0");
    ck_assert_line(t, "vfio_ntb_device_server_losses_total{node=\"hosta\","
                      "device=\"hosta/nvme0\",role=\"lender\"} 2");
    ck_assert_line(t, "vfio_ntb_vfio_user_messages_total{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 90");
    ck_assert_line(t, "vfio_ntb_dma_mappings{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 4");
    /* nvme1's worker did not answer (null): said so, no counters. */
    ck_assert_line(t, "vfio_ntb_worker_counters{node=\"hosta\",device=\"hosta/nvme1\","
                      "role=\"lender\"} 0");
    ck_assert_line(t, "vfio_ntb_worker_counters{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\"} 1");
    ck_assert_no(t, "vfio_ntb_dma_maps_total{node=\"hosta\",device=\"hosta/nvme1\"");
    /* Fewer region accesses than config ones (config is among them): no
     * BAR count to tell, the config count stands. */
    {
        g_autoptr(JsonNode) odd = json("{\"lent\": [{\"region_rw\": 1, \"config_rw\": 5}]}");
        g_autofree char *u = vn_metrics_text(s, odd);

        ck_assert_no(u, "space=\"bar\"");
        ck_assert_line(u, "vfio_ntb_forwarded_accesses_total{node=\"hosta\","
                          "device=\"hosta/nvme0\",role=\"lender\",space=\"config\"} 5");
    }
    /* Strings are not counters ("device_server": "lost" gives no series). */
    ck_assert_no(t, "_device_server{");
}
END_TEST

/* Worker counters are untrusted: what is not a non-negative integer (or a
 * boolean) is left out, extra or foreign entries change nothing, and a
 * device is reported once even if two entries name it. */
static const char *const hostile[] = {
    "{\"lent\": [{\"dma_maps\": -1}], \"borrowed\": []}",
    "{\"lent\": [{\"dma_maps\": 1.5}], \"borrowed\": []}",
    "{\"lent\": [{\"dma_maps\": \"9\"}], \"borrowed\": []}",
    "{\"lent\": [{\"dma_maps\": [1]}], \"borrowed\": []}",
    "{\"lent\": [{\"dma_maps\": {\"x\": 1}}], \"borrowed\": []}",
    "{\"lent\": [{\"region_rw\": 1, \"config_rw\": \"5\"}], \"borrowed\": []}",
    "{\"lent\": [7], \"borrowed\": [3, null, {\"device\": 5}]}",
    "{\"lent\": \"x\", \"borrowed\": {\"device\": \"hostc/disk\"}}",
    "{\"fabric\": [1], \"state_save_errors\": -3}",
    "[1, 2]",
};

START_TEST(test_untrusted)
{
    g_autoptr(VnMetricsSnapshot) s = snapshot_abc();
    g_autoptr(JsonNode) stats = json(hostile[_i]);
    g_autofree char *t = vn_metrics_text(s, stats);

    check_exposition(t);
    ck_assert_no(t, "vfio_ntb_dma_maps_total{");
    ck_assert_no(t, "vfio_ntb_forwarded_accesses_total{");
    ck_assert_no(t, "vfio_ntb_state_save_errors_total{");
    ck_assert_no(t, "vfio_ntb_fabric_messages_sent_total{");
    /* The daemon's own knowledge stays. */
    ck_assert_line(t, "vfio_ntb_lease_state{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\",state=\"held\"} 1");
}
END_TEST

START_TEST(test_foreign_and_duplicate)
{
    g_autoptr(VnMetricsSnapshot) s = snapshot_abc();
    g_autoptr(JsonNode) stats =
        json("{\"lent\": [{\"dma_maps\": 1}, {\"dma_maps\": 2}, {\"dma_maps\": 3}],"
             " \"borrowed\": [{\"device\": \"other\", \"lender\": \"hostz\", \"dma_maps\": 8},"
             "  {\"device\": \"disk\", \"lender\": \"hostz\", \"dma_maps\": 11},"
             "  {\"device\": \"disk\", \"dma_maps\": 12},"
             "  {\"device\": \"hostc/disk\", \"dma_maps\": 9},"
             "  {\"device\": \"hostc/disk\", \"dma_maps\": 10}]}");
    g_autofree char *t = vn_metrics_text(s, stats);

    check_exposition(t);
    ck_assert_line(t, "vfio_ntb_dma_maps_total{node=\"hosta\",device=\"hosta/nvme0\","
                      "role=\"lender\"} 1");
    ck_assert_line(t, "vfio_ntb_dma_maps_total{node=\"hosta\",device=\"hosta/nvme1\","
                      "role=\"lender\"} 2");
    ck_assert_line(t, "vfio_ntb_dma_maps_total{node=\"hosta\",device=\"hostc/disk\","
                      "role=\"borrower\"} 9");
    ck_assert_no(t, "} 3\n");
    ck_assert_no(t, "} 8\n");
    ck_assert_no(t, "} 10\n");
    ck_assert_no(t, "} 11\n");
    ck_assert_no(t, "} 12\n");
    ck_assert_no(t, "hostz");
}
END_TEST

START_TEST(test_escape)
{
    g_autoptr(VnMetricsSnapshot) s = vn_metrics_snapshot_new("hosta");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autofree char *t = NULL;

    vn_metrics_escape(out, "a\"b\\c\nd");
    ck_assert_str_eq(out->str, "a\\\"b\\\\c\\nd");
    vn_metrics_snapshot_add_peer(s, "x\"} 1\nvfio_ntb_up{node=\"evil", true);
    s->running = false;
    t = vn_metrics_text(s, NULL);
    check_exposition(t);
    ck_assert_line(t, "vfio_ntb_peer_link_up{node=\"hosta\",peer=\"x\\\"} 1\\nvfio_ntb_up{node="
                      "\\\"evil\"} 1");
    ck_assert_line(t, "vfio_ntb_up{node=\"hosta\"} 0");
    /* No counters without an answer. */
    ck_assert_no(t, "_total{");
}
END_TEST

START_TEST(test_write)
{
    g_autofree char *path = g_build_filename(tmpdir, "vfio-ntb.prom", NULL);
    g_autofree char *tmp = g_strconcat(path, ".tmp", NULL);
    g_autofree char *victim = g_build_filename(tmpdir, "victim", NULL);
    g_autofree char *bad = g_build_filename(tmpdir, "no-such-dir", "x.prom", NULL);
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;
    struct stat st;
    mode_t old = umask(077);

    ck_assert(g_file_set_contents(path, "old\n", -1, NULL));
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert(vn_metrics_write(path, "vfio_ntb_up{node=\"a\"} 1\n", &error));
    ck_assert(g_file_get_contents(path, &text, NULL, NULL));
    ck_assert_str_eq(text, "vfio_ntb_up{node=\"a\"} 1\n");
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0644);
    ck_assert(!g_file_test(tmp, G_FILE_TEST_EXISTS));
    /* A link where the temporary file goes is replaced, not written through. */
    ck_assert_int_eq(symlink(victim, tmp), 0);
    ck_assert(vn_metrics_write(path, "second\n", &error));
    ck_assert(!g_file_test(victim, G_FILE_TEST_EXISTS));
    ck_assert(!g_file_test(tmp, G_FILE_TEST_EXISTS));
    g_clear_pointer(&text, g_free);
    ck_assert(g_file_get_contents(path, &text, NULL, NULL));
    ck_assert_str_eq(text, "second\n");
    /* Failure: said where, nothing left behind. */
    ck_assert(!vn_metrics_write(bad, "x\n", &error));
    ck_assert_ptr_nonnull(error);
    ck_assert_ptr_nonnull(strstr(error->message, "no-such-dir"));
    umask(old);
}
END_TEST

static const struct {
    const char *lines;
    bool ok;
    uint32_t interval;
} confs[] = {
    { "", true, VN_METRICS_DEFAULT_INTERVAL_MS },
    { "metrics-file = /var/lib/node_exporter/vfio-ntb.prom\n", true,
      VN_METRICS_DEFAULT_INTERVAL_MS },
    { "metrics-file = /m.prom\nmetrics-interval-ms = 100\n", true, 100 },
    { "metrics-file = /m.prom\nmetrics-interval-ms = 3600000\n", true, 3600000 },
    { "metrics-file = m.prom\n", false, 0 },
    { "metrics-file = /m.prom\nmetrics-interval-ms = 99\n", false, 0 },
    { "metrics-file = /m.prom\nmetrics-interval-ms = 3600001\n", false, 0 },
    { "metrics-file = /m.prom\nmetrics-interval-ms = 1s\n", false, 0 },
    { "metrics-file = /m.prom\nmetrics-interval-ms = -5\n", false, 0 },
};

START_TEST(test_conf_keys)
{
    g_autofree char *text =
        g_strdup_printf("[node]\nname = hosta\nfabric-dir = /f\n%s", confs[_i].lines);
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_parse(text, &error);

    if (!confs[_i].ok) {
        ck_assert_ptr_null(c);
        ck_assert_ptr_nonnull(strstr(error->message, "metrics-"));
        return;
    }
    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(c->metrics_interval_ms, confs[_i].interval);
    ck_assert_int_eq(c->metrics_file != NULL, strstr(confs[_i].lines, "metrics-file") != NULL);
}
END_TEST

typedef struct Want {
    const char *path;
    const char *line;
} Want;

static bool file_has(void *opaque)
{
    const Want *w = opaque;
    g_autofree char *text = NULL;

    return g_file_get_contents(w->path, &text, NULL, NULL) && has_line(text, w->line);
}

static void metrics_on(VnDaemon *d, const char *name)
{
    d->conf->metrics_file = g_build_filename(tmpdir, name, NULL);
    d->conf->metrics_interval_ms = 100;
    vn_metrics_start(d);
}

/* Two daemons: the lender's and the borrower's files follow the lease
 * every metrics-interval-ms, and a daemon's last file says it stopped. */
START_TEST(test_daemons_write)
{
    VnDaemon *a = daemon_start("hosta");
    VnDaemon *b = daemon_start("hostb");
    VnDaemon *more[] = { daemon_start("hoste"), daemon_start("hostc"), daemon_start("hostd") };
    g_autofree char *pa = NULL, *pb = NULL, *text = NULL;
    const char *at[4];
    Want w;

    metrics_on(a, "a.prom");
    metrics_on(b, "b.prom");
    pa = g_strdup(a->conf->metrics_file);
    pb = g_strdup(b->conf->metrics_file);
    w = (Want){ pa, "vfio_ntb_lease_state{node=\"hosta\",device=\"hosta/nvme0\",role=\"lender\","
                    "state=\"free\"} 1" };
    ck_assert(spin_until(file_has, &w, 3000));
    borrow(a, b);
    /* On the lender, who holds it (the VM it serves it to, once attached). */
    w.line = "vfio_ntb_lease_state{node=\"hosta\",device=\"hosta/nvme0\",role=\"lender\","
             "state=\"held\",borrower=\"hostb\"} 1";
    ck_assert(spin_until(file_has, &w, 3000));
    w = (Want){ pb, "vfio_ntb_lease_state{node=\"hostb\",device=\"hosta/nvme0\","
                    "role=\"borrower\",state=\"held\"} 1" };
    ck_assert(spin_until(file_has, &w, 3000));
    w.line = "vfio_ntb_peer_link_up{node=\"hostb\",peer=\"hoste\"} 1";
    ck_assert(spin_until(file_has, &w, 3000));
    /* Peers in name order, so one write reads like the next. */
    ck_assert(g_file_get_contents(pb, &text, NULL, NULL));
    for (int i = 0; i < 4; i++) {
        g_autofree char *line =
            g_strdup_printf("vfio_ntb_peer_link_up{node=\"hostb\",peer=\"host%c\"} 1", "acde"[i]);

        at[i] = strstr(text, line);
        ck_assert_msg(at[i] != NULL && (i == 0 || at[i] > at[i - 1]), "%s", text);
    }
    g_clear_pointer(&text, g_free);
    for (size_t i = 0; i < G_N_ELEMENTS(more); i++) {
        vn_daemon_free(more[i]);
    }
    w.line = "vfio_ntb_up{node=\"hostb\"} 1";
    ck_assert(file_has(&w));
    vn_daemon_free(b);
    ck_assert(g_file_get_contents(pb, &text, NULL, NULL));
    check_exposition(text);
    ck_assert_line(text, "vfio_ntb_up{node=\"hostb\"} 0");
    /* Still listed at exit: the lease outlives the daemon. */
    ck_assert_line(text, "vfio_ntb_lease_state{node=\"hostb\",device=\"hosta/nvme0\","
                         "role=\"borrower\",state=\"held\"} 1");
    vn_daemon_free(a);
}
END_TEST

/* A daemon refused because another runs on its control socket must not
 * overwrite that one's metrics file. */
START_TEST(test_refused_daemon_writes_nothing)
{
    VnDaemon *a = daemon_start("hostb");
    g_autofree char *path = g_build_filename(tmpdir, "m.prom", NULL);
    g_autofree char *text =
        g_strdup_printf("[node]\nname = hostb\nfabric = shm\nfabric-dir = %s/fabric\n"
                        "control-socket = %s/hostb.control\nmetrics-file = %s\n",
                        tmpdir, tmpdir, path);
    g_autoptr(GError) error = NULL;
    VnConfig *conf = vn_conf_parse(text, &error);

    ck_assert_ptr_nonnull(conf);
    ck_assert_ptr_null(vn_daemon_new(conf, &fake_ops, &error));
    ck_assert(!g_file_test(path, G_FILE_TEST_EXISTS));
    vn_daemon_free(a);
}
END_TEST

static Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("text");

    tcase_add_test(tc, test_text);
    tcase_add_loop_test(tc, test_untrusted, 0, G_N_ELEMENTS(hostile));
    tcase_add_test(tc, test_foreign_and_duplicate);
    tcase_add_test(tc, test_escape);
    suite_add_tcase(s, tc);
    tc = tcase_create("file");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_write);
    tcase_add_loop_test(tc, test_conf_keys, 0, G_N_ELEMENTS(confs));
    suite_add_tcase(s, tc);
    tc = tcase_create("daemon");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_daemons_write);
    tcase_add_test(tc, test_refused_daemon_writes_nothing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(metrics_suite());
}
