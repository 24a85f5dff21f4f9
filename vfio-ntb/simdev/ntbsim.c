/*
 * vfio-ntb-ntbsim: a simulated NTB adapter pair served over vfio-user, for tests.
 *
 *   vfio-ntb-ntbsim --port0 PATH --port1 PATH [--window-mib N[,N...]] [--windows 1|2|3]
 *                   [--stats-file PATH] [--trap-windows]
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
 * the stats file (and so does the exit); SIGUSR2 toggles --trap-windows.
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
    char *window_mib;
    gint windows;
    uint64_t sizes[VN_EPF_MAX_WINDOWS];
    char *stats_file;
    gboolean trap_windows;
    gboolean verbose;
} Options;

static void options_clear(Options *o)
{
    g_free(o->trace);
    g_free(o->window_mib);
    g_free(o->port[0]);
    g_free(o->port[1]);
    g_free(o->stats_file);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Options, options_clear)

/* --window-mib: one size for every window, or one per window (vn_epf_new checks the rest). */
static bool window_sizes_parse(Options *o, GError **error)
{
    g_auto(GStrv) parts = g_strsplit(o->window_mib != NULL ? o->window_mib : "", ",", -1);
    guint n = g_strv_length(parts);

    if (o->windows < 1 || o->windows > (gint)VN_EPF_MAX_WINDOWS) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "--windows %d: 1 to %u",
                    o->windows, VN_EPF_MAX_WINDOWS);
        return false;
    }
    if (o->window_mib != NULL && n != 1 && n != (guint)o->windows) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                    "--window-mib %s: one size, or one for each of the %d windows", o->window_mib,
                    o->windows);
        return false;
    }
    for (gint w = 0; w < o->windows; w++) {
        const char *text = o->window_mib == NULL ? NULL : parts[n == 1 ? 0 : w];
        guint64 mib = NTBSIM_DEFAULT_WINDOW_MIB;

        if (text != NULL && (!g_ascii_string_to_unsigned(text, 10, NTBSIM_MIN_WINDOW_MIB,
                                                         NTBSIM_MAX_WINDOW_MIB, &mib, NULL) ||
                             (mib & (mib - 1)) != 0)) {
            g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                        "--window-mib %s: a power of two in %d..%d", text, NTBSIM_MIN_WINDOW_MIB,
                        NTBSIM_MAX_WINDOW_MIB);
            return false;
        }
        o->sizes[w] = mib << 20;
    }
    return true;
}

static bool options_parse(Options *o, int *argc, char ***argv, GError **error)
{
    GOptionEntry entries[] = {
        { "port0", 0, 0, G_OPTION_ARG_FILENAME, &o->port[0],
          "vfio-user socket of the first host's NTB function (must not exist)", "PATH" },
        { "port1", 0, 0, G_OPTION_ARG_FILENAME, &o->port[1],
          "vfio-user socket of the second host's NTB function (must not exist)", "PATH" },
        { "window-mib", 0, 0, G_OPTION_ARG_STRING, &o->window_mib,
          "size of each memory window, powers of two: one for all, or one per window (default 4)",
          "N[,N...]" },
        { "windows", 0, 0, G_OPTION_ARG_INT, &o->windows,
          "memory windows per host: 1 (BAR4, 64-bit), 2 (BAR4 and BAR5, 32-bit) or 3 (the "
          "j721e map: BAR2 after the doorbells, BAR3, BAR4 64-bit); default 1",
          "N" },
        { "stats-file", 0, 0, G_OPTION_ARG_FILENAME, &o->stats_file,
          "write the counters as JSON here on SIGUSR1 and at exit", "PATH" },
        { "trap-windows", 0, 0, G_OPTION_ARG_NONE, &o->trap_windows,
          "never let a host's QEMU map a window onto the peer's memory (every access a "
          "message, as under a QEMU without the region-map patch); SIGUSR2 toggles it",
          NULL },
        { "verbose", 'v', 0, G_OPTION_ARG_NONE, &o->verbose, "log every command", NULL },
        VN_TRACE_OPTION_ENTRY(o->trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) ctx =
        g_option_context_new("- a simulated NTB (Linux's ntb_hw_epf binds) over vfio-user");

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
    return window_sizes_parse(o, error);
}

static char *stats_json(void *opaque)
{
    return vn_ntbdev_stats_json(opaque);
}

/* SIGUSR2: windows mapped by their hosts' QEMUs, or every access trapped (a bench compares
 * both in one run of the same VMs). */
static gboolean on_usr2(gpointer data)
{
    VnNtbDev *dev = data;

    vn_ntbdev_set_mapping(dev, !vn_ntbdev_mapping(dev));
    g_message("ntbsim: windows %s",
              vn_ntbdev_mapping(dev) ? "mapped where they reach RAM" : "trapped");
    return G_SOURCE_CONTINUE;
}

int main(int argc, char **argv)
{
    g_auto(Options) opt = { 0 };
    g_autoptr(GError) error = NULL;
    g_autoptr(VnNtbDev) dev = NULL;
    g_autoptr(GMainLoop) loop = NULL;
    VnServer *server[2] = { NULL, NULL };
    VnUtilStatsFile stats;
    guint usr2;
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

    dev = vn_ntbdev_new(opt.sizes, (unsigned)opt.windows, &error);
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
    vn_ntbdev_set_mapping(dev, !opt.trap_windows);
    usr2 = g_unix_signal_add(SIGUSR2, on_usr2, dev);
    vn_util_stats_file_start(&stats, opt.stats_file, stats_json, dev);
    g_message("ntbsim %s: NTB ports on %s and %s, %d windows of %s MiB", VN_VERSION, opt.port[0],
              opt.port[1], opt.windows, opt.window_mib != NULL ? opt.window_mib : "4");
    vn_util_run_until_signalled(loop);
    vn_util_stats_file_stop(&stats);
    g_source_remove(usr2);
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
