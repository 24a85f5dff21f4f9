// SPDX-License-Identifier: GPL-2.0
/*
 * vfio_ntb's mappings (vfio-pci's model, Linux >= 6.10): a mapping is made for one target,
 * a window's or a buffer's generation, and its pages are filled at fault time under
 * vn->lock, only while that generation is current and the device is there.  A revoke bumps
 * the generation and zaps, under the same lock: a fault either filled its pages before (and
 * the zap removes them) or sees the new generation (SIGBUS).  Filling pages in ->mmap would
 * race: the new VMA joins the address space only after ->mmap returns, so a zap in between
 * would miss it.
 *
 * Every mapping sits in the address space of one inode of ours (vn->inode), at the device
 * file's offset for what it maps, whichever file it was made through, so one call zaps them
 * all.  A window file (VN_NTB_MW_FD) is bound to the generation it was made for: once that
 * is revoked, it cannot be mapped again.  A span file (VN_NTB_MW_SPAN_FD) is bound to each of
 * its windows' generations; its mappings share one place of their own, zapped whole at any
 * window's revoke (a span's pages come from several windows, so no one offset names them).
 */
#include <linux/file.h>
#include <linux/module.h>
#include <linux/slab.h>

#include "vn_dev.h"

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
#define vn_vma_set_flags(vma, f) vm_flags_set(vma, f)
#else
#define vn_vma_set_flags(vma, f) ((vma)->vm_flags |= (f))
#endif

/* One mapping's target (shared by the VMAs a split or a fork makes of it): an outbound
 * window, an inbound buffer, or (VN_MMAP_KIND_SPAN) @count outbound windows of @chunk bytes
 * each, one after the other.
 */
struct vn_map {
	struct kref ref;
	struct vn_dev *vn;      /* a reference */
	u64 kind;               /* VN_NTB_MMAP_OUT, _IN, or VN_MMAP_KIND_SPAN */
	u32 count;              /* targets: 1 but for a span */
	u64 chunk;              /* a span's bytes per window */
	u32 idx[VN_NTB_MAX_MWS];
	u64 gen[VN_NTB_MAX_MWS];
};

static void vn_map_free(struct kref *ref)
{
	struct vn_map *m = container_of(ref, struct vn_map, ref);

	kref_put(&m->vn->ref, vn_free);
	kfree(m);
}

static void vn_vma_open(struct vm_area_struct *vma)
{
	struct vn_map *m = vma->vm_private_data;

	kref_get(&m->ref);
}

static void vn_vma_close(struct vm_area_struct *vma)
{
	struct vn_map *m = vma->vm_private_data;

	kref_put(&m->ref, vn_map_free);
}

/* Whether every target of @m is still there, under vn->lock. */
static bool vn_map_live(struct vn_dev *vn, struct vn_map *m)
{
	u32 k;

	if (vn->dead)
		return false;
	if (m->kind == VN_NTB_MMAP_IN)
		return vn->in[m->idx[0]].kind == VN_IN_ALLOC &&
		       vn->in[m->idx[0]].gen == m->gen[0];
	for (k = 0; k < m->count; k++)
		if (vn->out[m->idx[k]].gen != m->gen[k])
			return false;
	return true;
}

/* The page frame at @addr of @vma, whose target is live (bounds were checked at mmap and a
 * mapping cannot grow: VM_DONTEXPAND).
 */
static unsigned long vn_map_pfn(struct vn_dev *vn, struct vn_map *m,
				struct vm_area_struct *vma, unsigned long addr)
{
	u64 base = m->kind == VN_MMAP_KIND_SPAN ? VN_NTB_MMAP_OFFSET(m->kind, 0ull)
						: VN_NTB_MMAP_OFFSET(m->kind, (u64)m->idx[0]);
	u64 within = ((u64)vma->vm_pgoff << PAGE_SHIFT) - base + (addr - vma->vm_start);
	u64 k;

	if (m->kind == VN_NTB_MMAP_IN)
		return page_to_pfn(vn->in[m->idx[0]].pages[within >> PAGE_SHIFT]);
	if (m->kind == VN_NTB_MMAP_OUT)
		return (vn->out[m->idx[0]].base + within) >> PAGE_SHIFT;
	k = div64_u64(within, m->chunk);
	return (vn->out[m->idx[k]].base + within - k * m->chunk) >> PAGE_SHIFT;
}

/* The faulting page, then the rest of the mapping (as vfio-pci does): one fault per
 * mapping rather than one per page.  SIGBUS once the target is gone.
 */
