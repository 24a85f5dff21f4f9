/*
 * vfio-ntbd internals: the daemon's state, shared by its files.
 *
 *   vfio-ntbd.c   main: options, signals
 *   daemon.c      the core (new/run/free), fabric event routing
 *   devices.c     the lent and borrowed devices: lookup, detach, lend
 *   control.c     the control socket (framing, dispatch, events)
 *   commands.c    the control commands
 *   cluster.c     daemon-to-daemon protocol: announcements, leases
 *   fence.c       a lent device taken back at a lease's end, by the daemon itself
 *   leases.c      the lender's lease state machine (no I/O; listeners act)
 *   state.c       persisted state (leases) in the state directory
 *   reload.c      the config read again (SIGHUP)
 *
 * Threads: one GMainContext (the default); every field is the main
 * thread's.
 */
#ifndef VN_DAEMON_INT_H
#define VN_DAEMON_INT_H

#include "borrower/borrower.h"
#include "conf.h"
#include "leases.h"
#include "peers.h"
#include "port.h"
#include "common/wctl.h"
#include "lending/lender.h"

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnControl VnControl;
typedef struct VnControlReply VnControlReply;

struct VnDaemon;
struct VnLocalDevice;

/* What waits for a fence: a borrow, answered with @token once the device is fenced. */
typedef void (*VnFenceResumeFn)(struct VnDaemon *d, struct VnLocalDevice *ld, const char *peer,
                                uint64_t token);
typedef struct VnFenceResume {
    VnFenceResumeFn fn; /* NULL: nothing waits */
    char *peer;
    uint64_t token;
} VnFenceResume;

/* A lent device's fence under way (fence.c). */
typedef struct VnFence {
    bool active; /* the device may not be lent until it is over */
    guint timer; /* the worker's time to say it fenced */
    bool loud;   /* after a loss (expired, dropped, revoked): said as a warning */
    VnFenceResume resume;
} VnFence;

/* A device this node lends. */
/* A lent device's server, as its lender worker says (devserver.c). */
typedef enum VnServerState {
    VN_SERVER_UNKNOWN = 0, /* the worker has not said (yet) */
    VN_SERVER_UP,
    VN_SERVER_DOWN,
} VnServerState;

typedef struct VnLocalDevice {
    struct VnDaemon *d;
    VnLendConf *conf;   /* borrowed from the config */
    VnLease *lease;     /* its lease (d->leases owns it): holder, id, state */
    guint revoke_timer; /* a revoke waiting out its grace period */
    VnControlReply *revoke_reply;
    gint64 revoke_deadline; /* when that grace runs out (real time, µs: in the state file,
                             * so a restart resumes the revoke); 0 when none */
    bool revoke_untold;     /* resumed after a restart: its holder is told again when it
                             * next announces itself */
    /* Its backend (lending/lender.h) runs in a vfio-ntb-lender process
     * (lenders.c), which outlives this daemon, behind its port: the
     * lease holder's requests go to it there. */
    VnPort *port;
    char *port_path;     /* in run-dir */
    char *channel_path;  /* its control channel (common/wctl.h), in run-dir */
    GPid worker_pid;     /* 0 while none runs */
    guint child_watch;   /* 0 for an adopted one */
    guint respawn_timer; /* a worker that exited is started again */
    guint adopted_watch; /* an adopted worker (not our child): is it still there? */
    VnIdentity id;       /* read when it was lent (identity.h) */
    char *holder_domain; /* the VM its holder serves it to, as announced, or NULL */
    VnFence fence;
    /* Its device server, as its worker says (devserver.c): whether one answers, and how
     * many times this daemon saw a lost one come back (announced to the holder). */
    VnServerState server;
    uint32_t server_gen;
    /* What its worker last said of its server's generation (kept with the worker in the
     * state file: an adopted worker whose server came back while we were away says more). */
    uint32_t worker_server_gen;
} VnLocalDevice;

/* A device this node borrows. */
/* A worker's answer to "is a QEMU connected?" */
typedef enum VnClientState {
    VN_CLIENT_UNKNOWN = 0, /* not answered (yet) */
    VN_CLIENT_CONNECTED,
    VN_CLIENT_GONE, /* QEMU let go, or the worker is gone */
} VnClientState;

/* A borrower worker is replaced under its QEMU at most VN_TAKEOVER_BURST times in
 * VN_TAKEOVER_WINDOW_MS (takeover.c). */
#define VN_TAKEOVER_BURST 3
#define VN_TAKEOVER_WINDOW_MS 60000

