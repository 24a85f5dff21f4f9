/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vfio_ntb's device, shared by its parts: vn_main.c (the NTB client, the character device and
 * its calls, eventfds), vn_inbound.c (what the peer's windows reach here), vn_mmap.c
 * (mappings of windows and buffers, window files, revocation) and vn_trigger.c (eventfds
 * that ring the peer's doorbells).
 *
 * Locking: vn->lock (a mutex) guards the device's state, the targets and the generations.
 * Order: the caller's mmap_lock, then vn->lock, then the address space's i_mmap lock (taken
 * by unmap_mapping_range).  So vn->lock is never held while taking an mmap_lock: arguments
 * are copied in before and out after it, user pages are pinned and charged before it, and
 * uncharged after it (struct vn_charges: a fault of the same process holds its mmap_lock
 * and waits for vn->lock).
 * vn->ev_lock (a spinlock) guards the eventfds, which the NTB driver's interrupt handlers
 * signal through our ctx ops.
 *
 * Lifetime: the device lives while the NTB device is there or anything refers to it: its
 * open file, a window file, a mapping (a kref each).  When the NTB device goes away first,
 * vn->dead is set, every mapping is zapped and faults from then on, and every call answers
 * ENODEV.
 */
#ifndef VN_DEV_H
#define VN_DEV_H

#include <linux/dma-mapping.h>
#include <linux/eventfd.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/mutex.h>
#include <linux/ntb.h>
#include <linux/scatterlist.h>
#include <linux/spinlock.h>
#include <linux/version.h>
#include <linux/workqueue.h>

#include "vfio_ntb_uapi.h"

#define VN_PIDX 0               /* the one peer */
#define VN_MMAP_KIND(off) (((off) >> 56) & 0xf)
#define VN_MMAP_INDEX(off) (((off) >> 48) & 0xff)
#define VN_MMAP_WITHIN(off) ((off) & (BIT_ULL(48) - 1))
#define VN_MMAP_SPAN BIT_ULL(48)       /* offsets of one window or buffer */
/* Where mappings of span files (VN_NTB_MW_SPAN_FD) sit in vn->inode's address space: a kind
 * of its own, which the device file does not map.
 */
#define VN_MMAP_KIND_SPAN 3ull

enum vn_in_kind { VN_IN_NONE, VN_IN_USER, VN_IN_ALLOC, VN_IN_MMIO };

/* A BAR target's watch on the mapping it was taken from (vn_inbound.c): VFIO zaps every
 * mapping of a BAR when it disables the device's memory, resets it or lets it go, and that
 * invalidation clears the window's translation at once, in the kernel.
 */
struct vn_bar_watch {
	struct mmu_interval_notifier mni;
	struct vn_dev *vn;      /* a reference */
	u32 idx;
	unsigned long seq;      /* mmu_interval_read_begin() before the export */
};

/* An inbound window's target: what the peer's window reaches here. */
struct vn_inbound {
	enum vn_in_kind kind;
	u64 gen;                /* bumped at each clear: older mappings of the buffer fault */
	u64 size;
	dma_addr_t dma;
	struct page **pages;    /* USER: pinned; ALLOC: the buffer's pages, for faults */
	unsigned long npages;
	struct sg_table sgt;    /* USER */
	struct mm_struct *mm;   /* USER: whose locked_vm the pins are charged to (grabbed) */
	void *cpu;              /* ALLOC */
	struct file *mmio_file; /* MMIO: the VFIO device file the BAR was mapped from, held */
	struct vn_bar_watch *watch; /* MMIO */
	bool revoked;           /* MMIO: VFIO took the BAR away; the translation is cleared */
	bool unwatched;         /* MMIO: kept past its exporter's exit (VN_NTB_KEEP) */
};

/* An outbound window: our way to the peer's memory. */
struct vn_outbound {
	phys_addr_t base;
	resource_size_t size;
	u64 gen;                /* bumped at each revoke: older mappings and files are dead */
};

struct vn_db_ev {
	struct eventfd_ctx *ctx;
	u64 bits;
};

struct vn_dev {
	struct kref ref;
	struct ntb_dev *ntb;
	struct device *dma_dev;
	struct miscdevice misc;
	struct inode *inode;    /* whose address space holds every mapping of the device's */
	char name[48];
	char nodename[48];
	struct mutex lock;      /* the device's state, targets and generations */
	bool dead;              /* the NTB device went away */
	struct file *owner;     /* the one open file */
	bool link_enabled;      /* by the owner */
	u32 mw_count, peer_mw_count, spad_count;
	u64 db_valid;
	struct vn_outbound out[VN_NTB_MAX_MWS];
	struct vn_inbound in[VN_NTB_MAX_MWS];
	spinlock_t ev_lock;     /* the eventfds, which interrupt handlers signal */
	struct eventfd_ctx *link_ev;
	struct vn_db_ev db_ev[VN_NTB_MAX_DB_EVENTFDS];
	struct list_head triggers;      /* peer doorbell triggers (vn_trigger.c), vn->lock's */
	unsigned int ntriggers;
	/* vn_keep.c, under vn->lock */
	u32 keep_ms;            /* the owner's VN_NTB_KEEP */
	bool kept;              /* no owner: its state waits for the next (keep_work) */
	bool took_over;         /* the owner found its predecessor's state (VN_NTB_INFO_KEPT) */
	struct delayed_work keep_work;
	void *stash;            /* VN_NTB_STASH_SET's bytes */
	u32 stash_len;
};

/* What VN_NTB_MW_EXPORT's memory is, taken hold of before vn->lock (which must not be held
 * while the caller's mmap_lock is taken): pinned and charged pages, or a BAR and the VFIO
 * device file it was mapped from.
 */
struct vn_source {
	struct page **pages;
	unsigned long npages;
	struct mm_struct *mm;   /* charged for @npages */
	phys_addr_t phys;
	struct file *file;
	struct vn_bar_watch *watch;
};

/* What to give back once vn->lock is dropped (vn_charges_drop), each inbound window's at
 * most: locked memory; a BAR's watch (its removal waits for a running invalidation, which
 * takes vn->lock) and its VFIO file (whose last put may zap, so invalidate).
 */
struct vn_charges {
	struct mm_struct *mm[VN_NTB_MAX_MWS];
	unsigned long npages[VN_NTB_MAX_MWS];
	unsigned int count;
	struct vn_bar_watch *watch[VN_NTB_MAX_MWS];
	struct file *file[VN_NTB_MAX_MWS];
	unsigned int bars;
};

extern const struct file_operations vn_fops;
extern struct vfsmount *vn_mnt;

void vn_free(struct kref *ref);

/* vn_inbound.c; the vn_in_* and vn_mw_* calls under vn->lock, which collect in @ch what is
 * to be uncharged after it.  vn_source_get and _release, and vn_charges_drop, without it.
 */
int vn_in_check(struct vn_dev *vn, u32 idx, u64 size);
int vn_source_get(struct vn_dev *vn, struct vn_ntb_mw_export *a, struct vn_source *src);
void vn_source_release(struct vn_source *src);
/* Takes from @src what the window keeps; the caller releases the rest. */
int vn_mw_export(struct vn_dev *vn, struct vn_ntb_mw_export *a, struct vn_source *src,
		 struct vn_charges *ch);
int vn_mw_alloc(struct vn_dev *vn, struct vn_ntb_mw_alloc *a, struct vn_charges *ch);
int vn_in_clear(struct vn_dev *vn, u32 idx, struct vn_charges *ch);
void vn_charges_drop(struct vn_charges *ch);

/* vn_mmap.c. */
int vn_mmap(struct file *f, struct vm_area_struct *vma);
long vn_mw_fd(struct vn_dev *vn, struct vn_ntb_mw_fd *a);
long vn_mw_span_fd(struct vn_dev *vn, struct vn_ntb_mw_span_fd *a);
/* Under vn->lock: every mapping of outbound window @idx (revoke) or of inbound buffer @idx
 * (zap) faults from now on, and (revoke) every window or span file of it is dead.
 */
void vn_out_revoke(struct vn_dev *vn, u32 idx);
void vn_in_zap(struct vn_dev *vn, u32 idx);
bool vn_is_ours(const struct file *f);

/* vn_main.c: everything the owner set up goes (under vn->lock). */
void vn_teardown(struct vn_dev *vn, struct vn_charges *ch);

/* vn_keep.c.  Under vn->lock: _release (at close: whether the state is kept rather than
 * torn down), _take (at open), _set, and vn_stash_clear.  Without it: _end (the device goes;
 * nothing stays kept), vn_stash_set and _get.
 */
void vn_keep_init(struct vn_dev *vn);
bool vn_keep_release(struct vn_dev *vn);
void vn_keep_take(struct vn_dev *vn);
void vn_keep_end(struct vn_dev *vn);
int vn_keep_set(struct vn_dev *vn, u32 ms);
long vn_stash_set(struct vn_dev *vn, const struct vn_ntb_stash *a);
long vn_stash_get(struct vn_dev *vn, struct vn_ntb_stash *a);
void vn_stash_clear(struct vn_dev *vn);

/* vn_trigger.c */
int vn_trigger_set(struct vn_dev *vn, struct vn_ntb_db_eventfd *a);
void vn_triggers_release(struct vn_dev *vn);

#endif /* VN_DEV_H */
