/*
 * Unit tests of a worker speaking through its daemon's port (daemon/port.c,
 * fabric/host.c): hosta lends (a threaded shm node), hostb is the daemon's
 * node with a port on the test's context, and the worker opens the `host`
 * backend in a thread of its own (its calls wait for the daemon, which the
 * test thread runs).  The worker is never a node: hosta sees hostb.
 */
#include "check-main.h"
#include "fabric-wait.h"
#include "fabric-rig.h"
#include "daemon/keep.h"
#include "daemon/port.h"
#include "fabric/host.h"
#include "fabric/record.h"

#include <glib-unix.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/eventfd.h>

#define DEVICE_JSON "{\"device\":\"nvme0\"}"

typedef struct Worker {
    VnFabric *fab;
    GMainContext *ctx;
    char *port;
    GMutex lock;
    unsigned doorbells[VN_FABRIC_MAX_DOORBELLS];
    unsigned ups, downs;
    /* one step at a time, run in the worker's thread */
    void (*step)(struct Worker *w);
    gint done;
    int ret;
    uint64_t id;
    int fd;
    int conn; /* the connection the port made for it (vn_port_pair) */
    VnFabricWindow *win;
    unsigned handled, handler_failed; /* w_on_request's */
    int linked;                       /* a connect's answer: 1 up, -errno, 0 none yet */
    unsigned flood_sent;              /* step_flood's */
    int flood_ms;
    VnFabricStats stats; /* its fabric's, as a step left it */
} Worker;

static Worker *worker;
static VnPort *port;

static void w_on_link(void *opaque, const char *peer, bool up)
{
    Worker *w = opaque;

    g_mutex_lock(&w->lock);
    w->ups += up;
    w->downs += !up;
    g_mutex_unlock(&w->lock);
}

static void w_on_doorbell(void *opaque, const char *peer, uint32_t bit)
{
    Worker *w = opaque;

    g_mutex_lock(&w->lock);
    w->doorbells[bit]++;
    g_mutex_unlock(&w->lock);
}

/* A lender's worker answering its holder: it exports a segment and withholds it first (ops
 * asked of its port without waiting, as a lender's attach and reset do), then echoes the
 * request once both were answered. */
typedef struct Handling {
    Worker *w;
    uint64_t token;
    char *json;
} Handling;

static void w_withheld(void *opaque, int ret)
{
    Handling *h = opaque;

    if (ret >= 0) {
        h->w->handled++;
    } else {
        h->w->handler_failed++;
    }
    vn_fabric_reply(h->w->fab, h->token, h->json, NULL, 0);
    g_free(h->json);
    g_free(h);
}

static void w_exported(void *opaque, uint64_t id, const GError *error)
{
    Handling *h = opaque;

    if (id == 0) {
        w_withheld(h, -EIO);
        return;
    }
    vn_fabric_segment_withhold_async(h->w->fab, id, true, w_withheld, h);
}

static void w_on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    Worker *w = opaque;
    Handling *h = g_new0(Handling, 1);

    *h = (Handling){ .w = w, .token = token, .json = g_strdup(msg->json) };
    vn_fabric_segment_export_async(w->fab, w->fd, 0, 4096, "hosta", w_exported, h);
}

static const VnFabricHandlers worker_handlers = {
    .on_link = w_on_link,
    .on_request = w_on_request,
    .on_doorbell = w_on_doorbell,
};

static gpointer step_thread(gpointer data)
{
    Worker *w = data;

    g_main_context_push_thread_default(w->ctx);
    w->step(w);
    g_main_context_pop_thread_default(w->ctx);
    g_atomic_int_set(&w->done, 1);
    return NULL;
}

/* Run @step in the worker's thread while this one serves the daemon. */
static void in_worker(void (*step)(Worker *w))
{
    GThread *t;

    worker->step = step;
    g_atomic_int_set(&worker->done, 0);
    t = g_thread_new("worker", step_thread, worker);
    WAIT_FOR(g_atomic_int_get(&worker->done));
    g_thread_join(t);
}

/* A worker about to start: the port makes its connection (in this, the daemon's, thread). */
static void open_worker(void (*step)(Worker *w))
{
    g_autoptr(GError) error = NULL;

    worker->conn = vn_port_pair(port, &error);
    ck_assert_msg(worker->conn >= 0, "%s", error ? error->message : "");
    vn_port_set_worker(port, getpid());
    in_worker(step);
}

static void on_linked(void *opaque, int err)
{
    ((Worker *)opaque)->linked = err == 0 ? 1 : err;
}

/* The worker connects to hosta and runs its loop until told (the daemon, in the test's
 * thread, answers once its link is up): 0, or -1. */
static int connect_hosta(Worker *w)
{
    w->linked = 0;
    if (vn_fabric_connect_async(w->fab, "hosta", on_linked, w) == NULL) {
        return -1;
    }
    while (w->linked == 0) {
        g_main_context_iteration(w->ctx, TRUE);
    }
    return w->linked == 1 ? 0 : -1;
}

static void step_open(Worker *w)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    char conn_param[16];

    g_hash_table_insert(params, "port", w->port);
    g_hash_table_insert(params, "fd", conn_param);
    g_snprintf(conn_param, sizeof(conn_param), "%d", w->conn);
    w->fab = vn_fabric_open("host", "hostb", params, &worker_handlers, w, w->ctx, &error);
    ck_assert_msg(w->fab != NULL, "%s", error ? error->message : "");
    w->ret = connect_hosta(w);
}

/* As step_open, with a bound of 400 ms before a gone daemon's links go down. */
static void step_open_short_bound(Worker *w)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    char conn_param[16];

    g_hash_table_insert(params, "port", w->port);
    g_hash_table_insert(params, "fd", conn_param);
    g_snprintf(conn_param, sizeof(conn_param), "%d", w->conn);
    g_hash_table_insert(params, "reconnect-ms", "400");
    w->fab = vn_fabric_open("host", "hostb", params, &worker_handlers, w, w->ctx, &error);
    ck_assert_msg(w->fab != NULL, "%s", error ? error->message : "");
    w->ret = connect_hosta(w);
}

/* A lender's worker: it does not connect, its daemon says who holds the
 * device. */
static void step_open_inbound(Worker *w)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    char conn_param[16];

    g_hash_table_insert(params, "port", w->port);
    g_hash_table_insert(params, "fd", conn_param);
    g_snprintf(conn_param, sizeof(conn_param), "%d", w->conn);
    w->fab = vn_fabric_open("host", "hostb", params, &worker_handlers, w, w->ctx, &error);
    ck_assert_msg(w->fab != NULL, "%s", error ? error->message : "");
}

static void step_echo(Worker *w)
{
    g_autoptr(VnFabricMsg) reply = NULL;

    w->ret = fw_request(w->fab, "hosta", T_ECHO, DEVICE_JSON, "abc", 3, &reply);
    if (w->ret == 0) {
        ck_assert_str_eq(reply->json, DEVICE_JSON);
        ck_assert_uint_eq(reply->data_len, 3);
    }
}

static void step_echo_other_device(Worker *w)
{
    g_autoptr(VnFabricMsg) reply = NULL;

    w->ret = fw_request(w->fab, "hosta", T_ECHO, "{\"device\":\"nic0\"}", NULL, 0, &reply);
}

static void step_map(Worker *w)
{
    g_autoptr(GError) error = NULL;

    w->win = fw_window_map(w->fab, "hosta", w->id, &error);
    w->ret = w->win != NULL ? 0 : -1;
}

static void step_unmap(Worker *w)
{
    vn_fabric_window_unmap(w->fab, w->win);
    w->win = NULL;
}

static void step_export(Worker *w)
{
    g_autoptr(GError) error = NULL;

    w->id = fw_export(w->fab, w->fd, 0, 4096, "hosta", &error);
    ck_assert_msg(w->id != 0, "%s", error ? error->message : "");
}

