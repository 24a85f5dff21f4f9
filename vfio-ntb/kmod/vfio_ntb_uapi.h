/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The interface of the vfio_ntb kernel module (vfio-ntb/kmod/vfio_ntb.c) to userspace: one
 * character device per NTB device, /dev/vfio-ntb/<its PCI name>, for the host's vfio-ntbd.
 *
 * What it gives, all through Linux's NTB API (so every NTB hardware driver Linux has works):
 *   - the device's shape (VN_NTB_INFO, VN_NTB_MW_INFO): windows, scratchpads, doorbells;
 *   - the link: enable/disable, its state, an eventfd signalled at each change;
 *   - scratchpads, ours and the peer's;
 *   - doorbells: ring the peer's; eventfds signalled when ours are rung; eventfds whose
 *     signals ring the peer's (VN_NTB_PEER_DB_EVENTFD: in the kernel, from whatever signals
 *     them, as a VFIO device's MSI-X vector does, so no process wakes up on the way);
 *   - outbound windows mapped into the caller (mmap at VN_NTB_MW_INFO's offset): device
 *     memory (VM_IO | VM_PFNMAP), so VFIO's type1 IOMMU driver can map it for a device;
 *   - an outbound window as a file of its own (VN_NTB_MW_FD): it can be mmap'd (from 0, the
 *     window's first byte) and nothing else, so the daemon can hand one window to another
 *     process (a VM's QEMU) without handing it the device.  Its filesystem's magic
 *     (fstatfs) is VN_NTB_WINDOW_FS_MAGIC;
 *   - consecutive outbound windows as one file (VN_NTB_MW_SPAN_FD): one memory larger than
 *     any window (a GPU's BAR cut into segments), mapped with one mmap;
 *   - inbound windows: what the peer's window reaches here.  Two kinds of target: the
 *     caller's own memory (VN_NTB_MW_EXPORT: pages pinned, charged to the locked memory of
 *     the process that calls it, as VFIO's type1 charges them (ENOMEM past its
 *     RLIMIT_MEMLOCK without CAP_IPC_LOCK), and mapped for the NTB's DMA device so that they
 *     are contiguous behind the IOMMU; or a BAR the caller mapped through a VFIO device
 *     file, which the window then reaches peer to peer), or a buffer of the module's
 *     (VN_NTB_MW_ALLOC, mmap-able).
 *
 * A mapping is a capability for one target (vfio-pci's model, Linux >= 6.10): its pages are
 * filled at fault time, under the device's lock, and only while the target it was made for
 * is there.  VN_NTB_MW_REVOKE ends an outbound window's target as far as this host can tell
 * (the peer set the translation behind it; vfio-ntbd knows when that changes): every
 * mapping of the window, through any file, then faults (SIGBUS), and every VN_NTB_MW_FD
 * file made before it is dead (mmap answers ENODEV); a new VN_NTB_MW_FD file reaches the
 * new target.  Clearing an inbound buffer (VN_NTB_MW_CLEAR) does the same to its mappings.
 * Window files map uncached unless made with VN_NTB_MW_FD_WC (memory behind the window:
 * write-combining); a device's registers must not have their writes merged or reordered.
 *
 * A window that has a target is not given another (EBUSY): clear it first.  Opening the
 * device unmasks its doorbells; closing it masks them again.
 *
 * One process at a time may open a device (a second open is EBUSY).  Everything it set up
 * goes when it closes the file, unless it asked VN_NTB_KEEP to keep it for its successor:
 * translations cleared, pages unpinned and uncharged, doorbells masked, eventfds released,
 * the link disabled.  Window files it handed out stay
 * until their window is revoked: whoever opens the device next revokes a window before it
 * gives it a new target.  When the NTB device goes away (hot removal, module
 * unload), every mapping faults and every call answers ENODEV.
 *
 * Every argument is checked: indexes against the device's counts, sizes against its
 * alignment and maximum, argsz against the structure, reserved fields and unknown flags
 * (EINVAL otherwise).  Inbound windows are set up while the link is up: Linux's NTB API
 * tells their alignment only then, so VN_NTB_MW_EXPORT and _ALLOC answer ENOTCONN before,
 * and VN_NTB_MW_INFO's inbound fields read 0.
 */
#ifndef VFIO_NTB_UAPI_H
#define VFIO_NTB_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define VN_NTB_TYPE 0xb7

/* Bounds on what one device can have; a device reporting more is refused at probe. */
#define VN_NTB_MAX_MWS 8
#define VN_NTB_MAX_SPADS 256
#define VN_NTB_MAX_DB_EVENTFDS 64

/* Link state in vn_ntb_info.flags. */
#define VN_NTB_INFO_LINK_UP (1u << 0)
/* What this open found: everything the last owner set up, kept for it (VN_NTB_KEEP). */
#define VN_NTB_INFO_KEPT (1u << 1)

/* Longest VN_NTB_KEEP, and the most a stash holds. */
#define VN_NTB_MAX_KEEP_MS 600000u
#define VN_NTB_MAX_STASH 4096u

struct vn_ntb_info {
    __u32 argsz;            /* in: sizeof(struct vn_ntb_info) */
    __u32 flags;            /* VN_NTB_INFO_* */
    __s32 port;             /* ntb_port_number() */
    __s32 peer_port;        /* ntb_peer_port_number(0) */
    __u32 mw_count;         /* inbound windows (ntb_mw_count) */
    __u32 peer_mw_count;    /* outbound windows (ntb_peer_mw_count) */
    __u32 spad_count;
    __u32 reserved;
    __u64 db_valid_mask;
};

struct vn_ntb_mw_info {
    __u32 argsz;            /* in: sizeof(struct vn_ntb_mw_info) */
    __u32 index;            /* in: window index */
    /* Outbound (ours, to the peer): 0 size when index >= peer_mw_count. */
    __u64 out_size;         /* bytes of the window (ntb_peer_mw_get_addr) */
    __u64 out_mmap_offset;  /* mmap() it at this offset */
    /* Inbound (the peer's, to us): 0 when index >= mw_count; the alignment and maximum
     * are 0 too while the link is down. */
    __u64 in_addr_align;    /* ntb_mw_get_align() */
    __u64 in_size_align;
    __u64 in_size_max;
    __u64 in_mmap_offset;   /* the VN_NTB_MW_ALLOC buffer, when there is one */
    __u64 in_size;          /* the translation's size now; 0: none */
};

struct vn_ntb_spad {
    __u32 index;
    __u32 value;            /* in for writes, out for reads */
};

struct vn_ntb_db_eventfd {
    __s32 fd;               /* an eventfd; -1 removes the registration of @bits */
    __u32 reserved;
    __u64 bits;             /* VN_NTB_DB_EVENTFD: signalled (and those bits cleared) when any
                             * of them rings.  VN_NTB_PEER_DB_EVENTFD: one bit, the peer's,
                             * rung at each signal (signals that come together ring once) */
};

struct vn_ntb_mw_export {
    __u32 index;            /* inbound window */
    __u32 reserved;
    __u64 vaddr;            /* page-aligned memory of the caller: pages, or one mapping of
                             * a BAR through a VFIO device file (VM_PFNMAP, physically
                             * contiguous, no RAM) */
    __u64 size;             /* a multiple of the page size, within in_size_max */
    __u64 dma_addr;         /* out: where the NTB's DMA device sees it */
};

struct vn_ntb_mw_alloc {
    __u32 index;
    __u32 reserved;
    __u64 size;             /* within in_size_max; rounded up to the alignment */
};

/* VN_NTB_STASH_SET's and _GET's argument. */
struct vn_ntb_stash {
    __u64 addr;             /* the caller's buffer */
    __u32 len;              /* SET: bytes, at most VN_NTB_MAX_STASH; GET: the buffer's size,
                             * and out: the bytes there were (ENOSPC when more than len) */
    __u32 reserved;
};

/* VN_NTB_MW_FD's argument. */
#define VN_NTB_MW_FD_WC (1u << 0)   /* map write-combining (memory, not registers) */

struct vn_ntb_mw_fd {
    __u32 argsz;            /* in: sizeof(struct vn_ntb_mw_fd) */
    __u32 index;            /* in: outbound window */
    __u32 flags;            /* in: VN_NTB_MW_FD_* */
    __u32 reserved;
};

/* VN_NTB_MW_SPAN_FD's argument: the file's offset O reaches window index[O / chunk] at
 * O % chunk, for O below count * chunk. */
struct vn_ntb_mw_span_fd {
    __u32 argsz;            /* in: sizeof(struct vn_ntb_mw_span_fd) */
    __u32 flags;            /* in: VN_NTB_MW_FD_* */
    __u32 count;            /* in: windows, 1..VN_NTB_MAX_MWS, each named once */
    __u32 reserved;
    __u64 chunk;            /* in: bytes of each window, a page multiple within its size */
    __u32 index[VN_NTB_MAX_MWS]; /* in: outbound windows in the file's order */
};

#define VN_NTB_INFO _IOWR(VN_NTB_TYPE, 0, struct vn_ntb_info)
#define VN_NTB_MW_INFO _IOWR(VN_NTB_TYPE, 1, struct vn_ntb_mw_info)
#define VN_NTB_LINK _IOW(VN_NTB_TYPE, 2, __u32)             /* 1: enable, 0: disable */
#define VN_NTB_LINK_EVENTFD _IOW(VN_NTB_TYPE, 3, __s32)     /* -1 removes it */
#define VN_NTB_SPAD_READ _IOWR(VN_NTB_TYPE, 4, struct vn_ntb_spad)
#define VN_NTB_SPAD_WRITE _IOW(VN_NTB_TYPE, 5, struct vn_ntb_spad)
#define VN_NTB_PEER_SPAD_READ _IOWR(VN_NTB_TYPE, 6, struct vn_ntb_spad)
#define VN_NTB_PEER_SPAD_WRITE _IOW(VN_NTB_TYPE, 7, struct vn_ntb_spad)
#define VN_NTB_PEER_DB_SET _IOW(VN_NTB_TYPE, 8, __u64)
#define VN_NTB_DB_EVENTFD _IOW(VN_NTB_TYPE, 9, struct vn_ntb_db_eventfd)
#define VN_NTB_DB_READ _IOR(VN_NTB_TYPE, 10, __u64)
#define VN_NTB_MW_EXPORT _IOWR(VN_NTB_TYPE, 11, struct vn_ntb_mw_export)
#define VN_NTB_MW_ALLOC _IOW(VN_NTB_TYPE, 12, struct vn_ntb_mw_alloc)
/* 13 was VN_NTB_MW_EXPORT_BAR: any local function's BAR by its address; gone. */
#define VN_NTB_MW_CLEAR _IOW(VN_NTB_TYPE, 14, __u32)        /* an inbound window's target */
/* Returns a new fd (O_CLOEXEC) for one outbound window alone, bound to its current target. */
#define VN_NTB_MW_FD _IOW(VN_NTB_TYPE, 15, struct vn_ntb_mw_fd)
/* 16 was VN_NTB_MW_ZAP, after which the same files could be mapped again; gone. */
/* The outbound window's target is gone (or about to change): every mapping of it faults,
 * every window file of it is dead.  In: the window's index. */
#define VN_NTB_MW_REVOKE _IOW(VN_NTB_TYPE, 17, __u32)
/* Returns a new fd (O_CLOEXEC) for several outbound windows as one memory, bound to their
 * current targets: a revoke of any of them kills the file, as VN_NTB_MW_FD's. */
#define VN_NTB_MW_SPAN_FD _IOW(VN_NTB_TYPE, 18, struct vn_ntb_mw_span_fd)
/* An eventfd whose signals ring one doorbell bit of the peer's (-1 removes it), at most
 * VN_NTB_MAX_DB_EVENTFDS of them; the same bit again replaces its eventfd. */
#define VN_NTB_PEER_DB_EVENTFD _IOW(VN_NTB_TYPE, 19, struct vn_ntb_db_eventfd)
/* Keep everything this owner set up for this many milliseconds after it closes the device
 * (0: tear it down at close, the default), for the next owner to take over: a daemon that
 * restarts (or crashes and is restarted) leaves its translations, doorbell eventfds,
 * triggers, link and stash as they were, so the data paths through them run on.  Not kept
 * when the device goes.  The next open takes it over (VN_NTB_INFO_KEPT) and starts with no
 * keep of its own; once the time is out with no open, it is torn down as at close.  While
 * something is kept the module cannot be unloaded. */
#define VN_NTB_KEEP _IOW(VN_NTB_TYPE, 20, __u32)
/* Tear down now everything the owner (or the one before it) set up, as closing would. */
#define VN_NTB_RESET _IO(VN_NTB_TYPE, 21)
/* The owner's own bytes, kept with the rest (VN_NTB_KEEP) and gone with it: what its
 * successor needs to know of the state it takes over.  The peer never sees them. */
#define VN_NTB_STASH_SET _IOW(VN_NTB_TYPE, 22, struct vn_ntb_stash)
#define VN_NTB_STASH_GET _IOWR(VN_NTB_TYPE, 23, struct vn_ntb_stash)

/* fstatfs(2) f_type of a VN_NTB_MW_FD file ("VNWF"). */
#define VN_NTB_WINDOW_FS_MAGIC 0x564e5746

/* mmap offsets: kind in bits 56-59, window index in bits 48-55, then the offset into the
 * window (page-aligned). */
#define VN_NTB_MMAP_OUT 1ull
#define VN_NTB_MMAP_IN 2ull
#define VN_NTB_MMAP_OFFSET(kind, index) (((kind) << 56) | ((__u64)(index) << 48))

#endif /* VFIO_NTB_UAPI_H */
