/*
 * Unit tests of the lender (vfio-ntb/lending/lender.c, lender-irq.c): attach, region
 * accesses, DMA, interrupts, fencing.  The rig is lender-rig.h.
 */
#include "lender-rig.h"

#include "lending/lender-int.h"

#include <linux/pci_regs.h>

/* ---- attach ------------------------------------------------------------- */

START_TEST(test_attach_describes)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w;
    VnProtoDevice d;
    g_autoptr(JsonObject) o = NULL;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, &d);
    ck_assert(d.flags & VFIO_DEVICE_FLAGS_RESET);
    ck_assert_uint_eq(d.num_regions, VFIO_PCI_NUM_REGIONS);
    ck_assert_uint_eq(d.regions[0].size, BAR0_SIZE);
    ck_assert(d.regions[0].flags & VFIO_REGION_INFO_FLAG_MMAP);
    ck_assert_uint_gt(d.regions[0].segments[0], 0);
    ck_assert_uint_eq(d.regions[0].nr_sparse, 2);
    ck_assert_uint_eq(d.regions[0].sparse[1].offset, 0x2000);
    ck_assert_uint_eq(d.regions[0].sparse[1].size, 0x2000);
    ck_assert_uint_eq(d.regions[VFIO_PCI_CONFIG_REGION_INDEX].size, CFG_SIZE);
    ck_assert_uint_eq(d.regions[VFIO_PCI_CONFIG_REGION_INDEX].segments[0], 0);
    ck_assert(!(d.regions[VFIO_PCI_CONFIG_REGION_INDEX].flags & VFIO_REGION_INFO_FLAG_MMAP));
    ck_assert_uint_eq(d.regions[1].size, 0);
    ck_assert_uint_eq(d.num_irqs, VFIO_PCI_NUM_IRQS);
    ck_assert_uint_eq(d.irq_count[VFIO_PCI_MSIX_IRQ_INDEX], MSIX_VECTORS);
    ck_assert_uint_eq(d.irq_flags[VFIO_PCI_MSIX_IRQ_INDEX], VFIO_IRQ_INFO_EVENTFD);

    /* The BAR's segment is the device's BAR memory, both ways. */
    w = fw_window_map(b->fab, "lender", d.regions[0].segments[0], &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(w->size, BAR0_SIZE);
    w->host[0x2010] = 0xab;
    ck_assert_uint_eq(rig.fake.bar[0x2010], 0xab);
    rig.fake.bar[0x18] = 0x5a;
    ck_assert_uint_eq(w->host[0x18], 0x5a);
    vn_fabric_window_unmap(b->fab, w);
    /* ...and only the borrower may map it. */
    ck_assert_ptr_null(fw_window_map(c->fab, "lender", d.regions[0].segments[0], &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED));

    s = snap();
    ck_assert_str_eq(s.borrower, "b");
    ck_assert_uint_eq(s.st.requests, 1);
    o = vn_json_parse_object(s.json, -1, 65536, NULL);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(json_object_get_string_member(o, "device"), DEV);
    ck_assert_str_eq(json_object_get_string_member(o, "borrower"), "b");
    ck_assert_int_eq(json_object_get_int_member(o, "requests"), 1);
    ck_assert_int_eq(json_object_get_int_member(o, "fences"), 0);
    snap_clear(&s);
}
END_TEST

/* An ATTACH that names the borrower's largest window. */
static int attach_windowed(Borrower *b, uint64_t max_window, VnProtoDevice *d, char **message)
{
    VnProtoAttach a = { .irq_mode = VN_IRQ_MODE_FD, .max_window = max_window };
    g_autofree char *json = NULL;
    g_autofree char *text = NULL;
    g_autoptr(GError) error = NULL;
    int ret;

    g_strlcpy(a.device, DEV, sizeof(a.device));
    json = vn_proto_attach_to_json(&a);
    ret = req_msg(b, VN_PROTO_ATTACH, json, NULL, 0, &text);
    if (ret == 0) {
        ck_assert_msg(vn_proto_device_from_json(text, d, &error), "%s",
                      error ? error->message : "");
    } else if (message != NULL) {
        *message = g_steal_pointer(&text);
    }
    return ret;
}

/* A BAR larger than the borrower's windows comes as slices of one window
 * each (here 4 KiB windows, so BAR0's 16 KiB is 4), in order, and every
 * one of them is withdrawn at the fence. */
