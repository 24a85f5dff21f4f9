/*
 * Unit tests of the simulated NVMe controller's I/O path
 * (vfio-ntb/simdev/nvme-io.c): PRPs and PRP lists (chained, unaligned, at
 * MDTS), Read/Write/Flush/Write Zeroes against the backing file, every
 * guest-controlled value that must fail (LBA range, MDTS, namespace, PRP
 * offsets, addresses outside guest memory), the backing file itself, and
 * data pointers into the controller's own CMB.  The rig is in nvme-rig.h.
 */
#include "check-main.h"
#include "nvme-rig.h"

START_TEST(test_io_roundtrip)
{
    VnNvmeStats st;

    enable();
    create_io_queues();
    irq_count(R.msix[1]);
    roundtrip(0, 512, 0, 0, 1);                 /* one block, PRP1 only */
    ck_assert_uint_ge(irq_count(R.msix[1]), 1); /* CQ 1 uses vector 1 */
    ck_assert_uint_eq(irq_count(R.msix[2]), 0);
    roundtrip(8, 8192, 0, 0, 2);              /* two pages: PRP2 page */
    roundtrip(40, 4096, 0x200, 0, 3);         /* offset: spans 2 pages */
    roundtrip(64, 65536, 0, 0, 4);            /* PRP list */
    roundtrip(200, 65536, 0x600, 0, 5);       /* list, unaligned start */
    roundtrip(1000, 1u << 20, 0x200, 0, 6);   /* MDTS, 257 pages */
    roundtrip(5000, 65536, 0, PG - 3 * 8, 7); /* list chains after 2 */
    roundtrip(NS_BLOCKS - 8, 4096, 0, 0, 8);  /* last blocks */

    /* Flush and Write Zeroes */
    ck_assert_uint_eq(SC(submit(&R.ioq, (Sqe){ .opc = 0x00, .nsid = 1 })), 0);
    ck_assert_uint_eq(SC(submit(&R.ioq, (Sqe){ .opc = 0x00, .nsid = 0xffffffff })), 0);
    ck_assert_uint_eq(
        SC(submit(&R.ioq, (Sqe){ .opc = 0x08, .nsid = 1, .cdw10 = 64, .cdw12 = 127 })), 0);
    {
        uint64_t rp[16];
        unsigned nr = pages_of(rp, O_RDATA, 65536, 0, false);
        uint8_t *back = g_malloc(65536);
        uint8_t *zero = g_malloc0(65536);

        memset(R.ram + O_RDATA, 0xaa, 65536);
        ck_assert_uint_eq(SC(rw(0x02, 64, 128, rp, nr, 0, 0)), 0);
        gather(back, rp, 0, 65536);
        ck_assert_mem_eq(back, zero, 65536);
        g_free(back);
        g_free(zero);
    }
    vn_nvme_stats(R.n, &st);
    ck_assert_uint_eq(st.errors, 0);
    ck_assert_uint_ge(st.blocks_written, 2048 + 128);
}
END_TEST

/*
 * Guest RAM as two DMA mappings (as QEMU maps RAM below and above a hole),
 * whose host mappings are not adjacent, and buffers whose pages are spread
 * over both in a scrambled order with gaps: a multi-page PRP list transfer
 * that crosses non-contiguous guest pages and a mapping boundary, in both
 * directions, unaligned, then one contiguous run straddling the boundary.
 * The data must land where the PRPs say, and in the file.
 */
