// SPDX-License-Identifier: GPL-2.0
/*
 * vfio_ntb: an NTB client that gives the host's vfio-ntbd its NTB device from userspace:
 * windows, doorbells, scratchpads and the link (vfio_ntb_uapi.h says what and how).
 *
 * It uses only Linux's NTB API, so it works over every NTB hardware driver Linux has.  One
 * peer (peer index 0): vfio-ntb joins hosts pairwise through each NTB port.
 *
 * This file: the NTB client, the character device and its calls, eventfds.  Inbound targets
 * are vn_inbound.c's, mappings and window files vn_mmap.c's; vn_dev.h has the locking and
 * lifetime rules they share.
 */
#include <linux/file.h>
#include <linux/module.h>
#include <linux/mount.h>
#include <linux/pci.h>
#include <linux/pseudo_fs.h>
#include <linux/slab.h>

#include "vn_dev.h"

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 8, 0)
#define vn_eventfd_signal(ctx) eventfd_signal(ctx)
#else
#define vn_eventfd_signal(ctx) eventfd_signal(ctx, 1)
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0) && LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
#error "vfio_ntb: Linux 6.10 and 6.11 (follow_pte without follow_pfnmap_start) are not supported"
#endif

/* The pseudo filesystem of window files and of vn->inode, mounted while the module is
 * loaded.  It has no owner: a mount of it must not keep the module from unloading (every
 * file of ours holds the module through its fops instead).
 */
struct vfsmount *vn_mnt;

static int vn_fs_init_fs_context(struct fs_context *fc)
{
	return init_pseudo(fc, VN_NTB_WINDOW_FS_MAGIC) ? 0 : -ENOMEM;
}

static struct file_system_type vn_fs_type = {
	.name = "vfio_ntb_window",
	.init_fs_context = vn_fs_init_fs_context,
	.kill_sb = kill_anon_super,
};

void vn_free(struct kref *ref)
{
	struct vn_dev *vn = container_of(ref, struct vn_dev, ref);

	if (vn->inode)
		iput(vn->inode);
	kfree(vn->stash);
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
		vn_keep_take(vn);
		ntb_db_clear_mask(vn->ntb, vn->db_valid);
	}
	mutex_unlock(&vn->lock);
	return ret;
}

/* Everything the owner set up goes: its translations, its doorbells (masked again, as the
 * device was before it opened it), its link.  Window files it handed out stay as they are
 * (a VM's QEMU reads all ones through a window whose link is down, rather than die of
 * SIGBUS) until the window is given a new target: the next owner revokes it first.
 */
void vn_teardown(struct vn_dev *vn, struct vn_charges *ch)
{
	u32 i;

	for (i = 0; i < vn->mw_count; i++)
		if (vn->in[i].kind != VN_IN_NONE)
			vn_in_clear(vn, i, ch);
	if (!vn->dead) {
		ntb_db_set_mask(vn->ntb, vn->db_valid);
		if (vn->link_enabled)
			ntb_link_disable(vn->ntb);
	}
	vn->link_enabled = false;
	vn_triggers_release(vn);
	vn_events_release(vn);
	vn_stash_clear(vn);
	vn->took_over = false;
}

static int vn_release(struct inode *inode, struct file *f)
{
	struct vn_dev *vn = vn_of(f);
	struct vn_charges ch = { 0 };

	mutex_lock(&vn->lock);
	if (!vn_keep_release(vn))
		vn_teardown(vn, &ch);
	vn->owner = NULL;
	mutex_unlock(&vn->lock);
	vn_charges_drop(&ch);
	kref_put(&vn->ref, vn_free);
	return 0;
}