/* hosta maps the worker's segment: it reaches hostb's daemon, which has it. */
static void step_map_back(Worker *w)
{
    g_autoptr(VnFabricMsg) reply = NULL;
    g_autofree char *json = g_strdup(DEVICE_JSON);

    w->ret = fw_request(w->fab, "hosta", T_MAP_BACK, json, &w->id, sizeof(w->id), &reply);
    if (w->ret == 0) {
        ck_assert_uint_eq(reply->data_len, 8);
        ck_assert_mem_eq(reply->data, "worker!!", 8);
    }
}

static void step_route(Worker *w)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnFabricMsg) reply = NULL;
    uint64_t id, le;

    id = fw_export(w->fab, w->fd, 0, 0, "hosta", &error);
    ck_assert_msg(id != 0, "%s", error ? error->message : "");
    le = GUINT64_TO_LE(id);
    w->ret = fw_request(w->fab, "hosta", T_SIGNAL_ROUTE, DEVICE_JSON, &le, sizeof(le), &reply);
}

static void step_doorbells(Worker *w)
{
    w->ret = fw_doorbells_alloc(w->fab, 2, NULL);
}

/* Until doorbell @id arrived (or a second went by). */
static void step_wait_doorbell(Worker *w)
{
    gint64 end = g_get_monotonic_time() + G_USEC_PER_SEC;

    while (g_get_monotonic_time() < end) {
        g_mutex_lock(&w->lock);
        if (w->doorbells[w->id] > 0) {
            g_mutex_unlock(&w->lock);
            return;
        }
        g_mutex_unlock(&w->lock);
        g_main_context_iteration(w->ctx, FALSE);
        g_usleep(1000);
    }
}

/* The worker's loop for half a second (it notices its daemon went, and
 * reconnects, from its own sources). */
static void step_run(Worker *w)
{
    gint64 end = g_get_monotonic_time() + G_USEC_PER_SEC / 2;

    while (g_get_monotonic_time() < end) {
        g_main_context_iteration(w->ctx, FALSE);
        g_usleep(1000);
    }
}

static void step_run_brief(Worker *w)
{
    gint64 end = g_get_monotonic_time() + G_USEC_PER_SEC * 15 / 100;

    while (g_get_monotonic_time() < end) {
        g_main_context_iteration(w->ctx, FALSE);
        g_usleep(1000);
    }
}

static void step_close(Worker *w)
{
    g_clear_pointer(&w->fab, vn_fabric_close);
}

static Node *lender;

static void port_setup(void)
{
    /* A window limit that is not the default, so a worker shows it learnt
     * the host's. */
    static const char *const limits[] = { "max-window-size", "2097152", NULL };
    Node *b;
    g_autoptr(GError) error = NULL;

    setup();
    lender = node_open("hosta", true);
    b = node_open_kv("hostb", false, limits);
    worker = g_new0(Worker, 1);
    worker->ctx = g_main_context_new();
    worker->port = g_build_filename(tmpdir, "w1-port.sock", NULL);
    g_mutex_init(&worker->lock);
    port = vn_port_new(b->fab, worker->port, "hosta", "nvme0", false, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
}

static void port_teardown(void)
{
    if (worker->fab != NULL) {
        in_worker(step_close);
    }
    vn_port_free(port, true);
    g_main_context_unref(worker->ctx);
    g_mutex_clear(&worker->lock);
    g_free(worker->port);
    g_free(worker);
    teardown();
}

static VnFabric *hostb(void)
{
    return ((Node *)nodes->pdata[1])->fab;
}

START_TEST(test_relayed_as_the_host)
{
    node_start(lender);
    open_worker(step_open);
    ck_assert_int_eq(worker->ret, 0);
    in_worker(step_echo);
    ck_assert_int_eq(worker->ret, 0);
    /* hosta saw hostb, and no worker node at all. */
    ck_assert(log_has(lender, "up:hostb"));
    ck_assert_uint_eq(log_count(lender, "up:"), 1);
    /* Another device of this host is not this worker's to speak for. */
    in_worker(step_echo_other_device);
    ck_assert_int_eq(worker->ret, -EACCES);
    ck_assert_uint_eq(vn_port_refused(port), 1);
}
END_TEST

START_TEST(test_windows_segments_routes)
{
    uint8_t *map, *wmap;
    int memfd = memfd_new(16384, &map);
    int wfd = memfd_new(4096, &wmap);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    uint64_t n = 0;

    worker->id = vn_fabric_segment_export(lender->fab, memfd, 16384, "hostb", NULL);
    ck_assert_uint_ne(worker->id, 0);
    node_start(lender);
    open_worker(step_open);
    /* The host's windows: how many, and how large (what a borrower asks
     * its lender to cut BARs to). */
    ck_assert_uint_eq(vn_fabric_limits(worker->fab)->max_windows,
                      vn_fabric_limits(hostb())->max_windows);
    ck_assert_uint_eq(vn_fabric_limits(worker->fab)->max_window_size, 2u << 20);
    /* The window is the host's: the daemon's node holds it. */
    in_worker(step_map);
    ck_assert_int_eq(worker->ret, 0);
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 1);
    memcpy(worker->win->host + 10, "through", 7);
    ck_assert_mem_eq(map + 10, "through", 7);
    in_worker(step_unmap);
    WAIT_FOR(vn_fabric_windows_in_use(hostb()) == 0);

    /* The worker's memory, exported by the daemon: hosta maps it. */
    memcpy(wmap, "worker!!", 8);
    worker->fd = wfd;
    in_worker(step_export);
    in_worker(step_map_back);
    ck_assert_int_eq(worker->ret, 0);

    /* An interrupt route: hosta signals the worker's eventfd itself. */
    worker->fd = efd;
    in_worker(step_route);
    ck_assert_int_eq(worker->ret, 0);
    ck_assert_int_eq(read(efd, &n, sizeof(n)), sizeof(n));
    ck_assert_uint_eq(n, 1);
    munmap(map, 16384);
    munmap(wmap, 4096);
    close(memfd);
    close(wfd);
    close(efd);
}
END_TEST

START_TEST(test_doorbells_and_restart)
{
    VnFabric *b = hostb();
    Node *hb = nodes->pdata[1];
    g_autoptr(GError) error = NULL;
    g_autofree char *secret = NULL;
    int first;

    node_start(lender);
    open_worker(step_open);
    in_worker(step_doorbells);
    first = worker->ret;
    ck_assert_int_ge(first, 0);
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(b), 2);
    /* hosta rings the worker's bit: the worker gets it, the daemon's
     * handler does not; a bit nobody was given reaches no worker. */
    ck_assert(vn_port_doorbell(port, "hosta", (uint32_t)first + 1));
    ck_assert(!vn_port_doorbell(port, "hosta", 20));
    ck_assert(!vn_port_doorbell(port, "hostc", (uint32_t)first));
    worker->id = (uint64_t)first + 1;
    in_worker(step_wait_doorbell);
    ck_assert_uint_eq(worker->doorbells[first + 1], 1);

    /* The daemon restarts: a new port at the same path; its bits were
     * forgotten with it, the worker claims them back, and no link went
     * down for it. */
    secret = vn_port_secret_hex(port);
    vn_port_free(port, false);
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(b), 0);
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", false, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
    ck_assert(vn_port_adopt(port, getpid(), secret));
    in_worker(step_run);
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(b), 2);
    in_worker(step_echo);
    ck_assert_int_eq(worker->ret, 0);
    ck_assert_uint_eq(worker->downs, 0);

    /* A port that goes takes back what its worker had. */
    vn_port_free(port, true);
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", false, ctx, &error);
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(b), 0);
}
END_TEST

static unsigned worker_links(bool up)
{
    unsigned n;

    g_mutex_lock(&worker->lock);
    n = up ? worker->ups : worker->downs;
    g_mutex_unlock(&worker->lock);
    return n;
}

/* The daemon stays away past the bound: the worker's link goes down and it
 * goes on dialling, so a daemon started later still finds it.  Each later
 * restart gets the whole bound again: one that comes back in time takes no
 * link down (the bound once ran from the first restart, so a second restart
 * brought every link down at once, and nothing dialled after that). */
