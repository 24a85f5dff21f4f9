/*
 * kmod-window-span: several outbound windows as one file (VN_NTB_MW_SPAN_FD), what the daemon
 * hands a VM's QEMU for a BAR larger than one window.  The file's offset O reaches window
 * index[O / chunk] at O % chunk, in the order asked (here the mock's windows 1 then 0, so a
 * file that mapped them in index order would read the wrong marks); a revoke of any of its
 * windows kills it (its mapping SIGBUS, a new mmap ENODEV) and a span without that window
 * lives on; every malformed argument is refused with EINVAL.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kselftest.h"

/* SPAN_FD of @count windows (its index copied whole: count may be a bad one). */
static int span_fd(int dev, unsigned count, const unsigned idx[VN_NTB_MAX_MWS], uint64_t chunk,
                   unsigned flags, unsigned reserved, unsigned argsz)
{
    struct vn_ntb_mw_span_fd a = {
        .argsz = argsz, .flags = flags, .count = count, .reserved = reserved, .chunk = chunk
    };

    for (unsigned k = 0; k < VN_NTB_MAX_MWS; k++) {
        a.index[k] = idx[k];
    }
    return vn_ioctl(dev, VN_NTB_MW_SPAN_FD, &a);
}

/* Each malformed span is EINVAL; @t fails naming the first that is not. */
static void span_refusals(struct tcase *t, int dev, uint64_t out_size)
{
    const unsigned both[VN_NTB_MAX_MWS] = { 1, 0 }, twice[VN_NTB_MAX_MWS] = { 0, 0 },
                   far[VN_NTB_MAX_MWS] = { 0, 9 };
    const unsigned sz = sizeof(struct vn_ntb_mw_span_fd);
    const uint64_t chunk = 2 * (uint64_t)page;
    const struct {
        const char *name;
        int ret;
    } cases[] = {
        { "count-0", span_fd(dev, 0, both, chunk, 0, 0, sz) },
        { "count-9", span_fd(dev, 9, both, chunk, 0, 0, sz) },
        { "index-twice", span_fd(dev, 2, twice, chunk, 0, 0, sz) },
        { "index-9", span_fd(dev, 2, far, chunk, 0, 0, sz) },
        { "chunk-0", span_fd(dev, 2, both, 0, 0, 0, sz) },
        { "chunk-unaligned", span_fd(dev, 2, both, chunk + 8, 0, 0, sz) },
        { "chunk-past-window", span_fd(dev, 2, both, out_size + (uint64_t)page, 0, 0, sz) },
        { "flags", span_fd(dev, 2, both, chunk, 0x80, 0, sz) },
        { "reserved", span_fd(dev, 2, both, chunk, 0, 1, sz) },
        { "argsz", span_fd(dev, 2, both, chunk, 0, 0, sz - 4) },
    };
    unsigned refused = 0;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (cases[i].ret >= 0) {
            close(cases[i].ret);
        }
        if (check(t, cases[i].ret == -EINVAL, "span %s: %d, not EINVAL", cases[i].name,
                  cases[i].ret)) {
            refused++;
        }
    }
    kv(t, "refused=%u/%zu", refused, sizeof(cases) / sizeof(cases[0]));
}

