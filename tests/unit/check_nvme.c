/*
 * Unit tests of the simulated NVMe controller (vfio-ntb/simdev/nvme.c,
 * nvme-admin.c): enable/disable and resets, Identify, queue management,
 * interrupts (MSI-X, INTx, MSI) and bus mastering, features, log pages,
 * AERs, the CMB's registers and sizes.  The rig is in
 * nvme-rig.h; I/O and PRPs are in check_nvme_io.c.
 */
#include "check-main.h"
#include "nvme-rig.h"

/* --- enable / disable ------------------------------------------------------ */

START_TEST(test_enable_disable)
{
    uint64_t cap;

    poll();
    cap = reg(CAP) | (uint64_t)reg(CAP + 4) << 32;
    ck_assert_uint_eq(cap & 0xffff, 1023);    /* MQES */
    ck_assert_uint_eq((cap >> 16) & 1, 1);    /* CQR */
    ck_assert_uint_ne((cap >> 24) & 0xff, 0); /* TO */
    ck_assert_uint_eq((cap >> 32) & 0xf, 0);  /* DSTRD */
    ck_assert_uint_eq((cap >> 37) & 1, 1);    /* CSS: NVM */
    ck_assert_uint_eq((cap >> 48) & 0xf, 0);  /* MPSMIN */
    ck_assert_uint_eq(reg(VS), 0x00010400);
    ck_assert_uint_eq(reg(CSTS), 0);

    /* Read-only registers come back after a stray guest write. */
    setreg(CAP, 0);
    setreg(VS, 0x12345678);
    setreg(CSTS, 0xffffffff);
    poll();
    ck_assert_uint_eq(reg(CAP) & 0xffff, 1023);
    ck_assert_uint_eq(reg(VS), 0x00010400);
    ck_assert_uint_eq(reg(CSTS), 0);

    enable();
    create_io_queues();
    /* Leave stale values in the doorbells, as a guest would. */
    setreg(DBS + 8, 5);
    setreg(DBS + 12, 3);
    disable();
    for (uint32_t off = DBS; off < VN_NVME_BAR0_SIZE; off += 4) {
        ck_assert_msg(reg(off) == 0, "doorbell at 0x%x is 0x%x", off, reg(off));
    }
    /* Enabled again, nothing of the old queues runs. */
    enable();
    poll();
    ck_assert_uint_eq(R.ram[O_ACQ + 14] & 1, 0); /* no completion posted */
    ck_assert_uint_eq(SC(identify(1, 0, RAM_IOVA + O_BUF, 0)), 0);
}
END_TEST

START_TEST(test_enable_bad_config)
{
    /* Admin queue base not page aligned: CSTS.CFS, never RDY. */
    setreg(AQA, (63u << 16) | 63u);
    setreg64(ASQ, RAM_IOVA + 0x100);
    setreg64(ACQ, RAM_IOVA + O_ACQ);
    setreg(CC, CC_ENABLE);
    poll();
    ck_assert_uint_eq(reg(CSTS) & 3, 2);
    /* Disabling clears it; a good configuration then works. */
    setreg(CC, 0);
    poll();
    ck_assert_uint_eq(reg(CSTS) & 3, 0);
    enable();
    /* AQA of one entry is invalid too. */
    disable();
    setreg(AQA, 0);
    setreg(CC, CC_ENABLE);
    poll();
    ck_assert_uint_eq(reg(CSTS) & 3, 2);
}
END_TEST

START_TEST(test_shutdown)
{
    enable();
    setreg(CC, CC_ENABLE | (1u << 14)); /* SHN normal */
    poll();
    ck_assert_uint_eq((reg(CSTS) >> 2) & 3, 2); /* SHST complete */
    setreg(CC, 0);
    poll();
    ck_assert_uint_eq(reg(CSTS), 0);
}
END_TEST

