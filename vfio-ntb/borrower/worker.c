/*
 * vfio-ntb-borrower: one borrowed device's vfio-user server, in a process
 * of its own so that it outlives vfio-ntbd: QEMU cannot reconnect to a
 * vfio-user server, so a daemon restart must not take the server down.
 *
 *   vfio-ntb-borrower --port PATH --node NAME --lender NODE --device NAME
 *                     --socket PATH [--irq-mode fd|relay] [--control PATH]
 *                     [--take-over FD] [--port-fd FD] [--run-as UID:GID]
 *
 * It is not a fabric node: it speaks as its host (NAME, the lease holder)
 * through vfio-ntbd's port for it (fabric/host.h), borrows the device's
 * data path from the lender and serves it on PATH until SIGTERM, when it
 * detaches cleanly.
 * With --take-over it serves the QEMU of a worker of the same device that died, with the
 * sockets, eventfds and state the daemon kept of it (borrower/takeover.c); when that
 * cannot be done it exits with VN_BORROWER_EXIT_NO_TAKEOVER, and the daemon detaches.
 * On its control channel (--control, wctl.h) it answers "stats" with its
 * counters and "unplug" by asking QEMU to unplug the device through the
 * device-request interrupt (when QEMU registered one).  vfio-ntbd starts it for
 * `attach` and stops it for `detach`, and a restarted vfio-ntbd adopts the
 * ones still running.
 * Once it is set up it serves from its sandbox (sandbox.h): the user --run-as names, no
 * capabilities, a seccomp filter.
 *
 *   vfio-ntb-borrower --spare-fd FD --node NAME --run-dir DIR --title-room SPACES
 *
 * is a spare (daemon/spare.h): started ahead of need, it waits on FD for the arguments and
 * fds of the device it is to serve (common/assign.h), shows them as its command line (what
 * ps, vfio-ntbd's stray search and an operator see), and goes on as a worker started with
 * them.  The daemon's end closing first means no device comes: it exits.  --node and
 * --run-dir only say whose spare it is.
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower.h"
#include "common/assign.h"
#include "sandbox.h"
#include "common/util.h"
#include "common/wctl.h"
#include "config.h"
#include "common/trace.h"

#include <gio/gio.h>
#include <glib-unix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct Worker {
    VnFabric *fab;
    VnBorrower *b;
    char *lender;
    const char *device;
    GMainLoop *loop;
    int status_fd;   /* where to say how the start went, or -1 */
    bool take_over;  /* --take-over */
    VnPrivs sandbox; /* entered once serving */
    bool ending;     /* the loop ended: a start cancelled by the fabric's close is no news */
    int exit_status;
    gint linger_ms; /* --dma-unmap-linger-ms (-1: the default) */
} Worker;

static void on_link(void *opaque, const char *peer, bool up)
{
    Worker *w = opaque;

    if (w->b == NULL || strcmp(peer, w->lender) != 0) {
        return;
    }
    if (up) {
        vn_borrower_lender_up(w->b);
    } else {
        vn_borrower_lender_down(w->b);
    }
}

static void on_doorbell(void *opaque, const char *peer, uint32_t bit)
{
    Worker *w = opaque;

    if (w->b != NULL && strcmp(peer, w->lender) == 0) {
        vn_borrower_doorbell(w->b, bit);
    }
}

static void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    Worker *w = opaque;

    /* A worker lends nothing and answers nobody. */
    vn_fabric_reply_error(w->fab, token, 95 /* EOPNOTSUPP */, "a borrower worker");
}

static const VnFabricHandlers handlers = {
    .on_link = on_link,
    .on_request = on_request,
    .on_doorbell = on_doorbell,
};

/* The control channel's commands (wctl.h). */
static char *on_command(void *opaque, const char *name, GError **error)
{
    Worker *w = opaque;

    if (g_str_has_prefix(name, "trace ")) {
        return vn_trace_command(name + strlen("trace "), error);
    }
    if (w->b == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_INITIALIZED, "not serving yet");
        return NULL;
    }
    if (strcmp(name, "stats") == 0) {
        return vn_borrower_stats_json(w->b);
    }
    if (strcmp(name, "unplug") == 0) {
        bool asked = vn_borrower_request_unplug(w->b);

        /* An answer, not news: the daemon falls back to QMP and says so. */
        if (!asked) {
            g_info("borrower worker: QEMU takes no device requests; nothing sent");
        }
        return g_strdup_printf("{\"requested\":%s}", asked ? "true" : "false");
    }
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, "no command \"%.32s\"", name);
    return NULL;
}

