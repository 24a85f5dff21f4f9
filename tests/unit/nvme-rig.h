/*
 * Test rig for the simulated NVMe controller (check_nvme.c, check_nvme_io.c).
 *
 * The controller is driven like a guest driver would, without sockets or
 * threads: BAR0 is a plain buffer, "guest RAM" is a memfd mapped into a real
 * VnDma (so addresses outside it are really unmapped), interrupts are
 * eventfds in a real VnIrqs, and each doorbell write is followed by one
 * vn_nvme_poll_once().  rig_tcase() builds the MSI-X device, rig_tcase_msi()
 * the MSI one (MSI_VECTORS vectors, all enabled), rig_tcase_cmb() the MSI-X
 * one with a CMB_MIB MiB Controller Memory Buffer in BAR2 (not yet assigned
 * an address: cmb_place() does).  Commands, completions and register
 * offsets are written out here from the NVMe 1.4 specification, not taken
 * from the model's headers, so the tests check the model against the spec.
 *
 * Only for inclusion by one test program each (one rig per process; the
 * helpers are static inline so a program need not use them all).
 */
#ifndef VN_TEST_NVME_RIG_H
#define VN_TEST_NVME_RIG_H

#include "common/peerfd.h"
#include "simdev/nvme.h"
#include "simdev/pcicfg.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- The spec, as the test reads it (NVMe 1.4) -------------------------- */

enum {
    CAP = 0x00,
    VS = 0x08,
    INTMS = 0x0c,
    INTMC = 0x10,
    CC = 0x14,
    CSTS = 0x1c,
    AQA = 0x24,
    ASQ = 0x28,
    ACQ = 0x30,
    CMBLOC = 0x38,
    CMBSZ = 0x3c,
    DBS = 0x1000
};
#define CC_ENABLE (1u | (6u << 16) | (4u << 20)) /* EN, IOSQES 64, IOCQES 16 */

typedef struct Sqe {
    uint8_t opc, flags;
    uint16_t cid;
    uint32_t nsid;
    uint64_t rsvd;
    uint64_t mptr;
    uint64_t prp1, prp2;
    uint32_t cdw10, cdw11, cdw12, cdw13, cdw14, cdw15;
} Sqe;

typedef struct Cqe {
    uint32_t dw0, dw1;
    uint16_t sqhd, sqid, cid, status;
} Cqe;

G_STATIC_ASSERT(sizeof(Sqe) == 64);
G_STATIC_ASSERT(sizeof(Cqe) == 16);

/* Status field as SCT << 8 | SC (CQE DW3 bits 27:17). */
#define SC(e) (((e).status >> 1) & 0x7ff)
#define DNR(e) (((e).status >> 15) & 1)

/* --- The rig --------------------------------------------------------------- */

#define VECTORS 9u
#define MSI_VECTORS 8u
#define MSI_CAP VN_PCICFG_CAP_MSI
#define NS_BLOCKS 16384u /* 8 MiB namespace */
#define RAM_IOVA 0x40000000ull
#define RAM_SIZE (8u << 20)
#define OUTSIDE 0x10000000ull /* not mapped */
#define PG 4096u
#define CMB_MIB 2u
#define CMB_SIZE (CMB_MIB << 20)
/* Where the guest puts BAR2: above 4 GiB, so BAR3 holds address bits too. */
#define CMB_ADDR 0x800000000ull
/* CMBSZ of the rig's CMB (NVMe 1.4 3.1.12): SZ = 2 units of SZU 1 MiB (2),
 * WDS (bit 4) and RDS (bit 3). */
#define CMBSZ_RIG ((CMB_MIB << 12) | (2u << 8) | (1u << 4) | (1u << 3))

/* Guest RAM layout (offsets from RAM_IOVA) */
enum {
    O_ASQ = 0x0000,
    O_ACQ = 0x1000,
    O_IOSQ = 0x2000,
    O_IOCQ = 0x3000,
    O_BUF = 0x4000,
    O_LIST = 0x10000,
    O_WDATA = 0x100000,
    O_RDATA = 0x300000
};