void case_window_span(void)
{
    struct tcase t = { .name = "kmod-window-span", .ok = true };
    const uint32_t mark1a = 0x53500101, mark1b = 0x53500102, mark0 = 0x53500000;
    const unsigned order[VN_NTB_MAX_MWS] = { 1, 0 }, one[VN_NTB_MAX_MWS] = { 1 };
    const uint64_t chunk = 2 * (uint64_t)page;
    volatile uint32_t *w0 = MAP_FAILED, *w1 = MAP_FAILED, *s = MAP_FAILED, *lone = MAP_FAILED;
    struct vn_ntb_mw_info mi0, mi1;
    int dev, sfd = -1, lfd = -1, nfd = -1, r, r2;
    uint32_t seen = 0, seen2 = 0;

    dev = open_linked(&t);
    if (dev < 0) {
        goto out;
    }
    if (!check(&t,
               mw_info(dev, 0, &mi0) == 0 && mw_info(dev, 1, &mi1) == 0 && mi0.out_size >= chunk &&
                   mi1.out_size >= chunk,
               "the mock has no two windows of 2 pages")) {
        goto out;
    }
    w0 = map(dev, chunk, mi0.out_mmap_offset);
    w1 = map(dev, chunk, mi1.out_mmap_offset);
    if (!check(&t, w0 != MAP_FAILED && w1 != MAP_FAILED, "mmap of the windows: %s",
               strerror(errno))) {
        goto out;
    }
    w1[0] = mark1a;
    w1[page / 4] = mark1b;
    w0[0] = mark0;
    w0[page / 4] = 0;

    sfd = span_fd(dev, 2, order, chunk, 0, 0, sizeof(struct vn_ntb_mw_span_fd));
    if (!check(&t, sfd >= 0, "SPAN_FD(1, 0): %s", strerror(-sfd))) {
        goto out;
    }
    errno = 0;
    check(&t, map(sfd, page, 2 * chunk) == MAP_FAILED && errno == EINVAL,
          "a mapping past the span's end was not EINVAL (errno %d)", errno);
    s = map(sfd, 2 * chunk, 0);
    if (!check(&t, s != MAP_FAILED, "mmap of the span: %s", strerror(errno))) {
        goto out;
    }
    /* Window 1 first, then window 0; a write through the span lands in window 0. */
    check(&t, peek(s, &seen) == 0 && seen == mark1a, "span[0] read %#x, not window 1's", seen);
    check(&t, peek(s + page / 4, &seen) == 0 && seen == mark1b,
          "span[page] read %#x, not window 1's second page", seen);
    check(&t, peek(s + chunk / 4, &seen) == 0 && seen == mark0,
          "span[chunk] read %#x, not window 0's", seen);
    r = touch(s + (chunk + page) / 4, &seen, 0x5350feed);
    check(&t, r == 0 && w0[page / 4] == 0x5350feed, "a write through the span missed window 0");
    kv(&t, "order=%s", t.ok ? "1,0" : "wrong");

    span_refusals(&t, dev, mi0.out_size > mi1.out_size ? mi0.out_size : mi1.out_size);

    /* A span of window 1 alone outlives a revoke of window 0; the two-window span does not. */
    lfd = span_fd(dev, 1, one, chunk, VN_NTB_MW_FD_WC, 0, sizeof(struct vn_ntb_mw_span_fd));
    lone = lfd >= 0 ? map(lfd, chunk, 0) : MAP_FAILED;
    check(&t, lone != MAP_FAILED && peek(lone, &seen) == 0 && seen == mark1a,
          "a span of window 1 alone does not read it");
    r = u32_ioctl(dev, VN_NTB_MW_REVOKE, 0);
    check(&t, r == 0, "MW_REVOKE(0): %s", strerror(-r));
    r = peek(s, &seen);
    r2 = peek(s + chunk / 4, &seen2);
    kv(&t, "after_revoke=%s", r == SIGBUS && r2 == SIGBUS ? "SIGBUS" : "read");
    check(&t, r == SIGBUS && r2 == SIGBUS,
          "the span's mapping still reads after a revoke of one of its windows (%d, %d)", r, r2);
    errno = 0;
    check(&t, map(sfd, chunk, 0) == MAP_FAILED && errno == ENODEV,
          "the span file maps again after the revoke (errno %d)", errno);
    check(&t, lone != MAP_FAILED && peek(lone, &seen) == 0 && seen == mark1a,
          "the span of window 1 alone stopped reading at window 0's revoke");
    nfd = span_fd(dev, 2, order, chunk, 0, 0, sizeof(struct vn_ntb_mw_span_fd));
    if (check(&t, nfd >= 0, "a new span after the revoke: %s", strerror(-nfd))) {
        volatile uint32_t *n = map(nfd, 2 * chunk, 0);

        check(&t, n != MAP_FAILED && peek(n + chunk / 4, &seen) == 0 && seen == mark0,
              "a new span does not read window 0's target");
        if (n != MAP_FAILED) {
            munmap((void *)n, 2 * chunk);
        }
    }

out:
    if (s != MAP_FAILED) {
        munmap((void *)s, 2 * chunk);
    }
    if (lone != MAP_FAILED) {
        munmap((void *)lone, chunk);
    }
    if (w0 != MAP_FAILED) {
        munmap((void *)w0, chunk);
    }
    if (w1 != MAP_FAILED) {
        munmap((void *)w1, chunk);
    }
    int fds[] = { sfd, lfd, nfd, dev };

    for (size_t k = 0; k < sizeof(fds) / sizeof(fds[0]); k++) {
        if (fds[k] >= 0) {
            close(fds[k]);
        }
    }
    finish(&t);
}
