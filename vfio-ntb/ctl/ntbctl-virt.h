/*
 * ntbctl's libvirt commands (ntbctl-virt.c): only ntbctl links them.
 */
#ifndef NTBCTL_VIRT_H
#define NTBCTL_VIRT_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stdio.h>

/* Where a --hosts file is looked for when none is given. */
#define NTBCTL_HOSTS_ENV "VFIO_NTB_HOSTS"
#define NTBCTL_DEFAULT_HOSTS "/etc/vfio-ntb/hosts.conf"

/* ntbctl xml --check FILE: a summary appended to @text and as JSON
 * {"file", "domain", "devices": [{"device", "alias", "socket", "bus"}]}, or
 * NULL with what is wrong. */
JsonNode *ntbctl_xml_check(const char *path, GString *text, GError **error);
/* ntbctl xml DEV: the snippets (g_free), or NULL; DeviceNotFound when no
 * node lends DEV. */
char *ntbctl_xml_print(const char *device, const char *alias, const char *bus,
                       const char *socket_path, int timeout_ms, GError **error);
/*
 * The commands that drive libvirt write their progress to @out (stdout, or
 * stderr under --json).  Errors: VN_CTL_ERROR_DOMAIN_NOT_FOUND (libvirt runs
 * no such domain), VN_CTL_ERROR_LIBVIRT (libvirt unreachable), the daemon's
 * and libvirt's own (VN_VIRT_ERROR).
 */
/* ntbctl attach DEV --domain D: hot-plug it into running domain D; refused
 * (nothing borrowed) when libvirt does not run D. */
bool ntbctl_virt_attach(const char *device, const char *domain, const char *alias, const char *uri,
                        bool config, const char *socket_path, int timeout_ms, FILE *out,
                        GError **error);
/* ntbctl detach DEV --domain D: unplug from the running domain, then return. */
bool ntbctl_virt_detach(const char *device, const char *domain, const char *uri, bool config,
                        const char *socket_path, int timeout_ms, FILE *out, GError **error);
/* ntbctl reassign DEV --to [HOST:]DOMAIN */
bool ntbctl_reassign(const char *device, const char *to, const char *hosts_file, const char *uri,
                     bool config, const char *socket_path, int timeout_ms, FILE *out,
                     GError **error);

#endif /* NTBCTL_VIRT_H */
