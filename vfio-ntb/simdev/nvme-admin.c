/*
 * Admin commands of the simulated NVMe controller (NVMe 1.4 section 5):
 * Identify, Get/Set Features, Create/Delete I/O queues, Get Log Page,
 * Asynchronous Event Request, Abort, Keep Alive.  Everything else is an
 * Invalid Opcode, which is what Identify's OACS = 0 promises.
 *
 * Runs in the engine thread with the controller lock held (nvme.c).
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "nvme-int.h"

#include "common/util.h"
#include "trace-simdev.h"

#include <string.h>

#define MODEL "vfio-ntb simulated NVMe"
#define FIRMWARE "1.0"
/* 4.5 / Identify SUBNQN: an NQN of our own so two simulated devices never
 * look like one subsystem to the host (Linux matches subsystems by it). */
#define SUBNQN_PREFIX "nqn.2024-01.io.vfio-ntb:simdev:"
#define IDENTIFY_SIZE 4096u
#define NSID_ALL 0xffffffffu

static void put16(uint8_t *b, unsigned off, uint16_t v)
{
    b[off] = v & 0xff;
    b[off + 1] = v >> 8;
}

static void put32(uint8_t *b, unsigned off, uint32_t v)
{
    put16(b, off, v & 0xffff);
    put16(b, off + 2, v >> 16);
}

static void put64(uint8_t *b, unsigned off, uint64_t v)
{
    put32(b, off, (uint32_t)v);
    put32(b, off + 4, (uint32_t)(v >> 32));
}

/* ASCII fields are space padded, not NUL terminated (7.10). */
static void put_ascii(uint8_t *b, unsigned off, unsigned len, const char *s)
{
    size_t n = MIN(strlen(s), len);

    memset(b + off, ' ', len);
    memcpy(b + off, s, n);
}

/* Figure 247: Identify Controller data structure. */
static void identify_ctrl(VnNvme *n, uint8_t *b)
{
    g_autofree char *nqn = g_strconcat(SUBNQN_PREFIX, n->serial, NULL);

    put16(b, 0, n->params.pci_vendor_id);                  /* VID */
    put16(b, 2, n->params.pci_subsys_vendor_id);           /* SSVID */
    put_ascii(b, 4, 20, n->serial);                        /* SN */
    put_ascii(b, 24, 40, MODEL);                           /* MN */
    put_ascii(b, 64, 8, FIRMWARE);                         /* FR */
    b[72] = 6;                                             /* RAB: 2^6 commands */
    b[77] = VN_NVME_MDTS;                                  /* MDTS */
    put16(b, 78, 0);                                       /* CNTLID */
    put32(b, 80, 0x00010400);                              /* VER 1.4 */
    b[111] = 1;                                            /* CNTRLTYPE: I/O */
    put16(b, 256, 0);                                      /* OACS: no optional admin commands */
    b[258] = 3;                                            /* ACL: 4 Aborts (0's based) */
    b[259] = VN_NVME_AERL;                                 /* AERL (0's based) */
    b[260] = 0x03;                                         /* FRMW: one slot, read-only */
    b[261] = 0x04;                                         /* LPA: Get Log Page offsets */
    b[262] = 0;                                            /* ELPE: one error log entry */
    b[263] = 0;                                            /* NPSS: power state 0 only */
    put16(b, 266, VN_NVME_WCTEMP);                         /* WCTEMP */
    put16(b, 268, VN_NVME_CCTEMP);                         /* CCTEMP */
    b[512] = (VN_NVME_SQE_SHIFT << 4) | VN_NVME_SQE_SHIFT; /* SQES */
    b[513] = (VN_NVME_CQE_SHIFT << 4) | VN_NVME_CQE_SHIFT; /* CQES */
    put32(b, 516, 1);                                      /* NN: one namespace */
    /* ONCS: Write Zeroes (bit 3) and Timestamp (bit 6). */
    put16(b, 520, (1u << 3) | (1u << 6));
    /* VWC: present, Flush with NSID FFFFFFFFh supported (bits 2:1 = 11b). */
    b[525] = 0x07;
    /* SUBNQN: UTF-8, NUL padded (the buffer is zeroed). */
    memcpy(b + 768, nqn, MIN(strlen(nqn), 255u));
    /* PSD0 (Figure 248): MP = 25 W in 0.01 W units, operational. */
    put16(b, 2048, 2500);
}

