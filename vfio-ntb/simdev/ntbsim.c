/*
 * vfio-ntb-ntbsim: a simulated NTB adapter pair served over vfio-user, for tests.
 *
 *   vfio-ntb-ntbsim --port0 PATH --port1 PATH [--window-mib N] [--windows 1|2]
 *                   [--stats-file PATH]
 *                   [--verbose]
 *
 * Two hosts (two QEMUs, each with a vfio-user-pci device on one of the sockets) are joined
 * by a non-transparent bridge that Linux's unmodified ntb_hw_epf driver binds to, in each
 * host (epf.h says what it models, ntbdev.h how it is served).  Linux's NTB core and its
 * clients (ntb_tool, ntb_perf, ntb_pingpong, ntb_transport) and our own kernel module then
 * run on it as on hardware: the link comes up when both hosts enable it and goes down when
 * either QEMU goes away; doorbells are MSI-X interrupts; each host's window reaches the
 * other host's memory at the translation that host programmed, through its IOMMU.
 *
 * Guest RAM must be shareable (memory-backend-memfd,share=on), as for any vfio-user device.
 * One client per socket at a time; a host that reconnects finds its port reset.  SIGTERM
 * and SIGINT end the process cleanly and remove the sockets; SIGUSR1 writes the counters to
 * the stats file (and so does the exit).
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "common/util.h"
#include "config.h"
#include "ntbdev.h"
#include "vfio-user/server.h"
#include "common/trace.h"

#include <glib-unix.h>
#include <signal.h>
#include <stdio.h>

/* Window size bounds in MiB (epf.h's, which a BAR allows). */
#define NTBSIM_MIN_WINDOW_MIB 1
#define NTBSIM_MAX_WINDOW_MIB ((gint)(VN_EPF_MAX_WINDOW >> 20))
/* What ntb_tool's and ntb_perf's buffers fit (a 4 MiB dma_alloc_coherent). */
#define NTBSIM_DEFAULT_WINDOW_MIB 4

typedef struct Options {
    char *trace;
    char *port[2];
    gint window_mib;
    gint windows;
    char *stats_file;
    gboolean verbose;
} Options;

static void options_clear(Options *o)
{
    g_free(o->trace);
    g_free(o->port[0]);
    g_free(o->port[1]);
    g_free(o->stats_file);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Options, options_clear)

static bool options_parse(Options *o, int *argc, char ***argv, GError **error)
{
    GOptionEntry entries[] = {
        { "port0", 0, 0, G_OPTION_ARG_FILENAME, &o->port[0],
          "vfio-user socket of the first host's NTB function (must not exist)", "PATH" },
        { "port1", 0, 0, G_OPTION_ARG_FILENAME, &o->port[1],
          "vfio-user socket of the second host's NTB function (must not exist)", "PATH" },
        { "window-mib", 0, 0, G_OPTION_ARG_INT, &o->window_mib,
          "size of each host's memory window (a power of two, default 4)", "N" },
        { "windows", 0, 0, G_OPTION_ARG_INT, &o->windows,
          "memory windows per host: 1 (BAR4, 64-bit) or 2 (BAR4 and BAR5, 32-bit); default 1",
          "N" },
        { "stats-file", 0, 0, G_OPTION_ARG_FILENAME, &o->stats_file,
          "write the counters as JSON here on SIGUSR1 and at exit", "PATH" },
        { "verbose", 'v', 0, G_OPTION_ARG_NONE, &o->verbose, "log every command", NULL },
        VN_TRACE_OPTION_ENTRY(o->trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) ctx =
        g_option_context_new("- a simulated NTB (Linux's ntb_hw_epf binds) over vfio-user");

    o->window_mib = NTBSIM_DEFAULT_WINDOW_MIB;
    o->windows = 1;
    g_option_context_add_main_entries(ctx, entries, NULL);
    if (!g_option_context_parse(ctx, argc, argv, error)) {
        return false;
    }
    if (*argc > 1) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_FAILED, "unexpected argument '%s'",
                    (*argv)[1]);
        return false;
    }
    if (o->port[0] == NULL || o->port[1] == NULL) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_FAILED,
                    "--port0 and --port1 are required");
        return false;
    }
    if (o->window_mib < NTBSIM_MIN_WINDOW_MIB || o->window_mib > NTBSIM_MAX_WINDOW_MIB ||
        (o->window_mib & (o->window_mib - 1)) != 0) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                    "--window-mib %d: a power of two in %d..%d", o->window_mib,
                    NTBSIM_MIN_WINDOW_MIB, NTBSIM_MAX_WINDOW_MIB);
        return false;
    }
    return true;
}

static char *stats_json(void *opaque)
{
    return vn_ntbdev_stats_json(opaque);
}

int main(int argc, char **argv)
{
    g_auto(Options) opt = { 0 };
    g_autoptr(GError) error = NULL;
    g_autoptr(VnNtbDev) dev = NULL;
    g_autoptr(GMainLoop) loop = NULL;
    VnServer *server[2] = { NULL, NULL };
    VnUtilStatsFile stats;
    int rc = 0;

    if (!options_parse(&opt, &argc, &argv, &error)) {
        fprintf(stderr, "vfio-ntb-ntbsim: %s\n", error->message);
        return 2;
    }
    if (!vn_trace_setup(opt.trace, opt.verbose, &error)) {
        fprintf(stderr, "vfio-ntb-ntbsim: %s\n", error->message);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a client that vanishes mid-reply must not kill us */

    dev = vn_ntbdev_new((uint64_t)opt.window_mib << 20, (unsigned)opt.windows, &error);
    for (unsigned p = 0; dev != NULL && p < 2 && error == NULL; p++) {
        server[p] = vn_server_new(opt.port[p], vn_ntbdev_info(dev), &vn_ntbdev_ops,
                                  vn_ntbdev_port(dev, p), NULL, &error);
        if (server[p] != NULL) {
            vn_ntbdev_attach(dev, p, server[p]);
        }
    }
    if (error != NULL) {
        g_printerr("vfio-ntb-ntbsim: %s\n", error->message);
        rc = 1;
        goto out;
    }

    loop = g_main_loop_new(NULL, FALSE);
    vn_util_stats_file_start(&stats, opt.stats_file, stats_json, dev);
    g_message("ntbsim %s: NTB ports on %s and %s, windows of %d MiB", VN_VERSION, opt.port[0],
              opt.port[1], opt.window_mib);
    vn_util_run_until_signalled(loop);
    vn_util_stats_file_stop(&stats);
out:
    /* The servers drop their clients (which resets the ports) and remove the sockets; the
     * device's ports stop using their tables first. */
    for (unsigned p = 0; p < 2; p++) {
        if (server[p] != NULL) {
            vn_server_free(server[p]);
            vn_ntbdev_attach(dev, p, NULL);
        }
    }
    g_message("ntbsim: stopped");
    return rc;
}