static int vn_info(struct vn_dev *vn, struct vn_ntb_info *a)
{
	if (a->argsz < sizeof(*a))
		return -EINVAL;
	a->argsz = sizeof(*a);
	a->flags = ntb_link_is_up(vn->ntb, NULL, NULL) & BIT_ULL(VN_PIDX) ? VN_NTB_INFO_LINK_UP : 0;
	a->flags |= vn->took_over ? VN_NTB_INFO_KEPT : 0;
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
	 * before): zeros then, the outbound part still answered.
	 */
	if (idx < vn->mw_count &&
	    !ntb_mw_get_align(vn->ntb, VN_PIDX, idx, &addr_align, &size_align, &max)) {
		a->in_addr_align = addr_align;
		a->in_size_align = size_align;
		a->in_size_max = max;
	}
	if (idx < vn->mw_count) {
		/* A BAR that VFIO took away is no translation any more. */
		a->in_size = vn->in[idx].revoked ? 0 : vn->in[idx].size;
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
	struct vn_ntb_mw_fd mw_fd;
	struct vn_ntb_mw_span_fd span;
	struct vn_ntb_stash stash;
	__u64 u64;
	__u32 u32;
	__s32 s32;
};

static long vn_ioctl_locked(struct vn_dev *vn, unsigned int cmd, union vn_args *a,
			    struct vn_source *src, struct vn_charges *ch)
{
	switch (cmd) {
	case VN_NTB_INFO:
		return vn_info(vn, &a->info);
	case VN_NTB_MW_INFO:
		return vn_mw_info(vn, &a->mw_info);
	case VN_NTB_LINK:
	{
		int ret;

		if (a->u32 > 1)
			return -EINVAL;
		ret = a->u32 ? ntb_link_enable(vn->ntb, NTB_SPEED_AUTO, NTB_WIDTH_AUTO)
			     : ntb_link_disable(vn->ntb);
		if (!ret)
			vn->link_enabled = a->u32;
		return ret;
	}
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
	case VN_NTB_PEER_DB_EVENTFD:
		return vn_trigger_set(vn, &a->db_ev);
	case VN_NTB_DB_READ:
		a->u64 = ntb_db_read(vn->ntb) & vn->db_valid;
		return 0;
	case VN_NTB_MW_EXPORT:
		return vn_mw_export(vn, &a->exp, src, ch);
	case VN_NTB_MW_ALLOC:
		return vn_mw_alloc(vn, &a->alloc, ch);
	case VN_NTB_MW_CLEAR:
		return a->u32 < vn->mw_count ? vn_in_clear(vn, a->u32, ch) : -EINVAL;
	case VN_NTB_MW_REVOKE:
		if (a->u32 >= vn->peer_mw_count)
			return -EINVAL;
		vn_out_revoke(vn, a->u32);
		return 0;
	case VN_NTB_KEEP:
		return vn_keep_set(vn, a->u32);
	case VN_NTB_RESET:
		vn_teardown(vn, ch);
		return 0;
	default:
		return -ENOTTY;
	}
}

/* Whether @cmd is one of ours, as its number says (direction and size too): anything else,
 * the removed commands among them, is ENOTTY before its argument is looked at.
 */
static bool vn_known_cmd(unsigned int cmd)
{
	switch (cmd) {
	case VN_NTB_INFO:
	case VN_NTB_MW_INFO:
	case VN_NTB_LINK:
	case VN_NTB_LINK_EVENTFD:
	case VN_NTB_SPAD_READ:
	case VN_NTB_SPAD_WRITE:
	case VN_NTB_PEER_SPAD_READ:
	case VN_NTB_PEER_SPAD_WRITE:
	case VN_NTB_PEER_DB_SET:
	case VN_NTB_DB_EVENTFD:
	case VN_NTB_PEER_DB_EVENTFD:
	case VN_NTB_DB_READ:
	case VN_NTB_MW_EXPORT:
	case VN_NTB_MW_ALLOC:
	case VN_NTB_MW_CLEAR:
	case VN_NTB_MW_FD:
	case VN_NTB_MW_REVOKE:
	case VN_NTB_MW_SPAN_FD:
	case VN_NTB_KEEP:
	case VN_NTB_RESET:
	case VN_NTB_STASH_SET:
	case VN_NTB_STASH_GET:
		return true;
	default:
		return false;
	}
}

