/*
 * Unit tests of the lender against untrusted borrowers: malformed or foreign
 * requests get errors and change nothing.  The rig is lender-rig.h.
 */
#include "lender-rig.h"

/* ---- untrusted requests ------------------------------------------------- */

#define TRIG "\"flags\":36" /* DATA_EVENTFD | ACTION_TRIGGER */

/* Each is refused with @err and changes nothing (see test_refused). */
static const struct {
    const char *name;
    bool from_c; /* sent by a node that is not the borrower */
    uint32_t type;
    const char *json;
    size_t data_len; /* of @data: route 77 (never exported) first */
    int err;
} refused[] = {
    /* The fabric refuses this one before the lender sees it. */
    { "JSON that does not parse", false, VN_PROTO_REGION_RW, "{\"device\":", 0, EINVAL },
    { "no JSON", false, VN_PROTO_REGION_RW, NULL, 0, EINVAL },
    { "no device", false, VN_PROTO_RESET, "{}", 0, EINVAL },
    { "a bad device name", false, VN_PROTO_RESET, "{\"device\":\"../x\"}", 0, EINVAL },
    { "an unknown device", false, VN_PROTO_RESET, "{\"device\":\"sda\"}", 0, ENODEV },
    { "an unknown type", false, 99, "{\"device\":\"" DEV "\"}", 0, ENOTSUP },
    { "REGION_RW from a non-borrower", true, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":0,\"count\":4,\"write\":false}", 0, EPERM },
    { "DETACH from a non-borrower", true, VN_PROTO_DETACH, "{\"device\":\"" DEV "\"}", 0, EPERM },
    { "DMA_UNMAP from a non-borrower", true, VN_PROTO_DMA_UNMAP,
      "{\"device\":\"" DEV "\",\"iova\":0,\"size\":0,\"all\":true}", 0, EPERM },
    { "a region the device lacks", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":9,\"offset\":0,\"count\":4,\"write\":false}", 0, EINVAL },
    { "a region beyond the protocol", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":16,\"offset\":0,\"count\":4,\"write\":false}", 0,
      EINVAL },
    { "a write shorter than its count", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":0,\"count\":4,\"write\":true}", 3, EINVAL },
    { "a read with data", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":0,\"count\":4,\"write\":false}", 4, EINVAL },
    { "a count above the transfer limit", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":0,\"offset\":0,\"count\":1048577,\"write\":false}", 0,
      EINVAL },
    { "a negative offset", false, VN_PROTO_REGION_RW,
      "{\"device\":\"" DEV "\",\"region\":7,\"offset\":-1,\"count\":4,\"write\":false}", 0,
      EINVAL },
    { "DMA_MAP of segment 0", false, VN_PROTO_DMA_MAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":4096,\"segment\":0,\"offset\":0,"
      "\"prot\":3}",
      0, EINVAL },
    { "an empty DMA_MAP", false, VN_PROTO_DMA_MAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":0,\"segment\":1,\"offset\":0,"
      "\"prot\":3}",
      0, EINVAL },
    { "DMA_MAP with unknown prot bits", false, VN_PROTO_DMA_MAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":4096,\"segment\":1,\"offset\":0,"
      "\"prot\":4}",
      0, EINVAL },
    { "an empty DMA_UNMAP", false, VN_PROTO_DMA_UNMAP,
      "{\"device\":\"" DEV "\",\"iova\":4096,\"size\":0,\"all\":false}", 0, EINVAL },
    { "SET_IRQS with two data types", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\",\"flags\":35,\"index\":2,\"start\":0,\"count\":1,"
      "\"relay\":false,\"doorbell\":0}",
      0, EINVAL },
    { "SET_IRQS with fewer routes than vectors", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":2,\"start\":0,\"count\":2,"
      "\"relay\":false,\"doorbell\":0}",
      8, EINVAL },
    { "SET_IRQS with a route never exported", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":2,\"start\":0,\"count\":1,"
      "\"relay\":false,\"doorbell\":0}",
      8, ENOENT },
    { "SET_IRQS with more routes than a message carries", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":2,\"start\":0,\"count\":17,"
      "\"relay\":false,\"doorbell\":0}",
      17 * 8, EINVAL },
    { "SET_IRQS with routes and no DATA_EVENTFD", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\",\"flags\":33,\"index\":2,\"start\":0,\"count\":1,"
      "\"relay\":false,\"doorbell\":0}",
      8, EINVAL },
    { "SET_IRQS DATA_BOOL of the wrong length", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\",\"flags\":10,\"index\":2,\"start\":0,\"count\":2,"
      "\"relay\":false,\"doorbell\":0}",
      1, EINVAL },
    { "SET_IRQS of an index the device lacks", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":7,\"start\":0,\"count\":1,"
      "\"relay\":false,\"doorbell\":0}",
      8, EINVAL },
    { "SET_IRQS relay in fd mode", false, VN_PROTO_SET_IRQS,
      "{\"device\":\"" DEV "\"," TRIG ",\"index\":2,\"start\":0,\"count\":1,"
      "\"relay\":true,\"doorbell\":0}",
      0, EINVAL },
    { "ATTACH with an unknown irq_mode", true, VN_PROTO_ATTACH,
      "{\"device\":\"" DEV "\",\"irq_mode\":\"carrier-pigeon\"}", 0, EINVAL },
    { "RESET with data", false, VN_PROTO_RESET, "{\"device\":\"" DEV "\"}", 8, EINVAL },
    { "ATTACH with a max_window that is no number", true, VN_PROTO_ATTACH,
      "{\"device\":\"" DEV "\",\"irq_mode\":\"fd\",\"max_window\":\"big\"}", 0, EINVAL },
    { "ATTACH with a negative max_window", true, VN_PROTO_ATTACH,
      "{\"device\":\"" DEV "\",\"irq_mode\":\"fd\",\"max_window\":-4096}", 0, EINVAL },
};

