/*
 * vfio-ntb-lender: one lent device's backend, in a process of its own so
 * that it outlives vfio-ntbd: the device server sees one vfio-user client
 * for as long as the device is lent, and a daemon restart (a crash, an
 * upgrade) leaves every borrower's data path -- DMA, interrupts, the
 * device's state -- as it was.
 *
 *   vfio-ntb-lender --port PATH --node NAME --device NAME --device-socket PATH
 *                   [--control PATH] [--run-as UID:GID]
 *
 * It is not a fabric node: it answers the lending protocol (lender.h) for
 * its host (NAME) through vfio-ntbd's port for it (fabric/host.h), which
 * passes it the requests of the device's lease holder and tells it when
 * the lease ends (the holder's link goes down, for this worker): then it
 * fences the device.  Its device operations run in its own loop, never in
 * the daemon's.  On its control channel (--control, common/wctl.h) it
 * answers "stats" with its counters.  SIGTERM fences and ends it.
 *
 * With --run-as (vfio-ntbd's worker-user), once set up it gives up its privileges
 * (common/privs.h): it is then that user, with no capabilities, and holds only fds; what
 * reaches its device is vfio-ntbd's to open when the worker asks (fabric/host.h:
 * vn_host_dial_device): a connection to the device server its config names, or the PCI
 * function's IOMMU group (/dev/vfio/N).  A managed function it bound as root is given back
 * by vfio-ntbd after the worker is gone.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender.h"

#include "backend.h"

#include "common/json.h"
#include "common/privs.h"
#include "common/util.h"
#include "common/wctl.h"
#include "fabric/host.h"
#include "pcibind.h"
#include "common/trace.h"

#include <gio/gio.h>
#include <glib-unix.h>
#include <json-glib/json-glib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

typedef struct Worker {
    VnFabric *fab;
    VnLender *l;
    GMainLoop *loop;
    const char *at; /* where its device is: a device server's socket, or a PCI function */
} Worker;

static void on_link(void *opaque, const char *peer, bool up)
{
    Worker *w = opaque;

    /* The daemon reports the holder "down" when the lease ended; it lends the device again
     * once we say it is fenced (or kills us when we do not in time). */
    if (up && w->l != NULL) {
        vn_lender_peer_up(w->l, peer);
    }
    if (!up && w->l != NULL) {
        vn_lender_peer_down(w->l, peer);
        vn_host_fenced(w->fab);
    }
}

static void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    Worker *w = opaque;

    vn_lender_request(w->l, msg, token);
}

static const VnFabricHandlers handlers = {
    .on_link = on_link,
    .on_request = on_request,
};

/*
 * managed = yes: bind @bdf to vfio-pci, the driver it had kept in @state
 * (pcibind.h: vn_pcibind_keep) so that a restarted worker gives it back to that one, not to
 * vfio-pci.  The driver's name, or NULL (said on stderr).
 */
static char *managed_take(const char *bdf, const char *state)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *kept = NULL, *kept_bdf = NULL, *was = NULL;

    if (!vn_pcibind_to_vfio("/sys", bdf, &was, &error)) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        return NULL;
    }
    if (vn_pcibind_kept(state, &kept, &kept_bdf) &&
        (kept_bdf == NULL || strcmp(kept_bdf, bdf) == 0)) {
        /* Written anew with the function: an older worker's file named none. */
        if (kept_bdf == NULL && !vn_pcibind_keep(state, bdf, kept, &error)) {
            fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        }
        return g_steal_pointer(&kept);
    }
    if (!vn_pcibind_keep(state, bdf, was, &error)) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
    }
    return g_steal_pointer(&was);
}

static void managed_give_back(const char *bdf, const char *state)
{
    g_autoptr(GError) error = NULL;

    if (!vn_pcibind_give_back("/sys", state, bdf, &error)) {
        g_warning("lender worker: %s", error->message);
    }
}

/* VFIO counts the memory a device's DMA pins against RLIMIT_MEMLOCK once the worker has no
 * CAP_IPC_LOCK: raised while it can (as root, before it gives up its privileges), else what
 * it was given stays (the unit's vfio.conf drop-in: LimitMEMLOCK=infinity). */
static void memlock_unbounded(void)
{
    struct rlimit r = { RLIM_INFINITY, RLIM_INFINITY };

    if (setrlimit(RLIMIT_MEMLOCK, &r) < 0 && getrlimit(RLIMIT_MEMLOCK, &r) == 0 &&
        r.rlim_cur != RLIM_INFINITY) {
        g_warning("lender worker: locked memory is limited to %llu KiB (RLIMIT_MEMLOCK): DMA "
                  "mappings beyond it fail (LimitMEMLOCK=infinity: the vfio.conf drop-in)",
                  (unsigned long long)r.rlim_cur / 1024);
    }
}

/* The host wants the device back: the daemon revokes the lease (the
 * lender fences by itself if the kernel keeps asking). */
