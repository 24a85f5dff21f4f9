// SPDX-License-Identifier: GPL-2.0
/*
 * vfio_ntb: an NTB client that gives the host's vfio-ntbd its NTB device from userspace:
 * windows, doorbells, scratchpads and the link (vfio_ntb_uapi.h says what and how).
 *
 * It uses only Linux's NTB API, so it works over every NTB hardware driver Linux has.  One
 * peer (peer index 0): vfio-ntb joins hosts pairwise through each NTB port.
 *
 * Locking: vn->lock (a mutex) guards the device's state and is never held while taking the
 * caller's mmap_lock: arguments are copied in before and out after it, user pages are pinned
 * before it.  mmap runs under the mmap_lock and takes vn->lock (so that order only).
 * vn->ev_lock (a spinlock) guards the eventfds, which the NTB driver's interrupt handlers
 * signal through our ctx ops.
 *
 * Lifetime: the device (struct vn_dev) lives while the NTB device is there or a file is
 * open on it, the device's own or one of its window files (a kref).  When the NTB device
 * goes away first, its mappings are zapped (a later access is SIGBUS), its translations
 * cleared, and the open files answer ENODEV.  Every mapping of a device is in the address
 * space of one inode of ours (vn->inode, on a pseudo filesystem of the module's), whichever
 * file it was made through, so one call zaps them all.
 */
#include <linux/dma-mapping.h>
#include <linux/eventfd.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/mount.h>
#include <linux/ntb.h>
#include <linux/pci.h>
#include <linux/pseudo_fs.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "vfio_ntb_uapi.h"

#define VN_PIDX 0               /* the one peer */
#define VN_MMAP_KIND(off) (((off) >> 56) & 0xf)
#define VN_MMAP_INDEX(off) (((off) >> 48) & 0xff)
#define VN_MMAP_WITHIN(off) ((off) & ((1ull << 48) - 1))

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 8, 0)
#define vn_eventfd_signal(ctx) eventfd_signal(ctx)
#else
#define vn_eventfd_signal(ctx) eventfd_signal(ctx, 1)
#endif
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
#define vn_vma_set_flags(vma, f) vm_flags_set(vma, f)
#else
#define vn_vma_set_flags(vma, f) ((vma)->vm_flags |= (f))
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0) && LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
#error "vfio_ntb: Linux 6.10 and 6.11 (follow_pte without follow_pfnmap_start) are not supported"
#endif

enum vn_in_kind { VN_IN_NONE, VN_IN_USER, VN_IN_ALLOC, VN_IN_BAR, VN_IN_MMIO };

/* An inbound window's target: what the peer's window reaches here. */
struct vn_inbound {
	enum vn_in_kind kind;
	u64 size;
	dma_addr_t dma;
	struct page **pages;    /* VN_IN_USER: pinned */
	unsigned long npages;
	struct sg_table sgt;
	void *cpu;              /* VN_IN_ALLOC */
	struct pci_dev *bar_dev;/* VN_IN_BAR: held */
	struct file *mmio_file; /* VN_IN_MMIO: the file the caller mapped it from, held */
	atomic_t maps;          /* live mmaps of the VN_IN_ALLOC buffer */
};

struct vn_outbound {
	phys_addr_t base;
	resource_size_t size;
	atomic_t maps;
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
	struct mutex lock;
	bool dead;              /* the NTB device went away */
	struct file *owner;     /* the one open file */
	bool link_enabled;      /* by the owner */
	u32 mw_count, peer_mw_count, spad_count;
	u64 db_valid;
	struct vn_outbound out[VN_NTB_MAX_MWS];
	struct vn_inbound in[VN_NTB_MAX_MWS];
	spinlock_t ev_lock;
	struct eventfd_ctx *link_ev;
	struct vn_db_ev db_ev[VN_NTB_MAX_DB_EVENTFDS];
};

/* The pseudo filesystem of window files and of vn->inode, mounted while the module is
 * loaded.  It has no owner: a mount of it must not keep the module from unloading (every
 * file of ours holds the module through its fops instead). */
static struct vfsmount *vn_mnt;

static int vn_fs_init_fs_context(struct fs_context *fc)
{
	return init_pseudo(fc, VN_NTB_WINDOW_FS_MAGIC) ? 0 : -ENOMEM;
}

static struct file_system_type vn_fs_type = {
	.name = "vfio_ntb_window",
	.init_fs_context = vn_fs_init_fs_context,
	.kill_sb = kill_anon_super,
};

static void vn_free(struct kref *ref)
{
	struct vn_dev *vn = container_of(ref, struct vn_dev, ref);

	if (vn->inode)
		iput(vn->inode);
	kfree(vn);
}

/* ---- NTB events (interrupt context) ------------------------------------- */

static void vn_link_event(void *ctx)
{
	struct vn_dev *vn = ctx;
	unsigned long flags;

	spin_lock_irqsave(&vn->ev_lock, flags);
	if (vn->link_ev)
		vn_eventfd_signal(vn->link_ev);
	spin_unlock_irqrestore(&vn->ev_lock, flags);
}

