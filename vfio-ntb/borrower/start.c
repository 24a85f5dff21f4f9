/*
 * A borrower's start (borrower.h, vn_borrower_start): ATTACH, the windows onto the BARs, the
 * config space mediation reads, then QEMU's socket.  Each is asked of the lender (and of our
 * daemon, for the windows) without waiting: the worker's loop answers its daemon
 * meanwhile, and a lender that takes its time holds nothing but this start.
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower.h"

#include "borrower-int.h"
#include "common/name.h"
#include "fabric/host.h"

#include <errno.h>
#include <gio/gio.h>
#include <linux/pci_regs.h>
#include <string.h>

typedef struct VnBorrowerStart {
    VnBorrower *b;
    char *socket_path;
    bool resume; /* taking over a dead worker's QEMU: the lender resumes our attachment */
    VnBorrowerHandoff handoff;
    VnBorrowerStartedFn done;
    void *opaque;
} VnBorrowerStart;

/* The end of the start: @b serves, or is freed (its DETACH sent) and @error says why. */
static void start_end(VnBorrowerStart *st, GError *error)
{
    VnBorrower *b = st->b;

    if (error != NULL) {
        g_clear_pointer(&b, vn_borrower_free);
    }
    /* What the handoff gave and was not taken (a dead worker's sockets) is closed before
     * the caller hears the end: it may look. */
    vn_borrower_handoff_clear(&st->handoff);
    st->done(st->opaque, b, error);
    g_clear_error(&error);
    g_free(st->socket_path);
    g_free(st);
}

/* QEMU's socket: a new one, or the dead worker's with its client and state. */
static void start_serve(VnBorrowerStart *st)
{
    VnBorrower *b = st->b;
    VnBorrowerHandoff *h = &st->handoff;
    GError *error = NULL;
    bool client = h->client_fd >= 0;

    if (!st->resume) {
        b->server = vn_server_new(st->socket_path, &b->info, &vn_borrower_ops, b, b->ctx, &error);
    } else {
        b->server =
            vn_server_adopt(st->socket_path, g_steal_fd(&h->listen_fd), g_steal_fd(&h->client_fd),
                            &h->caps, &b->info, &vn_borrower_ops, b, b->ctx, &error);
    }
    if (b->server == NULL || (st->resume && !vn_borrower_restore(b, h->state, h->fds, &error))) {
        start_end(st, error);
        return;
    }
    vn_host_on_greeted(b->fab, vn_borrower_kept_again, b);
    if (st->resume) {
        vn_borrower_dma_taken_over(b);
        vn_borrower_kept_again(b); /* rings the relayed vectors too */
        g_message("borrower %s: took over %s from a worker that died (%u DMA mappings, %s QEMU)",
                  b->device, st->socket_path, g_list_length(b->mappings),
                  client ? "with its" : "no");
    } else {
        vn_borrower_keep_sockets(b);
        g_message("borrower %s: borrowed from %s (%s interrupts), serving %s", b->device, b->lender,
                  vn_irq_mode_to_string(b->mode), st->socket_path);
    }
    start_end(st, NULL);
}

static void on_config_read(void *opaque, VnFabricMsg *reply, int err)
{
    VnBorrowerStart *st = opaque;
    VnBorrower *b = st->b;
    GError *error = NULL;

    if (err == 0 && reply->data_len != PCI_CFG_SPACE_SIZE) {
        err = -EPROTO;
    }
    if (err < 0) {
        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-err),
                    "borrower %s: cannot read config space: %s", b->device, g_strerror(-err));
        start_end(st, error);
        return;
    }
    vn_mediate_init(b, reply->data);
    vn_borrower_bars_carve_msix(b);
    start_serve(st);
}

