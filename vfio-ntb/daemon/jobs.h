/*
 * One job per device (CONVENTIONS 14, as libvirt's qemu driver keeps one
 * job per domain): what is being done to a lent or borrowed device that
 * takes time, since when, for whom, and which operations it lets through
 * meanwhile.  A refused operation names the job that holds the device:
 *
 *   hosta/nvme0 is being revoked (job revoke, 2.1 s)
 *
 * The holder's jobs: borrow (its lender is asked, no answer yet), attach
 * (its worker starts), release (its lender revoked it: its VM is asked to
 * let go), replug (it is presented to its VM anew).  The lender's: revoke
 * (a revoke waits out its grace period).  A job's resources (timers, the
 * worker, the revoke's deadline in the state file) stay with the part that
 * runs it; the job is what every other part asks.
 *
 * Pure logic, no clock of its own beyond g_get_monotonic_time() at start.
 * Threads: the daemon's main thread.
 */
#ifndef VN_JOBS_H
#define VN_JOBS_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum VnJobKind {
    VN_JOB_NONE,
    VN_JOB_BORROW,  /* holder: its lender is asked for a lease */
    VN_JOB_ATTACH,  /* holder: its worker starts */
    VN_JOB_RELEASE, /* holder: its lender revoked it; its VM is asked to let go */
    VN_JOB_REPLUG,  /* holder: presented to its VM anew (device_del, device_add) */
    VN_JOB_REVOKE,  /* lender: a revoke waits out its grace period */
    VN_JOB_LAST
} VnJobKind;

/* What an operator or a peer may ask of a device; each job lets some through. */
typedef enum VnJobOp {
    VN_JOB_OP_BORROW,
    VN_JOB_OP_ATTACH,
    VN_JOB_OP_DETACH,
    VN_JOB_OP_RETURN,
    VN_JOB_OP_UNPLUG,
    VN_JOB_OP_REVOKE,
    VN_JOB_OP_UNLEND,
    VN_JOB_OP_LAST
} VnJobOp;

/* Who asked for a job, at most this long (a node's name and a word). */
#define VN_JOB_MAX_OWNER 48

/* Who starts a job when no node asked for it. */
#define VN_JOB_OWNER_CONTROL "control"         /* an operator, through the control socket */
#define VN_JOB_OWNER_CONFIG "config"           /* a borrow the config file names */
#define VN_JOB_OWNER_KERNEL "kernel"           /* VFIO's device request: the host wants it back */
#define VN_JOB_OWNER_RESTART "restart"         /* resumed from the state file after a restart */
#define VN_JOB_OWNER_DEVSERVER "device server" /* its device server came back */

typedef struct VnJob {
    VnJobKind kind;
    gint64 since_us;                  /* monotonic, at its start */
    char owner[VN_JOB_MAX_OWNER + 1]; /* who asked: VN_JOB_OWNER_* or a node's name */
} VnJob;

const char *vn_job_kind_to_string(VnJobKind kind);
const char *vn_job_op_to_string(VnJobOp op);

/* @j becomes @kind, from now, for @owner (truncated to VN_JOB_MAX_OWNER).  A job that was
 * running is replaced: the caller ends one job before it starts another. */
void vn_job_start(VnJob *j, VnJobKind kind, const char *owner);
/* Ends @j if it is @kind (an end that comes after another job replaced it changes nothing). */
void vn_job_end(VnJob *j, VnJobKind kind);
/* @j's kind's name, or NULL when there is none (for query-device's "job"). */
const char *vn_job_name(const VnJob *j);
/* How long @j has run, in ms (0 without a job). */
int64_t vn_job_ms(const VnJob *j);
/* Whether @j lets @op through (always without a job). */
bool vn_job_allows(const VnJob *j, VnJobOp op);
/*
 * When @j does not let @op through: true, and @error (G_IO_ERROR_BUSY) says so with the
 * job, e.g. "hosta/nvme0 is being revoked (job revoke, 2.1 s)".  False, @error untouched,
 * when it does.
 */
bool vn_job_refuses(const VnJob *j, VnJobOp op, const char *device, GError **error);

#endif /* VN_JOBS_H */
