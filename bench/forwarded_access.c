/*
 * Bench "forwarded-access": round-trip latency of a trapped access, the
 * 4-byte REGION_READ of config space offset 0 (vendor and device id), as
 * QEMU issues it for every guest config cycle.  Side A is a borrower's
 * socket: borrower worker -> fabric -> lender (vfio-ntbd) -> device server,
 * and back.  Side B is the device server's own socket (what QEMU would use
 * with the device local).  Both clients stay connected; ROUNDS rounds of
 * SAMPLES accesses each, ABBA (bench-stats.h).
 *
 * With --write, bench "forwarded-write": a 4-byte REGION_WRITE to BAR0 at
 * 0x28 (the NVMe admin queue's address, harmless while the controller is
 * disabled), which the device servers must offer unmapped (simdev
 * --trap-bars): the borrower posts it (borrower-int.h), so side A's round
 * trip ends at the borrower.  One write every WRITE_GAP_US, a driver's
 * doorbell pace: back to back, the path's throughput bounds any write's wait
 * (at most VN_BORROWER_MAX_POSTED are in flight), which burst_writes_per_s
 * (and direct_burst_writes_per_s) give, from SAMPLES writes back to back on
 * each side.  At the end each side's register is read back through its
 * socket: the last value written, or the bench fails (a posted write lost or
 * overtaken by the read).
 *
 *   forwarded_access [--write] BORROWER_SOCKET DIRECT_SOCKET [ROUNDS] [SAMPLES]
 *
 * Prints one JSON object: p50_ns/p99_ns (A over all rounds),
 * direct_p50_ns/direct_p99_ns (B), ratio = p50_ns / direct_p50_ns, and per
 * round each side's p50 and the round's ratio; spread = max/min of the
 * per-round ratios.  The caller (bench/run-bench) adds the bench name and
 * the fabric's crossing delay.
 */
#include "bench-stats.h"
#include "common/util.h"
#include "vfio-user/client.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define ASQ_LOW 0x28
#define WRITE_GAP_US 200

static bool write_mode;
static uint32_t written[2]; /* each side's last value written (write mode) */

static int run(VnClient *c, int side, uint64_t *lat, int n)
{
    uint32_t v;

    for (int i = 0; i < n; i++) {
        uint64_t t0 = vn_util_now_ns();

        if (write_mode) {
            v = (++written[side] & 0xfffff) << 12; /* page aligned, as ASQ is */
            if (vn_client_region_write(c, VFIO_PCI_BAR0_REGION_INDEX, ASQ_LOW, &v, sizeof(v),
                                       false) < 0) {
                return -1;
            }
            lat[i] = vn_util_now_ns() - t0;
            if (lat[i] < WRITE_GAP_US * 1000) {
                g_usleep(WRITE_GAP_US - lat[i] / 1000);
            }
            continue;
        } else if (vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, 0, &v, sizeof(v)) !=
                   sizeof(v)) {
            return -1;
        }
        lat[i] = vn_util_now_ns() - t0;
    }
    return 0;
}

/* Write mode: @n writes back to back through @c, per second; 0 when one failed. */
static double burst(VnClient *c, int side, int n)
{
    uint64_t t0 = vn_util_now_ns();

    for (int i = 0; i < n; i++) {
        uint32_t v = (++written[side] & 0xfffff) << 12;

        if (vn_client_region_write(c, VFIO_PCI_BAR0_REGION_INDEX, ASQ_LOW, &v, sizeof(v), false) <
            0) {
            return 0;
        }
    }
    return (double)n * 1e9 / (double)MAX(vn_util_now_ns() - t0, 1);
}

/* Write mode: what the register holds now, through @c. */
static bool last_write_seen(VnClient *c, int s, const char *side)
{
    uint32_t v = 0, want = (written[s] & 0xfffff) << 12;

    if (vn_client_region_read(c, VFIO_PCI_BAR0_REGION_INDEX, ASQ_LOW, &v, sizeof(v)) != sizeof(v)) {
        fprintf(stderr, "forwarded_access: reading back through %s failed\n", side);
        return false;
    }
    if (v != want) {
        fprintf(stderr, "forwarded_access: %s holds 0x%x, not the last write 0x%x\n", side, v,
                want);
        return false;
    }
    return true;
}