static void vn_db_event(void *ctx, int vector)
{
	struct vn_dev *vn = ctx;
	unsigned long flags;
	u64 db, handled = 0;
	int i;

	spin_lock_irqsave(&vn->ev_lock, flags);
	db = ntb_db_read(vn->ntb) & vn->db_valid;
	for (i = 0; i < VN_NTB_MAX_DB_EVENTFDS; i++) {
		if (vn->db_ev[i].ctx && (vn->db_ev[i].bits & db)) {
			vn_eventfd_signal(vn->db_ev[i].ctx);
			handled |= vn->db_ev[i].bits & db;
		}
	}
	spin_unlock_irqrestore(&vn->ev_lock, flags);
	/* Bits nobody listens to stay set: VN_NTB_DB_READ shows them. */
	if (handled)
		ntb_db_clear(vn->ntb, handled);
}

static const struct ntb_ctx_ops vn_ctx_ops = {
	.link_event = vn_link_event,
	.db_event = vn_db_event,
};

/* ---- inbound windows ---------------------------------------------------- */

static void vn_unpin(struct page **pages, unsigned long npages)
{
	unpin_user_pages(pages, npages);
	kvfree(pages);
}

/* Undo what an inbound window's target holds (the translation is cleared first). */
static void vn_in_release(struct vn_dev *vn, struct vn_inbound *in)
{
	switch (in->kind) {
	case VN_IN_USER:
		dma_unmap_sgtable(vn->dma_dev, &in->sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(&in->sgt);
		vn_unpin(in->pages, in->npages);
		break;
	case VN_IN_ALLOC:
		dma_free_coherent(vn->dma_dev, in->size, in->cpu, in->dma);
		break;
	case VN_IN_BAR:
		dma_unmap_resource(vn->dma_dev, in->dma, in->size, DMA_BIDIRECTIONAL, 0);
		pci_dev_put(in->bar_dev);
		break;
	case VN_IN_MMIO:
		dma_unmap_resource(vn->dma_dev, in->dma, in->size, DMA_BIDIRECTIONAL, 0);
		fput(in->mmio_file);
		break;
	case VN_IN_NONE:
		break;
	}
	in->kind = VN_IN_NONE;
	in->size = 0;
	in->dma = 0;
	in->pages = NULL;
	in->cpu = NULL;
	in->bar_dev = NULL;
	in->mmio_file = NULL;
}

static int vn_in_clear(struct vn_dev *vn, u32 idx)
{
	struct vn_inbound *in = &vn->in[idx];

	if (in->kind == VN_IN_NONE)
		return -ENOENT;
	if (atomic_read(&in->maps))
		return -EBUSY;          /* never under a mapping */
	if (!vn->dead)
		ntb_mw_clear_trans(vn->ntb, VN_PIDX, idx);
	vn_in_release(vn, in);
	return 0;
}

/* Check a target of @size bytes at DMA address @dma against window @idx; size_align and
 * addr_align are powers of two or 0 (as the NTB drivers report them). */
static int vn_in_check(struct vn_dev *vn, u32 idx, u64 size, u64 *size_max)
{
	resource_size_t addr_align, size_align, max;
	int ret;

	if (idx >= vn->mw_count)
		return -EINVAL;
	if (vn->in[idx].kind != VN_IN_NONE)
		return -EBUSY;
	ret = ntb_mw_get_align(vn->ntb, VN_PIDX, idx, &addr_align, &size_align, &max);
	if (ret)
		return ret;
	if (!size || size > max || (size_align > 1 && (size & (size_align - 1))))
		return -EINVAL;
	*size_max = max;
	return 0;
}

static int vn_in_set(struct vn_dev *vn, u32 idx, struct vn_inbound *in)
{
	resource_size_t addr_align, size_align, max;
	int ret;

	ret = ntb_mw_get_align(vn->ntb, VN_PIDX, idx, &addr_align, &size_align, &max);
	if (!ret && addr_align > 1 && (in->dma & (addr_align - 1)))
		ret = -EINVAL;
	if (!ret)
		ret = ntb_mw_set_trans(vn->ntb, VN_PIDX, idx, in->dma, in->size);
	if (ret) {
		vn_in_release(vn, in);
		return ret;
	}
	return 0;
}

/* What VN_NTB_MW_EXPORT's memory is, taken hold of before vn->lock (it takes the caller's
 * mmap_lock): pinned pages, or device memory and the file it was mapped from. */
struct vn_source {
	struct page **pages;
	unsigned long npages;
	phys_addr_t phys;
	struct file *file;
};

static void vn_source_release(struct vn_source *src)
{
	if (src->pages)
		vn_unpin(src->pages, src->npages);
	if (src->file)
		fput(src->file);
	memset(src, 0, sizeof(*src));
}

/* Ours, defined below: a window's target is never one of our own mappings (a window
 * reaching a window makes no sense, and holding our own file would keep it open). */
static const struct file_operations vn_fops, vn_window_fops;

static int vn_follow_pfn(struct vm_area_struct *vma, unsigned long addr, unsigned long *pfn)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0)
	struct follow_pfnmap_args args = { .vma = vma, .address = addr };
	int ret = follow_pfnmap_start(&args);

	if (!ret) {
		*pfn = args.pfn;
		follow_pfnmap_end(&args);
	}
	return ret;
#else
	return follow_pfn(vma, addr, pfn);
