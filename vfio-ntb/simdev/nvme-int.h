/*
 * Internals of the simulated NVMe controller, shared by nvme.c (registers,
 * queues, completions), nvme-admin.c (admin commands) and nvme-io.c (PRPs,
 * the namespace and I/O commands).  Not for other modules.
 *
 * Numbers and layouts are from the NVM Express Base Specification 1.4;
 * section numbers are cited where they are used.
 */
#ifndef VN_NVME_INT_H
#define VN_NVME_INT_H

#include "common/lock.h"
#include "nvme.h"

#include <stdbool.h>
#include <stdint.h>

/* --- Limits (every guest-controlled value is checked against these) ---- */

/* Memory page size: CAP.MPSMIN = CAP.MPSMAX = 0, so CC.MPS must be 0. */
#define VN_NVME_PAGE_SIZE 4096u
/* Entries per queue: CAP.MQES is 0's based (NVMe 1.4 3.1.1). */
#define VN_NVME_MQES 1023u
/* Admin queues may hold up to 4096 entries (AQA.ASQS/ACQS, 12 bits). */
#define VN_NVME_MAX_ADMIN_ENTRIES 4096u
/* Maximum Data Transfer Size as a power of two of pages: 1 MiB.  Linux
 * splits larger requests; the bounce buffer (admin data, fallback) is this
 * big. */
#define VN_NVME_MDTS 8u
#define VN_NVME_MAX_XFER (VN_NVME_PAGE_SIZE << VN_NVME_MDTS)
/* Segments one transfer can need: one per page plus the unaligned start. */
#define VN_NVME_MAX_SEGS (VN_NVME_MAX_XFER / VN_NVME_PAGE_SIZE + 1)
/* Host iovecs of one zero-copy transfer: a segment split by a DMA mapping
 * boundary takes two; beyond this (far below IOV_MAX) the bounce buffer is
 * used instead. */
#define VN_NVME_MAX_IOV (2 * VN_NVME_MAX_SEGS)
/* Queue ids: the admin queue plus the I/O queues we can grant. */
#define VN_NVME_MAX_QUEUES (VN_NVME_MAX_IO_QUEUES + 1)
/* Outstanding Asynchronous Event Requests: Identify AERL is 0's based. */
#define VN_NVME_AERL 3u
/* Commands executed per queue per poll pass, so that one busy queue cannot
 * starve the others or delay a CC change for long. */
#define VN_NVME_SQ_BUDGET 64u
/* Write Zeroes covers NLB + 1 <= 65536 blocks; we zero in chunks this big. */
#define VN_NVME_ZERO_CHUNK (1024u * 1024u)

/* --- Registers (NVMe 1.4 3.1) ------------------------------------------ */

enum {
    VN_NVME_REG_CAP = 0x00,
    VN_NVME_REG_VS = 0x08,
    VN_NVME_REG_INTMS = 0x0c,
    VN_NVME_REG_INTMC = 0x10,
    VN_NVME_REG_CC = 0x14,
    VN_NVME_REG_CSTS = 0x1c,
    VN_NVME_REG_NSSR = 0x20,
    VN_NVME_REG_AQA = 0x24,
    VN_NVME_REG_ASQ = 0x28,
    VN_NVME_REG_ACQ = 0x30,
    VN_NVME_REG_CMBLOC = 0x38,
    VN_NVME_REG_CMBSZ = 0x3c,
    VN_NVME_REG_DBS = 0x1000,
};

/* CC (3.1.5) */
#define VN_NVME_CC_EN 0x1u
#define VN_NVME_CC_CSS(cc) (((cc) >> 4) & 0x7)
#define VN_NVME_CC_MPS(cc) (((cc) >> 7) & 0xf)
#define VN_NVME_CC_AMS(cc) (((cc) >> 11) & 0x7)
#define VN_NVME_CC_SHN(cc) (((cc) >> 14) & 0x3)
#define VN_NVME_CC_IOSQES(cc) (((cc) >> 16) & 0xf)
#define VN_NVME_CC_IOCQES(cc) (((cc) >> 20) & 0xf)
/* CSTS (3.1.6) */
#define VN_NVME_CSTS_RDY 0x1u
#define VN_NVME_CSTS_CFS 0x2u
#define VN_NVME_CSTS_SHST_DONE (0x2u << 2)
/* CMBLOC (3.1.11): BIR 2:0, OFST 31:12 (in CMBSZ.SZU units) */
#define VN_NVME_CMBLOC_BIR(bar) (0x7u & (uint32_t)(bar))
/* CMBSZ (3.1.12): what the CMB may hold, SZU 11:8, SZ 31:12 */
#define VN_NVME_CMBSZ_SQS (1u << 0)
#define VN_NVME_CMBSZ_CQS (1u << 1)
#define VN_NVME_CMBSZ_LISTS (1u << 2)
#define VN_NVME_CMBSZ_RDS (1u << 3)
#define VN_NVME_CMBSZ_WDS (1u << 4)
#define VN_NVME_CMBSZ_SZU_1M (2u << 8)
#define VN_NVME_CMBSZ_SZ(units) ((uint32_t)(units) << 12)
/* Entry sizes as powers of two (Identify SQES/CQES, CC.IOSQES/IOCQES). */
#define VN_NVME_SQE_SHIFT 6
#define VN_NVME_CQE_SHIFT 4