typedef struct Q {
    uint16_t qid;
    uint32_t sq_off, cq_off, entries, tail, head;
    int phase;
} Q;

static struct {
    const char *dir; /* rig_dir */
    char *backing;
    uint8_t *bar0;
    VnPciCfg *cfg;
    VnDma *dma;
    VnIrqs *irqs;
    VnNvme *n;
    int ramfd;
    uint8_t *ram;
    uint8_t *cmb;         /* rig_tcase_cmb: the CMB's memory (CMB_SIZE) */
    uint8_t *decoy;       /* cmb_decoy(): guest memory around and at CMB_ADDR */
    int msix[VECTORS];    /* MSI-X mode */
    int msi[MSI_VECTORS]; /* MSI mode */
    int intx;
    uint16_t cid;
    uint32_t next_list;
    Q aq, ioq;
} R;

static inline uint32_t reg(uint32_t off)
{
    return __atomic_load_n((uint32_t *)(void *)(R.bar0 + off), __ATOMIC_SEQ_CST);
}

static inline void setreg(uint32_t off, uint32_t v)
{
    __atomic_store_n((uint32_t *)(void *)(R.bar0 + off), v, __ATOMIC_SEQ_CST);
}

static inline void setreg64(uint32_t off, uint64_t v)
{
    setreg(off, (uint32_t)v);
    setreg(off + 4, (uint32_t)(v >> 32));
}

static inline void cfg16(unsigned off, uint16_t v)
{
    ck_assert_int_eq(vn_pcicfg_write(R.cfg, off, &v, 2), 0);
}

static inline void cfg32(unsigned off, uint32_t v)
{
    ck_assert_int_eq(vn_pcicfg_write(R.cfg, off, &v, 4), 0);
}

static inline uint32_t cfgrd32(unsigned off)
{
    uint32_t v = 0;

    ck_assert_int_eq(vn_pcicfg_read(R.cfg, off, &v, 4), 0);
    return v;
}

/* Signals counted by an eventfd since the last call. */
static inline uint64_t irq_count(int fd)
{
    uint64_t v = 0;

    if (read(fd, &v, sizeof(v)) != sizeof(v)) {
        return 0;
    }
    return v;
}

/*
 * The temp dir belongs to the test runner (an unchecked fixture runs in the
 * parent, once per TCase): libcheck ends a failing forked test with _exit(),
 * skipping its checked teardown, so only the parent can be sure to clean up.
 * Tests create only these fixed names in it.
 */
static char *rig_dir;
static const char *const rig_files[] = { "ns.img", "other.img" };

static inline void rig_dir_create(void)
{
    g_autoptr(GError) error = NULL;

    rig_dir = g_dir_make_tmp("check_nvme-XXXXXX", &error);
    g_assert_no_error(error);
}

static inline void rig_dir_remove(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(rig_files); i++) {
        g_autofree char *f = g_build_filename(rig_dir, rig_files[i], NULL);

        unlink(f);
    }
    rmdir(rig_dir);
    g_clear_pointer(&rig_dir, g_free);
}

/* Eventfds for @n vectors of @index, kept in @keep. */
static inline void rig_irqs(uint32_t index, int *keep, unsigned n)
{
    int fds[VECTORS];

    for (unsigned v = 0; v < n; v++) {
        keep[v] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        fds[v] = dup(keep[v]);
    }
    ck_assert_int_eq(vn_irqs_set(R.irqs, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                                 index, 0, n, NULL, fds, n),
                     0);
}