int main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;
    VnClient *c[2] = { NULL, NULL };
    int rounds, n;
    uint64_t *all[2] = { NULL, NULL };
    uint64_t p50[2][VN_BENCH_MAX_ROUNDS];
    double ratio_min = 0, ratio_max = 0;
    GString *out;

    if (argc > 1 && strcmp(argv[1], "--write") == 0) {
        write_mode = true;
        argv++;
        argc--;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: forwarded_access [--write] BORROWER_SOCKET DIRECT_SOCKET [ROUNDS] "
                        "[SAMPLES]\n");
        return 2;
    }
    if (!vn_bench_args(argc, argv, "forwarded_access", 4, 2000, &rounds, &n)) {
        return 2;
    }
    for (int s = 0; s < 2; s++) {
        c[s] = vn_client_connect(argv[1 + s], 5000, &error);
        if (c[s] == NULL) {
            fprintf(stderr, "forwarded_access: %s\n", error->message);
            return 1;
        }
        all[s] = g_new(uint64_t, (size_t)n * (size_t)rounds);
        /* warm-up: the lender connects lazily, caches are cold */
        if (run(c[s], s, all[s], MIN(n, 200)) < 0) {
            fprintf(stderr, "forwarded_access: the access failed on %s\n", argv[1 + s]);
            return 1;
        }
    }
    for (int r = 0; r < rounds; r++) {
        double ratio;

        for (int k = 0; k < 2; k++) {
            int s = vn_bench_a_first((unsigned)r) ? k : 1 - k;
            uint64_t *lat = all[s] + (size_t)r * (size_t)n;

            if (run(c[s], s, lat, n) < 0) {
                fprintf(stderr, "forwarded_access: the access failed on %s\n", argv[1 + s]);
                return 1;
            }
            p50[s][r] = vn_bench_pct_copy(lat, (size_t)n, 50);
        }
        ratio = (double)p50[0][r] / (double)MAX(p50[1][r], 1);
        ratio_min = r == 0 ? ratio : MIN(ratio_min, ratio);
        ratio_max = r == 0 ? ratio : MAX(ratio_max, ratio);
    }
    out = g_string_new(NULL);
    {
        size_t total = (size_t)n * (size_t)rounds;
        uint64_t a50 = vn_bench_pct(all[0], total, 50), a99 = vn_bench_pct(all[0], total, 99);
        uint64_t b50 = vn_bench_pct(all[1], total, 50), b99 = vn_bench_pct(all[1], total, 99);

        g_string_append_printf(out,
                               "{\"access\":\"%s\","
                               "\"samples_per_round\":%d,\"order\":\"ABBA\","
                               "\"p50_ns\":%" PRIu64 ",\"p99_ns\":%" PRIu64
                               ",\"direct_p50_ns\":%" PRIu64 ",\"direct_p99_ns\":%" PRIu64
                               ",\"ratio\":%.3f,\"rounds\":[",
                               write_mode ? "REGION_WRITE BAR0 0x28 4 B (posted by the borrower)"
                                          : "REGION_READ config 0x0 4 B",
                               n, a50, a99, b50, b99, (double)a50 / (double)MAX(b50, 1));
    }
    for (int r = 0; r < rounds; r++) {
        g_string_append_printf(out,
                               "%s{\"first\":\"%s\",\"p50_ns\":%" PRIu64
                               ",\"direct_p50_ns\":%" PRIu64 ",\"ratio\":%.3f}",
                               r ? "," : "", vn_bench_a_first((unsigned)r) ? "forwarded" : "direct",
                               p50[0][r], p50[1][r], (double)p50[0][r] / (double)MAX(p50[1][r], 1));
    }
    g_string_append_printf(out,
                           "],\"spread\":%.3f,\"spread_is\":\"max/min of per-round "
                           "ratios\"}\n",
                           ratio_max / (ratio_min > 0 ? ratio_min : 1));
    if (write_mode) {
        double rate[2];

        for (int s = 0; s < 2; s++) {
            rate[s] = burst(c[s], s, n);
            if (rate[s] == 0) {
                fprintf(stderr, "forwarded_access: a write failed on %s\n", argv[1 + s]);
                return 1;
            }
        }
        if (!last_write_seen(c[0], 0, argv[1]) || !last_write_seen(c[1], 1, argv[2])) {
            return 1;
        }
        /* the object's closing brace goes: two members more */
        g_string_truncate(out, out->len - 2);
        g_string_append_printf(out,
                               ",\"write_gap_us\":%d,\"burst_writes_per_s\":%.0f,"
                               "\"direct_burst_writes_per_s\":%.0f}\n",
                               WRITE_GAP_US, rate[0], rate[1]);
    }
    fputs(out->str, stdout);
    g_string_free(out, TRUE);
    for (int s = 0; s < 2; s++) {
        vn_client_free(c[s]);
        g_free(all[s]);
    }
    return 0;
}
