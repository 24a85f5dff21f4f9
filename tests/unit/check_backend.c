/*
 * Unit tests of the seam between a lender and its device
 * (vfio-ntb/lending/backend.[ch]): a backend's table is checked when it is
 * chosen, backends are found by name, and the lender reaches its device
 * through the table alone -- here a spy that forwards to vfio-user and
 * counts, under the lender rig's borrower, lender and device server; and
 * the vfio backend's refusals (its devices need a host with an IOMMU).
 */
#include "lender-rig.h"

#include "common/util.h"

#include "check-main.h"

/* Calls the lender made through the spy, by op. */
static struct {
    gint open, close, get_info, region_info, irq_info, set_irqs, read, write, map, unmap, reset,
        stalled;
} calls;

static void *spy_open(const char *where, unsigned timeout_ms, VnBackendStallFn stall, void *opaque,
                      GError **error)
{
    g_atomic_int_inc(&calls.open);
    return vn_backend_vfio_user.open(where, timeout_ms, stall, opaque, error);
}

static void spy_close(void *dev)
{
    g_atomic_int_inc(&calls.close);
    vn_backend_vfio_user.close(dev);
}

/* The device request (VFIO_PCI_REQ_IRQ_INDEX) as a VFIO device has it: the
 * spy keeps the eventfd the lender gives it, to signal it as the host
 * kernel would. */
static int spy_req_fd = -1;

static int spy_get_info(void *dev, VnWireDeviceInfo *info)
{
    int ret = vn_backend_vfio_user.get_info(dev, info);

    g_atomic_int_inc(&calls.get_info);
    if (ret == 0) {
        info->num_irqs = MAX(info->num_irqs, VFIO_PCI_REQ_IRQ_INDEX + 1);
    }
    return ret;
}

static int spy_get_region_info(void *dev, uint32_t index, struct vfio_region_info *info, int *fd,
                               struct vfio_region_sparse_mmap_area *sparse, uint32_t max_sparse,
                               uint32_t *nr_sparse)
{
    g_atomic_int_inc(&calls.region_info);
    return vn_backend_vfio_user.get_region_info(dev, index, info, fd, sparse, max_sparse,
                                                nr_sparse);
}

static int spy_get_irq_info(void *dev, uint32_t index, struct vfio_irq_info *info)
{
    g_atomic_int_inc(&calls.irq_info);
    if (index == VFIO_PCI_REQ_IRQ_INDEX) {
        *info = (struct vfio_irq_info){
            .argsz = sizeof(*info), .index = index, .count = 1, .flags = VFIO_IRQ_INFO_EVENTFD
        };
        return 0;
    }
    return vn_backend_vfio_user.get_irq_info(dev, index, info);
}

static int spy_set_irqs(void *dev, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                        const uint8_t *bools, const int *fds)
{
    g_atomic_int_inc(&calls.set_irqs);
    if (index == VFIO_PCI_REQ_IRQ_INDEX) {
        vn_util_close_fd(&spy_req_fd);
        if ((flags & VFIO_IRQ_SET_DATA_EVENTFD) && count == 1 && fds[0] >= 0) {
            spy_req_fd = dup(fds[0]);
        }
        return 0;
    }
    return vn_backend_vfio_user.set_irqs(dev, flags, index, start, count, bools, fds);
}

static int spy_read(void *dev, uint32_t region, uint64_t offset, void *buf, uint32_t count)
{
    g_atomic_int_inc(&calls.read);
    return vn_backend_vfio_user.region_read(dev, region, offset, buf, count);
}

static int spy_write(void *dev, uint32_t region, uint64_t offset, const void *buf, uint32_t count)
{
    g_atomic_int_inc(&calls.write);
    return vn_backend_vfio_user.region_write(dev, region, offset, buf, count);
}

/* Where the spy's IOMMU has a hole, as x86's has for MSI. */
#define SPY_RESERVED 0xfee00000ull

/* The spy's IOMMU forwards to the vfio-user device's own (its object is that device). */
static int spy_map(void *iommu, uint64_t iova, uint64_t size, int fd, uint64_t offset,
                   uint32_t prot)
{
    void *inner = NULL;
    const VnBackendIommuOps *ops = vn_backend_vfio_user.iommu(iommu, &inner);

    g_atomic_int_inc(&calls.map);
    if (iova == SPY_RESERVED) {
        return -ERANGE;
    }
    return ops->dma_map(inner, iova, size, fd, offset, prot);
}

static int spy_unmap(void *iommu, uint64_t iova, uint64_t size, bool all)
{
    void *inner = NULL;
    const VnBackendIommuOps *ops = vn_backend_vfio_user.iommu(iommu, &inner);

    g_atomic_int_inc(&calls.unmap);
    return ops->dma_unmap(inner, iova, size, all);
}

