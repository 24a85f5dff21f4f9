/*
 * Bench "irq-relay": how long an interrupt takes from the device to the
 * VM's eventfd, for two vfio-user sockets in one run (bench/run-bench gives
 * a borrower attached with relay interrupts and one with fd interrupts).
 *
 * The device is the simulated NVMe controller; this program plays QEMU and
 * the guest's driver at once: it DMA_MAPs a memfd as guest RAM, enables bus
 * mastering and MSI-X through config space, registers an eventfd for MSI-X
 * vector 0 with SET_IRQS (the VM's irqfd), sets up the admin queue through
 * the mapped BAR0 and then, SAMPLES times per round, submits a Keep Alive
 * admin command (no data) and waits for its interrupt.  Per command:
 *
 *   t_db   just before the SQ tail doorbell store (mapped BAR0)
 *   t_cqe  when the completion entry's phase tag flips in guest RAM (the
 *          client spins on it; the controller posts the entry, then
 *          signals the vector)
 *   t_irq  when read() of the eventfd returns (blocking after t_cqe)
 *
 *   signal_ns = t_irq - t_cqe: device signal to VM eventfd, the interval the
 *               interrupt route adds (fd mode: the device writes the VM's
 *               eventfd itself; relay: lender eventfd -> vfio-ntbd ->
 *               fabric doorbell -> borrower worker -> VM eventfd).  It
 *               starts a little after the device's signal (the spin's
 *               sampling), so it is the route's cost plus < 1 spin pass.
 *   rtt_ns    = t_irq - t_db: the whole admin command round trip, including
 *               the controller's polling.
 *
 *   irq_latency SOCKET_A SOCKET_B [ROUNDS] [SAMPLES]
 *
 * Rounds are ABBA (bench-stats.h).  Prints one JSON object with "a" and "b",
 * each with signal and rtt p50/p99 and the per-round signal p50s.
 */
#include "bench-stats.h"
#include "common/peerfd.h"
#include "common/util.h"
#include "vfio-user/client.h"

#include <errno.h>
#include <inttypes.h>
#include <linux/pci_regs.h>
#include <poll.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

/* Guest RAM: the admin SQ and CQ pages at a page-aligned IOVA. */
#define RAM_IOVA 0x40000000ull
#define RAM_SIZE (64u * 1024u)
#define QENTRIES 64u
/* NVMe 1.4 3.1: registers and doorbells (CAP.DSTRD = 0) */
enum {
    REG_CC = 0x14,
    REG_CSTS = 0x1c,
    REG_AQA = 0x24,
    REG_ASQ = 0x28,
    REG_ACQ = 0x30,
    DB_SQ0 = 0x1000,
    DB_CQ0 = 0x1004
};
#define CC_ENABLE (1u | (6u << 16) | (4u << 20)) /* EN, IOSQES 64 B, IOCQES 16 B */
#define ADM_KEEP_ALIVE 0x18

typedef struct Side {
    const char *socket;
    VnClient *c;
    int efd;
    uint8_t *ram;
    volatile uint32_t *bar0;
    size_t bar0_size;
    uint32_t tail, head;
    unsigned phase;
    uint64_t *signal, *rtt;
    uint64_t round_p50[VN_BENCH_MAX_ROUNDS];
} Side;

static int fail(const Side *s, const char *what, int err)
{
    fprintf(stderr, "irq_latency: %s: %s: %s\n", s->socket, what, g_strerror(err < 0 ? -err : err));
    return -1;
}

static int cfg_rw(Side *s, uint64_t off, void *buf, uint32_t n, bool write)
{
    int ret = write ? vn_client_region_write(s->c, VFIO_PCI_CONFIG_REGION_INDEX, off, buf, n, false)
                    : vn_client_region_read(s->c, VFIO_PCI_CONFIG_REGION_INDEX, off, buf, n);

    return ret < 0 ? ret : 0;
}

