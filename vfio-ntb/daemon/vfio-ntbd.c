/*
 * vfio-ntbd: one per host.  Attaches the node to the fabric, lends the
 * devices its config file names to the nodes their access lists allow,
 * borrows devices for VMs on request (control socket, see docs/control.md)
 * or from its config file, and keeps leases with the other daemons
 * (daemon.c and its parts).
 *
 *   vfio-ntbd [--config FILE] [--check-config [FILE]] [--reload [FILE]]
 *             [--log-level LEVEL] [--verbose] [--trace PATTERNS] [--version]
 *             [--stop-workers]
 *
 * Exit status: 0 stopped cleanly (or --check-config passed); 1 a runtime
 * failure (the fabric, a socket); 2 a bad config file or command line, which
 * a restart will not fix (the unit's RestartPreventExitStatus=2).
 *
 * Signals: SIGHUP reads the config again (reload.c; so does the control
 * command `reload`, which --reload sends and which answers once it is done,
 * or refused); SIGUSR1 writes the counters to the stats file; SIGTERM/SIGINT
 * stop.
 *
 * systemd (Type=notify): READY=1 once the control socket accepts, STATUS=
 * lines as things change, RELOADING=1 ... READY=1 around a reload,
 * STOPPING=1.  sd_notify() does nothing without $NOTIFY_SOCKET, so the same
 * binary runs by hand.  This file alone links libsystemd; the daemon's
 * library (and its unit tests) do not.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "conf.h"
#include "daemon.h"
#include "reload.h"
#include "stopworkers.h"

#include "common/log.h"
#include "client/ctl-client.h"
#include "common/trace.h"
#include "config.h"

#include <errno.h>
#include <glib-unix.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#define VN_DEFAULT_CONFIG "/etc/vfio-ntb/vfio-ntbd.conf"
/* STATUS= is refreshed this often when it changed: lease and link changes
 * happen all over the daemon, and one comparison a second costs less than a
 * hook in each. */
#define VN_STATUS_EVERY_S 1
/* --reload waits this long for the daemon's answer: lending a device anew
 * starts its worker, which answers in well under a second. */
#define VN_RELOAD_WAIT_MS 60000

typedef struct Main {
    VnDaemon *d;
    const char *config_path;
    bool level_from_cli; /* --log-level (or --verbose) wins over [node] log-level */
    char *status;        /* the last STATUS= sent */
} Main;

/* --check-config's and --reload's: set by their option callback (FILE is
 * optional). */
static gboolean check_config = FALSE, reload = FALSE;
static char *check_path = NULL;

static gboolean check_config_arg(const char *name, const char *value, gpointer data, GError **error)
{
    if (strcmp(name, "--reload") == 0) {
        reload = TRUE;
    } else {
        check_config = TRUE;
    }
    g_free(check_path);
    check_path = g_strdup(value);
    return TRUE;
}

/* STATUS= when it changed (or @force), after the lines in @also. */
static void send_status(Main *m, bool force, const char *also)
{
    g_autofree char *now = vn_daemon_status(m->d);

    if (force || g_strcmp0(now, m->status) != 0) {
        sd_notifyf(0, "%sSTATUS=%s", also, now);
        g_free(m->status);
        m->status = g_steal_pointer(&now);
    }
}

static gboolean on_status(gpointer data)
{
    send_status(data, false, "");
    return G_SOURCE_CONTINUE;
}

/* The loop runs: the control socket (listening since vn_daemon_new())
 * accepts now. */
static gboolean on_ready(gpointer data)
{
    send_status(data, true, "READY=1\n");
    return G_SOURCE_REMOVE;
}

static void apply_level(Main *m)
{
    if (!m->level_from_cli) {
        vn_log_set_level(m->d->conf->log_level); /* notice unless the file says */
    }
}

/* A reload, for SIGHUP and the `reload` command (vfio-ntbd --reload). */
static bool reload_config(void *data, char **summary, GError **error)
{
    Main *m = data;
    bool ok;

    /* systemd 253+ wants the monotonic time with RELOADING=1; older ones
     * ignore it. */
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%" G_GINT64_FORMAT "\nSTATUS=reloading %s",
               g_get_monotonic_time(), m->config_path);
    ok = vn_daemon_reload(m->d, m->config_path, summary, error);
    if (!ok) {
        g_warning("node %s: reload refused, nothing changed: %s", m->d->conf->node,
                  (*error)->message);
    }
    apply_level(m);
    send_status(m, true, "READY=1\n");
    return ok;
}

static gboolean on_hup(gpointer data)
{
    g_autoptr(GError) error = NULL;

    reload_config(data, NULL, &error);
    return G_SOURCE_CONTINUE;
}

