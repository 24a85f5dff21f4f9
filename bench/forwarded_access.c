/*
 * Bench "forwarded-access": round-trip latency of a trapped access, the
 * 4-byte REGION_READ of config space offset 0 (vendor and device id), as
 * QEMU issues it for every guest config cycle.  Side A is a borrower's
 * socket: borrower worker -> fabric -> lender (vfio-ntbd) -> device server,
 * and back.  Side B is the device server's own socket (what QEMU would use
 * with the device local).  Both clients stay connected; ROUNDS rounds of
 * SAMPLES accesses each, ABBA (bench-stats.h).
 *
 *   forwarded_access BORROWER_SOCKET DIRECT_SOCKET [ROUNDS] [SAMPLES]
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

static int run(VnClient *c, uint64_t *lat, int n)
{
    uint32_t v;

    for (int i = 0; i < n; i++) {
        uint64_t t0 = vn_util_now_ns();

        if (vn_client_region_read(c, VFIO_PCI_CONFIG_REGION_INDEX, 0, &v, sizeof(v)) != sizeof(v)) {
            return -1;
        }
        lat[i] = vn_util_now_ns() - t0;
    }
    return 0;
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

    if (argc < 3) {
        fprintf(stderr, "usage: forwarded_access BORROWER_SOCKET DIRECT_SOCKET [ROUNDS] "
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
        if (run(c[s], all[s], MIN(n, 200)) < 0) {
            fprintf(stderr, "forwarded_access: REGION_READ failed on %s\n", argv[1 + s]);
            return 1;
        }
    }
    for (int r = 0; r < rounds; r++) {
        double ratio;

        for (int k = 0; k < 2; k++) {
            int s = vn_bench_a_first((unsigned)r) ? k : 1 - k;
            uint64_t *lat = all[s] + (size_t)r * (size_t)n;

            if (run(c[s], lat, n) < 0) {
                fprintf(stderr, "forwarded_access: REGION_READ failed on %s\n", argv[1 + s]);
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
                               "{\"access\":\"REGION_READ config 0x0 4 B\","
                               "\"samples_per_round\":%d,\"order\":\"ABBA\","
                               "\"p50_ns\":%" PRIu64 ",\"p99_ns\":%" PRIu64
                               ",\"direct_p50_ns\":%" PRIu64 ",\"direct_p99_ns\":%" PRIu64
                               ",\"ratio\":%.3f,\"rounds\":[",
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
    fputs(out->str, stdout);
    g_string_free(out, TRUE);
    for (int s = 0; s < 2; s++) {
        vn_client_free(c[s]);
        g_free(all[s]);
    }
    return 0;
}