START_TEST(test_function_reset)
{
    static uint8_t data[8192], back[8192];
    uint64_t pages[4];
    unsigned np;

    enable();
    create_io_queues();
    fill(data, sizeof(data), 7);
    np = pages_of(pages, O_WDATA, sizeof(data), 0, false);
    scatter(data, pages, 0, sizeof(data));
    ck_assert_uint_eq(SC(rw(0x01, 100, 16, pages, np, 0, 0)), 0);

    vn_nvme_reset(R.n);
    ck_assert_uint_eq(reg(CC), 0);
    ck_assert_uint_eq(reg(AQA), 0);
    ck_assert_uint_eq(reg(ASQ), 0);
    ck_assert_uint_eq(reg(CSTS), 0);
    ck_assert_uint_eq(reg(VS), 0x00010400);
    for (uint32_t off = DBS; off < VN_NVME_BAR0_SIZE; off += 4) {
        ck_assert_uint_eq(reg(off), 0);
    }
    /* The namespace keeps its data. */
    disable();
    enable();
    create_io_queues();
    np = pages_of(pages, O_RDATA, sizeof(back), 0, false);
    ck_assert_uint_eq(SC(rw(0x02, 100, 16, pages, np, 0, 0)), 0);
    gather(back, pages, 0, sizeof(back));
    ck_assert_mem_eq(back, data, sizeof(data));
}
END_TEST

/* --- identify ----------------------------------------------------------------- */

START_TEST(test_identify)
{
    uint8_t *b = R.ram + O_BUF;
    uint8_t nguid[16];
    Cqe e;

    enable();
    e = identify(1, 0, RAM_IOVA + O_BUF, 0);
    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(b[0] | b[1] << 8, 0x1de1);             /* VID */
    ck_assert_mem_eq(b + 4, "TEST-SERIAL-1       ", 20);     /* SN */
    ck_assert_mem_eq(b + 24, "vfio-ntb simulated NVMe", 23); /* MN */
    ck_assert_uint_eq(b[24 + 23], ' ');
    ck_assert_uint_ge(b[77], 5);                                   /* MDTS */
    ck_assert_uint_eq(b[80] | b[81] << 8 | b[82] << 16, 0x010400); /* VER */
    ck_assert_uint_eq(b[512], 0x66);                               /* SQES */
    ck_assert_uint_eq(b[513], 0x44);                               /* CQES */
    ck_assert_uint_eq(b[516], 1);                                  /* NN */
    ck_assert_uint_eq(b[525] & 1, 1);                              /* VWC */
    ck_assert_int_eq(memcmp(b + 768, "nqn.", 4), 0);               /* SUBNQN */

    e = identify(0, 1, RAM_IOVA + O_BUF, 0);
    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(*(uint64_t *)(void *)b, NS_BLOCKS);       /* NSZE */
    ck_assert_uint_eq(*(uint64_t *)(void *)(b + 8), NS_BLOCKS); /* NCAP */
    ck_assert_uint_eq(b[26] & 0xf, 0);                          /* FLBAS */
    ck_assert_uint_eq(b[128 + 2], 9);                           /* LBADS */
    memcpy(nguid, b + 104, 16);

    e = identify(2, 0, RAM_IOVA + O_BUF, 0);
    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(*(uint32_t *)(void *)b, 1);
    ck_assert_uint_eq(*(uint32_t *)(void *)(b + 4), 0);
    e = identify(2, 1, RAM_IOVA + O_BUF, 0); /* ids above 1 */
    ck_assert_uint_eq(*(uint32_t *)(void *)b, 0);

    e = identify(3, 1, RAM_IOVA + O_BUF, 0);
    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(b[0], 2); /* NGUID */
    ck_assert_uint_eq(b[1], 16);
    ck_assert_mem_eq(b + 4, nguid, 16);
    ck_assert_uint_ne(nguid[0] | nguid[1] | nguid[2] | nguid[3], 0);

    e = identify(6, 0, RAM_IOVA + O_BUF, 0); /* NVM CS ctrl */
    ck_assert_uint_eq(SC(e), 0);
}
END_TEST

START_TEST(test_identify_errors)
{
    enable();
    ck_assert_uint_eq(SC(identify(0, 2, RAM_IOVA + O_BUF, 0)), 0x0b);
    ck_assert_uint_eq(SC(identify(0, 0, RAM_IOVA + O_BUF, 0)), 0x0b);
    ck_assert_uint_eq(SC(identify(3, 5, RAM_IOVA + O_BUF, 0)), 0x0b);
    ck_assert_uint_eq(SC(identify(2, 0xffffffff, RAM_IOVA + O_BUF, 0)), 0x0b);
    ck_assert_uint_eq(SC(identify(0x42, 0, RAM_IOVA + O_BUF, 0)), 0x02);
    ck_assert_uint_eq(DNR(identify(0x42, 0, RAM_IOVA + O_BUF, 0)), 1);
    /* Unknown admin opcode */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x80 })), 0x01);
}
END_TEST