#endif
}

/* Device memory the caller mapped (VM_PFNMAP, as VFIO maps a BAR), under the mmap_lock:
 * one physically contiguous range that is not ordinary RAM (as VFIO's type1 driver tells
 * it), faulted in where it is not yet. */
static int vn_source_mmio(struct mm_struct *mm, struct vm_area_struct *vma,
			  struct vn_ntb_mw_export *a, struct vn_source *src)
{
	unsigned long addr, pfn, first = 0;
	int ret;

	if (!vma->vm_file || a->vaddr + a->size > vma->vm_end)
		return -EFAULT;
	if (vma->vm_file->f_op == &vn_fops || vma->vm_file->f_op == &vn_window_fops)
		return -EINVAL;
	for (addr = a->vaddr; addr < a->vaddr + a->size; addr += PAGE_SIZE) {
		ret = vn_follow_pfn(vma, addr, &pfn);
		if (ret) {
			ret = fixup_user_fault(mm, addr, FAULT_FLAG_WRITE, NULL);
			if (!ret)
				ret = vn_follow_pfn(vma, addr, &pfn);
			if (ret)
				return -EFAULT;
		}
		if (addr == a->vaddr)
			first = pfn;
		if (pfn != first + ((addr - a->vaddr) >> PAGE_SHIFT) ||
		    (pfn_valid(pfn) && !PageReserved(pfn_to_page(pfn))))
			return -EINVAL;
		cond_resched();
	}
	src->phys = PFN_PHYS(first);
	src->file = get_file(vma->vm_file);
	return 0;
}

static int vn_source_get(struct vn_ntb_mw_export *a, struct vn_source *src)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	unsigned long n = a->size >> PAGE_SHIFT;
	int pinned, ret = 1;

	if (!a->size || !PAGE_ALIGNED(a->vaddr) || !PAGE_ALIGNED(a->size) ||
	    a->vaddr + a->size < a->vaddr || n > INT_MAX)
		return -EINVAL;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, a->vaddr);
	if (vma && (vma->vm_flags & (VM_IO | VM_PFNMAP)))
		ret = vn_source_mmio(mm, vma, a, src);
	mmap_read_unlock(mm);
	if (ret <= 0)
		return ret;
	src->pages = kvmalloc_array(n, sizeof(*src->pages), GFP_KERNEL);
	if (!src->pages)
		return -ENOMEM;
	pinned = pin_user_pages_fast(a->vaddr, n, FOLL_WRITE | FOLL_LONGTERM, src->pages);
	if (pinned != n) {
		if (pinned > 0)
			unpin_user_pages(src->pages, pinned);
		kvfree(src->pages);
		src->pages = NULL;
		return pinned < 0 ? pinned : -EFAULT;
	}
	src->npages = n;
	return 0;
}

/* Device memory as the target: reached peer to peer through the NTB's DMA device. */
static int vn_mw_export_mmio(struct vn_dev *vn, struct vn_ntb_mw_export *a, struct vn_source *src)
{
	struct vn_inbound *in = &vn->in[a->index];
	int ret;

	in->dma = dma_map_resource(vn->dma_dev, src->phys, a->size, DMA_BIDIRECTIONAL, 0);
	if (dma_mapping_error(vn->dma_dev, in->dma)) {
		in->dma = 0;
		vn_source_release(src);
		return -EIO;
	}
	in->kind = VN_IN_MMIO;
	in->mmio_file = src->file;
	in->size = a->size;
	src->file = NULL;
	ret = vn_in_set(vn, a->index, in);
	if (!ret)
		a->dma_addr = in->dma;
	return ret;
}

/* How many ranges of DMA addresses a mapped table is.  An IOMMU maps the pages at
 * consecutive addresses but in segments of at most the device's max_seg_size (64 KiB for a
 * PCI function unless its driver says otherwise), so count where one does not continue the
 * last rather than the segments themselves. */
static unsigned int vn_dma_ranges(struct sg_table *sgt)
{
	struct scatterlist *sg;
	dma_addr_t end = 0;
	unsigned int i, ranges = 0;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		if (!ranges || sg_dma_address(sg) != end)
			ranges++;
		end = sg_dma_address(sg) + sg_dma_len(sg);
	}
	return ranges;
}

/* Takes @src (vn_source_get's): the window keeps what it holds, or it is released. */
static int vn_mw_export(struct vn_dev *vn, struct vn_ntb_mw_export *a, struct vn_source *src)
{
	struct vn_inbound *in;
	unsigned int ranges;
	u64 max;
	int ret;

	ret = vn_in_check(vn, a->index, a->size, &max);
	if (ret)
		goto release;
	if (src->file)
		return vn_mw_export_mmio(vn, a, src);
	in = &vn->in[a->index];
	ret = sg_alloc_table_from_pages(&in->sgt, src->pages, src->npages, 0, a->size, GFP_KERNEL);
	if (ret)
		goto release;
	ret = dma_map_sgtable(vn->dma_dev, &in->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret) {
		sg_free_table(&in->sgt);
		goto release;
	}
	in->kind = VN_IN_USER;
	in->pages = src->pages;
	in->npages = src->npages;
	in->size = a->size;
	src->pages = NULL;
	/* The peer's window is one range: the pages must be one to the NTB's DMA device
	 * (an IOMMU makes them so; without one they must be physically contiguous). */
	ranges = vn_dma_ranges(&in->sgt);
	if (ranges != 1) {
		dev_info(&vn->ntb->dev, "window %u: %lu pages are %u ranges to the device\n",
			 a->index, src->npages, ranges);
		vn_in_release(vn, in);
		return -EINVAL;
	}
	in->dma = sg_dma_address(in->sgt.sgl);
	ret = vn_in_set(vn, a->index, in);
	if (!ret)
		a->dma_addr = in->dma;
	return ret;
release:
	vn_source_release(src);
	return ret;
}