static void on_bars_mapped(VnBorrower *b, GError *error, void *opaque)
{
    VnBorrowerStart *st = opaque;
    VnProtoRegionRw rw = { .region = VFIO_PCI_CONFIG_REGION_INDEX, .count = PCI_CFG_SPACE_SIZE };
    g_autofree char *json = NULL;
    int ret;

    if (error != NULL) {
        start_end(st, error);
        return;
    }
    json = vn_proto_region_rw_to_json(b->device, &rw);
    ret = vn_borrower_call_async(b, VN_PROTO_REGION_RW, json, NULL, 0, on_config_read, st);
    if (ret < 0) {
        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-ret),
                    "borrower %s: cannot read config space: %s", b->device, g_strerror(-ret));
        start_end(st, error);
    }
}

static void on_attached(void *opaque, VnFabricMsg *reply, int err)
{
    VnBorrowerStart *st = opaque;
    VnBorrower *b = st->b;
    GError *error = NULL;
    VnProtoDevice d;

    if (err < 0) {
        g_autofree char *why = reply != NULL ? vn_fabric_error_message(reply) : NULL;

        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-err),
                    "borrower %s: %s refused to %s it: %s", b->device, b->lender,
                    st->resume ? "resume lending" : "lend", why != NULL ? why : g_strerror(-err));
        start_end(st, error);
        return;
    }
    b->attached = true;
    if (!vn_proto_device_from_json(reply->json, &d, &error)) {
        g_prefix_error(&error, "borrower %s: from %s: ", b->device, b->lender);
        start_end(st, error);
        return;
    }
    vn_borrower_describe(b, &d);
    vn_borrower_bars_map(b, &d, on_bars_mapped, st);
}

static void on_lender_linked(void *opaque, int err)
{
    VnBorrowerStart *st = opaque;
    VnBorrower *b = st->b;
    VnProtoAttach at = { .resume = st->resume, .irq_mode = b->mode };
    g_autofree char *json = NULL;
    GError *error = NULL;
    int ret;

    if (err < 0) {
        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-err),
                    "borrower %s: cannot connect to %s: %s", b->device, b->lender,
                    g_strerror(-err));
        start_end(st, error);
        return;
    }
    at.max_window = vn_fabric_limits(b->fab)->max_window_size;
    g_strlcpy(at.device, b->device, sizeof(at.device));
    json = vn_proto_attach_to_json(&at);
    ret = vn_borrower_call_async(b, VN_PROTO_ATTACH, json, NULL, 0, on_attached, st);
    if (ret < 0) {
        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-ret),
                    "borrower %s: cannot ask %s: %s", b->device, b->lender, g_strerror(-ret));
        start_end(st, error);
    }
}

void vn_borrower_start(VnFabric *fab, const char *lender, const char *device, VnIrqMode mode,
                       const char *socket_path, int handoff_fd, GMainContext *ctx,
                       VnBorrowerStartedFn done, void *opaque)
{
    VnBorrowerStart *st = g_new0(VnBorrowerStart, 1);
    GError *error = NULL;
    VnBorrower *b;

    st->socket_path = g_strdup(socket_path);
    st->resume = handoff_fd >= 0;
    st->handoff = (VnBorrowerHandoff){ .listen_fd = -1, .client_fd = -1 };
    st->done = done;
    st->opaque = opaque;
    st->b = b = vn_borrower_alloc(fab, lender, device, mode);
    b->ctx = ctx;
    if (!vn_name_valid(VN_NAME_DEVICE, device)) {
        g_set_error(&error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "borrower: device name \"%.80s\" is not %s", device,
                    vn_name_rule(VN_NAME_DEVICE));
        start_end(st, error);
        return;
    }
    if (st->resume && !vn_borrower_handoff_read(handoff_fd, device, &st->handoff, &error)) {
        start_end(st, error);
        return;
    }
    /* The lender's link may be on its way (an NTB session): the ATTACH goes once it is up. */
    if (vn_fabric_connect_async(fab, lender, on_lender_linked, st) == NULL) {
        g_set_error(&error, G_IO_ERROR, G_IO_ERROR_CLOSED, "borrower %s: the fabric closes",
                    device);
        start_end(st, error);
    }
}