START_TEST(test_identify_split_page)
{
    /* PRP1 in the middle of a page: the rest goes to PRP2's page. */
    uint8_t *p1 = R.ram + O_BUF + 0x800;
    uint8_t *p2 = R.ram + O_LIST;

    enable();
    ck_assert_uint_eq(SC(identify(1, 0, RAM_IOVA + O_BUF + 0x800, RAM_IOVA + O_LIST)), 0);
    ck_assert_mem_eq(p1 + 4, "TEST-SERIAL-1", 13);
    /* byte 2048 of the structure is PSD0 (MP low byte, 2500 = 0x9c4) */
    ck_assert_uint_eq(p2[0] | p2[1] << 8, 2500);
    /* PRP1 not dword aligned */
    ck_assert_uint_eq(SC(identify(1, 0, RAM_IOVA + O_BUF + 2, 0)), 0x13);
    /* PRP2 with an offset where a page is required */
    ck_assert_uint_eq(SC(identify(1, 0, RAM_IOVA + O_BUF + 0x800, RAM_IOVA + O_LIST + 8)), 0x13);
}
END_TEST

/* --- queues --------------------------------------------------------------- */

START_TEST(test_queues)
{
    Cqe e;

    enable();
    e = admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = (63u << 16) | 63u });
    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(e.dw0, (7u << 16) | 7u); /* we grant 8 of 64 */
    e = admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = 0xffff });
    ck_assert_uint_eq(SC(e), 0x02);
    e = admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = (1u << 16) | 1u });
    ck_assert_uint_eq(e.dw0, (1u << 16) | 1u); /* 2 asked, 2 granted */

    /* Create I/O CQ: bad id, size, contiguity, base, vector */
    e = admin(
        (Sqe){ .opc = 0x05, .prp1 = RAM_IOVA + O_IOCQ, .cdw10 = (63u << 16) | 0, .cdw11 = 1 });
    ck_assert_uint_eq(SC(e), 0x101);
    e = admin(
        (Sqe){ .opc = 0x05, .prp1 = RAM_IOVA + O_IOCQ, .cdw10 = (63u << 16) | 3, .cdw11 = 1 });
    ck_assert_uint_eq(SC(e), 0x101); /* above the 2 granted */
    e = admin((Sqe){ .opc = 0x05, .prp1 = RAM_IOVA + O_IOCQ, .cdw10 = 1, .cdw11 = 1 });
    ck_assert_uint_eq(SC(e), 0x102); /* one entry */
    e = admin(
        (Sqe){ .opc = 0x05, .prp1 = RAM_IOVA + O_IOCQ, .cdw10 = (1024u << 16) | 1, .cdw11 = 1 });
    ck_assert_uint_eq(SC(e), 0x102); /* above MQES + 1 */
    e = admin(
        (Sqe){ .opc = 0x05, .prp1 = RAM_IOVA + O_IOCQ, .cdw10 = (63u << 16) | 1, .cdw11 = 0 });
    ck_assert_uint_eq(SC(e), 0x02); /* PC = 0 */
    e = admin(
        (Sqe){ .opc = 0x05, .prp1 = RAM_IOVA + O_IOCQ + 64, .cdw10 = (63u << 16) | 1, .cdw11 = 1 });
    ck_assert_uint_eq(SC(e), 0x13);
    e = admin((Sqe){ .opc = 0x05,
                     .prp1 = RAM_IOVA + O_IOCQ,
                     .cdw10 = (63u << 16) | 1,
                     .cdw11 = (VECTORS << 16) | 3 });
    ck_assert_uint_eq(SC(e), 0x108);

    /* Create I/O SQ on a CQ that does not exist */
    e = admin((Sqe){ .opc = 0x01,
                     .prp1 = RAM_IOVA + O_IOSQ,
                     .cdw10 = (63u << 16) | 1,
                     .cdw11 = (1u << 16) | 1 });
    ck_assert_uint_eq(SC(e), 0x100);

    e = admin((Sqe){ .opc = 0x05,
                     .prp1 = RAM_IOVA + O_IOCQ,
                     .cdw10 = (63u << 16) | 1,
                     .cdw11 = (1u << 16) | 3 });
    ck_assert_uint_eq(SC(e), 0);
    e = admin((Sqe){ .opc = 0x05,
                     .prp1 = RAM_IOVA + O_IOCQ,
                     .cdw10 = (63u << 16) | 1,
                     .cdw11 = (1u << 16) | 3 });
    ck_assert_uint_eq(SC(e), 0x101); /* exists */
    e = admin((Sqe){ .opc = 0x01,
                     .prp1 = RAM_IOVA + O_IOSQ,
                     .cdw10 = (63u << 16) | 1,
                     .cdw11 = (1u << 16) | 1 });
    ck_assert_uint_eq(SC(e), 0);

    /* Number of Queues is fixed once queues exist (5.21.1.7). */
    e = admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = 0 });
    ck_assert_uint_eq(SC(e), 0x0c);
    /* A CQ with an SQ on it cannot go; the SQ first. */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x04, .cdw10 = 1 })), 0x10c);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x00, .cdw10 = 0 })), 0x101);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x00, .cdw10 = 1 })), 0);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x00, .cdw10 = 1 })), 0x101);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x04, .cdw10 = 1 })), 0);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x04, .cdw10 = 1 })), 0x101);
}
END_TEST

