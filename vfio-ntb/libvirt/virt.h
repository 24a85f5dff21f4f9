/*
 * Hot-plugging borrowed devices into running libvirt domains (ntbctl attach,
 * detach and reassign).  libvirt has no vfio-user hostdev, so the device is
 * added and removed with QMP through libvirt's monitor passthrough
 * (virDomainQemuMonitorCommand): libvirt does not list such devices in the
 * domain's XML, and QMP's query-pci is what tells which root ports are free.
 *
 * Everything here is ntbctl's (a client); vfio-ntbd and the hook never call
 * libvirt.  Every wait is bounded; QEMU's answers are untrusted JSON.
 *
 * Errors: VN_VIRT_ERROR codes below, messages that name the domain and say
 * what to do.
 */
#ifndef VN_VIRT_H
#define VN_VIRT_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

#define VN_VIRT_ERROR (vn_virt_error_quark())
GQuark vn_virt_error_quark(void);

typedef enum VnVirtError {
    VN_VIRT_ERROR_UNREACHABLE, /* libvirt could not be reached */
    VN_VIRT_ERROR_NO_DOMAIN,   /* no such domain */
    VN_VIRT_ERROR_NOT_RUNNING, /* the domain is not running */
    VN_VIRT_ERROR_NO_PORT,     /* no free pcie-root-port */
    VN_VIRT_ERROR_QMP,         /* QEMU refused a command, or answered nonsense */
    VN_VIRT_ERROR_TIMEOUT,     /* the guest did not let go of a device in time */
    VN_VIRT_ERROR_TRANSIENT,   /* the domain has no persistent definition */
    VN_VIRT_ERROR_DEFINE,      /* libvirt would not read or take a definition */
    VN_VIRT_ERROR_LAST
} VnVirtError;

/* How long device_del may take: the guest's driver must release the device. */
#define VN_VIRT_UNPLUG_TIMEOUT_MS 15000
/* QMP answers we read (query-pci of a big VM is tens of KiB). */
#define VN_VIRT_MAX_ANSWER (4u << 20)

typedef struct VnVirt VnVirt;

/* Connect to libvirt at @uri (NULL: libvirt's default, $LIBVIRT_DEFAULT_URI). */
VnVirt *vn_virt_open(const char *uri, GError **error);
void vn_virt_close(VnVirt *v);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnVirt, vn_virt_close)

/* True if @domain exists and runs; else NO_DOMAIN saying which. */
bool vn_virt_domain_running(VnVirt *v, const char *domain, GError **error);

/* The alias of a pcie-root-port of @domain with nothing plugged in
 * (newly allocated), or NULL with NO_PORT. */
char *vn_virt_free_root_port(VnVirt *v, const char *domain, GError **error);

/* The bus (root port alias, or "pcie.0") of device @id in @domain, newly
 * allocated; NULL without an error when no such device is plugged. */
char *vn_virt_device_bus(VnVirt *v, const char *domain, const char *id, GError **error);

/* device_add a vfio-user-pci with id @id on @bus, served on @socket. */
bool vn_virt_plug(VnVirt *v, const char *domain, const char *id, const char *bus,
                  const char *socket, GError **error);

/* Ask QEMU to unplug @id (QMP device_del): the guest is told to release it. */
bool vn_virt_device_del(VnVirt *v, const char *domain, const char *id, GError **error);
/* Wait until QEMU no longer has @id (the guest released it), at most @timeout_ms. */
bool vn_virt_wait_removed(VnVirt *v, const char *domain, const char *id, int timeout_ms,
                          GError **error);

/* The persistent definition of @domain (running or not), newly allocated;
 * VN_VIRT_ERROR_TRANSIENT when it has none. */
char *vn_virt_domain_config(VnVirt *v, const char *domain, GError **error);
/* Replace @domain's persistent definition with @xml (it takes effect at its
 * next start). */
bool vn_virt_domain_define(VnVirt *v, const char *domain, const char *xml, GError **error);

#endif /* VN_VIRT_H */
