// SPDX-License-Identifier: GPL-2.0
/*
 * ntb_mock: NTB hardware that is not there, for testing NTB clients (vfio_ntb) in a VM.
 *
 * It binds QEMU's ivshmem-plain (PCI 1af4:1110) and registers an ntb_dev through Linux's NTB
 * API with ops that loop back to this host:
 *   - two inbound windows, whose translations (mw_set_trans) are only recorded;
 *   - two outbound windows, each one half of the ivshmem's BAR 2 (memory of the host's
 *     backend file: real device memory for a client to map);
 *   - the link goes up at enable and down at disable, at once;
 *   - ringing the peer's doorbells rings our own; the peer's scratchpads are ours.
 * Link and doorbell events reach the client from a work item, as a real device's would from
 * its interrupt, never from inside the client's own call.
 *
 * debugfs, /sys/kernel/debug/ntb_mock/<PCI name>/ (read-only), shows what the client left:
 *   trans    one line per inbound window, "IDX ADDR SIZE" in hex ("IDX 0 0" when cleared)
 *   db_mask  the doorbell mask, hex
 *   link     0 or 1
 *
 * Removal is the PCI driver's unbind (and bind adds the device again), which tests repeat
 * thousands of times: remove unregisters the ntb_dev (the client's remove runs then), stops
 * the work item and frees everything of the device.
 */
#include <linux/bits.h>
#include <linux/debugfs.h>
#include <linux/module.h>
#include <linux/ntb.h>
#include <linux/pci.h>
#include <linux/seq_file.h>
#include <linux/sizes.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>

#define MOCK_MWS 2
#define MOCK_SPADS 16
#define MOCK_DB_VALID GENMASK_ULL(15, 0)
#define MOCK_ALIGN SZ_4K
#define MOCK_BAR 2

static unsigned long size_max = SZ_4M;
module_param(size_max, ulong, 0444);
MODULE_PARM_DESC(size_max, "largest inbound translation, bytes (default 4 MiB)");

static struct dentry *mock_debugfs_root;

struct mock_trans {
	dma_addr_t addr;
	resource_size_t size;
};

struct ntb_mock {
	struct ntb_dev ntb;
	struct work_struct event_work;
	struct dentry *debugfs;

	spinlock_t lock;		/* protects everything below */
	bool link_up;
	bool link_event;		/* a link change not yet told to the client */
	u64 db;
	u64 db_mask;
	u32 spad[MOCK_SPADS];
	struct mock_trans trans[MOCK_MWS];
};

static struct ntb_mock *to_mock(struct ntb_dev *ntb)
{
	return container_of(ntb, struct ntb_mock, ntb);
}

/* What a device's interrupt would do: tell the client of a link change, of doorbells. */
static void mock_event_work(struct work_struct *work)
{
	struct ntb_mock *m = container_of(work, struct ntb_mock, event_work);
	unsigned long flags;
	bool link, db;

	spin_lock_irqsave(&m->lock, flags);
	link = m->link_event;
	m->link_event = false;
	db = m->db & ~m->db_mask;
	spin_unlock_irqrestore(&m->lock, flags);
	if (link)
		ntb_link_event(&m->ntb);
	if (db)
		ntb_db_event(&m->ntb, 0);
}

static u64 mock_link_is_up(struct ntb_dev *ntb, enum ntb_speed *speed, enum ntb_width *width)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;
	bool up;

	spin_lock_irqsave(&m->lock, flags);
	up = m->link_up;
	spin_unlock_irqrestore(&m->lock, flags);
	if (speed)
		*speed = up ? NTB_SPEED_GEN3 : NTB_SPEED_NONE;
	if (width)
		*width = up ? NTB_WIDTH_4 : NTB_WIDTH_NONE;
	/* One bit per peer: ours is peer 0. */
	return up ? BIT_ULL(0) : 0;
}