/* --- Commands and completions (4.2, 4.6) --------------------------------- */

typedef struct VnNvmeSqe {
    uint8_t opcode;
    uint8_t flags; /* FUSE 1:0, PSDT 7:6 */
    uint16_t cid;
    uint32_t nsid;
    uint32_t cdw2;
    uint32_t cdw3;
    uint64_t mptr;
    uint64_t prp1;
    uint64_t prp2;
    uint32_t cdw10;
    uint32_t cdw11;
    uint32_t cdw12;
    uint32_t cdw13;
    uint32_t cdw14;
    uint32_t cdw15;
} VnNvmeSqe;

typedef struct VnNvmeCqe {
    uint32_t result; /* DW0 */
    uint32_t rsvd;
    uint16_t sq_head;
    uint16_t sq_id;
    uint16_t cid;
    uint16_t status; /* phase tag in bit 0, status field in 15:1 */
} VnNvmeCqe;

G_STATIC_ASSERT(sizeof(VnNvmeSqe) == 1u << VN_NVME_SQE_SHIFT);
G_STATIC_ASSERT(sizeof(VnNvmeCqe) == 1u << VN_NVME_CQE_SHIFT);

/* Status field without the phase tag (4.6.1): SC 7:0, SCT 10:8, DNR 14. */
#define VN_NVME_SC(sct, sc) ((uint16_t)(((sct) << 8) | (sc)))
#define VN_NVME_DNR 0x4000u
#define VN_NVME_SUCCESS 0u
/* Returned by a handler that keeps the command (AER): no completion now. */
#define VN_NVME_DEFERRED 0xffffu

/* Generic Command Status, SCT 0 (Figure 128) */
#define VN_NVME_SC_INVALID_OPCODE VN_NVME_SC(0, 0x01)
#define VN_NVME_SC_INVALID_FIELD VN_NVME_SC(0, 0x02)
#define VN_NVME_SC_DATA_XFER_ERROR VN_NVME_SC(0, 0x04)
#define VN_NVME_SC_INTERNAL VN_NVME_SC(0, 0x06)
#define VN_NVME_SC_ABORT_SQ_DELETED VN_NVME_SC(0, 0x08)
#define VN_NVME_SC_INVALID_NS VN_NVME_SC(0, 0x0b)
#define VN_NVME_SC_CMD_SEQ_ERROR VN_NVME_SC(0, 0x0c)
#define VN_NVME_SC_INVALID_PRP_OFFSET VN_NVME_SC(0, 0x13)
#define VN_NVME_SC_LBA_RANGE VN_NVME_SC(0, 0x80)
/* Command Specific Status, SCT 1 (Figure 129) */
#define VN_NVME_SC_CQ_INVALID VN_NVME_SC(1, 0x00)
#define VN_NVME_SC_INVALID_QID VN_NVME_SC(1, 0x01)
#define VN_NVME_SC_INVALID_QSIZE VN_NVME_SC(1, 0x02)
#define VN_NVME_SC_AER_LIMIT VN_NVME_SC(1, 0x05)
#define VN_NVME_SC_INVALID_VECTOR VN_NVME_SC(1, 0x08)
#define VN_NVME_SC_INVALID_LOG_PAGE VN_NVME_SC(1, 0x09)
#define VN_NVME_SC_INVALID_QDELETE VN_NVME_SC(1, 0x0c)
#define VN_NVME_SC_FEAT_NOT_SAVEABLE VN_NVME_SC(1, 0x0d)
/* Media and Data Integrity Errors, SCT 2 (Figure 130) */
#define VN_NVME_SC_WRITE_FAULT VN_NVME_SC(2, 0x80)
#define VN_NVME_SC_READ_ERROR VN_NVME_SC(2, 0x81)

/* Admin opcodes (Figure 139) */
enum {
    VN_NVME_ADM_DELETE_SQ = 0x00,
    VN_NVME_ADM_CREATE_SQ = 0x01,
    VN_NVME_ADM_GET_LOG_PAGE = 0x02,
    VN_NVME_ADM_DELETE_CQ = 0x04,
    VN_NVME_ADM_CREATE_CQ = 0x05,
    VN_NVME_ADM_IDENTIFY = 0x06,
    VN_NVME_ADM_ABORT = 0x08,
    VN_NVME_ADM_SET_FEATURES = 0x09,
    VN_NVME_ADM_GET_FEATURES = 0x0a,
    VN_NVME_ADM_ASYNC_EVENT = 0x0c,
    VN_NVME_ADM_KEEP_ALIVE = 0x18,
};

