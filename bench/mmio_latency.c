/*
 * MMIO access latency through a device's mapped BAR0, as QEMU would map it:
 * open the device through a lender backend (lending/backend.h), turn on its
 * memory decoding through config space, GET_REGION_INFO(0), mmap the region
 * fd at its offset, then time 32-bit loads of one register.
 *
 *   mmio_latency [--backend vfio-user|vfio] WHERE [SAMPLES]
 *       -> one JSON object: {"where":..,"backend":..,"p50_ns":..,"p99_ns":..}
 *
 * vfio-user (the default): WHERE is a vfio-user socket: a device server's,
 * or a borrower's serving the same device.  vfio: WHERE is a PCI function
 * bound to vfio-pci (DDDD:BB:DD.F), mapped through VFIO itself.  The same
 * device measured both ways shows whether the borrower put anything in the
 * MMIO path.
 */
#include "common/util.h"
#include "lending/backend.h"

#include <linux/pci_regs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* Memory decoding on: VFIO faults loads of a BAR whose device decodes none. */
static int memory_on(const VnBackendOps *ops, void *dev)
{
    uint16_t cmd = 0;
    int ret = ops->region_read(dev, VFIO_PCI_CONFIG_REGION_INDEX, PCI_COMMAND, &cmd, 2);

    if (ret < 0) {
        return ret;
    }
    cmd |= PCI_COMMAND_MEMORY;
    ret = ops->region_write(dev, VFIO_PCI_CONFIG_REGION_INDEX, PCI_COMMAND, &cmd, 2);
    return ret < 0 ? ret : 0;
}

int main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;
    const char *backend = "vfio-user";
    const VnBackendOps *ops;
    struct vfio_region_info ri;
    const int batch = 1000;
    volatile uint32_t *reg;
    int n, a = 1, fd = -1;
    uint64_t *lat;
    void *dev, *map;

    if (argc > 2 && strcmp(argv[1], "--backend") == 0) {
        backend = argv[2];
        a = 3;
    }
    if (argc <= a) {
        fprintf(stderr, "usage: mmio_latency [--backend vfio-user|vfio] WHERE [SAMPLES]\n");
        return 2;
    }
    n = argc > a + 1 ? atoi(argv[a + 1]) : 2000;
    if (n < 10 || n > 1000000) {
        fprintf(stderr, "mmio_latency: SAMPLES must be 10..1000000\n");
        return 2;
    }
    ops = vn_backend_find(backend, &error);
    dev = ops != NULL ? ops->open(argv[a], 5000, NULL, NULL, &error) : NULL;
    if (dev == NULL) {
        fprintf(stderr, "mmio_latency: %s\n", error->message);
        return 1;
    }
    if (memory_on(ops, dev) < 0 ||
        ops->get_region_info(dev, VFIO_PCI_BAR0_REGION_INDEX, &ri, &fd, NULL, 0, NULL) < 0 ||
        fd < 0 || ri.size < 4096) {
        fprintf(stderr, "mmio_latency: BAR0 of %s is not mappable\n", argv[a]);
        ops->close(dev);
        return 1;
    }
    map = mmap(NULL, ri.size, PROT_READ, MAP_SHARED, fd, (off_t)ri.offset);
    if (map == MAP_FAILED) {
        perror("mmio_latency: mmap");
        ops->close(dev);
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
        lat[i] = (vn_util_now_ns() - t0) * 1000 / batch; /* picoseconds */
        (void)sink;
    }
    qsort(lat, (size_t)n, sizeof(lat[0]), cmp_u64);
    printf("{\"where\":\"%s\",\"backend\":\"%s\",\"samples\":%d,\"p50_ns\":%.3f,"
           "\"p99_ns\":%.3f}\n",
           argv[a], ops->name, n, lat[n / 2] / 1000.0, lat[(size_t)n * 99 / 100] / 1000.0);
    munmap(map, ri.size);
    close(fd);
    ops->close(dev);
    g_free(lat);
    return 0;
}
