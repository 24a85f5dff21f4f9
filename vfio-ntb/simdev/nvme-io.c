/*
 * The namespace of the simulated NVMe controller and its I/O commands:
 * PRP walking (NVMe 1.4 4.3), Read, Write, Flush and Write Zeroes (NVM
 * Command Set, NVMe 1.4 section 6) on a raw backing file.
 *
 * Read and Write move data with one preadv()/pwritev() straight between the
 * backing file and guest memory: the PRPs are resolved into segments, the
 * segments into host iovecs over the client's DMA mappings
 * (vn_dma_iov_call(), which holds the table's read lock meanwhile), so the
 * stand-in for hardware costs one system call per command, not a copy per
 * page.  Only a buffer that needs more than VN_NVME_MAX_IOV pieces goes
 * through the MDTS-sized bounce buffer.  Any segment outside the client's
 * mappings ends the command with Data Transfer Error.  A data pointer into
 * the controller's own CMB is served from its memory (nvme-cmb.c): zero-copy
 * when the whole buffer is there, through the bounce buffer when it is
 * mixed with host memory, Data Transfer Error when a piece runs over the
 * CMB's edge.
 *
 * Runs in the engine thread with the controller lock held (nvme.c), except
 * vn_nvme_ns_open/close which run at creation and destruction.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "nvme-int.h"

#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define NSID_ALL 0xffffffffu
/* CDW12 of Read/Write (Figure 364): FUA */
#define RW_FUA (1u << 30)
/* PRP list entries per memory page */
#define PRPS_PER_PAGE (VN_NVME_PAGE_SIZE / 8)

/* --- Namespace -------------------------------------------------------------- */

bool vn_nvme_ns_open(VnNvme *n, const char *path, uint64_t size, GError **error)
{
    struct stat st;
    int fd;

    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = errno;

        g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(err), "namespace %s: %s", path,
                    g_strerror(err));
        return false;
    }
    /* Two devices writing one file would corrupt it without either noticing. */
    if (flock(fd, LOCK_EX | LOCK_NB) < 0 || fstat(fd, &st) < 0) {
        int err = errno;

        g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(err), "namespace %s: %s", path,
                    err == EWOULDBLOCK ? "in use by another process" : g_strerror(err));
        close(fd);
        return false;
    }
    if (S_ISBLK(st.st_mode)) {
        uint64_t bytes = 0;

        if (ioctl(fd, BLKGETSIZE64, &bytes) < 0 || bytes < size) {
            g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                        "namespace %s: block device smaller than %" G_GUINT64_FORMAT " bytes", path,
                        size);
            close(fd);
            return false;
        }
    } else if (!S_ISREG(st.st_mode)) {
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                    "namespace %s: not a regular file or block device", path);
        close(fd);
        return false;
    } else if ((uint64_t)st.st_size < size && ftruncate(fd, (off_t)size) < 0) {
        /* Extending keeps the existing data; a larger file is not cut. */
        int err = errno;

        g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(err),
                    "namespace %s: extending to %" G_GUINT64_FORMAT " bytes: %s", path, size,
                    g_strerror(err));
        close(fd);
        return false;
    }
    n->fd = fd;
    n->nblocks = size / VN_NVME_LBA_SIZE;
    g_info("namespace %s: %" G_GUINT64_FORMAT " blocks of %u bytes", path, n->nblocks,
           VN_NVME_LBA_SIZE);
    return true;
}

void vn_nvme_ns_close(VnNvme *n)
{
    if (n->fd >= 0 && fdatasync(n->fd) < 0) {
        int err = errno;

        g_warning("device nvme %s: namespace fdatasync: %s", n->serial, g_strerror(err));
    }
    vn_util_close_fd(&n->fd);
}

