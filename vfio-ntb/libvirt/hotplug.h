/*
 * Moving borrowed devices in and out of running libvirt domains, as ntbctl
 * does it: attach (borrow, serve, plug into a free root port), detach
 * (unplug, wait for the guest, return) and reassign (from the domain that
 * holds a device, on whichever host, to another domain on another host).
 *
 * A host is reached through its vfio-ntbd's control socket and its libvirt
 * URI (ntbctl's --hosts file maps node names to both; docs/libvirt.md).  The
 * daemons never call libvirt; this code, in ntbctl, does.
 *
 * Each operation prints one progress line per step to @progress (may be
 * NULL) with the time since it started, is bounded (every wait has a
 * limit), and undoes what it did when a later step fails: a failed reassign
 * puts the device back into the domain it came from.
 *
 * With @config (ntbctl's --config, as virsh's) the domains' persistent
 * definitions follow the move once the live part succeeded: the domain the
 * device went into declares it, the one it left no longer does (else it
 * could not start while the device is elsewhere).  A failure there is
 * reported as an error; the live move stands.
 */
#ifndef VN_HOTPLUG_H
#define VN_HOTPLUG_H

#include <glib.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct VnHotplugHost {
    const char *node;        /* its fabric node name */
    const char *control;     /* its vfio-ntbd control socket */
    const char *libvirt_uri; /* NULL: libvirt's default */
} VnHotplugHost;

/* A --hosts file: [NODE] control = PATH, libvirt = URI.  Freed with g_hash_table_unref;
 * values are VnHotplugHost * (owned by the table). */
GHashTable *vn_hotplug_hosts_load(const char *path, GError **error);

/* Borrow @device on @h, serve it and plug it into running domain @domain with
 * id @alias (NULL: ntb-HOST-NAME). */
bool vn_hotplug_attach(const VnHotplugHost *h, const char *device, const char *domain,
                       const char *alias, bool config, FILE *progress, GError **error);

/* Unplug @device from the domain it is attached to on @h (the guest lets
 * go, bounded), then return it.  With @from, refused (nothing changed) unless
 * that is the domain it is attached to. */
bool vn_hotplug_detach(const VnHotplugHost *h, const char *device, const char *from, bool config,
                       FILE *progress, GError **error);

/*
 * Move @device into domain @domain on @to.  @hosts resolves the node that
 * holds it now (NULL: only @to is known, so it must hold it or nobody).
 * Nothing is changed until the target domain is known to be running with a
 * free root port.
 */
bool vn_hotplug_reassign(GHashTable *hosts, const VnHotplugHost *to, const char *device,
                         const char *domain, bool config, FILE *progress, GError **error);

#endif /* VN_HOTPLUG_H */
