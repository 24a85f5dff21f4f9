/*
 * Unit tests of the seam between a lender and its device
 * (vfio-ntb/lending/backend.[ch]): a backend's tables are checked (the
 * device's when it is chosen, its IOMMU's at attach), backends are found by
 * name, and the lender reaches its device through the tables alone -- here a
 * spy that forwards to vfio-user and counts, under the lender rig's
 * borrower, lender and device server; the lender's fence against a fake
 * IOMMU of the test's own, which records what it was told; and the vfio
 * backend's refusals (its devices need a host with an IOMMU).
 */
#include "lender-rig.h"

#include "common/util.h"

#include "check-main.h"

#include <inttypes.h>
#include <stdarg.h>
#include <sys/stat.h>

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

/* ---- the IOMMU's table ---------------------------------------------------- */

/*
 * The fake IOMMU: a table of the test's own, whose object is `fake`.  It maps nothing; it
 * keeps the mappings it was given and logs each call, and each mapping an unmap drops, to
 * one log with the device's fence steps (the rec backend below), in the lender's thread.
 */
typedef struct FakeMap {
    uint64_t iova, size;
    int fd;       /* the window's fd the lender gave, borrowed */
    dev_t st_dev; /* ... and what it was then: still it when the mapping is dropped? */
    ino_t st_ino;
} FakeMap;

static struct {
    GMutex lock; /* both: written in the lender's thread, read in the test's */
    GPtrArray *log;
    GArray *maps; /* FakeMap */
} fake;

static void fake_log(const char *fmt, ...) G_GNUC_PRINTF(1, 2);
static void fake_log(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_mutex_lock(&fake.lock);
    g_ptr_array_add(fake.log, g_strdup_vprintf(fmt, ap));
    g_mutex_unlock(&fake.lock);
    va_end(ap);
}

/* The log so far as one line ("a; b; c"), and emptied when @clear. */
static char *fake_log_take(bool clear)
{
    g_autoptr(GString) s = g_string_new(NULL);

    g_mutex_lock(&fake.lock);
    for (guint i = 0; i < fake.log->len; i++) {
        g_string_append_printf(s, "%s%s", i > 0 ? "; " : "", (char *)fake.log->pdata[i]);
    }
    if (clear) {
        g_ptr_array_set_size(fake.log, 0);
    }
    g_mutex_unlock(&fake.lock);
    return g_string_free(g_steal_pointer(&s), FALSE);
}

/* Called in the lender's thread: what is wrong is logged (and so fails the test's
 * comparison), never asserted there. */
static int fake_map(void *iommu, uint64_t iova, uint64_t size, int fd, uint64_t offset,
                    uint32_t prot)
{
    FakeMap m = { .iova = iova, .size = size, .fd = fd };
    struct stat st;

    if (iommu != &fake || fstat(fd, &st) < 0) {
        fake_log("map 0x%" PRIx64 " with a wrong object or fd", iova);
        return -EINVAL;
    }
    m.st_dev = st.st_dev;
    m.st_ino = st.st_ino;
    g_mutex_lock(&fake.lock);
    g_array_append_val(fake.maps, m);
    g_mutex_unlock(&fake.lock);
    fake_log("map 0x%" PRIx64 "+0x%" PRIx64, iova, size);
    return 0;
}

static guint fake_maps_now(void)
{
    guint n;

    g_mutex_lock(&fake.lock);
    n = fake.maps->len;
    g_mutex_unlock(&fake.lock);
    return n;
}

/* vfio type1's semantics: all, or the mappings inside the range; each dropped one is
 * logged with whether the window the lender mapped it from was still there. */
