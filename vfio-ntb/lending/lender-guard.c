/*
 * The lender's guard of a lent device's BARs, as VFIO guards its own mappings (the
 * CVE-2020-12888 class): before a config write that may stop the device decoding its
 * memory (COMMAND.MEM cleared, a function-level reset, a power-state change) or a reset
 * forwarded to the device, every path of the holder's onto the BARs is withheld and
 * confirmed (on an NTB: our inbound translations onto them are cleared), so that no
 * access through them reaches a BAR that does not decode: on some platforms that is an
 * unsupported request, an AER event, a host crash.  Meanwhile the holder's accesses
 * complete with nothing (all ones), as on a disabled BAR.  The paths are given back once
 * the device decodes its memory again: COMMAND.MEM set and in D0, read from the device
 * itself after every config write while withheld (a reset may restore COMMAND on its own).
 *
 * VFIO revokes its own mappings of a BAR (shm, where the holder maps the VFIO device
 * file); what it cannot reach is an NTB's translation onto the BAR, which this withholds.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"
#include "trace-lending.h"

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <linux/pci_regs.h>
#include <string.h>

/* Capability list entries walked at most (PCI r3.0: 48 fit in config space's 192 bytes
 * after the header): a device server's loop in its list must not hold us. */
#define VN_GUARD_MAX_CAPS 48
/* How long accesses already under way through a window are given to complete once its
 * translation went (see guard_withheld). */
#define VN_GUARD_DRAIN_MS 10

int vn_lender_cfg_read(VnLender *l, uint32_t offset, void *buf, uint32_t count)
{
    int ret = l->ops->region_read(l->device, VFIO_PCI_CONFIG_REGION_INDEX, offset, buf, count);

    return ret < 0 ? ret : (uint32_t)ret == count ? 0 : -EIO;
}

void vn_lender_guard_probe(VnLender *l)
{
    uint8_t pos = 0, id_next[2];
    uint16_t status = 0;

    l->pm_cap = l->exp_cap = 0;
    l->bars_withheld = false;
    if (vn_lender_cfg_read(l, PCI_STATUS, &status, 2) < 0 ||
        !(GUINT16_FROM_LE(status) & PCI_STATUS_CAP_LIST) ||
        vn_lender_cfg_read(l, PCI_CAPABILITY_LIST, &pos, 1) < 0) {
        return;
    }
    for (int n = 0; n < VN_GUARD_MAX_CAPS && pos >= PCI_STD_HEADER_SIZEOF; n++) {
        pos &= (uint8_t)~3u;
        if (vn_lender_cfg_read(l, pos, id_next, 2) < 0) {
            return;
        }
        if (id_next[0] == PCI_CAP_ID_PM && l->pm_cap == 0) {
            l->pm_cap = pos;
        } else if (id_next[0] == PCI_CAP_ID_EXP && l->exp_cap == 0) {
            l->exp_cap = pos;
        }
        pos = id_next[1];
    }
}

/* The bytes a write of @count at @offset (@data) puts in [at, at + 2), merged over what
 * the device has there now: -1 when the write does not touch that word. */
static int written_word(VnLender *l, uint64_t offset, const uint8_t *data, uint32_t count,
                        uint32_t at)
{
    uint8_t word[2];

    if (at == 0 || offset >= (uint64_t)at + 2 || offset + count <= at) {
        return -1;
    }
    if (vn_lender_cfg_read(l, at, word, 2) < 0) {
        memset(word, 0, sizeof(word));
    }
    for (uint32_t b = 0; b < 2; b++) {
        if (at + b >= offset && at + b < offset + count) {
            word[b] = data[at + b - offset];
        }
    }
    return word[0] | word[1] << 8;
}

