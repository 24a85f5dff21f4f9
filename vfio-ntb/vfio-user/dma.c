/*
 * A client's DMA mappings (see dma.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "dma.h"

#include "common/peerfd.h"
#include "common/util.h"
#include "wire.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct Entry {
    VnDmaMapping m;
    void *map_base; /* what mmap returned (page aligned) */
    size_t map_len;
    dev_t dev; /* m.fd's file, to tell two fds of one memfd (vn_dma_file_extents()) */
    ino_t ino;
} Entry;

struct VnDma {
    GRWLock lock;
    GArray *entries; /* Entry, sorted by iova, never overlapping */
};

VnDma *vn_dma_new(void)
{
    VnDma *dma = g_new0(VnDma, 1);

    g_rw_lock_init(&dma->lock);
    dma->entries = g_array_new(FALSE, TRUE, sizeof(Entry));
    return dma;
}

static void entry_release(Entry *e)
{
    if (e->map_base != NULL) {
        munmap(e->map_base, e->map_len);
        e->map_base = NULL;
    }
    vn_util_close_fd(&e->m.fd);
}

void vn_dma_free(VnDma *dma)
{
    if (dma == NULL) {
        return;
    }
    vn_dma_unmap(dma, 0, 0, true);
    g_array_free(dma->entries, TRUE);
    g_rw_lock_clear(&dma->lock);
    g_free(dma);
}

/* Index of the first entry whose end is above @iova (caller holds the lock). */
static guint lower_bound(VnDma *dma, uint64_t iova)
{
    guint lo = 0, hi = dma->entries->len;

    while (lo < hi) {
        guint mid = lo + (hi - lo) / 2;
        Entry *e = &g_array_index(dma->entries, Entry, mid);

        if (e->m.iova + e->m.size <= iova) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* The granule @fd maps in: the page size, or its huge page's for a hugetlbfs file (guest
 * RAM in huge pages), which mmap takes only at offsets and lengths of whole huge pages. */
static uint64_t map_granule(const struct stat *st)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), blk = (uint64_t)st->st_blksize;

    return blk > pg && blk <= (UINT64_C(1) << 30) && (blk & (blk - 1)) == 0 ? blk : pg;
}

static int entry_mmap(Entry *e, const struct stat *st)
{
    uint64_t granule = map_granule(st);
    uint64_t aligned = e->m.offset & ~(granule - 1);
    uint64_t delta = e->m.offset - aligned;
    int prot = PROT_READ;

    if (e->m.prot & VFIO_DMA_MAP_FLAG_WRITE) {
        prot |= PROT_WRITE;
    }
    /* Whole granules (the file, sealed, holds them: its size is a multiple of its huge
     * page's). */
    e->map_len = (e->m.size + delta + granule - 1) & ~(granule - 1);
    e->map_base = mmap(NULL, e->map_len, prot, MAP_SHARED, e->m.fd, (off_t)aligned);
    if (e->map_base == MAP_FAILED) {
        int err = errno;

        e->map_base = NULL;
        return -err;
    }
    e->m.host = (uint8_t *)e->map_base + delta;
    return 0;
}

int vn_dma_map(VnDma *dma, uint64_t iova, uint64_t size, uint64_t offset, uint32_t prot, int fd)
{
    Entry e = { .m = { .iova = iova, .size = size, .offset = offset, .prot = prot, .fd = fd } };
    struct stat st;
    guint pos;
    int ret;

    if (size == 0 || iova + size < iova || offset + size < offset ||
        size > (uint64_t)SIZE_MAX / 2) {
        vn_util_close_fd(&e.m.fd);
        return -EINVAL;
    }
    if (fd >= 0) {
        /* Sealed memfds only, covering the range: see dma.h. */
        ret = vn_peerfd_memory(fd, offset, size, NULL);
        if (ret < 0) {
            vn_util_close_fd(&e.m.fd);
            return ret;
        }
        if (fstat(fd, &st) < 0) {
            ret = -errno;
            vn_util_close_fd(&e.m.fd);
            return ret;
        }
        ret = entry_mmap(&e, &st);
        if (ret < 0) {
            vn_util_close_fd(&e.m.fd);
            return ret;
        }
        e.dev = st.st_dev;
        e.ino = st.st_ino;
    }

    g_rw_lock_writer_lock(&dma->lock);
    pos = lower_bound(dma, iova);
    if (dma->entries->len >= VN_MAX_DMA_MAPS) {
        ret = -ENOSPC;
    } else if (pos < dma->entries->len &&
               g_array_index(dma->entries, Entry, pos).m.iova < iova + size) {
        ret = -EEXIST;
    } else {
        g_array_insert_val(dma->entries, pos, e);
        ret = 0;
    }
    g_rw_lock_writer_unlock(&dma->lock);

    if (ret < 0) {
        entry_release(&e);
    }
    return ret;
}

