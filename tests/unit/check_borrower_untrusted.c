/*
 * Unit tests of the borrower against a lender of the test's own: a fabric node ("lender",
 * in a thread of its own) that speaks the lending protocol as the test tells it to,
 * rightly or wrongly on purpose, and writes down the DMA maps and unmaps it is asked for.
 * The borrower runs in a thread of its own; QEMU is a vfio-user client in the test's
 * thread.  What must hold: a bad answer fails what asked for it with an error that says
 * so, the borrower goes on serving (or, at its start, says why it cannot), and a lender
 * that goes mid-request leaves QEMU an error, not a wait; an unmapped DMA mapping lingers
 * at the lender no longer and no more than it is allowed to, and never under a new one.
 */
#include "check-main.h"
#include "fabric-wait.h"
#include "loop-rig.h"

#include "borrower/borrower.h"
#include "lending/proto.h"
#include "vfio-user/client.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <linux/pci_regs.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEV "nvme0"
#define BAR0_SIZE 0x1000u

/* How the lender answers (set by the test, read in the lender's thread). */
typedef enum Lie {
    LIE_NONE,
    LIE_BAD_DESCRIPTION, /* ATTACH: a description that is not one */
    LIE_SHORT_CONFIG,    /* the config space read: 100 bytes for 256 */
    LIE_SHORT_READ,      /* a BAR read: half the bytes asked for */
    LIE_HOLD_READ,       /* a BAR read: never answered */
    LIE_HOLD_UNMAP,      /* a DMA_UNMAP: answered when the test says (hold_answer) */
} Lie;

static struct {
    char *dir;
    char *sock;
    Loop lend, bor;
    VnFabric *lfab, *bfab;
    VnBorrower *b;
    char *refusal;
    gint started; /* atomic: the borrower's start ended */
    gint lie;     /* atomic: a Lie */
    gint held;    /* atomic: BAR reads the lender holds */
    GMutex dma_lock;
    GString *dma_log;    /* the lender's DMA requests, one line each (dma_lock) */
    GArray *held_unmaps; /* LIE_HOLD_UNMAP: their tokens (dma_lock) */
} t;

/* ---- the lender --------------------------------------------------------- */

static void config_space(uint8_t *cfg)
{
    memset(cfg, 0, PCI_CFG_SPACE_SIZE);
    cfg[PCI_VENDOR_ID] = 0x86;
    cfg[PCI_VENDOR_ID + 1] = 0x80;
    cfg[PCI_DEVICE_ID] = 0x53;
    cfg[PCI_DEVICE_ID + 1] = 0x09;
}

/* A config region and one trapped BAR (no window: every access is a request). */
static char *device_json(void)
{
    VnProtoDevice d = { .flags = VFIO_DEVICE_FLAGS_PCI, .num_regions = VFIO_PCI_NUM_REGIONS };

    d.regions[VFIO_PCI_BAR0_REGION_INDEX] =
        (VnProtoRegion){ .size = BAR0_SIZE,
                         .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE };
    d.regions[VFIO_PCI_CONFIG_REGION_INDEX] =
        (VnProtoRegion){ .size = PCI_CFG_SPACE_SIZE,
                         .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE };
    return vn_proto_device_to_json(&d);
}

static void answer_rw(VnFabricMsg *msg, uint64_t token, Lie lie)
{
    g_autoptr(GError) error = NULL;
    uint8_t data[PCI_CFG_SPACE_SIZE];
    VnProtoRegionRw r;

    if (!vn_proto_region_rw_from_json(msg->json, &r, &error) || r.count > sizeof(data)) {
        vn_fabric_reply_error(t.lfab, token, -EINVAL, "not a region access of this test's");
        return;
    }
    if (r.write) {
        vn_fabric_reply(t.lfab, token, "{}", NULL, 0);
        return;
    }
    if (r.region == VFIO_PCI_CONFIG_REGION_INDEX) {
        config_space(data);
        vn_fabric_reply(t.lfab, token, "{}", data + r.offset % PCI_CFG_SPACE_SIZE,
                        lie == LIE_SHORT_CONFIG ? 100
                                                : MIN(r.count, PCI_CFG_SPACE_SIZE - r.offset));
        return;
    }
    if (lie == LIE_HOLD_READ) {
        g_atomic_int_inc(&t.held); /* the token is kept: never answered */
        return;
    }
    memset(data, 0x5a, sizeof(data));
    vn_fabric_reply(t.lfab, token, "{}", data, lie == LIE_SHORT_READ ? r.count / 2 : r.count);
}

