/*
 * One job per device (see jobs.h): the table of what each job lets through.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "jobs.h"

#include <gio/gio.h>

static const char *const kind_names[VN_JOB_LAST] = {
    [VN_JOB_NONE] = "none",       [VN_JOB_BORROW] = "borrow", [VN_JOB_ATTACH] = "attach",
    [VN_JOB_RELEASE] = "release", [VN_JOB_REPLUG] = "replug", [VN_JOB_REVOKE] = "revoke",
};

/* What a refusal says the device is doing. */
static const char *const kind_doing[VN_JOB_LAST] = {
    [VN_JOB_BORROW] = "being borrowed",
    [VN_JOB_ATTACH] = "being attached",
    [VN_JOB_RELEASE] = "being released (its lender revoked it)",
    [VN_JOB_REPLUG] = "being presented to its VM anew",
    [VN_JOB_REVOKE] = "being revoked",
};

static const char *const op_names[VN_JOB_OP_LAST] = {
    [VN_JOB_OP_BORROW] = "borrow", [VN_JOB_OP_ATTACH] = "attach", [VN_JOB_OP_DETACH] = "detach",
    [VN_JOB_OP_RETURN] = "return", [VN_JOB_OP_UNPLUG] = "unplug", [VN_JOB_OP_REVOKE] = "revoke",
    [VN_JOB_OP_UNLEND] = "unlend",
};

#define OP(x) (1u << VN_JOB_OP_##x)

/*
 * What each job lets through.  A borrow or an attach under way takes no second one and no
 * unplug (there is no VM to ask yet); detach and return stop what they stop at any time,
 * as a dead worker would.  A release ends in a return of its own: the operator's detach
 * and return only come first.  A revoke in its grace takes no second revoke and no unlend
 * (the lease is still its holder's).
 */
static const unsigned allowed[VN_JOB_LAST] = {
    [VN_JOB_NONE] = (1u << VN_JOB_OP_LAST) - 1,
    [VN_JOB_BORROW] = OP(DETACH) | OP(RETURN) | OP(REVOKE) | OP(UNLEND),
    [VN_JOB_ATTACH] = OP(DETACH) | OP(RETURN) | OP(REVOKE) | OP(UNLEND),
    [VN_JOB_RELEASE] = OP(DETACH) | OP(RETURN) | OP(REVOKE) | OP(UNLEND),
    [VN_JOB_REPLUG] = OP(DETACH) | OP(RETURN) | OP(REVOKE) | OP(UNLEND),
    [VN_JOB_REVOKE] = OP(BORROW) | OP(ATTACH) | OP(DETACH) | OP(RETURN) | OP(UNPLUG),
};

const char *vn_job_kind_to_string(VnJobKind kind)
{
    return kind < VN_JOB_LAST ? kind_names[kind] : "?";
}

const char *vn_job_op_to_string(VnJobOp op)
{
    return op < VN_JOB_OP_LAST ? op_names[op] : "?";
}

void vn_job_start(VnJob *j, VnJobKind kind, const char *owner)
{
    j->kind = kind < VN_JOB_LAST ? kind : VN_JOB_NONE;
    j->since_us = g_get_monotonic_time();
    g_strlcpy(j->owner, owner != NULL ? owner : "", sizeof(j->owner));
}

void vn_job_end(VnJob *j, VnJobKind kind)
{
    if (j->kind == kind) {
        *j = (VnJob){ .kind = VN_JOB_NONE };
    }
}

const char *vn_job_name(const VnJob *j)
{
    return j->kind != VN_JOB_NONE ? vn_job_kind_to_string(j->kind) : NULL;
}

int64_t vn_job_ms(const VnJob *j)
{
    return j->kind != VN_JOB_NONE ? MAX(g_get_monotonic_time() - j->since_us, 0) / 1000 : 0;
}

bool vn_job_allows(const VnJob *j, VnJobOp op)
{
    return op < VN_JOB_OP_LAST && j->kind < VN_JOB_LAST && (allowed[j->kind] & (1u << op)) != 0;
}

bool vn_job_refuses(const VnJob *j, VnJobOp op, const char *device, GError **error)
{
    if (vn_job_allows(j, op)) {
        return false;
    }
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_BUSY, "%s is %s (job %s, %.1f s)", device,
                j->kind < VN_JOB_LAST && kind_doing[j->kind] != NULL ? kind_doing[j->kind] : "busy",
                vn_job_kind_to_string(j->kind), (double)vn_job_ms(j) / 1000.0);
    return true;
}
