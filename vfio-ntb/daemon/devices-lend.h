/*
 * Lending a device and ending that (devices-lend.c): a lent device's port, lease and lender
 * worker's wiring; a device gone from the config unlent once its lease ends.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_DEVICES_LEND_H
#define VN_DEVICES_LEND_H

#include "daemon.h"
#include "devices.h"

#include <glib.h>
#include <stdbool.h>

/* Lend @lc (which d->conf->lends then owns) / stop lending a free device;
 * NULL with @error once this node lends VN_CONF_MAX_DEVICES. */
VnLocalDevice *vn_devices_lend(VnDaemon *d, VnLendConf *lc, GError **error);
/* sriov-vfs: create @pf's virtual functions (conf.h) and lend each as
 * PF-vfK, managed; their confs join d->conf->lends. */
bool vn_devices_lend_vfs(VnDaemon *d, VnLendConf *pf, GError **error);
void vn_devices_unlend(VnDaemon *d, VnLocalDevice *ld);
/* The lease listener that unlends a device gone from the config (conf.h:
 * leaving) once its lease ends. */
void vn_devices_on_lease(void *opaque, const VnLeaseChange *change);

#endif /* VN_DEVICES_LEND_H */
