/*
 * Small helpers shared by every vfio-ntb module.
 */
#include "util.h"

#include <time.h>
#include <unistd.h>

void vn_util_close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

void vn_util_close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        vn_util_close_fd(&fds[i]);
    }
}

uint64_t vn_util_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool vn_util_trace_on(void)
{
    static gsize once;
    static bool on;

    if (g_once_init_enter(&once)) {
        on = g_getenv("G_MESSAGES_DEBUG") != NULL;
        g_once_init_leave(&once, 1);
    }
    return on;
}