static int vn_mw_alloc(struct vn_dev *vn, struct vn_ntb_mw_alloc *a)
{
	struct vn_inbound *in;
	u64 max, size = PAGE_ALIGN(a->size);
	int ret;

	if (size < a->size)
		return -EINVAL;
	ret = vn_in_check(vn, a->index, size, &max);
	if (ret)
		return ret;
	in = &vn->in[a->index];
	in->cpu = dma_alloc_coherent(vn->dma_dev, size, &in->dma, GFP_KERNEL);
	if (!in->cpu)
		return -ENOMEM;
	in->kind = VN_IN_ALLOC;
	in->size = size;
	return vn_in_set(vn, a->index, in);
}

static int vn_mw_export_bar(struct vn_dev *vn, struct vn_ntb_mw_export_bar *a)
{
	struct vn_inbound *in;
	struct pci_dev *pdev;
	u64 max;
	int ret;

	ret = vn_in_check(vn, a->index, a->size, &max);
	if (ret)
		return ret;
	if (a->bar >= PCI_STD_NUM_BARS)
		return -EINVAL;
	pdev = pci_get_domain_bus_and_slot(a->domain, a->bus, a->devfn);
	if (!pdev)
		return -ENODEV;
	if (!(pci_resource_flags(pdev, a->bar) & IORESOURCE_MEM) ||
	    a->offset > pci_resource_len(pdev, a->bar) ||
	    a->size > pci_resource_len(pdev, a->bar) - a->offset || !PAGE_ALIGNED(a->offset)) {
		pci_dev_put(pdev);
		return -EINVAL;
	}
	in = &vn->in[a->index];
	in->dma = dma_map_resource(vn->dma_dev, pci_resource_start(pdev, a->bar) + a->offset,
				   a->size, DMA_BIDIRECTIONAL, 0);
	if (dma_mapping_error(vn->dma_dev, in->dma)) {
		pci_dev_put(pdev);
		return -EIO;
	}
	in->kind = VN_IN_BAR;
	in->bar_dev = pdev;
	in->size = a->size;
	ret = vn_in_set(vn, a->index, in);
	if (!ret)
		a->dma_addr = in->dma;
	return ret;
}

/* ---- eventfds ----------------------------------------------------------- */

static void vn_events_release(struct vn_dev *vn)
{
	struct eventfd_ctx *old[VN_NTB_MAX_DB_EVENTFDS + 1] = { NULL };
	unsigned long flags;
	int i;

	spin_lock_irqsave(&vn->ev_lock, flags);
	old[0] = vn->link_ev;
	vn->link_ev = NULL;
	for (i = 0; i < VN_NTB_MAX_DB_EVENTFDS; i++) {
		old[i + 1] = vn->db_ev[i].ctx;
		vn->db_ev[i].ctx = NULL;
		vn->db_ev[i].bits = 0;
	}
	spin_unlock_irqrestore(&vn->ev_lock, flags);
	for (i = 0; i <= VN_NTB_MAX_DB_EVENTFDS; i++)
		if (old[i])
			eventfd_ctx_put(old[i]);
}

static int vn_link_eventfd(struct vn_dev *vn, s32 fd)
{
	struct eventfd_ctx *ctx = NULL, *old;
	unsigned long flags;

	if (fd >= 0) {
		ctx = eventfd_ctx_fdget(fd);
		if (IS_ERR(ctx))
			return PTR_ERR(ctx);
	} else if (fd != -1) {
		return -EINVAL;
	}
	spin_lock_irqsave(&vn->ev_lock, flags);
	old = vn->link_ev;
	vn->link_ev = ctx;
	spin_unlock_irqrestore(&vn->ev_lock, flags);
	if (old)
		eventfd_ctx_put(old);
	return 0;
}

static int vn_db_eventfd(struct vn_dev *vn, struct vn_ntb_db_eventfd *a)
{
	struct eventfd_ctx *ctx = NULL, *old = NULL;
	unsigned long flags;
	int i, slot = -1;

	if (!a->bits || (a->bits & ~vn->db_valid) || a->reserved)
		return -EINVAL;
	if (a->fd >= 0) {
		ctx = eventfd_ctx_fdget(a->fd);
		if (IS_ERR(ctx))
			return PTR_ERR(ctx);
	} else if (a->fd != -1) {
		return -EINVAL;
	}
	spin_lock_irqsave(&vn->ev_lock, flags);
	for (i = 0; i < VN_NTB_MAX_DB_EVENTFDS; i++) {
		if (vn->db_ev[i].ctx && vn->db_ev[i].bits == a->bits) {
			slot = i;
			break;
		}
		if (!vn->db_ev[i].ctx && slot < 0 && ctx)
			slot = i;
	}
	if (slot >= 0) {
		old = vn->db_ev[slot].ctx;
		vn->db_ev[slot].ctx = ctx;
		vn->db_ev[slot].bits = ctx ? a->bits : 0;
	}
	spin_unlock_irqrestore(&vn->ev_lock, flags);
	if (old)
		eventfd_ctx_put(old);
	if (slot < 0) {
		if (ctx)
			eventfd_ctx_put(ctx);
		return ctx ? -ENOSPC : -ENOENT;
	}
	return 0;
}