START_TEST(test_attach_cuts_large_bar)
{
    Borrower *b = borrower(0);
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w[4];
    VnProtoDevice d;

    /* Not a power of two: cut to the one below. */
    ck_assert_int_eq(attach_windowed(b, 0x1800, &d, NULL), 0);
    ck_assert_uint_eq(d.regions[0].size, BAR0_SIZE);
    ck_assert_uint_eq(d.regions[0].nr_segments, 4);
    ck_assert_uint_eq(d.regions[VFIO_PCI_CONFIG_REGION_INDEX].nr_segments, 0);
    for (uint32_t k = 0; k < 4; k++) {
        w[k] = fw_window_map(b->fab, "lender", d.regions[0].segments[k], &error);
        ck_assert_msg(w[k] != NULL, "%s", error ? error->message : "");
        ck_assert_uint_eq(w[k]->size, 0x1000);
        w[k]->host[0x10] = (uint8_t)(0xa0 + k);
    }
    for (uint32_t k = 0; k < 4; k++) {
        ck_assert_uint_eq(rig.fake.bar[k * 0x1000 + 0x10], 0xa0 + k);
        vn_fabric_window_unmap(b->fab, w[k]);
    }
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
    ck_assert(lender_free_and_clean());
    for (uint32_t k = 0; k < 4; k++) {
        ck_assert_ptr_null(fw_window_map(b->fab, "lender", d.regions[0].segments[k], &error));
        g_clear_error(&error);
    }
    /* Windows as large as the BAR: one segment. */
    ck_assert_int_eq(attach_windowed(b, BAR0_SIZE, &d, NULL), 0);
    ck_assert_uint_eq(d.regions[0].nr_segments, 1);
}
END_TEST

/* Windows smaller than a page cannot carry a BAR: refused, saying so, with
 * nothing left exported. */
START_TEST(test_attach_windows_too_small)
{
    Borrower *b = borrower(0);
    g_autofree char *message = NULL;
    VnProtoDevice d;

    ck_assert_int_eq(attach_windowed(b, 0x800, &d, &message), -EINVAL);
    ck_assert_msg(message != NULL && strstr(message, "smaller than a page") != NULL, "%s", message);
    ck_assert(lender_free_and_clean());
    attach_ok(b, VN_IRQ_MODE_FD, &d);
    ck_assert_uint_eq(d.regions[0].nr_segments, 1);
}
END_TEST

START_TEST(test_attach_busy_detach)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    g_autoptr(GError) error = NULL;
    g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
    g_autofree char *message = NULL;
    g_autoptr(JsonObject) o = NULL;
    VnFabricWindow *w;
    VnProtoDevice d;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, &d);
    /* Held: a second borrower is told by whom. */
    ck_assert_int_eq(req_msg(c, VN_PROTO_ATTACH, json, NULL, 0, &message), -EBUSY);
    ck_assert_ptr_nonnull(strstr(message, "lent to b"));
    ck_assert_int_eq(simple(c, VN_PROTO_DETACH), -EPERM);
    s = snap();
    ck_assert_str_eq(s.borrower, "b");
    snap_clear(&s);

    /* DETACH frees the device and withdraws the BAR segment. */
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
    s = snap();
    ck_assert_str_eq(s.borrower, "");
    ck_assert_uint_eq(s.st.fences, 1);
    o = vn_json_parse_object(s.json, -1, 65536, NULL);
    ck_assert(o != NULL && json_object_get_null_member(o, "borrower"));
    snap_clear(&s);
    w = fw_window_map(b->fab, "lender", d.regions[0].segments[0], &error);
    ck_assert_ptr_null(w);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND));
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), -EPERM);

    /* Now the other one can. */
    attach_ok(c, VN_IRQ_MODE_FD, NULL);
    s = snap();
    ck_assert_str_eq(s.borrower, "c");
    snap_clear(&s);
}
END_TEST

START_TEST(test_reattach_fresh)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    VnProtoDevice d1, d2;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, &d1);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);
    ck_assert_uint_eq(device_dma_count(), 1);
    attach_ok(b, VN_IRQ_MODE_RELAY, &d2);
    ck_assert_uint_eq(device_dma_count(), 0);
    ck_assert_uint_ne(d1.regions[0].segments[0], d2.regions[0].segments[0]);
    s = snap();
    ck_assert_str_eq(s.borrower, "b");
    ck_assert_uint_eq(s.st.fences, 1);
    ck_assert_uint_eq(s.st.windows, 0);
    snap_clear(&s);
    mem_free(&m);
}
END_TEST

static char *resume_json(VnIrqMode mode)
{
    VnProtoAttach a = { .irq_mode = mode, .resume = true };

    g_strlcpy(a.device, DEV, sizeof(a.device));
    return vn_proto_attach_to_json(&a);
}

/* The holder's worker died and another took over its QEMU: a resuming ATTACH describes the
 * attachment as it is -- the same segments, the device's DMA still mapped, nothing fenced.
 * Nobody else may resume it, not in another interrupt mode, and not one that is not there. */