START_TEST(test_admin_queue_wraps)
{
    /* 150 commands through a 64-entry queue: tail, head and phase wrap. */
    enable();
    for (unsigned i = 0; i < 150; i++) {
        Cqe e = admin((Sqe){ .opc = 0x0a, .cdw10 = 0x06 });

        ck_assert_uint_eq(SC(e), 0);
        ck_assert_uint_eq(e.dw0, 1); /* write cache enabled */
    }
}
END_TEST

START_TEST(test_queue_outside_memory)
{
    /* An I/O SQ placed in unmapped memory: fetching fails, CSTS.CFS. */
    enable();
    admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = 0 });
    ck_assert_uint_eq(
        SC(admin(
            (Sqe){ .opc = 0x05, .prp1 = RAM_IOVA + O_IOCQ, .cdw10 = (63u << 16) | 1, .cdw11 = 1 })),
        0);
    ck_assert_uint_eq(
        SC(admin((Sqe){
            .opc = 0x01, .prp1 = OUTSIDE, .cdw10 = (63u << 16) | 1, .cdw11 = (1u << 16) | 1 })),
        0);
    setreg(DBS + 8, 1);
    poll();
    ck_assert_uint_eq(reg(CSTS) & 2, 2);
    /* A reset recovers. */
    disable();
    ck_assert_uint_eq(reg(CSTS) & 2, 0);
    enable();
}
END_TEST

START_TEST(test_bus_master)
{
    Sqe c = { .opc = 0x06, .prp1 = RAM_IOVA + O_BUF, .cdw10 = 1 };
    Cqe e;

    enable();
    cfg16(PCI_COMMAND, PCI_COMMAND_MEMORY); /* bus master off */
    sq_push(&R.aq, &c);
    poll();
    poll();
    ck_assert(!cq_pop(&R.aq, &e));
    ck_assert_uint_eq(R.ram[O_BUF + 4], 0); /* no DMA happened */
    cfg16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    poll();
    ck_assert(cq_pop(&R.aq, &e));
    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(R.ram[O_BUF + 4], 'T');
}
END_TEST

START_TEST(test_intx)
{
    Sqe c = { .opc = 0x0a, .cdw10 = 0x06 };
    Cqe e;

    cfg16(VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, 0); /* MSI-X off: INTx */
    enable();
    irq_count(R.intx);
    irq_count(R.msix[0]);
    admin(c);
    ck_assert_uint_eq(irq_count(R.intx), 1);
    ck_assert_uint_eq(irq_count(R.msix[0]), 0);

    /* Interrupt Disable in the command register */
    cfg16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE);
    admin(c);
    ck_assert_uint_eq(irq_count(R.intx), 0);
    cfg16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);

    /* INTMS masks; INTMC unmasks and the unread completion asserts again. */
    setreg(INTMS, 1);
    poll();
    ck_assert_uint_eq(reg(INTMS), 1);
    sq_push(&R.aq, &c);
    poll();
    ck_assert_uint_eq(irq_count(R.intx), 0);
    setreg(INTMC, 1);
    poll();
    ck_assert_uint_eq(reg(INTMS), 0);
    ck_assert_uint_eq(irq_count(R.intx), 1);
    ck_assert(cq_pop(&R.aq, &e));

    /* And MSI-X on again: vector 0 for the admin queue, no INTx. */
    cfg16(VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE);
    admin(c);
    ck_assert_uint_eq(irq_count(R.msix[0]), 1);
    ck_assert_uint_eq(irq_count(R.intx), 0);
}
END_TEST