static void mock_set_link(struct ntb_mock *m, bool up)
{
	unsigned long flags;

	spin_lock_irqsave(&m->lock, flags);
	if (m->link_up != up) {
		m->link_up = up;
		m->link_event = true;
	}
	spin_unlock_irqrestore(&m->lock, flags);
	schedule_work(&m->event_work);
}

static int mock_link_enable(struct ntb_dev *ntb, enum ntb_speed max_speed,
			    enum ntb_width max_width)
{
	mock_set_link(to_mock(ntb), true);
	return 0;
}

static int mock_link_disable(struct ntb_dev *ntb)
{
	mock_set_link(to_mock(ntb), false);
	return 0;
}

static int mock_mw_count(struct ntb_dev *ntb, int pidx)
{
	return pidx == 0 ? MOCK_MWS : -EINVAL;
}

static int mock_mw_get_align(struct ntb_dev *ntb, int pidx, int widx,
			     resource_size_t *addr_align, resource_size_t *size_align,
			     resource_size_t *max)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;
	bool up;

	if (pidx != 0 || widx < 0 || widx >= MOCK_MWS)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	up = m->link_up;
	spin_unlock_irqrestore(&m->lock, flags);
	/* As hardware whose peer sets the window's size (ntb_hw_epf, switchtec). */
	if (!up)
		return -ENOTCONN;
	if (addr_align)
		*addr_align = MOCK_ALIGN;
	if (size_align)
		*size_align = MOCK_ALIGN;
	if (max)
		*max = size_max;
	return 0;
}

static int mock_mw_set_trans(struct ntb_dev *ntb, int pidx, int widx, dma_addr_t addr,
			     resource_size_t size)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;

	if (pidx != 0 || widx < 0 || widx >= MOCK_MWS)
		return -EINVAL;
	if (!IS_ALIGNED(addr, MOCK_ALIGN) || !IS_ALIGNED(size, MOCK_ALIGN) || size > size_max)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	m->trans[widx].addr = addr;
	m->trans[widx].size = size;
	spin_unlock_irqrestore(&m->lock, flags);
	return 0;
}

static int mock_mw_clear_trans(struct ntb_dev *ntb, int pidx, int widx)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;

	if (pidx != 0 || widx < 0 || widx >= MOCK_MWS)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	m->trans[widx].addr = 0;
	m->trans[widx].size = 0;
	spin_unlock_irqrestore(&m->lock, flags);
	return 0;
}

static int mock_peer_mw_count(struct ntb_dev *ntb)
{
	return MOCK_MWS;
}

/* Outbound window @widx: half @widx of BAR 2. */
static int mock_peer_mw_get_addr(struct ntb_dev *ntb, int widx, phys_addr_t *base,
				 resource_size_t *size)
{
	resource_size_t half = pci_resource_len(ntb->pdev, MOCK_BAR) / MOCK_MWS;

	if (widx < 0 || widx >= MOCK_MWS)
		return -EINVAL;
	if (base)
		*base = pci_resource_start(ntb->pdev, MOCK_BAR) + widx * half;
	if (size)
		*size = half;
	return 0;
}

static u64 mock_db_valid_mask(struct ntb_dev *ntb)
{
	return MOCK_DB_VALID;
}

static u64 mock_db_read(struct ntb_dev *ntb)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;
	u64 db;

	spin_lock_irqsave(&m->lock, flags);
	db = m->db;
	spin_unlock_irqrestore(&m->lock, flags);
	return db;
}

static int mock_db_clear(struct ntb_dev *ntb, u64 bits)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;

	if (bits & ~MOCK_DB_VALID)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	m->db &= ~bits;
	spin_unlock_irqrestore(&m->lock, flags);
	return 0;
}

static int mock_db_set_mask(struct ntb_dev *ntb, u64 bits)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;

	if (bits & ~MOCK_DB_VALID)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	m->db_mask |= bits;
	spin_unlock_irqrestore(&m->lock, flags);
	return 0;
}

