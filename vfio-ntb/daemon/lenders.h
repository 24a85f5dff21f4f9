/*
 * Lender workers (lenders.c): each lent device's backend runs in a vfio-ntb-lender
 * process, started on lend, started again when it exits, ended (fencing the device) on
 * unlend, adopted after a restart.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_LENDERS_H
#define VN_LENDERS_H

#include "daemon.h"
#include "devices.h"
#include "common/wctl.h"

#include <glib.h>
#include <stdbool.h>

/* lenders.c: the lender side of vn_spawn_ops (workers.h says what each does). */
bool vn_lenders_start(VnDaemon *d, VnLocalDevice *ld, GError **error);
void vn_lenders_stop(VnDaemon *d, VnLocalDevice *ld);
bool vn_lenders_adopt(VnDaemon *d, VnLocalDevice *ld, const char *secret);
bool vn_lenders_kill(VnDaemon *d, VnLocalDevice *ld);
VnWctlCall *vn_lenders_stats(VnDaemon *d, VnLocalDevice *ld, VnWctlDone done, void *opaque);

#endif /* VN_LENDERS_H */
