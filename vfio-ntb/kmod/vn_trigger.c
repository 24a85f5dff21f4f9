// SPDX-License-Identifier: GPL-2.0
/*
 * Peer doorbell triggers (VN_NTB_PEER_DB_EVENTFD): an eventfd whose every signal rings a
 * doorbell bit of the peer, in the kernel, as KVM's irqfd turns one into an interrupt.
 *
 * Why: a lent device's MSI-X vector is an eventfd that VFIO signals from its interrupt
 * handler.  Handed a trigger, the device's interrupt reaches the borrower host's doorbell
 * (whose own eventfd is the VM's irqfd there) without any process of either host waking
 * up: the interrupt path of a device lent over an NTB has no software of ours in it.
 *
 * Context: the wake-up runs wherever the eventfd is signalled (VFIO's hard interrupt
 * handler), under the eventfd's wait queue lock, so it only reads the count and rings the
 * doorbell (an MMIO write in every NTB driver Linux has).  A trigger goes when the owner
 * removes it, closes the device, or the device goes away: removing its wait queue entry
 * takes that lock, so no wake-up runs once it is gone.  Triggers are kept under vn->lock.
 */
#include <linux/file.h>
#include <linux/poll.h>
#include <linux/slab.h>

#include "vn_dev.h"

struct vn_trigger {
	struct list_head link;          /* in vn->triggers */
	struct vn_dev *vn;
	struct eventfd_ctx *ctx;
	u64 bits;
	wait_queue_entry_t wait;
	poll_table pt;
};

static int vn_trigger_wakeup(wait_queue_entry_t *wait, unsigned int mode, int sync, void *key)
{
	struct vn_trigger *t = container_of(wait, struct vn_trigger, wait);
	u64 count;

	if (key_to_poll(key) & EPOLLIN) {
		/* Signals that came together are one doorbell, as one MSI would be. */
		eventfd_ctx_do_read(t->ctx, &count);
		ntb_peer_db_set(t->vn->ntb, t->bits);
	}
	return 0;
}

static void vn_trigger_queue(struct file *file, wait_queue_head_t *wqh, poll_table *pt)
{
	struct vn_trigger *t = container_of(pt, struct vn_trigger, pt);

	add_wait_queue(wqh, &t->wait);
}

static void vn_trigger_free(struct vn_trigger *t)
{
	u64 count;

	eventfd_ctx_remove_wait_queue(t->ctx, &t->wait, &count);
	eventfd_ctx_put(t->ctx);
	list_del(&t->link);
	t->vn->ntriggers--;
	kfree(t);
}

static struct vn_trigger *vn_trigger_of(struct vn_dev *vn, u64 bits)
{
	struct vn_trigger *t;

	list_for_each_entry(t, &vn->triggers, link)
		if (t->bits == bits)
			return t;
	return NULL;
}

/* Under vn->lock: the trigger of @a->bits set to @a->fd, or removed (-1). */
int vn_trigger_set(struct vn_dev *vn, struct vn_ntb_db_eventfd *a)
{
	struct vn_trigger *t, *old = vn_trigger_of(vn, a->bits);
	struct file *file;
	__poll_t events;

	/* One bit: Linux's NTB drivers ring one doorbell per call (ntb_hw_epf the lowest). */
	if (a->reserved || !a->bits || hweight64(a->bits) != 1 || (a->bits & ~vn->db_valid))
		return -EINVAL;
	if (a->fd == -1) {
		if (!old)
			return -ENOENT;
		vn_trigger_free(old);
		return 0;
	}
	if (a->fd < 0)
		return -EINVAL;
	if (!old && vn->ntriggers >= VN_NTB_MAX_DB_EVENTFDS)
		return -ENOSPC;
	file = fget(a->fd);
	if (!file)
		return -EBADF;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t) {
		fput(file);
		return -ENOMEM;
	}
	t->ctx = eventfd_ctx_fileget(file);
	if (IS_ERR(t->ctx)) {
		fput(file);
		kfree(t);
		return -EINVAL;
	}
	if (old)
		vn_trigger_free(old);
	t->vn = vn;
	t->bits = a->bits;
	init_waitqueue_func_entry(&t->wait, vn_trigger_wakeup);
	init_poll_funcptr(&t->pt, vn_trigger_queue);
	list_add_tail(&t->link, &vn->triggers);
	vn->ntriggers++;
	events = vfs_poll(file, &t->pt);
	fput(file);
	/* Signalled before it was ours: that interrupt is not lost either. */
	if (events & EPOLLIN)
		ntb_peer_db_set(vn->ntb, t->bits);
	return 0;
}

/* Under vn->lock: every trigger goes (the owner closed the device, or it went away). */
void vn_triggers_release(struct vn_dev *vn)
{
	struct vn_trigger *t, *next;

	list_for_each_entry_safe(t, next, &vn->triggers, link)
		vn_trigger_free(t);
}