static gboolean on_usr1(gpointer data)
{
    vn_daemon_write_stats(((Main *)data)->d);
    return G_SOURCE_CONTINUE;
}

static gboolean on_stop(gpointer data)
{
    sd_notify(0, "STOPPING=1");
    vn_daemon_quit(((Main *)data)->d);
    return G_SOURCE_CONTINUE;
}

/* --stop-workers: the workers of this unit's cgroup (stopworkers.h); 1 when it cannot be
 * read. */
static int run_stop_workers(const char *config_path)
{
    g_autofree char *procs = vn_stopworkers_own_procs();
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = NULL;
    unsigned killed = 0, back, failed;
    int n = procs != NULL ? vn_stopworkers_run(procs, VN_STOPWORKERS_WAIT_MS, &killed) : -ENOENT;

    if (n < 0) {
        fprintf(stderr, "vfio-ntbd: --stop-workers: no unit's cgroup to look in (%s): %s\n",
                procs != NULL ? procs : "/proc/self/cgroup says none", g_strerror(-n));
        return 1;
    }
    printf("vfio-ntbd: stopped %d worker%s (%u did not stop in %d s and were killed)\n", n,
           n == 1 ? "" : "s", killed, VN_STOPWORKERS_WAIT_MS / 1000);
    /* Its run dir says which managed functions are still vfio-pci's for a lent device. */
    if ((c = vn_conf_load(config_path, &error)) == NULL) {
        fprintf(stderr, "vfio-ntbd: --stop-workers: no managed function given back: %s\n",
                error->message);
        return 0; /* the workers' part is done; the journal says what is left */
    }
    back = vn_stopworkers_give_back("/sys", c->run_dir, &failed);
    if (back + failed > 0) {
        printf("vfio-ntbd: gave %u managed function%s back to %s drivers (%u could not)\n", back,
               back == 1 ? "" : "s", back == 1 ? "its" : "their", failed);
    }
    return failed > 0 ? 1 : 0;
}

/* --check-config: what starting would check of the file, and nothing else
 * (no fabric joined, no socket bound, no file made). */
static int run_check(const char *path)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_load(path, &error);

    if (c == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 2;
    }
    printf("vfio-ntbd: %s: OK (node %s, %s fabric, %u lent, %u borrowed)\n", path, c->node,
           c->fabric, c->lends->len, c->borrows->len);
    return 0;
}

/* --reload: the daemon that runs with @path's control socket reads its
 * config again and says what it did; 0 once it has, 2 when this file is
 * refused here (as by --check-config), 1 when the daemon cannot be asked or
 * refuses the file (it then changed nothing).  The unit's ExecReload=. */
static int run_reload(const char *path)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_load(path, &error);
    g_autoptr(VnCtlClient) cl = NULL;
    g_autoptr(JsonNode) ret = NULL;
    JsonNode *summary;

    if (c == NULL) {
        fprintf(stderr, "vfio-ntbd: reload refused, nothing changed: %s\n", error->message);
        return 2;
    }
    cl = vn_ctl_client_connect(c->control_socket, VN_RELOAD_WAIT_MS, &error);
    ret = cl != NULL ? vn_ctl_client_execute(cl, "reload", NULL, &error) : NULL;
    if (ret == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 1;
    }
    summary = JSON_NODE_HOLDS_OBJECT(ret)
                  ? json_object_get_member(json_node_get_object(ret), "summary")
                  : NULL;
    printf("vfio-ntbd: node %s: %s\n", vn_ctl_client_node(cl),
           summary != NULL && JSON_NODE_HOLDS_VALUE(summary) &&
                   json_node_get_value_type(summary) == G_TYPE_STRING
               ? json_node_get_string(summary)
               : "reloaded");
    return 0;
}

