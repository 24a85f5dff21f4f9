/*
 * vn-p2p: PCI peer-to-peer DMA between an NVMe namespace and another device's p2pmem.
 *
 * Runs in the test guest (static, the kernel's uAPI only).  Device 1 is a block device (an
 * NVMe namespace, e.g. /dev/nvme0n1); device 2 is the PCI function BDF whose memory (an NVMe
 * Controller Memory Buffer) Linux published as p2pmem (/sys/bus/pci/devices/BDF/p2pmem/).
 * A buffer mmapped from p2pmem/allocate is the target and source of O_DIRECT I/O on device 1,
 * so device 1 DMAs straight into and out of device 2's BAR.  Each round, with its own pattern:
 *
 *   1. write the pattern at offset X from an ordinary buffer;
 *   2. read X into the p2pmem buffer (poisoned first) and compare it, read by the CPU;
 *   3. fill the p2pmem buffer with another pattern (CPU), write it at offset Y, read Y back
 *      into an ordinary buffer (poisoned first) and compare.
 *
 * With -F only step 2's read is done, and it is expected to FAIL (a peer that Linux or the
 * fabric does not let device 1 reach): the errno is printed, exit 0 if it failed, 1 if not.
 *
 * With -L SECONDS (device 2 is taken away meanwhile): step 1 once, then step 2 again and
 * again, each checked, until a read fails; "vn-p2p: loop: looping" once the first passed
 * (the host then takes device 2 away).  The read that failed is printed; then X is read into
 * ordinary memory and checked (device 1 still works).  Exit 0 when a read failed and device 1
 * then read X right, 1 when every read succeeded for SECONDS, or a check failed.
 *
 * With -B MIB (a bench): ROUNDS rounds (made even), each reading MIB MiB from X on in SIZE
 * pieces into the p2pmem buffer and the same into ordinary memory, in ABBA order; one line per
 * round and a last "vn-p2p: bench: p2p_mb_s=.. ram_mb_s=.. ratio=.. bytes=.." (medians; ratio:
 * the median of the rounds' p2p/ram ratios; bytes: all moved).
 *
 * Usage: vn-p2p [-s SIZE] [-x X] [-y Y] [-n ROUNDS] [-F | -L SECONDS | -B MIB] DISK BDF
 *        (defaults: 131072 bytes, X 0, Y 1 MiB, 3 rounds; sizes and offsets in bytes,
 *        multiples of 4096)
 * Every step prints one line "vn-p2p: ...: ok" or "vn-p2p: ...: FAILED ...".
 * Exit: 0 every check passed (-F: the read failed as expected), 1 a check failed (-F: the read
 * succeeded), 2 usage or setup error (no p2pmem, cannot mmap, cannot open the disk).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT */
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096

static const char *disk, *bdf;
static size_t size = 131072;
static int quiet; /* transfers that succeed say nothing (-L's many rounds) */

static void usage(void)
{
    fprintf(stderr, "usage: vn-p2p [-s SIZE] [-x X] [-y Y] [-n ROUNDS] [-F | -L SECONDS] DISK "
                    "BDF\n");
    exit(2);
}

static uint64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Bytes from /sys/bus/pci/devices/BDF/p2pmem/NAME, first line, or "?". */
static const char *p2pmem_attr(const char *name, char *buf, size_t len)
{
    char path[256];
    FILE *f;

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/p2pmem/%s", bdf, name);
    f = fopen(path, "r");
    if (!f || !fgets(buf, (int)len, f))
        snprintf(buf, len, "?");
    if (f)
        fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return buf;
}

/* Byte i of pattern `seed` at device offset `off` (the words are little-endian). */
static uint8_t pattern_byte(uint64_t seed, uint64_t off, size_t i)
{
    uint64_t w = (seed << 48) ^ ((off + (i & ~(size_t)7)) * 0x9e3779b97f4a7c15ull);

    return (uint8_t)(w >> (8 * (i & 7)));
}

/* Pattern `seed` for the bytes at device offset `off`: every 8-byte word holds its own offset
 * and the seed, so data from another round or another place does not match.  Whole words:
 * p2pmem is a BAR, where 8-byte stores are what a device expects. */
static void fill(volatile uint64_t *p, uint64_t seed, uint64_t off)
{
    for (size_t i = 0; i < size / 8; i++)
        p[i] = (seed << 48) ^ ((off + i * 8) * 0x9e3779b97f4a7c15ull);
}

/* Compare `got` with pattern `seed` at `off`; print the first differing bytes. 0 if equal. */
static int compare(const char *what, const uint8_t *got, uint64_t seed, uint64_t off)
{
    size_t first = 0, n = 0;

    for (size_t i = 0; i < size; i++) {
        uint8_t want = pattern_byte(seed, off, i);

        if (got[i] == want)
            continue;
        if (!n)
            first = i;
        if (n < 4)
            printf("vn-p2p:   %s byte %zu: got 0x%02x, want 0x%02x\n", what, i, got[i], want);
        n++;
    }
    if (!n) {
        printf("vn-p2p: %s holds pattern %llu: ok\n", what, (unsigned long long)seed);
        return 0;
    }
    printf("vn-p2p: %s holds pattern %llu: FAILED: %zu of %zu bytes differ, first at +%zu\n", what,
           (unsigned long long)seed, n, size, first);
    return 1;
}

