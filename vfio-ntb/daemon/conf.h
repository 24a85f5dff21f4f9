/*
 * vfio-ntbd's configuration file (GKeyFile; comments are whole lines
 * starting with #, shown here beside the keys for brevity):
 *
 *   [node]
 *   name = hosta                  # this node on the fabric
 *   fabric = shm                  # backend
 *   fabric-dir = /run/vfio-ntb/fabric
 *   stats-file = /run/vfio-ntb/hosta.stats   # counters, on SIGUSR1 and at exit
 *   metrics-file = /var/lib/node_exporter/textfile/vfio-ntb.prom  # Prometheus
 *                                 # (node_exporter textfile; default: none)
 *   metrics-interval-ms = 15000   # how often it is rewritten (100..3600000)
 *   state-dir = /var/lib/vfio-ntb             # leases, persisted (default: none)
 *   control-socket = /run/vfio-ntb/control.sock  # ntbctl's (default: this path)
 *   run-dir = /run/vfio-ntb                   # sockets made for QEMU (default)
 *   lease-timeout-ms = 10000      # a lease outlives its borrower's daemon this long
 *   log-level = notice            # error|warning|notice|info|debug (common/log.h)
 *
 *   [fabric]                      # optional backend limits, passed through
 *   max-windows = 8
 *
 *   [lend nvme0]                  # a device this node lends
 *   socket = /run/vfio-ntb/nvme0-device.sock # its vfio-user device server
 *   allow = hostb;hostc           # who may borrow it ("*": any node); required
 *
 *   [borrow nvme0]                # a device this node borrows for a VM
 *   lender = hosta
 *   device = nvme0                # the lender's name for it (default: the section's)
 *   socket = /run/vfio-ntb/vm1-nvme0.sock    # what QEMU's vfio-user-pci connects to
 *   irq-mode = fd                 # or relay
 *
 * Every value is checked; an unknown group or key is an error, so a typo
 * does not silently change what a host lends.  So is what GKeyFile would let
 * pass: a group or key given twice, a comment after a value, [fabric] dir;
 * and the [fabric] parameters are checked by the backend
 * (vn_fabric_params_check()) without opening anything.  Every message says
 * where: "FILE:LINE: " (vn_conf_load) or "line LINE: " (vn_conf_parse).
 */
#ifndef VN_CONF_H
#define VN_CONF_H

#include "common/log.h"
#include "lending/proto.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Devices one daemon lends or borrows (each is a socket and a few fds). */
#define VN_CONF_MAX_DEVICES 64
/* The user borrower workers serve as when [node] worker-user does not say (the package
 * creates it). */
#define VN_CONF_WORKER_USER "vfio-ntb"
/* Who QEMU runs as when none is configured: libvirt's system QEMU user, where it exists. */
#define VN_CONF_QEMU_USER "libvirt-qemu"
/* Virtual functions one [lend] section may lend (sriov-vfs). */
#define VN_CONF_MAX_VFS 32
/* Nodes one access list names. */
#define VN_CONF_MAX_ALLOW 256
/* sun_path holds 108 bytes with the NUL. */
#define VN_CONF_MAX_SOCKET_PATH 107

typedef struct VnLendConf {
    char *name;
    char *socket;       /* a vfio-user server's, or NULL ... */
    char *pci;          /* ... a function of this host, through VFIO */
    bool managed;       /* pci: bound to vfio-pci while lendable, then given back */
    unsigned sriov_vfs; /* pci, a physical function: lend this many of its VFs,
                                 * each as NAME-vfK (managed), not the function itself */
    GStrv allow;        /* node names, or the single entry "*" */
    bool runtime;       /* added with `lend`, persisted in the state file */
    bool vf;            /* one of a [lend] section's sriov-vfs, made at start */
    bool leaving;       /* no longer in the config (a reload or a restart found it so)
                         * while lent: unlent when its lease ends */
} VnLendConf;

/* A lendable device added at run time, served by a vfio-user server on
 * @socket or a PCI function @pci of this host (exactly one of them); NULL
 * with @error for a bad name, a relative socket path, a malformed PCI
 * address or a bad access list. */
VnLendConf *vn_conf_lend_new(const char *name, const char *socket, const char *pci,
                             const char *const *allow, GError **error);
/* `managed = yes|no` (also true/false): true or false, or false with @error
 * for another word or a managed device without "pci". */
bool vn_conf_lend_managed(VnLendConf *l, const char *value, GError **error);
/* The backend that reaches it (lending/backend.h) and what it opens. */
const char *vn_conf_lend_backend(const VnLendConf *l);
const char *vn_conf_lend_where(const VnLendConf *l);
void vn_conf_lend_free(VnLendConf *l);

/* True when @node may borrow the device. */
bool vn_lend_conf_allows(const VnLendConf *l, const char *node);

typedef struct VnBorrowConf {
    char *name;
    char *lender;
    char *device;
    char *socket;
    VnIrqMode irq_mode;
    /* The VM it is served to ("domain = "; the borrow's name by default), and whether it
     * takes part in the domain's compositions ("p2p = yes": docs/p2p.md). */
    char *domain;
    bool p2p;
} VnBorrowConf;

/* A lease whose borrower's daemon went away (or that was restored from the
 * state file) expires if that daemon is not back and claiming it within
 * [node] lease-timeout-ms, by default this long: a daemon restart keeps its
 * leases. */
#define VN_CONF_LEASE_TIMEOUT_MS 10000u

typedef struct VnConfig {
    char *node;
    char *fabric;
    GHashTable *fabric_params; /* char* -> char*, "dir" and limits */
    char *stats_file;          /* may be NULL */
    char *metrics_file;        /* may be NULL (daemon/metrics.h) */
    uint32_t metrics_interval_ms;
    char *state_dir; /* may be NULL: nothing persisted */
    char *control_socket;
    char *run_dir;
    uint32_t lease_timeout_ms;
    /* [node] dma-unmap-linger-ms: how long a DMA mapping a guest unmapped may linger at the
     * lender (borrower/borrower.h), given to each borrower worker; -1: the workers' own. */
    gint32 dma_unmap_linger_ms;
    VnLogLevel log_level; /* VN_LOG_NOTICE unless set */
    bool log_level_set;
    /* Borrower workers serve as this user (borrower/sandbox.h); NULL: as the daemon's. */
    char *worker_user;
    uid_t worker_uid;
    gid_t worker_gid;
    /* The sockets QEMU connects to are this user's alone ([node] qemu-user); NULL: root's. */
    char *qemu_user;
    uid_t qemu_uid;
    gid_t qemu_gid;
    GPtrArray *lends;   /* VnLendConf */
    GPtrArray *borrows; /* VnBorrowConf */
} VnConfig;

VnConfig *vn_conf_load(const char *path, GError **error);
VnConfig *vn_conf_parse(const char *text, GError **error);
void vn_conf_free(VnConfig *c);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnConfig, vn_conf_free)

#endif /* VN_CONF_H */