START_TEST(test_refused)
{
    Borrower *b = borrower(0);
    Borrower *c = borrower(1);
    Mem m = mem_export(b, "lender");
    uint64_t data[17] = { GUINT64_TO_LE(77) };
    uint8_t cfg[CFG_SIZE];
    g_autofree char *message = NULL;
    uint64_t messages;
    Snap before, after;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    ck_assert_int_eq(dma_map(b, 0x100000, MEM_SIZE, m.segment, 0), 0);
    before = snap();
    messages = device_messages();
    memcpy(cfg, rig.fake.cfg, CFG_SIZE);

    ck_assert_msg(req_msg(refused[_i].from_c ? c : b, refused[_i].type, refused[_i].json,
                          refused[_i].data_len ? data : NULL, refused[_i].data_len,
                          &message) == -refused[_i].err,
                  "%s: not refused with %s", refused[_i].name, g_strerror(refused[_i].err));
    ck_assert_msg(message != NULL && strlen(message) > 0, "%s: no message", refused[_i].name);

    /* Nothing changed: no device traffic, same state, same counters. */
    after = snap();
    ck_assert_uint_eq(device_messages(), messages);
    ck_assert_str_eq(after.borrower, "b");
    ck_assert_uint_eq(after.st.requests, before.st.requests + (_i == 0 ? 0 : 1));
    after.st.requests = before.st.requests;
    ck_assert_msg(memcmp(&after.st, &before.st, sizeof(before.st)) == 0, "%s: counters",
                  refused[_i].name);
    ck_assert_uint_eq(device_dma_count(), 1);
    ck_assert_int_eq(memcmp(cfg, rig.fake.cfg, CFG_SIZE), 0);
    /* And the borrower is still served. */
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0, data, 4, false), 0);
    snap_clear(&before);
    snap_clear(&after);
    mem_free(&m);
}
END_TEST

