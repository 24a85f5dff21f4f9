/*
 * The simulated NTB's two ports (see epf.h): registers, commands, doorbells, the link and
 * window translation, as ntb_hw_epf (Linux 6.1) expects them of the endpoint's firmware.
 *
 * Registers are 32-bit words; an access of any size is split into the words it touches,
 * a write merging only the bytes it covers (writew of CMD_STATUS leaves LINK_STATUS, the
 * other half of its word, alone).  A command runs when a write covers COMMAND's low byte.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "epf.h"

#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <string.h>

typedef struct EpfPort {
    bool connected;
    bool link_wanted; /* CMD_LINK_UP seen, no CMD_LINK_DOWN since */
    uint32_t argument;
    uint16_t status;
    uint32_t addr_lo, addr_hi, size_lo, size_hi;
    uint32_t vectors; /* CMD_CONFIGURE_DOORBELL's count; 0: none */
    /* CMD_CONFIGURE_MW's translation of the peer's window N */
    bool mw_valid[VN_EPF_MAX_WINDOWS];
    uint64_t mw_addr[VN_EPF_MAX_WINDOWS], mw_size[VN_EPF_MAX_WINDOWS];
    uint32_t spad[VN_EPF_SPADS];
    VnEpfStats stats;
} EpfPort;

struct VnEpf {
    uint64_t window_size[VN_EPF_MAX_WINDOWS];
    unsigned windows;
    VnEpfLayout layout;
    const VnEpfOps *ops;
    void *opaque;
    bool link; /* as last raised */
    EpfPort port[2];
};

#define SPADS_END VN_EPF_PEER_SPAD_OFFSET
#define PEER_SPADS_END (SPADS_END + 4 * VN_EPF_SPADS)
G_STATIC_ASSERT(PEER_SPADS_END <= VN_EPF_CTRL_SIZE);
G_STATIC_ASSERT(VN_EPF_REG_DB_OFFSET + 4 * VN_EPF_MAX_VECTORS <= VN_EPF_SPAD_OFFSET);

static const char *const command_names[VN_EPF_CMD_LAST] = {
    [VN_EPF_CMD_NONE] = "none",
    [VN_EPF_CMD_CONFIGURE_DOORBELL] = "configure-doorbell",
    [VN_EPF_CMD_TEARDOWN_DOORBELL] = "teardown-doorbell",
    [VN_EPF_CMD_CONFIGURE_MW] = "configure-mw",
    [VN_EPF_CMD_TEARDOWN_MW] = "teardown-mw",
    [VN_EPF_CMD_LINK_UP] = "link-up",
    [VN_EPF_CMD_LINK_DOWN] = "link-down",
};

const char *vn_epf_command_to_string(VnEpfCommand cmd)
{
    return (unsigned)cmd < VN_EPF_CMD_LAST ? command_names[cmd] : "?";
}

bool vn_epf_ops_valid(const VnEpfOps *ops, GError **error)
{
    const char *missing = ops == NULL              ? "the table"
                          : ops->signal == NULL    ? "signal"
                          : ops->dma_read == NULL  ? "dma_read"
                          : ops->dma_write == NULL ? "dma_write"
                                                   : NULL;

    if (missing != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "NTB model ops: %s is required (optional: bus_master)", missing);
        return false;
    }
    return true;
}