static long vn_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct vn_dev *vn = vn_of(f);
	void __user *uarg = (void __user *)arg;
	unsigned int size = _IOC_SIZE(cmd);
	struct vn_source src = { 0 };
	struct vn_charges ch = { 0 };
	union vn_args a;
	long ret;

	if (!vn_known_cmd(cmd) || size > sizeof(a))
		return -ENOTTY;
	memset(&a, 0, sizeof(a));
	if ((_IOC_DIR(cmd) & _IOC_WRITE) && copy_from_user(&a, uarg, size))
		return -EFAULT;
	if (cmd == VN_NTB_MW_EXPORT) {
		if (a.exp.reserved)
			return -EINVAL;
		/* Bound the size by the window's before pinning anything (checked again under
		 * the lock by vn_mw_export: the window may have changed meanwhile).
		 */
		mutex_lock(&vn->lock);
		ret = vn->dead ? -ENODEV : vn_in_check(vn, a.exp.index, a.exp.size);
		mutex_unlock(&vn->lock);
		if (ret)
			return ret;
		ret = vn_source_get(vn, &a.exp, &src);
		if (ret)
			return ret;
	}
	if (cmd == VN_NTB_MW_FD)
		return vn_mw_fd(vn, &a.mw_fd);
	if (cmd == VN_NTB_MW_SPAN_FD)
		return vn_mw_span_fd(vn, &a.span);
	if (cmd == VN_NTB_STASH_SET)
		return vn_stash_set(vn, &a.stash);
	if (cmd == VN_NTB_STASH_GET) {
		ret = vn_stash_get(vn, &a.stash);
		if (!ret && copy_to_user(uarg, &a, size))
			return -EFAULT;
		return ret;
	}
	mutex_lock(&vn->lock);
	ret = vn->dead ? -ENODEV : vn_ioctl_locked(vn, cmd, &a, &src, &ch);
	mutex_unlock(&vn->lock);
	/* What the window did not keep, and what it gave back: the caller's mmap_lock may be
	 * taken now.
	 */
	vn_source_release(&src);
	vn_charges_drop(&ch);
	if (!ret && (_IOC_DIR(cmd) & _IOC_READ) && copy_to_user(uarg, &a, size))
		return -EFAULT;
	return ret;
}

const struct file_operations vn_fops = {
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
	INIT_LIST_HEAD(&vn->triggers);
	vn_keep_init(vn);
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
	dev_info(&ntb->dev,
		 "vfio_ntb: /dev/%s: %u inbound and %u outbound windows, %u scratchpads, doorbells 0x%llx\n",
		 vn->nodename, vn->mw_count, vn->peer_mw_count, vn->spad_count, vn->db_valid);
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
	struct vn_charges ch = { 0 };
	u32 i;

	misc_deregister(&vn->misc);
	vn_keep_end(vn);
	mutex_lock(&vn->lock);
	for (i = 0; i < vn->mw_count; i++)
		if (vn->in[i].kind != VN_IN_NONE)
			vn_in_clear(vn, i, &ch);
	ntb_db_set_mask(ntb, vn->db_valid);
	if (vn->link_enabled)
		ntb_link_disable(ntb);
	vn->link_enabled = false;
	/* No doorbell rung from here on: the NTB device is going. */
	vn_triggers_release(vn);
	/* Every mapping goes now, the device file's and its windows' files', and faults from
	 * the next access on (SIGBUS): vn->dead is set first, under the lock faults take.
	 */
	vn->dead = true;
	unmap_mapping_range(vn->inode->i_mapping, 0, 0, 1);
	mutex_unlock(&vn->lock);
	vn_charges_drop(&ch);
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
 * inode of the filesystem is gone.
 */
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