/* --- MSI mode (rig_tcase_msi: 8 vectors, all enabled) --------------------------- */

/* Signals on each MSI vector since the last call, as a bit set. */
static uint32_t msi_fired(void)
{
    uint32_t got = 0;

    for (unsigned v = 0; v < MSI_VECTORS; v++) {
        if (irq_count(R.msi[v]) != 0) {
            got |= 1u << v;
        }
    }
    return got;
}

static void msi_enable(unsigned log2)
{
    cfg16(MSI_CAP + PCI_MSI_FLAGS, (uint16_t)(PCI_MSI_FLAGS_ENABLE | log2 << 4));
}

/* I/O queue pair 2 on interrupt vector @iv (queue 1 is the rig's, vector 1). */
static Q create_q2(uint32_t iv)
{
    Q q = { .qid = 2, .sq_off = 0xc000, .cq_off = 0xd000, .entries = 64, .phase = 1 };

    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x05,
                                      .prp1 = RAM_IOVA + q.cq_off,
                                      .cdw10 = (63u << 16) | 2,
                                      .cdw11 = iv << 16 | 3 })),
                      0);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x01,
                                      .prp1 = RAM_IOVA + q.sq_off,
                                      .cdw10 = (63u << 16) | 2,
                                      .cdw11 = (2u << 16) | 1 })),
                      0);
    return q;
}

static const Sqe flush = { .opc = 0x00, .nsid = 1 };

START_TEST(test_msi_vectors)
{
    Q q2;

    enable();
    msi_fired();
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x06 })), 0);
    ck_assert_uint_eq(msi_fired(), 1u << 0); /* admin CQ: vector 0 */
    ck_assert_uint_eq(irq_count(R.intx), 0);

    /* Create I/O CQ checks the IV against the 8 MSI vectors (not the 9
     * the MSI-X mode would have). */
    admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = (7u << 16) | 7u });
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x05,
                                      .prp1 = RAM_IOVA + O_IOCQ,
                                      .cdw10 = (63u << 16) | 1,
                                      .cdw11 = (MSI_VECTORS << 16) | 3 })),
                      0x108);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x09, .cdw11 = MSI_VECTORS })), 0x02);
    q2 = create_q2(MSI_VECTORS - 1);
    msi_fired();
    ck_assert_uint_eq(SC(submit(&q2, flush)), 0);
    ck_assert_uint_eq(msi_fired(), 1u << 7);

    /* PCI 3.0 6.8.3.4: with 4 enabled the device may only change the low 2
     * bits: IV 7 signals vector 3; with 1, everything is vector 0. */
    msi_enable(2);
    ck_assert_uint_eq(SC(submit(&q2, flush)), 0);
    ck_assert_uint_eq(msi_fired(), 1u << 3);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x06 })), 0);
    ck_assert_uint_eq(msi_fired(), 1u << 0);
    msi_enable(0);
    ck_assert_uint_eq(SC(submit(&q2, flush)), 0);
    ck_assert_uint_eq(msi_fired(), 1u << 0);

    /* MSI off: pin-based */
    cfg16(MSI_CAP + PCI_MSI_FLAGS, 0);
    ck_assert_uint_eq(SC(submit(&q2, flush)), 0);
    ck_assert_uint_eq(msi_fired(), 0);
    ck_assert_uint_eq(irq_count(R.intx), 1);
}
END_TEST