/* The map for @windows windows of @sizes (checked): see epf.h. */
static void layout_build(VnEpfLayout *l, const uint64_t *sizes, unsigned windows)
{
    memset(l, 0, sizeof(*l));
    l->bar_size[VN_EPF_CTRL_BAR] = VN_EPF_CTRL_SIZE;
    l->bar_size[VN_EPF_DB_BAR] = VN_EPF_DB_SIZE;
    l->bar_size[VN_EPF_MSIX_BAR] = VN_EPF_MSIX_SIZE;
    l->msix_bar = VN_EPF_MSIX_BAR;
    if (windows < 3) {
        l->vendor_id = VN_EPF_VENDOR_ID;
        l->device_id = VN_EPF_DEVICE_ID;
        l->peer_spad_bar = VN_EPF_CTRL_BAR;
        for (unsigned w = 0; w < windows; w++) {
            l->window_bar[w] = VN_EPF_WINDOW_BAR + w;
            l->bar_size[VN_EPF_WINDOW_BAR + w] = sizes[w];
            l->bar_prefetch[VN_EPF_WINDOW_BAR + w] = true;
        }
        l->bar_is64[VN_EPF_WINDOW_BAR] = windows == 1;
        return;
    }
    l->vendor_id = VN_EPF_J721E_VENDOR_ID;
    l->device_id = VN_EPF_J721E_DEVICE_ID;
    /* BAR1: the peer's scratchpads from 0, then MSI-X in its second half. */
    l->peer_spad_bar = VN_EPF_MSIX_BAR;
    l->bar_size[VN_EPF_MSIX_BAR] = 2 * VN_EPF_MSIX_SIZE;
    l->msix_offset = VN_EPF_MSIX_SIZE;
    /* BAR2: the doorbells, then window 1 in its second half. */
    l->window_bar[0] = VN_EPF_DB_BAR;
    l->window_offset[0] = sizes[0];
    l->bar_size[VN_EPF_DB_BAR] = 2 * sizes[0];
    l->window_bar[1] = VN_EPF_DB_BAR + 1;
    l->bar_size[VN_EPF_DB_BAR + 1] = sizes[1];
    l->window_bar[2] = VN_EPF_WINDOW_BAR;
    l->bar_size[VN_EPF_WINDOW_BAR] = sizes[2];
    l->bar_is64[VN_EPF_WINDOW_BAR] = true;
    for (unsigned b = VN_EPF_DB_BAR; b < VN_EPF_BARS; b++) {
        l->bar_prefetch[b] = l->bar_size[b] != 0;
    }
}

/* The largest window @w of @windows may be: what its BAR holds (see layout_build). */
static uint64_t window_max(unsigned windows, unsigned w)
{
    if (windows == 1 || (windows == 3 && w == 2)) {
        return VN_EPF_MAX_WINDOW;
    }
    return windows == 3 && w == 0 ? VN_EPF_MAX_WINDOW32 / 2 : VN_EPF_MAX_WINDOW32;
}

VnEpf *vn_epf_new(const uint64_t *sizes, unsigned windows, const VnEpfOps *ops, void *opaque,
                  GError **error)
{
    VnEpf *epf;

    if (!vn_epf_ops_valid(ops, error)) {
        return NULL;
    }
    if (windows < 1 || windows > VN_EPF_MAX_WINDOWS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "NTB model: %u windows (1 to %u)", windows, VN_EPF_MAX_WINDOWS);
        return NULL;
    }
    for (unsigned w = 0; w < windows; w++) {
        if (sizes[w] < VN_EPF_MIN_WINDOW || sizes[w] > window_max(windows, w) ||
            (sizes[w] & (sizes[w] - 1)) != 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "NTB model: window %u of %" G_GUINT64_FORMAT " bytes (a power of two, "
                        "%llu KiB to %" G_GUINT64_FORMAT " MiB with %u windows)",
                        w, sizes[w], VN_EPF_MIN_WINDOW >> 10, window_max(windows, w) >> 20,
                        windows);
            return NULL;
        }
    }
    epf = g_new0(VnEpf, 1);
    memcpy(epf->window_size, sizes, windows * sizeof(sizes[0]));
    epf->windows = windows;
    layout_build(&epf->layout, sizes, windows);
    epf->ops = ops;
    epf->opaque = opaque;
    return epf;
}

void vn_epf_free(VnEpf *epf)
{
    g_free(epf);
}

uint64_t vn_epf_window_size(VnEpf *epf, unsigned mw)
{
    return mw < epf->windows ? epf->window_size[mw] : 0;
}

void vn_epf_layout(VnEpf *epf, VnEpfLayout *out)
{
    *out = epf->layout;
}

unsigned vn_epf_windows(VnEpf *epf)
{
    return epf->windows;
}

bool vn_epf_link_up(VnEpf *epf)
{
    return epf->link;
}

void vn_epf_stats(VnEpf *epf, unsigned port, VnEpfStats *out)
{
    EpfPort *p = &epf->port[port & 1];

    *out = p->stats;
    out->connected = p->connected;
    out->link_wanted = p->link_wanted;
}

/* Raise the link vector where the link changed and a host listens. */
static void update_link(VnEpf *e)
{
    bool up = e->port[0].connected && e->port[1].connected && e->port[0].link_wanted &&
              e->port[1].link_wanted;

    if (up == e->link) {
        return;
    }
    e->link = up;
    g_info("NTB model: link %s", up ? "up" : "down");
    for (unsigned p = 0; p < 2; p++) {
        if (e->port[p].connected && e->port[p].vectors > 0) {
            e->port[p].stats.link_events++;
            e->ops->signal(e->opaque, p, 0);
        }
    }
}