static int spy_reset(void *dev)
{
    g_atomic_int_inc(&calls.reset);
    return vn_backend_vfio_user.reset(dev);
}

static bool spy_stalled(void *dev)
{
    g_atomic_int_inc(&calls.stalled);
    return vn_backend_vfio_user.stalled(dev);
}

static const char *spy_last_error(void *iommu)
{
    return "guest memory [0xfee00000, 0xfee00fff] collides with the IOMMU's reserved range";
}

static const VnBackendIommuOps spy_iommu_ops = {
    .name = "spy-iommu",
    .dma_map = spy_map,
    .dma_unmap = spy_unmap,
    .last_error = spy_last_error,
};

static const VnBackendIommuOps *spy_iommu(void *dev, void **iommu)
{
    *iommu = dev;
    return &spy_iommu_ops;
}

static const VnBackendOps spy = {
    .name = "spy",
    .open = spy_open,
    .close = spy_close,
    .get_info = spy_get_info,
    .get_region_info = spy_get_region_info,
    .get_irq_info = spy_get_irq_info,
    .set_irqs = spy_set_irqs,
    .region_read = spy_read,
    .region_write = spy_write,
    .reset = spy_reset,
    .stalled = spy_stalled,
    .iommu = spy_iommu,
};

static void spy_setup(void)
{
    memset(&calls, 0, sizeof(calls));
    vn_util_close_fd(&spy_req_fd);
    rig_backend = &spy;
    setup();
}

/* Each kind of request reaches the device through the table, and what the
 * device did is what the borrower sees. */
START_TEST(test_lender_uses_only_the_table)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    uint32_t v = 0x5eed5eed;
    uint8_t buf[8];
    int before;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(g_atomic_int_get(&calls.open), 1);
    ck_assert_int_ge(g_atomic_int_get(&calls.get_info), 1);
    ck_assert_int_ge(g_atomic_int_get(&calls.region_info), 2);
    ck_assert_int_ge(g_atomic_int_get(&calls.irq_info), 1);

    before = g_atomic_int_get(&calls.write);
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0x40, &v, 4, true), 0);
    ck_assert_int_eq(g_atomic_int_get(&calls.write), before + 1);
    ck_assert_int_eq(memcmp(rig.fake.cfg + 0x40, &v, 4), 0);
    memcpy(rig.fake.bar + 0x80, "via spy!", 8);
    before = g_atomic_int_get(&calls.read);
    ck_assert_int_eq(region_rw(b, 0, 0x80, buf, 8, false), 0);
    ck_assert_int_eq(g_atomic_int_get(&calls.read), before + 1);
    ck_assert_int_eq(memcmp(buf, "via spy!", 8), 0);

    ck_assert_int_eq(dma_map(b, 0x100000, 4096, m.segment, 0), 0);
    ck_assert_int_eq(g_atomic_int_get(&calls.map), 1);
    ck_assert_uint_eq(device_dma_count(), 1);
    ck_assert_int_eq(dma_unmap(b, 0x100000, 4096, false), 0);
    ck_assert_int_eq(g_atomic_int_get(&calls.unmap), 1);
    ck_assert_uint_eq(device_dma_count(), 0);

    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_MSIX_IRQ_INDEX, 0, 0, false, NULL, NULL, 0),
                     0);
    ck_assert_int_ge(g_atomic_int_get(&calls.set_irqs), 1);
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), 0);
    ck_assert_int_eq(g_atomic_int_get(&calls.reset), 1);
    s = snap(); /* the counters ask whether the device answers */
    ck_assert_int_ge(g_atomic_int_get(&calls.stalled), 1);
    snap_clear(&s);

    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
    ck_assert_int_eq(g_atomic_int_get(&calls.close), 1);
    mem_free(&m);
}
END_TEST

static gint requests_heard;

static void on_request(void *opaque)
{
    g_atomic_int_inc(&requests_heard);
}

static void hear_requests(void *data)
{
    vn_lender_on_device_request(rig.lender, on_request, NULL);
}

static void kernel_asks(void)
{
    uint64_t one = 1;

    ck_assert_int_ge(spy_req_fd, 0);
    ck_assert_int_eq(write(spy_req_fd, &one, sizeof(one)), sizeof(one));
}

/* The host kernel's device request: the lender registers an eventfd of its
 * own for it at attach, tells whoever listens each time the kernel asks,
 * fences by itself when the kernel keeps asking, and never lets the
 * borrower take the index over. */
