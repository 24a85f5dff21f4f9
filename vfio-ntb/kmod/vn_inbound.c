// SPDX-License-Identifier: GPL-2.0
/*
 * vfio_ntb's inbound windows: the target here of the peer's window.  Three kinds: the
 * caller's pages (pinned, charged to its locked memory as VFIO's type1 charges them, and one
 * range of DMA addresses to the NTB's DMA device), a BAR the caller mapped through a VFIO
 * device file (reached peer to peer), or a buffer of the module's that the caller maps.
 *
 * A BAR target is watched (struct vn_bar_watch): an mmu interval notifier on the caller's
 * mapping it was taken from.  VFIO zaps that mapping whenever the BAR must not be reached
 * (memory decode cleared, a reset, the device let go, the caller's munmap); the invalidation
 * clears the window's translation there and then, so the peer reaches nothing, whatever the
 * caller does or fails to do.  vfio-ntbd withholds a BAR before VFIO disables it (its guard,
 * lending/lender-guard.c); this is the kernel's own check behind it.
 */
#include <linux/file.h>
#include <linux/magic.h>
#include <linux/mmu_notifier.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>

#include "vn_dev.h"

static void vn_unpin(struct page **pages, unsigned long npages)
{
	unpin_user_pages(pages, npages);
	kvfree(pages);
}

/* Give back what @mm was charged for @npages pinned pages: its process may be gone (then
 * so is the charge).
 */
static void vn_uncharge(struct mm_struct *mm, unsigned long npages)
{
	if (!mm)
		return;
	if (mmget_not_zero(mm)) {
		account_locked_vm(mm, npages, false);
		mmput(mm);
	}
	mmdrop(mm);
}

/* ---- a BAR's watch -------------------------------------------------------- */

static bool vn_bar_invalidate(struct mmu_interval_notifier *mni,
			      const struct mmu_notifier_range *range, unsigned long cur_seq)
{
	struct vn_bar_watch *w = container_of(mni, struct vn_bar_watch, mni);
	struct vn_dev *vn = w->vn;
	struct vn_inbound *in = &vn->in[w->idx];

	/* VFIO's zaps and munmap may sleep; only the OOM reaper may not, and it is told no. */
	if (!mmu_notifier_range_blockable(range))
		return false;
	mutex_lock(&vn->lock);
	mmu_interval_set_seq(mni, cur_seq);
	/* The owner's process is exiting (its mappings go with it, not because VFIO took the
	 * BAR away) and asked that its state be kept for the next owner: the translation
	 * stays, unwatched from now on.  VFIO still holds the BAR where it was (the lender's
	 * worker has the device open), and the daemon withholds it before a reset as ever.
	 */
	if (in->kind == VN_IN_MMIO && in->watch == w && !in->revoked && vn->keep_ms &&
	    !atomic_read(&range->mm->mm_users)) {
		if (!in->unwatched)
			dev_info(&vn->ntb->dev, "window %u: kept for the next owner, unwatched\n",
				 w->idx);
		in->unwatched = true;
	} else if (in->kind == VN_IN_MMIO && in->watch == w && !in->revoked) {
		if (!vn->dead)
			ntb_mw_clear_trans(vn->ntb, VN_PIDX, w->idx);
		in->revoked = true;
		dev_info(&vn->ntb->dev, "window %u: its BAR was taken away (VFIO); translation cleared\n",
			 w->idx);
	}
	mutex_unlock(&vn->lock);
	return true;
}

static const struct mmu_interval_notifier_ops vn_bar_watch_ops = {
	.invalidate = vn_bar_invalidate,
};

/* Watch [@a->vaddr, + @a->size) of the caller's, without vn->lock or the mmap_lock (the
 * first watch of a process registers its notifier, which takes the mmap_lock).
 */
static int vn_bar_watch(struct vn_dev *vn, struct vn_ntb_mw_export *a, struct vn_source *src)
{
	struct vn_bar_watch *w = kzalloc(sizeof(*w), GFP_KERNEL);
	int ret;

	if (!w)
		return -ENOMEM;
	w->idx = a->index;
	ret = mmu_interval_notifier_insert(&w->mni, current->mm, a->vaddr, a->size,
					   &vn_bar_watch_ops);
	if (ret) {
		kfree(w);
		return ret;
	}
	kref_get(&vn->ref);
	w->vn = vn;
	w->seq = mmu_interval_read_begin(&w->mni);
	src->watch = w;
	return 0;
}