typedef struct VnBorrowed {
    char *device; /* "host/name" */
    char *lender;
    char *name;
    uint64_t lease;
    VnIrqMode irq_mode;
    char *domain; /* set while attached */
    char *socket;
    char *qmp;     /* the VM's QMP socket, optional */
    char *qdev_id; /* the device's id in that VM (with qmp) */
    /* While attached, the vfio-user server runs in its own process (spawn.c)
     * so that it outlives this daemon. */
    GPid worker_pid;     /* 0 when detached */
    char *worker_name;   /* names its files in run-dir (not a fabric node) */
    char *channel_path;  /* its control channel (common/wctl.h), in run-dir */
    char *port_path;     /* its port (port.h), in run-dir */
    VnPort *port;        /* how it uses this host's node; NULL when detached */
    guint child_watch;   /* 0 for a worker adopted after a restart */
    guint adopted_watch; /* an adopted worker: a look now and then at whether it lives */
    /* Does its QEMU still hold the socket?  Asked without waiting
     * (VnWorkerOps.client_state): the call in flight, when it was asked,
     * and the last answer with when its question was asked. */
    VnWctlCall *client_call;
    gint64 client_call_us;
    VnClientState client_state;
    gint64 client_state_us;
    bool lost; /* the lender went away */
    /* Its device server, as the lender announces it (devserver.c): lost now, and the
     * generation our VM's device is of (known once an announcement said it). */
    bool server_down;
    bool server_gen_known;
    uint32_t server_gen;
    bool unconfirmed;    /* restored, or the lender's link went down: the
                                 * lender's next announcement keeps or drops it */
    guint release_timer; /* vn_cluster_release() waits for the VM */
    guint away_timer;    /* the lender's link is down: lost unless it is back
                                 * within lease-timeout-ms (its daemon restarts) */
    /* A worker being started (VnWorkerOps.start has not called back yet);
     * freeing @b ends the start through @start_cancel. */
    bool starting;
    void (*start_cancel)(void *start_data);
    void *start_data;
    /* Workers that took over a dead one's QEMU (takeover.c): how many, and when the last
     * VN_TAKEOVER_BURST did (monotonic; 0: none). */
    uint64_t takeovers;
    gint64 takeover_us[VN_TAKEOVER_BURST];
} VnBorrowed;

/* A host that announced itself (workers never do, so they are never here).
 * Kept while its link is down, so its devices show as unreachable, until
 * VN_DAEMON_FORGET_NODE_MS have passed or the table needs the room. */
typedef struct VnRemoteNode {
    char *name;
    bool link_up;
    gint64 down_since_us; /* monotonic, while !link_up */
    gint64 seen_us;       /* monotonic: its last announcement */
    VnPeersAnnounce *ann; /* its last announcement (decoded, so valid) */
    bool owed;            /* our last announcement to it was not sent: the next beat sends */
    guint phase;          /* the beat of each VN_DAEMON_REFRESH_EVERY that refreshes it */
} VnRemoteNode;

typedef struct VnDaemonStatic VnDaemonStatic;
typedef struct VnMetrics VnMetrics;
typedef struct VnWorkerOps VnWorkerOps;

/*
 * The `reload` command's way to the config (its main() knows the file and
 * tells systemd around it): false with @error when the file is refused.
 * Without one (a daemon a test made) the command is refused.
 */
typedef bool (*VnReloadFn)(void *data, char **summary, GError **error);

typedef struct VnDaemon {
    VnConfig *conf;
    VnFabric *fab;
    GPtrArray *local;     /* VnLocalDevice */
    GPtrArray *borrowed;  /* VnBorrowed */
    GHashTable *nodes;    /* name -> VnRemoteNode */
    VnLeases *leases;     /* of the devices in @local */
    uint64_t save_errors; /* state saves that failed (reported in query-stats) */
    uint64_t leases_lost; /* lender: leases ended other than by a return (expired,
                           * dropped, revoked): a guest lost its device */
    bool unsaved;         /* the last save failed: the state file is behind; every
                           * control answer says "saved": false until one works */
    VnControl *control;
    GMainLoop *loop;
    guint heartbeat;
    guint announce_timer; /* a coalesced announcement is due */
    char *announced;      /* the last announcement broadcast, or NULL */
    unsigned beats;
    gint64 started_us;       /* monotonic; restored leases wait from here */
    VnDaemonStatic *statics; /* the borrows the config file names (daemon.c) */
    const VnWorkerOps *workers;
    GPtrArray *endings; /* VnEnding: workers on their way out (ending.c) */
    GPtrArray *gathers; /* counters being asked of workers (stats.c) */
    GPtrArray *unplugs; /* VnUnplug: VMs being asked to let go (unplug.c) */
    VnMetrics *metrics; /* [node] metrics-file's timer, or NULL (metrics.c) */
    GHashTable *losses; /* borrowed device -> its last loss, a line (devices.c) */
    VnReloadFn reload;  /* the `reload` command's (vn_daemon_set_reload), or NULL */
    void *reload_data;
} VnDaemon;

