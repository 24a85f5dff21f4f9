/*
 * A fabric request/reply round trip, for the bench "ntb-message-rtt"
 * (bench/ntb_bench.py runs it in the two-VM NTB testbed, tests/e2e/ntb_inner.py):
 *
 *   fabric_rtt serve BACKEND NODE PEER [KEY=VALUE...]
 *       attach NODE, export a segment of SEGMENT bytes (a pattern) to PEER,
 *       and answer every request with its own bytes (type 1) or with whether
 *       the segment now holds the pattern inverted (type 2), until SIGTERM
 *       or SIGINT;
 *   fabric_rtt ask BACKEND NODE PEER SAMPLES [KEY=VALUE...]
 *       attach NODE, wait (60 s at most) for the link to PEER, then time
 *       SAMPLES requests of 64 bytes, one at a time, after 20 unmeasured ones;
 *       then map PEER's segment through a window, check its pattern, invert
 *       it through the window and ask PEER to check (8-byte accesses: on an
 *       NTB the window is device memory); prints {"p50_us":..,"p99_us":..,
 *       "samples":..,"window_ok":..} on one line.
 *
 * KEY=VALUE are the backend's parameters ("ports=/dev/vfio-ntb/...=PEER" for
 * ntb, "dir=..." for shm).  Exit 0, or 1 after saying what failed.
 */
#include "bench-stats.h"
#include "common/peerfd.h"
#include "common/util.h"
#include "fabric/fabric.h"
#include "tests/unit/fabric-wait.h"

#include <errno.h>
#include <glib-unix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define WARMUP 20
#define PAYLOAD 64
#define LINK_WAIT_S 60
#define SEGMENT (16u * 1024u)
#define T_ECHO 1u
#define T_CHECK 2u
#define T_SEGMENT 3u

static VnFabric *fab;
static uint64_t *segment; /* the server's, SEGMENT bytes */
static uint64_t segment_id;

static uint64_t pattern(size_t i)
{
    return 0x9e3779b97f4a7c15ull * (i + 1);
}

static void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    bool inverted = segment != NULL;

    if (msg->type == T_SEGMENT) {
        g_autofree char *json = g_strdup_printf("{\"segment\":%" G_GUINT64_FORMAT "}", segment_id);

        vn_fabric_reply(fab, token, json, NULL, 0);
        return;
    }
    if (msg->type != T_CHECK) {
        vn_fabric_reply(fab, token, NULL, msg->data, msg->data_len);
        return;
    }
    for (size_t i = 0; inverted && i < SEGMENT / 8; i++) {
        inverted = segment[i] == ~pattern(i);
    }
    vn_fabric_reply(fab, token, inverted ? "{\"inverted\":true}" : "{\"inverted\":false}", NULL, 0);
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

static int serve(const char *peer)
{
    g_autoptr(GMainLoop) loop = g_main_loop_new(NULL, FALSE);
    g_autoptr(GError) error = NULL;
    int fd = vn_peerfd_memfd_new("fabric-rtt", SEGMENT);

    segment = fd < 0 ? MAP_FAILED : mmap(NULL, SEGMENT, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (segment == MAP_FAILED) {
        fprintf(stderr, "fabric_rtt: no segment memory\n");
        return 1;
    }
    for (size_t i = 0; i < SEGMENT / 8; i++) {
        segment[i] = pattern(i);
    }
    segment_id = vn_fabric_segment_export(fab, fd, SEGMENT, peer, &error);
    if (segment_id == 0) {
        fprintf(stderr, "fabric_rtt: %s\n", error->message);
        return 1;
    }

    g_unix_signal_add(SIGTERM, quit, loop);
    g_unix_signal_add(SIGINT, quit, loop);
    g_main_loop_run(loop);
    return 0;
}

/* PEER's segment through a window: its pattern read, inverted, checked by PEER. */
static bool window_check(const char *peer)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnFabricMsg) which = NULL;
    g_autoptr(VnFabricMsg) reply = NULL;
    VnFabricWindow *w = NULL;
    volatile uint64_t *m;
    const char *id;
    bool ok = true;

    if (fw_request(fab, peer, T_SEGMENT, NULL, NULL, 0, &which) == 0 && which->json != NULL &&
        (id = strstr(which->json, "\"segment\":")) != NULL) {
        w = fw_window_map(fab, peer, g_ascii_strtoull(id + 10, NULL, 10), &error);
    }
    if (w == NULL) {
        fprintf(stderr, "fabric_rtt: %s\n", error != NULL ? error->message : "no segment");
        return false;
    }
    m = w->host != NULL
            ? (volatile uint64_t *)w->host
            : mmap(NULL, w->size, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd, (off_t)w->offset);
    if ((void *)m == MAP_FAILED || w->size < SEGMENT) {
        fprintf(stderr, "fabric_rtt: cannot map the window\n");
        vn_fabric_window_unmap(fab, w);
        return false;
    }
    for (size_t i = 0; i < SEGMENT / 8; i++) {
        ok &= m[i] == pattern(i);
        m[i] = ~pattern(i);
    }
    if (w->host == NULL) {
        munmap((void *)m, w->size);
    }
    vn_fabric_window_unmap(fab, w);
    if (!ok) {
        fprintf(stderr, "fabric_rtt: the window does not show the peer's pattern\n");
    }
    return ok && fw_request(fab, peer, T_CHECK, NULL, NULL, 0, &reply) == 0 &&
           reply->json != NULL && strstr(reply->json, "true") != NULL;
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
        int ret = fw_request(fab, peer, T_ECHO, NULL, payload, sizeof(payload), &reply);

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
    printf("{\"p50_us\": %.1f, \"p99_us\": %.1f, \"samples\": %d, \"window_ok\": %s}\n",
           vn_bench_pct(ns, (size_t)samples, 50) / 1000.0,
           vn_bench_pct(ns, (size_t)samples, 99) / 1000.0, samples,
           window_check(peer) ? "true" : "false");
    return 0;
}

int main(int argc, char **argv)
{
    int ret, samples;

    if (argc >= 5 && strcmp(argv[1], "serve") == 0) {
        fab = attach(argv[2], argv[3], argv + 5, argc - 5);
        ret = fab != NULL ? serve(argv[4]) : 1;
    } else if (argc >= 6 && strcmp(argv[1], "ask") == 0) {
        samples = atoi(argv[5]);
        if (samples < 10 || samples > VN_BENCH_MAX_SAMPLES) {
            fprintf(stderr, "fabric_rtt: SAMPLES 10..%d\n", VN_BENCH_MAX_SAMPLES);
            return 1;
        }
        fab = attach(argv[2], argv[3], argv + 6, argc - 6);
        ret = fab != NULL ? ask(argv[4], samples) : 1;
    } else {
        fprintf(stderr, "usage: fabric_rtt serve BACKEND NODE PEER [KEY=VALUE...]\n"
                        "       fabric_rtt ask BACKEND NODE PEER SAMPLES [KEY=VALUE...]\n");
        return 1;
    }
    if (fab != NULL) {
        vn_fabric_close(fab);
    }
    return ret;
}