/* Figure 249: Identify Namespace data structure. */
static void identify_ns(VnNvme *n, uint8_t *b)
{
    put64(b, 0, n->nblocks);  /* NSZE */
    put64(b, 8, n->nblocks);  /* NCAP */
    put64(b, 16, n->nblocks); /* NUSE */
    b[24] = 0;                /* NSFEAT */
    b[25] = 0;                /* NLBAF: one format (0's based) */
    b[26] = 0;                /* FLBAS: format 0, no metadata */
    /* DLFEAT: deallocated blocks read as zeros, Write Zeroes may
     * deallocate (we punch holes). */
    b[33] = 0x09;
    put64(b, 48, n->nblocks * VN_NVME_LBA_SIZE); /* NVMCAP, low 64 bits */
    memcpy(b + 104, n->nguid, 16);               /* NGUID */
    b[128 + 2] = 9;                              /* LBAF0: LBADS 2^9, MS 0, RP 0 */
}

/* 5.15.2.3 (Figure 251): Namespace Identification Descriptor list. */
static void identify_ns_descs(VnNvme *n, uint8_t *b)
{
    b[0] = 2;  /* NIDT: NGUID */
    b[1] = 16; /* NIDL */
    memcpy(b + 4, n->nguid, 16);
}

/* 5.15: Identify; the data always goes to the host as 4 KiB. */
static uint16_t cmd_identify(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint8_t *b = n->bounce;
    uint8_t cns = cmd->cdw10 & 0xff;
    uint8_t csi = cmd->cdw11 >> 24;

    memset(b, 0, IDENTIFY_SIZE);
    switch (cns) {
    case 0x00:
        if (cmd->nsid != 1) {
            return VN_NVME_SC_INVALID_NS;
        }
        identify_ns(n, b);
        break;
    case 0x01:
        identify_ctrl(n, b);
        break;
    case 0x02:
        /* Active namespace ids above NSID; FFFFFFFEh/FFFFFFFFh are invalid. */
        if (cmd->nsid >= 0xfffffffeu) {
            return VN_NVME_SC_INVALID_NS;
        }
        if (cmd->nsid < 1) {
            put32(b, 0, 1);
        }
        break;
    case 0x03:
        /* Linux 6.1 gives up on a namespace whose descriptor list fails
         * (nvme_scan_ns returns when nvme_identify_ns_descs does), so this
         * must succeed for nsid 1; an NGUID descriptor is enough. */
        if (cmd->nsid != 1) {
            return VN_NVME_SC_INVALID_NS;
        }
        identify_ns_descs(n, b);
        break;
    case 0x05:
    case 0x06:
        /* I/O Command Set specific Identify Namespace/Controller (NVMe 2.0,
         * 5.17.2.5-6): Linux 6.1 asks for CNS 06h on every controller
         * (nvme_init_non_mdts_limits); for the NVM set all-zero data means
         * "no limits beyond MDTS", which is ours. */
        if (csi != 0 || (cns == 0x05 && cmd->nsid != 1)) {
            return cns == 0x05 && csi == 0 ? VN_NVME_SC_INVALID_NS : VN_NVME_SC_INVALID_FIELD;
        }
        break;
    default:
        return VN_NVME_SC_INVALID_FIELD;
    }
    return vn_nvme_prp_to_guest(n, cmd->prp1, cmd->prp2, b, IDENTIFY_SIZE);
}

