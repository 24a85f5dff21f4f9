/*
 * The Controller Memory Buffer of the simulated NVMe controller (NVMe 1.4
 * 4.7, registers 3.1.11 CMBLOC and 3.1.12 CMBSZ): memory of our own in a
 * BAR, which the host may use for the data of its commands and which Linux
 * publishes as p2pmem, a target other devices DMA into.
 *
 * Its bytes are a memfd the vfio-user client maps (pcidev.c), so the guest's
 * loads and stores and a peer device's DMA reach them without us.  What is
 * ours to do is the other direction: a data pointer (PRP entry or PRP list,
 * 4.3) whose bus address falls inside the CMB refers to the CMB, not to host
 * memory, and a real controller serves it from its own memory without going
 * out on the link.  We do the same: such an address never goes through the
 * DMA table, where QEMU records its guest's BARs without memory (an access
 * there would fail) or through a path back to us.
 *
 * Which bus address: CAP.CMBS is 0 (nvme.c), so the host does not tell us in
 * CMBMSC; the CMB is where the host put BAR VN_NVME_CMB_BAR, as with NVMe
 * 1.3 controllers, and only while the function decodes memory (PCI 3.0
 * 6.2.2: with Memory Space Enable clear it claims no address).
 *
 * Runs in the engine thread with the controller lock held, like nvme-io.c.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "nvme-int.h"

#include <errno.h>
#include <string.h>

bool vn_nvme_cmb_mib_valid(int64_t mib)
{
    return mib == 0 ||
           (mib >= VN_NVME_MIN_CMB_MIB && mib <= VN_NVME_MAX_CMB_MIB && (mib & (mib - 1)) == 0);
}

void vn_nvme_cmb_setup(VnNvme *n)
{
    if (n->cmb == NULL) {
        /* 3.1.11/3.1.12: no CMB, both registers read 0. */
        n->cmbloc = 0;
        n->cmbsz = 0;
        return;
    }
    /* The CMB is all of its BAR (OFST 0).  CMBLOC bits 8:3 (what NVMe 1.4
     * lets a controller say about mixing CMB and host memory in a command
     * or queue) stay 0: we promise nothing there, though a command whose
     * data pointers mix the two works. */
    n->cmbloc = VN_NVME_CMBLOC_BIR(VN_NVME_CMB_BAR);
    /* Read data (RDS) and write data (WDS) only: what Linux requires to
     * publish the CMB as p2pmem (nvme_map_cmb()).  No SQS/CQS: queues stay
     * in host memory, where we fetch and post with the DMA table; no LISTS:
     * the host keeps PRP lists in host memory (we read one from the CMB
     * anyway, it costs nothing). */
    n->cmbsz = VN_NVME_CMBSZ_RDS | VN_NVME_CMBSZ_WDS | VN_NVME_CMBSZ_SZU_1M |
               VN_NVME_CMBSZ_SZ(n->cmb_size >> 20);
}

/* The CMB's bus address now, or false when the host cannot address it:
 * memory decoding off, or the BAR not assigned yet (0, its reset value). */
static bool cmb_base(VnNvme *n, uint64_t *base)
{
    if (n->cmb == NULL || !vn_pcicfg_mem_enabled(n->cfg)) {
        return false;
    }
    *base = vn_pcicfg_bar_addr(n->cfg, VN_NVME_CMB_BAR);
    return *base != 0;
}

int vn_nvme_cmb_find(VnNvme *n, uint64_t addr, uint64_t len, uint8_t **host)
{
    uint64_t base;

    if (!cmb_base(n, &base) || len == 0) {
        return 0; /* host memory: the DMA table has the last word */
    }
    if (addr + len < addr) {
        return -EFAULT; /* wraps: no memory is there */
    }
    /* base + size is never formed: a BAR may end at 2^64. */
    if (addr >= base && addr - base < n->cmb_size) {
        if (len > n->cmb_size - (addr - base)) {
            return -EFAULT; /* runs past the CMB's end */
        }
        *host = n->cmb + (addr - base);
        return 1;
    }
    if (addr < base && base - addr < len) {
        return -EFAULT; /* runs into the CMB from below */
    }
    return 0;
}

int vn_nvme_cmb_read(VnNvme *n, uint64_t addr, void *buf, size_t len)
{
    uint8_t *host = NULL;
    int r = vn_nvme_cmb_find(n, addr, len, &host);

    if (r < 0) {
        return r;
    }
    if (r == 0) {
        return vn_dma_read(n->dma, addr, buf, len);
    }
    memcpy(buf, host, len);
    return 0;
}

int vn_nvme_cmb_write(VnNvme *n, uint64_t addr, const void *buf, size_t len)
{
    uint8_t *host = NULL;
    int r = vn_nvme_cmb_find(n, addr, len, &host);

    if (r < 0) {
        return r;
    }
    if (r == 0) {
        return vn_dma_write(n->dma, addr, buf, len);
    }
    memcpy(host, buf, len);
    return 0;
}

int vn_nvme_cmb_iov(VnNvme *n, const VnNvmeSeg *segs, unsigned count, struct iovec *iov,
                    unsigned max_iov)
{
    unsigned inside = 0;

    for (unsigned i = 0; i < count; i++) {
        uint8_t *host = NULL;
        int r = vn_nvme_cmb_find(n, segs[i].iova, segs[i].len, &host);

        if (r < 0) {
            return r;
        }
        if (r == 1 && inside < max_iov) {
            iov[inside] = (struct iovec){ .iov_base = host, .iov_len = segs[i].len };
        }
        inside += (unsigned)r;
    }
    if (inside == 0) {
        return 0;
    }
    /* Mixed: the caller's bounce buffer copies each piece from its place. */
    return inside == count && count <= max_iov ? (int)count : -E2BIG;
}