/* Unmasking bits that are set raises the interrupt they were held back from. */
static int mock_db_clear_mask(struct ntb_dev *ntb, u64 bits)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;
	bool pending;

	if (bits & ~MOCK_DB_VALID)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	m->db_mask &= ~bits;
	pending = m->db & ~m->db_mask;
	spin_unlock_irqrestore(&m->lock, flags);
	if (pending)
		schedule_work(&m->event_work);
	return 0;
}

/* The peer's doorbells are ours (loopback). */
static int mock_peer_db_set(struct ntb_dev *ntb, u64 bits)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;
	bool pending;

	if (bits & ~MOCK_DB_VALID)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	m->db |= bits;
	pending = m->db & ~m->db_mask;
	spin_unlock_irqrestore(&m->lock, flags);
	if (pending)
		schedule_work(&m->event_work);
	return 0;
}

static int mock_spad_count(struct ntb_dev *ntb)
{
	return MOCK_SPADS;
}

static u32 mock_spad_read(struct ntb_dev *ntb, int sidx)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;
	u32 val;

	if (sidx < 0 || sidx >= MOCK_SPADS)
		return 0;
	spin_lock_irqsave(&m->lock, flags);
	val = m->spad[sidx];
	spin_unlock_irqrestore(&m->lock, flags);
	return val;
}

static int mock_spad_write(struct ntb_dev *ntb, int sidx, u32 val)
{
	struct ntb_mock *m = to_mock(ntb);
	unsigned long flags;

	if (sidx < 0 || sidx >= MOCK_SPADS)
		return -EINVAL;
	spin_lock_irqsave(&m->lock, flags);
	m->spad[sidx] = val;
	spin_unlock_irqrestore(&m->lock, flags);
	return 0;
}

/* The peer's scratchpads are ours (loopback). */
static u32 mock_peer_spad_read(struct ntb_dev *ntb, int pidx, int sidx)
{
	return pidx == 0 ? mock_spad_read(ntb, sidx) : 0;
}

static int mock_peer_spad_write(struct ntb_dev *ntb, int pidx, int sidx, u32 val)
{
	return pidx == 0 ? mock_spad_write(ntb, sidx, val) : -EINVAL;
}

static const struct ntb_dev_ops mock_ops = {
	.link_is_up = mock_link_is_up,
	.link_enable = mock_link_enable,
	.link_disable = mock_link_disable,
	.mw_count = mock_mw_count,
	.mw_get_align = mock_mw_get_align,
	.mw_set_trans = mock_mw_set_trans,
	.mw_clear_trans = mock_mw_clear_trans,
	.peer_mw_count = mock_peer_mw_count,
	.peer_mw_get_addr = mock_peer_mw_get_addr,
	.db_valid_mask = mock_db_valid_mask,
	.db_read = mock_db_read,
	.db_clear = mock_db_clear,
	.db_set_mask = mock_db_set_mask,
	.db_clear_mask = mock_db_clear_mask,
	.peer_db_set = mock_peer_db_set,
	.spad_count = mock_spad_count,
	.spad_read = mock_spad_read,
	.spad_write = mock_spad_write,
	.peer_spad_read = mock_peer_spad_read,
	.peer_spad_write = mock_peer_spad_write,
};