static void vn_bar_unwatch(struct vn_bar_watch *w)
{
	if (!w)
		return;
	mmu_interval_notifier_remove(&w->mni);
	kref_put(&w->vn->ref, vn_free);
	kfree(w);
}

void vn_charges_drop(struct vn_charges *ch)
{
	unsigned int i;

	for (i = 0; i < ch->count; i++)
		vn_uncharge(ch->mm[i], ch->npages[i]);
	ch->count = 0;
	for (i = 0; i < ch->bars; i++) {
		vn_bar_unwatch(ch->watch[i]);
		fput(ch->file[i]);
	}
	ch->bars = 0;
}

/* Undo what an inbound window's target holds (its translation is cleared, its mappings
 * zapped first); its charge goes to @ch.
 */
static void vn_in_release(struct vn_dev *vn, struct vn_inbound *in, struct vn_charges *ch)
{
	switch (in->kind) {
	case VN_IN_USER:
		dma_unmap_sgtable(vn->dma_dev, &in->sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(&in->sgt);
		vn_unpin(in->pages, in->npages);
		/* One window, one entry: at most VN_NTB_MAX_MWS windows hold pins. */
		if (!WARN_ON(ch->count >= VN_NTB_MAX_MWS)) {
			ch->mm[ch->count] = in->mm;
			ch->npages[ch->count++] = in->npages;
		}
		break;
	case VN_IN_ALLOC:
		kvfree(in->pages);
		dma_free_coherent(vn->dma_dev, in->size, in->cpu, in->dma);
		break;
	case VN_IN_MMIO:
		dma_unmap_resource(vn->dma_dev, in->dma, in->size, DMA_BIDIRECTIONAL, 0);
		if (!WARN_ON(ch->bars >= VN_NTB_MAX_MWS)) {
			ch->watch[ch->bars] = in->watch;
			ch->file[ch->bars++] = in->mmio_file;
		}
		break;
	case VN_IN_NONE:
		break;
	}
	in->kind = VN_IN_NONE;
	in->size = 0;
	in->dma = 0;
	in->pages = NULL;
	in->npages = 0;
	in->mm = NULL;
	in->cpu = NULL;
	in->mmio_file = NULL;
	in->watch = NULL;
	in->revoked = false;
	in->unwatched = false;
}

/* The window reaches nothing from now on: the translation first (the peer's next access
 * goes nowhere), then our mappings of it, then what it held.
 */
int vn_in_clear(struct vn_dev *vn, u32 idx, struct vn_charges *ch)
{
	struct vn_inbound *in = &vn->in[idx];

	if (in->kind == VN_IN_NONE)
		return -ENOENT;
	if (!vn->dead)
		ntb_mw_clear_trans(vn->ntb, VN_PIDX, idx);
	vn_in_zap(vn, idx);
	vn_in_release(vn, in, ch);
	return 0;
}

/* Check a target of @size bytes against window @idx; size_align and addr_align are powers
 * of two or 0 (as the NTB drivers report them).
 */
int vn_in_check(struct vn_dev *vn, u32 idx, u64 size)
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
	return 0;
}

static int vn_in_set(struct vn_dev *vn, u32 idx, struct vn_inbound *in, struct vn_charges *ch)
{
	resource_size_t addr_align, size_align, max;
	int ret;

	ret = ntb_mw_get_align(vn->ntb, VN_PIDX, idx, &addr_align, &size_align, &max);
	if (!ret && addr_align > 1 && (in->dma & (addr_align - 1)))
		ret = -EINVAL;
	if (!ret)
		ret = ntb_mw_set_trans(vn->ntb, VN_PIDX, idx, in->dma, in->size);
	if (ret) {
		vn_in_release(vn, in, ch);
		return ret;
	}
	return 0;
}

void vn_source_release(struct vn_source *src)
{
	if (src->pages)
		vn_unpin(src->pages, src->npages);
	if (src->mm)
		vn_uncharge(src->mm, src->npages);
	vn_bar_unwatch(src->watch);
	if (src->file)
		fput(src->file);
	memset(src, 0, sizeof(*src));
}

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