/* ---- daemon.c ---- */
/*
 * A daemon for @conf (which it takes, even on failure): probes the control
 * socket, joins the fabric, lends, restores its state, opens the control
 * socket and starts announcing.  @workers serve attached devices (NULL:
 * vn_spawn_ops, worker processes).  NULL with @error when any of that fails.
 * It runs in the thread-default main context (the default one).
 */
VnDaemon *vn_daemon_new(VnConfig *conf, const VnWorkerOps *workers, GError **error);
/* Serve until vn_daemon_quit(). */
void vn_daemon_run(VnDaemon *d);
void vn_daemon_quit(VnDaemon *d);
/* Borrower workers keep serving their VMs (a new daemon adopts them). */
void vn_daemon_free(VnDaemon *d);
/* The counters to [node] stats-file, if set. */
void vn_daemon_write_stats(VnDaemon *d);

/* ---- reload.c ---- */
/*
 * Read the config at @path again and apply what needs no restart (reload.c
 * says what); false with @error (vn_conf_load()'s, the message
 * `vfio-ntbd --check-config` prints) when the file does not pass, and then
 * nothing changed.  Logs what it changed and what it ignored, and gives that
 * line in *@summary (NULL: not wanted).
 */
bool vn_daemon_reload(VnDaemon *d, const char *path, char **summary, GError **error);
/* The `reload` command's way to the config (VnReloadFn, above VnDaemon). */
void vn_daemon_set_reload(VnDaemon *d, VnReloadFn fn, void *data);
/* One line for systemd's STATUS=: "lending 2 (1 lent), borrowing 1, 3 nodes up". */
char *vn_daemon_status(VnDaemon *d);

/* Peers are looked for this often.  Announcements go out on every change and to a new
 * link; messages on a link arrive in order, so the periodic ones only heal what a send
 * that failed left behind: to a host we share a lease with every VN_DAEMON_ANNOUNCE_EVERY
 * beats, to any other every VN_DAEMON_REFRESH_EVERY (each host at its own beat, so an idle
 * cluster's messages are spread out, not a burst), and at the next beat to one whose last
 * send failed. */
#define VN_DAEMON_HEARTBEAT_MS 1000
#define VN_DAEMON_ANNOUNCE_EVERY 5
#define VN_DAEMON_REFRESH_EVERY 60
/* A grant is announced this long after it, with every change made
 * meanwhile: each announcement goes to every peer (n - 1 messages, each
 * parsed by its receiver), so a burst of grants on one lender -- a VM taking
 * several devices -- costs one broadcast, and a grant returned within the
 * delay costs none (the lease's end finds nothing to announce).  A lease's
 * end is announced at once (a reassign's target must see the device free).
 * Third parties learn of a grant this much later; the borrower learns from
 * the reply at once, and a lender refuses a lent device whatever a third
 * party believes. */
#define VN_DAEMON_ANNOUNCE_DELAY_MS 50
/* A revoke's default grace period. */
#define VN_DAEMON_REVOKE_GRACE_MS 5000
/* A revoked borrower gives its VM half the grace period, at most this, to let
 * go of the device, and looks whether it has this often. */
#define VN_DAEMON_MAX_RELEASE_MS 10000
#define VN_DAEMON_RELEASE_POLL_MS 50
/* The most a revoke may give: what a REVOKE message may carry. */
#define VN_DAEMON_MAX_GRACE_MS VN_PEERS_MAX_GRACE_MS
/* A lease whose borrower's daemon went away (or that was restored from the
 * state file) expires if that daemon is not back and claiming it within
 * [node] lease-timeout-ms (default): a daemon restart keeps its leases. */
#define VN_DAEMON_LEASE_TIMEOUT_MS 10000
/* A host whose link went down is listed (its devices unreachable) this long;
 * then, or when the table is full, it is forgotten until it announces again. */
#define VN_DAEMON_FORGET_NODE_MS (10 * 60 * 1000)

/* ---- control.c ---- */
/* Error classes of docs/control.md. */
#define VN_ERR_COMMAND "CommandNotFound"
#define VN_ERR_PARAM "InvalidParameter"
#define VN_ERR_NODEV "DeviceNotFound"
#define VN_ERR_ACCESS "AccessDenied"
#define VN_ERR_BUSY "DeviceBusy"
#define VN_ERR_NOTBORROWED "NotBorrowed"
#define VN_ERR_UNREACHABLE "NodeUnreachable"
#define VN_ERR_GENERIC "GenericError"

/* False (G_IO_ERROR_ADDRESS_IN_USE) when a live daemon answers on @path, or
 * G_IO_ERROR_EXISTS when @path is not a socket; true when it is free or a
 * dead daemon's socket, which vn_control_new() replaces. */