/* Bus master and MSI-X on, as the guest's driver (and QEMU) would. */
static int pci_setup(Side *s)
{
    uint8_t cfg[PCI_STD_HEADER_SIZEOF + 192];
    uint16_t v;
    unsigned pos;
    int ret;

    if ((ret = cfg_rw(s, 0, cfg, sizeof(cfg), false)) < 0) {
        return fail(s, "config read", ret);
    }
    v = (uint16_t)(cfg[PCI_COMMAND] | cfg[PCI_COMMAND + 1] << 8) | PCI_COMMAND_MEMORY |
        PCI_COMMAND_MASTER;
    if ((ret = cfg_rw(s, PCI_COMMAND, &v, 2, true)) < 0) {
        return fail(s, "command register", ret);
    }
    pos = cfg[PCI_CAPABILITY_LIST] & ~3u;
    for (int n = 0; n < 48 && pos >= 0x40 && pos + 4 <= sizeof(cfg); n++) {
        if (cfg[pos] == PCI_CAP_ID_MSIX) {
            v = (uint16_t)(cfg[pos + 2] | cfg[pos + 3] << 8) | PCI_MSIX_FLAGS_ENABLE;
            v &= (uint16_t)~PCI_MSIX_FLAGS_MASKALL;
            if ((ret = cfg_rw(s, pos + PCI_MSIX_FLAGS, &v, 2, true)) < 0) {
                return fail(s, "MSI-X control", ret);
            }
            return 0;
        }
        pos = cfg[pos + 1] & ~3u;
    }
    return fail(s, "no MSI-X capability", ENODEV);
}