START_TEST(test_resume_keeps_the_attachment)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    Mem m = mem_export(b, "lender");
    g_autofree char *fd_mode = resume_json(VN_IRQ_MODE_FD);
    g_autofree char *relay = resume_json(VN_IRQ_MODE_RELAY);
    g_autofree char *message = NULL;
    g_autoptr(VnFabricMsg) reply = NULL;
    g_autoptr(GError) error = NULL;
    VnProtoDevice d1, d2;
    Snap s;

    ck_assert_int_eq(req_msg(b, VN_PROTO_ATTACH, fd_mode, NULL, 0, &message), -ENODEV);
    g_clear_pointer(&message, g_free);
    attach_ok(b, VN_IRQ_MODE_FD, &d1);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);
    ck_assert_int_eq(req(b, VN_PROTO_ATTACH, fd_mode, NULL, 0, &reply), 0);
    ck_assert_msg(vn_proto_device_from_json(reply->json, &d2, &error), "%s",
                  error ? error->message : "");
    ck_assert_uint_eq(d1.regions[0].segments[0], d2.regions[0].segments[0]);
    ck_assert_uint_eq(device_dma_count(), 1);
    ck_assert_int_eq(req_msg(b, VN_PROTO_ATTACH, relay, NULL, 0, &message), -ENODEV);
    g_clear_pointer(&message, g_free);
    ck_assert_int_eq(req_msg(c, VN_PROTO_ATTACH, fd_mode, NULL, 0, &message), -EBUSY);
    s = snap();
    ck_assert_str_eq(s.borrower, "b");
    ck_assert_uint_eq(s.st.fences, 0);
    snap_clear(&s);
    ck_assert_uint_eq(device_dma_count(), 1);
    mem_free(&m);
}
END_TEST

static void lender_elsewhere_fn(void *data)
{
    g_autofree char *path = g_build_filename(rig.dir, "nobody.sock", NULL);

    vn_lender_free(rig.lender);
    rig.lender = vn_lender_new(rig.lfab, DEV, &vn_backend_vfio_user, path, NULL);
}

START_TEST(test_attach_no_device_server)
{
    Borrower *b = borrower(0);
    g_autofree char *json = attach_json(VN_IRQ_MODE_FD);
    g_autofree char *message = NULL;
    Snap s;

    /* A lender whose device server is not there refuses, and stays free. */
    on_loop(&rig.lend, lender_elsewhere_fn, NULL);
    ck_assert_int_eq(req_msg(b, VN_PROTO_ATTACH, json, NULL, 0, &message), -ENOENT);
    ck_assert_ptr_nonnull(strstr(message, "nobody.sock"));
    s = snap();
    ck_assert_str_eq(s.borrower, "");
    ck_assert_uint_eq(s.st.fences, 0);
    snap_clear(&s);
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), -EPERM);
}
END_TEST

/* ---- region accesses ---------------------------------------------------- */

START_TEST(test_region_rw)
{
    Borrower *b = borrower(0);
    uint32_t v = 0xcafef00d, got = 0;
    uint8_t buf[8];
    g_autofree char *message = NULL;
    VnProtoRegionRw bad = { .region = VFIO_PCI_CONFIG_REGION_INDEX,
                            .offset = CFG_SIZE - 2,
                            .count = 4 };
    g_autofree char *json = vn_proto_region_rw_to_json(DEV, &bad);
    int resets;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0x40, &v, 4, true), 0);
    ck_assert_int_eq(memcmp(rig.fake.cfg + 0x40, &v, 4), 0);
    memcpy(rig.fake.bar + 0x100, "trapped!", 8);
    ck_assert_int_eq(region_rw(b, 0, 0x100, buf, 8, false), 0);
    ck_assert_int_eq(memcmp(buf, "trapped!", 8), 0);
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0x40, &got, 4, false), 0);
    ck_assert_uint_eq(got, v);

    /* The device's own refusal comes back with its errno. */
    ck_assert_int_eq(req_msg(b, VN_PROTO_REGION_RW, json, NULL, 0, &message), -EINVAL);
    ck_assert_ptr_nonnull(strstr(message, "on the device"));

    resets = g_atomic_int_get(&rig.fake.resets);
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), 0);
    ck_assert_int_eq(g_atomic_int_get(&rig.fake.resets), resets + 1);

    s = snap();
    ck_assert_uint_eq(s.st.region_rw, 4);
    ck_assert_uint_eq(s.st.config_rw, 3);
    ck_assert_uint_eq(s.st.resets, 1);
    snap_clear(&s);
}
END_TEST