static inline void rig_setup(VnPciCfgIrqMode mode, bool with_cmb)
{
    bool msi = mode == VN_PCICFG_IRQ_MSI;
    uint32_t counts[VFIO_PCI_NUM_IRQS] = { 1, msi ? MSI_VECTORS : 0, msi ? 0 : VECTORS, 0, 0 };
    VnPciCfgParams cp = {
        .vendor_id = 0x1de1,
        .device_id = 0x5601,
        .class_code = 0x010802,
        .bars = { [0] = { .size = VN_NVME_BAR0_SIZE, .is64 = true },
                  [4] = { .size = msi ? 0 : 4096 } },
        .irq_mode = mode,
        .msix_vectors = VECTORS,
        .msix_bir = 4,
        .msix_table_offset = 0,
        .msix_pba_offset = 0x800,
        .msi_vectors = MSI_VECTORS,
    };
    VnNvmeParams np = {
        .size = (uint64_t)NS_BLOCKS * 512,
        .serial = "TEST-SERIAL-1",
        .vectors = msi ? MSI_VECTORS : VECTORS,
        .io_queues = VECTORS - 1,
        .pci_vendor_id = 0x1de1,
        .pci_subsys_vendor_id = 0x1de1,
    };
    g_autoptr(GError) error = NULL;
    int ifd;

    G_STATIC_ASSERT(MSI_VECTORS <= VECTORS);

    memset(&R, 0, sizeof(R));
    ck_assert_ptr_nonnull(rig_dir);
    R.dir = rig_dir;
    R.backing = g_build_filename(R.dir, rig_files[0], NULL);
    unlink(R.backing); /* left by a test that failed */
    np.backing = R.backing;
    R.bar0 = g_malloc0(VN_NVME_BAR0_SIZE);
    if (with_cmb) {
        /* BAR2 as pcidev builds it: 64-bit, prefetchable, the CMB's size. */
        cp.bars[2] = (VnPciCfgBar){ .size = CMB_SIZE, .is64 = true, .prefetch = true };
        R.cmb = g_malloc0(CMB_SIZE);
        np.cmb = R.cmb;
        np.cmb_mib = CMB_MIB;
    }
    R.cfg = vn_pcicfg_new(&cp, &error);
    ck_assert_msg(R.cfg != NULL, "%s", error ? error->message : "");
    R.n = vn_nvme_new(&np, R.bar0, R.cfg, &error);
    ck_assert_msg(R.n != NULL, "%s", error ? error->message : "");

    R.ramfd = vn_peerfd_memfd_new("guest-ram", RAM_SIZE); /* sealed, as QEMU's */
    ck_assert_int_ge(R.ramfd, 0);
    R.ram = mmap(NULL, RAM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, R.ramfd, 0);
    ck_assert(R.ram != MAP_FAILED);
    R.dma = vn_dma_new();
    ck_assert_int_eq(vn_dma_map(R.dma, RAM_IOVA, RAM_SIZE, 0,
                                VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, dup(R.ramfd)),
                     0);

    R.irqs = vn_irqs_new(counts, VFIO_PCI_NUM_IRQS);
    memset(R.msix, -1, sizeof(R.msix));
    memset(R.msi, -1, sizeof(R.msi));
    if (msi) {
        rig_irqs(VFIO_PCI_MSI_IRQ_INDEX, R.msi, MSI_VECTORS);
    } else {
        rig_irqs(VFIO_PCI_MSIX_IRQ_INDEX, R.msix, VECTORS);
    }
    R.intx = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ifd = dup(R.intx);
    ck_assert_int_eq(vn_irqs_set(R.irqs, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                                 VFIO_PCI_INTX_IRQ_INDEX, 0, 1, NULL, &ifd, 1),
                     0);
    vn_nvme_attach(R.n, R.dma, R.irqs);

    /* What the guest's PCI core does before the driver touches BAR0: with
     * MSI, all 8 vectors (Multiple Message Enable 011b). */
    cfg16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    if (msi) {
        cfg16(MSI_CAP + PCI_MSI_FLAGS, PCI_MSI_FLAGS_ENABLE | (3u << 4));
    } else {
        cfg16(VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE);
    }

    R.aq = (Q){ .qid = 0, .sq_off = O_ASQ, .cq_off = O_ACQ, .entries = 64, .phase = 1 };
    R.ioq = (Q){ .qid = 1, .sq_off = O_IOSQ, .cq_off = O_IOCQ, .entries = 64, .phase = 1 };
    R.next_list = O_LIST;
}