/* "map IOVA SIZE OFFSET" or "unmap IOVA SIZE" or "unmap all", then a newline. */
static void log_dma(const VnFabricMsg *msg)
{
    VnProtoDmaMap m;
    VnProtoDmaUnmap u;

    g_mutex_lock(&t.dma_lock);
    if (msg->type == VN_PROTO_DMA_MAP && vn_proto_dma_map_from_json(msg->json, &m, NULL)) {
        g_string_append_printf(t.dma_log,
                               "map 0x%" G_GINT64_MODIFIER "x 0x%" G_GINT64_MODIFIER
                               "x 0x%" G_GINT64_MODIFIER "x\n",
                               m.iova, m.size, m.offset);
    } else if (msg->type == VN_PROTO_DMA_UNMAP &&
               vn_proto_dma_unmap_from_json(msg->json, &u, NULL)) {
        if (u.all) {
            g_string_append(t.dma_log, "unmap all\n");
        } else {
            g_string_append_printf(t.dma_log,
                                   "unmap 0x%" G_GINT64_MODIFIER "x 0x%" G_GINT64_MODIFIER "x\n",
                                   u.iova, u.size);
        }
    } else {
        g_string_append(t.dma_log, "not a DMA request of this test's\n");
    }
    g_mutex_unlock(&t.dma_lock);
}

static void lender_on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    Lie lie = (Lie)g_atomic_int_get(&t.lie);
    g_autofree char *json = NULL;

    switch (msg->type) {
    case VN_PROTO_DMA_MAP:
    case VN_PROTO_DMA_UNMAP:
        log_dma(msg);
        if (msg->type == VN_PROTO_DMA_UNMAP && lie == LIE_HOLD_UNMAP) {
            g_mutex_lock(&t.dma_lock);
            g_array_append_val(t.held_unmaps, token);
            g_mutex_unlock(&t.dma_lock);
            break;
        }
        vn_fabric_reply(t.lfab, token, "{}", NULL, 0);
        break;
    case VN_PROTO_ATTACH:
        json = lie == LIE_BAD_DESCRIPTION ? g_strdup("{\"num_regions\":\"many\"}") : device_json();
        vn_fabric_reply(t.lfab, token, json, NULL, 0);
        break;
    case VN_PROTO_REGION_RW:
        answer_rw(msg, token, lie);
        break;
    default:
        vn_fabric_reply(t.lfab, token, "{}", NULL, 0);
        break;
    }
}

static const VnFabricHandlers lender_handlers = { .on_request = lender_on_request };

static void node_open(const char *name, const VnFabricHandlers *h, GMainContext *ctx,
                      VnFabric **fab)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;

    g_hash_table_insert(params, "dir", t.dir);
    g_hash_table_insert(params, "request-timeout-ms", "2000");
    *fab = vn_fabric_open("shm", name, params, h, NULL, ctx, &error);
    ck_assert_msg(*fab != NULL, "%s", error ? error->message : "");
}

static void lender_open(void *data)
{
    node_open("lender", &lender_handlers, t.lend.ctx, &t.lfab);
}

static void lender_close(void *data)
{
    g_clear_pointer(&t.lfab, vn_fabric_close);
}

/* ---- the borrower ------------------------------------------------------- */

static void bor_on_link(void *opaque, const char *peer, bool up)
{
    if (!up && t.b != NULL) {
        vn_borrower_lender_down(t.b);
    }
}

static const VnFabricHandlers bor_handlers = { .on_link = bor_on_link };