static void on_device_request(void *opaque)
{
    Worker *w = opaque;

    if (!vn_host_device_request(w->fab)) {
        g_warning("lender worker: the daemon is away; the host's device request waits for "
                  "it (or for the lender's own fence)");
    }
}

/* The device server came or went: the daemon tells the holder (and says it again to a
 * daemon that restarts: fabric/host.h). */
static void on_server(void *opaque, bool up, uint32_t gen, const char *why)
{
    Worker *w = opaque;

    if (!vn_host_device_server(w->fab, up, gen)) {
        g_info("lender worker: the daemon is away; it hears that the device server %s at its "
               "greeting",
               up ? "answers" : "is lost");
    }
}

/* A dial asked of the daemon for the lender: whom to tell, and how to say a refusal. */
typedef struct Dialing {
    Worker *w;
    int group; /* a PCI function's IOMMU group, or -1 for a device server */
    VnLenderDialedFn done;
    void *done_opaque;
} Dialing;

static void dialled(void *opaque, int fd, const GError *error)
{
    g_autofree Dialing *d = opaque;
    g_autoptr(GError) said = NULL;

    if (fd < 0 && d->group >= 0) {
        said = g_error_new(G_IO_ERROR, error->code,
                           "/dev/vfio/%d (IOMMU group of %s): %s (is it bound to vfio-pci, and "
                           "not in use?)",
                           d->group, d->w->at, error->message);
    } else if (fd < 0) {
        said = g_error_new(error->domain, error->code, "device server %s: %s", d->w->at,
                           error->message);
    }
    d->done(d->done_opaque, fd, said);
}

/* A connection to the device server, made by the daemon (we may not reach its socket). */
static void dial_through_daemon(void *opaque, VnLenderDialedFn done, void *done_opaque)
{
    Dialing *d = g_new0(Dialing, 1);

    *d = (Dialing){ .w = opaque, .group = -1, .done = done, .done_opaque = done_opaque };
    vn_host_dial_device_async(d->w->fab, dialled, d);
}

/* A PCI function's: the daemon opens its IOMMU group; said as an open here would say it. */
static void open_group_through_daemon(void *opaque, VnLenderDialedFn done, void *done_opaque)
{
    Worker *w = opaque;
    g_autoptr(GError) error = NULL;
    int n = vn_backend_vfio_group(w->at, &error);
    Dialing *d;

    if (n < 0) {
        done(done_opaque, -1, error);
        return;
    }
    d = g_new0(Dialing, 1);
    *d = (Dialing){ .w = w, .group = n, .done = done, .done_opaque = done_opaque };
    vn_host_dial_device_async(w->fab, dialled, d);
}

/* "stats": the lender's counters and how its device server is doing. */
static char *on_command(void *opaque, const char *name, GError **error)
{
    Worker *w = opaque;
    g_autoptr(JsonObject) o = NULL;
    g_autoptr(JsonNode) root = NULL;
    g_autofree char *stats = NULL;
    const char *borrower;

    if (g_str_has_prefix(name, "trace ")) {
        return vn_trace_command(name + strlen("trace "), error);
    }
    if (strcmp(name, "stats") != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, "no command \"%.32s\"", name);
        return NULL;
    }
    stats = vn_lender_stats_json(w->l);
    o = vn_json_parse_object(stats, -1, 65536, error);
    if (o == NULL) {
        return NULL;
    }
    borrower = vn_lender_borrower(w->l);
    json_object_set_string_member(o, "device_server", vn_lender_device_state(w->l));
    json_object_set_string_member(o, "last_stall", vn_lender_last_stall(w->l));
    json_object_set_string_member(o, "device_server_loss", vn_lender_server_loss(w->l));
    if (borrower != NULL) {
        json_object_set_string_member(o, "borrower", borrower);
    } else {
        json_object_set_null_member(o, "borrower");
    }
    root = json_node_new(JSON_NODE_OBJECT);
    json_node_set_object(root, o);
    return json_to_string(root, FALSE);
}

