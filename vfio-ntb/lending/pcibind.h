/*
 * A PCI function's driver, as libvirt's managed hostdevs handle it: find
 * who uses the function on this host, check its IOMMU group, bind it to
 * vfio-pci to lend it and give it back to the driver it had.
 *
 * Everything is read and written through sysfs and procfs at @sys and
 * @proc ("/sys" and "/proc"; the unit tests point them at a fake tree).
 * Only the binds write, and only under @sys/bus/pci.  @bdf is a checked PCI
 * address (vn_backend_vfio_address_ok()).
 *
 * What counts as in use (what the host would lose if the function went to
 * vfio-pci under it): a mounted filesystem or an active swap on one of the
 * function's block devices or their partitions, a block device something
 * else holds (LVM, md, dm-crypt), a network interface that is up, a DRM
 * node (/dev/dri/...) some process has open.
 *
 * Threads: no state; the binds write sysfs files whose writes wait on the
 * kernel (a driver's remove can take a while): not from a loop that must
 * not wait.
 */
#ifndef VN_PCIBIND_H
#define VN_PCIBIND_H

#include <glib.h>
#include <stdbool.h>

/* Processes and fds looked through for open DRM nodes, at most. */
#define VN_PCIBIND_MAX_PROCS 32768u
#define VN_PCIBIND_MAX_FDS_PER_PROC 4096u

/* Entries of a sysfs class directory looked through, at most. */
#define VN_PCIBIND_MAX_CLASS_ENTRIES 4096u

/* The entries of @sys/class/@cls ("block", "net", "drm") whose device is
 * @bdf or below it (the link resolves through ".../@bdf/..."): a new array
 * of their names. */
GPtrArray *vn_pcibind_class_of(const char *sys, const char *cls, const char *bdf);

/* The driver bound to @bdf now ("" for none), or NULL with @error when the
 * host has no such function. */
char *vn_pcibind_driver(const char *sys, const char *bdf, GError **error);

/* Who uses @bdf on this host, in one sentence naming them ("nvme0n1p1 is
 * mounted on /data; eth0 is up"), or NULL when nobody does. */
char *vn_pcibind_users(const char *sys, const char *proc, const char *bdf);

/* The other functions of @bdf's IOMMU group bound to a driver VFIO cannot
 * share the group with ("0000:3b:00.1 (ixgbe)"), or NULL when none is
 * (no driver, vfio-pci, pcieport). */
char *vn_pcibind_group_conflicts(const char *sys, const char *bdf);

/* Bind @bdf to vfio-pci: driver_override, unbind from its driver, probe.
 * *@was: the driver it had ("" none).  False with @error. */
bool vn_pcibind_to_vfio(const char *sys, const char *bdf, char **was, GError **error);

/* Give @bdf back: unbind from vfio-pci, clear driver_override, probe; and
 * check that @driver has it (any driver, or none, when @driver is "").
 * False with @error. */
bool vn_pcibind_restore(const char *sys, const char *bdf, const char *driver, GError **error);

/*
 * managed = yes: while a lender worker has @bdf bound to vfio-pci, the file @path (0600,
 * written as root before the worker serves as the worker user) keeps the driver @bdf had
 * and @bdf, so that whoever ends the worker (the worker itself when it serves as root,
 * vfio-ntbd, or vfio-ntbd --stop-workers) gives the function back to that driver.
 */
bool vn_pcibind_keep(const char *path, const char *bdf, const char *driver, GError **error);
/* What @path keeps: true with *@driver (a driver's name, "" for none) and *@bdf (NULL when
 * the file names none); false when it is missing, too long or malformed. */
bool vn_pcibind_kept(const char *path, char **driver, char **bdf);
/* The function @path keeps given back to its driver (vn_pcibind_restore()), then @path
 * removed; false with @error, the file left for a later try.  @bdf: the function the caller
 * knows, which the file must name, or NULL to take the file's. */
bool vn_pcibind_give_back(const char *sys, const char *path, const char *bdf, GError **error);

/*
 * SR-IOV: physical function @bdf (bound to its own driver, which creates
 * the VFs) has @n virtual functions afterwards: sriov_numvfs is written
 * only when it holds another number (so a restart leaves VFs in use
 * alone).  Their addresses in order, a new array of strings; NULL with
 * @error (no SR-IOV, more than sriov_totalvfs, the driver refused).
 */
GPtrArray *vn_pcibind_sriov_enable(const char *sys, const char *bdf, unsigned n, GError **error);

#endif /* VN_PCIBIND_H */