static vm_fault_t vn_vma_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct vn_map *m = vma->vm_private_data;
	struct vn_dev *vn = m->vn;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	unsigned long addr;

	mutex_lock(&vn->lock);
	if (!vn_map_live(vn, m))
		goto out;
	ret = vmf_insert_pfn(vma, vmf->address, vn_map_pfn(vn, m, vma, vmf->address));
	if (ret & VM_FAULT_ERROR)
		goto out;
	for (addr = vma->vm_start; addr < vma->vm_end; addr += PAGE_SIZE) {
		if (addr == vmf->address)
			continue;
		if (vmf_insert_pfn(vma, addr, vn_map_pfn(vn, m, vma, addr)) & VM_FAULT_ERROR)
			break;
	}
	ret = VM_FAULT_NOPAGE;
out:
	mutex_unlock(&vn->lock);
	return ret;
}

static const struct vm_operations_struct vn_vm_ops = {
	.open = vn_vma_open,
	.close = vn_vma_close,
	.fault = vn_vma_fault,
};

/* @vma maps @within.. of @tmpl's targets (its kind, windows and generations), under
 * vn->lock; nothing is mapped until the first access.  Its offset becomes the device
 * file's for that place (a span's: the span kind's), whichever file maps it.
 */
static int vn_map_setup(struct vn_dev *vn, struct vm_area_struct *vma,
			const struct vn_map *tmpl, u64 within, pgprot_t prot)
{
	struct vn_map *m = kmemdup(tmpl, sizeof(*m), GFP_KERNEL);
	u64 idx = tmpl->kind == VN_MMAP_KIND_SPAN ? 0 : tmpl->idx[0];

	if (!m)
		return -ENOMEM;
	kref_init(&m->ref);
	kref_get(&vn->ref);
	m->vn = vn;
	vma->vm_pgoff = (VN_NTB_MMAP_OFFSET(tmpl->kind, idx) + within) >> PAGE_SHIFT;
	vma->vm_page_prot = prot;
	/* Device memory to the rest of the kernel: VFIO's type1 can map it for a device
	 * (VM_PFNMAP), nothing takes a reference on its pages.
	 */
	vn_vma_set_flags(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
	vma->vm_private_data = m;
	vma->vm_ops = &vn_vm_ops;
	return 0;
}

/* The target of one window or buffer @idx of @kind, at its generation now. */
static struct vn_map vn_map_one(u64 kind, u32 idx, u64 gen)
{
	struct vn_map m = { .kind = kind, .count = 1 };

	m.idx[0] = idx;
	m.gen[0] = gen;
	return m;
}

/* Whether @within and @len fit in @size bytes. */
static bool vn_fits(u64 within, u64 len, u64 size)
{
	return within <= size && len <= size - within;
}

int vn_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct vn_dev *vn = container_of(f->private_data, struct vn_dev, misc);
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	u64 kind = VN_MMAP_KIND(off), idx = VN_MMAP_INDEX(off), within = VN_MMAP_WITHIN(off);
	int ret = -EINVAL;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	mutex_lock(&vn->lock);
	if (vn->dead) {
		ret = -ENODEV;
	} else if (kind == VN_NTB_MMAP_OUT && idx < vn->peer_mw_count && vn->out[idx].size &&
		   vn_fits(within, len, vn->out[idx].size)) {
		/* The owner's own mappings: its message rings, memory. */
		struct vn_map m = vn_map_one(kind, idx, vn->out[idx].gen);

		ret = vn_map_setup(vn, vma, &m, within, pgprot_writecombine(vma->vm_page_prot));
	} else if (kind == VN_NTB_MMAP_IN && idx < vn->mw_count &&
		   vn->in[idx].kind == VN_IN_ALLOC && vn_fits(within, len, vn->in[idx].size)) {
		struct vn_map m = vn_map_one(kind, idx, vn->in[idx].gen);

		ret = vn_map_setup(vn, vma, &m, within, vma->vm_page_prot);
	}
	mutex_unlock(&vn->lock);
	return ret;
}

void vn_out_revoke(struct vn_dev *vn, u32 idx)
{
	vn->out[idx].gen++;
	unmap_mapping_range(vn->inode->i_mapping,
			    VN_NTB_MMAP_OFFSET(VN_NTB_MMAP_OUT, (u64)idx), VN_MMAP_SPAN, 1);
	/* Span mappings share one place: all of them go, and those of spans that do not
	 * hold @idx fault their pages back in.
	 */
	unmap_mapping_range(vn->inode->i_mapping, VN_NTB_MMAP_OFFSET(VN_MMAP_KIND_SPAN, 0ull),
			    VN_MMAP_SPAN, 1);
}

void vn_in_zap(struct vn_dev *vn, u32 idx)
{
	vn->in[idx].gen++;
	unmap_mapping_range(vn->inode->i_mapping,
			    VN_NTB_MMAP_OFFSET(VN_NTB_MMAP_IN, (u64)idx), VN_MMAP_SPAN, 1);
}

/* ---- window files (VN_NTB_MW_FD) ---------------------------------------- */

/* A window file: one window (VN_NTB_MW_FD) or a span of them, bound to their targets. */
struct vn_window_file {
	struct vn_map target;   /* the windows and their generations when it was made */
	u64 size;               /* bytes it maps from 0 */
	bool wc;
};