/* A server that decodes BAR accesses by address (QEMU's x-remote) needs the
 * device's BARs to have addresses: the vfio-user backend assigns them,
 * again after a reset. */
START_TEST(test_bars_assigned)
{
    Borrower *b = borrower(0);
    uint32_t bar0;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    memcpy(&bar0, rig.fake.cfg + PCI_BASE_ADDRESS_0, 4);
    ck_assert_uint_eq(GUINT32_FROM_LE(bar0), VN_BACKEND_VFIO_USER_BAR_BASE);
    ck_assert_uint_eq(VN_BACKEND_VFIO_USER_BAR_BASE % BAR0_SIZE, 0);

    memset(rig.fake.cfg + PCI_BASE_ADDRESS_0, 0, 4); /* what a device reset does */
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), 0);
    memcpy(&bar0, rig.fake.cfg + PCI_BASE_ADDRESS_0, 4);
    ck_assert_uint_eq(GUINT32_FROM_LE(bar0), VN_BACKEND_VFIO_USER_BAR_BASE);
    /* BAR1 has no region: left alone. */
    memcpy(&bar0, rig.fake.cfg + PCI_BASE_ADDRESS_1, 4);
    ck_assert_uint_eq(bar0, 0);
}
END_TEST

/* ---- DMA ---------------------------------------------------------------- */

START_TEST(test_dma_isolation)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    VnDma *dma = vn_server_dma(rig.server);
    uint8_t buf[8] = { 0 };
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(vn_dma_read(dma, 0x100000, buf, 4), -EFAULT);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);

    /* The device reaches the borrower's memory, both ways. */
    ck_assert_int_eq(vn_dma_write(dma, 0x100008, "hello", 5), 0);
    ck_assert_int_eq(memcmp(m.map + 8, "hello", 5), 0);
    memcpy(m.map + 0x3000, "guest", 5);
    ck_assert_int_eq(vn_dma_read(dma, 0x103000, buf, 5), 0);
    ck_assert_int_eq(memcmp(buf, "guest", 5), 0);

    /* A second mapping into the segment shares its window. */
    ck_assert_int_eq(dma_map(b, 0x200000, 0x1000, m.segment, 0x1000), 0);
    ck_assert_int_eq(vn_dma_write(dma, 0x200010, "two", 3), 0);
    ck_assert_int_eq(memcmp(m.map + 0x1010, "two", 3), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    ck_assert_uint_eq(s.st.dma_maps, 2);
    snap_clear(&s);

    /* When DMA_UNMAP returns, the device can no longer reach it. */
    ck_assert_int_eq(dma_unmap(b, 0x100000, MEM_SIZE, false), 0);
    ck_assert_int_eq(vn_dma_read(dma, 0x100008, buf, 4), -EFAULT);
    ck_assert_int_eq(vn_dma_write(dma, 0x100008, "x", 1), -EFAULT);
    ck_assert_int_eq(vn_dma_read(dma, 0x200010, buf, 3), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    snap_clear(&s);

    ck_assert_int_eq(dma_unmap(b, 0, 0, true), 0);
    ck_assert_int_eq(vn_dma_read(dma, 0x200010, buf, 3), -EFAULT);
    ck_assert_uint_eq(device_dma_count(), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 0);
    ck_assert_uint_eq(s.st.dma_unmaps, 2);
    snap_clear(&s);
    mem_free(&m);
}
END_TEST

/* A DMA_MAP naming another node maps that node's segment (another device's BAR, shared
 * with the lender: docs/p2p.md): the device's DMA reaches it, not the borrower's memory. */
START_TEST(test_dma_p2p_target)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    Mem bar = mem_export(c, "lender"); /* c's export, as a target's lender shares it */
    Mem notours = mem_export(c, "b");
    VnDma *dma = vn_server_dma(rig.server);
    VnProtoDmaMap m = { .iova = 0x800000,
                        .size = 0x2000,
                        .segment = bar.segment,
                        .offset = 0x1000,
                        .prot = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE };
    g_autofree char *json = NULL;
    g_autofree char *bad = NULL;
    g_autofree char *message = NULL;
    uint8_t buf[4] = { 0 };
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    g_strlcpy(m.peer, "c", sizeof(m.peer));
    json = vn_proto_dma_map_to_json(DEV, &m);
    ck_assert_int_eq(req(b, VN_PROTO_DMA_MAP, json, NULL, 0, NULL), 0);
    ck_assert_int_eq(vn_dma_write(dma, 0x800010, "p2p", 3), 0);
    ck_assert_int_eq(memcmp(bar.map + 0x1010, "p2p", 3), 0);
    s = snap();
    ck_assert_uint_eq(s.st.p2p_maps, 1);
    ck_assert_uint_eq(s.st.windows, 1);
    ck_assert_ptr_nonnull(strstr(s.json, "\"p2p_mappings\":[{\"iova\":8388608,\"size\":8192,"
                                         "\"peer\":\"c\""));
    snap_clear(&s);

    /* A segment c exported to someone else is not ours to map, whoever asks. */
    m.iova = 0x900000;
    m.segment = notours.segment;
    g_free(json);
    json = vn_proto_dma_map_to_json(DEV, &m);
    ck_assert_int_eq(req(b, VN_PROTO_DMA_MAP, json, NULL, 0, NULL), -EACCES);
    /* A peer that is no node name is refused before anything is tried. */
    bad = g_strdup_printf("{\"device\":\"%s\",\"iova\":4096,\"size\":4096,\"segment\":1,"
                          "\"offset\":0,\"prot\":3,\"peer\":\"../x\"}",
                          DEV);
    ck_assert_int_eq(req_msg(b, VN_PROTO_DMA_MAP, bad, NULL, 0, &message), -EINVAL);
    ck_assert_ptr_nonnull(strstr(message, "peer"));

    /* Unmapped like any mapping: the device cannot reach the target any more. */
    ck_assert_int_eq(dma_unmap(b, 0x800000, 0x2000, false), 0);
    ck_assert_int_eq(vn_dma_read(dma, 0x800010, buf, 3), -EFAULT);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 0);
    ck_assert_ptr_nonnull(strstr(s.json, "\"p2p_mappings\":[]"));
    snap_clear(&s);
    mem_free(&bar);
    mem_free(&notours);
}
END_TEST