START_TEST(test_io_scattered_mappings)
{
    const uint64_t half = RAM_SIZE / 2, base = 0x3c0000; /* pages 0x3c0000..0x440000 */
    const uint32_t off = 0x200, len = 62 * PG;           /* 63 pages */
    uint64_t wp[64], rp[64], run[16];
    g_autofree uint8_t *data = g_malloc(len), *back = g_malloc(len), *file = g_malloc(len);
    int fd;

    ck_assert_int_eq(vn_dma_unmap(R.dma, RAM_IOVA, RAM_SIZE, false), RAM_SIZE);
    ck_assert_int_eq(vn_dma_map(R.dma, RAM_IOVA, half, 0,
                                VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, dup(R.ramfd)),
                     0);
    ck_assert_int_eq(vn_dma_map(R.dma, RAM_IOVA + half, half, half,
                                VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, dup(R.ramfd)),
                     0);
    enable();
    create_io_queues();
    /* page i of the buffer: slot (i * 37) % 64, even slots written, odd read */
    for (unsigned i = 0; i < 63; i++) {
        uint64_t slot = (i * 37u) % 64u;

        wp[i] = RAM_IOVA + base + 2 * slot * PG;
        rp[i] = RAM_IOVA + base + (2 * slot + 1) * PG;
    }
    fill(data, len, 11);
    scatter(data, wp, off, len);
    ck_assert_uint_eq(SC(rw(0x01, 300, len / 512, wp, 63, off, 0)), 0);
    memset(R.ram + base, 0, 128 * PG);
    ck_assert_uint_eq(SC(rw(0x02, 300, len / 512, rp, 63, off, 0)), 0);
    gather(back, rp, off, len);
    ck_assert_mem_eq(back, data, len);
    for (unsigned i = 0; i < 63; i++) { /* the gaps stayed untouched */
        ck_assert_uint_eq(R.ram[wp[i] - RAM_IOVA + PG / 2], 0);
    }
    fd = open(R.backing, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, file, len, 300 * 512), (ssize_t)len);
    ck_assert_mem_eq(file, data, len);

    /* 16 contiguous pages across the boundary: one segment, two mappings */
    for (unsigned i = 0; i < 16; i++) {
        run[i] = RAM_IOVA + half - 8 * PG + i * PG;
    }
    memset(R.ram + half - 8 * PG, 0, 16 * PG);
    ck_assert_uint_eq(SC(rw(0x02, 300, 16 * PG / 512, run, 16, 0, 0)), 0);
    gather(back, run, 0, 16 * PG);
    ck_assert_int_eq(pread(fd, file, 16 * PG, 300 * 512), 16 * PG);
    ck_assert_mem_eq(back, file, 16 * PG);
    close(fd);
}
END_TEST

START_TEST(test_io_errors)
{
    uint64_t pages[4] = { RAM_IOVA + O_WDATA, RAM_IOVA + O_WDATA + PG, RAM_IOVA + O_WDATA + 2 * PG,
                          RAM_IOVA + O_WDATA + 3 * PG };
    Cqe e;

    enable();
    create_io_queues();
    /* LBA range past the end, and NLB reaching past it */
    ck_assert_uint_eq(SC(rw(0x02, NS_BLOCKS, 1, pages, 1, 0, 0)), 0x80);
    ck_assert_uint_eq(SC(rw(0x01, NS_BLOCKS - 4, 8, pages, 1, 0, 0)), 0x80);
    ck_assert_uint_eq(SC(rw(0x02, NS_BLOCKS - 4, 5, pages, 2, 0, 0)), 0x80);
    ck_assert_uint_eq(SC(rw(0x02, NS_BLOCKS - 4, 4, pages, 1, 0, 0)), 0);
    ck_assert_uint_eq(SC(rw(0x02, 1ull << 40, 1, pages, 1, 0, 0)), 0x80);
    /* Above MDTS (1 MiB): 2049 blocks */
    e = submit(
        &R.ioq,
        (Sqe){
            .opc = 0x02, .nsid = 1, .cdw12 = 2048, .prp1 = pages[0], .prp2 = RAM_IOVA + O_LIST });
    ck_assert_uint_eq(SC(e), 0x02);
    /* Wrong namespace, unknown opcode, SGL requested */
    e = submit(&R.ioq, (Sqe){ .opc = 0x02, .nsid = 2, .prp1 = pages[0] });
    ck_assert_uint_eq(SC(e), 0x0b);
    ck_assert_uint_eq(SC(submit(&R.ioq, (Sqe){ .opc = 0x7f, .nsid = 1 })), 0x01);
    e = submit(&R.ioq, (Sqe){ .opc = 0x02, .nsid = 1, .flags = 0x40, .prp1 = pages[0] });
    ck_assert_uint_eq(SC(e), 0x02);

    /* A PRP outside guest memory: Data Transfer Error, nothing touched. */
    e = submit(&R.ioq, (Sqe){ .opc = 0x02, .nsid = 1, .prp1 = OUTSIDE });
    ck_assert_uint_eq(SC(e), 0x04);
    e = submit(&R.ioq, (Sqe){ .opc = 0x01, .nsid = 1, .prp1 = OUTSIDE });
    ck_assert_uint_eq(SC(e), 0x04);
    /* ... straddling the end of the mapping */
    e = submit(&R.ioq, (Sqe){ .opc = 0x02,
                              .nsid = 1,
                              .cdw12 = 15,
                              .prp1 = RAM_IOVA + RAM_SIZE - PG,
                              .prp2 = RAM_IOVA + RAM_SIZE });
    ck_assert_uint_eq(SC(e), 0x04);
    /* ... a PRP list that is itself outside */
    e = submit(&R.ioq,
               (Sqe){ .opc = 0x02, .nsid = 1, .cdw12 = 23, .prp1 = pages[0], .prp2 = OUTSIDE });
    ck_assert_uint_eq(SC(e), 0x04);
    /* ... an entry of a good list pointing outside */
    {
        uint64_t bad[3] = { pages[0], pages[1], OUTSIDE };

        ck_assert_uint_eq(SC(rw(0x02, 0, 24, bad, 3, 0, 0)), 0x04);
    }
    /* A list entry with an offset, a list pointer not qword aligned */
    {
        uint64_t bad[3] = { pages[0], pages[1], pages[2] + 0x10 };

        ck_assert_uint_eq(SC(rw(0x02, 0, 24, bad, 3, 0, 0)), 0x13);
    }
    e = submit(
        &R.ioq,
        (Sqe){
            .opc = 0x02, .nsid = 1, .cdw12 = 23, .prp1 = pages[0], .prp2 = RAM_IOVA + O_LIST + 4 });
    ck_assert_uint_eq(SC(e), 0x13);

    /* The controller is still healthy. */
    ck_assert_uint_eq(reg(CSTS) & 2, 0);
    roundtrip(16, 16384, 0, 0, 9);
}
END_TEST