/* Why a config write may stop the device decoding its memory, or NULL. */
static const char *write_disables_memory(VnLender *l, uint64_t offset, const uint8_t *data,
                                         uint32_t count)
{
    int cmd = written_word(l, offset, data, count, PCI_COMMAND);
    int devctl =
        l->exp_cap ? written_word(l, offset, data, count, l->exp_cap + PCI_EXP_DEVCTL) : -1;
    int pmcsr = l->pm_cap ? written_word(l, offset, data, count, l->pm_cap + PCI_PM_CTRL) : -1;
    uint16_t now = 0;

    if (cmd >= 0 && !(cmd & PCI_COMMAND_MEMORY)) {
        return "memory decode turned off";
    }
    if (devctl >= 0 && (devctl & PCI_EXP_DEVCTL_BCR_FLR)) {
        return "a function-level reset";
    }
    if (pmcsr >= 0 && vn_lender_cfg_read(l, l->pm_cap + PCI_PM_CTRL, &now, 2) == 0 &&
        (pmcsr & PCI_PM_CTRL_STATE_MASK) != (GUINT16_FROM_LE(now) & PCI_PM_CTRL_STATE_MASK)) {
        return "a power state change";
    }
    return NULL;
}

/*
 * A config write or reset the guard brackets, as one wait of the lender's (lender-queue.c):
 * the paths withheld (when @why and not yet), the accesses under way drained, the device
 * command, the paths given back (when it decodes its memory again), then the answer.  The
 * withholds and give-backs are asked of the fabric without waiting (a worker's are its
 * daemon's to make); the requests after this one wait meanwhile.
 */
typedef struct GuardWait {
    VnLenderWait wait;
    const char *why; /* withhold first, for this (a literal); NULL: not needed */
    bool reset;      /* else a config write of @count bytes of @data at @offset */
    uint64_t offset;
    uint32_t count;
    int ret;          /* the answer: the command's outcome, or why it was not made */
    bool withholding; /* the segments asked now are withheld (else given back) */
    unsigned unanswered;
    int first_err, changed; /* of the segments asked now */
    GSource *drain;
    uint8_t data[];
} GuardWait;

static void guard_withheld(GuardWait *g);
static void guard_given_back(GuardWait *g);

static void segment_set(void *opaque, int ret)
{
    GuardWait *g = opaque;

    if (ret < 0 && g->first_err == 0) {
        g->first_err = ret;
    }
    g->changed += ret > 0 ? ret : 0;
    if (--g->unanswered > 0) {
        return;
    }
    if (g->withholding) {
        guard_withheld(g);
    } else {
        guard_given_back(g);
    }
}

/* Ask every segment of every region to be withheld (or given back); what they say goes to
 * guard_withheld (guard_given_back) once all answered, maybe at once. */
static void bars_set(VnLender *l, GuardWait *g, bool withhold)
{
    g->withholding = withhold;
    g->unanswered = 1;
    g->first_err = 0;
    g->changed = 0;
    for (uint32_t i = 0; i < l->dev.num_regions; i++) {
        const VnProtoRegion *r = &l->dev.regions[i];

        for (uint32_t k = 0; k < r->nr_segments; k++) {
            g->unanswered++;
            vn_fabric_segment_withhold_async(l->fab, r->segments[k], withhold, segment_set, g);
        }
    }
    segment_set(g, 0);
}

/* The request is answered (g->ret), and the next one handled. */
static void guard_end(GuardWait *g)
{
    VnLender *l = vn_lender_wait_end(&g->wait);

    if (l != NULL && g->ret < 0) {
        vn_lender_fail(l, g->wait.token, g->ret, "%s failed on the device: %s",
                       g->reset ? "reset" : "config write", g_strerror(-g->ret));
    } else if (l != NULL) {
        l->stats.resets += g->reset ? 1 : 0;
        vn_fabric_reply(l->fab, g->wait.token, "{}", NULL, 0);
    }
    if (g->drain != NULL) {
        g_source_destroy(g->drain);
        g_source_unref(g->drain);
    }
    g_free(g);
    if (l != NULL) {
        vn_lender_wait_next(l);
    }
}

/* Whether the device decodes its memory: COMMAND.MEM set and in D0, as it says itself (a
 * reset may restore COMMAND on its own). */
static bool decodes(VnLender *l)
{
    uint16_t cmd = 0, pmcsr = 0;

    if (vn_lender_cfg_read(l, PCI_COMMAND, &cmd, 2) < 0 ||
        !(GUINT16_FROM_LE(cmd) & PCI_COMMAND_MEMORY)) {
        return false;
    }
    return l->pm_cap == 0 || (vn_lender_cfg_read(l, l->pm_cap + PCI_PM_CTRL, &pmcsr, 2) == 0 &&
                              (GUINT16_FROM_LE(pmcsr) & PCI_PM_CTRL_STATE_MASK) == 0);
}