static int trans_show(struct seq_file *s, void *unused)
{
	struct ntb_mock *m = s->private;
	struct mock_trans t[MOCK_MWS];
	unsigned long flags;
	int i;

	spin_lock_irqsave(&m->lock, flags);
	memcpy(t, m->trans, sizeof(t));
	spin_unlock_irqrestore(&m->lock, flags);
	for (i = 0; i < MOCK_MWS; i++)
		seq_printf(s, "%d %llx %llx\n", i, (u64)t[i].addr, (u64)t[i].size);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(trans);

static int db_mask_show(struct seq_file *s, void *unused)
{
	struct ntb_mock *m = s->private;
	unsigned long flags;
	u64 mask;

	spin_lock_irqsave(&m->lock, flags);
	mask = m->db_mask;
	spin_unlock_irqrestore(&m->lock, flags);
	seq_printf(s, "%llx\n", mask);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(db_mask);

static int link_show(struct seq_file *s, void *unused)
{
	struct ntb_mock *m = s->private;
	unsigned long flags;
	bool up;

	spin_lock_irqsave(&m->lock, flags);
	up = m->link_up;
	spin_unlock_irqrestore(&m->lock, flags);
	seq_printf(s, "%d\n", up);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(link);

static int mock_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct ntb_mock *m;
	int ret;

	if (!(pci_resource_flags(pdev, MOCK_BAR) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, MOCK_BAR) < MOCK_MWS * PAGE_SIZE) {
		dev_err(&pdev->dev, "BAR %d is no memory of at least %lu bytes\n", MOCK_BAR,
			MOCK_MWS * PAGE_SIZE);
		return -ENODEV;
	}
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	spin_lock_init(&m->lock);
	INIT_WORK(&m->event_work, mock_event_work);
	/* Doorbells start masked, as the hardware drivers leave them. */
	m->db_mask = MOCK_DB_VALID;

	ret = pci_enable_device(pdev);
	if (ret)
		goto err_free;
	ret = pci_request_region(pdev, MOCK_BAR, KBUILD_MODNAME);
	if (ret)
		goto err_disable;
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		goto err_release;
	pci_set_master(pdev);

	m->ntb.pdev = pdev;
	m->ntb.topo = NTB_TOPO_PRI;
	m->ntb.ops = &mock_ops;
	pci_set_drvdata(pdev, m);
	m->debugfs = debugfs_create_dir(pci_name(pdev), mock_debugfs_root);
	debugfs_create_file("trans", 0444, m->debugfs, m, &trans_fops);
	debugfs_create_file("db_mask", 0444, m->debugfs, m, &db_mask_fops);
	debugfs_create_file("link", 0444, m->debugfs, m, &link_fops);

	ret = ntb_register_device(&m->ntb);
	if (ret)
		goto err_debugfs;
	return 0;

err_debugfs:
	debugfs_remove_recursive(m->debugfs);
	pci_clear_master(pdev);
err_release:
	pci_release_region(pdev, MOCK_BAR);
err_disable:
	pci_disable_device(pdev);
err_free:
	kfree(m);
	return ret;
}

static void mock_remove(struct pci_dev *pdev)
{
	struct ntb_mock *m = pci_get_drvdata(pdev);

	/* The client's remove runs in here; it may still call our ops. */
	ntb_unregister_device(&m->ntb);
	/* No client now: a queued event is told to no one, and nothing queues another. */
	cancel_work_sync(&m->event_work);
	debugfs_remove_recursive(m->debugfs);
	pci_clear_master(pdev);
	pci_release_region(pdev, MOCK_BAR);
	pci_disable_device(pdev);
	kfree(m);
}

static const struct pci_device_id mock_ids[] = {
	{ PCI_DEVICE(PCI_VENDOR_ID_REDHAT_QUMRANET, 0x1110) },	/* ivshmem */
	{ }
};
MODULE_DEVICE_TABLE(pci, mock_ids);

static struct pci_driver mock_driver = {
	.name = KBUILD_MODNAME,
	.id_table = mock_ids,
	.probe = mock_probe,
	.remove = mock_remove,
};

static int __init mock_init(void)
{
	int ret;

	mock_debugfs_root = debugfs_create_dir(KBUILD_MODNAME, NULL);
	ret = pci_register_driver(&mock_driver);
	if (ret)
		debugfs_remove_recursive(mock_debugfs_root);
	return ret;
}
module_init(mock_init);

static void __exit mock_exit(void)
{
	pci_unregister_driver(&mock_driver);
	debugfs_remove_recursive(mock_debugfs_root);
}
module_exit(mock_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Mock NTB hardware on QEMU's ivshmem, for testing NTB clients");