START_TEST(test_dma_refused)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    Mem m = mem_export(b, "lender");
    Mem other = mem_export(b, "c");
    g_autofree char *message = NULL;
    VnProtoDmaMap beyond = { .iova = 0x100000,
                             .size = 0x2000,
                             .segment = m.segment,
                             .offset = MEM_SIZE - 0x1000,
                             .prot = VFIO_DMA_MAP_FLAG_READ };
    g_autofree char *json = vn_proto_dma_map_to_json(DEV, &beyond);
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    /* Past the end of the segment: refused, no window kept. */
    ck_assert_int_eq(req_msg(b, VN_PROTO_DMA_MAP, json, NULL, 0, &message), -EINVAL);
    ck_assert_ptr_nonnull(strstr(message, "outside segment"));
    /* A segment that is not there, or not ours to map. */
    ck_assert_int_eq(dma_map(b, 0x100000, 0x1000, 999, 0), -ENOENT);
    ck_assert_int_eq(dma_map(b, 0x100000, 0x1000, other.segment, 0), -EACCES);
    ck_assert_uint_eq(device_dma_count(), 0);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 0);
    ck_assert_uint_eq(s.st.dma_maps, 0);
    snap_clear(&s);

    /* The device refuses an overlap; the window of the first one stays. */
    ck_assert_int_eq(dma_map(b, 0x100000, 0x2000, m.segment, 0), 0);
    ck_assert_int_eq(dma_map(b, 0x101000, 0x2000, m.segment, 0), -EEXIST);
    /* Nothing mapped there: done, as with Linux's type1 IOMMU (the vfio backend's). */
    ck_assert_int_eq(dma_unmap(b, 0x300000, 0x1000, false), 0);
    ck_assert_uint_eq(device_dma_count(), 1);
    s = snap();
    ck_assert_uint_eq(s.st.windows, 1);
    snap_clear(&s);
    /* A non-borrower cannot unmap it. */
    ck_assert_int_eq(dma_unmap(c, 0, 0, true), -EPERM);
    ck_assert_uint_eq(device_dma_count(), 1);
    mem_free(&m);
    mem_free(&other);
}
END_TEST

/* ---- interrupts --------------------------------------------------------- */