/* The device command, then the paths back if it decodes its memory again. */
static void guard_act(GuardWait *g)
{
    VnLender *l = g->wait.l;

    if (l == NULL || !vn_lender_wait_current(l, &g->wait)) {
        g->ret = -ENODEV;
        guard_end(g);
        return;
    }
    g->ret = g->reset ? l->ops->reset(l->device)
                      : l->ops->region_write(l->device, VFIO_PCI_CONFIG_REGION_INDEX, g->offset,
                                             g->data, g->count);
    g->ret = MIN(g->ret, 0);
    if (!g->reset) {
        trace_lender_device_rw(l->name, g->wait.corr, "write", VFIO_PCI_CONFIG_REGION_INDEX,
                               g->offset, g->count, g->ret);
    }
    if (l->bars_withheld && decodes(l)) {
        bars_set(l, g, false);
        return;
    }
    guard_end(g);
}

static gboolean on_drained(gpointer data)
{
    GuardWait *g = data;

    g_clear_pointer(&g->drain, g_source_unref);
    guard_act(g);
    return G_SOURCE_REMOVE;
}

static void guard_withheld(GuardWait *g)
{
    VnLender *l = g->wait.l;

    if (l == NULL || !vn_lender_wait_current(l, &g->wait)) {
        g->ret = -ENODEV;
        guard_end(g);
        return;
    }
    if (g->first_err < 0) {
        g_warning("lender %s: %s: the paths onto its BARs could not all be withheld: %s", l->name,
                  g->why, g_strerror(-g->first_err));
        g->ret = g->first_err; /* the command is not made */
        guard_end(g);
        return;
    }
    l->bars_withheld = true;
    l->stats.bar_withholds++;
    g_info("lender %s: %s: the paths onto its BARs withheld", l->name, g->why);
    if (g->changed > 0) {
        /* An access the adapter forwarded before its translation went may still be on its
         * way to the BAR: let it complete before the BAR stops decoding.  PCIe's completion
         * timeouts are 50 us to 50 ms, the default range's upper end is 10 ms; the loop
         * serves everything else meanwhile, and this device's requests wait in order. */
        g->drain = g_timeout_source_new(VN_GUARD_DRAIN_MS);
        g_source_set_callback(g->drain, on_drained, g, NULL);
        g_source_attach(g->drain, l->ctx);
        return;
    }
    guard_act(g);
}

static void guard_given_back(GuardWait *g)
{
    VnLender *l = g->wait.l;

    if (l != NULL && g->first_err < 0) {
        g_warning("lender %s: memory decode on again, but the paths onto its BARs could not "
                  "all be given back: %s",
                  l->name, g_strerror(-g->first_err));
    } else if (l != NULL) {
        l->bars_withheld = false;
        g_info("lender %s: memory decode on again: the paths onto its BARs given back", l->name);
    }
    guard_end(g);
}

static void guard_begin(VnLender *l, uint64_t token, const char *why, bool reset, uint64_t offset,
                        const void *data, uint32_t count)
{
    GuardWait *g = g_malloc0(sizeof(*g) + count);

    g->why = l->bars_withheld ? NULL : why;
    g->reset = reset;
    g->offset = offset;
    g->count = count;
    if (count > 0) {
        memcpy(g->data, data, count);
    }
    vn_lender_wait_begin(l, &g->wait, token);
    if (g->why != NULL) {
        bars_set(l, g, true);
    } else {
        guard_act(g);
    }
}

bool vn_lender_guard_write(VnLender *l, uint64_t token, uint64_t offset, const void *data,
                           uint32_t count)
{
    const char *why = write_disables_memory(l, offset, data, count);

    if (why == NULL && !l->bars_withheld) {
        return false;
    }
    guard_begin(l, token, why, false, offset, data, count);
    return true;
}

void vn_lender_guard_reset(VnLender *l, uint64_t token)
{
    guard_begin(l, token, "reset", true, 0, NULL, 0);
}
