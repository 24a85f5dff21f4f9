/*
 * The simulated NTB's model (simdev/epf.c): what ntb_hw_epf reads and writes, as it does it
 * (readl/writel/readw/writew at its offsets), and what reaches the peer: interrupts and DMA,
 * recorded by a fake VnEpfOps.  Each port's DMA space is a small array here.
 */
#include "simdev/epf.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <string.h>

#define MEM_SIZE 65536u

typedef struct Rig {
    VnEpf *epf;
    uint32_t signals[2][VN_EPF_MAX_VECTORS];
    uint8_t mem[2][MEM_SIZE]; /* each port's host memory, DMA address 0.. */
    bool master[2];
} Rig;

static void fake_signal(void *opaque, unsigned port, uint32_t vector)
{
    Rig *r = opaque;

    ck_assert_uint_lt(vector, VN_EPF_MAX_VECTORS);
    r->signals[port][vector]++;
}

static int fake_dma_read(void *opaque, unsigned port, uint64_t addr, void *buf, uint32_t len)
{
    Rig *r = opaque;

    if (addr > MEM_SIZE || len > MEM_SIZE - addr) {
        return -EFAULT;
    }
    memcpy(buf, r->mem[port] + addr, len);
    return 0;
}

static int fake_dma_write(void *opaque, unsigned port, uint64_t addr, const void *buf, uint32_t len)
{
    Rig *r = opaque;

    if (addr > MEM_SIZE || len > MEM_SIZE - addr) {
        return -EFAULT;
    }
    memcpy(r->mem[port] + addr, buf, len);
    return 0;
}

static bool fake_bus_master(void *opaque, unsigned port)
{
    return ((Rig *)opaque)->master[port];
}

static const VnEpfOps fake_ops = {
    .signal = fake_signal,
    .dma_read = fake_dma_read,
    .dma_write = fake_dma_write,
    .bus_master = fake_bus_master,
};

static Rig *rig_new_windows(unsigned windows)
{
    g_autoptr(GError) error = NULL;
    Rig *r = g_new0(Rig, 1);

    r->master[0] = r->master[1] = true;
    static const uint64_t sizes[VN_EPF_MAX_WINDOWS] = { 1 << 20, 1 << 20, 1 << 20 };

    r->epf = vn_epf_new(sizes, windows, &fake_ops, r, &error);
    ck_assert_msg(r->epf != NULL, "%s", error ? error->message : "");
    return r;
}

static Rig *rig_new(void)
{
    return rig_new_windows(1);
}

static void rig_free(Rig *r)
{
    vn_epf_free(r->epf);
    g_free(r);
}

static uint32_t rd32(Rig *r, unsigned port, uint32_t off)
{
    uint32_t v;

    ck_assert_int_eq(vn_epf_ctrl_read(r->epf, port, off, &v, 4), 0);
    return v;
}

static uint16_t rd16(Rig *r, unsigned port, uint32_t off)
{
    uint16_t v;

    ck_assert_int_eq(vn_epf_ctrl_read(r->epf, port, off, &v, 2), 0);
    return v;
}

static void wr32(Rig *r, unsigned port, uint32_t off, uint32_t v)
{
    ck_assert_int_eq(vn_epf_ctrl_write(r->epf, port, off, &v, 4), 0);
}

/* ntb_epf_send_command: argument, command, poll the status, clear it. */
static uint16_t command(Rig *r, unsigned port, uint32_t cmd, uint32_t arg)
{
    uint16_t status, zero = 0;

    wr32(r, port, VN_EPF_REG_ARGUMENT, arg);
    wr32(r, port, VN_EPF_REG_COMMAND, cmd);
    status = rd16(r, port, VN_EPF_REG_CMD_STATUS);
    ck_assert_int_eq(vn_epf_ctrl_write(r->epf, port, VN_EPF_REG_CMD_STATUS, &zero, 2), 0);
    return status;
}

