/*
 * vfio-ntb-simdev: a simulated PCIe NVMe controller served over vfio-user.
 *
 *   vfio-ntb-simdev --socket PATH --backing FILE --size-mib N
 *                   [--serial S] [--vectors N] [--interrupts msix|msi]
 *                   [--cmb-mib N] [--trap-bars] [--stats-file PATH] [--verbose]
 *
 * QEMU's vfio-user-pci client connects to PATH; the guest's stock nvme driver
 * binds to the device and its I/O lands in FILE (created, or extended to N
 * MiB keeping its data).  One client at a time; after a disconnect the next
 * may connect and finds the same namespace.  SIGTERM/SIGINT end the process
 * cleanly and remove the socket.
 *
 * --interrupts msi replaces MSI-X by MSI (fewer vectors, no BAR4): stock
 * QEMU 11.1 aborts when it hot-unplugs a vfio-user device with MSI-X.
 * --cmb-mib N gives the controller an N MiB Controller Memory Buffer (a
 * power of two, 2..256; 0 or absent: none) in BAR2, for read and write data
 * (CMBSZ RDS|WDS): Linux's nvme driver publishes it as p2pmem, a target
 * another device can DMA into.  Its memory is a memfd the client maps, so a
 * lender exports it to borrowers as a window.
 * --trap-bars offers BAR0 (and the CMB) without its memory: every register
 * and doorbell access is a message, as with a device whose BAR a lender
 * cannot map.
 *
 * This file only parses arguments and wires the pieces: the device model
 * (pcidev.c) behind the server engine (vfio-user/server.c) in the default
 * GMainContext, with the device's engine thread started in between.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "common/util.h"
#include "config.h"
#include "pcidev.h"
#include "vfio-user/server.h"
#include "common/trace.h"

#include <glib-unix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

/* Largest --size-mib: the NVMe model's 16 TiB limit. */
#define VN_SIMDEV_MAX_SIZE_MIB (VN_NVME_MAX_SIZE >> 20)
#define VN_SIMDEV_DEFAULT_SERIAL "VNSIMDEV0001"
/* Admin queue + 8 I/O queues, each with its own vector. */
#define VN_SIMDEV_DEFAULT_VECTORS 9

typedef struct Options {
    char *trace;
    char *socket;
    char *backing;
    gint64 size_mib;
    char *serial;
    gint vectors;
    char *interrupts;
    VnPciCfgIrqMode irq_mode; /* parsed from interrupts */
    gint cmb_mib;
    gboolean trap_bars;
    gboolean verbose;
    char *stats_file;
} Options;

static void options_clear(Options *o)
{
    g_free(o->trace);
    g_free(o->socket);
    g_free(o->backing);
    g_free(o->serial);
    g_free(o->interrupts);
    g_free(o->stats_file);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Options, options_clear)

static bool options_parse(Options *o, int *argc, char ***argv, GError **error)
{
    GOptionEntry entries[] = {
        { "socket", 0, 0, G_OPTION_ARG_FILENAME, &o->socket,
          "vfio-user socket to listen on (must not exist)", "PATH" },
        { "backing", 0, 0, G_OPTION_ARG_FILENAME, &o->backing,
          "namespace backing file (created or extended)", "FILE" },
        { "size-mib", 0, 0, G_OPTION_ARG_INT64, &o->size_mib, "namespace size in MiB", "N" },
        { "serial", 0, 0, G_OPTION_ARG_STRING, &o->serial,
          "controller serial number (1-20 ASCII characters)", "S" },
        { "vectors", 0, 0, G_OPTION_ARG_INT, &o->vectors,
          "interrupt vectors (2-128, default 9: admin + 8 I/O queues; MSI offers the "
          "largest power of two not above N, at most 32)",
          "N" },
        { "interrupts", 0, 0, G_OPTION_ARG_STRING, &o->interrupts,
          "msix (default, as NVMe controllers have) or msi (stock QEMU can hot-unplug it)",
          "MODE" },
        { "cmb-mib", 0, 0, G_OPTION_ARG_INT, &o->cmb_mib,
          "Controller Memory Buffer in BAR2 of N MiB (a power of two, 2-256; Linux publishes it "
          "as p2pmem); 0 (default) for none",
          "N" },
        { "trap-bars", 0, 0, G_OPTION_ARG_NONE, &o->trap_bars,
          "offer BAR0 and the CMB without their memory: every access is a message", NULL },
        { "stats-file", 0, 0, G_OPTION_ARG_FILENAME, &o->stats_file,
          "write the server's counters as JSON here on SIGUSR1 and at exit", "PATH" },
        { "verbose", 'v', 0, G_OPTION_ARG_NONE, &o->verbose, "log every message and state change",
          NULL },
        VN_TRACE_OPTION_ENTRY(o->trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) ctx = g_option_context_new("- simulated NVMe over vfio-user");

    o->vectors = VN_SIMDEV_DEFAULT_VECTORS;
    o->size_mib = -1; /* "not given", unlike an explicit 0 */
    g_option_context_add_main_entries(ctx, entries, NULL);
    if (!g_option_context_parse(ctx, argc, argv, error)) {
        return false;
    }
    if (*argc > 1) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_FAILED, "unexpected argument '%s'",
                    (*argv)[1]);
        return false;
    }
    if (o->socket == NULL || o->backing == NULL || o->size_mib == -1) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_FAILED,
                    "--socket, --backing and --size-mib are required");
        return false;
    }
    /* CLI input is checked like any peer's: named bounds, no overflow. */
    if (o->size_mib < 1 || (guint64)o->size_mib > VN_SIMDEV_MAX_SIZE_MIB) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                    "--size-mib %" G_GINT64_FORMAT " is outside 1..%" G_GUINT64_FORMAT, o->size_mib,
                    (guint64)VN_SIMDEV_MAX_SIZE_MIB);
        return false;
    }
    if (o->vectors < (gint)VN_PCIDEV_MIN_VECTORS || o->vectors > (gint)VN_PCIDEV_MAX_VECTORS) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                    "--vectors %d is outside %u..%u", o->vectors, VN_PCIDEV_MIN_VECTORS,
                    VN_PCIDEV_MAX_VECTORS);
        return false;
    }
    if (!vn_nvme_cmb_mib_valid(o->cmb_mib)) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                    "--cmb-mib %d is not 0 or a power of two from %u to %u", o->cmb_mib,
                    VN_NVME_MIN_CMB_MIB, VN_NVME_MAX_CMB_MIB);
        return false;
    }
    o->irq_mode = VN_PCICFG_IRQ_MSIX;
    if (o->interrupts != NULL && !vn_pcicfg_irq_mode_from_string(o->interrupts, &o->irq_mode)) {
        g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                    "--interrupts '%s' is neither %s nor %s", o->interrupts,
                    vn_pcicfg_irq_mode_to_string(VN_PCICFG_IRQ_MSIX),
                    vn_pcicfg_irq_mode_to_string(VN_PCICFG_IRQ_MSI));
        return false;
    }
    if (o->serial == NULL) {
        o->serial = g_strdup(VN_SIMDEV_DEFAULT_SERIAL);
    }
    return true;
}

