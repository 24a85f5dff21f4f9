/*
 * A lent device's server (lender-int.h, "lender-server.c").  For a backend that can lose
 * its device on its own (a vfio-user server: VnBackendOps.hangup_fd), the lender keeps a
 * connection to the server whether the device is attached or not, and watches it:
 *
 * - The server dies: its socket hangs up.  It wedges: a command timed out and a probe
 *   still gets no answer VN_LENDER_WEDGED_MS later.  Either way it is lost.  A lent
 *   device's lease is fenced without it: the windows onto its memory and onto the
 *   holder's are withdrawn and the relays stop (a dead server does no DMA; a wedged one
 *   finds its client gone when it runs again, and quiesces the device).  The holder's
 *   requests are refused from then on, and the server is dialled until one answers.
 * - One answers: its connection is kept (the spare) for the next attach, and the holder
 *   is told through on_server, with the generation one higher: the device it had is gone
 *   with the old server's state, so its VM must be given the new one as a new device.
 *
 * Everything here runs from the lender's context, never inside a backend call (a loss
 * seen from inside one, a stall, is looked at from a timer), so a connection is never
 * closed under its own caller.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <unistd.h>

static bool watchable(VnLender *l)
{
    return l->ops->hangup_fd != NULL;
}

static void source_clear(GSource **src)
{
    if (*src != NULL) {
        g_source_destroy(*src);
        g_source_unref(*src);
        *src = NULL;
    }
}

static GSource *timer_new(VnLender *l, guint ms, GSourceFunc fn)
{
    GSource *src = g_timeout_source_new(ms);

    g_source_set_callback(src, fn, l, NULL);
    g_source_attach(src, l->ctx);
    return src;
}

static void tell(VnLender *l, bool up, const char *why)
{
    if (l->on_server != NULL) {
        l->on_server(l->on_server_opaque, up, l->server_gen, why);
    }
}

static void server_stall(VnLender *l, VnBackendStall ev);

/*
 * The device stalled: a command got no answer in time, or an answer came
 * after that (the backend dropped it, so later commands get their own).
 * Logged at the default level and kept for ntbctl show: a stall is what an
 * operator needs to see to tell a slow device server from a broken fabric.
 */
static void on_device_stall(void *opaque, VnBackendStall ev, const char *what, uint64_t ms)
{
    VnLender *l = opaque;
    g_autoptr(GDateTime) now = g_date_time_new_now_local();
    g_autofree char *at = g_date_time_format(now, "%H:%M:%S");

    if (ev == VN_BACKEND_TIMED_OUT) {
        l->stats.device_timeouts++;
        g_warning("lender %s: device server %s did not answer %s within %" PRIu64
                  " ms; the borrower's request failed",
                  l->name, l->where, what, ms);
        g_snprintf(l->last_stall, sizeof(l->last_stall),
                   "%s: %s not answered within %" PRIu64 " ms", at, what, ms);
    } else {
        l->stats.device_late++;
        g_warning("lender %s: device server %s answered %s %" PRIu64
                  " ms after it was sent; that late answer was dropped",
                  l->name, l->where, what, ms);
        g_snprintf(l->last_stall, sizeof(l->last_stall),
                   "%s: %s answered after %" PRIu64 " ms (dropped; later commands in step)", at,
                   what, ms);
    }
    server_stall(l, ev);
}

/* A new connection to the server, every command of which answers within the device
 * timeout, when the lender dials itself; NULL with @error. */
static void *server_open(VnLender *l, GError **error)
{
    return l->ops->open(l->where, VN_LENDER_DEVICE_TIMEOUT_MS, on_device_stall, l, error);
}

/* The connection over @fd (taken) that the dialer gave, or NULL with @error. */
static void *server_open_fd(VnLender *l, int fd, GError **error)
{
    return l->ops->open_fd(fd, l->where, VN_LENDER_DEVICE_TIMEOUT_MS, on_device_stall, l, error);
}

static bool dials_through(VnLender *l)
{
    return l->dial != NULL && l->ops->open_fd != NULL;
}

void vn_lender_set_dialer(VnLender *l, VnLenderDialFn fn, void *opaque)
{
    l->dial = fn;
    l->dial_opaque = opaque;
}