START_TEST(test_not_attached)
{
    Borrower *b = borrower(0);
    uint64_t messages = device_messages(); /* the lender's connection, made at its start */
    uint8_t buf[4];

    /* Nothing is lent yet: only ATTACH is heard. */
    ck_assert_int_eq(region_rw(b, VFIO_PCI_CONFIG_REGION_INDEX, 0, buf, 4, false), -EPERM);
    ck_assert_int_eq(simple(b, VN_PROTO_DETACH), -EPERM);
    ck_assert_int_eq(device_messages(), messages);
}
END_TEST

/* A lender's description is a peer's too: a region's "segments" that do
 * not agree with its "segment", or are too many, or not ids, are refused
 * (the borrower would map what the lender never exported). */
#define REGION(extra)                                                    \
    "{\"flags\":0,\"irqs\":[],\"regions\":[{\"size\":16384,\"flags\":7," \
    "\"sparse\":[]," extra "}]}"
static const struct {
    const char *name;
    const char *json;
    uint32_t nr; /* segments when accepted; 0: refused */
} descriptions[] = {
    { "one segment", REGION("\"segment\":5"), 1 },
    { "three segments", REGION("\"segment\":5,\"segments\":[5,6,7]"), 3 },
    { "segments without a first", REGION("\"segment\":0,\"segments\":[5,6]"), 0 },
    { "segments that start elsewhere", REGION("\"segment\":5,\"segments\":[6,7]"), 0 },
    { "one segment as a list", REGION("\"segment\":5,\"segments\":[5]"), 0 },
    { "a segment 0 in the list", REGION("\"segment\":5,\"segments\":[5,0]"), 0 },
    { "a string in the list", REGION("\"segment\":5,\"segments\":[5,\"6\"]"), 0 },
    { "segments not a list", REGION("\"segment\":5,\"segments\":6"), 0 },
    { "17 segments",
      REGION("\"segment\":1,\"segments\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,"
             "15,16,17]"),
      0 },
};

START_TEST(test_description_segments)
{
    g_autoptr(GError) error = NULL;
    VnProtoDevice d;
    bool ok = vn_proto_device_from_json(descriptions[_i].json, &d, &error);

    ck_assert_msg(ok == (descriptions[_i].nr > 0), "%s: %s", descriptions[_i].name,
                  ok ? "accepted" : error->message);
    if (ok) {
        ck_assert_uint_eq(d.regions[0].nr_segments, descriptions[_i].nr);
        ck_assert_uint_eq(d.regions[0].segments[0], 5);
    }
}
END_TEST

/* ---- a borrower host that takes its time ----------------------------------- */

/* An answer, and its place among the answers the test saw. */
typedef struct Ordered {
    bool done;
    int err;
    int place;
} Ordered;

static int answers_seen;

static void on_ordered(void *opaque, VnFabricMsg *reply, int err)
{
    Ordered *o = opaque;

    o->done = true;
    o->err = err;
    o->place = ++answers_seen;
}

static void send_ordered(Borrower *b, uint32_t type, const char *json, Ordered *o)
{
    ck_assert_int_eq(vn_fabric_request(b->fab, "lender", type, json, NULL, 0, on_ordered, o), 0);
}

static char *map_json(uint64_t iova, uint64_t segment)
{
    VnProtoDmaMap m = { .iova = iova,
                        .size = MEM_SIZE,
                        .segment = segment,
                        .prot = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE };

    return vn_proto_dma_map_to_json(DEV, &m);
}

static void windows_fn(void *data)
{
    *(uint32_t *)data = vn_fabric_windows_in_use(rig.lfab);
}

static uint32_t lender_windows(void)
{
    uint32_t n;

    on_loop(&rig.lend, windows_fn, &n);
    return n;
}

/*
 * The lender's window onto a borrower's segment is the borrower host's to give, and it may
 * take its time (here: the test does not run the borrower's node, so its answer waits).
 * Meanwhile the lender's loop answers (a snapshot is taken on it), the requests the
 * borrower sent after the map wait for it, and they are answered after it, in order: the
 * unmap after it undoes it.
 */