START_TEST(test_msi_masks)
{
    Sqe c = { .opc = 0x0a, .cdw10 = 0x06 };
    Q q2;
    Cqe e;

    enable();
    admin((Sqe){ .opc = 0x09, .cdw10 = 0x07, .cdw11 = (7u << 16) | 7u });
    q2 = create_q2(5);
    msi_fired();

    /* PCI 3.0 6.8.3.5: vector 5 masked: no message, Pending set; other
     * vectors still go; on unmask the message is sent, Pending cleared. */
    cfg32(MSI_CAP + PCI_MSI_MASK_64, 1u << 5);
    ck_assert_uint_eq(SC(submit(&q2, flush)), 0);
    ck_assert_uint_eq(msi_fired(), 0);
    ck_assert_uint_eq(cfgrd32(MSI_CAP + PCI_MSI_PENDING_64), 1u << 5);
    ck_assert_uint_eq(SC(admin(c)), 0);
    ck_assert_uint_eq(msi_fired(), 1u << 0);
    poll();
    ck_assert_uint_eq(msi_fired(), 0); /* still masked */
    cfg32(MSI_CAP + PCI_MSI_MASK_64, 0);
    poll();
    ck_assert_uint_eq(msi_fired(), 1u << 5);
    ck_assert_uint_eq(cfgrd32(MSI_CAP + PCI_MSI_PENDING_64), 0);
    poll();
    ck_assert_uint_eq(msi_fired(), 0); /* sent once */

    /* NVMe 1.4 3.1.3: INTMS bit 5 masks vector 5 too; INTMC sends it for
     * the completion still unread. */
    setreg(INTMS, 1u << 5);
    poll();
    sq_push(&q2, (Sqe[]){ flush });
    poll();
    ck_assert_uint_eq(msi_fired(), 0);
    setreg(INTMC, 1u << 5);
    poll();
    ck_assert_uint_eq(msi_fired(), 1u << 5);
    ck_assert(cq_pop(&q2, &e));
    ck_assert_uint_eq(SC(e), 0);
}
END_TEST

/* --- features, logs, AER ------------------------------------------------------ */

START_TEST(test_features)
{
    uint8_t *b = R.ram + O_BUF;
    uint64_t ms = 0;
    Cqe e;

    enable();
    /* Volatile Write Cache */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x06, .cdw11 = 0 })), 0);
    ck_assert_uint_eq(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x06 }).dw0, 0);
    ck_assert_uint_eq(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x06 | (1u << 8) }).dw0, 1);
    /* Temperature threshold, composite sensor */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x04, .cdw11 = 350 })), 0);
    ck_assert_uint_eq(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x04 }).dw0, 350);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x04, .cdw11 = 1u << 16 })), 0x02);
    /* Power state 1 does not exist */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x02, .cdw11 = 1 })), 0x02);
    /* Interrupt vector configuration: vector bounds */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x09, .cdw11 = (1u << 16) | 3 })), 0);
    ck_assert_uint_eq(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x09, .cdw11 = 3 }).dw0, (1u << 16) | 3);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x09, .cdw11 = VECTORS })), 0x02);
    /* Unknown feature; save requested */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x7f })), 0x02);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x0a, .cdw10 = 0x7f })), 0x02);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x06 | (1u << 31) })), 0x10d);

    /* Timestamp: set through a data buffer, read back no earlier. */
    memset(b, 0, 8);
    b[0] = 0x40;
    b[1] = 0x42;
    b[2] = 0x0f; /* 1000000 ms */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x09, .cdw10 = 0x0e, .prp1 = RAM_IOVA + O_BUF })), 0);
    memset(b, 0, 8);
    e = admin((Sqe){ .opc = 0x0a, .cdw10 = 0x0e, .prp1 = RAM_IOVA + O_BUF });
    ck_assert_uint_eq(SC(e), 0);
    for (int i = 5; i >= 0; i--) {
        ms = ms << 8 | b[i];
    }
    ck_assert_uint_ge(ms, 1000000);
    ck_assert_uint_lt(ms, 1000000 + 60000);
    ck_assert_uint_eq((b[6] >> 1) & 7, 1); /* origin: host */

    /* Abort: never aborts (DW0 bit 0 = 1) */
    e = admin((Sqe){ .opc = 0x08, .cdw10 = 5u << 16 });
    ck_assert_uint_eq(SC(e), 0);
    ck_assert_uint_eq(e.dw0 & 1, 1);
}
END_TEST