/*
 * The one dial asked of the dialer at a time (its daemon's to make, for a worker, which
 * refuses one that dials too often), answered later: in the background (a lost server's, or
 * the next attach's; @l, NULL once the lender went), or for an ATTACH (@then: it waits
 * meanwhile, as @wait), which may join a background dial already on its way.
 */
typedef struct LenderDial {
    VnLenderWait wait;
    VnLender *l;
    VnLenderTakenFn then; /* NULL: a background dial nobody waits for */
    void *opaque;
    bool asked; /* of the dialer already */
} LenderDial;

static void dialled(VnLender *l, void *dev, const GError *error);

/* The dial's answer, for the ATTACH waiting on it. */
static void attach_dialled(LenderDial *d, int fd, const GError *error)
{
    VnLender *l = vn_lender_wait_end(&d->wait);
    g_autoptr(GError) local = NULL;
    void *dev = NULL;

    if (l == NULL) {
        vn_util_close_fd(&fd);
        g_free(d);
        return;
    }
    dev = fd >= 0 ? server_open_fd(l, fd, &local) : NULL;
    if (dev != NULL && watchable(l)) {
        source_clear(&l->dial_src);
    }
    d->then(l, dev, dev != NULL ? NULL : local != NULL ? local : error, d->opaque);
    g_free(d);
    vn_lender_wait_next(l); /* unless @then waits again */
}

static void on_dialled(void *opaque, int fd, const GError *error)
{
    LenderDial *d = opaque;
    VnLender *l = d->then != NULL ? d->wait.l : d->l;
    g_autoptr(GError) local = NULL;
    void *dev = NULL;

    if (l != NULL && l->dialing == d) {
        l->dialing = NULL;
    }
    if (d->then != NULL) {
        attach_dialled(d, fd, error);
        return;
    }
    g_free(d);
    if (l == NULL) {
        vn_util_close_fd(&fd);
        return;
    }
    if (fd >= 0 && (l->device != NULL || l->spare != NULL)) {
        close(fd); /* one came meanwhile (a lender that dials itself) */
        return;
    }
    dev = fd >= 0 ? server_open_fd(l, fd, &local) : NULL;
    dialled(l, dev, dev != NULL ? NULL : local != NULL ? local : error);
}

static gboolean on_dial(gpointer data);
static gboolean on_hangup(gint fd, GIOCondition cond, gpointer data);

static void dial_later(VnLender *l, guint ms)
{
    if (l->dial_src == NULL) {
        l->dial_src = timer_new(l, ms, on_dial);
    }
}

/* The wait before the next dial of a server that did not answer (see VN_LENDER_DIAL_MS). */
static guint dial_wait_ms(VnLender *l, bool slow)
{
    guint base = slow ? VN_LENDER_DIAL_SLOW_MS : VN_LENDER_DIAL_MS;

    if (l->borrower != NULL) {
        l->dial_idle_ms = 0;
        return base;
    }
    l->dial_idle_ms =
        l->dial_idle_ms == 0 ? base : MIN(l->dial_idle_ms * 2, VN_LENDER_DIAL_IDLE_MAX_MS);
    return MAX(base, l->dial_idle_ms);
}

static void watch(VnLender *l, void *dev)
{
    int fd = l->ops->hangup_fd(dev);

    source_clear(&l->hangup_src);
    if (fd < 0) {
        return;
    }
    l->hangup_src = vn_util_fd_source_new(fd, G_IO_HUP | G_IO_ERR);
    g_source_set_callback(l->hangup_src, G_SOURCE_FUNC(on_hangup), l, NULL);
    g_source_attach(l->hangup_src, l->ctx);
}

/* A connection works again (or for the first time). */
static void came_up(VnLender *l)
{
    if (l->server_up) {
        return;
    }
    l->server_up = true;
    l->dial_idle_ms = 0;
    if (l->stats.server_losses > 0) {
        l->server_gen++;
        l->stats.server_returns++;
        g_warning("lender %s: device server %s answers again (its generation %u)%s%s", l->name,
                  l->where, l->server_gen,
                  l->server_lost ? "; the device is presented anew to " : "",
                  l->server_lost ? l->borrower : "");
    }
    tell(l, true, "answering");
}