void vn_epf_reset(VnEpf *epf, unsigned port)
{
    EpfPort *p = &epf->port[port & 1];
    bool connected = p->connected;
    VnEpfStats stats = p->stats;

    memset(p, 0, sizeof(*p));
    p->connected = connected;
    p->stats = stats;
    p->stats.resets++;
    g_info("NTB model: port %u reset", port & 1);
    update_link(epf);
}

void vn_epf_set_connected(VnEpf *epf, unsigned port, bool connected)
{
    /* Gone first: a host that leaves is not told of the link going down with it. */
    epf->port[port & 1].connected = connected;
    epf->port[port & 1].stats.connects += connected;
    g_info("NTB model: port %u %s", port & 1, connected ? "connected" : "disconnected");
    if (connected) {
        update_link(epf);
    } else {
        vn_epf_reset(epf, port); /* which updates the link */
    }
}

/* ---- commands ---------------------------------------------------------- */

static bool configure_mw(VnEpf *e, EpfPort *p, uint32_t idx)
{
    uint64_t addr = (uint64_t)p->addr_hi << 32 | p->addr_lo;
    uint64_t size = (uint64_t)p->size_hi << 32 | p->size_lo;

    /* A window of MW_COUNT; ntb_hw_epf aligns the address to 4 KiB (mw_get_align) and
     * keeps the size within the BAR (for j721e's window 1, all of BAR2: the driver's
     * size_max; what the peer reaches stays within the window). */
    if (idx >= e->windows || size == 0 || size > e->layout.bar_size[e->layout.window_bar[idx]] ||
        (addr & (VN_EPF_MIN_WINDOW - 1)) || addr + size < addr) {
        g_info("NTB model: refused window %u at 0x%" G_GINT64_MODIFIER
               "x size 0x%" G_GINT64_MODIFIER "x",
               idx, addr, size);
        return false;
    }
    p->mw_valid[idx] = true;
    p->mw_addr[idx] = addr;
    p->mw_size[idx] = size;
    return true;
}

static void run_command(VnEpf *e, unsigned port, uint32_t cmd)
{
    EpfPort *p = &e->port[port];
    uint32_t arg = p->argument;
    bool ok = true;

    switch (cmd) {
    case VN_EPF_CMD_CONFIGURE_DOORBELL:
        /* The count includes the link and the reserved vector (ntb_epf_init_isr). */
        ok = (arg & 0xffff) >= 1 && (arg & 0xffff) <= VN_EPF_MAX_VECTORS;
        if (ok) {
            p->vectors = arg & 0xffff;
        }
        break;
    case VN_EPF_CMD_TEARDOWN_DOORBELL:
        p->vectors = 0;
        break;
    case VN_EPF_CMD_CONFIGURE_MW:
        ok = configure_mw(e, p, arg);
        break;
    case VN_EPF_CMD_TEARDOWN_MW:
        ok = arg < e->windows;
        if (ok) {
            p->mw_valid[arg] = false;
        }
        break;
    case VN_EPF_CMD_LINK_UP:
    case VN_EPF_CMD_LINK_DOWN:
        p->link_wanted = cmd == VN_EPF_CMD_LINK_UP;
        p->stats.link_ups += p->link_wanted;
        p->stats.link_downs += !p->link_wanted;
        g_info("NTB model: port %u asks for the link %s", port, p->link_wanted ? "up" : "down");
        break;
    default:
        ok = false;
        break;
    }
    p->stats.commands++;
    p->stats.command_errors += !ok;
    p->status = ok ? VN_EPF_STATUS_OK : VN_EPF_STATUS_ERROR;
    g_debug("NTB model: port %u: %s (0x%x): %s", port, vn_epf_command_to_string(cmd), arg,
            ok ? "ok" : "error");
    if (cmd == VN_EPF_CMD_LINK_UP || cmd == VN_EPF_CMD_LINK_DOWN) {
        update_link(e);
    }
}

/* ---- BAR0 -------------------------------------------------------------- */