static int fake_unmap(void *iommu, uint64_t iova, uint64_t size, bool all)
{
    g_autoptr(GArray) dropped = g_array_new(FALSE, FALSE, sizeof(FakeMap));

    if (iommu != &fake) {
        fake_log("unmap with a wrong object");
        return -EINVAL;
    }
    if (all) {
        fake_log("unmap all");
    } else {
        fake_log("unmap 0x%" PRIx64 "+0x%" PRIx64, iova, size);
    }
    g_mutex_lock(&fake.lock);
    for (guint i = 0; i < fake.maps->len;) {
        FakeMap *m = &g_array_index(fake.maps, FakeMap, i);

        if (!all && (m->iova < iova || m->iova + m->size > iova + size)) {
            i++;
            continue;
        }
        g_array_append_val(dropped, *m);
        g_array_remove_index(fake.maps, i);
    }
    g_mutex_unlock(&fake.lock);
    for (guint i = 0; i < dropped->len; i++) {
        const FakeMap *m = &g_array_index(dropped, FakeMap, i);
        struct stat st;
        bool held = fstat(m->fd, &st) == 0 && st.st_dev == m->st_dev && st.st_ino == m->st_ino;

        fake_log("drop 0x%" PRIx64 " (window %s)", m->iova, held ? "held" : "gone");
    }
    return 0;
}

static const VnBackendIommuOps fake_iommu_ops = {
    .name = "fake-iommu",
    .dma_map = fake_map,
    .dma_unmap = fake_unmap,
};

/* Tables with a hole, and what the check must name. */
static const struct {
    const char *hole;
    const char *named;
} iommu_holes[] = {
    { "table", "the table" }, { "name", "name" },           { "empty name", "name" },
    { "dma_map", "dma_map" }, { "dma_unmap", "dma_unmap" },
};

/* A table without a member it needs is refused, naming the member. */
START_TEST(test_iommu_table_holes)
{
    VnBackendIommuOps t = fake_iommu_ops;
    const VnBackendIommuOps *ops = &t;
    const char *hole = iommu_holes[_i].hole;
    g_autoptr(GError) error = NULL;

    if (strcmp(hole, "table") == 0) {
        ops = NULL;
    } else if (strcmp(hole, "name") == 0) {
        t.name = NULL;
    } else if (strcmp(hole, "empty name") == 0) {
        t.name = "";
    } else if (strcmp(hole, "dma_map") == 0) {
        t.dma_map = NULL;
    } else {
        t.dma_unmap = NULL;
    }
    ck_assert(!vn_backend_iommu_ops_valid(ops, &error));
    ck_assert_ptr_nonnull(error);
    ck_assert_msg(strstr(error->message, iommu_holes[_i].named) != NULL, "%s: %s", hole,
                  error->message);
    ck_assert_msg(strstr(error->message, "missing") != NULL, "%s", error->message);
}
END_TEST

/* The backends' own tables and the fake are whole; last_error may be absent. */
START_TEST(test_iommu_tables_whole)
{
    VnBackendIommuOps t = fake_iommu_ops;
    g_autoptr(GError) error = NULL;

    ck_assert(vn_backend_iommu_ops_valid(&vn_backend_vfio_user_iommu, NULL));
    ck_assert(vn_backend_iommu_ops_valid(&vn_backend_type1, NULL));
    ck_assert_ptr_nonnull(vn_backend_type1.last_error);
    ck_assert(vn_backend_iommu_ops_valid(&fake_iommu_ops, &error));
    ck_assert_ptr_null(error);
    t.last_error = NULL;
    ck_assert(vn_backend_iommu_ops_valid(&t, NULL));
    /* The refusal names the table. */
    t.dma_unmap = NULL;
    ck_assert(!vn_backend_iommu_ops_valid(&t, &error));
    ck_assert_msg(strstr(error->message, "fake-iommu") != NULL, "%s", error->message);
}
END_TEST

/* ---- the fence against the fake IOMMU ------------------------------------ */

/*
 * The rec backend: the rig's vfio-user device for the device's I/O, logging to the fake's
 * log the calls a fence makes (interrupts, the command register, reset, close); its IOMMU
 * is the fake (or rec_iommu_ops, when a test gives it another table).
 */