int64_t vn_dma_unmap(VnDma *dma, uint64_t iova, uint64_t size, bool all)
{
    g_autoptr(GArray) gone = g_array_new(FALSE, FALSE, sizeof(Entry));
    uint64_t range_last = iova + (size - 1); /* it may end at 2^64; no mapping does */
    int64_t bytes = 0;
    guint first, last;

    g_rw_lock_writer_lock(&dma->lock);
    if (all) {
        first = 0;
        last = dma->entries->len;
    } else {
        first = lower_bound(dma, iova);
        last = first;
        /* vfio type1: an unmap may not cut a mapping in two */
        while (last < dma->entries->len &&
               g_array_index(dma->entries, Entry, last).m.iova <= range_last) {
            Entry *e = &g_array_index(dma->entries, Entry, last);

            if (e->m.iova < iova || e->m.iova + (e->m.size - 1) > range_last) {
                g_rw_lock_writer_unlock(&dma->lock);
                return -EINVAL;
            }
            last++;
        }
    }
    for (guint i = first; i < last; i++) {
        Entry *e = &g_array_index(dma->entries, Entry, i);

        bytes += (int64_t)e->m.size;
        g_array_append_val(gone, *e);
    }
    if (last > first) {
        g_array_remove_range(dma->entries, first, last - first);
    }
    g_rw_lock_writer_unlock(&dma->lock);

    /* munmap outside the lock: the entries are unreachable already. */
    for (guint i = 0; i < gone->len; i++) {
        entry_release(&g_array_index(gone, Entry, i));
    }
    return bytes;
}

/*
 * Hand @fn each host piece of [@iova, @iova + @len) in order, every byte of
 * it mapped with @need; the read lock is held.  -EFAULT when a byte is not,
 * or @fn's error.
 */
static int walk(VnDma *dma, uint64_t iova, uint64_t len, uint32_t need,
                int (*fn)(uint8_t *host, uint64_t n, void *opaque), void *opaque)
{
    guint i;

    if (iova + len < iova) {
        return -EFAULT;
    }
    i = lower_bound(dma, iova);
    while (len > 0) {
        Entry *e;
        uint64_t off, n;
        int ret;

        if (i >= dma->entries->len) {
            return -EFAULT;
        }
        e = &g_array_index(dma->entries, Entry, i);
        if (e->m.iova > iova || e->m.host == NULL || !(e->m.prot & need)) {
            return -EFAULT;
        }
        off = iova - e->m.iova;
        n = MIN(len, e->m.size - off);
        ret = fn(e->m.host + off, n, opaque);
        if (ret < 0) {
            return ret;
        }
        iova += n;
        len -= n;
        i++;
    }
    return 0;
}

typedef struct Copy {
    uint8_t *p;
    bool write;
} Copy;

static int copy_piece(uint8_t *host, uint64_t n, void *opaque)
{
    Copy *c = opaque;

    if (c->write) {
        memcpy(host, c->p, n);
    } else {
        memcpy(c->p, host, n);
    }
    c->p += n;
    return 0;
}

/* Copy @len bytes at @iova to or from @buf; the read lock is held. */
static int dma_access(VnDma *dma, uint64_t iova, void *buf, size_t len, bool write)
{
    Copy c = { .p = buf, .write = write };

    return walk(dma, iova, len, write ? VFIO_DMA_MAP_FLAG_WRITE : VFIO_DMA_MAP_FLAG_READ,
                copy_piece, &c);
}

int vn_dma_read(VnDma *dma, uint64_t iova, void *buf, size_t len)
{
    int ret;

    g_rw_lock_reader_lock(&dma->lock);
    ret = dma_access(dma, iova, buf, len, false);
    g_rw_lock_reader_unlock(&dma->lock);
    return ret;
}

int vn_dma_write(VnDma *dma, uint64_t iova, const void *buf, size_t len)
{
    int ret;

    g_rw_lock_reader_lock(&dma->lock);
    ret = dma_access(dma, iova, (void *)buf, len, true);
    g_rw_lock_reader_unlock(&dma->lock);
    return ret;
}

typedef struct Iov {
    struct iovec *iov;
    unsigned max;
    unsigned *count;
} Iov;

/* One piece onto the iovec, merged with the last one where they touch. */
static int iov_piece(uint8_t *host, uint64_t n, void *opaque)
{
    Iov *v = opaque;
    struct iovec *last = *v->count > 0 ? &v->iov[*v->count - 1] : NULL;

    if (last != NULL && (uint8_t *)last->iov_base + last->iov_len == host) {
        last->iov_len += n;
    } else if (*v->count >= v->max) {
        return -E2BIG;
    } else {
        v->iov[(*v->count)++] = (struct iovec){ .iov_base = host, .iov_len = n };
    }
    return 0;
}