static inline void teardown(void)
{
    vn_nvme_free(R.n);
    vn_irqs_free(R.irqs);
    vn_dma_free(R.dma);
    vn_pcicfg_free(R.cfg);
    munmap(R.ram, RAM_SIZE);
    close(R.ramfd);
    for (unsigned v = 0; v < VECTORS; v++) {
        if (R.msix[v] >= 0) {
            close(R.msix[v]);
        }
    }
    for (unsigned v = 0; v < MSI_VECTORS; v++) {
        if (R.msi[v] >= 0) {
            close(R.msi[v]);
        }
    }
    close(R.intx);
    g_free(R.bar0);
    g_free(R.cmb);
    if (R.decoy != NULL) {
        munmap(R.decoy, 3 * CMB_SIZE);
    }
    unlink(R.backing);
    g_clear_pointer(&R.backing, g_free);
}

static inline bool poll(void)
{
    return vn_nvme_poll_once(R.n);
}

static inline void enable(void)
{
    setreg(AQA, (63u << 16) | 63u);
    setreg64(ASQ, RAM_IOVA + O_ASQ);
    setreg64(ACQ, RAM_IOVA + O_ACQ);
    setreg(CC, CC_ENABLE);
    poll();
    ck_assert_uint_eq(reg(CSTS) & 3, 1); /* RDY, no CFS */
}

static inline void disable(void)
{
    setreg(CC, 0);
    poll();
    ck_assert_uint_eq(reg(CSTS) & 1, 0);
    R.aq.tail = R.aq.head = 0;
    R.aq.phase = 1;
    R.ioq.tail = R.ioq.head = 0;
    R.ioq.phase = 1;
    memset(R.ram + O_ACQ, 0, PG);
    memset(R.ram + O_IOCQ, 0, PG);
}

static inline void sq_push(Q *q, Sqe *c)
{
    c->cid = ++R.cid;
    memcpy(R.ram + q->sq_off + q->tail * 64, c, 64);
    q->tail = (q->tail + 1) % q->entries;
    setreg(DBS + 8 * q->qid, q->tail);
}

static inline bool cq_pop(Q *q, Cqe *out)
{
    Cqe e;

    memcpy(&e, R.ram + q->cq_off + q->head * 16, sizeof(e));
    if ((e.status & 1) != q->phase) {
        return false;
    }
    *out = e;
    if (++q->head == q->entries) {
        q->head = 0;
        q->phase ^= 1;
    }
    setreg(DBS + 8 * q->qid + 4, q->head);
    return true;
}

static inline Cqe submit(Q *q, Sqe c)
{
    Cqe e = { 0 };

    sq_push(q, &c);
    poll();
    ck_assert_msg(cq_pop(q, &e), "no completion for opcode 0x%02x", c.opc);
    ck_assert_uint_eq(e.cid, c.cid);
    ck_assert_uint_eq(e.sqid, q->qid);
    ck_assert_uint_eq(e.sqhd, q->tail);
    return e;
}

static inline Cqe admin(Sqe c)
{
    return submit(&R.aq, c);
}

static inline Cqe identify(uint32_t cns, uint32_t nsid, uint64_t prp1, uint64_t prp2)
{
    return admin((Sqe){ .opc = 0x06, .nsid = nsid, .prp1 = prp1, .prp2 = prp2, .cdw10 = cns });
}

/* Set Features Number of Queues, then I/O CQ 1 (vector 1) and SQ 1. */
static inline void create_io_queues(void)
{
    Cqe e = admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = (7u << 16) | 7u });

    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(e.dw0, (7u << 16) | 7u);
    e = admin((Sqe){ .opc = 0x05,
                     .prp1 = RAM_IOVA + O_IOCQ,
                     .cdw10 = (63u << 16) | 1,
                     .cdw11 = (1u << 16) | 3 });
    ck_assert_uint_eq(SC(e), 0);
    e = admin((Sqe){ .opc = 0x01,
                     .prp1 = RAM_IOVA + O_IOSQ,
                     .cdw10 = (63u << 16) | 1,
                     .cdw11 = (1u << 16) | 1 });
    ck_assert_uint_eq(SC(e), 0);
}