/* --- Features (5.21) ------------------------------------------------------ */

static void features_default(VnNvme *n, VnNvmeFeatures *f)
{
    memset(f, 0, sizeof(*f));
    f->temp_over = VN_NVME_WCTEMP;
    f->wce = true;
}

static uint16_t set_timestamp(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint8_t ts[8];
    uint16_t st = vn_nvme_prp_from_guest(n, cmd->prp1, cmd->prp2, ts, sizeof(ts));
    uint64_t ms = 0;

    if (st != VN_NVME_SUCCESS) {
        return st;
    }
    /* Figure 296: the timestamp is 48 bits of milliseconds. */
    for (int i = 5; i >= 0; i--) {
        ms = ms << 8 | ts[i];
    }
    n->feat.ts_host_ms = ms;
    n->feat.ts_set_ns = vn_util_now_ns();
    return VN_NVME_SUCCESS;
}

static uint16_t get_timestamp(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint8_t ts[8] = { 0 };
    uint64_t now = vn_util_now_ns();
    uint64_t ms;

    if (n->feat.ts_set_ns != 0) {
        ms = n->feat.ts_host_ms + (now - n->feat.ts_set_ns) / 1000000;
        ts[6] = 1u << 1; /* Timestamp Origin 001b: set by the host */
    } else {
        ms = (now - n->power_on_ns) / 1000000; /* origin 000b: since reset */
    }
    put32(ts, 0, (uint32_t)ms);
    put16(ts, 4, (uint16_t)(ms >> 32));
    return vn_nvme_prp_to_guest(n, cmd->prp1, cmd->prp2, ts, sizeof(ts));
}

static bool io_queues_exist(VnNvme *n)
{
    for (unsigned q = 1; q < VN_NVME_MAX_QUEUES; q++) {
        if (n->sq[q].valid || n->cq[q].valid) {
            return true;
        }
    }
    return false;
}