static char *stats_json(void *opaque)
{
    return vn_server_stats_json(opaque);
}

int main(int argc, char **argv)
{
    g_auto(Options) opt = { 0 };
    g_autoptr(GError) error = NULL;
    g_autoptr(VnPciDev) dev = NULL;
    g_autoptr(VnServer) server = NULL;
    g_autoptr(GMainLoop) loop = NULL;
    g_autofree char *cmb = NULL;
    VnPciDevParams params;
    VnUtilStatsFile stats;

    if (!options_parse(&opt, &argc, &argv, &error)) {
        fprintf(stderr, "vfio-ntb-simdev: %s\n", error->message);
        return 2;
    }
    if (!vn_trace_setup(opt.trace, opt.verbose, &error)) {
        fprintf(stderr, "vfio-ntb-simdev: %s\n", error->message);
        return 2;
    }
    /* A client that vanishes mid-reply must not kill us. */
    signal(SIGPIPE, SIG_IGN);

    params = (VnPciDevParams){
        .backing = opt.backing,
        .size = (uint64_t)opt.size_mib << 20,
        .serial = opt.serial,
        .vectors = (uint32_t)opt.vectors,
        .irq_mode = opt.irq_mode,
        .trap_bars = opt.trap_bars,
        .cmb_mib = (uint32_t)opt.cmb_mib,
    };
    dev = vn_pcidev_new(&params, &error);
    if (dev == NULL) {
        g_printerr("vfio-ntb-simdev: %s\n", error->message);
        return 1;
    }
    server = vn_server_new(opt.socket, vn_pcidev_info(dev), &vn_pcidev_ops, dev, NULL, &error);
    if (server == NULL) {
        g_printerr("vfio-ntb-simdev: %s\n", error->message);
        return 1;
    }
    if (!vn_pcidev_start(dev, vn_server_dma(server), vn_server_irqs(server), &error)) {
        g_printerr("vfio-ntb-simdev: %s\n", error->message);
        return 1;
    }

    cmb = opt.cmb_mib == 0 ? g_strdup("no CMB")
                           : g_strdup_printf("CMB %d MiB in BAR%u", opt.cmb_mib, VN_NVME_CMB_BAR);
    loop = g_main_loop_new(NULL, FALSE);
    vn_util_stats_file_start(&stats, opt.stats_file, stats_json, server);
    g_message("simdev %s: serving %s (%" G_GINT64_FORMAT " MiB, serial %s, interrupts %s, "
              "%u vectors, %s) on %s",
              VN_VERSION, opt.backing, opt.size_mib, opt.serial,
              vn_pcicfg_irq_mode_to_string(opt.irq_mode), vn_pcidev_vectors(dev), cmb, opt.socket);
    vn_util_run_until_signalled(loop);

    /* The engine uses the server's DMA and irq tables: stop it first, then
     * the server (drops the client, resets the device, removes the socket),
     * then the device. */
    vn_pcidev_stop(dev);
    vn_util_stats_file_stop(&stats);
    g_clear_pointer(&server, vn_server_free);
    g_clear_pointer(&dev, vn_pcidev_free);
    g_message("simdev: stopped");
    return 0;
}