/* ---- the character device ----------------------------------------------- */

static struct vn_dev *vn_of(struct file *f)
{
	return container_of(f->private_data, struct vn_dev, misc);
}

static int vn_open(struct inode *inode, struct file *f)
{
	struct vn_dev *vn = vn_of(f);
	int ret = 0;

	mutex_lock(&vn->lock);
	if (vn->dead)
		ret = -ENODEV;
	else if (vn->owner)
		ret = -EBUSY;
	if (!ret) {
		vn->owner = f;
		f->f_mapping = vn->inode->i_mapping;
		kref_get(&vn->ref);
		ntb_db_clear_mask(vn->ntb, vn->db_valid);
	}
	mutex_unlock(&vn->lock);
	return ret;
}

/* Everything the owner set up goes (its mappings went before: they hold the file). */
static void vn_teardown(struct vn_dev *vn)
{
	u32 i;

	for (i = 0; i < vn->mw_count; i++)
		if (vn->in[i].kind != VN_IN_NONE)
			vn_in_clear(vn, i);
	if (vn->link_enabled && !vn->dead)
		ntb_link_disable(vn->ntb);
	vn->link_enabled = false;
	vn_events_release(vn);
}

static int vn_release(struct inode *inode, struct file *f)
{
	struct vn_dev *vn = vn_of(f);

	mutex_lock(&vn->lock);
	vn_teardown(vn);
	vn->owner = NULL;
	mutex_unlock(&vn->lock);
	kref_put(&vn->ref, vn_free);
	return 0;
}

static int vn_info(struct vn_dev *vn, struct vn_ntb_info *a)
{
	if (a->argsz < sizeof(*a))
		return -EINVAL;
	a->argsz = sizeof(*a);
	a->flags = ntb_link_is_up(vn->ntb, NULL, NULL) & BIT_ULL(VN_PIDX) ? VN_NTB_INFO_LINK_UP : 0;
	a->port = ntb_port_number(vn->ntb);
	a->peer_port = ntb_peer_port_number(vn->ntb, VN_PIDX);
	a->mw_count = vn->mw_count;
	a->peer_mw_count = vn->peer_mw_count;
	a->spad_count = vn->spad_count;
	a->reserved = 0;
	a->db_valid_mask = vn->db_valid;
	return 0;
}

static int vn_mw_info(struct vn_dev *vn, struct vn_ntb_mw_info *a)
{
	resource_size_t addr_align, size_align, max;
	u32 idx = a->index;

	if (a->argsz < sizeof(*a) || idx >= VN_NTB_MAX_MWS ||
	    (idx >= vn->mw_count && idx >= vn->peer_mw_count))
		return -EINVAL;
	memset(a, 0, sizeof(*a));
	a->argsz = sizeof(*a);
	a->index = idx;
	if (idx < vn->peer_mw_count) {
		a->out_size = vn->out[idx].size;
		a->out_mmap_offset = VN_NTB_MMAP_OFFSET(VN_NTB_MMAP_OUT, idx);
	}
	/* The NTB API tells an inbound window's shape only while the link is up (ENOTCONN
	 * before): zeros then, the outbound part still answered. */
	if (idx < vn->mw_count &&
	    !ntb_mw_get_align(vn->ntb, VN_PIDX, idx, &addr_align, &size_align, &max)) {
		a->in_addr_align = addr_align;
		a->in_size_align = size_align;
		a->in_size_max = max;
	}
	if (idx < vn->mw_count) {
		a->in_size = vn->in[idx].size;
		if (vn->in[idx].kind == VN_IN_ALLOC)
			a->in_mmap_offset = VN_NTB_MMAP_OFFSET(VN_NTB_MMAP_IN, idx);
	}
	return 0;
}

static int vn_spad(struct vn_dev *vn, unsigned int cmd, struct vn_ntb_spad *a)
{
	if (a->index >= vn->spad_count)
		return -EINVAL;
	switch (cmd) {
	case VN_NTB_SPAD_READ:
		a->value = ntb_spad_read(vn->ntb, a->index);
		return 0;
	case VN_NTB_SPAD_WRITE:
		return ntb_spad_write(vn->ntb, a->index, a->value);
	case VN_NTB_PEER_SPAD_READ:
		a->value = ntb_peer_spad_read(vn->ntb, VN_PIDX, a->index);
		return 0;
	default:
		return ntb_peer_spad_write(vn->ntb, VN_PIDX, a->index, a->value);
	}
}