/* The start's end: serving (say so, enter the sandbox), or why not (say so, exit). */
static void on_started(void *opaque, VnBorrower *b, const GError *error)
{
    Worker *w = opaque;
    g_autoptr(GError) local = NULL;

    if (w->ending) {
        return; /* stopped while it started: nothing to say */
    }
    if (b == NULL) {
        fprintf(stderr, "vfio-ntb-borrower: %s\n", error->message);
        /* vfio-ntbd answers the attach with it. */
        if (w->status_fd >= 0) {
            g_autofree char *line = g_strdup_printf("%s\n", error->message);

            (void)!write(w->status_fd, line, strlen(line));
        }
        w->exit_status = w->take_over ? VN_BORROWER_EXIT_NO_TAKEOVER : 1;
        g_main_loop_quit(w->loop);
        return;
    }
    w->b = b;
    if (w->linger_ms >= 0) {
        vn_borrower_set_dma_linger(b, (unsigned)w->linger_ms, VN_BORROWER_MAX_LINGERING);
    }
    /* QEMU's socket listens: vfio-ntbd answers the attach now (it does not poll for the
     * socket).  A failure from here on is our exit. */
    if (w->status_fd >= 0) {
        (void)!write(w->status_fd, "ready\n", 6);
        vn_util_close_fd(&w->status_fd);
    }
    /* Everything it serves with is an fd now: QEMU's first message is parsed in here. */
    if (!vn_sandbox_enter(&w->sandbox, &local)) {
        g_warning("borrower %s: %s; not serving", w->device, local->message);
        g_clear_pointer(&w->b, vn_borrower_free);
        w->exit_status = VN_BORROWER_EXIT_NO_TAKEOVER; /* another would fail the same way */
        g_main_loop_quit(w->loop);
        return;
    }
    /* The e2e suite's proof that the filter kills (a call no worker makes). */
    if (getenv("VN_TEST_SANDBOX_VIOLATION") != NULL) {
        (void)!getppid();
    }
}

