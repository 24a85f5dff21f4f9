/*
 * Just enough QMP (qmp.c) for vfio-ntbd to take a borrowed device out of a VM and to
 * present it anew.  QEMU is a peer like any other: every wait is bounded and every line
 * is checked.  Each call blocks (bounded): the daemon makes them on a thread of GLib's
 * pool (unplug.c).
 *
 * Threads: any; nothing is shared.
 */
#ifndef VN_QMP_H
#define VN_QMP_H

#include <glib.h>
#include <stdbool.h>

/* device_del @id in the VM whose QMP socket is @path (bounded; does not wait
 * for the guest).  False with @error if QEMU refused. */
bool vn_qmp_device_del(const char *path, const char *id, GError **error);
/* The same on @fd, a connected QMP socket (borrowed; the fuzzer's seam). */
bool vn_qmp_device_del_fd(int fd, const char *id, GError **error);
/*
 * A device to be presented anew, in two steps (the worker serving it is restarted
 * between them).  remove: read where device @id sits (*@bus, the name device_add takes,
 * and *@addr, "SS.F"; newly allocated), device_del it and wait up to @wait_ms for the
 * guest to let go (DEVICE_DELETED).  add: device_add a vfio-user-pci of id @id at @bus and
 * @addr on @socket, so the guest's driver probes it as new; other properties it was
 * added with are not kept.  Bounded; false with @error at the first step that failed.
 */
bool vn_qmp_device_remove(const char *path, const char *id, unsigned wait_ms, char **bus,
                          char **addr, GError **error);
bool vn_qmp_device_remove_fd(int fd, const char *id, unsigned wait_ms, char **bus, char **addr,
                             GError **error);
bool vn_qmp_device_add(const char *path, const char *id, const char *bus, const char *addr,
                       const char *socket, GError **error);
bool vn_qmp_device_add_fd(int fd, const char *id, const char *bus, const char *addr,
                          const char *socket, GError **error);

#endif /* VN_QMP_H */