static void started(void *opaque, VnBorrower *b, const GError *error)
{
    t.b = b;
    t.refusal = error != NULL ? g_strdup(error->message) : NULL;
    g_atomic_int_set(&t.started, 1);
}

static void bor_open(void *data)
{
    node_open("b", &bor_handlers, t.bor.ctx, &t.bfab);
    vn_borrower_start(t.bfab, "lender", DEV, VN_IRQ_MODE_FD, t.sock, -1, t.bor.ctx, started, NULL);
}

static void bor_close(void *data)
{
    g_clear_pointer(&t.b, vn_borrower_free);
    g_clear_pointer(&t.bfab, vn_fabric_close);
}

/* Start the borrower with the lender lying as @lie says; true when it serves. */
static bool bor_start(Lie lie)
{
    g_atomic_int_set(&t.lie, (gint)lie);
    on_loop(&t.bor, bor_open, NULL);
    for (int i = 0; i < 10000 && !g_atomic_int_get(&t.started); i++) {
        g_usleep(1000);
    }
    ck_assert_msg(g_atomic_int_get(&t.started), "the borrower's start did not end in 10 s");
    return t.b != NULL;
}

static void setup(void)
{
    /* GLib's first number parse in a process sets up its C locale, and done first in a
     * thread (the lender's, below) it can leave errno set, so that parse says "2000" is
     * not a number (seen 1 run in 4).  Once here, before any thread. */
    (void)g_ascii_strtoull("0", NULL, 10);
    memset(&t, 0, sizeof(t));
    t.dir = g_dir_make_tmp("vn-bor-untrusted-XXXXXX", NULL);
    t.sock = g_build_filename(t.dir, "vm.sock", NULL);
    t.dma_log = g_string_new(NULL);
    t.held_unmaps = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    t.lend.ctx = g_main_context_new();
    t.bor.ctx = g_main_context_new();
    loop_start(&t.lend, "lender");
    loop_start(&t.bor, "borrower");
    on_loop(&t.lend, lender_open, NULL);
}

static void teardown(void)
{
    on_loop(&t.bor, bor_close, NULL);
    on_loop(&t.lend, lender_close, NULL);
    loop_stop(&t.bor);
    loop_stop(&t.lend);
    g_free(t.refusal);
    g_string_free(t.dma_log, TRUE);
    g_array_unref(t.held_unmaps);
    g_free(t.sock);
    g_rmdir(t.dir); /* the fabric's sockets went with the nodes */
    g_free(t.dir);
}