START_TEST(test_restarts_each_get_the_bound)
{
    Node *hb = nodes->pdata[1];
    g_autoptr(GError) error = NULL;

    node_start(lender);
    open_worker(step_open_short_bound);
    ck_assert_int_eq(worker->ret, 0);
    in_worker(step_run);
    ck_assert_uint_eq(worker_links(true), 1);

    /* Away for 500 ms, then twice for 150 ms. */
    for (int restart = 0; restart < 3; restart++) {
        g_autofree char *secret = vn_port_secret_hex(port);

        vn_port_free(port, false);
        port = NULL;
        in_worker(restart == 0 ? step_run : step_run_brief);
        ck_assert_uint_eq(worker_links(false), 1);
        port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", false, ctx, &error);
        ck_assert_msg(port != NULL, "%s", error ? error->message : "");
        ck_assert(vn_port_adopt(port, getpid(), secret));
        in_worker(step_run);
        in_worker(step_echo);
        ck_assert_msg(worker->ret == 0, "restart %d: %s", restart, g_strerror(-worker->ret));
        ck_assert_uint_ge(worker_links(true), 2);
        ck_assert_uint_eq(worker_links(false), 1);
    }
}
END_TEST

/* The holder was known before the worker started (a lend and a borrow at
 * once): the daemon's greeting names it, and the worker's fabric, still
 * opening then, has the link up once it runs. */
START_TEST(test_holder_known_before_the_worker)
{
    Node *hb = nodes->pdata[1];
    g_autoptr(GError) error = NULL;
    bool up;

    vn_port_free(port, true);
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", true, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
    open_worker(step_open_inbound);
    in_worker(step_run);
    up = vn_fabric_link_up(worker->fab, "hosta");
    ck_assert_msg(up, "the worker never heard its holder's link is up");
    ck_assert_uint_eq(worker->ups, 1);
}
END_TEST

/* The port again as a lender worker's (it answers its peer's requests). */
static void port_inbound(Node *hb)
{
    g_autoptr(GError) error = NULL;

    vn_port_free(port, true);
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", true, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
}

/* Which node's segment step_map_peer maps (a peer-to-peer target's). */
static const char *map_peer;

static void step_map_peer(Worker *w)
{
    g_autoptr(GError) error = NULL;

    w->win = fw_window_map(w->fab, map_peer, w->id, &error);
    w->ret = w->win != NULL ? 0 : -(error != NULL ? error->code : 1);
}

/* A lender's worker maps another node's segment (a peer-to-peer target, docs/p2p.md) only
 * once the daemon allowed it for the device's holder, and its own host's only so too (mapped
 * without a window); a new holder starts with nothing allowed. */
START_TEST(test_p2p_only_what_the_holder_allowed)
{
    Node *hb = nodes->pdata[1];
    Node *hc = node_open("hostc", true);
    uint8_t *cmap, *bmap;
    int cfd = memfd_new(4096, &cmap);
    int bfd = memfd_new(4096, &bmap);
    uint64_t cseg, bseg;
    uint64_t refused;

    cseg = vn_fabric_segment_export(hc->fab, cfd, 4096, "hostb", NULL);
    ck_assert_uint_ne(cseg, 0);
    bseg = vn_fabric_segment_export(hb->fab, bfd, 4096, "hostb", NULL);
    ck_assert_uint_ne(bseg, 0);
    node_start(hc);
    link_nodes(hb, hc);
    /* A borrower's port allows nothing of the kind. */
    ck_assert(!vn_port_p2p_allow(port, "hostc", cseg));
    port_inbound(hb);
    open_worker(step_open_inbound);

    /* Not allowed: refused, nothing mapped. */
    map_peer = "hostc";
    worker->id = cseg;
    refused = vn_port_refused(port);
    in_worker(step_map_peer);
    ck_assert_int_ne(worker->ret, 0);
    ck_assert_uint_gt(vn_port_refused(port), refused);
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 0);

    /* Allowed: the window reaches hostc's memory. */
    ck_assert(vn_port_p2p_allow(port, "hostc", cseg));
    in_worker(step_map_peer);
    ck_assert_int_eq(worker->ret, 0);
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 1);
    memcpy(worker->win->host + 8, "to-c", 4);
    ck_assert_mem_eq(cmap + 8, "to-c", 4);
    in_worker(step_unmap);
    WAIT_FOR(vn_fabric_windows_in_use(hostb()) == 0);

    /* This host's own segment, allowed: its memory, no window of the host's spent. */
    map_peer = "hostb";
    worker->id = bseg;
    ck_assert(vn_port_p2p_allow(port, "hostb", bseg));
    in_worker(step_map_peer);
    ck_assert_int_eq(worker->ret, 0);
    memcpy(worker->win->host, "local", 5);
    ck_assert_mem_eq(bmap, "local", 5);
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 0);
    in_worker(step_unmap);

    /* The holder changes: what the old one allowed is not the new one's. */
    vn_port_set_peer(port, NULL);
    vn_port_set_peer(port, "hosta");
    map_peer = "hostc";
    worker->id = cseg;
    in_worker(step_map_peer);
    ck_assert_int_ne(worker->ret, 0);
    ck_assert(!vn_port_p2p_allow(port, "hostc", 0));
    munmap(cmap, 4096);
    munmap(bmap, 4096);
    close(cfd);
    close(bfd);
}
END_TEST

/* A lender's worker that was away gets its holder's requests right after its daemon's
 * greeting (held by the port, then passed after the HELLO's answer): it handles them once the
 * greeting is over, from its loop, so a handler that waits on the port itself (an export)
 * does not take an answer the greeting waits for.  (It once did: the worker saw "a REPLY to
 * no op of ours", dropped its connection, and the holder's next attach went unanswered.) */
START_TEST(test_requests_after_the_greeting)
{
    Node *hb = nodes->pdata[1];
    g_autoptr(GError) error = NULL;
    g_autofree char *secret = NULL;
    VnFabricMsg msg = { .peer = "hosta", .type = T_ECHO, .json = DEVICE_JSON };
    VnFabricStats st;

    port_inbound(hb);
    open_worker(step_open_inbound);
    in_worker(step_run_brief);
    secret = vn_port_secret_hex(port);
    vn_port_free(port, false);
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", true, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
    ck_assert(vn_port_adopt(port, getpid(), secret));
    for (uint64_t token = 1; token <= 3; token++) {
        ck_assert(vn_port_request(port, &msg, token));
    }
    worker->fd = memfd_new(4096, NULL);
    in_worker(step_run);
    ck_assert_uint_eq(worker->handled, 3);
    ck_assert_uint_eq(worker->handler_failed, 0);
    vn_fabric_stats(worker->fab, &st);
    ck_assert_uint_eq(st.bad_messages, 0);
    ck_assert_uint_eq(vn_port_refused(port), 0);
    close(worker->fd);
}
END_TEST

static gint device_requests;

static void on_device_request(void *opaque)
{
    g_atomic_int_inc(&device_requests);
}

static void step_device_request(Worker *w)
{
    w->ret = vn_host_device_request(w->fab) ? 0 : -1;
}

/* A lender's worker says the host wants the device back: its daemon hears
 * it; a borrower's worker saying it is refused. */
START_TEST(test_device_request)
{
    Node *hb = nodes->pdata[1];

    g_atomic_int_set(&device_requests, 0);
    vn_port_on_device_request(port, on_device_request, NULL);
    open_worker(step_open);
    in_worker(step_device_request);
    ck_assert_int_eq(worker->ret, 0);
    WAIT_FOR(vn_port_refused(port) == 1);
    ck_assert_int_eq(g_atomic_int_get(&device_requests), 0);
    in_worker(step_close);

    port_inbound(hb);
    vn_port_on_device_request(port, on_device_request, NULL);
    open_worker(step_open_inbound);
    in_worker(step_device_request);
    ck_assert_int_eq(worker->ret, 0);
    WAIT_FOR(g_atomic_int_get(&device_requests) == 1);
    ck_assert_uint_eq(vn_port_refused(port), 0);
    /* Not a `host` node: nothing to tell. */
    ck_assert(!vn_host_device_request(hb->fab));
}
END_TEST

