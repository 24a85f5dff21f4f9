/*
 * Bench "vfio-user-rtt": REGION_READ round-trip latency through our server
 * and client engines over a UNIX socket, and the engine's message rate.
 * The server runs in its own thread, as it would in its own process.
 * Prints one JSON line.
 */
#include "common/util.h"
#include "vfio-user/client.h"
#include "vfio-user/server.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static uint8_t regs[4096];

static int rd(void *opaque, uint32_t index, uint64_t off, void *buf, uint32_t n)
{
    memcpy(buf, regs + off, n);
    return 0;
}

static int wr(void *opaque, uint32_t index, uint64_t off, const void *buf, uint32_t n)
{
    memcpy(regs + off, buf, n);
    return 0;
}

static const VnDeviceOps ops = { .region_read = rd, .region_write = wr };
static GMainLoop *loop;

static gpointer serve(gpointer ctx)
{
    g_main_context_push_thread_default(ctx);
    g_main_loop_run(loop);
    return NULL;
}

static gboolean quit(gpointer data)
{
    g_main_loop_quit(loop);
    return G_SOURCE_REMOVE;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    VnDeviceInfo info = { .flags = VFIO_DEVICE_FLAGS_PCI, .num_regions = 9, .num_irqs = 0 };
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = g_dir_make_tmp("vn-bench-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "s", NULL);
    GMainContext *ctx = g_main_context_new();
    const int n = argc > 1 ? atoi(argv[1]) : 20000;
    g_autofree uint64_t *lat = g_new(uint64_t, n);
    VnServer *server;
    VnClient *client;
    GThread *th;
    uint64_t t0, total;
    uint32_t v;

    for (unsigned i = 0; i < info.num_regions; i++) {
        info.regions[i].mmap_fd = -1;
    }
    info.regions[0] =
        (VnRegion){ .size = sizeof(regs),
                    .mmap_fd = -1,
                    .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE };
    loop = g_main_loop_new(ctx, FALSE);
    server = vn_server_new(path, &info, &ops, NULL, ctx, &error);
    if (server == NULL) {
        fprintf(stderr, "bench: %s\n", error->message);
        return 1;
    }
    th = g_thread_new("server", serve, ctx);
    client = vn_client_connect(path, 5000, &error);
    if (client == NULL) {
        fprintf(stderr, "bench: %s\n", error->message);
        return 1;
    }
    for (int i = 0; i < 1000; i++) { /* warm-up */
        vn_client_region_read(client, 0, 0, &v, 4);
    }
    t0 = vn_util_now_ns();
    for (int i = 0; i < n; i++) {
        uint64_t s = vn_util_now_ns();

        if (vn_client_region_read(client, 0, (uint64_t)(i % 1024) * 4, &v, 4) != 4) {
            fprintf(stderr, "bench: read failed\n");
            return 1;
        }
        lat[i] = vn_util_now_ns() - s;
    }
    total = vn_util_now_ns() - t0;
    qsort(lat, (size_t)n, sizeof(lat[0]), cmp_u64);
    /* each round trip is two messages: the command and its reply */
    printf("{\"bench\":\"vfio-user-rtt\",\"op\":\"REGION_READ 4B\",\"samples\":%d,"
           "\"p50_ns\":%" G_GUINT64_FORMAT ",\"p99_ns\":%" G_GUINT64_FORMAT
           ",\"msgs_per_s\":%.0f,\"round_trips_per_s\":%.0f}\n",
           n, lat[n / 2], lat[(size_t)n * 99 / 100], 2.0 * n * 1e9 / (double)total,
           (double)n * 1e9 / (double)total);
    vn_client_free(client);
    g_main_context_invoke(ctx, quit, NULL);
    g_thread_join(th);
    vn_server_free(server);
    g_rmdir(dir);
    return 0;
}