static const VnBackendIommuOps *rec_iommu_ops = &fake_iommu_ops; /* g_atomic_pointer_* */

static void *rec_open(const char *where, unsigned timeout_ms, VnBackendStallFn stall, void *opaque,
                      GError **error)
{
    return vn_backend_vfio_user.open(where, timeout_ms, stall, opaque, error);
}

static void rec_close(void *dev)
{
    fake_log("close");
    vn_backend_vfio_user.close(dev);
}

static int rec_get_info(void *dev, VnWireDeviceInfo *info)
{
    return vn_backend_vfio_user.get_info(dev, info);
}

static int rec_get_region_info(void *dev, uint32_t index, struct vfio_region_info *info, int *fd,
                               struct vfio_region_sparse_mmap_area *sparse, uint32_t max_sparse,
                               uint32_t *nr_sparse)
{
    return vn_backend_vfio_user.get_region_info(dev, index, info, fd, sparse, max_sparse,
                                                nr_sparse);
}

static int rec_get_irq_info(void *dev, uint32_t index, struct vfio_irq_info *info)
{
    return vn_backend_vfio_user.get_irq_info(dev, index, info);
}

static int rec_set_irqs(void *dev, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                        const uint8_t *bools, const int *fds)
{
    bool off = (flags & VFIO_IRQ_SET_DATA_NONE) && count == 0;

    fake_log("irqs %u %s", index, off ? "off" : "set");
    return vn_backend_vfio_user.set_irqs(dev, flags, index, start, count, bools, fds);
}

static int rec_read(void *dev, uint32_t region, uint64_t offset, void *buf, uint32_t count)
{
    return vn_backend_vfio_user.region_read(dev, region, offset, buf, count);
}

static int rec_write(void *dev, uint32_t region, uint64_t offset, const void *buf, uint32_t count)
{
    if (region == VFIO_PCI_CONFIG_REGION_INDEX && offset == PCI_COMMAND && count == 2) {
        uint16_t cmd;

        memcpy(&cmd, buf, 2);
        fake_log("bus master %s", GUINT16_FROM_LE(cmd) & PCI_COMMAND_MASTER ? "on" : "off");
    }
    return vn_backend_vfio_user.region_write(dev, region, offset, buf, count);
}

static int rec_reset(void *dev)
{
    fake_log("reset");
    return vn_backend_vfio_user.reset(dev);
}

static bool rec_stalled(void *dev)
{
    return vn_backend_vfio_user.stalled(dev);
}

static const VnBackendIommuOps *rec_iommu(void *dev, void **iommu)
{
    *iommu = &fake;
    return g_atomic_pointer_get(&rec_iommu_ops);
}

/* No hangup_fd: a device that cannot go on its own, so every fence closes it. */
static const VnBackendOps rec = {
    .name = "rec",
    .open = rec_open,
    .close = rec_close,
    .get_info = rec_get_info,
    .get_region_info = rec_get_region_info,
    .get_irq_info = rec_get_irq_info,
    .set_irqs = rec_set_irqs,
    .region_read = rec_read,
    .region_write = rec_write,
    .reset = rec_reset,
    .stalled = rec_stalled,
    .iommu = rec_iommu,
};

static void rec_setup(void)
{
    g_mutex_init(&fake.lock);
    fake.log = g_ptr_array_new_with_free_func(g_free);
    fake.maps = g_array_new(FALSE, FALSE, sizeof(FakeMap));
    g_atomic_pointer_set(&rec_iommu_ops, &fake_iommu_ops);
    rig_backend = &rec;
    setup();
}

static void rec_teardown(void)
{
    teardown();
    g_clear_pointer(&fake.log, g_ptr_array_unref);
    g_clear_pointer(&fake.maps, g_array_unref);
    g_mutex_clear(&fake.lock);
}