bool vn_control_path_free(const char *path, GError **error);
/* A command's handler answers @r once, now or later. */
typedef void (*VnCommandFn)(VnDaemon *d, JsonObject *args, VnControlReply *r);
/* The handler of @name, or NULL; *@allowed lists its argument names. */
typedef VnCommandFn (*VnCommandLookup)(const char *name, const char *const **allowed);
/* The control socket at @path, dispatching through @lookup (transport only:
 * it knows no command). */
VnControl *vn_control_new(VnDaemon *d, const char *path, VnCommandLookup lookup, GError **error);
void vn_control_free(VnControl *c);
/* Answer a request (takes @value; NULL means {}), or fail it.  Each reply
 * is answered exactly once; it may be kept and answered later. */
void vn_control_return(VnControlReply *r, JsonNode *value);
void vn_control_error(VnControlReply *r, const char *klass, const char *fmt, ...)
    G_GNUC_PRINTF(3, 4);
/* To every client that subscribed, and kept for late subscribers; takes
 * @data. */
void vn_control_event(VnControl *c, const char *name, JsonNode *data);
/* subscribe-events: answers @r, then sends @r's client every event from
 * now on, after those kept that came after @since_us (real time, as the
 * events' timestamps say; 0: none of them). */
void vn_control_subscribe(VnControlReply *r, gint64 since_us);
/* The "device" argument, host/name, split and checked; false once an error
 * answers @r. */
bool vn_control_arg_device(JsonObject *a, VnControlReply *r, char **node, char **name);

/* ---- commands.c ---- */
/* The daemon's command table (a VnCommandLookup). */
VnCommandFn vn_commands_lookup(const char *name, const char *const **allowed);

