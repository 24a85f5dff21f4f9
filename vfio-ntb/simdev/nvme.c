/*
 * Simulated NVMe controller: registers, the CC/CSTS state machine, queues,
 * completions and interrupts (see nvme.h; commands are in nvme-admin.c and
 * nvme-io.c).
 *
 * BAR0 is memory the guest writes without telling us, so each poll pass
 * reads CC and the doorbells, compares them with what it acted on last, and
 * puts back the registers the guest may not change (CAP, VS, CSTS).  All
 * of it is 32-bit atomic loads and stores: the vCPU writes the same words.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "nvme-int.h"

#include "common/util.h"
#include "trace-simdev.h"

#include <errno.h>
#include <linux/vfio.h>
#include <string.h>
#include <unistd.h>

/* NVMe 1.4 3.1.1: CAP.  MQES (0's based), CQR = 1 (queues must be
 * physically contiguous: we do not walk PRP lists for queues), TO in 500 ms
 * units, DSTRD = 0, CSS bit 37 = NVM command set, MPSMIN = MPSMAX = 0
 * (4 KiB pages only), no NSSR, no boot partitions, no PMR.  CMBS (bit 57)
 * is 0 even with a CMB: set, it would say we implement CMBMSC (3.1.13), and
 * the host would have to enable the CMB there and tell us its address
 * before CMBLOC/CMBSZ read anything.  Clear, CMBLOC/CMBSZ describe the CMB
 * from the start and it lives at the address the host gave its BAR, as in
 * NVMe 1.3 (Linux's nvme_map_cmb() writes CMBMSC only when CMBS is set;
 * QEMU's nvme does the same with legacy-cmb=on). */
#define CAP_TO 20u /* 10 s: the longest we take to set CSTS.RDY */
static const uint64_t cap_value =
    (uint64_t)VN_NVME_MQES | (1ull << 16) | ((uint64_t)CAP_TO << 24) | (1ull << 37);
/* 3.1.2: VS 1.4.0 */
#define VS_VALUE 0x00010400u

static void reg_assert(VnNvme *n, uint32_t off, uint32_t val)
{
    /* Store only when the guest changed it: a store dirties a cache line
     * the vCPU reads in its own polling loops. */
    if (vn_nvme_reg_load(n, off) != val) {
        vn_nvme_reg_store(n, off, val);
    }
}

/* The read-only registers that are not zero (or may not be): CAP, VS,
 * CMBLOC and CMBSZ (3.1.11/3.1.12: RO; 0 without a CMB). */
static void regs_fixed(VnNvme *n)
{
    reg_assert(n, VN_NVME_REG_CAP, (uint32_t)cap_value);
    reg_assert(n, VN_NVME_REG_CAP + 4, (uint32_t)(cap_value >> 32));
    reg_assert(n, VN_NVME_REG_VS, VS_VALUE);
    reg_assert(n, VN_NVME_REG_CMBLOC, n->cmbloc);
    reg_assert(n, VN_NVME_REG_CMBSZ, n->cmbsz);
}

static uint64_t reg_load64(VnNvme *n, uint32_t off)
{
    return vn_nvme_reg_load(n, off) | (uint64_t)vn_nvme_reg_load(n, off + 4) << 32;
}

void vn_nvme_fatal(VnNvme *n, const char *why)
{
    if (!n->fatal) {
        g_info("device nvme %s: controller fatal status: %s", n->serial, why);
    }
    n->fatal = true;
    n->csts |= VN_NVME_CSTS_CFS;
    vn_nvme_reg_store(n, VN_NVME_REG_CSTS, n->csts);
}

/* Zero the doorbells of every queue: after a reset the host starts again
 * at 0, and old tails left in the shared page would otherwise look like
 * new commands (TESTBED: "zero its doorbells when disabled"). */
static void doorbells_zero(VnNvme *n)
{
    for (uint32_t off = VN_NVME_REG_DBS; off < VN_NVME_BAR0_SIZE; off += 4) {
        reg_assert(n, off, 0);
    }
}

/*
 * Controller Level Reset (NVMe 1.4 7.3.2): stop processing, delete every
 * I/O queue, reset the admin queues, drop held commands; AQA, ASQ and ACQ
 * keep their values (they are host-written BAR0 memory we leave alone).
 * The CMB's contents are kept: neither 7.3.2 nor 4.7 says a reset clears
 * them (QEMU's nvme keeps them too), and as p2pmem they may be another
 * device's buffer, which has nothing to do with our queues.
 */
