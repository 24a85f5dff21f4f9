/*
 * Bench "attach-map": the time to map a 4 GiB guest's RAM for its device at
 * attach, as QEMU does when a vfio-user-pci device joins a q35 guest: one
 * DMA_MAP per memory section (RAM below the PCI hole, the legacy holes'
 * ROM and BIOS ranges, RAM above 4 GiB), each of which the borrower must
 * get its lender to map before the device may use it.
 *
 * Side A, batched: the sections' maps sent together, then their replies
 * taken (QEMU sends a memory transaction's maps without waiting and waits
 * for the last one at commit): the borrower sends them on to the lender
 * without waiting between them.  Side B, unbatched: one map, its reply,
 * the next.  Each sample maps every section of a fresh 4 GiB memfd (the
 * borrower exports it and the lender maps its window, as at a first
 * attach) and is unmapped, untimed, before the next.
 *
 *   attach_map BORROWER_SOCKET [ROUNDS] [SAMPLES]
 *
 * Prints one JSON object: batched_s/unbatched_s (p50 of a whole map phase
 * over all rounds), ratio = unbatched_s / batched_s (above 1: batching
 * wins), sections, per round each side's p50, spread (max/min of the
 * per-round ratios).  The caller (bench/run-bench) adds the bench name.
 */
#include "bench-stats.h"
#include "common/peerfd.h"
#include "common/util.h"
#include "vfio-user/client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define GIB (1024ull * 1024 * 1024)
#define RW (VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE)

/* A q35 guest with -m 4G, as QEMU lays it out: its RAM is one file (pc.ram),
 * 2 GiB below the PCI hole and 2 GiB above 4 GiB, around the VGA hole; the
 * option ROM area and the BIOS are another (read-only, as QEMU maps ROM). */
enum { RAM, ROM };
static const struct {
    int file;
    VnClientDmaMap map;
} sections[] = {
    { RAM, { .iova = 0, .size = 0xa0000, .offset = 0, .prot = RW } },
    { ROM, { .iova = 0xc0000, .size = 0x20000, .offset = 0, .prot = VFIO_DMA_MAP_FLAG_READ } },
    { ROM,
      { .iova = 0xe0000, .size = 0x20000, .offset = 0x20000, .prot = VFIO_DMA_MAP_FLAG_READ } },
    { RAM, { .iova = 0x100000, .size = 2 * GIB - 0x100000, .offset = 0x100000, .prot = RW } },
    { ROM,
      { .iova = 0xfffc0000, .size = 0x40000, .offset = 0x40000, .prot = VFIO_DMA_MAP_FLAG_READ } },
    { RAM, { .iova = 4 * GIB, .size = 2 * GIB, .offset = 2 * GIB, .prot = RW } },
};
#define NR_SECTIONS G_N_ELEMENTS(sections)
static const uint64_t file_size[] = { [RAM] = 4 * GIB, [ROM] = 0x80000 };

/* One map phase on fresh guest memory files: its ns, or 0 when a map failed. */
static uint64_t attach(VnClient *c, bool batched)
{
    VnClientDmaMap maps[NR_SECTIONS];
    int mem[2] = { -1, -1 };
    uint64_t t0, t = 0;
    int ret = 0;

    for (int f = RAM; f <= ROM; f++) {
        mem[f] = vn_peerfd_memfd_new(f == RAM ? "pc.ram" : "pc.rom", file_size[f]);
        if (mem[f] < 0) {
            fprintf(stderr, "attach_map: no memfd of %" PRIu64 " bytes\n", file_size[f]);
            goto out;
        }
    }
    for (size_t i = 0; i < NR_SECTIONS; i++) {
        maps[i] = sections[i].map;
        maps[i].fd = mem[sections[i].file];
    }
    t0 = vn_util_now_ns();
    if (batched) {
        ret = vn_client_dma_map_many(c, maps, NR_SECTIONS);
    } else {
        for (size_t i = 0; i < NR_SECTIONS && ret == 0; i++) {
            ret = vn_client_dma_map(c, maps[i].iova, maps[i].size, maps[i].offset, maps[i].prot,
                                    maps[i].fd);
        }
    }
    t = vn_util_now_ns() - t0;
    if (vn_client_dma_unmap(c, 0, 0, true) < 0 || ret < 0) {
        fprintf(stderr, "attach_map: %s\n", g_strerror(ret < 0 ? -ret : EIO));
        t = 0;
    }
out:
    vn_util_close_fds(mem, 2);
    return t;
}

int main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnClient) c = NULL;
    int rounds, n;
    uint64_t *all[2];
    uint64_t p50[2][VN_BENCH_MAX_ROUNDS];
    double ratio_min = 0, ratio_max = 0;
    uint64_t a50, b50;

    if (argc < 2) {
        fprintf(stderr, "usage: attach_map BORROWER_SOCKET [ROUNDS] [SAMPLES]\n");
        return 2;
    }
    /* vn_bench_args() reads ROUNDS and SAMPLES after two sockets: shift by one. */
    if (!vn_bench_args(argc + 1, argv - 1, "attach_map", 4, 10, &rounds, &n)) {
        return 2;
    }
    c = vn_client_connect(argv[1], 10000, &error);
    if (c == NULL) {
        fprintf(stderr, "attach_map: %s\n", error->message);
        return 1;
    }
    for (int s = 0; s < 2; s++) {
        all[s] = g_new(uint64_t, (size_t)n * (size_t)rounds);
        if (attach(c, s == 0) == 0) { /* warm-up: the lender's first window, its worker */
            return 1;
        }
    }
    for (int r = 0; r < rounds; r++) {
        double ratio;

        for (int k = 0; k < 2; k++) {
            int s = vn_bench_a_first((unsigned)r) ? k : 1 - k;
            uint64_t *t = all[s] + (size_t)r * (size_t)n;

            for (int i = 0; i < n; i++) {
                t[i] = attach(c, s == 0);
                if (t[i] == 0) {
                    return 1;
                }
            }
            p50[s][r] = vn_bench_pct_copy(t, (size_t)n, 50);
        }
        ratio = (double)p50[1][r] / (double)MAX(p50[0][r], 1);
        ratio_min = r == 0 ? ratio : MIN(ratio_min, ratio);
        ratio_max = r == 0 ? ratio : MAX(ratio_max, ratio);
    }
    a50 = vn_bench_pct(all[0], (size_t)n * (size_t)rounds, 50);
    b50 = vn_bench_pct(all[1], (size_t)n * (size_t)rounds, 50);
    printf("{\"guest_ram_gib\":4,\"sections\":%zu,\"samples_per_round\":%d,\"order\":\"ABBA\","
           "\"batched_s\":%.6f,\"unbatched_s\":%.6f,\"ratio\":%.3f,\"ratio_is\":\"unbatched_s / "
           "batched_s\",\"rounds\":[",
           NR_SECTIONS, n, (double)a50 / 1e9, (double)b50 / 1e9, (double)b50 / (double)MAX(a50, 1));
    for (int r = 0; r < rounds; r++) {
        printf("%s{\"first\":\"%s\",\"batched_s\":%.6f,\"unbatched_s\":%.6f}", r ? "," : "",
               vn_bench_a_first((unsigned)r) ? "batched" : "unbatched", (double)p50[0][r] / 1e9,
               (double)p50[1][r] / 1e9);
    }
    printf("],\"spread\":%.3f,\"spread_is\":\"max/min of per-round ratios\"}\n",
           ratio_max / (ratio_min > 0 ? ratio_min : 1));
    return 0;
}
