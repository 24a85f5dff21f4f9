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

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <linux/pci_regs.h>
#include <string.h>

/* Capability list entries walked at most (PCI r3.0: 48 fit in config space's 192 bytes
 * after the header): a device server's loop in its list must not hold us. */
#define VN_GUARD_MAX_CAPS 48
/* How long accesses already under way through a window are given to complete once its
 * translation went (see vn_lender_guard_withhold). */
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

/* Every segment of every region: withheld or given back; how many windows changed, or the
 * first error. */
static int bars_set(VnLender *l, bool withhold)
{
    int first = 0, changed = 0;

    for (uint32_t i = 0; i < l->dev.num_regions; i++) {
        const VnProtoRegion *r = &l->dev.regions[i];

        for (uint32_t k = 0; k < r->nr_segments; k++) {
            int ret = vn_fabric_segment_withhold(l->fab, r->segments[k], withhold);

            if (ret < 0 && first == 0) {
                first = ret;
            }
            changed += ret > 0 ? ret : 0;
        }
    }
    return first < 0 ? first : changed;
}

int vn_lender_guard_withhold(VnLender *l, const char *why)
{
    int ret;

    if (l->bars_withheld) {
        return 0;
    }
    ret = bars_set(l, true);
    if (ret < 0) {
        g_warning("lender %s: %s: the paths onto its BARs could not all be withheld: %s", l->name,
                  why, g_strerror(-ret));
        return ret;
    }
    if (ret > 0) {
        /* An access the adapter forwarded before its translation went may still be on its
         * way to the BAR: let it complete before the BAR stops decoding.  A bounded wait of
         * this worker's (one device's) alone, as its device commands are; PCIe's completion
         * timeouts are 50 us to 50 ms, the default range's upper end is 10 ms. */
        g_usleep(VN_GUARD_DRAIN_MS * 1000);
    }
    l->bars_withheld = true;
    l->stats.bar_withholds++;
    g_info("lender %s: %s: the paths onto its BARs withheld", l->name, why);
    return 0;
}

int vn_lender_guard_before_write(VnLender *l, uint64_t offset, const void *data, uint32_t count)
{
    const char *why = write_disables_memory(l, offset, data, count);

    return why != NULL ? vn_lender_guard_withhold(l, why) : 0;
}

void vn_lender_guard_settle(VnLender *l)
{
    uint16_t cmd = 0, pmcsr = 0;
    int ret;

    if (!l->bars_withheld || l->device == NULL || vn_lender_cfg_read(l, PCI_COMMAND, &cmd, 2) < 0 ||
        !(GUINT16_FROM_LE(cmd) & PCI_COMMAND_MEMORY)) {
        return;
    }
    if (l->pm_cap != 0 && (vn_lender_cfg_read(l, l->pm_cap + PCI_PM_CTRL, &pmcsr, 2) < 0 ||
                           (GUINT16_FROM_LE(pmcsr) & PCI_PM_CTRL_STATE_MASK) != 0)) {
        return;
    }
    ret = bars_set(l, false);
    if (ret < 0) {
        g_warning("lender %s: memory decode on again, but the paths onto its BARs could not "
                  "all be given back: %s",
                  l->name, g_strerror(-ret));
        return;
    }
    l->bars_withheld = false;
    g_info("lender %s: memory decode on again: the paths onto its BARs given back", l->name);
}
