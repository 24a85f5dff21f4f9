/*
 * A client's DMA mappings: the table of guest memory a device may reach.
 *
 * The vfio-user server fills it from DMA_MAP/DMA_UNMAP; a device model
 * reads and writes guest memory only through vn_dma_read()/vn_dma_write(),
 * which check that the whole range lies in mappings with the right
 * permission.  An address outside them is an error the device reports to its
 * driver (e.g. an NVMe data-transfer error), never a stray access.
 *
 * Guest memory fds (DMA_MAP) must be memfds sealed against shrinking whose
 * size covers [offset, offset + size) (vn_peerfd_memory()): the device's
 * engine thread touches the mapping at any time, and a file the client
 * shrank later would turn that into a SIGBUS of the whole device server.
 * A plain file (QEMU's memory-backend-file) is refused even when its size
 * covers the range, since its owner may truncate it at any time; vfio-user
 * QEMU needs memory-backend-memfd anyway, which seals by default.
 *
 * Threads: the table is shared between the thread that serves the socket
 * (map/unmap) and a device's engine thread (read/write).  A GRWLock guards
 * it; an access holds the read lock for the whole copy, so when
 * vn_dma_unmap() returns no access to the unmapped memory is still running.
 */
#ifndef VN_DMA_H
#define VN_DMA_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

typedef struct VnDma VnDma;

typedef struct VnDmaMapping {
    uint64_t iova;
    uint64_t size;
    uint64_t offset; /* into fd */
    uint32_t prot;   /* VFIO_DMA_MAP_FLAG_READ | _WRITE */
    int fd;          /* owned by the table; -1 when the client sent none */
    uint8_t *host;   /* mmap of [offset, offset + size) of fd, or NULL */
} VnDmaMapping;

VnDma *vn_dma_new(void);
void vn_dma_free(VnDma *dma);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnDma, vn_dma_free)

/*
 * Add a mapping.  Takes ownership of @fd (closed on failure too); with
 * fd < 0 the range is recorded but not accessible (QEMU maps BARs that way).
 * Returns 0, -EINVAL for an fd that is not a sealed memfd covering
 * [offset, offset + size), -EEXIST if it overlaps a mapping, -ENOSPC above
 * VN_MAX_DMA_MAPS, or -errno from mmap.
 */
int vn_dma_map(VnDma *dma, uint64_t iova, uint64_t size, uint64_t offset, uint32_t prot, int fd);

/*
 * Remove mappings.  With @all, every mapping; otherwise the mappings inside
 * [iova, iova + size), none of which may cross either end (-EINVAL: no
 * mapping is split).  Returns the number of bytes unmapped, 0 when nothing
 * was mapped there (as Linux's type1 IOMMU answers).
 */
int64_t vn_dma_unmap(VnDma *dma, uint64_t iova, uint64_t size, bool all);

/* Copy between guest memory at @iova and @buf.  0, or -EFAULT when any part
 * of the range is unmapped, inaccessible or lacks the permission. */
int vn_dma_read(VnDma *dma, uint64_t iova, void *buf, size_t len);
int vn_dma_write(VnDma *dma, uint64_t iova, const void *buf, size_t len);

/* One contiguous range of guest addresses. */
typedef struct VnDmaRange {
    uint64_t iova;
    uint64_t len;
} VnDmaRange;

typedef int (*VnDmaIovFn)(const struct iovec *iov, int iovcnt, void *opaque);

/*
 * Zero-copy access: resolve the @n guest ranges @ranges (in order) into host
 * iovecs over the mappings, at most @max_iov of them in @iov (pieces that
 * are adjacent in host memory are merged), and call @fn(iov, count,
 * @opaque) with the read lock held, so a device can preadv()/pwritev()
 * straight between a file and guest memory and an unmap waits for it.
 * @to_guest: the device writes guest memory (needs WRITE permission), else
 * it reads it (READ).  Returns fn's result; -EFAULT (fn not called) when
 * any part is unmapped, inaccessible or lacks the permission; -E2BIG when
 * more than @max_iov pieces would be needed (the caller may fall back to
 * vn_dma_read/write).  @fn must not call back into the table.
 */
int vn_dma_iov_call(VnDma *dma, const VnDmaRange *ranges, unsigned n, bool to_guest,
                    struct iovec *iov, unsigned max_iov, VnDmaIovFn fn, void *opaque);

/* Number of mappings (for tests and counters). */
unsigned vn_dma_count(VnDma *dma);

/*
 * Call @fn for every mapping under the read lock (fn must not call back into
 * the table).  Used to hand mappings on, e.g. to export them.
 */
void vn_dma_foreach(VnDma *dma, void (*fn)(const VnDmaMapping *m, void *opaque), void *opaque);

/*
 * Copy the mapping that starts at @iova into *out (fd and host pointer are
 * the table's, borrowed).  Returns false when no mapping starts there.
 */
bool vn_dma_lookup(VnDma *dma, uint64_t iova, VnDmaMapping *out);

/* A piece of a range of guest addresses in a file: [at, at + len) of the range is
 * [offset, offset + len) of the file. */
typedef struct VnDmaExtent {
    uint64_t at;
    uint64_t offset;
    uint64_t len;
} VnDmaExtent;

/*
 * Where [@iova, @iova + @len) lies in one file: every byte mapped with at least @need, all of
 * it in the same file (each DMA_MAP brings its own fd, often of the one memfd), as extents
 * (VnDmaExtent, in @out, in order, pieces that follow each other in the file merged; a guest
 * buffer behind an IOMMU is rarely contiguous in its RAM).  Returns a new fd of that file
 * (the caller closes it); -EFAULT when a byte is unmapped, has no fd or lacks @need, or the
 * range spans files; -E2BIG when it takes more than @max extents; -EINVAL for an empty or
 * wrapping range (@out empty then).  What a device needs to let another process map the
 * range itself (the simulated NTB's windows).
 */
int vn_dma_file_extents(VnDma *dma, uint64_t iova, uint64_t len, uint32_t need, GArray *out,
                        unsigned max);

#endif /* VN_DMA_H */
