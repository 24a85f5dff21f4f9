/*
 * The daemon's fence of a lent device (fence.c): at the end of a lease the device goes back
 * to nobody before anyone else may borrow it.  The fence's state is a VnFence in its
 * VnLocalDevice (devices.h); a borrow that comes meanwhile waits for it (vn_fence_defer).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_FENCE_H
#define VN_FENCE_H

#include "daemon.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct VnLocalDevice VnLocalDevice;

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

#endif /* VN_FENCE_H */