START_TEST(test_map_wait_leaves_loop_free)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    g_autofree char *map = map_json(0x100000, m.segment);
    VnProtoDmaUnmap u = { .iova = 0x100000, .size = MEM_SIZE };
    g_autofree char *unmap = vn_proto_dma_unmap_to_json(DEV, &u);
    g_autofree char *map2 = map_json(0x200000, m.segment);
    Ordered first = { 0 }, second = { 0 }, third = { 0 };
    Snap s;

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    answers_seen = 0;
    send_ordered(b, VN_PROTO_DMA_MAP, map, &first);
    send_ordered(b, VN_PROTO_DMA_UNMAP, unmap, &second);
    send_ordered(b, VN_PROTO_DMA_MAP, map2, &third);
    /* The borrower's node is not run: the lender's map of its segment waits. */
    g_usleep(200 * 1000);
    s = snap();
    ck_assert(!first.done);
    ck_assert_uint_eq(s.st.queued, 2);
    ck_assert_uint_eq(s.st.dma_maps, 0);
    snap_clear(&s);

    WAIT_FOR(first.done && second.done && third.done);
    ck_assert_int_eq(first.err, 0);
    ck_assert_int_eq(second.err, 0);
    ck_assert_int_eq(third.err, 0);
    ck_assert_int_lt(first.place, second.place);
    ck_assert_int_lt(second.place, third.place);
    /* The unmap came after the map it undid; the third map shares the window. */
    ck_assert_uint_eq(device_dma_count(), 1);
    ck_assert_uint_eq(lender_windows(), 1);
    mem_free(&m);
}
END_TEST

/* Node d's loop, run by the test alone (not the borrowers'): d's records go out while b's
 * node, whose answer the lender's map waits for, stays still. */
static void d_run(GMainContext *dctx, int ms)
{
    gint64 end = now_ms() + ms;

    while (now_ms() < end) {
        if (!g_main_context_iteration(dctx, FALSE)) {
            g_usleep(500);
        }
    }
}

/* A node floods the lender with large writes while the borrower's map waits: what waits
 * behind the map holds at most VN_LENDER_MAX_QUEUED_BYTES (16 MiB; the fabric bounds their
 * number), the rest is refused with EBUSY at once, and what waited is handled after the
 * map (refused then: d holds nothing). */
#define FLOOD 20u
#define MIB (1024u * 1024u)

START_TEST(test_queue_bounded)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    g_autofree char *map = map_json(0x100000, m.segment);
    VnProtoRegionRw rw = { .region = VFIO_PCI_BAR0_REGION_INDEX, .count = MIB, .write = true };
    g_autofree char *write = vn_proto_region_rw_to_json(DEV, &rw);
    g_autofree uint8_t *data = g_malloc0(MIB);
    GMainContext *dctx = g_main_context_new();
    VnFabric *d = node_open("d", &borrower_handlers, NULL, dctx);
    Ordered o[FLOOD] = { { 0 } };
    Ordered first = { 0 };
    unsigned busy = 0, perm = 0;
    Snap s;

    ck_assert(vn_fabric_connect(d, "lender", NULL));
    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    send_ordered(b, VN_PROTO_DMA_MAP, map, &first);
    for (unsigned i = 0; i < FLOOD; i++) {
        ck_assert_int_eq(
            vn_fabric_request(d, "lender", VN_PROTO_REGION_RW, write, data, MIB, on_ordered, &o[i]),
            0);
        d_run(dctx, 20);
    }
    /* The refusals come at once, while the map still waits. */
    s = snap();
    for (int i = 0; i < 300 && s.st.refused_busy < FLOOD - 15; i++) {
        snap_clear(&s);
        d_run(dctx, 10);
        s = snap();
    }
    ck_assert_uint_eq(s.st.refused_busy, FLOOD - 15);
    ck_assert_uint_eq(s.st.dma_maps, 0);
    snap_clear(&s);
    for (unsigned i = 0; i < FLOOD; i++) {
        busy += o[i].done && o[i].err == -EBUSY;
    }
    ck_assert_uint_eq(busy, FLOOD - 15);
    /* b's node runs again: the map is answered, then what waited. */
    WAIT_FOR(first.done);
    ck_assert_int_eq(first.err, 0);
    for (int i = 0; i < 300 && perm < 15; i++) {
        d_run(dctx, 10);
        perm = 0;
        for (unsigned k = 0; k < FLOOD; k++) {
            perm += o[k].done && o[k].err == -EPERM;
        }
    }
    ck_assert_uint_eq(perm, 15);
    vn_fabric_close(d);
    g_main_context_unref(dctx);
    mem_free(&m);
}
END_TEST