START_TEST(test_irqs_fd)
{
    Borrower *b = borrower(0);
    VnIrqs *irqs = vn_server_irqs(rig.server);
    const uint32_t trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    const uint8_t masked = 1;
    int efd[MSIX_VECTORS];

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    for (unsigned i = 0; i < MSIX_VECTORS; i++) {
        efd[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        ck_assert_int_ge(efd[i], 0);
    }
    ck_assert_int_eq(set_irqs(b, trigger, VFIO_PCI_MSIX_IRQ_INDEX, 0, MSIX_VECTORS, false, NULL,
                              efd, MSIX_VECTORS),
                     0);
    /* The device signals the VM's eventfd itself. */
    ck_assert(vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 2));
    ck_assert_uint_eq(eventfd_wait(efd[2]), 1);
    ck_assert(!readable(efd[0]) && !readable(efd[1]) && !readable(efd[3]));

    /* DATA_BOOL masks go through as they are. */
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_MASK,
                              VFIO_PCI_MSIX_IRQ_INDEX, 1, 1, false, &masked, NULL, 0),
                     0);
    ck_assert(!vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 1));
    ck_assert(!readable(efd[1]));
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK,
                              VFIO_PCI_MSIX_IRQ_INDEX, 1, 1, false, NULL, NULL, 0),
                     0);
    ck_assert_uint_eq(eventfd_wait(efd[1]), 1);

    /* count 0 disables the index. */
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_MSIX_IRQ_INDEX, 0, 0, false, NULL, NULL, 0),
                     0);
    ck_assert(!device_irqs_any());
    ck_assert(!vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 2));
    for (unsigned i = 0; i < MSIX_VECTORS; i++) {
        close(efd[i]);
    }
}
END_TEST

START_TEST(test_irqs_relay)
{
    Borrower *b = borrower(0);
    VnIrqs *irqs = vn_server_irqs(rig.server);
    const uint32_t trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    g_autofree char *message = NULL;
    VnProtoSetIrqs high = { .flags = trigger,
                            .index = VFIO_PCI_MSIX_IRQ_INDEX,
                            .start = VN_PROTO_RELAY_VECTORS,
                            .count = 1,
                            .relay = true };
    g_autofree char *json = vn_proto_set_irqs_to_json(DEV, &high);
    int efd = eventfd(0, EFD_CLOEXEC);
    int fds_attached;
    Snap s;

    attach_ok(b, VN_IRQ_MODE_RELAY, NULL);
    fds_attached = count_fds();
    /* The borrower's bits: MSI-X from 4 on, INTx at 20. */
    ck_assert_int_eq(relay_irqs(b, VFIO_PCI_MSIX_IRQ_INDEX, 0, MSIX_VECTORS, 4), 0);
    ck_assert_int_eq(relay_irqs(b, VFIO_PCI_INTX_IRQ_INDEX, 0, 1, 20), 0);
    ck_assert(vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    WAIT_FOR(b->doorbells[7] == 1);
    ck_assert(vn_irqs_signal(irqs, VFIO_PCI_INTX_IRQ_INDEX, 0));
    WAIT_FOR(b->doorbells[20] == 1);
    ck_assert_uint_eq(b->doorbells[3] + b->doorbells[4] + b->doorbells[5] + b->doorbells[6], 0);
    s = snap();
    ck_assert_uint_eq(s.st.relayed_irqs, 2);
    snap_clear(&s);

    /* Vectors beyond the relay's, bits beyond any NTB's; fds in relay mode. */
    ck_assert_int_eq(req_msg(b, VN_PROTO_SET_IRQS, json, NULL, 0, &message), -ENOSPC);
    ck_assert_int_eq(relay_irqs(b, VFIO_PCI_MSIX_IRQ_INDEX, 0, 2, VN_FABRIC_MAX_DOORBELLS - 1),
                     -EINVAL);
    ck_assert_int_eq(set_irqs(b, trigger, VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, false, NULL, &efd, 1),
                     -EINVAL);

    /* De-assigning stops the relay. */
    ck_assert_int_eq(
        set_irqs(b, trigger, VFIO_PCI_MSIX_IRQ_INDEX, 0, MSIX_VECTORS, false, NULL, NULL, 0), 0);
    ck_assert(!vn_irqs_signal(irqs, VFIO_PCI_MSIX_IRQ_INDEX, 3));
    spin(50);
    ck_assert_uint_eq(b->doorbells[7], 1);
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_INTX_IRQ_INDEX, 0, 0, false, NULL, NULL, 0),
                     0);
    ck_assert(!device_irqs_any());
    /* ...and the lender's eventfds are gone with it (the device's copies
     * were closed before its reply, the lender's before its own). */
    ck_assert_int_eq(count_fds(), fds_attached);
    close(efd);
}
END_TEST

START_TEST(test_relay_needs_relay_mode)
{
    Borrower *b = borrower(0);

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(relay_irqs(b, VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, 0), -EINVAL);
    ck_assert(!device_irqs_any());
}
END_TEST

/* ---- fencing ------------------------------------------------------------ */

/* What a fence must have told the device (not merely what its server
 * undoes when the client goes): DMA_UNMAP, SET_IRQS off, RESET. */
typedef struct DeviceMark {
    uint64_t dma_unmaps;
    int msix_changes;
    int resets;
} DeviceMark;

