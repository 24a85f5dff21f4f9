/*
 * Config-space mediation for a borrowed device.
 *
 * Most of config space is the device's and is forwarded to the lender.  What
 * cannot be honoured across the fabric, or belongs to the borrower's side of
 * the bus, is answered here:
 *   BAR registers   reads forwarded (QEMU learns the BAR types), writes
 *                   dropped: the device's addresses are the lender's business
 *   ROM BAR         a local register sized like the lender's ROM region (0
 *                   without one): QEMU sizes it and serves the guest the
 *                   ROM's bytes, read from the ROM region (GPU drivers read
 *                   their VBIOS there); the device's own ROM BAR stays the
 *                   lender's
 *   Interrupt Line  a local byte (firmware writes it, nothing uses it)
 *   Initiate FLR    turned into a RESET of the lent device (PCIe r5.0 6.6.2)
 *   extended space  reads 0 (PCIe r5.0 7.6.3: a zero header ends the list):
 *                   AER, ATS, SR-IOV and friends act on the lender's fabric
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower-int.h"

#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <linux/pci_regs.h>
#include <string.h>

/* A capability list longer than this is a loop (48 = (256 - 64) / 4). */
#define VN_MEDIATE_MAX_CAPS 48
/* An expansion ROM is 2 KiB to 16 MiB (PCI r3.0 6.2.5.2 allows more; no
 * device ships that). */
#define VN_MEDIATE_MIN_ROM 2048u
#define VN_MEDIATE_MAX_ROM (16u << 20)

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void vn_mediate_init(VnBorrower *b, const uint8_t *cfg)
{
    VnMediate *m = &b->med;
    unsigned pos;

    memset(m, 0, sizeof(*m));
    /* The lender is a peer: a ROM of an odd size is no ROM. */
    if (b->info.num_regions > VFIO_PCI_ROM_REGION_INDEX) {
        uint64_t rom = b->info.regions[VFIO_PCI_ROM_REGION_INDEX].size;

        if (rom >= VN_MEDIATE_MIN_ROM && rom <= VN_MEDIATE_MAX_ROM && (rom & (rom - 1)) == 0 &&
            (b->info.regions[VFIO_PCI_ROM_REGION_INDEX].flags & VFIO_REGION_INFO_FLAG_READ)) {
            m->rom_size = rom;
        }
    }
    m->int_line = cfg[PCI_INTERRUPT_LINE];
    for (unsigned i = 0; i < PCI_STD_NUM_BARS; i++) {
        m->bar[i] = le32(&cfg[PCI_BASE_ADDRESS_0 + 4 * i]);
        m->bar_type[i] = (uint8_t)(m->bar[i] & 0xf);
    }
    m->command = (uint16_t)(cfg[PCI_COMMAND] | cfg[PCI_COMMAND + 1] << 8);
    if (!(cfg[PCI_STATUS] & PCI_STATUS_CAP_LIST)) {
        return;
    }
    /* The lender is a peer like any other: a bad list ends the walk. */
    pos = cfg[PCI_CAPABILITY_LIST] & ~3u;
    for (int n = 0; n < VN_MEDIATE_MAX_CAPS && pos >= 0x40 && pos < 0xfc; n++) {
        uint8_t id = cfg[pos];

        if (id == PCI_CAP_ID_EXP) {
            m->exp_cap = (uint8_t)pos;
        } else if (id == PCI_CAP_ID_MSIX && pos + 12 <= PCI_CFG_SPACE_SIZE) {
            uint16_t flags = (uint16_t)(cfg[pos + 2] | cfg[pos + 3] << 8);
            uint32_t table = le32(&cfg[pos + PCI_MSIX_TABLE]);
            uint32_t pba = le32(&cfg[pos + PCI_MSIX_PBA]);

            m->msix.present = true;
            m->msix.vectors = (flags & PCI_MSIX_FLAGS_QSIZE) + 1u;
            m->msix.table_bar = table & PCI_MSIX_TABLE_BIR;
            m->msix.table_offset = table & PCI_MSIX_TABLE_OFFSET;
            m->msix.pba_bar = pba & PCI_MSIX_PBA_BIR;
            m->msix.pba_offset = pba & PCI_MSIX_PBA_OFFSET;
        }
        pos = cfg[pos + PCI_CAP_LIST_NEXT] & ~3u;
    }
}

/* What the borrower does with one config byte. */
typedef enum Rule {
    RULE_FORWARD,   /* the device's */
    RULE_ZERO,      /* reads 0, writes dropped */
    RULE_READ_ONLY, /* reads forwarded, writes dropped */
    RULE_LOCAL,     /* a byte kept here */
    RULE_ROM,       /* a byte of the ROM BAR kept here */
} Rule;