/* What ntb_hw_epf's probe and link_enable do on both ports, with the hosts there. */
static Rig *rig_linked_windows(unsigned windows)
{
    Rig *r = rig_new_windows(windows);

    for (unsigned p = 0; p < 2; p++) {
        vn_epf_set_connected(r->epf, p, true);
        ck_assert_uint_eq(command(r, p, VN_EPF_CMD_CONFIGURE_DOORBELL, VN_EPF_ARG_MSIX | 8),
                          VN_EPF_STATUS_OK);
    }
    for (unsigned p = 0; p < 2; p++) {
        ck_assert_uint_eq(command(r, p, VN_EPF_CMD_LINK_UP, 0), VN_EPF_STATUS_OK);
    }
    return r;
}

static Rig *rig_linked(void)
{
    return rig_linked_windows(1);
}

/* Port @port translates its peer's window @mw to @addr, @size bytes (ntb_epf_mw_set_trans). */
static uint16_t set_trans_mw(Rig *r, unsigned port, uint32_t mw, uint64_t addr, uint64_t size)
{
    wr32(r, port, VN_EPF_REG_LOWER_ADDR, (uint32_t)addr);
    wr32(r, port, VN_EPF_REG_UPPER_ADDR, (uint32_t)(addr >> 32));
    wr32(r, port, VN_EPF_REG_LOWER_SIZE, (uint32_t)size);
    wr32(r, port, VN_EPF_REG_UPPER_SIZE, (uint32_t)(size >> 32));
    return command(r, port, VN_EPF_CMD_CONFIGURE_MW, mw);
}

static uint16_t set_trans(Rig *r, unsigned port, uint64_t addr, uint64_t size)
{
    return set_trans_mw(r, port, 0, addr, size);
}

START_TEST(test_layout)
{
    Rig *r = rig_new();

    /* What ntb_epf_init_dev and the spad/db ops read. */
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_MW_COUNT), 1);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_MW1_OFFSET), 0);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_SPAD_OFFSET), VN_EPF_SPAD_OFFSET);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_SPAD_COUNT), VN_EPF_SPADS);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_DB_ENTRY_SIZE), VN_EPF_DB_ENTRY_SIZE);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_DB_OFFSET + 4 * 5), 0);
    ck_assert_uint_eq(rd16(r, 0, VN_EPF_REG_LINK_STATUS), 0);
    ck_assert_uint_eq(vn_epf_window_size(r->epf, 0), 1 << 20);
    ck_assert_uint_eq(vn_epf_window_size(r->epf, 1), 0);
    rig_free(r);
}
END_TEST

START_TEST(test_link)
{
    Rig *r = rig_new();

    vn_epf_set_connected(r->epf, 0, true);
    vn_epf_set_connected(r->epf, 1, true);
    ck_assert_uint_eq(command(r, 0, VN_EPF_CMD_CONFIGURE_DOORBELL, VN_EPF_ARG_MSIX | 4),
                      VN_EPF_STATUS_OK);
    ck_assert_uint_eq(command(r, 1, VN_EPF_CMD_CONFIGURE_DOORBELL, VN_EPF_ARG_MSIX | 4),
                      VN_EPF_STATUS_OK);
    /* One side asking is not enough. */
    ck_assert_uint_eq(command(r, 0, VN_EPF_CMD_LINK_UP, 0), VN_EPF_STATUS_OK);
    ck_assert(!vn_epf_link_up(r->epf));
    ck_assert_uint_eq(r->signals[0][0], 0);
    ck_assert_uint_eq(command(r, 1, VN_EPF_CMD_LINK_UP, 0), VN_EPF_STATUS_OK);
    ck_assert(vn_epf_link_up(r->epf));
    ck_assert_uint_eq(rd16(r, 0, VN_EPF_REG_LINK_STATUS) & 1, 1);
    ck_assert_uint_eq(rd16(r, 1, VN_EPF_REG_LINK_STATUS) & 1, 1);
    ck_assert_uint_eq(r->signals[0][0], 1); /* the link vector, both sides */
    ck_assert_uint_eq(r->signals[1][0], 1);
    /* Clearing CMD_STATUS (writew) leaves LINK_STATUS alone. */
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_CMD_STATUS), 1u << 16);
    /* The peer's host goes away: down, and the one left is told. */
    vn_epf_set_connected(r->epf, 1, false);
    ck_assert(!vn_epf_link_up(r->epf));
    ck_assert_uint_eq(rd16(r, 0, VN_EPF_REG_LINK_STATUS) & 1, 0);
    ck_assert_uint_eq(r->signals[0][0], 2);
    ck_assert_uint_eq(r->signals[1][0], 1);
    /* It comes back reset: it must configure and ask again. */
    vn_epf_set_connected(r->epf, 1, true);
    ck_assert(!vn_epf_link_up(r->epf));
    /* What the stats say of each port (what a failed run is read by). */
    VnEpfStats st0, st1;
    vn_epf_stats(r->epf, 0, &st0);
    vn_epf_stats(r->epf, 1, &st1);
    ck_assert(st0.connected && st0.link_wanted);
    ck_assert_uint_eq(st0.link_ups, 1);
    ck_assert_uint_eq(st0.connects, 1);
    ck_assert(st1.connected && !st1.link_wanted);
    ck_assert_uint_eq(st1.link_ups, 1);
    ck_assert_uint_eq(st1.connects, 2);
    ck_assert_uint_eq(st1.resets, 1);
    rig_free(r);
}
END_TEST

