/*
 * The lender's lease table and its state machine (leases.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "leases.h"

#include "trace-daemon.h"

#include <string.h>

struct VnLeases {
    GPtrArray *leases; /* VnLease, in the order added */
    GArray *listeners; /* Listener */
    uint64_t last_id;
    gint64 timeout_us;
};

typedef struct Listener {
    VnLeaseListener fn;
    void *opaque;
} Listener;

static const char *const state_names[VN_LEASE_STATE_LAST] = {
    [VN_LEASE_FREE] = "free",         [VN_LEASE_GRANTED] = "granted",
    [VN_LEASE_HELD] = "held",         [VN_LEASE_ORPHANED] = "orphaned",
    [VN_LEASE_RESTORED] = "restored", [VN_LEASE_REVOKING] = "revoking",
};

static const char *const end_names[VN_LEASE_END_LAST] = {
    [VN_LEASE_END_NONE] = "-",
    [VN_LEASE_END_RETURNED] = "returned",
    [VN_LEASE_END_DROPPED] = "the borrower no longer holds it",
    [VN_LEASE_END_EXPIRED] = "the borrower did not claim it in time",
    [VN_LEASE_END_REVOKED] = "revoked, grace period over",
    [VN_LEASE_END_UNLENT] = "the device is no longer lent",
    [VN_LEASE_END_PATHS_LOST] = "the NTB session that carried its data path to the holder ended",
};

const char *vn_lease_state_to_string(VnLeaseState s)
{
    return s < VN_LEASE_STATE_LAST ? state_names[s] : "?";
}

const char *vn_lease_end_to_string(VnLeaseEnd e)
{
    return e < VN_LEASE_END_LAST ? end_names[e] : "?";
}

static void lease_free(gpointer p)
{
    VnLease *l = p;

    g_free(l->device);
    g_free(l->holder);
    g_free(l);
}

VnLeases *vn_leases_new(uint32_t timeout_ms)
{
    VnLeases *ls = g_new0(VnLeases, 1);

    ls->leases = g_ptr_array_new_with_free_func(lease_free);
    ls->listeners = g_array_new(FALSE, FALSE, sizeof(Listener));
    ls->timeout_us = (gint64)timeout_ms * 1000;
    return ls;
}

void vn_leases_free(VnLeases *ls)
{
    if (ls == NULL) {
        return;
    }
    g_ptr_array_unref(ls->leases);
    g_array_unref(ls->listeners);
    g_free(ls);
}

void vn_leases_listen(VnLeases *ls, VnLeaseListener fn, void *opaque)
{
    Listener li = { .fn = fn, .opaque = opaque };

    g_array_append_val(ls->listeners, li);
}

/*
 * The one place a lease changes.  The listeners see the new state; the
 * holder and id it had are passed along (a lease that ended has none).
 */
static void set_state(VnLeases *ls, VnLease *l, VnLeaseState to, VnLeaseEnd end, gint64 now_us)
{
    g_autofree char *old_holder = NULL;
    VnLeaseChange ch = { .lease = l, .from = l->state, .end = end, .old_id = l->id };

    if (to == VN_LEASE_FREE) {
        old_holder = g_steal_pointer(&l->holder);
        l->id = 0;
        l->known = false;
    } else {
        old_holder = g_strdup(l->holder);
    }
    ch.old_holder = old_holder;
    l->state = to;
    l->since_us = now_us;
    if (trace_lease_state_enabled()) {
        g_autofree char *why =
            end != VN_LEASE_END_NONE ? g_strdup_printf(": %s", vn_lease_end_to_string(end)) : NULL;

        trace_lease_state(ch.old_id ? ch.old_id : l->id, l->device,
                          old_holder != NULL ? old_holder : "-", vn_lease_state_to_string(ch.from),
                          vn_lease_state_to_string(to), why != NULL ? why : "");
    }
    for (guint i = 0; i < ls->listeners->len; i++) {
        Listener *li = &g_array_index(ls->listeners, Listener, i);

        li->fn(li->opaque, &ch);
    }
}

VnLease *vn_leases_add(VnLeases *ls, const char *name, void *opaque)
{
    VnLease *l = g_new0(VnLease, 1);

    l->device = g_strdup(name);
    l->opaque = opaque;
    g_ptr_array_add(ls->leases, l);
    return l;
}

void vn_leases_remove(VnLeases *ls, VnLease *l)
{
    vn_leases_end(ls, l, VN_LEASE_END_UNLENT);
    g_ptr_array_remove(ls->leases, l);
}