START_TEST(test_backing_file)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *path = g_build_filename(R.dir, rig_files[1], NULL);
    g_autofree uint8_t *bar0 = g_malloc0(VN_NVME_BAR0_SIZE);
    VnNvmeParams np = {
        .backing = path, .size = 1 << 20, .serial = "S2", .vectors = 2, .io_queues = 1
    };
    struct stat st;
    VnNvme *n2;
    int fd;

    /* Existing data is kept and the file extended, not cut. */
    fd = open(path, O_CREAT | O_RDWR, 0644);
    ck_assert_int_eq(pwrite(fd, "keep", 4, 0), 4);
    close(fd);
    n2 = vn_nvme_new(&np, bar0, R.cfg, &error);
    ck_assert_msg(n2 != NULL, "%s", error ? error->message : "");
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_size, 1 << 20);
    vn_nvme_free(n2);
    fd = open(path, O_RDONLY);
    {
        char buf[4];

        ck_assert_int_eq(pread(fd, buf, 4, 0), 4);
        ck_assert_mem_eq(buf, "keep", 4);
    }
    close(fd);

    /* The same file twice at once is refused (our rig holds R.backing). */
    np.backing = R.backing;
    ck_assert_ptr_null(vn_nvme_new(&np, bar0, R.cfg, &error));
    ck_assert_ptr_nonnull(error);
    g_clear_error(&error);

    /* Bad parameters */
    np.backing = path;
    np.size = 1000;
    ck_assert_ptr_null(vn_nvme_new(&np, bar0, R.cfg, &error));
    g_clear_error(&error);
    np.size = 1 << 20;
    np.serial = "a serial that is much too long";
    ck_assert_ptr_null(vn_nvme_new(&np, bar0, R.cfg, &error));
    g_clear_error(&error);
    unlink(path);
}
END_TEST

/* --- The controller's own CMB as a data buffer (NVMe 1.4 4.7) -------------- */

/* Page addresses of a buffer at @cmb_off in the CMB (BAR2 at CMB_ADDR). */
static unsigned cmb_pages(uint64_t *pages, uint32_t cmb_off, uint32_t len, uint32_t off)
{
    unsigned n = (off + len + PG - 1) / PG;

    for (unsigned i = 0; i < n; i++) {
        pages[i] = CMB_ADDR + cmb_off + (uint64_t)i * PG;
    }
    return n;
}

static void file_pwrite(const void *buf, size_t len, uint64_t slba)
{
    int fd = open(R.backing, O_WRONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, buf, len, (off_t)slba * 512), (ssize_t)len);
    close(fd);
}

static void file_pread(void *buf, size_t len, uint64_t slba)
{
    int fd = open(R.backing, O_RDONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, buf, len, (off_t)slba * 512), (ssize_t)len);
    close(fd);
}

/*
 * Data pointers at the address the host gave BAR2 are the CMB: a Read lands
 * there and not in the guest memory the DMA table has at the same addresses
 * (the decoy), a Write takes its data from there; a buffer half in host
 * memory, half in the CMB; a PRP list kept in the CMB; admin data.
 */