static VnClient *qemu_connect(void)
{
    g_autoptr(GError) error = NULL;
    VnClient *c = vn_client_connect(t.sock, 3000, &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    return c;
}

/* ---- the tests ---------------------------------------------------------- */

/* A description of the device that is not one: the start fails, says so, serves nothing. */
START_TEST(test_bad_description_refused)
{
    ck_assert(!bor_start(LIE_BAD_DESCRIPTION));
    ck_assert_msg(strstr(t.refusal, "from lender") != NULL, "%s", t.refusal);
    ck_assert(!g_file_test(t.sock, G_FILE_TEST_EXISTS));
}
END_TEST

/* Fewer config space bytes than asked for: the start fails naming the config read. */
START_TEST(test_short_config_refused)
{
    ck_assert(!bor_start(LIE_SHORT_CONFIG));
    ck_assert_msg(strstr(t.refusal, "cannot read config space") != NULL, "%s", t.refusal);
    ck_assert(!g_file_test(t.sock, G_FILE_TEST_EXISTS));
}
END_TEST

/* A BAR read answered with half its bytes: QEMU's read fails, and the next read, answered
 * rightly, gets the device's bytes: the borrower serves on. */
START_TEST(test_short_read_fails_that_read)
{
    g_autoptr(VnClient) c = NULL;
    uint32_t v = 0;

    ck_assert_msg(bor_start(LIE_SHORT_READ), "%s", t.refusal);
    c = qemu_connect();
    ck_assert_int_lt(vn_client_region_read(c, VFIO_PCI_BAR0_REGION_INDEX, 0, &v, sizeof(v)), 0);
    g_atomic_int_set(&t.lie, LIE_NONE);
    ck_assert_int_eq(vn_client_region_read(c, VFIO_PCI_BAR0_REGION_INDEX, 0, &v, sizeof(v)),
                     sizeof(v));
    ck_assert_uint_eq(v, 0x5a5a5a5au);
}
END_TEST

/* QEMU's read in a thread of its own (it waits for the borrower's reply). */
typedef struct Read {
    VnClient *c;
    uint32_t v;
    gint ret;
    gint done;
} Read;

static gpointer read_thread(gpointer data)
{
    Read *r = data;

    g_atomic_int_set(
        &r->ret, vn_client_region_read(r->c, VFIO_PCI_BAR0_REGION_INDEX, 0, &r->v, sizeof(r->v)));
    g_atomic_int_set(&r->done, 1);
    return NULL;
}

/* The lender goes while QEMU's read waits for it: the read ends with an error, not a wait
 * (QEMU's client would give up after 3 s; the borrower answers first), and a later read is
 * a lost device's: all-ones. */
START_TEST(test_lender_goes_mid_read)
{
    Read r = { 0 };
    GThread *th;
    uint32_t v = 0;

    ck_assert_msg(bor_start(LIE_HOLD_READ), "%s", t.refusal);
    r.c = qemu_connect();
    th = g_thread_new("qemu-read", read_thread, &r);
    for (int i = 0; i < 3000 && g_atomic_int_get(&t.held) == 0; i++) {
        g_usleep(1000);
    }
    ck_assert_int_eq(g_atomic_int_get(&t.held), 1); /* the lender holds it */
    ck_assert(!g_atomic_int_get(&r.done));
    on_loop(&t.lend, lender_close, NULL);
    g_thread_join(th);
    /* The link's end, not a timeout (the fabric's, 2 s, or QEMU's client's, 3 s). */
    ck_assert_int_lt(g_atomic_int_get(&r.ret), 0);
    ck_assert_int_ne(g_atomic_int_get(&r.ret), -ETIMEDOUT);
    for (int i = 0; i < 300 && v != 0xffffffffu; i++) {
        ck_assert_int_eq(vn_client_region_read(r.c, VFIO_PCI_BAR0_REGION_INDEX, 0, &v, sizeof(v)),
                         sizeof(v));
        g_usleep(10000);
    }
    ck_assert_uint_eq(v, 0xffffffffu);
    vn_client_free(r.c);
}
END_TEST

/* ---- DMA unmaps that linger (borrower.h) --------------------------------- */

/* What the lender was asked for since the last call. */
static char *dma_log_take(void)
{
    char *s;

    g_mutex_lock(&t.dma_lock);
    s = g_strdup(t.dma_log->str);
    g_string_truncate(t.dma_log, 0);
    g_mutex_unlock(&t.dma_lock);
    return s;
}

typedef struct Linger {
    unsigned ms, max;
    VnBorrowerStats st;
} Linger;

static void linger_set_fn(void *data)
{
    Linger *l = data;

    vn_borrower_set_dma_linger(t.b, l->ms, l->max);
}

static void stats_fn(void *data)
{
    vn_borrower_stats(t.b, &((Linger *)data)->st);
}

static VnBorrowerStats bor_stats(void)
{
    Linger l = { 0 };

    on_loop(&t.bor, stats_fn, &l);
    return l.st;
}

/* The borrower serving QEMU (returned) with @ms and @max, and guest memory in *@mem. */
static VnClient *linger_start(unsigned ms, unsigned max, int *mem)
{
    Linger l = { .ms = ms, .max = max };

    ck_assert_msg(bor_start(LIE_NONE), "%s", t.refusal);
    on_loop(&t.bor, linger_set_fn, &l);
    /* QEMU's guest memory as the server takes it: a memfd that cannot shrink. */
    *mem = memfd_create("guest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_ge(*mem, 0);
    ck_assert_int_eq(ftruncate(*mem, 0x10000), 0);
    ck_assert_int_eq(fcntl(*mem, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    return qemu_connect();
}

#define RW (VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE)

/* The same page mapped, unmapped and mapped again at the same address (what a guest's
 * driver does behind its own IOMMU) is asked of the lender once; another page at that
 * address has the lingering one unmapped there first. */
START_TEST(test_unmap_lingers_map_takes_it_back)
{
    g_autoptr(VnClient) c = NULL;
    g_autofree char *log = NULL;
    VnBorrowerStats st;
    int mem;

    c = linger_start(60000, VN_BORROWER_MAX_LINGERING, &mem);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0, RW, mem), 0);
    log = dma_log_take();
    ck_assert_str_eq(log, "map 0x100000 0x1000 0x0\n");

    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x1000, false), 0);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0, RW, mem), 0);
    g_free(log);
    log = dma_log_take();
    ck_assert_str_eq(log, ""); /* both answered by the borrower */
    st = bor_stats();
    ck_assert_uint_eq(st.dma_unmaps_here, 1);
    ck_assert_uint_eq(st.dma_maps_here, 1);
    ck_assert_uint_eq(st.dma_lingering, 0);

    /* Unmapped again, then another page at that address: unmapped first, in order. */
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x1000, false), 0);
    ck_assert_uint_eq(bor_stats().dma_lingering, 1);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0x1000, RW, mem), 0);
    g_free(log);
    log = dma_log_take();
    ck_assert_str_eq(log, "unmap 0x100000 0x1000\nmap 0x100000 0x1000 0x1000\n");

    /* The same page read-only is another mapping too. */
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x1000, false), 0);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0x1000, VFIO_DMA_MAP_FLAG_READ, mem),
                     0);
    g_free(log);
    log = dma_log_take();
    ck_assert_str_eq(log, "unmap 0x100000 0x1000\nmap 0x100000 0x1000 0x1000\n");

    /* An unmap of everything never lingers: what lingered goes with it. */
    ck_assert_int_eq(vn_client_dma_map(c, 0x200000, 0x2000, 0x2000, RW, mem), 0);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x200000, 0x2000, false), 0);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0, 0, true), 0);
    g_free(log);
    log = dma_log_take();
    ck_assert_str_eq(log, "map 0x200000 0x2000 0x2000\nunmap all\n");
    ck_assert_uint_eq(bor_stats().dma_lingering, 0);
    close(mem);
}
END_TEST