/* The ROM BAR as read: the address bits the size leaves, the enable bit. */
static uint32_t rom_bar(const VnMediate *m)
{
    if (m->rom_size == 0) {
        return 0;
    }
    return (m->rom_bar & (uint32_t) ~(m->rom_size - 1) & PCI_ROM_ADDRESS_MASK) |
           (m->rom_bar & PCI_ROM_ADDRESS_ENABLE);
}

static Rule rule_of(const VnMediate *m, uint64_t a)
{
    if (a >= PCI_CFG_SPACE_SIZE) {
        return RULE_ZERO;
    }
    if (a >= PCI_BASE_ADDRESS_0 && a <= PCI_BASE_ADDRESS_5 + 3) {
        return RULE_READ_ONLY;
    }
    if (a >= PCI_ROM_ADDRESS && a < PCI_ROM_ADDRESS + 4) {
        return RULE_ROM;
    }
    if (a == PCI_INTERRUPT_LINE) {
        return RULE_LOCAL;
    }
    return RULE_FORWARD;
}

/* Our bytes of [offset, offset + count) into @p, as @m has them; the device's (forwarded)
 * are left as they are. */
static void patch(const VnMediate *m, uint64_t offset, uint32_t count, uint8_t *p)
{
    for (uint64_t a = offset; a < offset + count; a++) {
        switch (rule_of(m, a)) {
        case RULE_ZERO:
            p[a - offset] = 0;
            break;
        case RULE_LOCAL:
            p[a - offset] = m->int_line;
            break;
        case RULE_ROM:
            p[a - offset] = (uint8_t)(rom_bar(m) >> (8 * (a - PCI_ROM_ADDRESS)));
            break;
        default:
            break;
        }
    }
}

/* A config read on its way to the lender, with our registers as they were when QEMU asked
 * (a write it sends after the read must not show in it), laid over the device's bytes when
 * they come. */
typedef struct ConfigRead {
    uint64_t reply_id;
    uint64_t offset;
    uint32_t count, forwarded;
    VnMediate med;
} ConfigRead;

static int on_config_read(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    const ConfigRead *r = opaque;
    g_autofree uint8_t *bytes = NULL;

    if (err < 0) {
        return err;
    }
    if (reply == NULL || reply->data_len != r->forwarded) {
        return -EPROTO;
    }
    bytes = g_malloc(r->count);
    memcpy(bytes, reply->data, r->forwarded);
    patch(&r->med, r->offset, r->count, bytes);
    if (b->server != NULL) {
        vn_server_complete_read(b->server, r->reply_id, bytes, r->count);
    }
    return VN_BORROWER_ANSWERED;
}

int vn_mediate_read(VnBorrower *b, uint64_t offset, void *buf, uint32_t count)
{
    uint64_t fwd_end = MIN(offset + count, (uint64_t)PCI_CFG_SPACE_SIZE);
    g_autofree char *json = NULL;
    VnProtoRegionRw rw = { .region = VFIO_PCI_CONFIG_REGION_INDEX, .offset = offset };
    ConfigRead *r;

    if (offset >= fwd_end) {
        patch(&b->med, offset, count, buf); /* extended space: all ours */
        b->stats.config_virtualized++;
        return 0;
    }
    /* One forwarded read for the conventional part (QEMU reads all of config space at once
     * when the device is added), answered to QEMU with our bytes laid over it. */
    b->stats.config_forwarded++;
    r = g_new0(ConfigRead, 1);
    *r = (ConfigRead){ .reply_id = vn_server_later(b->server),
                       .offset = offset,
                       .count = count,
                       .forwarded = (uint32_t)(fwd_end - offset),
                       .med = b->med };
    rw.count = r->forwarded;
    json = vn_proto_region_rw_to_json(b->device, &rw);
    return vn_borrower_ask_later(b, VN_PROTO_REGION_RW, json, NULL, 0, 0, on_config_read, r,
                                 g_free);
}

/*
 * A config write goes as one request per run of the device's bytes (and a RESET for an
 * FLR), one after the other; QEMU's reply waits for the last answer and carries the first
 * error.  The earlier answers only note theirs here.
 */
typedef struct ConfigWrite {
    gint refs;
    int first_err;
} ConfigWrite;

static void config_write_unref(void *opaque)
{
    ConfigWrite *w = opaque;

    if (--w->refs == 0) {
        g_free(w);
    }
}

static void on_config_run(void *opaque, VnFabricMsg *reply, int err)
{
    ConfigWrite *w = opaque;

    if (err < 0 && w->first_err == 0) {
        w->first_err = err;
    }
    config_write_unref(w);
}

static int on_config_written(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    ConfigWrite *w = opaque;

    return w->first_err < 0 ? w->first_err : err;
}

/* Send @type (a run of bytes, or the RESET) to the lender: the last one (@last) answers
 * QEMU. */