START_TEST(test_cmb_transfers)
{
    static uint8_t data[65536], back[65536];
    uint64_t pages[17];
    unsigned np;

    enable();
    create_io_queues();
    cmb_place(CMB_ADDR);
    cmb_decoy();
    fill(data, sizeof(data), 11);
    file_pwrite(data, sizeof(data), 0);

    /* 64 KiB read, unaligned start, PRP list in host memory */
    np = cmb_pages(pages, 0x10000, sizeof(data), 0x200);
    ck_assert_uint_eq(SC(rw(0x02, 0, 128, pages, np, 0x200, 0)), 0);
    ck_assert_mem_eq(R.cmb + 0x10200, data, sizeof(data));
    ck_assert(all_bytes(R.decoy, 3 * CMB_SIZE, 0));

    /* 8 KiB write from the CMB: the file has the CMB's bytes */
    fill(R.cmb + 0x40000, 8192, 12);
    np = cmb_pages(pages, 0x40000, 8192, 0);
    ck_assert_uint_eq(SC(rw(0x01, 200, 16, pages, np, 0, 0)), 0);
    file_pread(back, 8192, 200);
    ck_assert_mem_eq(back, R.cmb + 0x40000, 8192);

    /* Mixed: PRP1 a host page, PRP2 a CMB page, both directions */
    pages[0] = RAM_IOVA + O_RDATA;
    pages[1] = CMB_ADDR + 0x50000;
    memset(R.ram + O_RDATA, 0, PG);
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, pages, 2, 0, 0)), 0);
    ck_assert_mem_eq(R.ram + O_RDATA, data, PG);
    ck_assert_mem_eq(R.cmb + 0x50000, data + PG, PG);
    fill(R.ram + O_RDATA, PG, 13);
    fill(R.cmb + 0x50000, PG, 14);
    ck_assert_uint_eq(SC(rw(0x01, 300, 16, pages, 2, 0, 0)), 0);
    file_pread(back, 8192, 300);
    ck_assert_mem_eq(back, R.ram + O_RDATA, PG);
    ck_assert_mem_eq(back + PG, R.cmb + 0x50000, PG);

    /* A PRP list in the CMB whose entries are host pages */
    {
        uint64_t list[2] = { RAM_IOVA + O_RDATA + PG, RAM_IOVA + O_RDATA + 2 * PG };
        Sqe c = { .opc = 0x02,
                  .nsid = 1,
                  .cdw12 = 23,
                  .prp1 = RAM_IOVA + O_RDATA,
                  .prp2 = CMB_ADDR + 0x60000 };

        memcpy(R.cmb + 0x60000, list, sizeof(list));
        memset(R.ram + O_RDATA, 0, 3 * PG);
        ck_assert_uint_eq(SC(submit(&R.ioq, c)), 0);
        ck_assert_mem_eq(R.ram + O_RDATA, data, 3 * PG);
    }

    /* Admin data: Identify Controller into the CMB (VID first) */
    ck_assert_uint_eq(SC(identify(1, 0, CMB_ADDR + 0x70000, 0)), 0);
    ck_assert_uint_eq(R.cmb[0x70000] | R.cmb[0x70001] << 8, 0x1de1);
    ck_assert(all_bytes(R.decoy, 3 * CMB_SIZE, 0));
}
END_TEST

/* A buffer that runs over either end of the CMB ends with Data Transfer
 * Error and moves nothing: not into the CMB, not into the guest memory
 * around it, not into the file. */
START_TEST(test_cmb_edges)
{
    static uint8_t before[8192], after[8192];
    uint64_t past[2] = { CMB_ADDR + CMB_SIZE - PG, CMB_ADDR + CMB_SIZE };
    uint64_t below[2] = { CMB_ADDR - PG, CMB_ADDR };

    enable();
    create_io_queues();
    cmb_place(CMB_ADDR);
    cmb_decoy();
    fill(before, sizeof(before), 21);
    file_pwrite(before, sizeof(before), 0);
    memset(R.cmb, 0x5a, CMB_SIZE);

    ck_assert_uint_eq(SC(rw(0x02, 0, 16, past, 2, 0, 0)), 0x04);
    ck_assert_uint_eq(SC(rw(0x02, 0, 2, past, 2, PG - 512, 0)), 0x04);
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, below, 2, 0, 0)), 0x04);
    ck_assert_uint_eq(SC(rw(0x01, 0, 16, past, 2, 0, 0)), 0x04);
    ck_assert_uint_eq(SC(rw(0x01, 0, 16, below, 2, 0, 0)), 0x04);
    ck_assert_uint_eq(SC(identify(1, 0, CMB_ADDR + CMB_SIZE - 2048, CMB_ADDR + CMB_SIZE)), 0x04);

    ck_assert(all_bytes(R.cmb, CMB_SIZE, 0x5a));
    ck_assert(all_bytes(R.decoy, 3 * CMB_SIZE, 0));
    file_pread(after, sizeof(after), 0);
    ck_assert_mem_eq(after, before, sizeof(after));
    ck_assert_uint_eq(reg(CSTS) & 2, 0);
}
END_TEST

