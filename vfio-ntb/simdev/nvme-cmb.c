/*
 * The Controller Memory Buffer of the simulated NVMe controller (NVMe 1.4
 * 4.7, registers 3.1.11 CMBLOC and 3.1.12 CMBSZ): memory of our own in a
 * BAR, which the host may use for the data of its commands and which Linux
 * publishes as p2pmem, a target other devices DMA into.
 *
 * Its bytes are a memfd the vfio-user client maps (pcidev.c), so the guest's
 * loads and stores and a peer device's DMA reach them without us.  Here:
 * the sizes we offer and the registers that describe it.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "nvme-int.h"

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