int main(int argc, char **argv)
{
    g_autofree char *trace = NULL, *config_path = NULL, *level_name = NULL;
    gboolean verbose = FALSE, version = FALSE, stop_workers = FALSE;
    GOptionEntry entries[] = {
        { "config", 'c', 0, G_OPTION_ARG_FILENAME, &config_path,
          "configuration file (default " VN_DEFAULT_CONFIG ")", "FILE" },
        { "check-config", 't', G_OPTION_FLAG_OPTIONAL_ARG, G_OPTION_ARG_CALLBACK, check_config_arg,
          "check the configuration file (FILE, else --config's) and exit: 0 good, 2 bad",
          "[FILE]" },
        { "reload", 0, G_OPTION_FLAG_OPTIONAL_ARG, G_OPTION_ARG_CALLBACK, check_config_arg,
          "make the running daemon of FILE (else --config's) read it again, wait for its answer "
          "and exit: 0 applied, 1 the daemon refused it or cannot be asked, 2 bad file",
          "[FILE]" },
        { "log-level", 0, 0, G_OPTION_ARG_STRING, &level_name,
          "error, warning, notice (default), info (lease, attach and link changes) or debug",
          "LEVEL" },
        { "verbose", 'v', 0, G_OPTION_ARG_NONE, &verbose,
          "log everything, every trace event too (--log-level debug --trace '*')", NULL },
        { "version", 0, 0, G_OPTION_ARG_NONE, &version, "print the version", NULL },
        { "stop-workers", 0, 0, G_OPTION_ARG_NONE, &stop_workers,
          "stop the workers a stopped daemon left in this cgroup (the unit's ExecStopPost= on "
          "systemctl stop), give back the managed functions they lent (--config's) and exit",
          NULL },
        VN_TRACE_OPTION_ENTRY(trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) oc = g_option_context_new("- vfio-ntb host daemon");
    g_autoptr(GError) error = NULL;
    VnLogLevel level = VN_LOG_NOTICE;
    Main m = { 0 };
    VnConfig *conf;
    guint sigs[5];

    g_option_context_add_main_entries(oc, entries, NULL);
    if (!g_option_context_parse(oc, &argc, &argv, &error)) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 2;
    }
    /* GOption takes an optional argument only as --check-config=FILE: the
     * form `sshd -t`'s users type, --check-config FILE, leaves FILE here. */
    if ((check_config || reload) && check_path == NULL && argc == 2) {
        check_path = g_strdup(argv[1]);
        argc--;
    }
    if (argc > 1) {
        fprintf(stderr, "vfio-ntbd: unexpected argument \"%s\" (see --help)\n", argv[1]);
        return 2;
    }
    if (level_name != NULL && !vn_log_level_from_string(level_name, &level)) {
        fprintf(stderr, "vfio-ntbd: --log-level %s: error, warning, notice, info or debug\n",
                level_name);
        return 2;
    }
    if (!vn_trace_setup(trace, verbose, &error)) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 2;
    }
    if (version) {
        printf("vfio-ntbd %s\n", VN_VERSION);
        return 0;
    }
    if (stop_workers) {
        return run_stop_workers(config_path != NULL ? config_path : VN_DEFAULT_CONFIG);
    }
    if (check_config && reload) {
        fprintf(stderr, "vfio-ntbd: --check-config or --reload, not both\n");
        return 2;
    }
    if (check_config || reload) {
        const char *path = check_path != NULL    ? check_path
                           : config_path != NULL ? config_path
                                                 : VN_DEFAULT_CONFIG;
        int rc = reload ? run_reload(path) : run_check(path);

        g_free(check_path);
        return rc;
    }
    /* --verbose means everything, unless a level is named.  (G_MESSAGES_DEBUG
     * still shows what it names: common/log.h.) */
    m.level_from_cli = level_name != NULL || verbose;
    if (level_name == NULL && verbose) {
        level = VN_LOG_DEBUG;
    }
    vn_log_setup(level);
    signal(SIGPIPE, SIG_IGN);
    m.config_path = config_path != NULL ? config_path : VN_DEFAULT_CONFIG;
    conf = vn_conf_load(m.config_path, &error);
    if (conf == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 2;
    }
    if (!m.level_from_cli && conf->log_level_set) {
        vn_log_set_level(conf->log_level);
    }
    m.d = vn_daemon_new(conf, NULL, &error);
    if (m.d == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 1;
    }
    sigs[0] = g_unix_signal_add(SIGTERM, on_stop, &m);
    sigs[1] = g_unix_signal_add(SIGINT, on_stop, &m);
    sigs[2] = g_unix_signal_add(SIGUSR1, on_usr1, &m);
    sigs[3] = g_unix_signal_add(SIGHUP, on_hup, &m);
    /* STATUS= is only for a service manager that listens. */
    sigs[4] = g_getenv("NOTIFY_SOCKET") != NULL
                  ? g_timeout_add_seconds(VN_STATUS_EVERY_S, on_status, &m)
                  : 0;
    vn_daemon_set_reload(m.d, reload_config, &m);
    g_idle_add(on_ready, &m);
    vn_daemon_run(m.d);
    for (size_t i = 0; i < G_N_ELEMENTS(sigs); i++) {
        if (sigs[i] != 0) {
            g_source_remove(sigs[i]);
        }
    }
    vn_daemon_write_stats(m.d);
    vn_daemon_free(m.d);
    g_free(m.status);
    return 0;
}