/* Append the host pieces of [iova, iova + len) to @iov; the read lock is held. */
static int range_iov(VnDma *dma, uint64_t iova, uint64_t len, uint32_t need, struct iovec *iov,
                     unsigned max_iov, unsigned *count)
{
    Iov v = { .iov = iov, .max = max_iov, .count = count };

    return walk(dma, iova, len, need, iov_piece, &v);
}

int vn_dma_iov_call(VnDma *dma, const VnDmaRange *ranges, unsigned n, bool to_guest,
                    struct iovec *iov, unsigned max_iov, VnDmaIovFn fn, void *opaque)
{
    uint32_t need = to_guest ? VFIO_DMA_MAP_FLAG_WRITE : VFIO_DMA_MAP_FLAG_READ;
    unsigned count = 0;
    int ret = 0;

    g_rw_lock_reader_lock(&dma->lock);
    for (unsigned r = 0; r < n && ret == 0; r++) {
        ret = range_iov(dma, ranges[r].iova, ranges[r].len, need, iov, max_iov, &count);
    }
    if (ret == 0) {
        ret = fn(iov, (int)count, opaque);
    }
    g_rw_lock_reader_unlock(&dma->lock);
    return ret;
}

unsigned vn_dma_count(VnDma *dma)
{
    unsigned n;

    g_rw_lock_reader_lock(&dma->lock);
    n = dma->entries->len;
    g_rw_lock_reader_unlock(&dma->lock);
    return n;
}

void vn_dma_foreach(VnDma *dma, void (*fn)(const VnDmaMapping *m, void *opaque), void *opaque)
{
    g_rw_lock_reader_lock(&dma->lock);
    for (guint i = 0; i < dma->entries->len; i++) {
        fn(&g_array_index(dma->entries, Entry, i).m, opaque);
    }
    g_rw_lock_reader_unlock(&dma->lock);
}

bool vn_dma_lookup(VnDma *dma, uint64_t iova, VnDmaMapping *out)
{
    bool found = false;
    guint i;

    g_rw_lock_reader_lock(&dma->lock);
    i = lower_bound(dma, iova);
    if (i < dma->entries->len && g_array_index(dma->entries, Entry, i).m.iova == iova) {
        *out = g_array_index(dma->entries, Entry, i).m;
        found = true;
    }
    g_rw_lock_reader_unlock(&dma->lock);
    return found;
}

/* Same file: the client sends a new fd with each DMA_MAP, often of the one memfd. */
static bool same_file(const Entry *a, const Entry *b)
{
    return a->m.fd == b->m.fd || (a->ino != 0 && a->dev == b->dev && a->ino == b->ino);
}

int vn_dma_file_extents(VnDma *dma, uint64_t iova, uint64_t len, uint32_t need, GArray *out,
                        unsigned max)
{
    const Entry *first = NULL;
    uint64_t at = iova, left = len;
    int ret = -EFAULT;
    guint i;

    g_array_set_size(out, 0);
    if (len == 0 || iova + len < iova) {
        return -EINVAL;
    }
    g_rw_lock_reader_lock(&dma->lock);
    for (i = lower_bound(dma, iova); left > 0 && i < dma->entries->len; i++) {
        const Entry *e = &g_array_index(dma->entries, Entry, i);
        uint64_t n = MIN(left, e->m.size - (at - e->m.iova));
        uint64_t off = e->m.offset + (at - e->m.iova);
        VnDmaExtent *last = out->len > 0 ? &g_array_index(out, VnDmaExtent, out->len - 1) : NULL;

        if (e->m.iova > at || e->m.fd < 0 || (e->m.prot & need) != need ||
            (first != NULL && !same_file(first, e))) {
            break;
        }
        first = first != NULL ? first : e;
        if (last != NULL && last->offset + last->len == off) {
            last->len += n; /* the file goes on where the last piece ended */
        } else if (out->len == max) {
            ret = -E2BIG;
            break;
        } else {
            VnDmaExtent x = { .at = at - iova, .offset = off, .len = n };

            g_array_append_val(out, x);
        }
        at += n;
        left -= n;
    }
    if (left == 0 && first != NULL) {
        ret = dup(first->m.fd);
        ret = ret >= 0 ? ret : -errno;
    }
    g_rw_lock_reader_unlock(&dma->lock);
    if (ret < 0) {
        g_array_set_size(out, 0);
    }
    return ret;
}