static DeviceMark device_mark(void)
{
    return (DeviceMark){ .dma_unmaps = device_stats().dma_unmaps,
                         .msix_changes =
                             g_atomic_int_get(&rig.fake.irq_changes[VFIO_PCI_MSIX_IRQ_INDEX]),
                         .resets = g_atomic_int_get(&rig.fake.resets) };
}

static void device_was_fenced(const DeviceMark *before)
{
    DeviceMark now = device_mark();

    ck_assert_uint_eq(now.dma_unmaps, before->dma_unmaps + 1);
    ck_assert_int_eq(now.msix_changes, before->msix_changes + 1);
    /* One RESET, one more when the server saw the client go. */
    ck_assert_int_ge(now.resets, before->resets + 1);
    /* In the fence's order: interrupts off, then bus mastering off, then the reset last
     * (the first reset after them: the server's own comes later still). */
    int irqs_off = g_atomic_int_get(&rig.fake.irq_change_at);
    int master_off = g_atomic_int_get(&rig.fake.bus_master_off_at);
    int reset = g_atomic_int_get(&rig.fake.reset_at);

    ck_assert_int_gt(master_off, 0);
    ck_assert_int_lt(irqs_off, master_off);
    ck_assert_int_lt(master_off, reset);
}

/* A borrower with DMA and interrupts in place. */
static void busy_borrower(Borrower *b, Mem *m, int *efd)
{
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    *m = mem_export(b, "lender");
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m->segment, 0), 0);
    *efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ck_assert_int_eq(set_irqs(b, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                              VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, false, NULL, efd, 1),
                     0);
    ck_assert_uint_eq(device_dma_count(), 1);
    ck_assert(device_irqs_any());
}

START_TEST(test_fence_on_link_down)
{
    Borrower *b = borrower(0);
    DeviceMark mark;
    gint64 t0;
    Mem m;
    int efd;
    Snap s;

    busy_borrower(b, &m, &efd);
    mark = device_mark();
    t0 = now_ms();
    borrower_close(0);
    WAIT_FOR_MS(lender_free_and_clean(), 1000);
    ck_assert_int_lt(now_ms() - t0, 1000);
    device_was_fenced(&mark);
    ck_assert(!vn_irqs_signal(vn_server_irqs(rig.server), VFIO_PCI_MSIX_IRQ_INDEX, 0));
    s = snap();
    ck_assert_uint_eq(s.st.fences, 1);
    snap_clear(&s);

    /* A new borrower can attach. */
    attach_ok(borrower(1), VN_IRQ_MODE_FD, NULL);
    close(efd);
    mem_free(&m);
}
END_TEST

START_TEST(test_fence_on_detach)
{
    Borrower *b = borrower(0);
    DeviceMark mark;
    Mem m;
    int efd;

    busy_borrower(b, &m, &efd);
    mark = device_mark();
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), 0);
    /* Done before the reply. */
    ck_assert(lender_free_and_clean());
    device_was_fenced(&mark);
    close(efd);
    mem_free(&m);
}
END_TEST

static void lender_free_fn(void *data)
{
    g_clear_pointer(&rig.lender, vn_lender_free);
}

START_TEST(test_fence_on_free)
{
    Borrower *b = borrower(0);
    DeviceMark mark;
    Mem m;
    int efd;

    busy_borrower(b, &m, &efd);
    mark = device_mark();
    on_loop(&rig.lend, lender_free_fn, NULL);
    ck_assert_uint_eq(device_dma_count(), 0);
    ck_assert(!device_irqs_any());
    device_was_fenced(&mark);
    close(efd);
    mem_free(&m);
}
END_TEST

/* ---- the BAR guard ------------------------------------------------------ */

/* A config space with a power management capability at 0x40 and a PCIe one at 0x50. */
#define GUARD_PM 0x40u
#define GUARD_EXP 0x50u

static void guard_config(void)
{
    uint8_t *c = rig.fake.cfg;

    c[PCI_STATUS] = PCI_STATUS_CAP_LIST;
    c[PCI_CAPABILITY_LIST] = GUARD_PM;
    c[GUARD_PM] = PCI_CAP_ID_PM;
    c[GUARD_PM + 1] = GUARD_EXP;
    c[GUARD_EXP] = PCI_CAP_ID_EXP;
    c[GUARD_EXP + 1] = 0;
    c[PCI_COMMAND] = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
}

/* What the lender says of its guard: withheld now, and how often it withheld. */
static bool guard_state(int64_t *withholds)
{
    Snap s = snap();
    g_autoptr(JsonObject) o = vn_json_parse_object(s.json, -1, 65536, NULL);
    bool withheld;

    ck_assert_ptr_nonnull(o);
    withheld = json_object_get_boolean_member(o, "bars_withheld");
    *withholds = json_object_get_int_member(o, "bar_withholds");
    snap_clear(&s);
    return withheld;
}