START_TEST(test_scratchpads)
{
    Rig *r = rig_linked();
    uint32_t peer0 = VN_EPF_SPAD_OFFSET + 4 * VN_EPF_SPADS;

    /* ntb_epf_peer_spad_write on port 0 is ntb_epf_spad_read on port 1, and back. */
    wr32(r, 0, peer0 + 4 * 3, 0xa11ce);
    ck_assert_uint_eq(rd32(r, 1, VN_EPF_SPAD_OFFSET + 4 * 3), 0xa11ce);
    wr32(r, 1, VN_EPF_SPAD_OFFSET + 4 * 63, 0xb0b);
    ck_assert_uint_eq(rd32(r, 0, peer0 + 4 * 63), 0xb0b);
    /* A byte write merges. */
    uint8_t b = 0x77;
    ck_assert_int_eq(vn_epf_ctrl_write(r->epf, 0, VN_EPF_SPAD_OFFSET + 1, &b, 1), 0);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_SPAD_OFFSET), 0x7700);
    /* Without a peer, its scratchpads answer all ones and take nothing. */
    vn_epf_set_connected(r->epf, 1, false);
    ck_assert_uint_eq(rd32(r, 0, peer0 + 4 * 3), 0xffffffffu);
    wr32(r, 0, peer0, 5);
    vn_epf_set_connected(r->epf, 1, true);
    ck_assert_uint_eq(rd32(r, 1, VN_EPF_SPAD_OFFSET), 0);
    rig_free(r);
}
END_TEST

START_TEST(test_doorbells)
{
    Rig *r = rig_linked();
    uint32_t one = 1;
    VnEpfStats st;

    /* ntb_epf_peer_db_set(bit 0): interrupt 2 at entry 2. */
    ck_assert_int_eq(vn_epf_db_write(r->epf, 0, 2 * VN_EPF_DB_ENTRY_SIZE, &one, 4), 0);
    ck_assert_uint_eq(r->signals[1][2], 1);
    ck_assert_uint_eq(r->signals[0][2], 0);
    /* Beyond the vectors port 1 configured (8): lost, counted. */
    ck_assert_int_eq(vn_epf_db_write(r->epf, 0, 9 * VN_EPF_DB_ENTRY_SIZE, &one, 4), 0);
    vn_epf_stats(r->epf, 0, &st);
    ck_assert_uint_eq(st.doorbells, 1);
    ck_assert_uint_eq(st.doorbells_lost, 1);
    /* After the peer tore its doorbells down, nothing reaches it. */
    ck_assert_uint_eq(command(r, 1, VN_EPF_CMD_TEARDOWN_DOORBELL, 8), VN_EPF_STATUS_OK);
    ck_assert_int_eq(vn_epf_db_write(r->epf, 0, 2 * VN_EPF_DB_ENTRY_SIZE, &one, 4), 0);
    ck_assert_uint_eq(r->signals[1][2], 1);
    rig_free(r);
}
END_TEST