static int config_send(VnBorrower *b, ConfigWrite *w, uint32_t type, const char *json,
                       const void *data, size_t len, bool last)
{
    int ret;

    w->refs++;
    if (last) {
        return vn_borrower_ask_later(b, type, json, data, len, 0, on_config_written, w,
                                     config_write_unref);
    }
    ret = vn_borrower_call_async(b, type, json, data, len, on_config_run, w);
    if (ret < 0) {
        w->refs--;
        if (w->first_err == 0) {
            w->first_err = ret;
        }
    }
    return 0;
}

/* Keep what the guest writes to the BAR registers and Command (p2p.c); whether it touched
 * them. */
static bool shadow(VnBorrower *b, uint64_t offset, const uint8_t *data, uint64_t n)
{
    VnMediate *m = &b->med;
    bool touched = false;

    for (uint64_t a = offset; a < offset + n; a++) {
        uint8_t v = data[a - offset];

        if (a >= PCI_BASE_ADDRESS_0 && a <= PCI_BASE_ADDRESS_5 + 3) {
            unsigned i = (unsigned)(a - PCI_BASE_ADDRESS_0) / 4,
                     shift = 8 * ((a - PCI_BASE_ADDRESS_0) % 4);

            m->bar[i] = (m->bar[i] & ~(0xffu << shift)) | (uint32_t)v << shift;
            touched = true;
        } else if (a == PCI_COMMAND || a == PCI_COMMAND + 1) {
            unsigned shift = 8 * (unsigned)(a - PCI_COMMAND);

            m->command = (uint16_t)((m->command & ~(0xffu << shift)) | (unsigned)v << shift);
            touched = true;
        }
    }
    return touched;
}

int vn_mediate_write(VnBorrower *b, uint64_t offset, const void *buf, uint32_t count)
{
    const VnMediate *m = &b->med;
    uint8_t data[PCI_CFG_SPACE_SIZE];
    uint64_t end = offset + count;
    uint64_t runs[PCI_CFG_SPACE_SIZE / 2 + 1][2]; /* runs alternate with our bytes */
    unsigned nruns = 0;
    uint64_t run = UINT64_MAX;
    bool flr = false, placing;
    ConfigWrite *w;
    int ret = 0;

    if (offset >= PCI_CFG_SPACE_SIZE) {
        b->stats.config_virtualized++;
        return 0;
    }
    end = MIN(end, (uint64_t)PCI_CFG_SPACE_SIZE);
    memcpy(data, buf, end - offset);
    /* Initiate FLR (bit 15 of Device Control) becomes a RESET request. */
    if (m->exp_cap != 0) {
        uint64_t hi = m->exp_cap + PCI_EXP_DEVCTL + 1;

        if (hi >= offset && hi < end && (data[hi - offset] & 0x80)) {
            data[hi - offset] &= 0x7f;
            flr = true;
        }
    }
    placing = shadow(b, offset, data, end - offset);
    for (uint64_t a = offset; a <= end; a++) {
        Rule r = a < end ? rule_of(m, a) : RULE_ZERO;

        if (r == RULE_FORWARD) {
            if (run == UINT64_MAX) {
                run = a;
            }
            continue;
        }
        if (run != UINT64_MAX) {
            runs[nruns][0] = run;
            runs[nruns][1] = a;
            nruns++;
            run = UINT64_MAX;
        }
        if (a < end && r == RULE_LOCAL) {
            b->med.int_line = data[a - offset];
            b->stats.config_virtualized++;
        } else if (a < end && r == RULE_ROM) {
            unsigned shift = 8 * (unsigned)(a - PCI_ROM_ADDRESS);

            b->med.rom_bar = (b->med.rom_bar & ~(0xffu << shift)) | (uint32_t)data[a - offset]
                                                                        << shift;
        }
    }
    /* Said before the write goes on (and QEMU maps the BAR after its answer): the daemon
     * knows where the BAR is when another device's offer of it comes. */
    if (placing) {
        vn_borrower_p2p_place(b, false);
    }
    if (nruns == 0 && !flr) {
        return 0;
    }
    w = g_new0(ConfigWrite, 1);
    w->refs = 1;
    for (unsigned i = 0; i < nruns && ret == 0; i++) {
        VnProtoRegionRw rw = { .region = VFIO_PCI_CONFIG_REGION_INDEX,
                               .offset = runs[i][0],
                               .count = (uint32_t)(runs[i][1] - runs[i][0]),
                               .write = true };
        g_autofree char *json = vn_proto_region_rw_to_json(b->device, &rw);

        b->stats.config_forwarded++;
        ret = config_send(b, w, VN_PROTO_REGION_RW, json, data + (runs[i][0] - offset), rw.count,
                          i + 1 == nruns && !flr);
    }
    if (flr) {
        g_autofree char *json = vn_proto_device_only_to_json(b->device);

        g_info("borrower %s: guest requested FLR: resetting the lent device", b->device);
        ret = config_send(b, w, VN_PROTO_RESET, json, NULL, 0, true);
    }
    config_write_unref(w);
    return ret;
}