static bool fake_log_has(const char *what)
{
    g_autofree char *log = fake_log_take(false);

    return strstr(log, what) != NULL;
}

static void lender_free_fn(void *data)
{
    g_clear_pointer(&rig.lender, vn_lender_free);
}

/* What makes the lender fence. */
static const char *const fence_triggers[] = { "detach", "link down", "lender freed" };

/*
 * Whatever makes the lender fence, the IOMMU hears it in the fence's order (lender.c,
 * vn_lender_fence): the device's interrupts off and bus mastering off first, so it starts
 * no DMA; then one unmap of everything, which drops every mapping while the windows they
 * were mapped from are still there; then the reset, and the device is closed.
 */
START_TEST(test_fence_order)
{
    Borrower *b = borrower(0);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    g_autofree char *before = NULL;
    g_autofree char *log = NULL;
    Mem m;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    m = mem_export(b, "lender");
    ck_assert_int_eq(dma_map(b, 0x100000, 0x1000, m.segment, 0), 0);
    ck_assert_int_eq(dma_map(b, 0x200000, 0x2000, m.segment, 0x2000), 0);
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, false, NULL, &efd, 1),
                     0);
    /* The maps reached the fake, not the device server. */
    before = fake_log_take(true);
    ck_assert_str_eq(before, "map 0x100000+0x1000; map 0x200000+0x2000; irqs 2 set");
    ck_assert_uint_eq(device_dma_count(), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    snap_clear(&s);

    switch (_i) {
    case 0:
        ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
        break;
    case 1:
        borrower_close(0);
        WAIT_FOR(fake_log_has("close"));
        break;
    default:
        on_loop(&rig.lend, lender_free_fn, NULL);
        break;
    }
    log = fake_log_take(false);
    ck_assert_msg(strcmp(log, "irqs 0 off; irqs 2 off; bus master off; unmap all; "
                              "drop 0x100000 (window held); drop 0x200000 (window held); "
                              "reset; close") == 0,
                  "%s: %s", fence_triggers[_i], log);
    ck_assert_uint_eq(fake_maps_now(), 0);
    if (rig.lender != NULL) {
        s = snap();
        ck_assert_str_eq(s.borrower, "");
        ck_assert_uint_eq(s.st.windows, 0);
        ck_assert_uint_eq(s.st.fences, 1);
        snap_clear(&s);
    }
    close(efd);
    mem_free(&m);
}
END_TEST

/* A device whose IOMMU table has a hole is not lent: the attach is refused, naming it. */
START_TEST(test_attach_checks_the_iommu)
{
    static VnBackendIommuOps holed;
    Borrower *b = borrower(0);
    g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
    g_autofree char *message = NULL;
    Snap s;

    holed = fake_iommu_ops;
    holed.dma_unmap = NULL;
    g_atomic_pointer_set(&rec_iommu_ops, &holed);
    ck_assert_int_eq(req_msg(b, VN_PROTO_ATTACH, json, NULL, 0, &message), -EINVAL);
    ck_assert_msg(message != NULL && strstr(message, "fake-iommu: dma_map and dma_unmap missing"),
                  "%s", message != NULL ? message : "(none)");
    s = snap();
    ck_assert_str_eq(s.borrower, "");
    snap_clear(&s);
    ck_assert(fake_log_has("close"));

    g_atomic_pointer_set(&rec_iommu_ops, &fake_iommu_ops);
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
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

    tc = tcase_create("iommu table");
    tcase_add_loop_test(tc, test_iommu_table_holes, 0, G_N_ELEMENTS(iommu_holes));
    tcase_add_test(tc, test_iommu_tables_whole);
    suite_add_tcase(s, tc);

    tc = tcase_create("iommu");
    tcase_add_checked_fixture(tc, rec_setup, rec_teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_loop_test(tc, test_fence_order, 0, G_N_ELEMENTS(fence_triggers));
    tcase_add_test(tc, test_attach_checks_the_iommu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(backend_suite());
}