static void fence_fn(void *data)
{
    vn_lender_peer_down(rig.lender, "b"); /* as its link going does */
}

/* The device is taken back (a fence: the borrower's link went) while a map waits for its window: the window that
 * comes is not kept, the map is refused, and nothing of the borrower's is mapped. */
START_TEST(test_fence_while_map_waits)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    g_autofree char *map = map_json(0x100000, m.segment);
    Ordered o = { 0 };

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    send_ordered(b, VN_PROTO_DMA_MAP, map, &o);
    g_usleep(100 * 1000);
    on_loop(&rig.lend, fence_fn, NULL);
    WAIT_FOR(o.done);
    ck_assert_int_eq(o.err, -ENODEV);
    ck_assert_uint_eq(device_dma_count(), 0);
    ck_assert_uint_eq(lender_windows(), 0);
    ck_assert(lender_free_and_clean());
    mem_free(&m);
}
END_TEST

static void lender_only_free(void *data)
{
    g_clear_pointer(&rig.lender, vn_lender_free);
}

/* The lender goes (its worker stops) while a map waits for its window and a request waits
 * behind it: the queued one is answered, the window that comes later finds nobody and is
 * let go (the sanitizer builds check that nothing freed is reached). */
START_TEST(test_lender_goes_while_map_waits)
{
    Borrower *b = borrower(0);
    Mem m = mem_export(b, "lender");
    g_autofree char *map = map_json(0x100000, m.segment);
    g_autofree char *map2 = map_json(0x200000, m.segment);
    Ordered first = { 0 }, second = { 0 };

    attach_ok(b, VN_IRQ_MODE_FD, NULL);
    send_ordered(b, VN_PROTO_DMA_MAP, map, &first);
    send_ordered(b, VN_PROTO_DMA_MAP, map2, &second);
    g_usleep(200 * 1000);
    on_loop(&rig.lend, lender_only_free, NULL);
    /* The borrower's node runs again: its answer to the map reaches the fabric alone. */
    WAIT_FOR(second.done);
    ck_assert_int_eq(second.err, -ESHUTDOWN);
    WAIT_FOR(lender_windows() == 0 && first.done);
    ck_assert_int_ne(first.err, 0);
    ck_assert_uint_eq(device_dma_count(), 0);
    mem_free(&m);
}
END_TEST

static Suite *lender_untrusted_suite(void)
{
    Suite *s = suite_create("lender-untrusted");
    TCase *tc;

    tc = tcase_create("untrusted");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_refused, 0, G_N_ELEMENTS(refused));
    tcase_add_test(tc, test_not_attached);
    suite_add_tcase(s, tc);
    tc = tcase_create("slow borrower host");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_map_wait_leaves_loop_free);
    tcase_add_test(tc, test_fence_while_map_waits);
    tcase_add_test(tc, test_lender_goes_while_map_waits);
    tcase_add_test(tc, test_queue_bounded);
    suite_add_tcase(s, tc);
    tc = tcase_create("description");
    tcase_add_loop_test(tc, test_description_segments, 0, G_N_ELEMENTS(descriptions));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(lender_untrusted_suite());
}