/* queries.c: query-version, -nodes, -devices, -device, -stats. */
void vn_queries_version(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_nodes(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_devices(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_device(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_stats(VnDaemon *d, JsonObject *a, VnControlReply *r);
/* Does any node (this one included) lend @node/@name, as far as we know? */
bool vn_queries_device_known(VnDaemon *d, const char *node, const char *name);

/* ---- stats.c ---- */
/*
 * Counters of this node (fabric, lent and borrowed devices; @only: one
 * device "host/name" or NULL for all), as `query-stats` returns them: the
 * workers are asked at once, and @ready gets the JSON (it takes it) when
 * the last has answered or timed out, or the daemon stops.  False, with
 * nothing started, when VN_STATS_MAX_GATHERS are under way.
 */
/* Each asks every worker at once: a socket per worker, 64 at most. */
#define VN_STATS_MAX_GATHERS 4
typedef void (*VnStatsReady)(VnDaemon *d, JsonNode *root, void *opaque);
bool vn_stats_gather(VnDaemon *d, const char *only, VnStatsReady ready, void *opaque);
GPtrArray *vn_stats_gathers_new(void);
/* Each gather under way gets what it has so far. */
void vn_stats_gathers_free(VnDaemon *d);

/* ---- metrics.c ---- */
/* [node] metrics-file, if set: written now and every metrics-interval-ms
 * (the workers asked as query-stats asks them; one gather at a time). */
void vn_metrics_start(VnDaemon *d);
/* Before the daemon's devices go: the timer ends and the file is written
 * once more, saying the daemon stopped (metrics.h). */
void vn_metrics_stop(VnDaemon *d);

/* ---- fence.c ---- */
/* How long a lender worker has to say it fenced its device before it is killed: within a
 * borrower's request timeout, so that a borrow waiting for the fence is answered. */
#define VN_FENCE_TIMEOUT_MS 3000
/* A lease on @ld ended (@why): withdraw the worker's exports now, and have it fence. */
void vn_fence_start(VnDaemon *d, VnLocalDevice *ld, const char *why);
/* The port's VnPortFencedFn (@opaque: the VnLocalDevice). */
void vn_fence_confirmed(void *opaque);
/* @ld's lender worker exited: what it held is withdrawn; a fence under way is over. */
void vn_fence_worker_died(VnDaemon *d, VnLocalDevice *ld);
/* While a fence is under way, have @fn(@peer, @token) run when it is over (one at a time):
 * true; false when no fence is under way (or one borrow waits already). */
bool vn_fence_defer(VnLocalDevice *ld, VnFenceResumeFn fn, const char *peer, uint64_t token);
/* @ld goes (the daemon stops): its timer, and a borrow waiting is refused. */
void vn_fence_clear(VnLocalDevice *ld);

/* ---- events.c ---- */
/* A control-socket event (docs/control.md "Events"); NULL / 0 members are left out. */
void vn_events_emit(VnDaemon *d, const char *event, const char *device, uint64_t lease,
                    const char *node, const char *domain);

/* ---- announce.c ---- */
void vn_announce(VnDaemon *d);
/* Announce within VN_DAEMON_ANNOUNCE_DELAY_MS, coalescing changes. */
void vn_announce_soon(VnDaemon *d);
/* Our announcement to @peer alone, now (it just came, or we owe it a return). */
void vn_announce_to(VnDaemon *d, const char *peer);
/* Announce now, unless nothing changed since the last broadcast. */
void vn_announce_changed(VnDaemon *d);
/* Is our periodic announcement due to a host at heartbeat @beat (VN_DAEMON_ANNOUNCE_EVERY):
 * @phase its beat of each VN_DAEMON_REFRESH_EVERY, @owed the last send to it failed,
 * @partner it shares a lease with us. */
bool vn_announce_due(guint beat, guint phase, bool owed, bool partner);
/* The heartbeat's periodic announcements, at beat d->beats: to each host that is up and
 * due (vn_announce_due). */
void vn_announce_beat(VnDaemon *d);

/* ---- cluster.c (the borrower's side of a lease: cluster-borrow.c) ---- */
void vn_cluster_start(VnDaemon *d);
void vn_cluster_request(VnDaemon *d, VnFabricMsg *msg, uint64_t token);
void vn_cluster_event(VnDaemon *d, VnFabricMsg *msg);
void vn_cluster_link(VnDaemon *d, const char *peer, bool up);
/*
 * Borrow / return, asynchronous: @done runs once, later or at once, with
 * the borrowed device (borrow) or NULL, and on failure an error class of
 * docs/control.md and a message (@done may be NULL: nobody waits).  Return
 * detaches and forgets the device before it asks the lender.  Revoke answers
 * @r when the device is free.
 */
typedef void (*VnClusterDone)(VnDaemon *d, VnBorrowed *b, const char *klass, const char *msg,
                              void *opaque);
void vn_cluster_borrow(VnDaemon *d, const char *lender, const char *name, VnClusterDone done,
                       void *opaque);
void vn_cluster_return(VnDaemon *d, VnBorrowed *b, VnClusterDone done, void *opaque);
void vn_cluster_revoke(VnDaemon *d, VnLocalDevice *ld, uint32_t grace_ms, VnControlReply *r);
/* A revoke the state file says was waiting out its grace (until @deadline, real time, µs)
 * when the daemon stopped: @ld's restored lease is being revoked again, ending at that
 * deadline (at once when it passed); its holder is told again when it next announces. */
void vn_cluster_revoke_resume(VnDaemon *d, VnLocalDevice *ld, gint64 deadline);
/* The host wants @ld back (its worker heard VFIO's device request: an
 * unbind or a removal waits on it): a revoke with the usual grace, once. */
void vn_cluster_device_request(void *ld);
/* The lease listener that fences, answers revokes, announces and emits
 * events (registered by vn_cluster_start's caller before leases change). */
void vn_cluster_on_lease(void *opaque, const VnLeaseChange *change);
/* Take @b out of its VM, then return it: the guest gets up to @wait_ms to
 * let go, waited for by a timer (the daemon keeps serving meanwhile). */
void vn_cluster_release(VnDaemon *d, VnBorrowed *b, unsigned wait_ms);

/* ---- devices.c ---- */
VnLocalDevice *vn_devices_local(VnDaemon *d, const char *name);
/* At most this many devices' last losses are kept (a borrower holds far
 * fewer devices; the state file stays small). */
#define VN_DEVICES_MAX_LOSSES 256
/* A loss line is a sentence and a time; a longer one in the state file is
 * not ours. */
#define VN_DEVICES_MAX_LOSS_LINE 512
/* Borrower side: @device was lost (@why, a sentence): said as a warning,
 * kept (with the time) for `show` and the state file, and saved. */
void vn_devices_note_loss(VnDaemon *d, const char *device, uint64_t lease, const char *why);
/* The free function of d->local (a stopping daemon's lease stays). */
void vn_devices_local_free(gpointer ld);
VnBorrowed *vn_devices_borrowed(VnDaemon *d, const char *device);
void vn_devices_borrowed_free(VnBorrowed *b);
/* Stop a borrowed device's vfio-user server (the lease stays).  The caller
 * saves the state (a restart must not find the stopped worker to adopt). */
void vn_devices_detach(VnDaemon *d, VnBorrowed *b);

/* ---- devices-lend.c ---- */
/* Lend @lc (which d->conf->lends then owns) / stop lending a free device;
 * NULL with @error once this node lends VN_CONF_MAX_DEVICES. */
VnLocalDevice *vn_devices_lend(VnDaemon *d, VnLendConf *lc, GError **error);
/* sriov-vfs: create @pf's virtual functions (conf.h) and lend each as
 * PF-vfK, managed; their confs join d->conf->lends. */
bool vn_devices_lend_vfs(VnDaemon *d, VnLendConf *pf, GError **error);
void vn_devices_unlend(VnDaemon *d, VnLocalDevice *ld);
/* The lease listener that unlends a device gone from the config (conf.h:
 * leaving) once its lease ends. */
void vn_devices_on_lease(void *opaque, const VnLeaseChange *change);

/* ---- unplug.c ---- */
/*
 * Ask @b's VM to let go of it, without waiting: through the device request
 * when its QEMU takes them, else (@via_qmp) with device_del if attach named
 * the VM's QMP socket.  @done (may be NULL) runs once, from the loop or
 * before this returns, with whether it was asked (the guest releases the
 * device in its own time), or with @stopping set when the daemon stops
 * first.  @b may be gone by then: @device and @lease say which it was.
 * False, with nothing started and @done not called, when VN_UNPLUG_MAX are
 * under way already (each holds a socket or a thread).
 */
#define VN_UNPLUG_MAX 16
typedef void (*VnUnplugDone)(VnDaemon *d, const char *device, uint64_t lease, bool asked,
                             bool stopping, void *opaque);
typedef struct VnUnplug VnUnplug;
bool vn_unplug_start(VnDaemon *d, VnBorrowed *b, bool via_qmp, VnUnplugDone done, void *opaque);
/*
 * Present @b to its VM as a new device (its device server was lost and another answers:
 * the device the guest had is gone), through the QMP socket attach named: device_del,
 * wait for the guest (VN_UNPLUG_REPLUG_WAIT_MS), device_add at the same place, on a thread
 * of GLib's pool.  Emits DEVICE_REPLUGGED or DEVICE_REPLUG_FAILED.  False, with nothing
 * started, without a QMP socket or when VN_UNPLUG_MAX are under way.
 */
#define VN_UNPLUG_REPLUG_WAIT_MS 60000
bool vn_unplug_replug(VnDaemon *d, VnBorrowed *b);
/* A replug of @device is under way: the worker it starts attaches to whichever device
 * server answers then, so a later return needs no second one. */
bool vn_unplug_replugging(VnDaemon *d, const char *device);
GPtrArray *vn_unplugs_new(void);
void vn_unplugs_free(VnDaemon *d);

/* ---- workers: what serves an attached device's VM ---- */
/*
 * Behind this table so the daemon runs in unit tests with a fake one.  Every
 * member is required (vn_worker_ops_valid()).
 *
 * start: serve @b on b->socket (b->domain set); sets b->worker_pid (> 0
 *   while it runs), b->worker_name, b->channel_path, b->port.  Asynchronous: @done
 *   runs once, at once or later from the loop, with @error NULL when the
 *   worker serves, else why not; b->starting is set meanwhile.  When @b is
 *   freed first (returned), @done runs with b NULL and an error.
 * stop: b->worker_pid is 0 and b->port NULL after, at once: the worker
 *   ends in the background (it first waits for QEMU to let go of its
 *   socket, bounded), and a start for the same device waits for that.
 * adopt: after a restart, is the recorded worker still there (b->worker_pid
 *   cleared if not)?  Only it may reconnect to its port, with @secret (the
 *   state file's: port.h, vn_port_adopt).
 * stats, lend_stats: ask for its counters without waiting: @done runs
 *   once, later from the loop or before this returns, with the JSON text
 *   (untrusted: the worker wrote it; at most VN_SPAWN_MAX_STATS bytes; @done
 *   frees it) or NULL.  Returns the call in flight, to cancel with
 *   vn_wctl_call_cancel() (@done never runs then), or NULL once @done ran.
 * request_unplug: ask the VM to release @b through the device-request
 *   interrupt, as stats asks (@done's text: {"requested": false} when its
 *   QEMU takes no device requests).
 * client_state: is a QEMU connected (the device still in a VM)?  Never
 *   waits: the worker's answer to a question asked at or after @since_us
 *   (monotonic), else VN_CLIENT_UNKNOWN, asking it when no question is in
 *   flight.  A caller polls.
 */
typedef void (*VnWorkerStarted)(VnDaemon *d, VnBorrowed *b, const GError *error, void *opaque);

/*
 * lend_start: start @ld's lender worker (ld->worker_pid set), false with
 *   @error; lend_stop: end it (bounded), fencing the device; lend_adopt:
 *   after a restart, is the recorded one still there (pid cleared if not)?
 *   As adopt, with its port's @secret.
 *   lend_kill: kill it now (it did not fence in time): true when its exit
 *   will be reported (vn_fence_worker_died), false when it is as good as gone
 *   already (pid cleared).
 * stop_strays (optional): at start, once the recorded workers were adopted
 *   and before new ones start, stop every other worker of this node that
 *   runs (strays.c); returns how many.
 */
struct VnWorkerOps {
    const char *name;
    bool (*lend_start)(VnDaemon *d, VnLocalDevice *ld, GError **error);
    void (*lend_stop)(VnDaemon *d, VnLocalDevice *ld);
    bool (*lend_adopt)(VnDaemon *d, VnLocalDevice *ld, const char *secret);
    bool (*lend_kill)(VnDaemon *d, VnLocalDevice *ld);
    VnWctlCall *(*lend_stats)(VnDaemon *d, VnLocalDevice *ld, VnWctlDone done, void *opaque);
    void (*start)(VnDaemon *d, VnBorrowed *b, VnWorkerStarted done, void *opaque);
    void (*stop)(VnDaemon *d, VnBorrowed *b);
    bool (*adopt)(VnDaemon *d, VnBorrowed *b, const char *secret);
    VnWctlCall *(*stats)(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque);
    VnWctlCall *(*request_unplug)(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque);
    VnClientState (*client_state)(VnDaemon *d, VnBorrowed *b, gint64 since_us);
    guint (*stop_strays)(VnDaemon *d);
};

bool vn_worker_ops_valid(const VnWorkerOps *ops, GError **error);

/* ---- ending.c: workers on their way out, watched from the loop ---- */
/*
 * The ending takes @pid (@child: ours to reap; its child watch removed by
 * the caller), @port, @channel_path and @socket_path (QEMU's; each may be NULL;
 * the files are removed when it is gone), and returns at once.  It waits at most
 * @client_wait_ms for the worker's QEMU to let go (0: not at all), then
 * sends SIGTERM, and SIGKILL after @term_wait_ms.  @what names the device
 * ("host/name" borrowed, a name lent): a new worker for it waits while
 * vn_ending_busy() says one is still going.
 */
typedef struct VnEnding VnEnding;
VnEnding *vn_ending_start(VnDaemon *d, const char *what, GPid pid, bool child, VnPort *port,
                          char *channel_path, char *socket_path, unsigned client_wait_ms,
                          unsigned term_wait_ms);
/* A managed function's lender worker (@pid 0: none runs): once it is gone, @bdf goes back to
 * the driver @kept_path names (lending/pcibind.h), if the file is still there (the worker,
 * serving as root, gives it back itself); the ending lasts until then. */
void vn_ending_give_back(VnEnding *e, const char *bdf, const char *kept_path);
bool vn_ending_busy(VnDaemon *d, const char *what);
GPtrArray *vn_endings_new(void);
/* At the daemon's end: each gets SIGTERM if it has not yet, none is waited for. */
void vn_endings_free(GPtrArray *endings);

/* spawn.c: vfio-ntb-borrower and vfio-ntb-lender processes, which outlive
 * the daemon. */
#define VN_SPAWN_BINARY "vfio-ntb-borrower"
#define VN_LENDERS_BINARY "vfio-ntb-lender"
extern const VnWorkerOps vn_spawn_ops;
/* tracing.c: the control socket's "trace" (switch trace events here and in the workers). */
void vn_daemon_cmd_trace(VnDaemon *d, JsonObject *a, VnControlReply *r);
/* query-trace: every trace event, and whether it is on. */
void vn_daemon_cmd_query_trace(VnDaemon *d, JsonObject *a, VnControlReply *r);

/* Command @name on the control channel @channel of worker @pid (@what: its
 * device, for the log), answered from the loop as VnWorkerOps.stats says. */
VnWctlCall *vn_spawn_ask(GPid pid, const char *channel, const char *what, const char *name,
                         VnWctlDone done, void *opaque);
/* What a borrower worker's counters (@stats, its "stats" answer; NULL: no
 * answer) say of its QEMU. */
VnClientState vn_spawn_client_of(const char *stats);
/* Worker @name (a file name): next to our own binary, else in VN_LIBEXECDIR,
 * else on PATH; NULL with @error naming where it looked when in none. */
char *vn_spawn_binary(const char *name, GError **error);
/* @name in the first of @dirs (NULL-terminated) that has it executable,
 * else on PATH; NULL with @error (G_IO_ERROR_NOT_FOUND) when in none. */
char *vn_spawn_find(const char *name, const char *const *dirs, GError **error);
/* The run dir, made when missing, passable (not listable) by others: QEMU's user reaches its
 * socket there, the worker user its port.  False with @error. */
bool vn_spawn_run_dir(VnDaemon *d, GError **error);
/* @port's socket given to the worker user ([node] worker-user), whose worker must be able to
 * dial it again after a restart of ours.  False with @error. */
bool vn_spawn_port_for_worker_user(VnDaemon *d, VnPort *port, GError **error);
/* The fd a worker finds its port's connection at (port.h: vn_port_pair). */
#define VN_SPAWN_PORT_FD 3
/* @pid (> 0) runs: a signal reaches it (whether it is still ours, vn_spawn_alive says). */
bool vn_spawn_running(GPid pid);
/* @pid runs and is @binary (a process of ours, not a reused pid). */
bool vn_spawn_alive(GPid pid, const char *binary);
/* An adopted worker (not our child) still runs: @pid is @binary, and its @port (NULL: none)
 * did not refuse it as an impostor. */
bool vn_spawn_adopted_alive(VnPort *port, GPid pid, const char *binary);
/* A source (its id) that calls @fn(@data) once @pid has exited, heard through a pidfd
 * (pidfd_open(2)): for a worker adopted after a restart, which is not our child.  0 when no
 * pidfd could be had (the process is gone already, or the kernel has none): look another
 * way.  @destroy(@data) when the source goes. */
guint vn_spawn_watch_exit(GPid pid, GSourceFunc fn, void *data, GDestroyNotify destroy);
/* takeover.c: a borrower worker that died (@status, as waitpid() says) is replaced by one
 * that serves its QEMU, when it kept what that takes and has not died too often: the new
 * worker runs @argv (its usual arguments, NULL-terminated; one is added) with what the dead
 * one kept, b->worker_pid is its pid, and the caller watches it.  False: it was not
 * replaced (said why in the log when that is news). */
bool vn_takeover_start(VnDaemon *d, VnBorrowed *b, int status, GPtrArray *argv);
/* strays.c: vn_spawn_ops.stop_strays. */
guint vn_strays_stop(VnDaemon *d);
/* lenders.c: the lender side of vn_spawn_ops. */
bool vn_lenders_start(VnDaemon *d, VnLocalDevice *ld, GError **error);
void vn_lenders_stop(VnDaemon *d, VnLocalDevice *ld);
bool vn_lenders_adopt(VnDaemon *d, VnLocalDevice *ld, const char *secret);
bool vn_lenders_kill(VnDaemon *d, VnLocalDevice *ld);
VnWctlCall *vn_lenders_stats(VnDaemon *d, VnLocalDevice *ld, VnWctlDone done, void *opaque);
/* Some thirty counters, a few KiB; a longer file is not one the worker
 * wrote, and is not parsed. */
#define VN_SPAWN_MAX_STATS (64 * 1024)
/* SIGTERM, then SIGKILL this much later. */
#define VN_SPAWN_STOP_TIMEOUT_MS 5000
#define VN_SPAWN_STATS_TIMEOUT_MS 1000

/* ---- devserver.c ---- */
/* Lender side, a port's VnPortDeviceServerFn (@opaque: the VnLocalDevice). */
void vn_devserver_changed(void *opaque, bool up, uint32_t gen);
/* Lender side: @ld's worker died while it was lent; its device went with it (the next
 * worker's is presented to the holder anew, as a lost server's return is). */
void vn_devserver_worker_gone(VnLocalDevice *ld);
/* Borrower side: what @lender's announcement @a says of the servers of devices we hold. */
void vn_devserver_announced(VnDaemon *d, const char *lender, const VnPeersAnnounce *a);

/* ---- qmp.c ---- */
/* device_del @id in the VM whose QMP socket is @path (bounded; does not wait
 * for the guest).  False with @error if QEMU refused. */
bool vn_qmp_device_del(const char *path, const char *id, GError **error);
/* The same on @fd, a connected QMP socket (borrowed; the fuzzer's seam). */
bool vn_qmp_device_del_fd(int fd, const char *id, GError **error);
/*
 * A device to be presented anew, in two steps (the worker serving it is restarted
 * between them).  remove: read where device @id sits (*@bus, the name device_add takes,
 * and *@addr, "SS.F"; newly allocated), device_del it and wait up to @wait_ms for the
 * guest to let go (DEVICE_DELETED).  add: device_add a vfio-user-pci of id @id at @bus and
 * @addr on @socket, so the guest's driver probes it as new; other properties it was
 * added with are not kept.  Bounded; false with @error at the first step that failed.
 */
bool vn_qmp_device_remove(const char *path, const char *id, unsigned wait_ms, char **bus,
                          char **addr, GError **error);
bool vn_qmp_device_remove_fd(int fd, const char *id, unsigned wait_ms, char **bus, char **addr,
                             GError **error);
bool vn_qmp_device_add(const char *path, const char *id, const char *bus, const char *addr,
                       const char *socket, GError **error);
bool vn_qmp_device_add_fd(int fd, const char *id, const char *bus, const char *addr,
                          const char *socket, GError **error);
/* ---- state.c ---- */
bool vn_state_save(VnDaemon *d, GError **error);
/* The store, as a lease listener: saves when a lease's holder changed, and
 * reports (logs, counts in d->save_errors) a save that failed. */
void vn_state_on_lease(void *opaque, const VnLeaseChange *change);
/* Save now, reporting a failure as vn_state_on_lease() does. */
void vn_state_save_or_report(VnDaemon *d);
/* The state file's path: STATE-DIR/state.json, RUN-DIR/state.json without a state-dir
 * (newly allocated). */
char *vn_state_path(VnDaemon *d);

/* ---- state-load.c ---- */
bool vn_state_load(VnDaemon *d, GError **error);

#endif /* VN_DAEMON_INT_H */