static int cfg_write16(Borrower *b, uint32_t offset, uint16_t v)
{
    return region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, offset, &v, 2, true);
}

/* The paths onto the BARs are withheld before each write that may stop memory decode
 * (MEM cleared, a D-state change, an FLR) and before a reset, and given back only once the
 * device decodes its memory again (MEM set, D0), as the device itself then says; writes
 * that change nothing of that neither withhold nor give back. */
START_TEST(test_guard_memory_decode)
{
    Borrower *b = borrower(0);
    int64_t n = 0;

    guard_config();
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert(!guard_state(&n));
    ck_assert_int_eq(n, 0);
    /* MEM off; another register meanwhile keeps it off; MEM on gives them back. */
    ck_assert_int_eq(cfg_write16(b, PCI_COMMAND, PCI_COMMAND_MASTER), 0);
    ck_assert(guard_state(&n));
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(cfg_write16(b, 0x60, 0x1234), 0);
    ck_assert(guard_state(&n));
    ck_assert_int_eq(cfg_write16(b, PCI_COMMAND, PCI_COMMAND_MASTER | PCI_COMMAND_MEMORY), 0);
    ck_assert(!guard_state(&n));
    ck_assert_int_eq(n, 1);
    /* A write of MEM's byte that keeps it on, and one of the byte above it: nothing. */
    ck_assert_int_eq(cfg_write16(b, PCI_COMMAND, PCI_COMMAND_MASTER | PCI_COMMAND_MEMORY), 0);
    ck_assert_int_eq(
        region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, PCI_COMMAND + 1, &(uint8_t){ 0x04 }, 1, true),
        0);
    ck_assert(!guard_state(&n));
    ck_assert_int_eq(n, 1);
    /* D3hot: withheld until D0. */
    ck_assert_int_eq(cfg_write16(b, GUARD_PM + PCI_PM_CTRL, 3), 0);
    ck_assert(guard_state(&n));
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(cfg_write16(b, GUARD_PM + PCI_PM_CTRL, 0), 0);
    ck_assert(!guard_state(&n));
    /* An FLR (this fake keeps MEM on through it: given back at once), then a reset. */
    ck_assert_int_eq(cfg_write16(b, GUARD_EXP + PCI_EXP_DEVCTL, PCI_EXP_DEVCTL_BCR_FLR), 0);
    ck_assert(!guard_state(&n));
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(simple(b, VN_PROTO_RESET), 0);
    ck_assert(!guard_state(&n));
    ck_assert_int_eq(n, 4);
}
END_TEST

/* A device server whose capability list loops (a peer too) is walked a bounded number of
 * steps: the attach works, a MEM write is still guarded. */
START_TEST(test_guard_capability_loop)
{
    Borrower *b = borrower(0);
    int64_t n = 0;

    guard_config();
    rig.fake.cfg[GUARD_EXP + 1] = GUARD_PM; /* back to the first */
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(cfg_write16(b, PCI_COMMAND, 0), 0);
    ck_assert(guard_state(&n));
    ck_assert_int_eq(n, 1);
}
END_TEST

static Suite *lender_suite(void)
{
    Suite *s = suite_create("lender");
    TCase *tc;

    tc = tcase_create("attach");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_attach_describes);
    tcase_add_test(tc, test_attach_cuts_large_bar);
    tcase_add_test(tc, test_attach_windows_too_small);
    tcase_add_test(tc, test_attach_busy_detach);
    tcase_add_test(tc, test_reattach_fresh);
    tcase_add_test(tc, test_resume_keeps_the_attachment);
    tcase_add_test(tc, test_attach_no_device_server);
    suite_add_tcase(s, tc);

    tc = tcase_create("region");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_region_rw);
    tcase_add_test(tc, test_bars_assigned);
    suite_add_tcase(s, tc);

    tc = tcase_create("dma");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_dma_isolation);
    tcase_add_test(tc, test_dma_refused);
    tcase_add_test(tc, test_dma_p2p_target);
    suite_add_tcase(s, tc);

    tc = tcase_create("irqs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_irqs_fd);
    tcase_add_test(tc, test_irqs_relay);
    tcase_add_test(tc, test_relay_needs_relay_mode);
    suite_add_tcase(s, tc);

    tc = tcase_create("guard");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_guard_memory_decode);
    tcase_add_test(tc, test_guard_capability_loop);
    suite_add_tcase(s, tc);

    tc = tcase_create("fence");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_fence_on_link_down);
    tcase_add_test(tc, test_fence_on_detach);
    tcase_add_test(tc, test_fence_on_free);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    return vn_check_main(lender_suite());
}