START_TEST(test_log_pages)
{
    static uint8_t data[4096];
    uint8_t *b = R.ram + O_BUF;
    uint64_t pages[1];
    uint32_t numd = 512 / 4 - 1;

    enable();
    create_io_queues();
    pages_of(pages, O_WDATA, 4096, 0, false);
    scatter(data, pages, 0, 4096);
    ck_assert_uint_eq(SC(rw(0x01, 0, 8, pages, 1, 0, 0)), 0);
    ck_assert_uint_eq(SC(rw(0x01, 8, 8, pages, 1, 0, 0)), 0);

    /* SMART / Health: temperature, spare, write command counter */
    memset(b, 0xee, 512);
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x02,
                                      .nsid = 0xffffffff,
                                      .prp1 = RAM_IOVA + O_BUF,
                                      .cdw10 = (numd << 16) | 0x02 })),
                      0);
    ck_assert_uint_eq(b[0], 0);               /* no warnings */
    ck_assert_uint_gt(b[1] | b[2] << 8, 273); /* Kelvin */
    ck_assert_uint_eq(b[3], 100);
    ck_assert_uint_eq(*(uint64_t *)(void *)(b + 80), 2); /* host writes */
    ck_assert_uint_eq(*(uint64_t *)(void *)(b + 48), 1); /* units, rounded up */
    /* Error log, firmware slot log */
    ck_assert_uint_eq(
        SC(admin((Sqe){ .opc = 0x02, .prp1 = RAM_IOVA + O_BUF, .cdw10 = (15u << 16) | 0x01 })), 0);
    ck_assert_uint_eq(
        SC(admin((Sqe){ .opc = 0x02, .prp1 = RAM_IOVA + O_BUF, .cdw10 = (numd << 16) | 0x03 })), 0);
    ck_assert_uint_eq(b[0], 1);
    ck_assert_mem_eq(b + 8, "1.0     ", 8);
    /* With an offset (LPA bit 2): the firmware revision is at byte 8 */
    ck_assert_uint_eq(
        SC(admin((Sqe){
            .opc = 0x02, .prp1 = RAM_IOVA + O_BUF, .cdw10 = (1u << 16) | 0x03, .cdw12 = 8 })),
        0);
    ck_assert_mem_eq(b, "1.0     ", 8);
    /* Unknown log, offset past the end, unaligned offset */
    ck_assert_uint_eq(
        SC(admin((Sqe){ .opc = 0x02, .prp1 = RAM_IOVA + O_BUF, .cdw10 = (numd << 16) | 0x70 })),
        0x109);
    ck_assert_uint_eq(
        SC(admin((Sqe){
            .opc = 0x02, .prp1 = RAM_IOVA + O_BUF, .cdw10 = (numd << 16) | 0x02, .cdw12 = 512 })),
        0x02);
    ck_assert_uint_eq(
        SC(admin((Sqe){
            .opc = 0x02, .prp1 = RAM_IOVA + O_BUF, .cdw10 = (numd << 16) | 0x02, .cdw12 = 2 })),
        0x02);
}
END_TEST

START_TEST(test_async_events)
{
    Sqe aer = { .opc = 0x0c };
    Cqe e;

    enable();
    for (int i = 0; i < 4; i++) { /* AERL + 1 = 4 */
        sq_push(&R.aq, &aer);
        poll();
        ck_assert(!cq_pop(&R.aq, &e));
    }
    e = admin(aer);
    ck_assert_uint_eq(SC(e), 0x105);
    /* Other commands still complete while AERs are held. */
    ck_assert_uint_eq(SC(admin((Sqe){ .opc = 0x18 })), 0);
    /* A controller reset drops them: four fit again. */
    disable();
    enable();
    for (int i = 0; i < 4; i++) {
        sq_push(&R.aq, &aer);
        poll();
        ck_assert(!cq_pop(&R.aq, &e));
    }
}
END_TEST

/* --- Controller Memory Buffer registers ------------------------------------ */

/* NVMe 1.4 3.1.11/3.1.12: CMBLOC BIR 2, OFST 0; CMBSZ as CMBSZ_RIG; CAP.CMBS
 * (bit 57) clear.  Read-only: a guest's write is undone by the next poll,
 * whether the controller is enabled or not, and a reset keeps them. */
START_TEST(test_cmb_registers)
{
    poll();
    ck_assert_uint_eq(reg(CMBLOC), 2);
    ck_assert_uint_eq(reg(CMBSZ), CMBSZ_RIG);
    ck_assert_uint_eq((reg(CAP + 4) >> (57 - 32)) & 1, 0);

    setreg(CMBLOC, 0xffffffff);
    setreg(CMBSZ, 0x1f);
    poll();
    ck_assert_uint_eq(reg(CMBLOC), 2);
    ck_assert_uint_eq(reg(CMBSZ), CMBSZ_RIG);

    enable();
    setreg(CMBLOC, 0);
    setreg(CMBSZ, 0);
    poll();
    ck_assert_uint_eq(reg(CMBLOC), 2);
    ck_assert_uint_eq(reg(CMBSZ), CMBSZ_RIG);

    vn_nvme_reset(R.n);
    ck_assert_uint_eq(reg(CMBLOC), 2);
    ck_assert_uint_eq(reg(CMBSZ), CMBSZ_RIG);
}
END_TEST

