/*
 * The daemon's events (events.c): what happened to a device, a lease or a link, sent by
 * the control socket to every client that subscribed (control.h: vn_control_event).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_EVENTS_H
#define VN_EVENTS_H

#include "daemon.h"

#include <stdint.h>

/* A control-socket event (docs/control.md "Events"); NULL / 0 members are left out. */
void vn_events_emit(VnDaemon *d, const char *event, const char *device, uint64_t lease,
                    const char *node, const char *domain);

#endif /* VN_EVENTS_H */
