/*
 * The daemon's devices (devices.c): the ones it lends (VnLocalDevice, each with its lease,
 * its lender worker and that worker's port) and the ones it borrows (VnBorrowed, each with
 * the worker serving it to a VM), in d->local and d->borrowed, which own them (their free
 * functions below).  Lending and unlending one is devices-lend.h's.
 *
 * Threads: the daemon's main thread; every field is the main thread's.
 */
#ifndef VN_DEVICES_H
#define VN_DEVICES_H

#include "daemon.h"
#include "fence.h"
#include "identity.h"
#include "jobs.h"
#include "port.h"
#include "common/wctl.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnControlReply VnControlReply;

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
    bool revoke_untold;     /* its holder may not have heard (resumed after a restart, sent
                             * with no link, or the link went since): told again when it
                             * next announces itself */
    VnJob job;              /* what is being done to it that takes time (jobs.h) */
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
    bool p2p;     /* attached to take part in its domain's compositions (docs/p2p.md) */
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
    VnJob job;           /* what is being done to it that takes time (jobs.h) */
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
    /* Its BARs and offers, and the targets made of them (p2p.h); NULL until its worker
     * said any; and what its port's p2p callback is given. */
    struct VnP2pDev *p2p_dev;
    void *p2p_watch;
} VnBorrowed;

/* The device this node lends as @name, or NULL (d->local owns it). */
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
/* The device this node holds as @device ("host/name"), or NULL (d->borrowed owns it). */
VnBorrowed *vn_devices_borrowed(VnDaemon *d, const char *device);
/* The free function of d->borrowed: a start under way is answered, the timers end, the
 * port is freed with its socket file left (a worker that outlives us reconnects to our
 * successor's port); the worker runs on. */
void vn_devices_borrowed_free(VnBorrowed *b);
/* Stop a borrowed device's vfio-user server (the lease stays).  The caller
 * saves the state (a restart must not find the stopped worker to adopt). */
void vn_devices_detach(VnDaemon *d, VnBorrowed *b);

#endif /* VN_DEVICES_H */