/* The argument of each command: its size (the ioctl number's) is what is copied. */
union vn_args {
	struct vn_ntb_info info;
	struct vn_ntb_mw_info mw_info;
	struct vn_ntb_spad spad;
	struct vn_ntb_db_eventfd db_ev;
	struct vn_ntb_mw_export exp;
	struct vn_ntb_mw_alloc alloc;
	struct vn_ntb_mw_export_bar bar;
	__u64 u64;
	__u32 u32;
	__s32 s32;
};

static long vn_ioctl_locked(struct vn_dev *vn, unsigned int cmd, union vn_args *a,
			    struct vn_source *src)
{
	switch (cmd) {
	case VN_NTB_INFO:
		return vn_info(vn, &a->info);
	case VN_NTB_MW_INFO:
		return vn_mw_info(vn, &a->mw_info);
	case VN_NTB_LINK:
		if (a->u32 > 1)
			return -EINVAL;
		vn->link_enabled = a->u32;
		return a->u32 ? ntb_link_enable(vn->ntb, NTB_SPEED_AUTO, NTB_WIDTH_AUTO)
			      : ntb_link_disable(vn->ntb);
	case VN_NTB_LINK_EVENTFD:
		return vn_link_eventfd(vn, a->s32);
	case VN_NTB_SPAD_READ:
	case VN_NTB_SPAD_WRITE:
	case VN_NTB_PEER_SPAD_READ:
	case VN_NTB_PEER_SPAD_WRITE:
		return vn_spad(vn, cmd, &a->spad);
	case VN_NTB_PEER_DB_SET:
		if (!a->u64 || (a->u64 & ~vn->db_valid))
			return -EINVAL;
		return ntb_peer_db_set(vn->ntb, a->u64);
	case VN_NTB_DB_EVENTFD:
		return vn_db_eventfd(vn, &a->db_ev);
	case VN_NTB_DB_READ:
		a->u64 = ntb_db_read(vn->ntb) & vn->db_valid;
		return 0;
	case VN_NTB_MW_EXPORT:
		return vn_mw_export(vn, &a->exp, src);
	case VN_NTB_MW_ALLOC:
		return vn_mw_alloc(vn, &a->alloc);
	case VN_NTB_MW_EXPORT_BAR:
		return vn_mw_export_bar(vn, &a->bar);
	case VN_NTB_MW_CLEAR:
		return a->u32 < vn->mw_count ? vn_in_clear(vn, a->u32) : -EINVAL;
	case VN_NTB_MW_ZAP:
		if (a->u32 >= vn->peer_mw_count)
			return -EINVAL;
		unmap_mapping_range(vn->inode->i_mapping,
				    VN_NTB_MMAP_OFFSET(VN_NTB_MMAP_OUT, (u64)a->u32), 1ull << 48, 1);
		return 0;
	default:
		return -ENOTTY;
	}
}

static long vn_ioctl_mw_fd(struct vn_dev *vn, u32 idx);

static long vn_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct vn_dev *vn = vn_of(f);
	void __user *uarg = (void __user *)arg;
	unsigned int size = _IOC_SIZE(cmd);
	struct vn_source src = { 0 };
	union vn_args a;
	long ret;

	if (_IOC_TYPE(cmd) != VN_NTB_TYPE || size > sizeof(a))
		return -ENOTTY;
	memset(&a, 0, sizeof(a));
	if ((_IOC_DIR(cmd) & _IOC_WRITE) && copy_from_user(&a, uarg, size))
		return -EFAULT;
	if (cmd == VN_NTB_MW_EXPORT) {
		u64 max;

		if (a.exp.reserved)
			return -EINVAL;
		/* Bound the size by the window's before pinning anything (checked again under
		 * the lock by vn_mw_export: the window may have changed meanwhile). */
		mutex_lock(&vn->lock);
		ret = vn->dead ? -ENODEV : vn_in_check(vn, a.exp.index, a.exp.size, &max);
		mutex_unlock(&vn->lock);
		if (ret)
			return ret;
		ret = vn_source_get(&a.exp, &src);
		if (ret)
			return ret;
	}
	if (cmd == VN_NTB_MW_FD)
		return vn_ioctl_mw_fd(vn, a.u32);
	mutex_lock(&vn->lock);
	if (vn->dead) {
		ret = -ENODEV;
		vn_source_release(&src);
	} else {
		ret = vn_ioctl_locked(vn, cmd, &a, &src);      /* takes @src */
	}
	mutex_unlock(&vn->lock);
	if (!ret && (_IOC_DIR(cmd) & _IOC_READ) && copy_to_user(uarg, &a, size))
		return -EFAULT;
	return ret;
}

/* ---- mmap --------------------------------------------------------------- */

static void vn_vma_open(struct vm_area_struct *vma)
{
	atomic_inc(vma->vm_private_data);
}

static void vn_vma_close(struct vm_area_struct *vma)
{
	atomic_dec(vma->vm_private_data);
}

/* Only after the device went away (its mappings were zapped). */
static vm_fault_t vn_vma_fault(struct vm_fault *vmf)
{
	return VM_FAULT_SIGBUS;
}

static const struct vm_operations_struct vn_vm_ops = {
	.open = vn_vma_open,
	.close = vn_vma_close,
	.fault = vn_vma_fault,
};