/* A worker started with @argv (by vfio-ntbd, or given them as a spare). */
static int serve(int argc, char **argv)
{
    g_autofree char *trace = NULL, *port_fd = NULL;
    g_autofree char *port = NULL, *node = NULL, *lender = NULL, *device = NULL;
    g_autofree char *socket = NULL, *mode = NULL, *control = NULL;
    g_autofree char *run_as = NULL;
    gint status_fd = -1, handoff_fd = -1, linger_ms = -1;
    GOptionEntry entries[] = {
        { "port", 0, 0, G_OPTION_ARG_FILENAME, &port, "vfio-ntbd's port for this worker", "PATH" },
        { "port-fd", 0, 0, G_OPTION_ARG_STRING, &port_fd,
          "the connection to the port vfio-ntbd made for this worker", "FD" },
        { "node", 0, 0, G_OPTION_ARG_STRING, &node, "this host's fabric node", "NAME" },
        { "lender", 0, 0, G_OPTION_ARG_STRING, &lender, "the lending node", "NODE" },
        { "device", 0, 0, G_OPTION_ARG_STRING, &device, "the lender's device", "NAME" },
        { "socket", 0, 0, G_OPTION_ARG_FILENAME, &socket, "vfio-user socket for QEMU", "PATH" },
        { "irq-mode", 0, 0, G_OPTION_ARG_STRING, &mode, "fd or relay", "MODE" },
        { "control", 0, 0, G_OPTION_ARG_FILENAME, &control, "control channel for vfio-ntbd",
          "PATH" },
        { "status-fd", 0, 0, G_OPTION_ARG_INT, &status_fd,
          "where to say \"ready\" once QEMU's socket listens, or why the device cannot be served",
          "FD" },
        { "run-as", 0, 0, G_OPTION_ARG_STRING, &run_as,
          "serve as this user and group (numbers), once set up", "UID:GID" },
        { "dma-unmap-linger-ms", 0, 0, G_OPTION_ARG_INT, &linger_ms,
          "how long a DMA mapping QEMU unmapped may linger at the lender (0: none)", "MS" },
        { "take-over", 0, 0, G_OPTION_ARG_INT, &handoff_fd,
          "serve the QEMU of a worker that died, with what its daemon kept (the handoff)", "FD" },
        VN_TRACE_OPTION_ENTRY(trace),
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) oc = g_option_context_new("- one borrowed device's server");
    g_autoptr(GHashTable) fp = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_autoptr(GError) error = NULL;
    VnIrqMode irq_mode = VN_IRQ_MODE_FD;
    guint signals[2];
    g_autoptr(VnWctl) wctl = NULL;
    Worker w = { .status_fd = -1 };

    g_option_context_add_main_entries(oc, entries, NULL);
    if (!g_option_context_parse(oc, &argc, &argv, &error)) {
        fprintf(stderr, "vfio-ntb-borrower: %s\n", error->message);
        return 2;
    }
    if (!vn_trace_setup(trace, false, &error)) {
        fprintf(stderr, "vfio-ntb-borrower: %s\n", error->message);
        return 2;
    }
    if (port == NULL || node == NULL || lender == NULL || device == NULL || socket == NULL ||
        (mode != NULL && !vn_irq_mode_from_string(mode, &irq_mode)) || linger_ms < -1 ||
        linger_ms > (gint)VN_BORROWER_MAX_LINGER_MS) {
        fprintf(stderr,
                "vfio-ntb-borrower: --port, --node, --lender, --device and "
                "--socket are required; --irq-mode is fd or relay; "
                "--dma-unmap-linger-ms is 0..%u\n",
                VN_BORROWER_MAX_LINGER_MS);
        return 2;
    }
    w.linger_ms = linger_ms;
    if (run_as != NULL && !vn_privs_parse_run_as(run_as, &w.sandbox, &error)) {
        fprintf(stderr, "vfio-ntb-borrower: %s\n", error->message);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    g_hash_table_insert(fp, g_strdup("port"), g_strdup(port));
    if (port_fd != NULL) {
        g_hash_table_insert(fp, g_strdup("fd"), g_strdup(port_fd));
    }
    w.lender = lender;
    w.device = device;
    w.status_fd = status_fd;
    w.take_over = handoff_fd >= 0;
    w.loop = g_main_loop_new(NULL, FALSE);
    w.fab = vn_fabric_open("host", node, fp, &handlers, &w, NULL, &error);
    if (w.fab == NULL) {
        fprintf(stderr, "vfio-ntb-borrower: %s\n", error->message);
        return 1;
    }
    /* Before the vfio-user socket: its appearance tells vfio-ntbd both are up. */
    if (control != NULL && (wctl = vn_wctl_new(control, on_command, &w, &error)) == NULL) {
        fprintf(stderr, "vfio-ntb-borrower: %s\n", error->message);
        vn_fabric_close(w.fab);
        return 1;
    }
    /* The signals first (GLib starts a thread for them, which the sandbox would not
     * allow); the start asks the lender and its answers come from the loop. */
    vn_util_quit_on_signals(w.loop, signals);
    vn_borrower_start(w.fab, lender, device, irq_mode, socket, handoff_fd, NULL, on_started, &w);
    g_main_loop_run(w.loop);
    w.ending = true;
    g_source_remove(signals[0]);
    g_source_remove(signals[1]);
    g_clear_pointer(&wctl, vn_wctl_free);
    g_clear_pointer(&w.b, vn_borrower_free);
    vn_fabric_close(w.fab);
    g_main_loop_unref(w.loop);
    return w.exit_status;
}

/* Port and status fds, where a spawn would have put them (VN_ASSIGN_FIRST_FD on). */
#define SPARE_FDS 2

/* As a spare: wait for the device, then serve it. */
static int spare(int argc, char **argv, int fd)
{
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) job = NULL;
    g_autofree char **view = NULL;
    int fds[SPARE_FDS];
    guint n;

    job = vn_assign_receive(fd, fds, SPARE_FDS, &error);
    close(fd);
    if (job == NULL) {
        if (error == NULL) {
            return 0; /* its daemon went: no device for it */
        }
        fprintf(stderr, "vfio-ntb-borrower: spare: %s\n", error->message);
        return 1;
    }
    if (!vn_assign_install(fds, SPARE_FDS, &error)) {
        fprintf(stderr, "vfio-ntb-borrower: spare: %s\n", error->message);
        return 1;
    }
    if (!vn_assign_retitle(argc, argv, (const char *const *)job)) {
        fprintf(stderr, "vfio-ntb-borrower: spare: its arguments do not fit its command line\n");
        return 1;
    }
    /* serve() takes arguments out of its array as it parses them: a view, not @job. */
    n = g_strv_length(job);
    view = g_memdup2(job, sizeof(char *) * (n + 1));
    return serve((int)n, view);
}

int main(int argc, char **argv)
{
    const char *opt = "--spare-fd=";
    guint64 fd;

    if (argc > 1 && g_str_has_prefix(argv[1], opt)) {
        if (!g_ascii_string_to_unsigned(argv[1] + strlen(opt), 10, 0, G_MAXINT, &fd, NULL)) {
            fprintf(stderr, "vfio-ntb-borrower: --spare-fd takes a descriptor number\n");
            return 2;
        }
        return spare(argc, argv, (int)fd);
    }
    return serve(argc, argv);
}