static void w_dialled(void *opaque, int fd, const GError *error)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->fd = fd;
    a->err = fd >= 0 ? 0 : error->code;
}

/* The daemon dials the worker's device server for it (asked; waited for here). */
static void step_dial(Worker *w)
{
    FwAnswer a = { .fd = -1, .err = -ETIMEDOUT };

    vn_host_dial_device_async(w->fab, w_dialled, &a);
    fw_until(w->fab, &a);
    w->fd = a.fd;
    w->ret = a.err;
}

/* A device server's socket for the dial test: listening, in the rig's directory. */
static int device_server_socket(char **path)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    *path = g_build_filename(tmpdir, "device.sock", NULL);
    g_strlcpy(addr.sun_path, *path, sizeof(addr.sun_path));
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(fd, 4), 0);
    return fd;
}

/* A lender's worker without the rights to reach its device server asks its daemon to dial
 * it: it gets a connection to the socket the daemon's config names (the server accepts
 * it), not more often than every VN_PORT_DIAL_MIN_MS; a borrower's worker, or a lender's
 * whose daemon names no server, is refused. */
START_TEST(test_dial_device)
{
    Node *hb = nodes->pdata[1];
    g_autofree char *path = NULL;
    int server = device_server_socket(&path), conn;

    open_worker(step_open);
    in_worker(step_dial);
    ck_assert_int_lt(worker->fd, 0); /* a borrower's: no device server */
    WAIT_FOR(vn_port_refused(port) == 1);
    in_worker(step_close);

    port_inbound(hb);
    open_worker(step_open_inbound);
    in_worker(step_dial);
    ck_assert_int_lt(worker->fd, 0); /* no server named */
    ck_assert_uint_eq(vn_port_refused(port), 1);
    vn_port_set_dial(port, path);
    in_worker(step_dial);
    ck_assert_msg(worker->fd >= 0, "dial: error %d", worker->ret);
    conn = accept(server, NULL, NULL);
    ck_assert_int_ge(conn, 0);
    ck_assert_int_eq(write(worker->fd, "hi", 2), 2);
    {
        char buf[2];

        ck_assert_int_eq(read(conn, buf, 2), 2);
        ck_assert_mem_eq(buf, "hi", 2);
    }
    close(conn);
    close(worker->fd);
    /* At once again: too soon. */
    in_worker(step_dial);
    ck_assert_int_lt(worker->fd, 0);
    ck_assert_int_eq(worker->ret, G_IO_ERROR_WOULD_BLOCK);
    /* A worker that keeps every connection it is handed holds one live one: each dial
     * ends the one before, for the server too (it reads the end of it). */
    {
        int held[4], served[4];
        char c;

        for (int i = 0; i < 4; i++) {
            g_usleep(VN_PORT_DIAL_MIN_MS * 1000 * 2);
            in_worker(step_dial);
            held[i] = worker->fd;
            ck_assert_int_ge(held[i], 0);
            served[i] = accept(server, NULL, NULL);
            ck_assert_int_ge(served[i], 0);
        }
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(read(served[i], &c, 1), 0);
            ck_assert_int_eq(read(held[i], &c, 1), 0);
        }
        ck_assert_int_eq(write(held[3], "x", 1), 1);
        ck_assert_int_eq(read(served[3], &c, 1), 1);
        for (int i = 0; i < 4; i++) {
            close(held[i]);
            close(served[i]);
        }
    }
    /* A server that is not there: the dial says so, and so does one at once after it (the
     * last dial's answer, not EAGAIN: what the attach that follows tells the operator). */
    {
        g_autofree char *absent = g_strconcat(path, ".absent", NULL);

        vn_port_set_dial(port, absent);
        g_usleep(VN_PORT_DIAL_MIN_MS * 1000 * 2);
        in_worker(step_dial);
        ck_assert_int_lt(worker->fd, 0);
        ck_assert_int_eq(worker->ret, G_IO_ERROR_NOT_FOUND);
        in_worker(step_dial);
        ck_assert_int_lt(worker->fd, 0);
        ck_assert_int_eq(worker->ret, G_IO_ERROR_NOT_FOUND);
    }
    /* A PCI function's worker: the dial opens its IOMMU group, here a function this host
     * does not have (so no fd, and nothing else opened in its place). */
    vn_port_set_dial_vfio(port, "0000:7f:1f.7");
    in_worker(step_dial);
    ck_assert_int_lt(worker->fd, 0);
    close(server);
}
END_TEST

static gint fences;

static void on_fenced(void *opaque)
{
    g_atomic_int_inc(&fences);
}

static void step_fenced(Worker *w)
{
    w->ret = vn_host_fenced(w->fab) ? 0 : -1;
}

/* A lender's worker says it fenced its device: its daemon hears it; a borrower's worker
 * saying so is refused. */
START_TEST(test_fenced)
{
    Node *hb = nodes->pdata[1];

    g_atomic_int_set(&fences, 0);
    vn_port_on_fenced(port, on_fenced, NULL);
    open_worker(step_open);
    in_worker(step_fenced);
    ck_assert_int_eq(worker->ret, 0);
    WAIT_FOR(vn_port_refused(port) == 1);
    ck_assert_int_eq(g_atomic_int_get(&fences), 0);
    in_worker(step_close);

    port_inbound(hb);
    vn_port_on_fenced(port, on_fenced, NULL);
    open_worker(step_open_inbound);
    in_worker(step_fenced);
    WAIT_FOR(g_atomic_int_get(&fences) == 1);
    ck_assert_uint_eq(vn_port_refused(port), 0);
}
END_TEST

static gint server_says, server_up_said, server_gen_said;

static void on_device_server(void *opaque, bool up, uint32_t gen)
{
    g_atomic_int_set(&server_up_said, up);
    g_atomic_int_set(&server_gen_said, (gint)gen);
    g_atomic_int_inc(&server_says);
}

static void step_server_lost(Worker *w)
{
    w->ret = vn_host_device_server(w->fab, false, 0) ? 0 : -1;
}

static void step_server_back(Worker *w)
{
    w->ret = vn_host_device_server(w->fab, true, 3) ? 0 : -1;
}

/* A lender's worker says its device server is lost or back: its daemon hears it, and a
 * restarted daemon hears the last word at the worker's greeting; a borrower's worker
 * saying so is refused. */
START_TEST(test_device_server)
{
    Node *hb = nodes->pdata[1];
    g_autoptr(GError) error = NULL;
    g_autofree char *secret = NULL;

    g_atomic_int_set(&server_says, 0);
    vn_port_on_device_server(port, on_device_server, NULL);
    open_worker(step_open);
    in_worker(step_server_lost);
    ck_assert_int_eq(worker->ret, 0);
    WAIT_FOR(vn_port_refused(port) == 1);
    ck_assert_int_eq(g_atomic_int_get(&server_says), 0);
    in_worker(step_close);

    port_inbound(hb);
    vn_port_on_device_server(port, on_device_server, NULL);
    open_worker(step_open_inbound);
    in_worker(step_server_lost);
    WAIT_FOR(g_atomic_int_get(&server_says) == 1);
    ck_assert(!g_atomic_int_get(&server_up_said));
    in_worker(step_server_back);
    WAIT_FOR(g_atomic_int_get(&server_says) == 2);
    ck_assert(g_atomic_int_get(&server_up_said));
    ck_assert_int_eq(g_atomic_int_get(&server_gen_said), 3);
    ck_assert_uint_eq(vn_port_refused(port), 0);

    /* The daemon restarts: the new one hears where the server stands at the greeting. */
    secret = vn_port_secret_hex(port);
    vn_port_free(port, false);
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", true, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
    ck_assert(vn_port_adopt(port, getpid(), secret));
    vn_port_on_device_server(port, on_device_server, NULL);
    in_worker(step_run);
    WAIT_FOR(g_atomic_int_get(&server_says) == 3);
    ck_assert(g_atomic_int_get(&server_up_said));
    ck_assert_int_eq(g_atomic_int_get(&server_gen_said), 3);
    /* Not a `host` node: nothing to tell. */
    ck_assert(!vn_host_device_server(hb->fab, true, 0));
}
END_TEST