START_TEST(test_window)
{
    Rig *r = rig_linked();
    uint64_t v = 0x1122334455667788ull, got = 0;
    VnEpfStats st;

    /* Port 1 translates port 0's window to its memory at 0x4000, 8 KiB. */
    ck_assert_uint_eq(set_trans(r, 1, 0x4000, 0x2000), VN_EPF_STATUS_OK);
    ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 0, 0x10, &v, 8), 0);
    ck_assert(memcmp(r->mem[1] + 0x4010, &v, 8) == 0);
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, 0x10, &got, 8), 0);
    ck_assert_uint_eq(got, v);
    /* Past the translation's size: nothing there, all ones. */
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, 0x2000, &got, 8), 0);
    ck_assert_uint_eq(got, UINT64_MAX);
    /* Port 0's own memory was never touched; port 1's window reaches nothing (port 0 set
     * no translation). */
    ck_assert_int_eq(vn_epf_window_write(r->epf, 1, 0, 0, &v, 8), 0);
    for (unsigned i = 0; i < MEM_SIZE; i++) {
        ck_assert_uint_eq(r->mem[0][i], 0);
    }
    /* The peer's function may not master the bus: no DMA. */
    r->master[1] = false;
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, 0x10, &got, 8), 0);
    ck_assert_uint_eq(got, UINT64_MAX);
    r->master[1] = true;
    /* Torn down: gone. */
    ck_assert_uint_eq(command(r, 1, VN_EPF_CMD_TEARDOWN_MW, 0), VN_EPF_STATUS_OK);
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, 0x10, &got, 8), 0);
    ck_assert_uint_eq(got, UINT64_MAX);
    vn_epf_stats(r->epf, 0, &st);
    ck_assert_uint_eq(st.window_writes, 1);
    ck_assert_uint_eq(st.window_reads, 4);
    ck_assert_uint_eq(st.window_faults, 3);
    rig_free(r);
}
END_TEST

/* Commands a host might send wrong: each answers ERROR and changes nothing. */
/* Two windows (BAR4, BAR5): each its own translation on the peer; one window has no second. */
START_TEST(test_two_windows)
{
    Rig *r = rig_linked_windows(2);
    Rig *one = rig_linked();
    uint64_t a = 0xaaaaaaaaaaaaaaaaull, b = 0xbbbbbbbbbbbbbbbbull, got = 0;

    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_MW_COUNT), 2);
    ck_assert_uint_eq(vn_epf_windows(r->epf), 2);
    ck_assert_uint_eq(set_trans_mw(r, 1, 0, 0x1000, 0x1000), VN_EPF_STATUS_OK);
    ck_assert_uint_eq(set_trans_mw(r, 1, 1, 0x6000, 0x1000), VN_EPF_STATUS_OK);
    ck_assert_uint_eq(set_trans_mw(r, 1, 2, 0x6000, 0x1000), VN_EPF_STATUS_ERROR);
    ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 0, 8, &a, 8), 0);
    ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 1, 8, &b, 8), 0);
    ck_assert(memcmp(r->mem[1] + 0x1008, &a, 8) == 0);
    ck_assert(memcmp(r->mem[1] + 0x6008, &b, 8) == 0);
    /* Window 1 torn down, window 0 still there. */
    ck_assert_uint_eq(command(r, 1, VN_EPF_CMD_TEARDOWN_MW, 1), VN_EPF_STATUS_OK);
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 1, 8, &got, 8), 0);
    ck_assert_uint_eq(got, UINT64_MAX);
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, 8, &got, 8), 0);
    ck_assert_uint_eq(got, a);
    ck_assert_uint_eq(command(r, 1, VN_EPF_CMD_TEARDOWN_MW, 2), VN_EPF_STATUS_ERROR);
    /* One window: no second to translate or reach. */
    ck_assert_uint_eq(rd32(one, 0, VN_EPF_REG_MW_COUNT), 1);
    ck_assert_uint_eq(set_trans_mw(one, 1, 1, 0x6000, 0x1000), VN_EPF_STATUS_ERROR);
    ck_assert_int_eq(vn_epf_window_write(one->epf, 0, 1, 8, &b, 8), -EINVAL);
    rig_free(one);
    rig_free(r);
}
END_TEST