static uint32_t ctrl_read32(VnEpf *e, unsigned port, uint32_t off)
{
    EpfPort *p = &e->port[port], *peer = &e->port[port ^ 1];

    if (off >= VN_EPF_SPAD_OFFSET && off < SPADS_END) {
        return p->spad[(off - VN_EPF_SPAD_OFFSET) / 4];
    }
    if (off >= SPADS_END && off < PEER_SPADS_END) {
        /* The peer's scratchpads: nothing answers while it is absent. */
        return peer->connected ? peer->spad[(off - SPADS_END) / 4] : 0xffffffffu;
    }
    if (off >= VN_EPF_REG_DB_DATA && off < VN_EPF_REG_DB_OFFSET) {
        return (off - VN_EPF_REG_DB_DATA) / 4; /* any value: we only look at where */
    }
    switch (off) {
    case VN_EPF_REG_ARGUMENT:
        return p->argument;
    case VN_EPF_REG_CMD_STATUS:
        return p->status | (uint32_t)(e->link ? 1 : 0) << 16;
    case VN_EPF_REG_LOWER_ADDR:
        return p->addr_lo;
    case VN_EPF_REG_UPPER_ADDR:
        return p->addr_hi;
    case VN_EPF_REG_LOWER_SIZE:
        return p->size_lo;
    case VN_EPF_REG_UPPER_SIZE:
        return p->size_hi;
    case VN_EPF_REG_MW_COUNT:
        return e->windows;
    case VN_EPF_REG_SPAD_OFFSET:
        return VN_EPF_SPAD_OFFSET;
    case VN_EPF_REG_SPAD_COUNT:
        return VN_EPF_SPADS;
    case VN_EPF_REG_DB_ENTRY_SIZE:
        return VN_EPF_DB_ENTRY_SIZE;
    case VN_EPF_REG_MW1_OFFSET:
        return (uint32_t)e->layout.window_offset[0];
    default: /* COMMAND, TOPOLOGY, DB_OFFSET, reserved */
        return 0;
    }
}

static void merge(uint32_t *reg, uint32_t v, uint32_t mask)
{
    *reg = (*reg & ~mask) | (v & mask);
}

/* Write the bytes of @mask of the word at @off. */
static void ctrl_write32(VnEpf *e, unsigned port, uint32_t off, uint32_t v, uint32_t mask)
{
    EpfPort *p = &e->port[port], *peer = &e->port[port ^ 1];
    uint32_t status;

    if (off >= VN_EPF_SPAD_OFFSET && off < SPADS_END) {
        merge(&p->spad[(off - VN_EPF_SPAD_OFFSET) / 4], v, mask);
        return;
    }
    if (off >= SPADS_END && off < PEER_SPADS_END) {
        if (peer->connected) {
            merge(&peer->spad[(off - SPADS_END) / 4], v, mask);
        }
        return;
    }
    switch (off) {
    case VN_EPF_REG_COMMAND:
        if (mask & 0xff) {
            run_command(e, port, v & mask);
        }
        break;
    case VN_EPF_REG_ARGUMENT:
        merge(&p->argument, v, mask);
        break;
    case VN_EPF_REG_CMD_STATUS:
        status = p->status;
        merge(&status, v, mask & 0xffff); /* LINK_STATUS, the upper half, is RO */
        p->status = (uint16_t)status;
        break;
    case VN_EPF_REG_LOWER_ADDR:
        merge(&p->addr_lo, v, mask);
        break;
    case VN_EPF_REG_UPPER_ADDR:
        merge(&p->addr_hi, v, mask);
        break;
    case VN_EPF_REG_LOWER_SIZE:
        merge(&p->size_lo, v, mask);
        break;
    case VN_EPF_REG_UPPER_SIZE:
        merge(&p->size_hi, v, mask);
        break;
    default: /* read-only or reserved: dropped */
        break;
    }
}

static bool access_ok(uint64_t offset, uint32_t len, uint64_t size)
{
    return len >= 1 && len <= VN_EPF_MAX_ACCESS && vn_util_range_ok(offset, len, size);
}

int vn_epf_ctrl_read(VnEpf *epf, unsigned port, uint64_t offset, void *buf, uint32_t len)
{
    uint8_t *out = buf;

    if (!access_ok(offset, len, VN_EPF_CTRL_SIZE)) {
        return -EINVAL;
    }
    for (uint32_t i = 0; i < len; i++) {
        uint32_t at = (uint32_t)offset + i;

        out[i] = (uint8_t)(ctrl_read32(epf, port & 1, at & ~3u) >> (8 * (at & 3)));
    }
    return 0;
}