static void lost(VnLender *l, const char *why)
{
    g_autoptr(GDateTime) now = g_date_time_new_now_local();
    g_autofree char *at = g_date_time_format(now, "%H:%M:%S");

    source_clear(&l->hangup_src);
    source_clear(&l->wedge_src);
    l->stall_since_us = 0;
    if (l->spare != NULL) {
        l->ops->close(g_steal_pointer(&l->spare));
    }
    if (l->device != NULL) {
        l->server_lost = true;
        g_warning("lender %s: device server %s lost (%s) while lent to %s: the windows onto "
                  "its memory and onto %s's are withdrawn; the device is presented anew once "
                  "a server answers there",
                  l->name, l->where, why, l->borrower, l->borrower);
        l->up->drop_device(l, "device server lost");
    } else {
        g_warning("lender %s: device server %s lost (%s); dialling it again within %d s", l->name,
                  l->where, why, VN_LENDER_DIAL_IDLE_MAX_MS / 1000);
    }
    if (l->server_up) {
        l->server_up = false;
        l->stats.server_losses++;
        g_snprintf(l->server_loss, sizeof(l->server_loss), "%s: %s", at, why);
        tell(l, false, why);
    }
    if (l->borrower != NULL) {
        source_clear(&l->dial_src); /* its holder waits: not an idle back-off's wait */
    }
    dial_later(l, dial_wait_ms(l, false));
}

static gboolean on_hangup(gint fd, GIOCondition cond, gpointer data)
{
    VnLender *l = data;

    lost(l, "its socket closed: the server exited");
    return G_SOURCE_REMOVE;
}

/* What a background dial gave: the spare, or a failure (and the next dial). */
static void dialled(VnLender *l, void *dev, const GError *error)
{
    if (dev == NULL) {
        bool slow = g_error_matches(error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT);

        if (l->server_up) {
            /* It served the last connection and refuses the next. */
            lost(l, error->message);
            return;
        }
        if (l->server_loss[0] == '\0') {
            /* Never found since the lender started: said once. */
            g_snprintf(l->server_loss, sizeof(l->server_loss), "not found: %s", error->message);
            g_warning("lender %s: no device server answers: %s; dialling it again within %d s",
                      l->name, error->message, VN_LENDER_DIAL_IDLE_MAX_MS / 1000);
            tell(l, false, error->message);
        }
        dial_later(l, dial_wait_ms(l, slow));
        return;
    }
    l->spare = dev;
    watch(l, dev);
    came_up(l);
}

static gboolean on_dial(gpointer data)
{
    VnLender *l = data;
    g_autoptr(GError) error = NULL;
    LenderDial *d;

    g_clear_pointer(&l->dial_src, g_source_unref);
    if (l->device != NULL || l->spare != NULL || l->dialing != NULL) {
        return G_SOURCE_REMOVE;
    }
    l->stats.server_dials++;
    if (!dials_through(l)) {
        void *dev = server_open(l, &error);

        dialled(l, dev, error);
        return G_SOURCE_REMOVE;
    }
    d = g_new0(LenderDial, 1);
    d->l = l;
    d->asked = true;
    l->dialing = d;
    l->dial(l->dial_opaque, on_dialled, d);
    return G_SOURCE_REMOVE;
}

/* A stall lasted VN_LENDER_WEDGED_MS: one command more says whether it is a wedge. */
static gboolean on_wedge_check(gpointer data)
{
    VnLender *l = data;
    void *dev = l->device != NULL ? l->device : l->spare;
    VnWireDeviceInfo info;
    int ret;

    g_clear_pointer(&l->wedge_src, g_source_unref);
    if (dev == NULL || l->stall_since_us == 0 || !l->ops->stalled(dev)) {
        l->stall_since_us = 0;
        return G_SOURCE_REMOVE;
    }
    ret = l->ops->get_info(dev, &info);
    if (ret >= 0) {
        l->stall_since_us = 0;
    } else {
        g_autofree char *why = g_strdup_printf(
            "no answer for %" G_GINT64_FORMAT " s: %s",
            (g_get_monotonic_time() - l->stall_since_us) / G_USEC_PER_SEC, g_strerror(-ret));

        lost(l, why);
    }
    return G_SOURCE_REMOVE;
}