static void ctrl_reset(VnNvme *n)
{
    memset(n->sq, 0, sizeof(n->sq));
    memset(n->cq, 0, sizeof(n->cq));
    n->enabled = false;
    n->fatal = false;
    n->intms = 0;
    n->ioq_granted = n->params.io_queues;
    n->csts &= ~(VN_NVME_CSTS_RDY | VN_NVME_CSTS_CFS);
    vn_nvme_admin_reset(n);
    doorbells_zero(n);
}

static bool aqa_ok(uint32_t aqa, uint64_t asq, uint64_t acq, uint32_t cc, const char **why)
{
    /* 3.1.8: ASQS/ACQS are 0's based and at least 2 entries;
     * 3.1.9/3.1.10: the bases are page aligned (bits 11:0 reserved). */
    if ((aqa & 0xfff) < 1 || ((aqa >> 16) & 0xfff) < 1) {
        *why = "admin queue size below 2 entries";
    } else if (asq == 0 || acq == 0 || (asq & (VN_NVME_PAGE_SIZE - 1)) ||
               (acq & (VN_NVME_PAGE_SIZE - 1))) {
        *why = "admin queue base not page aligned";
    } else if (VN_NVME_CC_CSS(cc) != 0) {
        *why = "CC.CSS is not the NVM command set";
    } else if (VN_NVME_CC_MPS(cc) != 0) {
        *why = "CC.MPS is not 4 KiB";
    } else if (VN_NVME_CC_AMS(cc) != 0) {
        *why = "CC.AMS is not round robin";
    } else {
        return true;
    }
    return false;
}

/* CC.EN 0 -> 1 (7.6.1): take the admin queue from AQA/ASQ/ACQ, set RDY. */
static void ctrl_enable(VnNvme *n, uint32_t cc)
{
    uint32_t aqa = vn_nvme_reg_load(n, VN_NVME_REG_AQA);
    uint64_t asq = reg_load64(n, VN_NVME_REG_ASQ);
    uint64_t acq = reg_load64(n, VN_NVME_REG_ACQ);
    const char *why = NULL;

    if (!aqa_ok(aqa, asq, acq, cc, &why)) {
        /* The host waits for RDY, times out after CAP.TO and resets us. */
        vn_nvme_fatal(n, why);
        return;
    }
    n->sq[0] = (VnNvmeSq){ .valid = true, .cqid = 0, .size = (aqa & 0xfff) + 1, .base = asq };
    n->cq[0] = (VnNvmeCq){ .valid = true,
                           .ien = true,
                           .phase = true,
                           .vector = 0,
                           .size = ((aqa >> 16) & 0xfff) + 1,
                           .nsq = 1,
                           .base = acq };
    n->enabled = true;
    n->csts |= VN_NVME_CSTS_RDY;
    n->stats.enables++;
    g_info("device nvme %s: enabled, admin queues %u/%u entries", n->serial, n->sq[0].size,
           n->cq[0].size);
}

static void cc_changed(VnNvme *n, uint32_t old, uint32_t cc)
{
    trace_nvme_cc(n->serial, old, cc);
    if (!(old & VN_NVME_CC_EN) && (cc & VN_NVME_CC_EN)) {
        ctrl_enable(n, cc);
    } else if ((old & VN_NVME_CC_EN) && !(cc & VN_NVME_CC_EN)) {
        ctrl_reset(n);
        g_info("device nvme %s: disabled", n->serial);
    }
    /* 7.6.2: a normal or abrupt shutdown.  Our data is written through to
     * the file, so shutting down is one fdatasync; SHST goes straight to
     * "complete" (10b) and back to 0 when the host clears SHN. */
    if (VN_NVME_CC_SHN(cc) != 0 && VN_NVME_CC_SHN(old) == 0) {
        if (fdatasync(n->fd) < 0) {
            int err = errno;

            g_warning("device nvme %s: shutdown: fdatasync: %s", n->serial, g_strerror(err));
        }
        n->csts = (n->csts & ~(3u << 2)) | VN_NVME_CSTS_SHST_DONE;
        g_info("device nvme %s: shutdown complete", n->serial);
    } else if (VN_NVME_CC_SHN(cc) == 0 && VN_NVME_CC_SHN(old) != 0) {
        n->csts &= ~(3u << 2);
    }
}

