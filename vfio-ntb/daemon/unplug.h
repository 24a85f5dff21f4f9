/*
 * Asking a VM to let go of a borrowed device, or to take it anew (unplug.c), without
 * waiting in the daemon's loop.
 *
 * Threads: the daemon's main thread; the QMP calls run on a thread of GLib's pool.
 */
#ifndef VN_UNPLUG_H
#define VN_UNPLUG_H

#include "daemon.h"
#include "devices.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

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
/* d->unplugs, empty. */
GPtrArray *vn_unplugs_new(void);
/* At the daemon's end: each unplug under way is done (@stopping set), and its thread, if it
 * has one, frees it when it ends. */
void vn_unplugs_free(VnDaemon *d);

#endif /* VN_UNPLUG_H */