static int vn_window_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct vn_window_file *w = f->private_data;
	struct vn_dev *vn = w->target.vn;
	u64 within = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	int ret;

	if (!(vma->vm_flags & VM_SHARED) || vma->vm_pgoff >= (VN_MMAP_SPAN >> PAGE_SHIFT))
		return -EINVAL;
	mutex_lock(&vn->lock);
	if (!vn_map_live(vn, &w->target))
		ret = -ENODEV;
	else if (!vn_fits(within, len, w->size))
		ret = -EINVAL;
	else
		ret = vn_map_setup(vn, vma, &w->target, within,
				   w->wc ? pgprot_writecombine(vma->vm_page_prot)
					 : pgprot_noncached(vma->vm_page_prot));
	mutex_unlock(&vn->lock);
	return ret;
}

static int vn_window_release(struct inode *inode, struct file *f)
{
	struct vn_window_file *w = f->private_data;

	kref_put(&w->target.vn->ref, vn_free);
	kfree(w);
	return 0;
}

static const struct file_operations vn_window_fops = {
	.owner = THIS_MODULE,
	.mmap = vn_window_mmap,
	.release = vn_window_release,
	.llseek = noop_llseek,
};

bool vn_is_ours(const struct file *f)
{
	return f->f_op == &vn_fops || f->f_op == &vn_window_fops;
}

/* A new window file for @w (its targets checked and bound under vn->lock by the caller,
 * which found @ret), which takes it; the fd or -errno.
 */
static long vn_window_file_install(struct vn_dev *vn, struct vn_window_file *w, long ret)
{
	struct file *f;
	int fd;

	if (ret) {
		kfree(w);
		return ret;
	}
	/* The caller's open device file keeps @vn meanwhile. */
	kref_get(&vn->ref);
	w->target.vn = vn;
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

/* Outbound window @idx of @vn, under vn->lock: whether it can be a file's target. */
static bool vn_out_usable(struct vn_dev *vn, u32 idx)
{
	return idx < vn->peer_mw_count && vn->out[idx].size;
}

/* A new fd for outbound window @a->index alone, bound to its target now: what the daemon
 * hands a VM's QEMU.
 */
long vn_mw_fd(struct vn_dev *vn, struct vn_ntb_mw_fd *a)
{
	struct vn_window_file *w;
	long ret;

	if (a->argsz < sizeof(*a) || a->reserved || (a->flags & ~VN_NTB_MW_FD_WC))
		return -EINVAL;
	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return -ENOMEM;
	mutex_lock(&vn->lock);
	ret = vn->dead ? -ENODEV : !vn_out_usable(vn, a->index) ? -EINVAL : 0;
	if (!ret) {
		w->target = vn_map_one(VN_NTB_MMAP_OUT, a->index, vn->out[a->index].gen);
		w->size = vn->out[a->index].size;
		w->wc = a->flags & VN_NTB_MW_FD_WC;
	}
	mutex_unlock(&vn->lock);
	return vn_window_file_install(vn, w, ret);
}

/* A new fd for @a->count outbound windows as one memory of @a->chunk bytes per window:
 * what the daemon hands a VM's QEMU for a BAR larger than a window.
 */
long vn_mw_span_fd(struct vn_dev *vn, struct vn_ntb_mw_span_fd *a)
{
	struct vn_window_file *w;
	unsigned long seen = 0;
	long ret = 0;
	u32 k;

	if (a->argsz < sizeof(*a) || a->reserved || (a->flags & ~VN_NTB_MW_FD_WC) ||
	    a->count == 0 || a->count > VN_NTB_MAX_MWS || a->chunk == 0 ||
	    !PAGE_ALIGNED(a->chunk) || a->chunk > VN_MMAP_SPAN / a->count)
		return -EINVAL;
	for (k = 0; k < a->count; k++) {
		if (a->index[k] >= VN_NTB_MAX_MWS || (seen & BIT(a->index[k])))
			return -EINVAL;
		seen |= BIT(a->index[k]);
	}
	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return -ENOMEM;
	w->target.kind = VN_MMAP_KIND_SPAN;
	w->target.count = a->count;
	w->target.chunk = a->chunk;
	w->size = a->chunk * a->count;
	w->wc = a->flags & VN_NTB_MW_FD_WC;
	mutex_lock(&vn->lock);
	for (k = 0; !ret && k < a->count; k++) {
		u32 idx = a->index[k];

		if (vn->dead)
			ret = -ENODEV;
		else if (!vn_out_usable(vn, idx) || vn->out[idx].size < a->chunk)
			ret = -EINVAL;
		w->target.idx[k] = idx;
		w->target.gen[k] = vn->out[idx].gen;
	}
	mutex_unlock(&vn->lock);
	return vn_window_file_install(vn, w, ret);
}