static void step_unexport(Worker *w)
{
    vn_fabric_segment_unexport(w->fab, w->id);
}

/*
 * The daemon's part of a fence, without the worker: what the worker exported goes at once
 * (its peer cannot map it any more) while what was mapped for it stays (its device may
 * still reach it, until the worker is dead); the worker's own unexport of it later is no
 * refusal; for a dead worker, everything goes, its windows too.
 */
START_TEST(test_withdraw)
{
    uint8_t *map, *wmap;
    int memfd = memfd_new(16384, &map);
    int wfd = memfd_new(4096, &wmap);
    uint64_t segment;

    segment = vn_fabric_segment_export(lender->fab, memfd, 16384, "hostb", NULL);
    node_start(lender);
    open_worker(step_open);
    worker->id = segment;
    in_worker(step_map);
    ck_assert_int_eq(worker->ret, 0);
    memcpy(wmap, "worker!!", 8);
    worker->fd = wfd;
    in_worker(step_export);
    in_worker(step_map_back);
    ck_assert_int_eq(worker->ret, 0);

    vn_port_withdraw(port, false, "a test's lease ended");
    in_worker(step_map_back);
    ck_assert_int_ne(worker->ret, 0);
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 1);
    in_worker(step_unexport);
    in_worker(step_echo); /* after the unexport, in order */
    ck_assert_uint_eq(vn_port_refused(port), 0);

    vn_port_withdraw(port, true, "a test's worker died");
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 0);
    munmap(map, 16384);
    munmap(wmap, 4096);
    close(memfd);
    close(wfd);
}
END_TEST

/* A raw connection to the port, past a worker's own fabric's checks: the one it makes for
 * a worker it starts. */
static int raw_connect(void)
{
    int sock = vn_port_pair(port, NULL);

    ck_assert_int_ge(sock, 0);
    ck_assert(g_unix_set_fd_nonblocking(sock, TRUE, NULL));
    return sock;
}

/* The next REPLY on @sock (within a second), and the fd it carried (-1: none). */
static VnHostHdr raw_reply(int sock, int *fd)
{
    VnRecordReader rx = { 0 };
    VnRecord rec = { 0 };
    VnHostHdr rep;
    int ret = 0;

    for (int i = 0; i < 1000 && ret == 0; i++) {
        ret = vn_record_step(&rx, sock, VN_HOST_MAX_RECORD, &rec);
        if (ret == 0) {
            g_usleep(1000);
        }
    }
    ck_assert_int_gt(ret, 0);
    ck_assert_uint_ge(rec.len, sizeof(rep));
    memcpy(&rep, rec.buf, sizeof(rep));
    ck_assert_uint_eq(rep.op, VN_HOST_REPLY);
    *fd = rec.nfds == 1 ? rec.fds[0] : -1;
    g_free(rec.buf);
    vn_record_reader_clear(&rx);
    return rep;
}

/* The daemon restarts and leaves its port (the worker's exports stay); the new daemon's
 * fabric has no entry of them.  The worker claims its segment back as it reconnects, and its
 * unexport is then done, not refused.  Claims for another peer than the port's, or of a kind
 * there is none of, are refused and counted. */
START_TEST(test_exports_claimed_after_restart)
{
    Node *hb = nodes->pdata[1];
    g_autoptr(GError) error = NULL;
    g_autofree char *secret = NULL;
    uint8_t *wmap;
    int wfd = memfd_new(4096, &wmap);
    int sock;

    node_start(lender);
    open_worker(step_open);
    worker->fd = wfd;
    in_worker(step_export);
    secret = vn_port_secret_hex(port);
    vn_port_leave(port);
    vn_fabric_segment_unexport(hostb(), worker->id); /* what a new daemon's fabric lacks */
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", false, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
    ck_assert(vn_port_adopt(port, getpid(), secret));
    in_worker(step_run);
    in_worker(step_unexport);
    in_worker(step_echo); /* after the unexport, in order */
    ck_assert_uint_eq(vn_port_refused(port), 0);

    sock = raw_connect();
    ck_assert_int_eq(
        vn_host_send(sock, VN_HOST_CLAIM, 0, 0, "hostc", 77, VN_FABRIC_HELD_SEGMENT, NULL, 0, -1),
        0);
    WAIT_FOR(vn_port_refused(port) == 1);
    ck_assert_int_eq(vn_host_send(sock, VN_HOST_CLAIM, 0, 0, "hosta", 78, 7, NULL, 0, -1), 0);
    WAIT_FOR(vn_port_refused(port) == 2);
    close(sock);
    munmap(wmap, 4096);
    close(wfd);
}
END_TEST

/* A worker that lies: it asks its daemon to withhold (or give back) a segment that is not
 * its own, here one the daemon's node exported itself.  Refused with EACCES, counted, and
 * the segment is left as it was. */
START_TEST(test_withhold_not_its_own)
{
    uint8_t *map;
    int memfd = memfd_new(4096, &map);
    uint64_t other = vn_fabric_segment_export(hostb(), memfd, 4096, "hosta", NULL);
    VnHostHdr rep;
    int sock, fd;

    ck_assert_uint_ne(other, 0);
    sock = raw_connect();
    ck_assert_int_eq(
        vn_host_send(sock, VN_HOST_WITHHOLD_SEGMENT, 7, 0, NULL, other, 1, NULL, 0, -1), 0);
    WAIT_FOR(vn_port_refused(port) == 1);
    rep = raw_reply(sock, &fd);
    ck_assert_uint_eq(rep.seq, 7);
    ck_assert_int_eq(rep.status, EACCES);
    ck_assert_int_eq(fd, -1);
    /* Untouched: still exported. */
    ck_assert_int_eq(vn_fabric_segment_withhold(hostb(), other, false), 0);
    close(sock);
    vn_fabric_segment_unexport(hostb(), other);
    munmap(map, 4096);
    close(memfd);
}
END_TEST

/* JOIN_WINDOWS of @len bytes of @ids sent raw as op @seq: the refusal's status, once the
 * port counted it as its @refused-th (no fd comes with it). */
static int raw_join(int sock, uint64_t seq, const uint64_t *ids, size_t len, uint64_t refused)
{
    VnHostHdr rep;
    int fd;

    ck_assert_int_eq(
        vn_host_send(sock, VN_HOST_JOIN_WINDOWS, seq, 0, "hosta", 4096, 0, ids, len, -1), 0);
    WAIT_FOR(vn_port_refused(port) == refused);
    rep = raw_reply(sock, &fd);
    ck_assert_uint_eq(rep.seq, seq);
    ck_assert_int_eq(fd, -1);
    return rep.status;
}

/* A worker that asks its daemon to join windows it was not given (ids it forged), or
 * sends ids that are not a whole number of them: refused (EACCES, EINVAL), counted, no fd. */
START_TEST(test_join_not_its_own)
{
    const uint64_t forged[2] = { 1, 2 };
    int sock;

    node_start(lender);
    sock = raw_connect();
    ck_assert_int_eq(raw_join(sock, 8, forged, sizeof(forged), 1), EACCES);
    ck_assert_int_eq(raw_join(sock, 9, forged, sizeof(forged) - 4, 2), EINVAL);
    close(sock);
}
END_TEST

/* A worker that floods its daemon with CONNECTs: each is answered once (the link, or busy
 * while one waits: here 1 and 99), none holds anything, and the worker keeps its connection. */