static const struct {
    const char *why;
    uint32_t cmd, arg;
    uint64_t addr, size;
} bad_commands[] = {
    { "no such command", 7, 0, 0, 0 },
    { "command 0", 0, 0, 0, 0 },
    { "doorbells: none", VN_EPF_CMD_CONFIGURE_DOORBELL, VN_EPF_ARG_MSIX, 0, 0 },
    { "doorbells: more than the table", VN_EPF_CMD_CONFIGURE_DOORBELL, VN_EPF_ARG_MSIX | 33, 0, 0 },
    { "window 1 (there is one)", VN_EPF_CMD_CONFIGURE_MW, 1, 0x1000, 0x1000 },
    { "window larger than the BAR", VN_EPF_CMD_CONFIGURE_MW, 0, 0, (1 << 20) + 4096 },
    { "window of 0 bytes", VN_EPF_CMD_CONFIGURE_MW, 0, 0x1000, 0 },
    { "window not page aligned", VN_EPF_CMD_CONFIGURE_MW, 0, 0x1800, 0x1000 },
    { "window wrapping around", VN_EPF_CMD_CONFIGURE_MW, 0, UINT64_MAX & ~0xfffull, 0x2000 },
    { "teardown of window 3", VN_EPF_CMD_TEARDOWN_MW, 3, 0, 0 },
};

START_TEST(test_bad_commands)
{
    Rig *r = rig_linked();
    uint64_t v = 0;
    VnEpfStats st;

    if (bad_commands[_i].cmd == VN_EPF_CMD_CONFIGURE_MW) {
        ck_assert_uint_eq(set_trans(r, 1, 0, 0x1000), VN_EPF_STATUS_OK);
        wr32(r, 1, VN_EPF_REG_LOWER_ADDR, (uint32_t)bad_commands[_i].addr);
        wr32(r, 1, VN_EPF_REG_UPPER_ADDR, (uint32_t)(bad_commands[_i].addr >> 32));
        wr32(r, 1, VN_EPF_REG_LOWER_SIZE, (uint32_t)bad_commands[_i].size);
        wr32(r, 1, VN_EPF_REG_UPPER_SIZE, (uint32_t)(bad_commands[_i].size >> 32));
    }
    ck_assert_msg(command(r, 1, bad_commands[_i].cmd, bad_commands[_i].arg) == VN_EPF_STATUS_ERROR,
                  "accepted: %s", bad_commands[_i].why);
    vn_epf_stats(r->epf, 1, &st);
    ck_assert_uint_eq(st.command_errors, 1);
    /* What was there before still is: the first translation, 8 vectors, the link. */
    ck_assert(vn_epf_link_up(r->epf));
    if (bad_commands[_i].cmd == VN_EPF_CMD_CONFIGURE_MW) {
        ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 0, 0xff8, &v, 8), 0);
        vn_epf_stats(r->epf, 0, &st);
        ck_assert_uint_eq(st.window_faults, 0);
    }
    rig_free(r);
}
END_TEST

