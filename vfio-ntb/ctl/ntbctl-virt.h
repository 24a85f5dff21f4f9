/*
 * ntbctl's libvirt commands (ntbctl-virt.c): only ntbctl links them.
 */
#ifndef NTBCTL_VIRT_H
#define NTBCTL_VIRT_H

#include <glib.h>
#include <stdbool.h>

/* Where a --hosts file is looked for when none is given. */
#define NTBCTL_HOSTS_ENV "VFIO_NTB_HOSTS"
#define NTBCTL_DEFAULT_HOSTS "/etc/vfio-ntb/hosts.conf"

enum {
    NTBCTL_VIRT_DONE,
    NTBCTL_VIRT_FAILED,      /* @error says why */
    NTBCTL_VIRT_NOT_LIBVIRT, /* no libvirt, or it runs no such domain: use the daemon alone */
};

/* ntbctl xml --check FILE: prints a summary (0) or what is wrong (1). */
int ntbctl_xml_check(const char *path);
/* ntbctl xml DEV: prints the snippets. */
bool ntbctl_xml_print(const char *device, const char *alias, const char *bus,
                      const char *socket_path, int timeout_ms, GError **error);
/* ntbctl attach DEV --domain D, when libvirt runs D: hot-plug it. */
int ntbctl_virt_attach(const char *device, const char *domain, const char *alias, const char *uri,
                       bool config, const char *socket_path, int timeout_ms, GError **error);
/* ntbctl detach DEV --domain D: unplug from the running domain, then return. */
bool ntbctl_virt_detach(const char *device, const char *domain, const char *uri, bool config,
                        const char *socket_path, int timeout_ms, GError **error);
/* ntbctl reassign DEV --to [HOST:]DOMAIN */
bool ntbctl_reassign(const char *device, const char *to, const char *hosts_file, const char *uri,
                     bool config, const char *socket_path, int timeout_ms, GError **error);

#endif /* NTBCTL_VIRT_H */
