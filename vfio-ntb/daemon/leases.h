/*
 * The leases a lender grants: one per lent device, an explicit state
 * machine, and listeners told of every change.
 *
 *   FREE --grant--> GRANTED --claimed--> HELD <--claimed-- ORPHANED
 *                                           |                 ^
 *                                           +---link down-----+
 *   FREE --restore--> RESTORED --claimed--> HELD
 *   any lent state --revoke--> REVOKING (a claim keeps it there)
 *   any lent state --return / dropped / expired / revoked / unlent--> FREE
 *
 * A holder "claims" a lease by listing it in its announcements.  Messages on
 * one link arrive in order, so once a lease was claimed, an announcement
 * without it means the holder let it go (returned while we were away, or
 * lost in its restart): the lease ends.  Before the first claim an
 * announcement without it may have been built before the grant's reply got
 * there; a grant never claimed ends after the lease timeout.  A lease whose
 * holder's link is down (ORPHANED) or read back from the state file
 * (RESTORED) ends after the lease timeout unless it is claimed again.
 *
 * Pure logic: no fabric, no JSON, no clock of its own (callers pass the
 * monotonic time), so every transition is testable on its own.  The
 * listeners do the rest: fencing, persistence, announcements, events.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_LEASES_H
#define VN_LEASES_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum VnLeaseState {
    VN_LEASE_FREE,
    VN_LEASE_GRANTED,  /* granted, not claimed by its holder yet */
    VN_LEASE_HELD,     /* claimed by its holder */
    VN_LEASE_ORPHANED, /* its holder's link went down */
    VN_LEASE_RESTORED, /* read from the state file, not claimed since */
    VN_LEASE_REVOKING, /* a revoke waits out its grace period */
    VN_LEASE_STATE_LAST
} VnLeaseState;

/* Why a lease ended (the change's @end when it went FREE). */
typedef enum VnLeaseEnd {
    VN_LEASE_END_NONE,
    VN_LEASE_END_RETURNED,   /* its holder gave it back */
    VN_LEASE_END_DROPPED,    /* its holder's announcement no longer claims it */
    VN_LEASE_END_EXPIRED,    /* not claimed (again) within the lease timeout */
    VN_LEASE_END_REVOKED,    /* a revoke's grace period ran out */
    VN_LEASE_END_UNLENT,     /* the device is no longer lent */
    VN_LEASE_END_PATHS_LOST, /* the windows and routes to its holder are gone (an NTB session) */
    VN_LEASE_END_LAST
} VnLeaseEnd;

const char *vn_lease_state_to_string(VnLeaseState s);
/* The end's reason as a log line says it ("returned", "the borrower did
 * not come back", ...). */
const char *vn_lease_end_to_string(VnLeaseEnd e);

typedef struct VnLease {
    char *device; /* the local device's name */
    VnLeaseState state;
    uint64_t id;     /* 0 when FREE */
    char *holder;    /* a node; NULL when FREE */
    gint64 since_us; /* when it entered its state (monotonic) */
    /* Its holder knows of it: it claimed it since the grant, or the lease
     * was restored (every announcement we get after our restart was built
     * after the grant).  An announcement without it then ends it. */
    bool known;
    void *opaque; /* the owner's (the daemon's device) */
} VnLease;

/* What a listener is told: @lease is the lease as it is now; the holder and
 * id before the change are in @old_holder / @old_id (they differ when it
 * ended or was granted). */
typedef struct VnLeaseChange {
    const VnLease *lease;
    VnLeaseState from;
    VnLeaseEnd end;
    const char *old_holder;
    uint64_t old_id;
} VnLeaseChange;

typedef void (*VnLeaseListener)(void *opaque, const VnLeaseChange *change);

typedef struct VnLeases VnLeases;

/* @timeout_ms: [node] lease-timeout-ms. */
VnLeases *vn_leases_new(uint32_t timeout_ms);
void vn_leases_free(VnLeases *ls);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnLeases, vn_leases_free)

/* Listeners run in the order added, after each change, with the table
 * consistent; one may call back into the table (a change it makes is told
 * to every listener in turn, after this one's). */
void vn_leases_listen(VnLeases *ls, VnLeaseListener fn, void *opaque);

/* A FREE lease for device @name (a new one: the caller checks names are
 * unique); the table owns it, @opaque is the caller's. */
VnLease *vn_leases_add(VnLeases *ls, const char *name, void *opaque);
/* Ends it (VN_LEASE_END_UNLENT) if lent, then forgets it. */
void vn_leases_remove(VnLeases *ls, VnLease *l);
VnLease *vn_leases_lookup(VnLeases *ls, const char *name);
guint vn_leases_count(VnLeases *ls);
VnLease *vn_leases_index(VnLeases *ls, guint i);

static inline bool vn_lease_lent(const VnLease *l)
{
    return l->state != VN_LEASE_FREE;
}

/* The last id given; ids are never reused (the state file keeps it). */
uint64_t vn_leases_last_id(VnLeases *ls);
void vn_leases_set_last_id(VnLeases *ls, uint64_t id);

/* FREE -> GRANTED to @holder with a new id; false (nothing changes) when it
 * is lent already. */
bool vn_leases_grant(VnLeases *ls, VnLease *l, const char *holder, gint64 now_us);
/* From the state file: FREE -> RESTORED; false when lent or @id is 0. */
bool vn_leases_restore(VnLeases *ls, VnLease *l, const char *holder, uint64_t id, gint64 now_us);
/* @holder gives lease @id back: -> FREE; false (nothing changes) when the
 * lease is not @holder's @id. */
bool vn_leases_return(VnLeases *ls, VnLease *l, const char *holder, uint64_t id);
/* -> REVOKING; false when FREE or revoking already. */
bool vn_leases_revoke(VnLeases *ls, VnLease *l, gint64 now_us);
/* -> FREE for @why (REVOKED, UNLENT); nothing when FREE. */
void vn_leases_end(VnLeases *ls, VnLease *l, VnLeaseEnd why);

/*
 * @holder announced itself: @claimed(opaque, device, id) says whether its
 * announcement lists a lease.  Each of its leases is judged as the header
 * says.
 */
typedef bool (*VnLeaseClaimFn)(void *opaque, const char *device, uint64_t id);
void vn_leases_announced(VnLeases *ls, const char *holder, VnLeaseClaimFn claimed, void *opaque,
                         gint64 now_us);
/* @holder's link went down: its GRANTED and HELD leases become ORPHANED. */
void vn_leases_link_down(VnLeases *ls, const char *holder, gint64 now_us);
/* End what waited longer than the timeout (GRANTED, ORPHANED, RESTORED). */
void vn_leases_tick(VnLeases *ls, gint64 now_us);

#endif /* VN_LEASES_H */