static int side_open(Side *s, size_t samples)
{
    g_autoptr(GError) error = NULL;
    struct vfio_region_info ri;
    int memfd = -1, bfd = -1, ret;
    void *map;

    s->c = vn_client_connect(s->socket, 5000, &error);
    if (s->c == NULL) {
        fprintf(stderr, "irq_latency: %s\n", error->message);
        return -1;
    }
    /* Sealed as QEMU's memory-backend-memfd seals guest RAM: servers refuse
     * memory that could shrink under them (common/peerfd.h). */
    memfd = vn_peerfd_memfd_new("irq-bench-ram", RAM_SIZE);
    if (memfd < 0) {
        return fail(s, "memfd", -memfd);
    }
    s->ram = mmap(NULL, RAM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (s->ram == MAP_FAILED) {
        return fail(s, "mmap RAM", errno);
    }
    ret = vn_client_dma_map(s->c, RAM_IOVA, RAM_SIZE, 0,
                            VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE, memfd);
    close(memfd);
    if (ret < 0) {
        return fail(s, "DMA_MAP", ret);
    }
    if (pci_setup(s) < 0) {
        return -1;
    }
    s->efd = eventfd(0, EFD_CLOEXEC);
    if (s->efd < 0) {
        return fail(s, "eventfd", errno);
    }
    ret = vn_client_set_irqs(s->c, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                             VFIO_PCI_MSIX_IRQ_INDEX, 0, 1, NULL, &s->efd);
    if (ret < 0) {
        return fail(s, "SET_IRQS MSI-X 0", ret);
    }
    ret = vn_client_get_region_info(s->c, VFIO_PCI_BAR0_REGION_INDEX, &ri, &bfd, NULL, 0, NULL);
    if (ret < 0 || bfd < 0 || ri.size < 0x2000) {
        return fail(s, "BAR0 is not mappable", ret < 0 ? ret : ENODEV);
    }
    map = mmap(NULL, ri.size, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, (off_t)ri.offset);
    close(bfd);
    if (map == MAP_FAILED) {
        return fail(s, "mmap BAR0", errno);
    }
    s->bar0 = map;
    s->bar0_size = ri.size;
    /* Admin queue (NVMe 1.4 7.6.1): SQ at RAM_IOVA, CQ one page up. */
    s->bar0[REG_CC / 4] = 0;
    for (int i = 0; i < 2000 && (s->bar0[REG_CSTS / 4] & 1); i++) {
        g_usleep(1000);
    }
    s->bar0[REG_AQA / 4] = (QENTRIES - 1) << 16 | (QENTRIES - 1);
    s->bar0[REG_ASQ / 4] = (uint32_t)RAM_IOVA;
    s->bar0[REG_ASQ / 4 + 1] = (uint32_t)(RAM_IOVA >> 32);
    s->bar0[REG_ACQ / 4] = (uint32_t)(RAM_IOVA + 4096);
    s->bar0[REG_ACQ / 4 + 1] = (uint32_t)((RAM_IOVA + 4096) >> 32);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    s->bar0[REG_CC / 4] = CC_ENABLE;
    for (int i = 0; i < 5000 && !(s->bar0[REG_CSTS / 4] & 1); i++) {
        g_usleep(1000);
    }
    if ((s->bar0[REG_CSTS / 4] & 3) != 1) {
        return fail(s, "controller not ready (CSTS)", EIO);
    }
    s->phase = 1;
    s->signal = g_new(uint64_t, samples);
    s->rtt = g_new(uint64_t, samples);
    return 0;
}

/* One Keep Alive: submit, spin for the CQE, block for the interrupt. */
static int one(Side *s, uint16_t cid, uint64_t *signal, uint64_t *rtt)
{
    uint8_t *sqe = s->ram + (size_t)s->tail * 64;
    volatile uint16_t *status = (volatile uint16_t *)(s->ram + 4096 + (size_t)s->head * 16 + 14);
    struct pollfd pfd = { .fd = s->efd, .events = POLLIN };
    uint64_t t_db, t_cqe, t_irq, n;

    memset(sqe, 0, 64);
    sqe[0] = ADM_KEEP_ALIVE;
    memcpy(sqe + 2, &cid, sizeof(cid));
    s->tail = (s->tail + 1) % QENTRIES;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    t_db = vn_util_now_ns();
    s->bar0[DB_SQ0 / 4] = s->tail;
    for (uint64_t spins = 0; (*status & 1) != s->phase; spins++) {
        if (spins % 64 == 63 && vn_util_now_ns() - t_db > 2000000000ull) {
            return fail(s, "no completion in 2 s", ETIMEDOUT);
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    t_cqe = vn_util_now_ns();
    if (poll(&pfd, 1, 2000) != 1 || read(s->efd, &n, sizeof(n)) != sizeof(n)) {
        return fail(s, "no interrupt in 2 s", ETIMEDOUT);
    }
    t_irq = vn_util_now_ns();
    if ((*status >> 1) != 0) {
        return fail(s, "Keep Alive failed", EIO);
    }
    s->head = (s->head + 1) % QENTRIES;
    if (s->head == 0) {
        s->phase ^= 1;
    }
    s->bar0[DB_CQ0 / 4] = s->head;
    *signal = t_irq - t_cqe;
    *rtt = t_irq - t_db;
    return 0;
}

static int run(Side *s, size_t first, int n)
{
    for (int i = 0; i < n; i++) {
        if (one(s, (uint16_t)(first + (size_t)i), &s->signal[first + (size_t)i],
                &s->rtt[first + (size_t)i]) < 0) {
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    Side side[2] = { { .socket = NULL, .efd = -1 }, { .socket = NULL, .efd = -1 } };
    int rounds, n;
    size_t total;
    uint64_t warm[64];

    if (argc < 3) {
        fprintf(stderr, "usage: irq_latency SOCKET_A SOCKET_B [ROUNDS] [SAMPLES]\n");
        return 2;
    }
    if (!vn_bench_args(argc, argv, "irq_latency", 4, 1000, &rounds, &n)) {
        return 2;
    }
    total = (size_t)n * (size_t)rounds;
    for (int s = 0; s < 2; s++) {
        side[s].socket = argv[1 + s];
        if (side_open(&side[s], total) < 0) {
            return 1;
        }
        for (unsigned i = 0; i < G_N_ELEMENTS(warm); i++) { /* warm-up */
            if (one(&side[s], (uint16_t)i, &warm[i], &warm[i]) < 0) {
                return 1;
            }
        }
    }
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            Side *s = &side[vn_bench_a_first((unsigned)r) ? k : 1 - k];
            size_t first = (size_t)r * (size_t)n;

            if (run(s, first, n) < 0) {
                return 1;
            }
            s->round_p50[r] = vn_bench_pct_copy(s->signal + first, (size_t)n, 50);
        }
    }
    printf("{\"samples_per_round\":%d,\"order\":\"ABBA\"", n);
    for (int s = 0; s < 2; s++) {
        printf(",\"%c\":{\"signal_p50_ns\":%" PRIu64 ",\"signal_p99_ns\":%" PRIu64
               ",\"rtt_p50_ns\":%" PRIu64 ",\"rtt_p99_ns\":%" PRIu64 ",\"round_signal_p50_ns\":[",
               'a' + s, vn_bench_pct(side[s].signal, total, 50),
               vn_bench_pct(side[s].signal, total, 99), vn_bench_pct(side[s].rtt, total, 50),
               vn_bench_pct(side[s].rtt, total, 99));
        for (int r = 0; r < rounds; r++) {
            printf("%s%" PRIu64, r ? "," : "", side[s].round_p50[r]);
        }
        printf("]}");
    }
    printf("}\n");
    for (int s = 0; s < 2; s++) {
        munmap((void *)side[s].bar0, side[s].bar0_size);
        munmap(side[s].ram, RAM_SIZE);
        close(side[s].efd);
        vn_client_free(side[s].c);
        g_free(side[s].signal);
        g_free(side[s].rtt);
    }
    return 0;
}