/* Describe @npages guest pages (first at offset @off) as PRP1/PRP2,
 * building PRP lists in O_LIST pages; @list_off places the first list
 * inside its page, so a list near the end of a page must chain. */
static inline void prps(Sqe *c, const uint64_t *pages, unsigned npages, uint32_t off,
                        uint32_t list_off)
{
    uint64_t at;
    unsigned i = 1;

    c->prp1 = pages[0] + off;
    if (npages == 1) {
        return;
    }
    if (npages == 2) {
        c->prp2 = pages[1];
        return;
    }
    at = RAM_IOVA + R.next_list + list_off;
    R.next_list += PG;
    c->prp2 = at;
    while (i < npages) {
        unsigned avail = (PG - (at & (PG - 1))) / 8;
        unsigned left = npages - i;
        uint64_t *ents = (uint64_t *)(void *)(R.ram + (at - RAM_IOVA));

        if (left <= avail) {
            memcpy(ents, &pages[i], left * 8);
            break;
        }
        memcpy(ents, &pages[i], (avail - 1) * 8);
        i += avail - 1;
        ents[avail - 1] = RAM_IOVA + R.next_list;
        at = RAM_IOVA + R.next_list;
        R.next_list += PG;
    }
}

static inline Cqe rw(uint8_t opc, uint64_t slba, uint32_t nblocks, const uint64_t *pages,
                     unsigned npages, uint32_t off, uint32_t list_off)
{
    Sqe c = { .opc = opc,
              .nsid = 1,
              .cdw10 = (uint32_t)slba,
              .cdw11 = (uint32_t)(slba >> 32),
              .cdw12 = nblocks - 1 };

    prps(&c, pages, npages, off, list_off);
    return submit(&R.ioq, c);
}

/* Page addresses of a buffer: contiguous, or in reverse order (scattered). */
static inline unsigned pages_of(uint64_t *pages, uint32_t ram_off, uint32_t len, uint32_t off,
                                bool reverse)
{
    unsigned n = (off + len + PG - 1) / PG;

    for (unsigned i = 0; i < n; i++) {
        pages[i] = RAM_IOVA + ram_off + (uint64_t)(reverse ? n - 1 - i : i) * PG;
    }
    return n;
}

/* Copy between a flat buffer and the guest pages the PRPs describe. */
static inline void gather(uint8_t *dst, const uint64_t *pages, uint32_t off, uint32_t len)
{
    for (unsigned i = 0; len > 0; i++) {
        uint32_t o = i == 0 ? off : 0;
        uint32_t l = MIN(len, PG - o);

        memcpy(dst, R.ram + (pages[i] - RAM_IOVA) + o, l);
        dst += l;
        len -= l;
    }
}

static inline void scatter(const uint8_t *src, const uint64_t *pages, uint32_t off, uint32_t len)
{
    for (unsigned i = 0; len > 0; i++) {
        uint32_t o = i == 0 ? off : 0;
        uint32_t l = MIN(len, PG - o);

        memcpy(R.ram + (pages[i] - RAM_IOVA) + o, src, l);
        src += l;
        len -= l;
    }
}

static inline void fill(uint8_t *buf, size_t len, uint32_t seed)
{
    g_autoptr(GRand) r = g_rand_new_with_seed(seed);

    for (size_t i = 0; i < len; i++) {
        buf[i] = (uint8_t)g_rand_int(r);
    }
}

/* Write @len bytes from contiguous pages at PRP1 offset @off, read them back
 * into scattered pages, compare with what was written and with the file. */