/* NVM command set opcodes (Figure 346) */
enum {
    VN_NVME_CMD_FLUSH = 0x00,
    VN_NVME_CMD_WRITE = 0x01,
    VN_NVME_CMD_READ = 0x02,
    VN_NVME_CMD_WRITE_ZEROES = 0x08,
};

/* Feature identifiers (Figure 271) */
enum {
    VN_NVME_FEAT_ARBITRATION = 0x01,
    VN_NVME_FEAT_POWER_MGMT = 0x02,
    VN_NVME_FEAT_TEMP_THRESH = 0x04,
    VN_NVME_FEAT_ERROR_RECOVERY = 0x05,
    VN_NVME_FEAT_VOLATILE_WC = 0x06,
    VN_NVME_FEAT_NUM_QUEUES = 0x07,
    VN_NVME_FEAT_IRQ_COALESCE = 0x08,
    VN_NVME_FEAT_IRQ_CONFIG = 0x09,
    VN_NVME_FEAT_WRITE_ATOMIC = 0x0a,
    VN_NVME_FEAT_ASYNC_EVENT = 0x0b,
    VN_NVME_FEAT_TIMESTAMP = 0x0e,
};

/* Identify: composite temperature thresholds we report (Kelvin). */
#define VN_NVME_WCTEMP 343u
#define VN_NVME_CCTEMP 353u
#define VN_NVME_TEMPERATURE 313u

/* --- State --------------------------------------------------------------- */

typedef struct VnNvmeSq {
    bool valid;
    uint16_t cqid;
    uint32_t size;      /* entries */
    uint32_t head;      /* next entry we fetch */
    uint64_t base;      /* guest address, page aligned */
    bool bad_db_logged; /* an out-of-range tail was reported once */
} VnNvmeSq;

typedef struct VnNvmeCq {
    bool valid;
    bool ien;    /* interrupts enabled (CDW11.IEN) */
    bool phase;  /* phase tag we write; starts at 1 (4.6) */
    bool notify; /* posted since the last interrupt */
    uint16_t vector;
    uint32_t size;
    uint32_t head; /* last head the host wrote */
    uint32_t tail; /* next entry we post */
    uint32_t nsq;  /* submission queues that complete here */
    uint64_t base;
    bool bad_db_logged;
} VnNvmeCq;

/* One contiguous piece of a guest data buffer (from PRP1/PRP2/PRP lists). */
typedef VnDmaRange VnNvmeSeg;

/* Current values of the features we keep (5.21.1). */
typedef struct VnNvmeFeatures {
    uint32_t arbitration;
    uint32_t power_mgmt;
    uint16_t temp_over;
    uint16_t temp_under;
    uint32_t error_recovery;
    bool wce;
    uint32_t irq_coalesce;
    uint32_t write_atomic;
    uint32_t async_event;
    uint64_t ts_host_ms;                                /* last Timestamp the host set */
    uint64_t ts_set_ns;                                 /* when (monotonic), 0 = never set */
    uint64_t irq_cd[(VN_PCICFG_MAX_VECTORS + 63) / 64]; /* per-vector CD bit */
} VnNvmeFeatures;

/*
 * Ownership: params, bar0, cfg, fd, nblocks, the cmb fields, bounce, segs
 * and iov are set up before the engine starts and not changed afterwards
 * (bounce/segs/iov are scratch used under @lock; the CMB's bytes are shared
 * with the guest and peers, like BAR0's).  Everything else below @lock is
 * guarded by it; in practice the engine thread holds it while polling and
 * the socket thread only for reset and flush.  dma and irqs are set by
 * attach before polling starts.
 */
struct VnNvme {
    /* immutable after vn_nvme_new/attach */
    VnNvmeParams params;
    char serial[VN_NVME_SERIAL_LEN + 1];
    uint8_t nguid[16];
    uint8_t *bar0;
    uint8_t *cmb;      /* NULL: no CMB */
    uint64_t cmb_size; /* bytes */
    uint32_t cmbloc;   /* CMBLOC and CMBSZ as the guest reads them */
    uint32_t cmbsz;
    VnPciCfg *cfg;
    VnDma *dma;
    VnIrqs *irqs;
    int fd;
    uint64_t nblocks;
    uint8_t *bounce;   /* VN_NVME_MAX_XFER bytes */
    VnNvmeSeg *segs;   /* VN_NVME_MAX_SEGS */
    struct iovec *iov; /* VN_NVME_MAX_IOV */