int vn_epf_ctrl_write(VnEpf *epf, unsigned port, uint64_t offset, const void *buf, uint32_t len)
{
    const uint8_t *in = buf;
    uint32_t i = 0;

    if (!access_ok(offset, len, VN_EPF_CTRL_SIZE)) {
        return -EINVAL;
    }
    /* Word by word, each with the bytes of it this access covers. */
    while (i < len) {
        uint32_t at = (uint32_t)offset + i, word = at & ~3u, v = 0, mask = 0;

        for (; i < len && (((uint32_t)offset + i) & ~3u) == word; i++) {
            unsigned shift = 8 * (((uint32_t)offset + i) & 3);

            v |= (uint32_t)in[i] << shift;
            mask |= 0xffu << shift;
        }
        ctrl_write32(epf, port & 1, word, v, mask);
    }
    return 0;
}

/* ---- BAR2 and BAR4 ----------------------------------------------------- */

int vn_epf_db_read(VnEpf *epf, unsigned port, uint64_t offset, void *buf, uint32_t len)
{
    if (!access_ok(offset, len, VN_EPF_DB_SIZE)) {
        return -EINVAL;
    }
    memset(buf, 0, len);
    return 0;
}

int vn_epf_db_write(VnEpf *epf, unsigned port, uint64_t offset, const void *buf, uint32_t len)
{
    EpfPort *p = &epf->port[port & 1], *peer = &epf->port[(port & 1) ^ 1];
    uint32_t vector = (uint32_t)(offset / VN_EPF_DB_ENTRY_SIZE);

    if (!access_ok(offset, len, VN_EPF_DB_SIZE)) {
        return -EINVAL;
    }
    if (!peer->connected || vector >= peer->vectors) {
        p->stats.doorbells_lost++;
        return 0;
    }
    p->stats.doorbells++;
    epf->ops->signal(epf->opaque, (port & 1) ^ 1, vector);
    return 0;
}

/* The peer port that @port's window reaches, when its function can do the DMA now: it is
 * there, translates [offset, offset + len) and may master the bus.  -1 otherwise. */
static int window_target(VnEpf *e, unsigned port, unsigned mw, uint64_t offset, uint32_t len)
{
    unsigned q = port ^ 1;
    EpfPort *peer = &e->port[q];

    if (peer->connected && peer->mw_valid[mw] && vn_util_range_ok(offset, len, peer->mw_size[mw]) &&
        (e->ops->bus_master == NULL || e->ops->bus_master(e->opaque, q))) {
        return (int)q;
    }
    return -1;
}

bool vn_epf_window_reach(VnEpf *epf, unsigned port, unsigned mw, uint64_t *addr, uint64_t *size)
{
    unsigned q = (port & 1) ^ 1;

    if (mw >= epf->windows || window_target(epf, port & 1, mw, 0, 1) < 0) {
        return false;
    }
    *addr = epf->port[q].mw_addr[mw];
    *size = MIN(epf->port[q].mw_size[mw], epf->window_size[mw]);
    return true;
}

int vn_epf_window_read(VnEpf *epf, unsigned port, unsigned mw, uint64_t offset, void *buf,
                       uint32_t len)
{
    EpfPort *p = &epf->port[port & 1];
    int q;

    if (mw >= epf->windows || !access_ok(offset, len, epf->window_size[mw])) {
        return -EINVAL;
    }
    p->stats.window_reads++;
    q = window_target(epf, port & 1, mw, offset, len);
    if (q < 0 || epf->ops->dma_read(epf->opaque, (unsigned)q, epf->port[q].mw_addr[mw] + offset,
                                    buf, len) < 0) {
        p->stats.window_faults++;
        memset(buf, 0xff, len); /* a read that completes with nothing: all ones */
    }
    return 0;
}

int vn_epf_window_write(VnEpf *epf, unsigned port, unsigned mw, uint64_t offset, const void *buf,
                        uint32_t len)
{
    EpfPort *p = &epf->port[port & 1];
    int q;

    if (mw >= epf->windows || !access_ok(offset, len, epf->window_size[mw])) {
        return -EINVAL;
    }
    p->stats.window_writes++;
    q = window_target(epf, port & 1, mw, offset, len);
    if (q < 0 || epf->ops->dma_write(epf->opaque, (unsigned)q, epf->port[q].mw_addr[mw] + offset,
                                     buf, len) < 0) {
        p->stats.window_faults++; /* a posted write that reached nothing is lost */
    }
    return 0;
}