/* Outbound window @idx from @within, under vn->lock.  Whichever file maps it, the mapping
 * sits at the device file's offset for it in vn->inode's address space. */
static int vn_mmap_out(struct vn_dev *vn, struct vm_area_struct *vma, u64 idx, u64 within)
{
	u64 len = vma->vm_end - vma->vm_start;
	int ret;

	if (idx >= vn->peer_mw_count || within > vn->out[idx].size ||
	    len > vn->out[idx].size - within)
		return -EINVAL;
	vma->vm_pgoff = (VN_NTB_MMAP_OFFSET(VN_NTB_MMAP_OUT, idx) + within) >> PAGE_SHIFT;
	/* Device memory: VFIO's type1 can map it for a device (VM_PFNMAP). */
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	vn_vma_set_flags(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
	ret = io_remap_pfn_range(vma, vma->vm_start, (vn->out[idx].base + within) >> PAGE_SHIFT,
				 len, vma->vm_page_prot);
	if (!ret) {
		vma->vm_private_data = &vn->out[idx].maps;
		vma->vm_ops = &vn_vm_ops;
		atomic_inc(&vn->out[idx].maps);
	}
	return ret;
}

static int vn_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct vn_dev *vn = vn_of(f);
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	u64 kind = VN_MMAP_KIND(off), idx = VN_MMAP_INDEX(off), within = VN_MMAP_WITHIN(off);
	atomic_t *maps = NULL;
	int ret = -EINVAL;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	mutex_lock(&vn->lock);
	if (vn->dead) {
		ret = -ENODEV;
	} else if (kind == VN_NTB_MMAP_OUT) {
		ret = vn_mmap_out(vn, vma, idx, within);
	} else if (kind == VN_NTB_MMAP_IN && idx < vn->mw_count &&
		   vn->in[idx].kind == VN_IN_ALLOC && within <= vn->in[idx].size &&
		   len <= vn->in[idx].size - within) {
		/* dma_mmap_coherent takes the offset into the buffer from vm_pgoff. */
		vma->vm_pgoff = within >> PAGE_SHIFT;
		ret = dma_mmap_coherent(vn->dma_dev, vma, vn->in[idx].cpu, vn->in[idx].dma,
					vn->in[idx].size);
		maps = &vn->in[idx].maps;
	}
	if (!ret && maps) {
		vma->vm_private_data = maps;
		vma->vm_ops = &vn_vm_ops;
		atomic_inc(maps);
	}
	mutex_unlock(&vn->lock);
	return ret;
}

/* ---- window files (VN_NTB_MW_FD) ---------------------------------------- */

struct vn_window_file {
	struct vn_dev *vn;      /* a reference */
	u32 idx;
};

static int vn_window_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct vn_window_file *w = f->private_data;
	u64 within = (u64)vma->vm_pgoff << PAGE_SHIFT;
	int ret;

	if (!(vma->vm_flags & VM_SHARED) || vma->vm_pgoff >= (1ull << (48 - PAGE_SHIFT)))
		return -EINVAL;
	mutex_lock(&w->vn->lock);
	ret = w->vn->dead ? -ENODEV : vn_mmap_out(w->vn, vma, w->idx, within);
	mutex_unlock(&w->vn->lock);
	return ret;
}

static int vn_window_release(struct inode *inode, struct file *f)
{
	struct vn_window_file *w = f->private_data;

	kref_put(&w->vn->ref, vn_free);
	kfree(w);
	return 0;
}

static const struct file_operations vn_window_fops = {
	.owner = THIS_MODULE,
	.mmap = vn_window_mmap,
	.release = vn_window_release,
	.llseek = noop_llseek,
};

/* A new fd for outbound window @idx alone: what the daemon hands a VM's QEMU. */
static long vn_ioctl_mw_fd(struct vn_dev *vn, u32 idx)
{
	struct vn_window_file *w;
	struct file *f;
	int fd;

	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return -ENOMEM;
	mutex_lock(&vn->lock);
	fd = vn->dead ? -ENODEV
	     : idx >= vn->peer_mw_count || !vn->out[idx].size ? -EINVAL : 0;
	if (!fd) {
		w->vn = vn;
		w->idx = idx;
		kref_get(&vn->ref);
	}
	mutex_unlock(&vn->lock);
	if (fd) {
		kfree(w);
		return fd;
	}
	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0)
		goto put;
	/* The file's release puts its fops' module and its inode: take both. */
	if (!try_module_get(THIS_MODULE)) {
		put_unused_fd(fd);
		fd = -ENODEV;
		goto put;
	}
	ihold(vn->inode);
	f = alloc_file_pseudo(vn->inode, vn_mnt, "vfio-ntb-window", O_RDWR, &vn_window_fops);
	if (IS_ERR(f)) {
		iput(vn->inode);
		module_put(THIS_MODULE);
		put_unused_fd(fd);
		fd = PTR_ERR(f);
		goto put;
	}
	f->private_data = w;
	fd_install(fd, f);
	return fd;
put:
	kref_put(&vn->ref, vn_free);
	kfree(w);
	return fd;
}