static void server_stall(VnLender *l, VnBackendStall ev)
{
    if (!watchable(l)) {
        return;
    }
    if (ev == VN_BACKEND_LATE_ANSWER) {
        l->stall_since_us = 0; /* it runs: a stall, not a wedge */
        source_clear(&l->wedge_src);
        return;
    }
    if (l->stall_since_us == 0) {
        l->stall_since_us = g_get_monotonic_time();
        source_clear(&l->wedge_src);
        l->wedge_src = timer_new(l, VN_LENDER_WEDGED_MS, on_wedge_check);
    }
}

void vn_lender_server_start(VnLender *l)
{
    if (!watchable(l)) {
        l->server_up = true;
        return;
    }
    dial_later(l, 0);
}

void vn_lender_server_take(VnLender *l, uint64_t token, VnLenderTakenFn then, void *opaque)
{
    g_autoptr(GError) error = NULL;
    LenderDial *d;
    void *dev;

    if (l->spare != NULL) {
        source_clear(&l->hangup_src);
        then(l, g_steal_pointer(&l->spare), NULL, opaque);
        return;
    }
    if (!dials_through(l)) {
        dev = server_open(l, &error);
        if (dev != NULL && watchable(l)) {
            source_clear(&l->dial_src);
        }
        then(l, dev, error, opaque);
        return;
    }
    /* One dial at a time: a background one on its way is this attach's now. */
    d = l->dialing;
    if (d == NULL) {
        d = g_new0(LenderDial, 1);
        d->l = l;
        l->dialing = d;
    }
    d->then = then;
    d->opaque = opaque;
    vn_lender_wait_begin(l, &d->wait, token);
    if (!d->asked) {
        d->asked = true;
        l->dial(l->dial_opaque, on_dialled, d); /* @d may be answered and gone on return */
    }
}

void vn_lender_server_attached(VnLender *l)
{
    l->server_lost = false;
    if (!watchable(l)) {
        return;
    }
    watch(l, l->device);
    came_up(l);
}

void vn_lender_server_released(VnLender *l)
{
    source_clear(&l->wedge_src);
    l->stall_since_us = 0;
    l->server_lost = false;
    if (!watchable(l)) {
        return;
    }
    if (l->spare != NULL) {
        watch(l, l->spare); /* a server found again while the device was lost */
        return;
    }
    source_clear(&l->hangup_src);
    dial_later(l, 0); /* the next attach's connection, and a watch meanwhile */
}

bool vn_lender_server_keep(VnLender *l, void *dev)
{
    if (!watchable(l) || l->spare != NULL || !l->server_up) {
        return false;
    }
    l->spare = dev; /* watched once released */
    return true;
}

bool vn_lender_server_refuses(VnLender *l, uint32_t type, uint64_t token)
{
    if (!l->server_lost || type == VN_PROTO_ATTACH || type == VN_PROTO_DETACH) {
        return false;
    }
    if (type == VN_PROTO_DMA_UNMAP) {
        /* True as asked: the device has nothing mapped any more (a VM letting go of the
         * dead device unmaps its memory, and must not be told it failed). */
        l->stats.dma_unmaps++;
        vn_fabric_reply(l->fab, token, "{}", NULL, 0);
        return true;
    }
    vn_lender_fail(l, token, ENODEV,
                   "its device server was lost (%s); the device is presented anew once one "
                   "answers on %s",
                   l->server_loss, l->where);
    return true;
}

void vn_lender_server_stop(VnLender *l)
{
    if (l->dialing != NULL) {
        ((LenderDial *)l->dialing)->l = NULL; /* its answer finds nobody */
        l->dialing = NULL;
    }
    source_clear(&l->hangup_src);
    source_clear(&l->wedge_src);
    source_clear(&l->dial_src);
    if (l->spare != NULL) {
        l->ops->close(g_steal_pointer(&l->spare));
    }
}

void vn_lender_on_server(VnLender *l, VnLenderServerFn fn, void *opaque)
{
    l->on_server = fn;
    l->on_server_opaque = opaque;
    /* A backend that cannot lose its device has it from the start: said now (a new
     * worker's device is a new one to its daemon). */
    if (!watchable(l) && fn != NULL) {
        fn(opaque, true, 0, "open");
    }
}

bool vn_lender_server_up(VnLender *l)
{
    return l->server_up;
}

uint32_t vn_lender_server_gen(VnLender *l)
{
    return l->server_gen;
}

const char *vn_lender_server_loss(VnLender *l)
{
    return l->server_loss[0] != '\0' ? l->server_loss : NULL;
}
