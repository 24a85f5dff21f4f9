/*
 * A lent device's identity as an operator knows it from lspci: its address
 * on the lender, vendor:device, class, a name from the PCI ID database
 * (libpci's pci.ids), and the size of its storage when the host's driver
 * showed one.  The lender reads it when it lends the device and announces
 * it; a peer's is untrusted text and is checked like any (peers.c).
 *
 * Threads: none of it keeps state.
 */
#ifndef VN_IDENTITY_H
#define VN_IDENTITY_H

#include <stdbool.h>
#include <stdint.h>

#define VN_IDENTITY_MAX_NAME 127

typedef struct VnIdentity {
    bool known;   /* false: nothing is known (a device server's) */
    char pci[16]; /* DDDD:BB:DD.F on the lender */
    uint16_t vendor, device;
    uint32_t class_code;                 /* base, sub-class, interface */
    char name[VN_IDENTITY_MAX_NAME + 1]; /* "Non-Volatile memory controller: Red Hat, ..." */
    uint64_t size;                       /* bytes of storage; 0: not known */
} VnIdentity;

/*
 * The identity of PCI function @bdf, read from @sys (sysfs: "/sys") and
 * named from the PCI ID database.  Storage size: the whole disks the
 * host's driver made of it, when one has it (not once vfio-pci has).
 * False when the host has no such function.
 */
bool vn_identity_of_pci(const char *sys, const char *bdf, VnIdentity *id);

/* A name as it may be shown: printable ASCII, at most VN_IDENTITY_MAX_NAME
 * bytes; anything else is replaced by '?' (for a peer's). */
void vn_identity_clean_name(char *name);

#endif /* VN_IDENTITY_H */