/* A device file of VFIO's, as VFIO_GROUP_GET_DEVICE_FD makes them: an anonymous inode
 * named so.  Only VFIO mediates a BAR (memory enable, resets, its own revocation): a BAR
 * mapped any other way (sysfs resource files, /dev/mem) is never a window's target.
 */
static bool vn_vfio_device_file(struct file *f)
{
	return file_inode(f)->i_sb->s_magic == ANON_INODE_FS_MAGIC &&
	       !strcmp(f->f_path.dentry->d_name.name, "[vfio-device]");
}

/* A BAR the caller mapped through VFIO (VM_PFNMAP), under the mmap_lock: one physically
 * contiguous range with no page of RAM in it, faulted in where it is not yet.
 */
static int vn_source_mmio(struct mm_struct *mm, struct vm_area_struct *vma,
			  struct vn_ntb_mw_export *a, struct vn_source *src)
{
	unsigned long addr, pfn, first = 0;
	int ret;

	if (!vma->vm_file || a->vaddr + a->size > vma->vm_end)
		return -EFAULT;
	if (vn_is_ours(vma->vm_file) || !vn_vfio_device_file(vma->vm_file))
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
		if (pfn != first + ((addr - a->vaddr) >> PAGE_SHIFT) || pfn_valid(pfn))
			return -EINVAL;
		cond_resched();
	}
	src->phys = PFN_PHYS(first);
	src->file = get_file(vma->vm_file);
	return 0;
}

/* The caller's pages, charged to its locked memory first (ENOMEM past RLIMIT_MEMLOCK
 * without CAP_IPC_LOCK, as VFIO's type1 answers), then pinned.
 */
static int vn_source_pages(struct vn_ntb_mw_export *a, struct vn_source *src)
{
	unsigned long n = a->size >> PAGE_SHIFT;
	int pinned, ret;

	ret = account_locked_vm(current->mm, n, true);
	if (ret)
		return ret;
	mmgrab(current->mm);
	src->mm = current->mm;
	src->npages = n;
	src->pages = kvmalloc_array(n, sizeof(*src->pages), GFP_KERNEL);
	if (!src->pages) {
		vn_source_release(src);
		return -ENOMEM;
	}
	pinned = pin_user_pages_fast(a->vaddr, n, FOLL_WRITE | FOLL_LONGTERM, src->pages);
	if (pinned != n) {
		if (pinned > 0)
			unpin_user_pages(src->pages, pinned);
		kvfree(src->pages);
		src->pages = NULL;
		vn_source_release(src);
		return pinned < 0 ? pinned : -EFAULT;
	}
	return 0;
}

int vn_source_get(struct vn_dev *vn, struct vn_ntb_mw_export *a, struct vn_source *src)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	unsigned long n = a->size >> PAGE_SHIFT;
	bool mmio;
	int ret;

	if (!a->size || !PAGE_ALIGNED(a->vaddr) || !PAGE_ALIGNED(a->size) ||
	    a->vaddr + a->size < a->vaddr || n > INT_MAX)
		return -EINVAL;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, a->vaddr);
	mmio = vma && (vma->vm_flags & (VM_IO | VM_PFNMAP));
	mmap_read_unlock(mm);
	if (!mmio)
		return vn_source_pages(a, src);
	/* Watched before its pages are read: a zap from then on bumps the watch's sequence,
	 * which the export checks under vn->lock.
	 */
	ret = vn_bar_watch(vn, a, src);
	if (ret)
		return ret;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, a->vaddr);
	ret = vma && (vma->vm_flags & (VM_IO | VM_PFNMAP)) ? vn_source_mmio(mm, vma, a, src)
							    : -EFAULT;
	mmap_read_unlock(mm);
	if (ret)
		vn_source_release(src);
	return ret;
}

/* A BAR as the target: reached peer to peer through the NTB's DMA device. */
static int vn_mw_export_mmio(struct vn_dev *vn, struct vn_ntb_mw_export *a,
			     struct vn_source *src, struct vn_charges *ch)
{
	struct vn_inbound *in = &vn->in[a->index];
	int ret;