static uint16_t cmd_set_features(VnNvme *n, const VnNvmeSqe *cmd, uint32_t *result)
{
    uint8_t fid = cmd->cdw10 & 0xff;
    uint32_t v = cmd->cdw11;
    VnNvmeFeatures *f = &n->feat;

    /* ONCS bit 4 is clear: nothing is saveable (5.21.1). */
    if (cmd->cdw10 & (1u << 31)) {
        return VN_NVME_SC_FEAT_NOT_SAVEABLE;
    }
    switch (fid) {
    case VN_NVME_FEAT_ARBITRATION:
        f->arbitration = v & 0xffffff07u;
        return VN_NVME_SUCCESS;
    case VN_NVME_FEAT_POWER_MGMT:
        if ((v & 0x1f) != 0) {
            return VN_NVME_SC_INVALID_FIELD; /* NPSS = 0: only PS 0 */
        }
        f->power_mgmt = v & 0xff;
        return VN_NVME_SUCCESS;
    case VN_NVME_FEAT_TEMP_THRESH: {
        uint32_t sel = (v >> 16) & 0xf, thsel = (v >> 20) & 0x3;

        /* Only the composite temperature (TMPSEL 0, or Fh = all). */
        if ((sel != 0 && sel != 0xf) || thsel > 1) {
            return VN_NVME_SC_INVALID_FIELD;
        }
        if (thsel == 0) {
            f->temp_over = v & 0xffff;
        } else {
            f->temp_under = v & 0xffff;
        }
        return VN_NVME_SUCCESS;
    }
    case VN_NVME_FEAT_ERROR_RECOVERY:
        if (v & (1u << 16)) {
            return VN_NVME_SC_INVALID_FIELD; /* DULBE: not supported */
        }
        f->error_recovery = v & 0xffff;
        return VN_NVME_SUCCESS;
    case VN_NVME_FEAT_VOLATILE_WC:
        f->wce = v & 1;
        return VN_NVME_SUCCESS;
    case VN_NVME_FEAT_NUM_QUEUES: {
        uint32_t nsq = v & 0xffff, ncq = v >> 16;

        /* 5.21.1.7: 0's based; FFFFh is invalid; only before any I/O
         * queue exists. */
        if (nsq == 0xffff || ncq == 0xffff) {
            return VN_NVME_SC_INVALID_FIELD;
        }
        if (io_queues_exist(n)) {
            return VN_NVME_SC_CMD_SEQ_ERROR;
        }
        nsq = MIN(nsq + 1, n->params.io_queues);
        ncq = MIN(ncq + 1, n->params.io_queues);
        n->ioq_granted = MAX(nsq, ncq);
        *result = (nsq - 1) | (ncq - 1) << 16;
        return VN_NVME_SUCCESS;
    }
    case VN_NVME_FEAT_IRQ_COALESCE:
        f->irq_coalesce = v & 0xffff;
        return VN_NVME_SUCCESS;
    case VN_NVME_FEAT_IRQ_CONFIG: {
        uint32_t iv = v & 0xffff;

        if (iv >= n->params.vectors) {
            return VN_NVME_SC_INVALID_FIELD;
        }
        if (v & (1u << 16)) {
            f->irq_cd[iv / 64] |= 1ull << (iv % 64);
        } else {
            f->irq_cd[iv / 64] &= ~(1ull << (iv % 64));
        }
        return VN_NVME_SUCCESS;
    }
    case VN_NVME_FEAT_WRITE_ATOMIC:
        f->write_atomic = v & 1;
        return VN_NVME_SUCCESS;
    case VN_NVME_FEAT_ASYNC_EVENT:
        /* OAES = 0: only the SMART critical warning bits exist. */
        f->async_event = v & 0xff;
        return VN_NVME_SUCCESS;
    case VN_NVME_FEAT_TIMESTAMP:
        return set_timestamp(n, cmd);
    default:
        return VN_NVME_SC_INVALID_FIELD;
    }
}

static uint16_t cmd_get_features(VnNvme *n, const VnNvmeSqe *cmd, uint32_t *result)
{
    uint8_t fid = cmd->cdw10 & 0xff;
    uint32_t sel = (cmd->cdw10 >> 8) & 0x7;
    VnNvmeFeatures def;
    const VnNvmeFeatures *f = &n->feat;

    features_default(n, &def);
    switch (fid) {
    case VN_NVME_FEAT_ARBITRATION ... VN_NVME_FEAT_POWER_MGMT:
    case VN_NVME_FEAT_TEMP_THRESH ... VN_NVME_FEAT_ASYNC_EVENT:
    case VN_NVME_FEAT_TIMESTAMP:
        break;
    default:
        return VN_NVME_SC_INVALID_FIELD;
    }
    /* Figure 284: SEL 0 current, 1 default, 2 saved (= default: nothing is
     * saveable), 3 supported capabilities (changeable only). */
    if (sel == 3) {
        *result = 1u << 2;
        return VN_NVME_SUCCESS;
    }
    if (sel > 3) {
        return VN_NVME_SC_INVALID_FIELD;
    }
    if (sel != 0) {
        f = &def;
    }
    switch (fid) {
    case VN_NVME_FEAT_ARBITRATION:
        *result = f->arbitration;
        break;
    case VN_NVME_FEAT_POWER_MGMT:
        *result = f->power_mgmt;
        break;
    case VN_NVME_FEAT_TEMP_THRESH: {
        uint32_t tsel = (cmd->cdw11 >> 16) & 0xf, thsel = (cmd->cdw11 >> 20) & 0x3;

        if (tsel != 0 || thsel > 1) {
            return VN_NVME_SC_INVALID_FIELD;
        }
        *result = thsel == 0 ? f->temp_over : f->temp_under;
        break;
    }
    case VN_NVME_FEAT_ERROR_RECOVERY:
        *result = f->error_recovery;
        break;
    case VN_NVME_FEAT_VOLATILE_WC:
        *result = f->wce ? 1 : 0;
        break;
    case VN_NVME_FEAT_NUM_QUEUES: {
        uint32_t g = sel == 0 ? n->ioq_granted : n->params.io_queues;

        *result = (g - 1) | (g - 1) << 16;
        break;
    }
    case VN_NVME_FEAT_IRQ_COALESCE:
        *result = f->irq_coalesce;
        break;
    case VN_NVME_FEAT_IRQ_CONFIG: {
        uint32_t iv = cmd->cdw11 & 0xffff;

        if (iv >= n->params.vectors) {
            return VN_NVME_SC_INVALID_FIELD;
        }
        *result = iv | (uint32_t)((f->irq_cd[iv / 64] >> (iv % 64)) & 1) << 16;
        break;
    }
    case VN_NVME_FEAT_WRITE_ATOMIC:
        *result = f->write_atomic;
        break;
    case VN_NVME_FEAT_ASYNC_EVENT:
        *result = f->async_event;
        break;
    case VN_NVME_FEAT_TIMESTAMP:
        return get_timestamp(n, cmd);
    default:
        return VN_NVME_SC_INVALID_FIELD; /* reserved FIDs in the ranges */
    }
    return VN_NVME_SUCCESS;
}

