// SPDX-License-Identifier: GPL-2.0
/*
 * Keeping an owner's state for its successor (VN_NTB_KEEP, VN_NTB_RESET, VN_NTB_STASH_*).
 *
 * Why: everything vfio-ntbd sets up on an adapter (the translations behind the peer's
 * windows, the eventfds its doorbells signal, the triggers that ring the peer's) belongs to
 * the open file, and goes when the file closes.  Lent devices' DMA and interrupts run
 * through it with no process in the way, and the workers that serve them outlive the
 * daemon; a daemon that restarts (an upgrade, a crash and systemd's restart) must not take
 * their data paths down on the way.  So an owner may ask that its state outlive the file
 * for a while: the next open takes it over as it is, with the owner's stash (what the
 * successor needs to know of it, opaque here); if nobody opens the device in time, it is
 * torn down as a close would have.
 *
 * Lifetime: a kept state holds a reference on the device and on the module (no file does
 * meanwhile), dropped by whoever ends the wait: the open that takes it over (when it
 * cancels the work in time), the work once it ran, or the device's removal.
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "vn_dev.h"

static void vn_keep_put(struct vn_dev *vn)
{
	module_put(THIS_MODULE);
	kref_put(&vn->ref, vn_free);
}

/* Nobody took it over in time. */
static void vn_keep_expired(struct work_struct *work)
{
	struct vn_dev *vn = container_of(to_delayed_work(work), struct vn_dev, keep_work);
	struct vn_charges ch = { 0 };
	bool expired;

	mutex_lock(&vn->lock);
	expired = vn->kept;
	if (expired) {
		vn->kept = false;
		vn_teardown(vn, &ch);
	}
	mutex_unlock(&vn->lock);
	vn_charges_drop(&ch);
	if (expired)
		dev_info(&vn->ntb->dev, "vfio_ntb: state kept for the next owner expired\n");
	vn_keep_put(vn);
}

void vn_keep_init(struct vn_dev *vn)
{
	INIT_DELAYED_WORK(&vn->keep_work, vn_keep_expired);
}

bool vn_keep_release(struct vn_dev *vn)
{
	if (!vn->keep_ms || vn->dead)
		return false;
	vn->kept = true;
	__module_get(THIS_MODULE);
	kref_get(&vn->ref);
	schedule_delayed_work(&vn->keep_work, msecs_to_jiffies(vn->keep_ms));
	return true;
}

void vn_keep_take(struct vn_dev *vn)
{
	vn->keep_ms = 0;
	vn->took_over = vn->kept;
	if (!vn->kept)
		return;
	vn->kept = false;
	/* A work already running waits for vn->lock, finds nothing kept and only puts. */
	if (cancel_delayed_work(&vn->keep_work))
		vn_keep_put(vn);        /* not the last reference: the open holds one */
}

void vn_keep_end(struct vn_dev *vn)
{
	mutex_lock(&vn->lock);
	vn->kept = false;
	mutex_unlock(&vn->lock);
	if (cancel_delayed_work_sync(&vn->keep_work))
		vn_keep_put(vn);
}

int vn_keep_set(struct vn_dev *vn, u32 ms)
{
	if (ms > VN_NTB_MAX_KEEP_MS)
		return -EINVAL;
	vn->keep_ms = ms;
	return 0;
}

/* ---- the stash ----------------------------------------------------------- */

long vn_stash_set(struct vn_dev *vn, const struct vn_ntb_stash *a)
{
	void *buf = NULL, *old;

	if (a->reserved || a->len > VN_NTB_MAX_STASH)
		return -EINVAL;
	if (a->len) {
		buf = memdup_user(u64_to_user_ptr(a->addr), a->len);
		if (IS_ERR(buf))
			return PTR_ERR(buf);
	}
	mutex_lock(&vn->lock);
	if (vn->dead) {
		mutex_unlock(&vn->lock);
		kfree(buf);
		return -ENODEV;
	}
	old = vn->stash;
	vn->stash = buf;
	vn->stash_len = a->len;
	mutex_unlock(&vn->lock);
	kfree(old);
	return 0;
}

long vn_stash_get(struct vn_dev *vn, struct vn_ntb_stash *a)
{
	void *buf;
	u32 len;

	if (a->reserved)
		return -EINVAL;
	buf = kmalloc(VN_NTB_MAX_STASH, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	mutex_lock(&vn->lock);
	len = vn->stash_len;
	if (len)
		memcpy(buf, vn->stash, len);
	mutex_unlock(&vn->lock);
	if (len > a->len) {
		kfree(buf);
		return -ENOSPC;
	}
	if (len && copy_to_user(u64_to_user_ptr(a->addr), buf, len)) {
		kfree(buf);
		return -EFAULT;
	}
	kfree(buf);
	a->len = len;
	return 0;
}

void vn_stash_clear(struct vn_dev *vn)
{
	kfree(vn->stash);
	vn->stash = NULL;
	vn->stash_len = 0;
}
