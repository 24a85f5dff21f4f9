/*
 * vfio-ntbd: one per host.  Attaches the node to the fabric, lends the
 * devices its config file names to the nodes their access lists allow,
 * borrows devices for VMs on request (control socket, see docs/control.md)
 * or from its config file, and keeps leases with the other daemons
 * (daemon.c and its parts).
 *
 *   vfio-ntbd [--config FILE] [--verbose]
 *
 * SIGUSR1 writes the counters to the stats file; SIGTERM/SIGINT stop.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "daemon-int.h"

#include "config.h"
#include "common/trace.h"

#include <glib-unix.h>
#include <signal.h>
#include <stdio.h>

static gboolean on_usr1(gpointer data)
{
    vn_daemon_write_stats(data);
    return G_SOURCE_CONTINUE;
}

static gboolean on_stop(gpointer data)
{
    vn_daemon_quit(data);
    return G_SOURCE_CONTINUE;
}

int main(int argc, char **argv)
{
    g_autofree char *trace = NULL;
    g_autofree char *config_path = NULL;
    gboolean verbose = FALSE, version = FALSE;
    GOptionEntry entries[] = {
        { "config", 'c', 0, G_OPTION_ARG_FILENAME, &config_path,
          "configuration file (default /etc/vfio-ntb/vfio-ntbd.conf)", "FILE" },
        { "verbose", 'v', 0, G_OPTION_ARG_NONE, &verbose, "log everything, every trace event too",
          NULL },
        { "version", 0, 0, G_OPTION_ARG_NONE, &version, "print the version", NULL },
        VN_TRACE_OPTION_ENTRY(trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) oc = g_option_context_new("- vfio-ntb host daemon");
    g_autoptr(GError) error = NULL;
    VnConfig *conf;
    VnDaemon *d;
    guint sigs[3];

    g_option_context_add_main_entries(oc, entries, NULL);
    if (!g_option_context_parse(oc, &argc, &argv, &error)) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
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
    signal(SIGPIPE, SIG_IGN);
    conf = vn_conf_load(config_path ? config_path : "/etc/vfio-ntb/vfio-ntbd.conf", &error);
    if (conf == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 2;
    }
    d = vn_daemon_new(conf, NULL, &error);
    if (d == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 1;
    }
    sigs[0] = g_unix_signal_add(SIGTERM, on_stop, d);
    sigs[1] = g_unix_signal_add(SIGINT, on_stop, d);
    sigs[2] = g_unix_signal_add(SIGUSR1, on_usr1, d);
    vn_daemon_run(d);
    for (int i = 0; i < 3; i++) {
        g_source_remove(sigs[i]);
    }
    vn_daemon_write_stats(d);
    vn_daemon_free(d);
    return 0;
}