START_TEST(test_connect_flood)
{
    enum { N = 100 };
    VnRecordReader rx = { 0 };
    unsigned answered[N + 1] = { 0 }, up = 0, busy = 0, got = 0;
    gint64 end;
    int sock;

    node_start(lender);
    sock = raw_connect();
    for (uint64_t seq = 1; seq <= N; seq++) {
        ck_assert_int_eq(vn_host_send(sock, VN_HOST_CONNECT, seq, 0, "hosta", 0, 0, NULL, 0, -1),
                         0);
    }
    end = g_get_monotonic_time() + 5 * G_USEC_PER_SEC;
    while (got < N && g_get_monotonic_time() < end) {
        VnRecord rec = { 0 };
        VnHostHdr rep;

        g_main_context_iteration(ctx, FALSE);
        if (vn_record_step(&rx, sock, VN_HOST_MAX_RECORD, &rec) <= 0) {
            g_usleep(500);
            continue;
        }
        ck_assert_uint_ge(rec.len, sizeof(rep));
        memcpy(&rep, rec.buf, sizeof(rep));
        g_free(rec.buf);
        ck_assert_uint_eq(rep.op, VN_HOST_REPLY);
        ck_assert(rep.seq >= 1 && rep.seq <= N);
        answered[rep.seq]++;
        up += rep.status == 0;
        busy += rep.status == EBUSY;
        got++;
    }
    vn_record_reader_clear(&rx);
    ck_assert_uint_eq(got, N);
    for (unsigned seq = 1; seq <= N; seq++) {
        ck_assert_uint_eq(answered[seq], 1);
    }
    ck_assert_uint_ge(up, 1);
    ck_assert_uint_eq(up + busy, N);
    ck_assert(vn_port_connected(port));
    close(sock);
}
END_TEST

static void step_keep(Worker *w)
{
    w->ret = vn_host_keep(w->fab, w->id, w->fd, w->fd < 0 ? "{\"v\":1}" : NULL, w->fd < 0 ? 7 : 0)
                 ? 0
                 : -1;
}

static void step_forget(Worker *w)
{
    w->ret = vn_host_forget(w->fab, w->id, w->id) ? 0 : -1;
}

static bool same_file(int a, int b)
{
    struct stat x, y;

    return fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static bool kept_state_is(const char *text)
{
    g_autoptr(GBytes) st = vn_keep_get_state(vn_port_keep(port));
    gsize n = 0;
    const char *data = st != NULL ? g_bytes_get_data(st, &n) : NULL;

    return text == NULL ? st == NULL
                        : (data != NULL && n == strlen(text) && !memcmp(data, text, n));
}

/* A borrower's worker keeps fds and its state with its port, for the worker after it: the
 * daemon holds the same files, forgets them when told, and refuses what is not a keep (key
 * 0 is the state's, a state over the bound). */
START_TEST(test_keep_for_the_next_worker)
{
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    g_autofree char *big = g_malloc0(VN_HOST_MAX_KEPT_STATE + 1);

    node_start(lender);
    open_worker(step_open);
    worker->id = 5;
    worker->fd = efd;
    in_worker(step_keep);
    ck_assert_int_eq(worker->ret, 0);
    worker->id = 0;
    worker->fd = -1;
    in_worker(step_keep);
    ck_assert_int_eq(worker->ret, 0);
    WAIT_FOR(vn_keep_get_fd(vn_port_keep(port), 5) >= 0 && kept_state_is("{\"v\":1}"));
    ck_assert(same_file(vn_keep_get_fd(vn_port_keep(port), 5), efd));
    /* Refused by the worker's own side: an fd under the state's key, too long a state. */
    ck_assert(!vn_host_keep(worker->fab, 0, efd, NULL, 0));
    ck_assert(!vn_host_keep(worker->fab, 0, -1, big, VN_HOST_MAX_KEPT_STATE + 1));
    worker->id = 5;
    in_worker(step_forget);
    WAIT_FOR(vn_keep_get_fd(vn_port_keep(port), 5) < 0);
    ck_assert(kept_state_is("{\"v\":1}"));
    worker->id = 0;
    in_worker(step_forget);
    WAIT_FOR(kept_state_is(NULL));
    ck_assert_uint_eq(vn_port_refused(port), 0);
    close(efd);
}
END_TEST

/* A worker that lies: an fd under key 0, a state under a key, a state past the bound, a
 * FORGET of a reversed range.  Each is refused and counted; nothing is kept. */
START_TEST(test_keep_forged)
{
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    g_autofree char *big = g_malloc0(VN_HOST_MAX_KEPT_STATE + 1);
    int sock;

    node_start(lender);
    sock = raw_connect();
    ck_assert_int_eq(vn_host_send(sock, VN_HOST_KEEP, 0, 0, NULL, 0, 0, NULL, 0, efd), 0);
    WAIT_FOR(vn_port_refused(port) == 1);
    ck_assert_int_eq(vn_host_send(sock, VN_HOST_KEEP, 0, 0, NULL, 9, 0, "{}", 2, -1), 0);
    WAIT_FOR(vn_port_refused(port) == 2);
    ck_assert_int_eq(
        vn_host_send(sock, VN_HOST_KEEP, 0, 0, NULL, 0, 0, big, VN_HOST_MAX_KEPT_STATE + 1, -1), 0);
    WAIT_FOR(vn_port_refused(port) == 3);
    ck_assert_int_eq(vn_host_send(sock, VN_HOST_FORGET, 0, 0, NULL, 9, 3, NULL, 0, -1), 0);
    WAIT_FOR(vn_port_refused(port) == 4);
    ck_assert(kept_state_is(NULL));
    ck_assert_int_lt(vn_keep_get_fd(vn_port_keep(port), 9), 0);
    close(sock);
    close(efd);
}
END_TEST

/* Dial the port's socket as any local process may. */
static int dial_socket(void)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    g_strlcpy(addr.sun_path, worker->port, sizeof(addr.sun_path));
    ck_assert_int_eq(connect(sock, (struct sockaddr *)&addr, sizeof(addr)), 0);
    return sock;
}

/* Whether the port closed @sock (within a second) without a word. */
static bool closed_on(int sock)
{
    struct pollfd p = { .fd = sock, .events = POLLIN };
    char c;

    for (int i = 0; i < 1000; i++) {
        g_main_context_iteration(ctx, FALSE);
        if (poll(&p, 1, 1) == 1) {
            ssize_t r = recv(sock, &c, 1, MSG_DONTWAIT);

            /* Reset: it closed with what we sent unread. */
            return r == 0 || (r < 0 && errno == ECONNRESET);
        }
    }
    return false;
}

/* Dial the socket and say HELLO with @secret: whether the port closed it unanswered. */
static bool hello_refused(const uint8_t secret[VN_HOST_SECRET_LEN])
{
    int sock = dial_socket();
    bool closed;

    ck_assert_int_eq(
        vn_host_send(sock, VN_HOST_HELLO, 1, 0, NULL, 0, 0, secret, VN_HOST_SECRET_LEN, -1), 0);
    closed = closed_on(sock);
    close(sock);
    return closed;
}

static gint gone_heard;

static void on_gone(void *opaque)
{
    g_atomic_int_inc(&gone_heard);
}

/* Another process of the worker's user (root, here this one) cannot take the worker's place:
 * a connection while the worker is connected is closed (its own goes on); so is one from a
 * process that is not the worker's. */
START_TEST(test_takeover_refused)
{
    uint8_t secret[VN_HOST_SECRET_LEN] = { 0 };
    int sock;

    node_start(lender);
    open_worker(step_open);
    ck_assert_int_eq(worker->ret, 0);
    ck_assert(hello_refused(secret));
    ck_assert_uint_eq(vn_port_refused(port), 1);
    in_worker(step_echo);
    ck_assert_int_eq(worker->ret, 0);

    /* Its connection lost (the port gave up on it): the socket takes the worker's process
     * back, and no other. */
    vn_port_set_worker(port, getpid() + 1);
    in_worker(step_close);
    g_usleep(20000);
    g_main_context_iteration(ctx, FALSE);
    ck_assert(!vn_port_connected(port));
    sock = dial_socket();
    ck_assert(closed_on(sock));
    close(sock);
    ck_assert_uint_eq(vn_port_refused(port), 2);
}
END_TEST