/* A lingering mapping is unmapped at the lender in its time, without QEMU asking again. */
START_TEST(test_lingering_ends_in_time)
{
    g_autoptr(VnClient) c = NULL;
    g_autofree char *log = NULL;
    int mem;

    c = linger_start(50, VN_BORROWER_MAX_LINGERING, &mem);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0, RW, mem), 0);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x1000, false), 0);
    for (int i = 0; i < 3000; i++) {
        g_free(log);
        log = dma_log_take();
        if (strstr(log, "unmap") != NULL) {
            break;
        }
        g_usleep(1000);
    }
    ck_assert_str_eq(log, "unmap 0x100000 0x1000\n");
    ck_assert_uint_eq(bor_stats().dma_lingering, 0);
    close(mem);
}
END_TEST

/* A QEMU that maps and unmaps pages without end leaves at most @max lingering: past it, its
 * unmaps wait for the lender again. */
START_TEST(test_lingering_bounded)
{
    g_autoptr(VnClient) c = NULL;
    g_autofree char *log = NULL;
    int mem;

    c = linger_start(60000, 4, &mem);
    for (uint64_t i = 0; i < 6; i++) {
        ck_assert_int_eq(vn_client_dma_map(c, 0x100000 + i * 0x1000, 0x1000, i * 0x1000, RW, mem),
                         0);
        ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000 + i * 0x1000, 0x1000, false), 0);
    }
    log = dma_log_take();
    ck_assert_ptr_null(strstr(log, "unmap 0x100000"));
    ck_assert_ptr_null(strstr(log, "unmap 0x103000"));
    ck_assert_ptr_nonnull(strstr(log, "map 0x104000 0x1000 0x4000\nunmap 0x104000 0x1000\n"));
    ck_assert_ptr_nonnull(strstr(log, "map 0x105000 0x1000 0x5000\nunmap 0x105000 0x1000\n"));
    ck_assert_uint_eq(bor_stats().dma_lingering, 4);
    ck_assert_uint_eq(bor_stats().dma_unmaps_here, 4);
    close(mem);
}
END_TEST