/* --- Queues (5.3-5.6) ----------------------------------------------------- */

/* Checks shared by Create I/O CQ/SQ: id, size, contiguity, base. */
static uint16_t queue_args_check(VnNvme *n, const VnNvmeSqe *cmd, bool exists)
{
    uint32_t qid = cmd->cdw10 & 0xffff;
    uint32_t qsize = (cmd->cdw10 >> 16) + 1;

    if (qid == 0 || qid > n->ioq_granted || qid >= VN_NVME_MAX_QUEUES || exists) {
        return VN_NVME_SC_INVALID_QID;
    }
    if (qsize < 2 || qsize > VN_NVME_MQES + 1) {
        return VN_NVME_SC_INVALID_QSIZE;
    }
    if (!(cmd->cdw11 & 1)) {
        return VN_NVME_SC_INVALID_FIELD; /* CAP.CQR: PC must be 1 */
    }
    if (cmd->prp1 == 0) {
        return VN_NVME_SC_INVALID_FIELD;
    }
    if (cmd->prp1 & (VN_NVME_PAGE_SIZE - 1)) {
        return VN_NVME_SC_INVALID_PRP_OFFSET;
    }
    return VN_NVME_SUCCESS;
}

static uint16_t cmd_create_cq(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint32_t qid = cmd->cdw10 & 0xffff;
    uint32_t iv = cmd->cdw11 >> 16;
    uint16_t st;

    st = queue_args_check(n, cmd, qid < VN_NVME_MAX_QUEUES && n->cq[qid].valid);
    if (st != VN_NVME_SUCCESS) {
        return st;
    }
    if (iv >= n->params.vectors) {
        return VN_NVME_SC_INVALID_VECTOR;
    }
    if (VN_NVME_CC_IOCQES(n->cc) != VN_NVME_CQE_SHIFT) {
        return VN_NVME_SC_INVALID_FIELD; /* CC.IOCQES must be 16 bytes */
    }
    n->cq[qid] = (VnNvmeCq){ .valid = true,
                             .ien = (cmd->cdw11 >> 1) & 1,
                             .phase = true,
                             .vector = (uint16_t)iv,
                             .size = (cmd->cdw10 >> 16) + 1,
                             .base = cmd->prp1 };
    /* The host starts at head 0; drop whatever an earlier queue left. */
    vn_nvme_reg_store(n, vn_nvme_db_cq((uint16_t)qid), 0);
    trace_nvme_cq_created(n->serial, qid, n->cq[qid].size, iv);
    return VN_NVME_SUCCESS;
}