/* The worker's pid without its secret (the worker died, its pid went to another process):
 * refused, and after it nobody, not even with the secret; the daemon hears its worker is
 * gone.  With the secret a worker that outlived its daemon is taken back (the restart tests
 * above). */
/* A worker that went with its daemon, and the daemon after it with a new port that expects
 * it back (this process, the state file's secret): the secret's bytes in @secret. */
static void adopted_port(uint8_t secret[VN_HOST_SECRET_LEN])
{
    g_autofree char *secret_hex = NULL;
    Node *hb = nodes->pdata[1];
    g_autoptr(GError) error = NULL;

    node_start(lender);
    open_worker(step_open);
    secret_hex = vn_port_secret_hex(port);
    ck_assert_uint_eq(strlen(secret_hex), 2 * VN_HOST_SECRET_LEN);
    in_worker(step_close);
    vn_port_free(port, false);
    port = vn_port_new(hb->fab, worker->port, "hosta", "nvme0", false, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
    ck_assert(!vn_port_adopt(port, getpid(), "not hex"));
    ck_assert(vn_port_adopt(port, getpid(), secret_hex));
    vn_port_on_gone(port, on_gone, NULL);
    for (size_t i = 0; i < VN_HOST_SECRET_LEN; i++) {
        secret[i] = (uint8_t)(g_ascii_xdigit_value(secret_hex[2 * i]) << 4 |
                              g_ascii_xdigit_value(secret_hex[2 * i + 1]));
    }
}

START_TEST(test_pid_without_secret_refused)
{
    uint8_t wrong[VN_HOST_SECRET_LEN];

    adopted_port(wrong);
    wrong[VN_HOST_SECRET_LEN - 1] ^= 1;
    ck_assert(hello_refused(wrong));
    ck_assert_int_eq(g_atomic_int_get(&gone_heard), 1);
    ck_assert_int_eq(vn_port_worker(port), 0);
    /* Now not even the right secret gets in. */
    wrong[VN_HOST_SECRET_LEN - 1] ^= 1;
    ck_assert(hello_refused(wrong));
    ck_assert_uint_eq(vn_port_refused(port), 2);
}
END_TEST

/* The worker's pid that asks for something before it says the secret (a peer that tries its
 * luck with an op, then with the HELLO it may have read somewhere): refused at the first
 * record, the HELLO after it never read. */
START_TEST(test_secret_must_come_first)
{
    uint8_t secret[VN_HOST_SECRET_LEN];
    int sock;

    adopted_port(secret);
    sock = dial_socket();
    ck_assert_int_eq(vn_host_send(sock, VN_HOST_DOORBELLS_ALLOC, 1, 0, NULL, 1, 0, NULL, 0, -1), 0);
    ck_assert_int_eq(
        vn_host_send(sock, VN_HOST_HELLO, 2, 0, NULL, 0, 0, secret, VN_HOST_SECRET_LEN, -1), 0);
    ck_assert(closed_on(sock));
    close(sock);
    ck_assert_int_eq(g_atomic_int_get(&gone_heard), 1);
    ck_assert_int_eq(vn_port_worker(port), 0);
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(hostb()), 0);
}
END_TEST

/* The worker after a dead one maps the BAR's segment again: it gets the window the dead one
 * had (QEMU maps that one), not a second. */
START_TEST(test_window_given_again)
{
    uint8_t *map;
    int memfd = memfd_new(16384, &map);
    worker->id = vn_fabric_segment_export(lender->fab, memfd, 16384, "hostb", NULL);
    node_start(lender);
    open_worker(step_open);
    in_worker(step_map);
    ck_assert_int_eq(worker->ret, 0);
    /* The worker dies: its connection closes, it unmaps nothing (its backend is gone before
     * its windows); the next opens the port again. */
    worker->win = NULL;
    vn_fabric_close(worker->fab);
    worker->fab = NULL;
    g_usleep(50000);
    g_main_context_iteration(ctx, FALSE);
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 1);
    open_worker(step_open);
    in_worker(step_map);
    ck_assert_int_eq(worker->ret, 0);
    ck_assert_uint_eq(vn_fabric_windows_in_use(hostb()), 1);
    memcpy(worker->win->host + 10, "again", 5);
    ck_assert_mem_eq(map + 10, "again", 5);
    munmap(map, 16384);
    close(memfd);
}
END_TEST

/* ---- ops answered later ------------------------------------------------------ */

/* What an op asked without waiting was told (set in the worker's thread). */
typedef struct Asked {
    gint done;
    VnFabricWindow *win;
    int fd;
    int code; /* the GError's, or 0 */
} Asked;

static Asked asked[3];
static uint64_t asked_route; /* hosta's route that step_ask opens */

static void on_mapped(void *opaque, VnFabricWindow *w, const GError *error)
{
    Asked *a = opaque;

    a->win = w;
    a->code = error != NULL ? error->code : 0;
    g_atomic_int_set(&a->done, 1);
}

static void on_routed(void *opaque, int fd, const GError *error)
{
    Asked *a = opaque;

    a->fd = fd;
    a->code = error != NULL ? error->code : 0;
    g_atomic_int_set(&a->done, 1);
}

static bool all_asked_done(unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (!g_atomic_int_get(&asked[i].done)) {
            return false;
        }
    }
    return true;
}

/* A map of hosta's segment w->id, one of a segment hosta does not have, and an open of
 * hosta's route asked_route: none is told anything inside the call. */
static void step_ask(Worker *w)
{
    memset(asked, 0, sizeof(asked));
    vn_fabric_window_map_async(w->fab, "hosta", w->id, on_mapped, &asked[0]);
    vn_fabric_window_map_async(w->fab, "hosta", 999, on_mapped, &asked[1]);
    vn_fabric_route_open_async(w->fab, "hosta", asked_route, on_routed, &asked[2]);
    ck_assert(!all_asked_done(1) && !asked[1].done && !asked[2].done);
}

/* The worker's loop until the asks are answered (3 s at most). */
static void step_run_until_answered(Worker *w)
{
    gint64 end = g_get_monotonic_time() + 3 * G_USEC_PER_SEC;

    while (!all_asked_done((unsigned)w->ret) && g_get_monotonic_time() < end) {
        g_main_context_iteration(w->ctx, FALSE);
        g_usleep(1000);
    }
}

/* Replies to step_ask_many's requests: how many, how many failed, and any out of order. */
static unsigned many_answered, many_failed, many_out_of_order;

static void on_many(void *opaque, VnFabricMsg *reply, int err)
{
    g_autofree char *want =
        g_strdup_printf("{\"device\":\"nvme0\",\"i\":%u}", GPOINTER_TO_UINT(opaque));

    many_out_of_order += GPOINTER_TO_UINT(opaque) != many_answered ||
                         (err == 0 && g_strcmp0(reply->json, want) != 0);
    many_failed += err != 0;
    many_answered++;
}

/* The worker asks its lender (who takes 1 ms to answer each) 3 times what its daemon relays
 * at once, before it reads any answer, and runs its loop until all came back. */
static void step_ask_many(Worker *w)
{
    const unsigned n = 3 * VN_HOST_MAX_RELAYED;
    gint64 end = g_get_monotonic_time() + 5 * G_USEC_PER_SEC;

    many_answered = many_failed = many_out_of_order = 0;
    for (unsigned i = 0; i < n; i++) {
        g_autofree char *json = g_strdup_printf("{\"device\":\"nvme0\",\"i\":%u}", i);

        ck_assert_int_eq(vn_fabric_request(w->fab, "hosta", T_SLOW_ECHO, json, NULL, 0, on_many,
                                           GUINT_TO_POINTER(i)),
                         0);
    }
    while (many_answered < n && g_get_monotonic_time() < end) {
        g_main_context_iteration(w->ctx, FALSE);
        g_usleep(200);
    }
    vn_fabric_stats(w->fab, &w->stats);
}

static void step_unmap_asked(Worker *w)
{
    vn_fabric_window_unmap(w->fab, asked[0].win);
    asked[0].win = NULL;
}