VnLease *vn_leases_lookup(VnLeases *ls, const char *name)
{
    for (guint i = 0; i < ls->leases->len; i++) {
        VnLease *l = ls->leases->pdata[i];

        if (strcmp(l->device, name) == 0) {
            return l;
        }
    }
    return NULL;
}

guint vn_leases_count(VnLeases *ls)
{
    return ls->leases->len;
}

VnLease *vn_leases_index(VnLeases *ls, guint i)
{
    return i < ls->leases->len ? ls->leases->pdata[i] : NULL;
}

uint64_t vn_leases_last_id(VnLeases *ls)
{
    return ls->last_id;
}

void vn_leases_set_last_id(VnLeases *ls, uint64_t id)
{
    ls->last_id = MAX(ls->last_id, id);
}

bool vn_leases_grant(VnLeases *ls, VnLease *l, const char *holder, gint64 now_us)
{
    if (vn_lease_lent(l)) {
        return false;
    }
    l->holder = g_strdup(holder);
    l->id = ++ls->last_id;
    l->known = false;
    set_state(ls, l, VN_LEASE_GRANTED, VN_LEASE_END_NONE, now_us);
    return true;
}

bool vn_leases_restore(VnLeases *ls, VnLease *l, const char *holder, uint64_t id, gint64 now_us)
{
    if (vn_lease_lent(l) || id == 0) {
        return false;
    }
    l->holder = g_strdup(holder);
    l->id = id;
    l->known = true;
    vn_leases_set_last_id(ls, id);
    set_state(ls, l, VN_LEASE_RESTORED, VN_LEASE_END_NONE, now_us);
    return true;
}

bool vn_leases_return(VnLeases *ls, VnLease *l, const char *holder, uint64_t id)
{
    if (!vn_lease_lent(l) || strcmp(l->holder, holder) != 0 || l->id != id) {
        return false;
    }
    set_state(ls, l, VN_LEASE_FREE, VN_LEASE_END_RETURNED, l->since_us);
    return true;
}

bool vn_leases_revoke(VnLeases *ls, VnLease *l, gint64 now_us)
{
    if (!vn_lease_lent(l) || l->state == VN_LEASE_REVOKING) {
        return false;
    }
    set_state(ls, l, VN_LEASE_REVOKING, VN_LEASE_END_NONE, now_us);
    return true;
}

void vn_leases_end(VnLeases *ls, VnLease *l, VnLeaseEnd why)
{
    if (vn_lease_lent(l)) {
        set_state(ls, l, VN_LEASE_FREE, why, l->since_us);
    }
}

/*
 * Listeners may change the table (end another lease, remove one), so the
 * walks below look each lease up again by position and re-check it.
 */
void vn_leases_announced(VnLeases *ls, const char *holder, VnLeaseClaimFn claimed, void *opaque,
                         gint64 now_us)
{
    for (guint i = 0; i < ls->leases->len; i++) {
        VnLease *l = ls->leases->pdata[i];

        if (!vn_lease_lent(l) || strcmp(l->holder, holder) != 0) {
            continue;
        }
        if (claimed(opaque, l->device, l->id)) {
            l->known = true;
            if (l->state != VN_LEASE_HELD && l->state != VN_LEASE_REVOKING) {
                set_state(ls, l, VN_LEASE_HELD, VN_LEASE_END_NONE, now_us);
            }
        } else if (l->known) {
            /* In order on one link: it was claimed, or we restarted since
             * the grant; an announcement without it now means let go. */
            set_state(ls, l, VN_LEASE_FREE, VN_LEASE_END_DROPPED, now_us);
        }
        /* else: built before the grant's reply reached the holder. */
    }
}

void vn_leases_link_down(VnLeases *ls, const char *holder, gint64 now_us)
{
    for (guint i = 0; i < ls->leases->len; i++) {
        VnLease *l = ls->leases->pdata[i];

        if ((l->state == VN_LEASE_GRANTED || l->state == VN_LEASE_HELD) &&
            strcmp(l->holder, holder) == 0) {
            set_state(ls, l, VN_LEASE_ORPHANED, VN_LEASE_END_NONE, now_us);
        }
    }
}

void vn_leases_tick(VnLeases *ls, gint64 now_us)
{
    for (guint i = 0; i < ls->leases->len; i++) {
        VnLease *l = ls->leases->pdata[i];

        if ((l->state == VN_LEASE_GRANTED || l->state == VN_LEASE_ORPHANED ||
             l->state == VN_LEASE_RESTORED) &&
            now_us - l->since_us > ls->timeout_us) {
            set_state(ls, l, VN_LEASE_FREE, VN_LEASE_END_EXPIRED, now_us);
        }
    }
}