static guint held_count(void)
{
    guint n;

    g_mutex_lock(&t.dma_lock);
    n = t.held_unmaps->len;
    g_mutex_unlock(&t.dma_lock);
    return n;
}

static void answer_held_fn(void *data)
{
    g_mutex_lock(&t.dma_lock);
    for (guint i = 0; i < t.held_unmaps->len; i++) {
        vn_fabric_reply(t.lfab, g_array_index(t.held_unmaps, uint64_t, i), "{}", NULL, 0);
    }
    g_array_set_size(t.held_unmaps, 0);
    g_mutex_unlock(&t.dma_lock);
}

static unsigned count_of(const char *haystack, const char *needle)
{
    unsigned n = 0;

    for (const char *p = strstr(haystack, needle); p != NULL; p = strstr(p + 1, needle)) {
        n++;
    }
    return n;
}

/* How many of the lender's logged requests so far contain NEEDLE (the log is kept). */
static unsigned dma_log_count(const char *needle)
{
    unsigned n;

    g_mutex_lock(&t.dma_lock);
    n = count_of(t.dma_log->str, needle);
    g_mutex_unlock(&t.dma_lock);
    return n;
}

/* Lingering mappings whose time is up are unmapped nobody waiting, but never more than
 * VN_BORROWER_MAX_UNMAPS_POSTED at once: a lender that takes its time holds the rest back (a
 * burst past what the lender takes from one peer would be refused and leave them mapped
 * there); once it answers, the rest go. */
START_TEST(test_lingering_unmaps_held_back)
{
    g_autoptr(VnClient) c = NULL;
    g_autofree char *log = NULL;
    const unsigned n = VN_BORROWER_MAX_UNMAPS_POSTED + 8;
    int mem;

    c = linger_start(20, VN_BORROWER_MAX_LINGERING, &mem);
    g_atomic_int_set(&t.lie, LIE_HOLD_UNMAP);
    for (uint64_t i = 0; i < n; i++) { /* none next to another: one unmap each */
        ck_assert_int_eq(vn_client_dma_map(c, 0x100000 + i * 0x2000, 0x1000, 0, RW, mem), 0);
        ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000 + i * 0x2000, 0x1000, false), 0);
    }
    for (int i = 0; i < 1000 && held_count() < VN_BORROWER_MAX_UNMAPS_POSTED; i++) {
        g_usleep(1000);
    }
    g_usleep(200000); /* 10 times their time: no more come */
    ck_assert_uint_eq(held_count(), VN_BORROWER_MAX_UNMAPS_POSTED);
    ck_assert_uint_eq(bor_stats().dma_lingering, n - VN_BORROWER_MAX_UNMAPS_POSTED);

    g_atomic_int_set(&t.lie, LIE_NONE);
    on_loop(&t.lend, answer_held_fn, NULL);
    for (int i = 0; i < 1000 && bor_stats().dma_lingering > 0; i++) {
        g_usleep(1000);
    }
    ck_assert_uint_eq(bor_stats().dma_lingering, 0);
    /* A mapping stops lingering when its unmap is posted; the lender logs it when it gets there. */
    for (int i = 0; i < 1000 && dma_log_count("unmap ") < n; i++) {
        g_usleep(1000);
    }
    g_usleep(50000); /* none more than one each */
    log = dma_log_take();
    ck_assert_uint_eq(count_of(log, "unmap "), n);
    ck_assert_uint_eq(bor_stats().unmaps_missed, 0);
    close(mem);
}
END_TEST