int main(int argc, char **argv)
{
    g_autofree char *trace = NULL, *port_fd = NULL;
    g_autofree char *port = NULL, *node = NULL, *device = NULL, *dsock = NULL;
    g_autofree char *control = NULL, *backend = NULL, *at = NULL, *managed = NULL;
    g_autofree char *was = NULL, *run_as = NULL;
    GOptionEntry entries[] = {
        { "port", 0, 0, G_OPTION_ARG_FILENAME, &port, "vfio-ntbd's port for this worker", "PATH" },
        { "port-fd", 0, 0, G_OPTION_ARG_STRING, &port_fd,
          "the connection to the port vfio-ntbd made for this worker", "FD" },
        { "node", 0, 0, G_OPTION_ARG_STRING, &node, "this host's fabric node", "NAME" },
        { "device", 0, 0, G_OPTION_ARG_STRING, &device, "the lent device's name", "NAME" },
        { "backend", 0, 0, G_OPTION_ARG_STRING, &backend,
          "how the device is reached (default vfio-user)", "NAME" },
        { "device-at", 0, 0, G_OPTION_ARG_FILENAME, &at,
          "where the backend finds the device (vfio-user: the server's socket)", "PLACE" },
        { "device-socket", 0, 0, G_OPTION_ARG_FILENAME, &dsock,
          "the same as --backend=vfio-user --device-at=PATH", "PATH" },
        { "control", 0, 0, G_OPTION_ARG_FILENAME, &control, "control channel for vfio-ntbd",
          "PATH" },
        { "managed-state", 0, 0, G_OPTION_ARG_FILENAME, &managed,
          "bind the PCI function to vfio-pci, keeping its driver's name in PATH; give it "
          "back to that driver on SIGTERM",
          "PATH" },
        { "run-as", 0, 0, G_OPTION_ARG_STRING, &run_as,
          "once set up, serve as this user (a device server's worker; vfio-ntbd dials for it)",
          "UID:GID" },
        VN_TRACE_OPTION_ENTRY(trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) oc = g_option_context_new("- one lent device's backend");
    g_autoptr(GHashTable) fp = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_autoptr(GError) error = NULL;
    g_autoptr(VnWctl) wctl = NULL;
    Worker w = { 0 };
    VnPrivs privs = { 0 };
    const VnBackendOps *ops;

    g_option_context_add_main_entries(oc, entries, NULL);
    if (!g_option_context_parse(oc, &argc, &argv, &error)) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        return 2;
    }
    if (!vn_trace_setup(trace, false, &error)) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        return 2;
    }
    if (dsock != NULL && (at != NULL || (backend != NULL && strcmp(backend, "vfio-user")))) {
        fprintf(stderr, "vfio-ntb-lender: --device-socket is a vfio-user --device-at\n");
        return 2;
    }
    if (port == NULL || node == NULL || device == NULL || (at == NULL && dsock == NULL)) {
        fprintf(stderr, "vfio-ntb-lender: --port, --node, --device and --device-at are "
                        "required\n");
        return 2;
    }
    if ((ops = vn_backend_find(backend != NULL ? backend : "vfio-user", &error)) == NULL) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        return 2;
    }
    if (run_as != NULL && !vn_privs_parse_run_as(run_as, &privs, &error)) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        return 2;
    }
    if (run_as != NULL && ops->open_fd == NULL) {
        fprintf(stderr, "vfio-ntb-lender: --run-as needs a backend whose device vfio-ntbd can "
                        "open for it\n");
        return 2;
    }
    if (managed != NULL && (strcmp(ops->name, "vfio") != 0 || at == NULL)) {
        fprintf(stderr, "vfio-ntb-lender: --managed-state is for --backend=vfio\n");
        return 2;
    }
    if (managed != NULL && (was = managed_take(at, managed)) == NULL) {
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    g_hash_table_insert(fp, g_strdup("port"), g_strdup(port));
    if (port_fd != NULL) {
        g_hash_table_insert(fp, g_strdup("fd"), g_strdup(port_fd));
    }
    w.loop = g_main_loop_new(NULL, FALSE);
    w.fab = vn_fabric_open("host", node, fp, &handlers, &w, NULL, &error);
    if (w.fab == NULL) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        return 1;
    }
    w.l = vn_lender_new(w.fab, device, ops, at != NULL ? at : dsock, &error);
    if (w.l == NULL) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        vn_fabric_close(w.fab);
        return 1;
    }
    vn_lender_on_device_request(w.l, on_device_request, &w);
    vn_lender_on_server(w.l, on_server, &w);
    if (control != NULL && (wctl = vn_wctl_new(control, on_command, &w, &error)) == NULL) {
        fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
        vn_lender_free(w.l);
        vn_fabric_close(w.fab);
        return 1;
    }
    /* Everything it serves with is an fd now, or comes from the daemon (its first dial is
     * on the loop, after this). */
    if (privs.drop) {
        w.at = at != NULL ? at : dsock;
        if (strcmp(ops->name, "vfio") == 0) {
            vn_lender_set_dialer(w.l, open_group_through_daemon, &w);
            memlock_unbounded();
        } else {
            vn_lender_set_dialer(w.l, dial_through_daemon, &w);
        }
        if (!vn_privs_drop(&privs, &error)) {
            fprintf(stderr, "vfio-ntb-lender: %s\n", error->message);
            g_clear_pointer(&wctl, vn_wctl_free);
            vn_lender_free(w.l);
            vn_fabric_close(w.fab);
            return 1;
        }
    }
    vn_util_run_until_signalled(w.loop);
    g_clear_pointer(&wctl, vn_wctl_free);
    g_clear_pointer(&w.l, vn_lender_free);
    vn_fabric_close(w.fab);
    g_main_loop_unref(w.loop);
    /* Serving as the worker user, it cannot write sysfs: vfio-ntbd gives the function back
     * once this process is gone (or vfio-ntbd --stop-workers does, at systemctl stop). */
    if (was != NULL && !privs.drop) {
        managed_give_back(at, managed);
    }
    return 0;
}
