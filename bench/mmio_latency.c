/*
 * MMIO access latency through a vfio-user device's mapped BAR0, as QEMU
 * would map it: connect, GET_REGION_INFO(0), mmap the region fd, then time
 * 32-bit loads of one register.  Run against the device server itself and
 * against a borrower serving the same device, the two numbers show whether
 * the borrower put anything in the MMIO path.
 *
 *   mmio_latency SOCKET [LOADS]   -> one JSON object: {"socket":..,"p50_ns":..}
 */
#include "common/util.h"
#include "vfio-user/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnClient) c = NULL;
    struct vfio_region_info ri;
    const int batch = 1000;
    int n, fd = -1;
    volatile uint32_t *reg;
    uint64_t *lat;
    void *map;

    if (argc < 2) {
        fprintf(stderr, "usage: mmio_latency SOCKET [SAMPLES]\n");
        return 2;
    }
    n = argc > 2 ? atoi(argv[2]) : 2000;
    if (n < 10 || n > 1000000) {
        fprintf(stderr, "mmio_latency: SAMPLES must be 10..1000000\n");
        return 2;
    }
    c = vn_client_connect(argv[1], 5000, &error);
    if (c == NULL) {
        fprintf(stderr, "mmio_latency: %s\n", error->message);
        return 1;
    }
    if (vn_client_get_region_info(c, VFIO_PCI_BAR0_REGION_INDEX, &ri, &fd, NULL, 0, NULL) < 0 ||
        fd < 0 || ri.size < 4096) {
        fprintf(stderr, "mmio_latency: BAR0 is not mappable\n");
        return 1;
    }
    map = mmap(NULL, ri.size, PROT_READ, MAP_SHARED, fd, (off_t)ri.offset);
    if (map == MAP_FAILED) {
        perror("mmio_latency: mmap");
        return 1;
    }
    reg = (volatile uint32_t *)map;
    lat = g_new(uint64_t, n);
    /* Each sample is the mean of a batch of loads of CAP (offset 0): one
     * load is below the clock's resolution. */
    for (int i = 0; i < n; i++) {
        uint64_t t0 = vn_util_now_ns();
        uint32_t sink = 0;

        for (int j = 0; j < batch; j++) {
            sink ^= reg[0];
        }
        lat[i] = (vn_util_now_ns() - t0) * 1000 / batch;   /* picoseconds */
        (void)sink;
    }
    qsort(lat, (size_t)n, sizeof(lat[0]), cmp_u64);
    printf("{\"socket\":\"%s\",\"samples\":%d,\"p50_ns\":%.3f,\"p99_ns\":%.3f}\n", argv[1], n,
           lat[n / 2] / 1000.0, lat[(size_t)n * 99 / 100] / 1000.0);
    munmap(map, ri.size);
    close(fd);
    g_free(lat);
    return 0;
}