static inline void roundtrip(uint64_t slba, uint32_t len, uint32_t off, uint32_t list_off,
                             uint32_t seed)
{
    uint8_t *data = g_malloc(len), *back = g_malloc(len), *file = g_malloc(len);
    uint64_t wp[300], rp[300];
    unsigned nw = pages_of(wp, O_WDATA, len, off, false);
    unsigned nr = pages_of(rp, O_RDATA, len, off, true);
    int fd;

    fill(data, len, seed);
    scatter(data, wp, off, len);
    ck_assert_uint_eq(SC(rw(0x01, slba, len / 512, wp, nw, off, list_off)), 0);
    memset(R.ram + O_RDATA, 0, 0x101000);
    ck_assert_uint_eq(SC(rw(0x02, slba, len / 512, rp, nr, off, list_off)), 0);
    gather(back, rp, off, len);
    ck_assert_mem_eq(back, data, len);

    fd = open(R.backing, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, file, len, (off_t)slba * 512), (ssize_t)len);
    close(fd);
    ck_assert_mem_eq(file, data, len);
    g_free(data);
    g_free(back);
    g_free(file);
}

static inline void setup(void)
{
    rig_setup(VN_PCICFG_IRQ_MSIX, false);
}

static inline void setup_msi(void)
{
    rig_setup(VN_PCICFG_IRQ_MSI, false);
}

static inline void setup_cmb(void)
{
    rig_setup(VN_PCICFG_IRQ_MSIX, true);
}

/* What the guest's PCI core does: BAR2 (and BAR3, its upper half) at
 * @addr.  Memory decoding is on from rig_setup. */
static inline void cmb_place(uint64_t addr)
{
    cfg32(PCI_BASE_ADDRESS_2, (uint32_t)addr);
    cfg32(PCI_BASE_ADDRESS_3, (uint32_t)(addr >> 32));
}

/* Guest memory (a mapping in the DMA table) over [CMB_ADDR - CMB_SIZE,
 * CMB_ADDR + 2 * CMB_SIZE): the CMB's addresses and both neighbours, so a
 * transfer the model wrongly sent to the DMA table would succeed there and
 * show.  QEMU's own mappings of a BAR carry no memory; this one does. */
static inline void cmb_decoy(void)
{
    int fd = vn_peerfd_memfd_new("decoy", 3 * CMB_SIZE);

    ck_assert_int_ge(fd, 0);
    R.decoy = mmap(NULL, 3 * CMB_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(R.decoy != MAP_FAILED);
    ck_assert_int_eq(vn_dma_map(R.dma, CMB_ADDR - CMB_SIZE, 3 * CMB_SIZE, 0,
                                VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, fd),
                     0);
}

/* Whether @len bytes at @p are all @byte. */
static inline bool all_bytes(const uint8_t *p, size_t len, uint8_t byte)
{
    for (size_t i = 0; i < len; i++) {
        if (p[i] != byte) {
            return false;
        }
    }
    return true;
}

/* A TCase with the rig: temp dir per TCase (parent), rig per test (child). */
static inline TCase *rig_tcase(const char *name)
{
    TCase *tc = tcase_create(name);

    tcase_add_unchecked_fixture(tc, rig_dir_create, rig_dir_remove);
    tcase_add_checked_fixture(tc, setup, teardown);
    return tc;
}

/* The same with the device in MSI mode. */
static inline TCase *rig_tcase_msi(const char *name)
{
    TCase *tc = tcase_create(name);

    tcase_add_unchecked_fixture(tc, rig_dir_create, rig_dir_remove);
    tcase_add_checked_fixture(tc, setup_msi, teardown);
    return tc;
}

/* The same with a CMB (MSI-X). */
static inline TCase *rig_tcase_cmb(const char *name)
{
    TCase *tc = tcase_create(name);

    tcase_add_unchecked_fixture(tc, rig_dir_create, rig_dir_remove);
    tcase_add_checked_fixture(tc, setup_cmb, teardown);
    return tc;
}

#endif /* VN_TEST_NVME_RIG_H */