/* The CMB answers only at the BAR's address with memory decoding on: before
 * the BAR is assigned, with Memory Space Enable clear, and at an address
 * the BAR left, the same addresses are host memory. */
START_TEST(test_cmb_decoding)
{
    static uint8_t data[8192];
    uint64_t at_addr[2] = { CMB_ADDR, CMB_ADDR + PG };
    uint64_t moved = CMB_ADDR + CMB_SIZE;
    uint8_t *decoy_at;

    enable();
    create_io_queues();
    cmb_decoy();
    decoy_at = R.decoy + CMB_SIZE; /* the decoy's bytes at CMB_ADDR */
    fill(data, sizeof(data), 31);
    file_pwrite(data, sizeof(data), 0);

    /* BAR2 still 0 */
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, at_addr, 2, 0, 0)), 0);
    ck_assert_mem_eq(decoy_at, data, sizeof(data));
    ck_assert(all_bytes(R.cmb, CMB_SIZE, 0));

    /* Assigned, but memory decoding off */
    memset(decoy_at, 0, sizeof(data));
    cmb_place(CMB_ADDR);
    cfg16(PCI_COMMAND, PCI_COMMAND_MASTER);
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, at_addr, 2, 0, 0)), 0);
    ck_assert_mem_eq(decoy_at, data, sizeof(data));
    ck_assert(all_bytes(R.cmb, CMB_SIZE, 0));

    /* Decoding on: the CMB */
    memset(decoy_at, 0, sizeof(data));
    cfg16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, at_addr, 2, 0, 0)), 0);
    ck_assert_mem_eq(R.cmb, data, sizeof(data));
    ck_assert(all_bytes(R.decoy, 3 * CMB_SIZE, 0));

    /* Moved up by its size: the old address is host memory again */
    memset(R.cmb, 0, sizeof(data));
    cmb_place(moved);
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, at_addr, 2, 0, 0)), 0);
    ck_assert_mem_eq(decoy_at, data, sizeof(data));
    ck_assert(all_bytes(R.cmb, CMB_SIZE, 0));
    at_addr[0] = moved;
    at_addr[1] = moved + PG;
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, at_addr, 2, 0, 0)), 0);
    ck_assert_mem_eq(R.cmb, data, sizeof(data));
}
END_TEST

/* A controller reset (CC.EN 1 -> 0) and a function reset keep the CMB's
 * contents (nvme.c: NVMe leaves them alone). */
START_TEST(test_cmb_reset_keeps)
{
    static uint8_t data[8192];
    uint64_t pages[2];
    unsigned np;

    enable();
    create_io_queues();
    cmb_place(CMB_ADDR);
    fill(data, sizeof(data), 41);
    file_pwrite(data, sizeof(data), 0);
    np = cmb_pages(pages, 0x1000, sizeof(data), 0);
    ck_assert_uint_eq(SC(rw(0x02, 0, 16, pages, np, 0, 0)), 0);
    disable();
    ck_assert_mem_eq(R.cmb + 0x1000, data, sizeof(data));
    vn_nvme_reset(R.n);
    ck_assert_mem_eq(R.cmb + 0x1000, data, sizeof(data));
}
END_TEST

static Suite *nvme_io_suite(void)
{
    Suite *s = suite_create("nvme_io");
    TCase *tc;

    tc = rig_tcase("transfers");
    tcase_add_test(tc, test_io_roundtrip);
    tcase_add_test(tc, test_io_scattered_mappings);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = rig_tcase("errors");
    tcase_add_test(tc, test_io_errors);
    suite_add_tcase(s, tc);

    tc = rig_tcase("namespace");
    tcase_add_test(tc, test_backing_file);
    suite_add_tcase(s, tc);

    tc = rig_tcase_cmb("cmb");
    tcase_add_test(tc, test_cmb_transfers);
    tcase_add_test(tc, test_cmb_edges);
    tcase_add_test(tc, test_cmb_decoding);
    tcase_add_test(tc, test_cmb_reset_keeps);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(nvme_io_suite());
}