/* Whether `got` differs from pattern `seed` at `off` anywhere (nothing printed). */
static int pattern_differs(const uint8_t *got, uint64_t seed, uint64_t off)
{
    for (size_t i = 0; i < size; i++) {
        if (got[i] != pattern_byte(seed, off, i))
            return 1;
    }
    return 0;
}

/* One O_DIRECT transfer of `size` bytes between `mem` (described as `what`) and the disk at
 * `off`; prints its line.  0, or -errno. */
static int xfer(int fd, int write, void *mem, uint64_t off, const char *what)
{
    uint64_t t0 = now_us();
    ssize_t r = write ? pwrite(fd, mem, size, (off_t)off) : pread(fd, mem, size, (off_t)off);
    int err = r < 0 ? errno : 0;
    char line[200];

    snprintf(line, sizeof(line), "%s %zu bytes %s %s at %llu of %s", write ? "wrote" : "read", size,
             write ? "from" : "into", what, (unsigned long long)off, disk);
    if (r == (ssize_t)size) {
        if (!quiet)
            printf("vn-p2p: %s: ok (%llu us)\n", line, (unsigned long long)(now_us() - t0));
        return 0;
    }
    if (r >= 0) {
        printf("vn-p2p: %s: FAILED: short, %zd bytes\n", line, r);
        return -EIO;
    }
    printf("vn-p2p: %s: FAILED: %s (errno %d)\n", line, strerror(err), err);
    return -err;
}

static uint64_t number(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 0);

    if (*s == 0 || *end != 0)
        usage();
    return v;
}

/* -L: read X into p2pmem until a read fails (device 2 taken away), then X into memory. */
static int loop(int fd, uint8_t *p2p, uint8_t *buf, uint8_t *copy, uint64_t x, uint64_t secs,
                const char *where)
{
    uint64_t end = now_us() + secs * 1000000, n = 0;
    int r;

    fill((uint64_t *)buf, 7, x);
    if (xfer(fd, 1, buf, x, "memory") < 0)
        return 1;
    quiet = 1;
    for (;;) {
        memset(p2p, 0xa5, size);
        r = xfer(fd, 0, p2p, x, where);
        if (r < 0)
            break;
        memcpy(copy, p2p, size);
        if (pattern_differs(copy, 7, x)) {
            quiet = 0;
            compare(where, copy, 7, x);
            return 1;
        }
        if (++n == 1) {
            printf("vn-p2p: loop: looping\n");
            fflush(stdout);
        }
        if (now_us() > end) {
            printf("vn-p2p: loop: FAILED: %llu reads into %s succeeded for %llu s\n",
                   (unsigned long long)n, where, (unsigned long long)secs);
            return 1;
        }
    }
    printf("vn-p2p: loop: the read into %s failed after %llu rounds: %s (errno %d)\n", where,
           (unsigned long long)n, strerror(-r), -r);
    quiet = 0;
    memset(buf, 0x5a, size);
    if (n == 0 || xfer(fd, 0, buf, x, "memory") < 0)
        return 1;
    return compare(disk, buf, 7, x);
}