/*
 * The MSI vector of a CQ's IV: PCI 3.0 6.8.3.4 lets the function modify
 * only the low log2(enabled) bits of the message data, so with fewer
 * vectors enabled than IVs in use, IVs share them (NVMe 1.4 7.5.1.2).
 */
static uint32_t msi_vector(VnNvme *n, const VnNvmeCq *cq)
{
    return cq->vector & (vn_pcicfg_msi_vectors(n->cfg) - 1);
}

/* NVMe 1.4 3.1.3: with MSI, INTMS bit N masks vector N; with pin-based
 * interrupts bit 0 masks INTx (with MSI-X the register is undefined: bit
 * 0, as before). */
static uint32_t intm_bit(VnNvme *n, const VnNvmeCq *cq)
{
    return vn_pcicfg_msi_enabled(n->cfg) ? 1u << msi_vector(n, cq) : 1u;
}

/* Send the messages the host held back with MSI mask bits and has since
 * unmasked (PCI 3.0 6.8.3.5); pcidev kicks us after every config write. */
static void msi_release(VnNvme *n)
{
    uint32_t released;

    if (!vn_pcicfg_msi_enabled(n->cfg)) {
        return;
    }
    released = vn_pcicfg_msi_take_released(n->cfg);
    while (released != 0) {
        uint32_t v = (uint32_t)g_bit_nth_lsf(released, -1);

        released &= released - 1;
        vn_irqs_signal(n->irqs, VFIO_PCI_MSI_IRQ_INDEX, v);
    }
}

/* Raise the interrupt of @cq (7.5: MSI vector, MSI-X vector IV, or INTx). */
static void irq_raise(VnNvme *n, VnNvmeCq *cq)
{
    if (!cq->ien) {
        return;
    }
    n->stats.irqs++;
    if (vn_pcicfg_msi_enabled(n->cfg)) {
        uint32_t v = msi_vector(n, cq);

        /* A CQ left with unread entries is notified again on INTMC. */
        if (n->intms & (1u << v)) {
            return;
        }
        /* QEMU emulates MSI (and its masks) itself and signals the guest
         * from our eventfd; our own mask bits are what it wrote through. */
        if (!vn_pcicfg_msi_hold(n->cfg, v)) {
            vn_irqs_signal(n->irqs, VFIO_PCI_MSI_IRQ_INDEX, v);
        }
        return;
    }
    if (vn_pcicfg_msix_enabled(n->cfg)) {
        /* The vfio-user client emulates the MSI-X table and its masks
         * (function mask included) and applies them to our eventfd
         * signals, so the device does not filter here; with no eventfd
         * assigned, vn_irqs_signal() does nothing. */
        vn_irqs_signal(n->irqs, VFIO_PCI_MSIX_IRQ_INDEX, cq->vector);
        return;
    }
    /* Pin-based: one interrupt for every queue, masked by INTMS bit 0
     * (3.1.3) and by the command register's Interrupt Disable. */
    if (vn_pcicfg_intx_disabled(n->cfg) || (n->intms & 1)) {
        return;
    }
    vn_irqs_signal(n->irqs, VFIO_PCI_INTX_IRQ_INDEX, 0);
}

/*
 * INTMS/INTMC (3.1.3/3.1.4) are "write 1 to set/clear" registers, but in
 * shared memory a write only leaves a value behind.  INTMS shows the mask:
 * a value other than the mask is a write, whose bits are set.  INTMC is
 * kept 0: any non-zero value is a write, whose bits are cleared (so INTMC
 * reads 0, not the mask: the one deviation).  A compare-and-swap keeps a
 * write that races ours for the next pass.  Bit 0 masks INTx, bit N MSI
 * vector N.  Linux never uses them with MSI-X, which 3.1.3 says is
 * undefined anyway.
 */