static const struct file_operations vn_fops = {
	.owner = THIS_MODULE,
	.open = vn_open,
	.release = vn_release,
	.unlocked_ioctl = vn_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = vn_mmap,
	.llseek = noop_llseek,
};

/* ---- the NTB client ----------------------------------------------------- */

static int vn_probe(struct ntb_client *client, struct ntb_dev *ntb)
{
	struct vn_dev *vn;
	int i, ret;

	if (ntb_peer_port_count(ntb) < 1)
		return -ENODEV;
	vn = kzalloc(sizeof(*vn), GFP_KERNEL);
	if (!vn)
		return -ENOMEM;
	kref_init(&vn->ref);
	mutex_init(&vn->lock);
	spin_lock_init(&vn->ev_lock);
	vn->ntb = ntb;
	vn->dma_dev = ntb_get_dma_dev(ntb);
	vn->inode = alloc_anon_inode(vn_mnt->mnt_sb);
	if (IS_ERR(vn->inode)) {
		ret = PTR_ERR(vn->inode);
		vn->inode = NULL;
		goto free;
	}
	ret = ntb_mw_count(ntb, VN_PIDX);
	vn->mw_count = ret < 0 ? 0 : ret;
	ret = ntb_peer_mw_count(ntb);
	vn->peer_mw_count = ret < 0 ? 0 : ret;
	ret = ntb_spad_count(ntb);
	vn->spad_count = ret < 0 ? 0 : min(ret, VN_NTB_MAX_SPADS);
	vn->db_valid = ntb_db_valid_mask(ntb);
	if (vn->mw_count > VN_NTB_MAX_MWS || vn->peer_mw_count > VN_NTB_MAX_MWS) {
		dev_err(&ntb->dev, "vfio_ntb: %u/%u windows, more than %d\n", vn->mw_count,
			vn->peer_mw_count, VN_NTB_MAX_MWS);
		ret = -EINVAL;
		goto free;
	}
	for (i = 0; i < vn->peer_mw_count; i++) {
		ret = ntb_peer_mw_get_addr(ntb, i, &vn->out[i].base, &vn->out[i].size);
		if (ret)
			goto free;
		if (!PAGE_ALIGNED(vn->out[i].base))
			vn->out[i].size = 0;    /* cannot be mapped: left out */
	}
	ret = ntb_set_ctx(ntb, vn, &vn_ctx_ops);
	if (ret)
		goto free;
	snprintf(vn->name, sizeof(vn->name), "vfio-ntb-%s", dev_name(&ntb->dev));
	snprintf(vn->nodename, sizeof(vn->nodename), "vfio-ntb/%s", dev_name(&ntb->dev));
	vn->misc.minor = MISC_DYNAMIC_MINOR;
	vn->misc.name = vn->name;
	vn->misc.nodename = vn->nodename;
	vn->misc.mode = 0600;
	vn->misc.fops = &vn_fops;
	ret = misc_register(&vn->misc);
	if (ret)
		goto clear;
	dev_info(&ntb->dev, "vfio_ntb: /dev/%s: %u inbound and %u outbound windows, %u "
		 "scratchpads, doorbells 0x%llx\n", vn->nodename, vn->mw_count,
		 vn->peer_mw_count, vn->spad_count, vn->db_valid);
	return 0;
clear:
	ntb_clear_ctx(ntb);
free:
	kref_put(&vn->ref, vn_free);
	return ret;
}

static void vn_remove(struct ntb_client *client, struct ntb_dev *ntb)
{
	struct vn_dev *vn = ntb->ctx;
	u32 i;

	misc_deregister(&vn->misc);
	mutex_lock(&vn->lock);
	/* Every mapping goes now, the device file's and its windows' files'; the next access
	 * faults (SIGBUS). */
	unmap_mapping_range(vn->inode->i_mapping, 0, 0, 1);
	for (i = 0; i < vn->mw_count; i++) {
		if (vn->in[i].kind != VN_IN_NONE) {
			ntb_mw_clear_trans(ntb, VN_PIDX, i);
			vn_in_release(vn, &vn->in[i]);
		}
	}
	if (vn->link_enabled)
		ntb_link_disable(ntb);
	vn->dead = true;
	mutex_unlock(&vn->lock);
	ntb_clear_ctx(ntb);
	vn_events_release(vn);
	kref_put(&vn->ref, vn_free);
}

static struct ntb_client vn_client = {
	.ops = {
		.probe = vn_probe,
		.remove = vn_remove,
	},
};

static int __init vn_init(void)
{
	int ret;

	vn_mnt = kern_mount(&vn_fs_type);
	if (IS_ERR(vn_mnt))
		return PTR_ERR(vn_mnt);
	ret = ntb_register_client(&vn_client);
	if (ret)
		kern_unmount(vn_mnt);
	return ret;
}

/* No file of ours is open (each holds the module), so once the devices are removed every
 * inode of the filesystem is gone. */
static void __exit vn_exit(void)
{
	ntb_unregister_client(&vn_client);
	kern_unmount(vn_mnt);
}

module_init(vn_init);
module_exit(vn_exit);

MODULE_DESCRIPTION("vfio-ntb: NTB windows, doorbells and scratchpads for vfio-ntbd");
MODULE_AUTHOR("vfio-ntb");
MODULE_LICENSE("GPL");