START_TEST(test_device_request)
{
    Borrower *b = borrower(0);
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    Snap s;

    g_atomic_int_set(&requests_heard, 0);
    on_loop(&rig.lend, hear_requests, NULL);
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_ge(spy_req_fd, 0);
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_REQ_IRQ_INDEX, 0, 1, false, NULL, &efd, 1),
                     -EPERM);

    kernel_asks();
    WAIT_FOR(g_atomic_int_get(&requests_heard) == 1);
    s = snap();
    ck_assert_str_eq(s.borrower, "b"); /* a revoke is the daemon's to start */
    ck_assert_uint_eq(s.st.device_requests, 1);
    snap_clear(&s);
    for (int i = 1; i < VN_LENDER_REQUESTS_BEFORE_FENCE; i++) {
        kernel_asks();
        WAIT_FOR((s = snap(), snap_clear(&s), s.st.device_requests == (uint64_t)i + 1));
    }
    /* Asked again and again: the lender let the device go by itself. */
    s = snap();
    ck_assert_str_eq(s.borrower, "");
    ck_assert_uint_eq(s.st.fences, 1);
    ck_assert_int_eq(g_atomic_int_get(&requests_heard), VN_LENDER_REQUESTS_BEFORE_FENCE - 1);
    snap_clear(&s);
    close(efd);
}
END_TEST

/* A refusal the backend can say in words reaches the borrower in them. */
START_TEST(test_refusal_in_words)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    VnProtoDmaMap dm = { .iova = SPY_RESERVED,
                         .size = 4096,
                         .segment = m.segment,
                         .prot = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE };
    g_autofree char *json = vn_proto_dma_map_to_json(DEV, &dm);
    g_autofree char *message = NULL;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(req_msg(b, VN_PROTO_DMA_MAP, json, NULL, 0, &message), -ERANGE);
    ck_assert_msg(message != NULL && strstr(message, "collides with the IOMMU's reserved range"),
                  "%s", message != NULL ? message : "(none)");
    ck_assert_uint_eq(device_dma_count(), 0);
    mem_free(&m);
}
END_TEST

/* A table with a hole is refused when the lender is made, naming the hole;
 * a backend is found by name, an unknown one refused with the known ones. */
START_TEST(test_tables_checked)
{
    VnBackendOps holed = spy;
    g_autoptr(GError) error = NULL;

    ck_assert(vn_backend_ops_valid(&vn_backend_vfio_user, NULL));
    ck_assert(vn_backend_ops_valid(&spy, NULL));
    holed.iommu = NULL;
    ck_assert(!vn_backend_ops_valid(&holed, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "iommu"));
    g_clear_error(&error);
    ck_assert_ptr_null(vn_lender_new(rig.lfab, "other", &holed, rig.sock, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "spy"));
    g_clear_error(&error);
    ck_assert(!vn_backend_ops_valid(NULL, NULL));

    ck_assert_ptr_eq(vn_backend_find("vfio-user", NULL), &vn_backend_vfio_user);
    ck_assert_ptr_null(vn_backend_find("vfio-pci-please", &error));
    ck_assert_ptr_nonnull(strstr(error->message, "known: vfio-user"));
}
END_TEST

/* The vfio backend refuses what it cannot lend, saying why: a malformed
 * address, a function this host does not have, one in no IOMMU group
 * (this machine has PCI functions and no IOMMU). */
START_TEST(test_vfio_refusals)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GDir) dir = g_dir_open("/sys/bus/pci/devices", 0, NULL);
    const char *some = dir != NULL ? g_dir_read_name(dir) : NULL;

    ck_assert(vn_backend_ops_valid(&vn_backend_vfio, NULL));
    ck_assert_ptr_eq(vn_backend_find("vfio", NULL), &vn_backend_vfio);
    ck_assert_ptr_null(vn_backend_vfio.open("0000:00:1f.8", 1000, NULL, NULL, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "not a PCI address"));
    g_clear_error(&error);
    ck_assert_ptr_null(vn_backend_vfio.open("00:1f.0", 1000, NULL, NULL, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "not a PCI address"));
    g_clear_error(&error);
    ck_assert_ptr_null(vn_backend_vfio.open("0000:7f:1f.7", 1000, NULL, NULL, &error));
    ck_assert_msg(strstr(error->message, "no PCI function 0000:7f:1f.7") != NULL, "%s",
                  error->message);
    g_clear_error(&error);
    if (some != NULL && !g_file_test("/sys/kernel/iommu_groups/0", G_FILE_TEST_EXISTS)) {
        ck_assert_ptr_null(vn_backend_vfio.open(some, 1000, NULL, NULL, &error));
        ck_assert_msg(strstr(error->message, "in no IOMMU group") != NULL, "%s", error->message);
    }
}
END_TEST

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("backend");

    tcase_add_checked_fixture(tc, spy_setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_lender_uses_only_the_table);
    tcase_add_test(tc, test_tables_checked);
    tcase_add_test(tc, test_device_request);
    tcase_add_test(tc, test_refusal_in_words);
    tcase_add_test(tc, test_vfio_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(backend_suite());
}