    VnMutex lock;
    uint32_t cc; /* CC as last acted upon */
    uint32_t csts;
    uint32_t intms;       /* INTx mask (3.1.3/3.1.4) */
    bool enabled;         /* CC.EN accepted and admin queue set up */
    bool fatal;           /* CSTS.CFS: stop processing until reset */
    uint32_t ioq_granted; /* I/O queue pairs allowed (Number of Queues) */
    VnNvmeSq sq[VN_NVME_MAX_QUEUES];
    VnNvmeCq cq[VN_NVME_MAX_QUEUES];
    VnNvmeFeatures feat;
    uint16_t aer_cid[VN_NVME_AERL + 1];
    uint32_t aer_count;
    VnNvmeStats stats;
    uint64_t power_on_ns;
};

/* nvme.c */
void vn_nvme_fatal(VnNvme *n, const char *why);

/* BAR0 registers and doorbells: 32-bit accesses that are atomic against the
 * guest's own (the memory is shared with the vCPUs). */
static inline uint32_t vn_nvme_reg_load(VnNvme *n, uint32_t off)
{
    return __atomic_load_n((uint32_t *)(void *)(n->bar0 + off), __ATOMIC_ACQUIRE);
}

static inline void vn_nvme_reg_store(VnNvme *n, uint32_t off, uint32_t val)
{
    __atomic_store_n((uint32_t *)(void *)(n->bar0 + off), val, __ATOMIC_RELEASE);
}

/* Doorbells with CAP.DSTRD = 0 (3.1.10/3.1.11): SQ y tail at 1000h + 8y,
 * CQ y head at 1000h + 8y + 4. */
static inline uint32_t vn_nvme_db_sq(uint16_t qid)
{
    return VN_NVME_REG_DBS + 8u * qid;
}

static inline uint32_t vn_nvme_db_cq(uint16_t qid)
{
    return VN_NVME_REG_DBS + 8u * qid + 4u;
}

/* nvme-admin.c: execute one admin command; the status, or VN_NVME_DEFERRED */
uint16_t vn_nvme_admin_exec(VnNvme *n, const VnNvmeSqe *cmd, uint32_t *result);
/* Drop held AERs and reset features (controller reset). */
void vn_nvme_admin_reset(VnNvme *n);

/* nvme-io.c */
bool vn_nvme_ns_open(VnNvme *n, const char *path, uint64_t size, GError **error);
void vn_nvme_ns_close(VnNvme *n);
uint16_t vn_nvme_io_exec(VnNvme *n, const VnNvmeSqe *cmd, uint32_t *result);
/* Copy @len bytes between @buf and the guest buffer described by PRP1/PRP2
 * (4.3).  Returns the status: success, Invalid PRP Offset, Invalid Field or
 * Data Transfer Error. */
uint16_t vn_nvme_prp_to_guest(VnNvme *n, uint64_t prp1, uint64_t prp2, const void *buf,
                              uint32_t len);
uint16_t vn_nvme_prp_from_guest(VnNvme *n, uint64_t prp1, uint64_t prp2, void *buf, uint32_t len);

/*
 * nvme-cmb.c: data pointers into the controller's own CMB (NVMe 1.4 4.7).
 * A range of bus addresses is in the CMB when it lies inside BAR
 * VN_NVME_CMB_BAR as the host programmed it and memory decoding is on.
 *
 * vn_nvme_cmb_setup(): set n->cmbloc/cmbsz from n->cmb and n->cmb_size.
 * vn_nvme_cmb_find(): 1 with *@host set when [@addr, @addr + @len) is all
 * in the CMB, 0 when none of it is (host memory), -EFAULT when it is partly
 * (runs over either end of the CMB) or wraps.
 * vn_nvme_cmb_read/write(): copy between @buf and the data pointer's
 * memory, the CMB or guest memory through the DMA table; 0 or -EFAULT.
 * vn_nvme_cmb_iov(): when all @count segments are in the CMB, fill @iov
 * with them and return how many; 0 when none touches it; -E2BIG when some
 * do and some do not (or more than @max_iov); -EFAULT as find.
 */
void vn_nvme_cmb_setup(VnNvme *n);
int vn_nvme_cmb_find(VnNvme *n, uint64_t addr, uint64_t len, uint8_t **host);
int vn_nvme_cmb_read(VnNvme *n, uint64_t addr, void *buf, size_t len);
int vn_nvme_cmb_write(VnNvme *n, uint64_t addr, const void *buf, size_t len);
int vn_nvme_cmb_iov(VnNvme *n, const VnNvmeSeg *segs, unsigned count, struct iovec *iov,
                    unsigned max_iov);

#endif /* VN_NVME_INT_H */