/* Accesses outside a BAR or larger than a load: refused, nothing happens. */
START_TEST(test_bad_access)
{
    Rig *r = rig_linked();
    uint8_t buf[16] = { 0 };

    ck_assert_int_eq(vn_epf_ctrl_read(r->epf, 0, VN_EPF_CTRL_SIZE - 2, buf, 4), -EINVAL);
    ck_assert_int_eq(vn_epf_ctrl_write(r->epf, 0, UINT64_MAX - 1, buf, 4), -EINVAL);
    ck_assert_int_eq(vn_epf_ctrl_read(r->epf, 0, 0, buf, 16), -EINVAL);
    ck_assert_int_eq(vn_epf_ctrl_read(r->epf, 0, 0, buf, 0), -EINVAL);
    ck_assert_int_eq(vn_epf_db_write(r->epf, 0, VN_EPF_DB_SIZE, buf, 4), -EINVAL);
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, (1 << 20) - 4, buf, 8), -EINVAL);
    ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 0, 0, buf, 16), -EINVAL);
    for (unsigned v = 0; v < VN_EPF_MAX_VECTORS; v++) {
        ck_assert_uint_eq(r->signals[1][v], v == 0 ? 1 : 0);
    }
    rig_free(r);
}
END_TEST

START_TEST(test_bad_new)
{
    static const uint64_t sizes[] = { 0, 2048, 12288, VN_EPF_MAX_WINDOW * 2 };
    static const VnEpfOps no_dma = { .signal = fake_signal };
    const uint64_t mib[4] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20 };
    const uint64_t big32[3] = { VN_EPF_MAX_WINDOW32 * 2, 1 << 20, 1 << 20 };
    const uint64_t half[3] = { VN_EPF_MAX_WINDOW32, 1 << 20, 1 << 20 };

    for (unsigned i = 0; i < G_N_ELEMENTS(sizes); i++) {
        g_autoptr(GError) error = NULL;

        ck_assert_ptr_null(vn_epf_new(&sizes[i], 1, &fake_ops, NULL, &error));
        ck_assert_ptr_nonnull(error);
    }
    /* No window, four (the maps have three at most), a 32-bit BAR of 2 GiB, and j721e's
     * window 1 as large as BAR2 (the doorbells share it). */
    ck_assert_ptr_null(vn_epf_new(mib, 0, &fake_ops, NULL, NULL));
    ck_assert_ptr_null(vn_epf_new(mib, 4, &fake_ops, NULL, NULL));
    ck_assert_ptr_null(vn_epf_new(big32, 2, &fake_ops, NULL, NULL));
    ck_assert_ptr_null(vn_epf_new(half, 3, &fake_ops, NULL, NULL));
    g_autoptr(GError) error = NULL;
    ck_assert_ptr_null(vn_epf_new(mib, 1, &no_dma, NULL, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "dma_read"));
}
END_TEST

/* Three windows of their own sizes take ntb_hw_epf's j721e map: window 1 in BAR2's second
 * half (MW1_OFFSET), 2 in BAR3, 3 in BAR4 (64-bit); each reaches its own translation, up to
 * its own size; window 1 may be translated for all of BAR2 (the driver's size_max). */