static uint16_t cmd_create_sq(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint32_t qid = cmd->cdw10 & 0xffff;
    uint32_t cqid = cmd->cdw11 >> 16;
    uint16_t st;

    st = queue_args_check(n, cmd, qid < VN_NVME_MAX_QUEUES && n->sq[qid].valid);
    if (st != VN_NVME_SUCCESS) {
        return st;
    }
    if (cqid == 0 || cqid >= VN_NVME_MAX_QUEUES || !n->cq[cqid].valid) {
        return VN_NVME_SC_CQ_INVALID;
    }
    if (VN_NVME_CC_IOSQES(n->cc) != VN_NVME_SQE_SHIFT) {
        return VN_NVME_SC_INVALID_FIELD; /* CC.IOSQES must be 64 bytes */
    }
    n->sq[qid] = (VnNvmeSq){
        .valid = true, .cqid = (uint16_t)cqid, .size = (cmd->cdw10 >> 16) + 1, .base = cmd->prp1
    };
    n->cq[cqid].nsq++;
    vn_nvme_reg_store(n, vn_nvme_db_sq((uint16_t)qid), 0);
    trace_nvme_sq_created(n->serial, qid, n->sq[qid].size, cqid);
    return VN_NVME_SUCCESS;
}

static uint16_t cmd_delete_sq(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint32_t qid = cmd->cdw10 & 0xffff;

    if (qid == 0 || qid >= VN_NVME_MAX_QUEUES || !n->sq[qid].valid) {
        return VN_NVME_SC_INVALID_QID;
    }
    /* Commands complete synchronously, so none is left to abort (5.6). */
    n->cq[n->sq[qid].cqid].nsq--;
    memset(&n->sq[qid], 0, sizeof(n->sq[qid]));
    vn_nvme_reg_store(n, vn_nvme_db_sq((uint16_t)qid), 0);
    return VN_NVME_SUCCESS;
}

static uint16_t cmd_delete_cq(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint32_t qid = cmd->cdw10 & 0xffff;

    if (qid == 0 || qid >= VN_NVME_MAX_QUEUES || !n->cq[qid].valid) {
        return VN_NVME_SC_INVALID_QID;
    }
    if (n->cq[qid].nsq != 0) {
        return VN_NVME_SC_INVALID_QDELETE; /* 5.5: delete its SQs first */
    }
    memset(&n->cq[qid], 0, sizeof(n->cq[qid]));
    vn_nvme_reg_store(n, vn_nvme_db_cq((uint16_t)qid), 0);
    return VN_NVME_SUCCESS;
}

/* --- Log pages (5.14) ----------------------------------------------------- */

/* 5.14.1.2 (Figure 194): SMART / Health Information. */
static void log_smart(VnNvme *n, uint8_t *b)
{
    uint64_t hours = (vn_util_now_ns() - n->power_on_ns) / 3600000000000ull;

    put16(b, 1, VN_NVME_TEMPERATURE); /* Composite Temperature */
    b[3] = 100;                       /* Available Spare */
    b[4] = 10;                        /* Available Spare Threshold */
    /* Data Units: thousands of 512-byte units, rounded up. */
    put64(b, 32, (n->stats.blocks_read + 999) / 1000);
    put64(b, 48, (n->stats.blocks_written + 999) / 1000);
    put64(b, 64, n->stats.read_cmds);
    put64(b, 80, n->stats.write_cmds);
    put64(b, 112, 1);     /* Power Cycles */
    put64(b, 128, hours); /* Power On Hours */
}