static bool intm_poll(VnNvme *n)
{
    uint32_t *ms = (uint32_t *)(void *)(n->bar0 + VN_NVME_REG_INTMS);
    uint32_t *mc = (uint32_t *)(void *)(n->bar0 + VN_NVME_REG_INTMC);
    uint32_t v = __atomic_load_n(ms, __ATOMIC_ACQUIRE);
    uint32_t c = __atomic_load_n(mc, __ATOMIC_ACQUIRE);
    bool busy = false;

    if (v != n->intms) {
        uint32_t want = n->intms | v;

        if (__atomic_compare_exchange_n(ms, &v, want, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            n->intms = want;
        }
        busy = true;
    }
    if (c != 0) {
        if (__atomic_compare_exchange_n(mc, &c, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            uint32_t cleared = n->intms & c;

            n->intms &= ~c;
            vn_nvme_reg_store(n, VN_NVME_REG_INTMS, n->intms);
            /* Unmasked with completions still unread: INTx is a level, so
             * it asserts again; an MSI vector sends the message it held
             * back (7.5.1.1/7.5.1.2). */
            if (cleared != 0 && n->enabled) {
                for (unsigned q = 0; q < VN_NVME_MAX_QUEUES; q++) {
                    VnNvmeCq *cq = &n->cq[q];

                    if (cq->valid && cq->head != cq->tail && (cleared & intm_bit(n, cq))) {
                        cq->notify = true;
                    }
                }
            }
        }
        busy = true;
    }
    return busy;
}

/* Registers: keep the read-only ones, react to CC. */
static bool regs_poll(VnNvme *n)
{
    uint32_t cc;
    bool busy;

    regs_fixed(n);
    reg_assert(n, VN_NVME_REG_NSSR, 0);
    busy = intm_poll(n);
    cc = vn_nvme_reg_load(n, VN_NVME_REG_CC);
    if (cc != n->cc) {
        uint32_t old = n->cc;

        n->cc = cc;
        cc_changed(n, old, cc);
        busy = true;
    }
    reg_assert(n, VN_NVME_REG_CSTS, n->csts);
    return busy;
}

static bool cq_full(const VnNvmeCq *cq)
{
    return (cq->tail + 1) % cq->size == cq->head;
}

/* Take the host's new CQ head (4.1: an out-of-range value is an invalid
 * doorbell write, which we ignore and report once). */
static bool cq_update_head(VnNvme *n, uint16_t qid)
{
    VnNvmeCq *cq = &n->cq[qid];
    uint32_t head = vn_nvme_reg_load(n, vn_nvme_db_cq(qid));

    if (head == cq->head) {
        return false;
    }
    if (head >= cq->size) {
        if (!cq->bad_db_logged) {
            g_info("device nvme %s: CQ %u head doorbell %u beyond %u entries", n->serial, qid, head,
                   cq->size);
            cq->bad_db_logged = true;
        }
        return false;
    }
    cq->head = head;
    return true;
}

/* Post a completion (4.6): all but the last dword first, then the dword
 * with the phase tag, so the host never sees a new phase with old data. */
static void cq_post(VnNvme *n, VnNvmeCq *cq, uint16_t sqid, const VnNvmeSqe *cmd, uint16_t status,
                    uint32_t result)
{
    VnNvmeCqe cqe = {
        .result = result,
        .sq_head = (uint16_t)n->sq[sqid].head,
        .sq_id = sqid,
        .cid = cmd->cid,
    };
    uint64_t at = cq->base + ((uint64_t)cq->tail << VN_NVME_CQE_SHIFT);

    if (status != VN_NVME_SUCCESS) {
        /* Our errors are deterministic: a retry would fail the same way. */
        status |= VN_NVME_DNR;
        n->stats.errors++;
        trace_nvme_cmd_done(n->serial, sqid, cmd->cid, cmd->opcode, status);
    }
    cqe.status = (uint16_t)(status << 1) | (cq->phase ? 1 : 0);
    if (vn_dma_write(n->dma, at, &cqe, offsetof(VnNvmeCqe, cid)) < 0) {
        vn_nvme_fatal(n, "completion queue outside guest memory");
        return;
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    if (vn_dma_write(n->dma, at + offsetof(VnNvmeCqe, cid), &cqe.cid, 4) < 0) {
        vn_nvme_fatal(n, "completion queue outside guest memory");
        return;
    }
    cq->tail++;
    if (cq->tail == cq->size) {
        cq->tail = 0;
        cq->phase = !cq->phase;
    }
    cq->notify = true;
}

/* Execute up to VN_NVME_SQ_BUDGET commands of SQ @qid. */
static bool sq_run(VnNvme *n, uint16_t qid)
{
    VnNvmeSq *sq = &n->sq[qid];
    VnNvmeCq *cq = &n->cq[sq->cqid];
    uint32_t tail = vn_nvme_reg_load(n, vn_nvme_db_sq(qid));
    bool busy = false;

    if (tail >= sq->size) {
        if (!sq->bad_db_logged) {
            g_info("device nvme %s: SQ %u tail doorbell %u beyond %u entries", n->serial, qid, tail,
                   sq->size);
            sq->bad_db_logged = true;
        }
        return false;
    }
    for (unsigned i = 0; i < VN_NVME_SQ_BUDGET && sq->head != tail; i++) {
        VnNvmeSqe cmd;
        uint32_t result = 0;
        uint16_t status;

        /* 4.1: never overrun the host's CQ; wait for its head to move. */
        if (cq_full(cq) && !(cq_update_head(n, sq->cqid) && !cq_full(cq))) {
            break;
        }
        if (vn_dma_read(n->dma, sq->base + ((uint64_t)sq->head << VN_NVME_SQE_SHIFT), &cmd,
                        sizeof(cmd)) < 0) {
            vn_nvme_fatal(n, "submission queue outside guest memory");
            return true;
        }
        sq->head = (sq->head + 1) % sq->size;
        busy = true;
        status =
            qid == 0 ? vn_nvme_admin_exec(n, &cmd, &result) : vn_nvme_io_exec(n, &cmd, &result);
        if (status != VN_NVME_DEFERRED) {
            cq_post(n, cq, qid, &cmd, status, result);
        }
        /* An admin command may have deleted this very queue or its CQ
         * (never queue 0), or a DMA failure made us fatal. */
        if (n->fatal || !sq->valid) {
            break;
        }
    }
    return busy;
}

static bool queues_poll(VnNvme *n)
{
    bool busy = false;

    for (uint16_t q = 0; q < VN_NVME_MAX_QUEUES; q++) {
        if (n->cq[q].valid) {
            busy |= cq_update_head(n, q);
        }
    }
    for (uint16_t q = 0; q < VN_NVME_MAX_QUEUES && !n->fatal; q++) {
        if (n->sq[q].valid) {
            busy |= sq_run(n, q);
        }
    }
    for (uint16_t q = 0; q < VN_NVME_MAX_QUEUES; q++) {
        if (n->cq[q].valid && n->cq[q].notify) {
            n->cq[q].notify = false;
            irq_raise(n, &n->cq[q]);
        }
    }
    return busy;
}

bool vn_nvme_poll_once(VnNvme *n)
{
    bool busy = false;

    vn_mutex_lock(&n->lock);
    if (n->dma != NULL && n->irqs != NULL) {
        msi_release(n);
        busy = regs_poll(n);
        /* PCI 3.0 6.2.2: without Bus Master Enable the function may not
         * issue memory requests, so commands wait (their doorbells stay). */
        if (n->enabled && !n->fatal && vn_pcicfg_bus_master(n->cfg)) {
            busy |= queues_poll(n);
        }
    }
    vn_mutex_unlock(&n->lock);
    return busy;
}

/* Every BAR0 register to its reset value (3.1; all zero but CAP, VS,
 * CMBLOC and CMBSZ). */
static void regs_reset(VnNvme *n)
{
    for (uint32_t off = 0; off < VN_NVME_REG_DBS; off += 4) {
        reg_assert(n, off, 0);
    }
    regs_fixed(n);
    n->cc = 0;
    n->csts = 0;
}

bool vn_nvme_ready(VnNvme *n)
{
    bool ready;

    vn_mutex_lock(&n->lock);
    ready = n->enabled && !n->fatal;
    vn_mutex_unlock(&n->lock);
    return ready;
}

void vn_nvme_reset(VnNvme *n)
{
    vn_mutex_lock(&n->lock);
    ctrl_reset(n);
    regs_reset(n);
    vn_mutex_unlock(&n->lock);
    g_info("device nvme %s: reset", n->serial);
}

int vn_nvme_flush(VnNvme *n)
{
    return fdatasync(n->fd) < 0 ? -errno : 0;
}

void vn_nvme_attach(VnNvme *n, VnDma *dma, VnIrqs *irqs)
{
    vn_mutex_lock(&n->lock);
    n->dma = dma;
    n->irqs = irqs;
    vn_mutex_unlock(&n->lock);
}

void vn_nvme_stats(VnNvme *n, VnNvmeStats *out)
{
    vn_mutex_lock(&n->lock);
    *out = n->stats;
    vn_mutex_unlock(&n->lock);
}

static bool serial_ok(const char *s)
{
    size_t len = s != NULL ? strlen(s) : 0;

    if (len == 0 || len > VN_NVME_SERIAL_LEN) {
        return false;
    }
    /* Identify SN is ASCII (7.10: printable characters 20h..7Eh). */
    for (size_t i = 0; i < len; i++) {
        if (s[i] < 0x20 || s[i] > 0x7e) {
            return false;
        }
    }
    return true;
}

static bool params_valid(const VnNvmeParams *p, GError **error)
{
    const char *why = NULL;

    if (p->backing == NULL || p->backing[0] == '\0') {
        why = "no backing file";
    } else if (p->size == 0 || p->size % VN_NVME_LBA_SIZE || p->size > VN_NVME_MAX_SIZE) {
        why = "size must be a non-zero multiple of 512 bytes up to 16 TiB";
    } else if (!serial_ok(p->serial)) {
        why = "serial must be 1-20 printable ASCII characters";
    } else if (p->vectors == 0 || p->vectors > VN_PCICFG_MAX_VECTORS) {
        why = "vector count out of range";
    } else if (p->io_queues == 0 || p->io_queues > VN_NVME_MAX_IO_QUEUES) {
        why = "I/O queue count out of range";
    } else if ((p->cmb_mib != 0) != (p->cmb != NULL)) {
        why = "a CMB size without CMB memory, or memory without a size";
    }
    if (why != NULL) {
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_INVAL, "device nvme: %s", why);
        return false;
    }
    if (!vn_nvme_cmb_mib_valid(p->cmb_mib)) {
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                    "device nvme: a CMB of %u MiB (a power of two from %u to %u, or 0 for none)",
                    p->cmb_mib, VN_NVME_MIN_CMB_MIB, VN_NVME_MAX_CMB_MIB);
        return false;
    }
    return true;
}

VnNvme *vn_nvme_new(const VnNvmeParams *params, uint8_t *bar0, VnPciCfg *cfg, GError **error)
{
    g_autoptr(VnNvme) n = NULL;
    g_autoptr(GChecksum) sum = NULL;
    uint8_t digest[32];
    gsize dlen = sizeof(digest);

    if (!params_valid(params, error)) {
        return NULL;
    }
    n = g_new0(VnNvme, 1);
    vn_mutex_init(&n->lock);
    n->fd = -1;
    n->params = *params;
    n->params.backing = NULL; /* not kept: the caller's string */
    n->params.serial = NULL;
    g_strlcpy(n->serial, params->serial, sizeof(n->serial));
    n->bar0 = bar0;
    n->cmb = params->cmb;
    n->cmb_size = (uint64_t)params->cmb_mib << 20;
    vn_nvme_cmb_setup(n);
    n->cfg = cfg;
    n->bounce = g_malloc(VN_NVME_MAX_XFER);
    n->segs = g_new0(VnNvmeSeg, VN_NVME_MAX_SEGS);
    n->iov = g_new0(struct iovec, VN_NVME_MAX_IOV);
    n->power_on_ns = vn_util_now_ns();

    /* A stable namespace id from the serial (Identify NGUID, 7.10), so the
     * guest recognises the same disk across reconnects and resets. */
    sum = g_checksum_new(G_CHECKSUM_SHA256);
    g_checksum_update(sum, (const guchar *)"vfio-ntb simdev nguid:", -1);
    g_checksum_update(sum, (const guchar *)n->serial, -1);
    g_checksum_get_digest(sum, digest, &dlen);
    memcpy(n->nguid, digest, sizeof(n->nguid));

    if (!vn_nvme_ns_open(n, params->backing, params->size, error)) {
        return NULL;
    }
    ctrl_reset(n);
    regs_reset(n);
    if (n->cmb != NULL) {
        trace_nvme_cmb(n->serial, params->cmb_mib, VN_NVME_CMB_BAR, n->cmbsz);
    }
    return g_steal_pointer(&n);
}

void vn_nvme_free(VnNvme *n)
{
    if (n == NULL) {
        return;
    }
    vn_nvme_ns_close(n);
    g_free(n->bounce);
    g_free(n->segs);
    g_free(n->iov);
    vn_mutex_clear(&n->lock);
    g_free(n);
}