/*
 * A worker's maps and route opens do not wait for its daemon (whose answer waits on the
 * peer): the worker asks and goes on, and each answer comes from its loop later, to the
 * one that asked it.  A daemon that goes with asks unanswered fails them: the worker is
 * told, not left waiting.
 */
START_TEST(test_asks_answered_later)
{
    uint8_t *map;
    int memfd = memfd_new(16384, &map);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    VnFabric *hb = hostb();
    g_autoptr(GError) error = NULL;
    uint64_t n = 0;

    worker->id = vn_fabric_segment_export(lender->fab, memfd, 16384, "hostb", NULL);
    ck_assert_uint_ne(worker->id, 0);
    asked_route = vn_fabric_route_export(lender->fab, efd, "hostb", NULL);
    ck_assert_uint_ne(asked_route, 0);
    node_start(lender);
    open_worker(step_open);

    in_worker(step_ask);
    worker->ret = 3;
    in_worker(step_run_until_answered);
    ck_assert(all_asked_done(3));
    ck_assert_ptr_nonnull(asked[0].win);
    memcpy(asked[0].win->host + 20, "later", 5);
    ck_assert_mem_eq(map + 20, "later", 5);
    ck_assert_ptr_null(asked[1].win);
    ck_assert_int_ne(asked[1].code, 0);
    ck_assert_int_ge(asked[2].fd, 0);
    n = 1;
    ck_assert_int_eq(write(asked[2].fd, &n, sizeof(n)), sizeof(n));
    ck_assert_int_eq(read(efd, &n, sizeof(n)), sizeof(n));
    close(asked[2].fd);
    in_worker(step_unmap_asked);
    WAIT_FOR(vn_fabric_windows_in_use(hb) == 0);

    /* Asked, and the daemon goes before it read the ask (this thread, its loop, does not
     * run meanwhile): the worker is told once it sees its daemon gone. */
    memset(asked, 0, sizeof(asked));
    vn_fabric_window_map_async(worker->fab, "hosta", worker->id, on_mapped, &asked[0]);
    vn_port_free(port, false);
    worker->ret = 1;
    in_worker(step_run_until_answered);
    ck_assert(all_asked_done(1));
    ck_assert_ptr_null(asked[0].win);
    ck_assert_uint_eq(vn_fabric_windows_in_use(worker->fab), 0);
    port = vn_port_new(hb, worker->port, "hosta", "nvme0", false, ctx, &error);
    ck_assert_msg(port != NULL, "%s", error ? error->message : "");
    munmap(map, 16384);
    close(memfd);
    close(efd);
}
END_TEST

/* A worker never has more requests with its daemon than the daemon relays at once (it
 * refuses the rest: EBUSY); its fabric holds the others back and sends them, in order, as
 * answers come.  None is refused. */
START_TEST(test_worker_requests_past_relay_bound_wait)
{
    node_start(lender);
    open_worker(step_open);
    ck_assert_int_eq(worker->ret, 0);
    in_worker(step_ask_many);
    ck_assert_uint_eq(many_answered, 3 * VN_HOST_MAX_RELAYED);
    ck_assert_uint_eq(many_failed, 0);
    ck_assert_uint_eq(many_out_of_order, 0);
    ck_assert_uint_eq(worker->stats.requests_held, 2 * VN_HOST_MAX_RELAYED);
    ck_assert_uint_eq(vn_port_refused(port), 0);
}
END_TEST

/*
 * A worker that stops reading its port (its thread is not run: nothing reads its socket)
 * while the daemon has records for it (doorbells): the daemon's calls never wait for it,
 * and once the worker has read nothing for VN_PORT_STALL_MS the port drops its connection
 * (a stuck worker reconnects when it is not).
 */
START_TEST(test_worker_that_stops_reading)
{
    int first;

    node_start(lender);
    open_worker(step_open);
    in_worker(step_doorbells);
    first = worker->ret;
    ck_assert_int_ge(first, 0);
    ck_assert(vn_port_connected(port));
    /* Far more than its socket takes.  A send that waited would give up on the worker in
     * here (after VN_PORT_STALL_MS); what waits goes only from the loop, which does not run
     * in here, so the worker is still connected after it. */
    for (int i = 0; i < 20000; i++) {
        vn_port_doorbell(port, "hosta", (uint32_t)first);
    }
    ck_assert(vn_port_connected(port));
    /* The loop runs: the worker reads nothing, and loses its connection. */
    WAIT_FOR_MS(!vn_port_connected(port), VN_PORT_STALL_MS * 3);
}
END_TEST

/* Frames to hosta, 1 MiB each, until one is refused (40 at most): how many went and how long
 * they took. */
static void step_flood(Worker *w)
{
    g_autofree uint8_t *mib = g_malloc0(1024 * 1024);
    gint64 t0 = g_get_monotonic_time();
    int i, ret = 0;

    for (i = 0; i < 40 && ret == 0; i++) {
        ret = vn_fabric_event(w->fab, "hosta", T_ECHO, NULL, mib, 1024 * 1024);
    }
    w->ret = ret;
    w->flood_sent = (unsigned)i;
    w->flood_ms = (int)((g_get_monotonic_time() - t0) / 1000);
}

/* The other way: a daemon that reads nothing for a while (its loop does not run) neither
 * holds its worker nor loses it at the first burst.  What the port's socket does not take
 * waits in the worker, up to VN_HOST_MAX_QUEUED; the send past that fails at once and the
 * worker reconnects.  Before, a send on the first connection (non-blocking) that met a full
 * socket dropped it, and one on a reconnected (blocking) socket held the worker's loop, QEMU's
 * requests with it, up to 5 s. */
START_TEST(test_daemon_that_stops_reading)
{
    GThread *t;

    node_start(lender);
    open_worker(step_open);
    ck_assert_int_eq(worker->ret, 0);
    worker->step = step_flood;
    g_atomic_int_set(&worker->done, 0);
    t = g_thread_new("worker", step_thread, worker);
    g_thread_join(t); /* this, the daemon's, loop does not run meanwhile */
    ck_assert_msg(worker->flood_ms < 2500, "the worker's sends took %d ms", worker->flood_ms);
    ck_assert_int_lt(worker->ret, 0);
    ck_assert_uint_gt(worker->flood_sent, 2); /* some waited, then one was too many */
}
END_TEST

static Suite *port_suite(void)
{
    Suite *s = suite_create("port");
    TCase *tc = tcase_create("port");

    tcase_add_checked_fixture(tc, port_setup, port_teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_relayed_as_the_host);
    tcase_add_test(tc, test_takeover_refused);
    tcase_add_test(tc, test_pid_without_secret_refused);
    tcase_add_test(tc, test_secret_must_come_first);
    tcase_add_test(tc, test_windows_segments_routes);
    tcase_add_test(tc, test_p2p_only_what_the_holder_allowed);
    tcase_add_test(tc, test_asks_answered_later);
    tcase_add_test(tc, test_worker_requests_past_relay_bound_wait);
    tcase_add_test(tc, test_worker_that_stops_reading);
    tcase_add_test(tc, test_daemon_that_stops_reading);
    tcase_add_test(tc, test_connect_flood);
    tcase_add_test(tc, test_doorbells_and_restart);
    tcase_add_test(tc, test_holder_known_before_the_worker);
    tcase_add_test(tc, test_requests_after_the_greeting);
    tcase_add_test(tc, test_dial_device);
    tcase_add_test(tc, test_restarts_each_get_the_bound);
    tcase_add_test(tc, test_device_request);
    tcase_add_test(tc, test_fenced);
    tcase_add_test(tc, test_device_server);
    tcase_add_test(tc, test_withdraw);
    tcase_add_test(tc, test_exports_claimed_after_restart);
    tcase_add_test(tc, test_withhold_not_its_own);
    tcase_add_test(tc, test_join_not_its_own);
    tcase_add_test(tc, test_keep_for_the_next_worker);
    tcase_add_test(tc, test_keep_forged);
    tcase_add_test(tc, test_window_given_again);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(port_suite());
}