static uint16_t cmd_get_log_page(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint8_t log[512] = { 0 };
    uint8_t lid = cmd->cdw10 & 0xff;
    uint64_t numd = ((uint64_t)(cmd->cdw11 & 0xffff) << 16 | cmd->cdw10 >> 16) + 1;
    uint64_t len = numd * 4;
    uint64_t off = cmd->cdw12 | (uint64_t)cmd->cdw13 << 32;
    uint32_t size;

    switch (lid) {
    case 0x01: /* Error Information: ELPE + 1 entries of 64 bytes */
        size = 64;
        break;
    case 0x02:
        if (cmd->nsid != 0 && cmd->nsid != 1 && cmd->nsid != NSID_ALL) {
            return VN_NVME_SC_INVALID_NS;
        }
        log_smart(n, log);
        size = 512;
        break;
    case 0x03:      /* Firmware Slot Information (Figure 197) */
        log[0] = 1; /* AFI: slot 1 active */
        put_ascii(log, 8, 8, FIRMWARE);
        size = 512;
        break;
    default:
        return VN_NVME_SC_INVALID_LOG_PAGE;
    }
    /* Figure 191: the offset is dword aligned and inside the log. */
    if (len > VN_NVME_MAX_XFER || (off & 3) || off >= size) {
        return VN_NVME_SC_INVALID_FIELD;
    }
    memset(n->bounce, 0, len);
    memcpy(n->bounce, log + off, MIN(len, size - off));
    return vn_nvme_prp_to_guest(n, cmd->prp1, cmd->prp2, n->bounce, (uint32_t)len);
}

/* --- AER, dispatch -------------------------------------------------------- */

/* 5.2: held until an event happens.  We never raise one (no OAES events,
 * no SMART warnings), so they wait until the controller is reset. */
static uint16_t cmd_async_event(VnNvme *n, const VnNvmeSqe *cmd)
{
    if (n->aer_count > VN_NVME_AERL) {
        return VN_NVME_SC_AER_LIMIT;
    }
    n->aer_cid[n->aer_count++] = cmd->cid;
    return VN_NVME_DEFERRED;
}

void vn_nvme_admin_reset(VnNvme *n)
{
    n->aer_count = 0;
    features_default(n, &n->feat);
}

uint16_t vn_nvme_admin_exec(VnNvme *n, const VnNvmeSqe *cmd, uint32_t *result)
{
    n->stats.admin_cmds++;
    trace_nvme_admin_cmd(n->serial, cmd->cid, cmd->opcode, cmd->cdw10);
    /* 4.2: no fused operations (FUSES = 0), and admin commands use PRPs. */
    if (cmd->flags & 0xc3) {
        return VN_NVME_SC_INVALID_FIELD;
    }
    switch (cmd->opcode) {
    case VN_NVME_ADM_IDENTIFY:
        return cmd_identify(n, cmd);
    case VN_NVME_ADM_SET_FEATURES:
        return cmd_set_features(n, cmd, result);
    case VN_NVME_ADM_GET_FEATURES:
        return cmd_get_features(n, cmd, result);
    case VN_NVME_ADM_CREATE_CQ:
        return cmd_create_cq(n, cmd);
    case VN_NVME_ADM_CREATE_SQ:
        return cmd_create_sq(n, cmd);
    case VN_NVME_ADM_DELETE_SQ:
        return cmd_delete_sq(n, cmd);
    case VN_NVME_ADM_DELETE_CQ:
        return cmd_delete_cq(n, cmd);
    case VN_NVME_ADM_GET_LOG_PAGE:
        return cmd_get_log_page(n, cmd);
    case VN_NVME_ADM_ASYNC_EVENT:
        return cmd_async_event(n, cmd);
    case VN_NVME_ADM_ABORT:
        /* 5.1: commands complete before we look at the next, so there is
         * never one to abort; DW0 bit 0 = 1 says "not aborted". */
        *result = 1;
        return VN_NVME_SUCCESS;
    case VN_NVME_ADM_KEEP_ALIVE:
        return VN_NVME_SUCCESS; /* KAS = 0: nothing to time */
    default:
        return VN_NVME_SC_INVALID_OPCODE;
    }
}