static int pread_full(int fd, uint8_t *buf, size_t len, uint64_t off)
{
    while (len > 0) {
        ssize_t r = pread(fd, buf, len, (off_t)off);

        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return -errno;
        }
        if (r == 0) {
            memset(buf, 0, len); /* past the end of a shrunk file */
            return 0;
        }
        buf += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

static int pwrite_full(int fd, const uint8_t *buf, size_t len, uint64_t off)
{
    while (len > 0) {
        ssize_t r = pwrite(fd, buf, len, (off_t)off);

        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return r < 0 ? -errno : -EIO;
        }
        buf += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

/* --- PRPs (4.3) ----------------------------------------------------------- */

static uint16_t seg_add(VnNvme *n, unsigned *count, uint64_t iova, uint32_t len)
{
    VnNvmeSeg *last = *count > 0 ? &n->segs[*count - 1] : NULL;

    /* Physically adjacent pages become one copy. */
    if (last != NULL && last->iova + last->len == iova) {
        last->len += len;
        return VN_NVME_SUCCESS;
    }
    if (*count >= VN_NVME_MAX_SEGS) {
        return VN_NVME_SC_INVALID_FIELD;
    }
    n->segs[(*count)++] = (VnNvmeSeg){ .iova = iova, .len = len };
    return VN_NVME_SUCCESS;
}

/*
 * Resolve PRP1/PRP2 for @len bytes into n->segs.  PRP1 may start anywhere
 * dword aligned in a page; PRP2 is the second page when the transfer ends
 * in it, else a PRP list pointer (qword aligned).  Every list entry points
 * at a whole page (offset 0), and the last entry of a list page points to
 * the next list page when more entries are needed (Figure 108-110).
 */
static uint16_t prp_map(VnNvme *n, uint64_t prp1, uint64_t prp2, uint32_t len, unsigned *count)
{
    const uint64_t pmask = VN_NVME_PAGE_SIZE - 1;
    uint64_t ents[PRPS_PER_PAGE];
    uint64_t list;
    uint32_t rem, first;
    uint16_t st;

    *count = 0;
    if (len == 0) {
        return VN_NVME_SUCCESS;
    }
    if (len > VN_NVME_MAX_XFER) {
        return VN_NVME_SC_INVALID_FIELD;
    }
    if (prp1 & 3) {
        return VN_NVME_SC_INVALID_PRP_OFFSET;
    }
    first = (uint32_t)MIN((uint64_t)len, VN_NVME_PAGE_SIZE - (prp1 & pmask));
    st = seg_add(n, count, prp1, first);
    rem = len - first;
    if (st != VN_NVME_SUCCESS || rem == 0) {
        return st;
    }
    if (rem <= VN_NVME_PAGE_SIZE) {
        if (prp2 & pmask) {
            return VN_NVME_SC_INVALID_PRP_OFFSET;
        }
        return seg_add(n, count, prp2, rem);
    }
    list = prp2;
    /* Each list page yields at least one data entry unless it holds only
     * a chain pointer; bound the walk so a list chaining to itself ends. */
    for (unsigned pages = 0; rem > 0; pages++) {
        uint32_t avail, need, take, data;

        if ((list & 7) || pages > VN_NVME_MAX_SEGS) {
            return (list & 7) ? VN_NVME_SC_INVALID_PRP_OFFSET : VN_NVME_SC_INVALID_FIELD;
        }
        avail = (uint32_t)((VN_NVME_PAGE_SIZE - (list & pmask)) / 8);
        need = (rem + VN_NVME_PAGE_SIZE - 1) / VN_NVME_PAGE_SIZE;
        take = MIN(avail, need);
        data = need > avail ? take - 1 : take; /* last slot chains on */
        if (vn_nvme_cmb_read(n, list, ents, (size_t)take * 8) < 0) {
            return VN_NVME_SC_DATA_XFER_ERROR;
        }
        for (uint32_t i = 0; i < data; i++) {
            uint32_t l = MIN(rem, VN_NVME_PAGE_SIZE);

            if (ents[i] & pmask) {
                return VN_NVME_SC_INVALID_PRP_OFFSET;
            }
            st = seg_add(n, count, ents[i], l);
            if (st != VN_NVME_SUCCESS) {
                return st;
            }
            rem -= l;
        }
        if (need > avail) {
            list = ents[take - 1];
        }
    }
    return VN_NVME_SUCCESS;
}

uint16_t vn_nvme_prp_to_guest(VnNvme *n, uint64_t prp1, uint64_t prp2, const void *buf,
                              uint32_t len)
{
    const uint8_t *p = buf;
    unsigned count;
    uint16_t st = prp_map(n, prp1, prp2, len, &count);

    for (unsigned i = 0; st == VN_NVME_SUCCESS && i < count; i++) {
        if (vn_nvme_cmb_write(n, n->segs[i].iova, p, n->segs[i].len) < 0) {
            st = VN_NVME_SC_DATA_XFER_ERROR;
        }
        p += n->segs[i].len;
    }
    return st;
}

uint16_t vn_nvme_prp_from_guest(VnNvme *n, uint64_t prp1, uint64_t prp2, void *buf, uint32_t len)
{
    uint8_t *p = buf;
    unsigned count;
    uint16_t st = prp_map(n, prp1, prp2, len, &count);

    for (unsigned i = 0; st == VN_NVME_SUCCESS && i < count; i++) {
        if (vn_nvme_cmb_read(n, n->segs[i].iova, p, n->segs[i].len) < 0) {
            st = VN_NVME_SC_DATA_XFER_ERROR;
        }
        p += n->segs[i].len;
    }
    return st;
}

/* --- I/O commands (NVMe 1.4 6) --------------------------------------------- */

/* SLBA in CDW10/11, NLB (0's based) in CDW12 15:0; the range must lie in
 * the namespace (6.1: LBA Out of Range otherwise). */
static uint16_t lba_range(VnNvme *n, const VnNvmeSqe *cmd, uint64_t *off, uint64_t *len)
{
    uint64_t slba = cmd->cdw10 | (uint64_t)cmd->cdw11 << 32;
    uint64_t nlb = (uint64_t)(cmd->cdw12 & 0xffff) + 1;

    if (cmd->nsid != 1) {
        return VN_NVME_SC_INVALID_NS;
    }
    if (slba >= n->nblocks || nlb > n->nblocks - slba) {
        return VN_NVME_SC_LBA_RANGE;
    }
    *off = slba * VN_NVME_LBA_SIZE;
    *len = nlb * VN_NVME_LBA_SIZE;
    return VN_NVME_SUCCESS;
}

static uint16_t sync_data(VnNvme *n)
{
    if (fdatasync(n->fd) < 0) {
        int err = errno;

        g_warning("device nvme %s: fdatasync: %s", n->serial, g_strerror(err));
        return VN_NVME_SC_WRITE_FAULT;
    }
    return VN_NVME_SUCCESS;
}

/* A zero-copy transfer (vn_dma_iov_call's callback): the file range and
 * the direction. */
typedef struct FileXfer {
    VnNvme *n;
    uint64_t off;
    bool to_file;
} FileXfer;

/* preadv/pwritev the whole of @iov at x->off; reads past the end of a
 * shrunk file give zeros, as pread_full does.  0 or -errno. */
static int file_iov(const struct iovec *iov_in, int cnt, void *opaque)
{
    FileXfer *x = opaque;
    /* Our own scratch array (n->iov), shortened in place as it is done. */
    struct iovec *iov = (struct iovec *)iov_in;
    uint64_t off = x->off;
    int i = 0;

    while (i < cnt) {
        ssize_t r = x->to_file ? pwritev(x->n->fd, iov + i, cnt - i, (off_t)off)
                               : preadv(x->n->fd, iov + i, cnt - i, (off_t)off);

        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return -errno;
        }
        if (r == 0) {
            if (x->to_file) {
                return -EIO;
            }
            for (; i < cnt; i++) {
                memset(iov[i].iov_base, 0, iov[i].iov_len);
            }
            return 0;
        }
        off += (uint64_t)r;
        /* Skip what was done; a partly done iovec is shortened. */
        while (r > 0 && i < cnt) {
            if ((size_t)r >= iov[i].iov_len) {
                r -= (ssize_t)iov[i].iov_len;
                i++;
            } else {
                iov[i].iov_base = (uint8_t *)iov[i].iov_base + r;
                iov[i].iov_len -= (size_t)r;
                r = 0;
            }
        }
    }
    return 0;
}

/* The old way, for buffers of more than VN_NVME_MAX_IOV pieces, and for
 * those partly in our CMB and partly in host memory (each piece is copied
 * from or to where it lies). */
static int rw_bounce(VnNvme *n, const VnNvmeSqe *cmd, uint64_t off, uint64_t len, bool write,
                     uint16_t *st)
{
    int ret;

    if (write) {
        *st = vn_nvme_prp_from_guest(n, cmd->prp1, cmd->prp2, n->bounce, (uint32_t)len);
        return *st != VN_NVME_SUCCESS ? 0 : pwrite_full(n->fd, n->bounce, len, off);
    }
    ret = pread_full(n->fd, n->bounce, len, off);
    *st = ret < 0 ? VN_NVME_SUCCESS
                  : vn_nvme_prp_to_guest(n, cmd->prp1, cmd->prp2, n->bounce, (uint32_t)len);
    return ret;
}

static uint16_t cmd_rw(VnNvme *n, const VnNvmeSqe *cmd, bool write)
{
    FileXfer x = { .n = n, .to_file = write };
    uint64_t off, len;
    unsigned count;
    uint16_t st = lba_range(n, cmd, &off, &len);
    int ret;

    if (st != VN_NVME_SUCCESS) {
        return st;
    }
    if (len > VN_NVME_MAX_XFER) {
        return VN_NVME_SC_INVALID_FIELD; /* above MDTS (Identify 7.10) */
    }
    if (write) {
        n->stats.write_cmds++;
    } else {
        n->stats.read_cmds++;
    }
    st = prp_map(n, cmd->prp1, cmd->prp2, (uint32_t)len, &count);
    if (st != VN_NVME_SUCCESS) {
        return st;
    }
    x.off = off;
    /* A buffer in our own CMB is our memory: straight to it.  A Read
     * writes guest memory, a Write reads it. */
    ret = vn_nvme_cmb_iov(n, n->segs, count, n->iov, VN_NVME_MAX_IOV);
    if (ret > 0) {
        ret = file_iov(n->iov, ret, &x);
    } else if (ret == 0) {
        ret =
            vn_dma_iov_call(n->dma, n->segs, count, !write, n->iov, VN_NVME_MAX_IOV, file_iov, &x);
    }
    if (ret == -E2BIG) {
        ret = rw_bounce(n, cmd, off, len, write, &st);
        if (st != VN_NVME_SUCCESS) {
            return st;
        }
    } else if (ret == -EFAULT) {
        return VN_NVME_SC_DATA_XFER_ERROR;
    }
    if (ret < 0) {
        g_warning("device nvme %s: %s at %" G_GUINT64_FORMAT ": %s", n->serial,
                  write ? "write" : "read", off, g_strerror(-ret));
        return write ? VN_NVME_SC_WRITE_FAULT : VN_NVME_SC_READ_ERROR;
    }
    if (!write) {
        n->stats.blocks_read += len / VN_NVME_LBA_SIZE;
        return VN_NVME_SUCCESS;
    }
    n->stats.blocks_written += len / VN_NVME_LBA_SIZE;
    /* FUA, or no volatile cache to hide behind: data must be durable. */
    if ((cmd->cdw12 & RW_FUA) || !n->feat.wce) {
        return sync_data(n);
    }
    return VN_NVME_SUCCESS;
}

/* 6.16: Write Zeroes.  No data moves, so MDTS does not apply (WZSL = 0).
 * Punching a hole zeroes the range and frees the space (DLFEAT says
 * deallocated blocks read as zeros); writes of zeros are the fallback. */
static uint16_t cmd_write_zeroes(VnNvme *n, const VnNvmeSqe *cmd)
{
    uint64_t off, len;
    uint16_t st = lba_range(n, cmd, &off, &len);

    if (st != VN_NVME_SUCCESS) {
        return st;
    }
    if (fallocate(n->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0) {
        memset(n->bounce, 0, MIN(len, (uint64_t)VN_NVME_ZERO_CHUNK));
        for (uint64_t done = 0; done < len;) {
            uint64_t chunk = MIN(len - done, (uint64_t)VN_NVME_ZERO_CHUNK);
            int ret = pwrite_full(n->fd, n->bounce, chunk, off + done);

            if (ret < 0) {
                g_warning("device nvme %s: write zeroes at %" G_GUINT64_FORMAT ": %s", n->serial,
                          off + done, g_strerror(-ret));
                return VN_NVME_SC_WRITE_FAULT;
            }
            done += chunk;
        }
    }
    n->stats.blocks_written += len / VN_NVME_LBA_SIZE;
    return n->feat.wce ? VN_NVME_SUCCESS : sync_data(n);
}

uint16_t vn_nvme_io_exec(VnNvme *n, const VnNvmeSqe *cmd, uint32_t *result)
{
    n->stats.io_cmds++;
    /* No fused operations; PSDT != 0 asks for SGLs, which SGLS = 0 says
     * we lack (4.2: Invalid Field in Command). */
    if (cmd->flags & 0xc3) {
        return VN_NVME_SC_INVALID_FIELD;
    }
    switch (cmd->opcode) {
    case VN_NVME_CMD_READ:
        return cmd_rw(n, cmd, false);
    case VN_NVME_CMD_WRITE:
        return cmd_rw(n, cmd, true);
    case VN_NVME_CMD_FLUSH:
        /* 6.8: NSID FFFFFFFFh flushes every namespace (VWC bits 2:1). */
        if (cmd->nsid != 1 && cmd->nsid != NSID_ALL) {
            return VN_NVME_SC_INVALID_NS;
        }
        return sync_data(n);
    case VN_NVME_CMD_WRITE_ZEROES:
        return cmd_write_zeroes(n, cmd);
    default:
        return VN_NVME_SC_INVALID_OPCODE;
    }
}