START_TEST(test_three_windows)
{
    const uint64_t sizes[3] = { 64 << 10, 1 << 20, 4 << 20 };
    uint64_t a = 0x1111111111111111ull, c = 0x3333333333333333ull, got = 0;
    Rig *r = g_new0(Rig, 1);
    VnEpfLayout l;

    r->master[0] = r->master[1] = true;
    r->epf = vn_epf_new(sizes, 3, &fake_ops, r, NULL);
    ck_assert_ptr_nonnull(r->epf);
    vn_epf_layout(r->epf, &l);
    ck_assert_uint_eq(l.vendor_id, VN_EPF_J721E_VENDOR_ID);
    ck_assert_uint_eq(l.device_id, VN_EPF_J721E_DEVICE_ID);
    ck_assert_uint_eq(l.peer_spad_bar, 1);
    ck_assert_uint_eq(l.window_bar[0], 2);
    ck_assert_uint_eq(l.window_offset[0], 64 << 10);
    ck_assert_uint_eq(l.bar_size[2], 128 << 10);
    ck_assert_uint_eq(l.window_bar[1], 3);
    ck_assert_uint_eq(l.bar_size[3], 1 << 20);
    ck_assert_uint_eq(l.window_bar[2], 4);
    ck_assert(l.bar_is64[4] && !l.bar_is64[3] && l.bar_size[5] == 0);
    ck_assert_uint_ge(l.msix_offset, 4 * VN_EPF_SPADS);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_MW_COUNT), 3);
    ck_assert_uint_eq(rd32(r, 0, VN_EPF_REG_MW1_OFFSET), 64 << 10);

    vn_epf_set_connected(r->epf, 0, true);
    vn_epf_set_connected(r->epf, 1, true);
    ck_assert_uint_eq(set_trans_mw(r, 1, 0, 0x1000, 128 << 10), VN_EPF_STATUS_OK);
    ck_assert_uint_eq(set_trans_mw(r, 1, 0, 0x1000, 256 << 10), VN_EPF_STATUS_ERROR);
    ck_assert_uint_eq(set_trans_mw(r, 1, 2, 0x8000, 4 << 20), VN_EPF_STATUS_OK);
    ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 0, 8, &a, 8), 0);
    ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 2, 16, &c, 8), 0);
    ck_assert(memcmp(r->mem[1] + 0x1008, &a, 8) == 0);
    ck_assert(memcmp(r->mem[1] + 0x8010, &c, 8) == 0);
    /* Past window 1's own size (into what BAR2 does not give it), past window 3's. */
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, 64 << 10, &got, 8), -EINVAL);
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 2, 4 << 20, &got, 8), -EINVAL);
    /* Window 2 has no translation: all ones. */
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 1, 0, &got, 8), 0);
    ck_assert_uint_eq(got, UINT64_MAX);
    rig_free(r);
}
END_TEST

/* A reset of one port (FLR): its translation and scratchpads go, the link drops. */
START_TEST(test_reset)
{
    Rig *r = rig_linked();
    uint64_t v = 1, got;

    ck_assert_uint_eq(set_trans(r, 1, 0, 0x1000), VN_EPF_STATUS_OK);
    wr32(r, 1, VN_EPF_SPAD_OFFSET, 42);
    vn_epf_reset(r->epf, 1);
    ck_assert(!vn_epf_link_up(r->epf));
    ck_assert_uint_eq(rd32(r, 1, VN_EPF_SPAD_OFFSET), 0);
    ck_assert_int_eq(vn_epf_window_write(r->epf, 0, 0, 0, &v, 8), 0);
    ck_assert_int_eq(vn_epf_window_read(r->epf, 0, 0, 0, &got, 8), 0);
    ck_assert_uint_eq(got, UINT64_MAX);
    ck_assert_str_eq(vn_epf_command_to_string(VN_EPF_CMD_LINK_UP), "link-up");
    ck_assert_str_eq(vn_epf_command_to_string(VN_EPF_CMD_LAST), "?");
    rig_free(r);
}
END_TEST

static Suite *epf_suite(void)
{
    Suite *s = suite_create("epf");
    TCase *tc;

    tc = tcase_create("registers");
    tcase_add_test(tc, test_layout);
    tcase_add_test(tc, test_scratchpads);
    tcase_add_test(tc, test_reset);
    suite_add_tcase(s, tc);

    tc = tcase_create("link");
    tcase_add_test(tc, test_link);
    suite_add_tcase(s, tc);

    tc = tcase_create("doorbells");
    tcase_add_test(tc, test_doorbells);
    suite_add_tcase(s, tc);

    tc = tcase_create("window");
    tcase_add_test(tc, test_window);
    tcase_add_test(tc, test_two_windows);
    tcase_add_test(tc, test_three_windows);
    suite_add_tcase(s, tc);

    tc = tcase_create("untrusted");
    tcase_add_loop_test(tc, test_bad_commands, 0, G_N_ELEMENTS(bad_commands));
    tcase_add_test(tc, test_bad_access);
    tcase_add_test(tc, test_bad_new);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(epf_suite());
}
