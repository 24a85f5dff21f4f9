/*
 * A fabric request/reply round trip, for the bench "ntb-message-rtt"
 * (bench/ntb_bench.py runs it in the two-VM NTB testbed, tests/e2e/ntb_inner.py):
 *
 *   fabric_rtt serve BACKEND NODE [KEY=VALUE...]
 *       attach NODE and answer every request with its own bytes, until
 *       SIGTERM or SIGINT;
 *   fabric_rtt ask BACKEND NODE PEER SAMPLES [KEY=VALUE...]
 *       attach NODE, wait (60 s at most) for the link to PEER, then time
 *       SAMPLES synchronous requests of 64 bytes after 20 unmeasured ones;
 *       prints {"p50_us":..,"p99_us":..,"samples":..} on one line.
 *
 * KEY=VALUE are the backend's parameters ("ports=/dev/vfio-ntb/...=PEER" for
 * ntb, "dir=..." for shm).  Exit 0, or 1 after saying what failed.
 */
#include "bench-stats.h"
#include "common/util.h"
#include "fabric/fabric.h"

#include <errno.h>
#include <glib-unix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WARMUP 20
#define PAYLOAD 64
#define LINK_WAIT_S 60

static VnFabric *fab;

static void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    vn_fabric_reply(fab, token, NULL, msg->data, msg->data_len);
}

static const VnFabricHandlers handlers = { .on_request = on_request };

static gboolean quit(gpointer loop)
{
    g_main_loop_quit(loop);
    return G_SOURCE_REMOVE;
}

static VnFabric *attach(const char *backend, const char *node, char **kv, int n)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    VnFabric *f;

    for (int i = 0; i < n; i++) {
        char *eq = strchr(kv[i], '=');

        if (eq == NULL) {
            fprintf(stderr, "fabric_rtt: %s: not KEY=VALUE\n", kv[i]);
            return NULL;
        }
        *eq = '\0';
        g_hash_table_insert(params, kv[i], eq + 1);
    }
    f = vn_fabric_open(backend, node, params, &handlers, NULL, NULL, &error);
    if (f == NULL) {
        fprintf(stderr, "fabric_rtt: %s\n", error->message);
    }
    return f;
}

static int serve(void)
{
    g_autoptr(GMainLoop) loop = g_main_loop_new(NULL, FALSE);

    g_unix_signal_add(SIGTERM, quit, loop);
    g_unix_signal_add(SIGINT, quit, loop);
    g_main_loop_run(loop);
    return 0;
}

static int ask(const char *peer, int samples)
{
    g_autofree uint64_t *ns = g_new0(uint64_t, samples);
    uint8_t payload[PAYLOAD];
    gint64 deadline = g_get_monotonic_time() + LINK_WAIT_S * G_USEC_PER_SEC;

    memset(payload, 0x5a, sizeof(payload));
    while (!vn_fabric_link_up(fab, peer)) {
        vn_fabric_connect(fab, peer, NULL);
        if (g_get_monotonic_time() > deadline) {
            fprintf(stderr, "fabric_rtt: no link to %s in %d s\n", peer, LINK_WAIT_S);
            return 1;
        }
        g_main_context_iteration(NULL, FALSE);
        g_usleep(10000);
    }
    for (int i = -WARMUP; i < samples; i++) {
        g_autoptr(VnFabricMsg) reply = NULL;
        uint64_t t0 = vn_util_now_ns();
        int ret = vn_fabric_request_sync(fab, peer, 1, NULL, payload, sizeof(payload), &reply);

        if (ret < 0 || reply->data_len != sizeof(payload) ||
            memcmp(reply->data, payload, sizeof(payload)) != 0) {
            fprintf(stderr, "fabric_rtt: request %d to %s: %s\n", i, peer,
                    ret < 0 ? g_strerror(-ret) : "the reply did not echo it");
            return 1;
        }
        if (i >= 0) {
            ns[i] = vn_util_now_ns() - t0;
        }
        /* What the loop owes (queued link changes) between requests. */
        while (g_main_context_iteration(NULL, FALSE)) {
        }
    }
    printf("{\"p50_us\": %.1f, \"p99_us\": %.1f, \"samples\": %d}\n",
           vn_bench_pct(ns, (size_t)samples, 50) / 1000.0,
           vn_bench_pct(ns, (size_t)samples, 99) / 1000.0, samples);
    return 0;
}

int main(int argc, char **argv)
{
    int ret, samples;

    if (argc >= 4 && strcmp(argv[1], "serve") == 0) {
        fab = attach(argv[2], argv[3], argv + 4, argc - 4);
        ret = fab != NULL ? serve() : 1;
    } else if (argc >= 6 && strcmp(argv[1], "ask") == 0) {
        samples = atoi(argv[5]);
        if (samples < 10 || samples > VN_BENCH_MAX_SAMPLES) {
            fprintf(stderr, "fabric_rtt: SAMPLES 10..%d\n", VN_BENCH_MAX_SAMPLES);
            return 1;
        }
        fab = attach(argv[2], argv[3], argv + 6, argc - 6);
        ret = fab != NULL ? ask(argv[4], samples) : 1;
    } else {
        fprintf(stderr, "usage: fabric_rtt serve BACKEND NODE [KEY=VALUE...]\n"
                        "       fabric_rtt ask BACKEND NODE PEER SAMPLES [KEY=VALUE...]\n");
        return 1;
    }
    if (fab != NULL) {
        vn_fabric_close(fab);
    }
    return ret;
}