/* Without a CMB both read 0, and stay 0 when the guest writes them. */
START_TEST(test_cmb_registers_absent)
{
    poll();
    ck_assert_uint_eq(reg(CMBLOC), 0);
    ck_assert_uint_eq(reg(CMBSZ), 0);
    setreg(CMBLOC, 2);
    setreg(CMBSZ, CMBSZ_RIG);
    poll();
    ck_assert_uint_eq(reg(CMBLOC), 0);
    ck_assert_uint_eq(reg(CMBSZ), 0);
    vn_nvme_reset(R.n);
    ck_assert_uint_eq(reg(CMBLOC), 0);
    ck_assert_uint_eq(reg(CMBSZ), 0);
}
END_TEST

/* CMB sizes vn_nvme_new() takes (with memory) and refuses. */
static const struct {
    uint32_t mib;
    bool memory, ok;
} cmb_params[] = {
    { 0, false, true },   { 2, true, true },   { 4, true, true },  { 256, true, true },
    { 1, true, false },   { 3, true, false },  { 6, true, false }, { 257, true, false },
    { 512, true, false }, { 2, false, false }, { 0, true, false }, { 0xffffffffu, true, false },
};

START_TEST(test_cmb_params)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *path = g_build_filename(R.dir, rig_files[1], NULL);
    g_autofree uint8_t *bar0 = g_malloc0(VN_NVME_BAR0_SIZE);
    /* Reserved, never touched: the constructor only records it. */
    void *mem = mmap(NULL, 256u << 20, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    VnNvmeParams np = { .backing = path,
                        .size = 1 << 20,
                        .serial = "S2",
                        .vectors = 2,
                        .io_queues = 1,
                        .cmb_mib = cmb_params[_i].mib,
                        .cmb = cmb_params[_i].memory ? mem : NULL };
    VnNvme *n2;

    ck_assert(mem != MAP_FAILED);
    n2 = vn_nvme_new(&np, bar0, R.cfg, &error);
    if (cmb_params[_i].ok) {
        ck_assert_msg(n2 != NULL, "%u MiB: %s", cmb_params[_i].mib, error ? error->message : "");
    } else {
        ck_assert_msg(n2 == NULL, "%u MiB accepted", cmb_params[_i].mib);
        ck_assert_ptr_nonnull(error);
    }
    vn_nvme_free(n2);
    munmap(mem, 256u << 20);
    unlink(path);
}
END_TEST

static Suite *nvme_suite(void)
{
    Suite *s = suite_create("nvme");
    TCase *tc;

    tc = rig_tcase("enable");
    tcase_add_test(tc, test_enable_disable);
    tcase_add_test(tc, test_enable_bad_config);
    tcase_add_test(tc, test_shutdown);
    tcase_add_test(tc, test_function_reset);
    suite_add_tcase(s, tc);

    tc = rig_tcase("identify");
    tcase_add_test(tc, test_identify);
    tcase_add_test(tc, test_identify_errors);
    tcase_add_test(tc, test_identify_split_page);
    suite_add_tcase(s, tc);

    tc = rig_tcase("queues");
    tcase_add_test(tc, test_queues);
    tcase_add_test(tc, test_admin_queue_wraps);
    tcase_add_test(tc, test_queue_outside_memory);
    suite_add_tcase(s, tc);

    tc = rig_tcase("interrupts");
    tcase_add_test(tc, test_bus_master);
    tcase_add_test(tc, test_intx);
    suite_add_tcase(s, tc);

    tc = rig_tcase_msi("msi");
    tcase_add_test(tc, test_msi_vectors);
    tcase_add_test(tc, test_msi_masks);
    suite_add_tcase(s, tc);

    tc = rig_tcase("features");
    tcase_add_test(tc, test_features);
    tcase_add_test(tc, test_log_pages);
    tcase_add_test(tc, test_async_events);
    suite_add_tcase(s, tc);

    tc = rig_tcase_cmb("cmb");
    tcase_add_test(tc, test_cmb_registers);
    suite_add_tcase(s, tc);

    tc = rig_tcase("cmb absent");
    tcase_add_test(tc, test_cmb_registers_absent);
    tcase_add_loop_test(tc, test_cmb_params, 0, G_N_ELEMENTS(cmb_params));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(nvme_suite());
}