/* -B: MB/s of reading @mib MiB from @x on into @mem, in `size` pieces; 0 on a failed read. */
static double read_rate(int fd, uint8_t *mem, uint64_t x, uint64_t mib, const char *where)
{
    uint64_t total = mib << 20, t0 = now_us(), us;

    for (uint64_t done = 0; done < total; done += size) {
        if (xfer(fd, 0, mem, x + done, where) < 0)
            return 0;
    }
    us = now_us() - t0;
    return (double)total / (double)(us ? us : 1);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static double median(double *v, uint64_t n)
{
    qsort(v, n, sizeof(v[0]), by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* -B: reads into p2pmem against reads into memory, ABBA. */
static int bench(int fd, uint8_t *p2p, uint8_t *buf, uint64_t x, uint64_t mib, uint64_t rounds,
                 const char *where)
{
    double p[64], m[64], ratio[64];

    if (rounds > 64)
        rounds = 64;
    quiet = 1;
    for (uint64_t r = 0; r < rounds; r++) {
        if (r % 2 == 0) {
            p[r] = read_rate(fd, p2p, x, mib, where);
            m[r] = read_rate(fd, buf, x, mib, "memory");
        } else {
            m[r] = read_rate(fd, buf, x, mib, "memory");
            p[r] = read_rate(fd, p2p, x, mib, where);
        }
        if (p[r] == 0 || m[r] == 0) {
            printf("vn-p2p: bench: FAILED in round %llu\n", (unsigned long long)r + 1);
            return 1;
        }
        ratio[r] = p[r] / m[r];
        printf("vn-p2p: bench: round %llu %s p2p %.1f MB/s ram %.1f MB/s\n",
               (unsigned long long)r + 1, r % 2 ? "BA" : "AB", p[r], m[r]);
    }
    printf("vn-p2p: bench: p2p_mb_s=%.1f ram_mb_s=%.1f ratio=%.3f bytes=%llu\n", median(p, rounds),
           median(m, rounds), median(ratio, rounds),
           (unsigned long long)(2 * rounds * (mib << 20)));
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t x = 0, y = 1048576, rounds = 3, loop_s = 0, bench_mib = 0;
    int expect_fail = 0, failed = 0, fd, mfd, c;
    char path[256], pub[32], avail[32], p2p_where[64];
    uint8_t *p2p, *buf, *copy;

    while ((c = getopt(argc, argv, "s:x:y:n:FL:B:")) != -1) {
        switch (c) {
        case 's':
            size = number(optarg);
            break;
        case 'x':
            x = number(optarg);
            break;
        case 'y':
            y = number(optarg);
            break;
        case 'n':
            rounds = number(optarg);
            break;
        case 'F':
            expect_fail = 1;
            break;
        case 'L':
            loop_s = number(optarg);
            break;
        case 'B':
            bench_mib = number(optarg);
            break;
        default:
            usage();
        }
    }
    if (argc - optind != 2 || !size || size % ALIGN || x % ALIGN || y % ALIGN)
        usage();
    disk = argv[optind];
    bdf = argv[optind + 1];
    snprintf(p2p_where, sizeof(p2p_where), "p2pmem of %s", bdf);

    printf("vn-p2p: %s published=%s available=%s\n", p2p_where,
           p2pmem_attr("published", pub, sizeof(pub)),
           p2pmem_attr("available", avail, sizeof(avail)));
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/p2pmem/allocate", bdf);
    mfd = open(path, O_RDWR);
    if (mfd < 0) {
        printf("vn-p2p: open %s: FAILED: %s (errno %d)\n", path, strerror(errno), errno);
        return 2;
    }
    p2p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (p2p == MAP_FAILED) {
        printf("vn-p2p: mmap %zu bytes of %s: FAILED: %s (errno %d)\n", size, path, strerror(errno),
               errno);
        return 2;
    }
    fd = open(disk, O_RDWR | O_DIRECT);
    if (fd < 0) {
        printf("vn-p2p: open %s: FAILED: %s (errno %d)\n", disk, strerror(errno), errno);
        return 2;
    }
    if (posix_memalign((void **)&buf, ALIGN, size) || !(copy = malloc(size)))
        return 2;
    printf("vn-p2p: %s, %zu bytes of %s mapped, x=%llu y=%llu rounds=%llu%s\n", disk, size,
           p2p_where, (unsigned long long)x, (unsigned long long)y, (unsigned long long)rounds,
           expect_fail ? " (the read is expected to fail)" : "");

    if (expect_fail) {
        size_t changed = 0;
        int r;

        memset(p2p, 0xa5, size);
        r = xfer(fd, 0, p2p, x, p2p_where);
        if (r < 0) {
            printf("vn-p2p: read into %s failed as expected: %s (errno %d)\n", p2p_where,
                   strerror(-r), -r);
            return 0;
        }
        memcpy(copy, p2p, size);
        for (size_t i = 0; i < size; i++)
            changed += copy[i] != 0xa5;
        printf("vn-p2p: read into %s: FAILED: it succeeded, expected to fail (%zu of %zu bytes "
               "changed)\n",
               p2p_where, changed, size);
        return 1;
    }

    if (loop_s)
        return loop(fd, p2p, buf, copy, x, loop_s, p2p_where);
    if (bench_mib)
        return bench(fd, p2p, buf, x, bench_mib, rounds + (rounds & 1), p2p_where);

    for (uint64_t r = 1; r <= rounds && !failed; r++) {
        uint64_t seed_x = r * 2, seed_y = r * 2 + 1;

        printf("vn-p2p: round %llu\n", (unsigned long long)r);
        /* 1. the pattern at X, from ordinary memory */
        fill((uint64_t *)buf, seed_x, x);
        if (xfer(fd, 1, buf, x, "memory") < 0)
            failed = 1;
        /* 2. X into p2pmem (device 1 DMAs into device 2), checked by the CPU */
        memset(p2p, 0xa5, size);
        if (!failed && xfer(fd, 0, p2p, x, p2p_where) < 0)
            failed = 1;
        if (!failed) {
            memcpy(copy, p2p, size);
            failed = compare(p2p_where, copy, seed_x, x);
        }
        /* 3. p2pmem (filled by the CPU) to Y (device 1 DMAs out of device 2), read back */
        if (!failed) {
            fill((volatile uint64_t *)p2p, seed_y, y);
            failed = xfer(fd, 1, p2p, y, p2p_where) < 0;
        }
        memset(buf, 0x5a, size);
        if (!failed && xfer(fd, 0, buf, y, "memory") < 0)
            failed = 1;
        if (!failed)
            failed = compare(disk, buf, seed_y, y);
    }
    printf("vn-p2p: %s\n", failed ? "FAILED" : "all checks passed");
    return failed;
}