	/* VFIO took the BAR away since its pages were read (or is doing so): not a target. */
	if (mmu_interval_read_retry(&src->watch->mni, src->watch->seq))
		return -EAGAIN;
	in->dma = dma_map_resource(vn->dma_dev, src->phys, a->size, DMA_BIDIRECTIONAL, 0);
	if (dma_mapping_error(vn->dma_dev, in->dma)) {
		in->dma = 0;
		return -EIO;
	}
	in->kind = VN_IN_MMIO;
	in->mmio_file = src->file;
	in->watch = src->watch;
	in->size = a->size;
	src->file = NULL;
	src->watch = NULL;
	ret = vn_in_set(vn, a->index, in, ch);
	if (!ret)
		a->dma_addr = in->dma;
	return ret;
}

/* How many ranges of DMA addresses a mapped table is.  An IOMMU maps the pages at
 * consecutive addresses but in segments of at most the device's max_seg_size (64 KiB for a
 * PCI function unless its driver says otherwise), so count where one does not continue the
 * last rather than the segments themselves.
 */
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

int vn_mw_export(struct vn_dev *vn, struct vn_ntb_mw_export *a, struct vn_source *src,
		 struct vn_charges *ch)
{
	struct vn_inbound *in;
	unsigned int ranges;
	int ret;

	ret = vn_in_check(vn, a->index, a->size);
	if (ret)
		return ret;
	if (src->file)
		return vn_mw_export_mmio(vn, a, src, ch);
	in = &vn->in[a->index];
	ret = sg_alloc_table_from_pages(&in->sgt, src->pages, src->npages, 0, a->size, GFP_KERNEL);
	if (ret)
		return ret;
	ret = dma_map_sgtable(vn->dma_dev, &in->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret) {
		sg_free_table(&in->sgt);
		return ret;
	}
	in->kind = VN_IN_USER;
	in->pages = src->pages;
	in->npages = src->npages;
	in->mm = src->mm;
	in->size = a->size;
	src->pages = NULL;
	src->mm = NULL;
	/* The peer's window is one range: the pages must be one to the NTB's DMA device
	 * (an IOMMU makes them so; without one they must be physically contiguous).
	 */
	ranges = vn_dma_ranges(&in->sgt);
	if (ranges != 1) {
		dev_info(&vn->ntb->dev, "window %u: %lu pages are %u ranges to the device\n",
			 a->index, in->npages, ranges);
		vn_in_release(vn, in, ch);
		return -EINVAL;
	}
	in->dma = sg_dma_address(in->sgt.sgl);
	ret = vn_in_set(vn, a->index, in, ch);
	if (!ret)
		a->dma_addr = in->dma;
	return ret;
}

/* The pages of a coherent buffer, so that faults can map them one by one (the buffer may be
 * remapped pages behind an IOMMU, not one range of memory).
 */
static int vn_alloc_pages(struct vn_dev *vn, struct vn_inbound *in)
{
	struct sg_table sgt;
	struct scatterlist *sg;
	unsigned long n = 0, k;
	unsigned int i;
	int ret;

	ret = dma_get_sgtable(vn->dma_dev, &sgt, in->cpu, in->dma, in->size);
	if (ret)
		return ret;
	in->pages = kvmalloc_array(in->size >> PAGE_SHIFT, sizeof(*in->pages), GFP_KERNEL);
	if (!in->pages) {
		sg_free_table(&sgt);
		return -ENOMEM;
	}
	for_each_sgtable_sg(&sgt, sg, i)
		for (k = 0; k < sg->length >> PAGE_SHIFT && n < in->size >> PAGE_SHIFT; k++)
			in->pages[n++] = nth_page(sg_page(sg), k);
	sg_free_table(&sgt);
	in->npages = n;
	return n == in->size >> PAGE_SHIFT ? 0 : -EIO;
}

int vn_mw_alloc(struct vn_dev *vn, struct vn_ntb_mw_alloc *a, struct vn_charges *ch)
{
	struct vn_inbound *in;
	u64 size = PAGE_ALIGN(a->size);
	int ret;

	if (size < a->size || a->reserved)
		return -EINVAL;
	ret = vn_in_check(vn, a->index, size);
	if (ret)
		return ret;
	in = &vn->in[a->index];
	in->cpu = dma_alloc_coherent(vn->dma_dev, size, &in->dma, GFP_KERNEL);
	if (!in->cpu)
		return -ENOMEM;
	in->kind = VN_IN_ALLOC;
	in->size = size;
	ret = vn_alloc_pages(vn, in);
	if (ret) {
		vn_in_release(vn, in, ch);
		return ret;
	}
	return vn_in_set(vn, a->index, in, ch);
}