/* Pages that follow each other and linger out together go in one unmap of their run. */
START_TEST(test_lingering_run_in_one_unmap)
{
    g_autoptr(VnClient) c = NULL;
    g_autofree char *log = NULL;
    int mem;

    /* 2 s: the 16 unmaps are within half of it of each other however slow this machine. */
    c = linger_start(2000, VN_BORROWER_MAX_LINGERING, &mem);
    for (uint64_t i = 0; i < 16; i++) {
        ck_assert_int_eq(vn_client_dma_map(c, 0x300000 + i * 0x1000, 0x1000, i * 0x1000, RW, mem),
                         0);
    }
    g_free(dma_log_take());
    for (uint64_t i = 0; i < 16; i++) {
        ck_assert_int_eq(vn_client_dma_unmap(c, 0x300000 + i * 0x1000, 0x1000, false), 0);
    }
    for (int i = 0; i < 6000 && dma_log_count("unmap ") == 0; i++) {
        g_usleep(1000);
    }
    g_usleep(50000); /* none more */
    log = dma_log_take();
    ck_assert_str_eq(log, "unmap 0x300000 0x10000\n");
    close(mem);
}
END_TEST

/* The lender's link goes while a mapping lingers: it is not unmapped into the void (a
 * missed unmap keeps the device dead when the lender comes back); it waits. */
START_TEST(test_lingering_waits_for_lost_lender)
{
    g_autoptr(VnClient) c = NULL;
    VnBorrowerStats st;
    int mem;

    c = linger_start(20, VN_BORROWER_MAX_LINGERING, &mem);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0, RW, mem), 0);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x1000, false), 0);
    on_loop(&t.lend, lender_close, NULL);
    for (int i = 0; i < 3000 && !bor_stats().lender_lost; i++) {
        g_usleep(1000);
    }
    g_usleep(200000); /* 10 times its time */
    st = bor_stats();
    ck_assert(st.lender_lost);
    ck_assert_uint_eq(st.unmaps_missed, 0);
    ck_assert_uint_eq(st.dma_lingering, 1);
    close(mem);
}
END_TEST

/* Lingering off: QEMU's unmap returns once the lender has unmapped. */
START_TEST(test_strict_unmap_waits_for_lender)
{
    g_autoptr(VnClient) c = NULL;
    g_autofree char *log = NULL;
    int mem;

    c = linger_start(0, VN_BORROWER_MAX_LINGERING, &mem);
    ck_assert_int_eq(vn_client_dma_map(c, 0x100000, 0x1000, 0, RW, mem), 0);
    ck_assert_int_eq(vn_client_dma_unmap(c, 0x100000, 0x1000, false), 0);
    log = dma_log_take();
    ck_assert_str_eq(log, "map 0x100000 0x1000 0x0\nunmap 0x100000 0x1000\n");
    ck_assert_uint_eq(bor_stats().dma_unmaps_here, 0);
    close(mem);
}
END_TEST

static Suite *borrower_untrusted_suite(void)
{
    Suite *s = suite_create("borrower-untrusted");
    TCase *tc = tcase_create("lies");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_bad_description_refused);
    tcase_add_test(tc, test_short_config_refused);
    tcase_add_test(tc, test_short_read_fails_that_read);
    tcase_add_test(tc, test_lender_goes_mid_read);
    suite_add_tcase(s, tc);

    tc = tcase_create("dma");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_unmap_lingers_map_takes_it_back);
    tcase_add_test(tc, test_lingering_ends_in_time);
    tcase_add_test(tc, test_lingering_bounded);
    tcase_add_test(tc, test_lingering_unmaps_held_back);
    tcase_add_test(tc, test_lingering_run_in_one_unmap);
    tcase_add_test(tc, test_lingering_waits_for_lost_lender);
    tcase_add_test(tc, test_strict_unmap_waits_for_lender);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(borrower_untrusted_suite());
}
