/*
 * vfio-ntb's libvirt domain XML convention (docs/libvirt.md): parse and
 * check a domain, and print the snippets that declare a borrowed device.
 *
 * A domain borrows devices by listing them in its <metadata>, in our own
 * namespace, next to the <qemu:commandline> -device argument that plugs
 * each one into QEMU and the shared memfd memory backing that vfio-user
 * needs:
 *
 *   <domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
 *     <name>vm1</name>
 *     <metadata>
 *       <vn:devices xmlns:vn='https://vfio-ntb.org/xmlns/domain/1'>
 *         <vn:device name='hosta/nvme0' alias='ntb0'/>
 *       </vn:devices>
 *     </metadata>
 *     <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
 *     ...
 *     <qemu:commandline>
 *       <qemu:arg value='-device'/>
 *       <qemu:arg value='{"driver":"vfio-user-pci","id":"ntb0","bus":"pci.1",
 *                         "socket":{"type":"unix","path":"/run/vfio-ntb/hosta-nvme0.sock"}}'/>
 *     </qemu:commandline>
 *   </domain>
 *
 * <vn:device> attributes: name (required, "host/name" as ntbctl takes it),
 * alias (required: the -device id, [A-Za-z][A-Za-z0-9_.-]*, at most
 * VN_MAX_QDEV_ID), irq-mode (optional: "fd" or "relay").
 *
 * The XML comes from libvirt (a hook's stdin) or an operator's file and is
 * untrusted: its size and every count are bounded, DTDs and entities are
 * not loaded, the network is never touched, and anything unexpected is an
 * error that says what and where.  A domain without our metadata is valid
 * and has no devices (libvirt runs hooks for every domain).
 */
#ifndef VN_DOMXML_H
#define VN_DOMXML_H

#include "common/name.h"

#include <glib.h>
#include <stdbool.h>

#define VN_DOMXML_NS "https://vfio-ntb.org/xmlns/domain/1"
#define VN_DOMXML_QEMU_NS "http://libvirt.org/schemas/domain/qemu/1.0"
/* libvirt's own domain XML of a large VM is a few hundred KiB. */
#define VN_DOMXML_MAX_BYTES (4u << 20)
/* Borrowed devices per domain: a VM has a handful of root ports to spare. */
#define VN_DOMXML_MAX_DEVICES 16u
/* <qemu:arg> elements looked at (each -device is two). */
#define VN_DOMXML_MAX_ARGS 512u
/* The socket path must fit sun_path. */
#define VN_DOMXML_MAX_SOCKET 107u

typedef struct VnDomDevice {
    char *device;   /* "host/name" */
    char *alias;    /* the -device id */
    char *irq_mode; /* "fd", "relay", or NULL (the daemon's default) */
    bool p2p;       /* p2p='yes': in the domain's compositions (docs/p2p.md) */
    char *socket;   /* from the -device argument whose id is alias */
    char *bus;      /* from that argument; NULL when it has none */
} VnDomDevice;

typedef struct VnDomain {
    char *name;         /* <name>, [A-Za-z0-9_.-]{1,VN_MAX_DOMAIN_NAME} */
    GPtrArray *devices; /* VnDomDevice *, owned; in document order */
} VnDomain;

/*
 * Parse @xml (@len bytes, not necessarily NUL-terminated) and check it.  When
 * the domain declares devices, each must have exactly one vfio-user-pci
 * -device argument in <qemu:commandline> whose "id" is its alias, with a
 * unix socket at an absolute path; aliases and device names must not repeat;
 * and the memory backing must be memfd with shared access.  NULL with
 * @error (G_MARKUP_ERROR_INVALID_CONTENT for a rule, G_MARKUP_ERROR_PARSE for
 * XML that does not parse) naming what is wrong.
 */
VnDomain *vn_domxml_parse(const char *xml, size_t len, GError **error);
void vn_domain_free(VnDomain *dom);

/* Read @fd to its end, keeping at most VN_DOMXML_MAX_BYTES + 1 bytes (enough
 * for vn_domxml_parse() to refuse a larger document with its limit). */
GByteArray *vn_domxml_read_fd(int fd, GError **error);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnDomain, vn_domain_free)

/* The device named @device ("host/name") in @dom, or NULL. */
const VnDomDevice *vn_domain_find(const VnDomain *dom, const char *device);

/* The id ntbctl gives @device ("host/name") in a domain when none is chosen:
 * "ntb-host-name", newly allocated.  A long device name makes it longer than
 * an alias may be: check it with vn_name_valid(VN_NAME_QDEV_ID, ...). */
char *vn_domxml_default_alias(const char *device);

/*
 * The snippets that declare @device in a domain (ntbctl xml): the
 * <metadata> element, the <memoryBacking> element and the
 * <qemu:commandline> element, with a comment before each saying where it
 * goes.  @bus may be NULL (then the -device has no bus; a spare
 * pcie-root-port's alias such as "pci.1" is what docs/libvirt.md advises).
 * Newly allocated; the caller checked the arguments.
 */
char *vn_domxml_snippets(const char *device, const char *alias, const char *socket,
                         const char *bus);

#endif /* VN_DOMXML_H */
