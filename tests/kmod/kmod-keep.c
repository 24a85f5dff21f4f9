/*
 * kmod-keep: an owner's state kept for the next one (VN_NTB_KEEP, VN_NTB_RESET,
 * VN_NTB_STASH_*), as a restarting vfio-ntbd uses it.  Checked: after a close with a keep,
 * the translations, the link, the doorbells' eventfds and the triggers all still work with no
 * owner (a trigger's signal still reaches the doorbell's eventfd); the next open says it took
 * the state over, finds the stash and the buffer's contents as they were; a close then (its
 * own keep not asked) tears it all down; a keep nobody takes over in time is torn down by
 * itself; RESET tears down what was taken over; the refusals (too long a keep, too large a
 * stash, a reserved field, too small a buffer).  With a pci-testdev: a BAR exported (through
 * VFIO) by an owner that dies with a keep stays translated (its process's exit is no VFIO
 * zap), and without a keep it does not.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kselftest.h"

static const char stash_text[] = "the daemon's own words";

static int stash_set(int dev, const void *buf, uint32_t len, uint32_t reserved)
{
    struct vn_ntb_stash s = { .addr = (uintptr_t)buf, .len = len, .reserved = reserved };

    return vn_ioctl(dev, VN_NTB_STASH_SET, &s);
}

/* The stash's bytes into @buf (of @size): their count, or -errno. */
static int stash_get(int dev, void *buf, uint32_t size)
{
    struct vn_ntb_stash s = { .addr = (uintptr_t)buf, .len = size };
    int r = vn_ioctl(dev, VN_NTB_STASH_GET, &s);

    return r < 0 ? r : (int)s.len;
}

static bool took_over(int dev)
{
    struct vn_ntb_info in;

    return info(dev, &in) == 0 && (in.flags & VN_NTB_INFO_KEPT);
}

/* The owner's setup: a buffer behind window 0 (filled with @fill), @mem behind window 1, an
 * eventfd for doorbell bit 1, a trigger of the peer's bit 1, a stash.  The mock loops the
 * peer's doorbells back to ours. */
static void set_up(struct tcase *t, int dev, void *mem, int efd, int sig, uint32_t fill)
{
    struct vn_ntb_db_eventfd listen = { .fd = efd, .bits = BIT1 };
    struct vn_ntb_mw_info mi;
    uint32_t *buf;
    int r;

    r = mw_alloc(dev, 0, 64 * KIB);
    check(t, r == 0, "MW_ALLOC(0): %s", strerror(-r));
    r = mw_info(dev, 0, &mi);
    buf = r == 0 ? map(dev, 64 * KIB, mi.in_mmap_offset) : MAP_FAILED;
    if (check(t, buf != MAP_FAILED, "mmap of buffer 0: %s", strerror(errno))) {
        buf[0] = fill;
        munmap(buf, 64 * KIB);
    }
    r = mw_export(dev, 1, mem, 64 * KIB);
    check(t, r == 0, "MW_EXPORT(1): %s", strerror(-r));
    r = vn_ioctl(dev, VN_NTB_DB_EVENTFD, &listen);
    check(t, r == 0, "DB_EVENTFD: %s", strerror(-r));
    r = peer_trigger(dev, sig, BIT1);
    check(t, r == 0, "PEER_DB_EVENTFD: %s", strerror(-r));
    r = stash_set(dev, stash_text, sizeof(stash_text), 0);
    check(t, r == 0, "STASH_SET: %s", strerror(-r));
}

/* The first word of buffer 0, or 0 when it cannot be mapped. */
static uint32_t buffer_word(int dev)
{
    struct vn_ntb_mw_info mi;
    uint32_t *buf, v;

    if (mw_info(dev, 0, &mi) != 0 || mi.in_size == 0 || mi.in_mmap_offset == 0) {
        return 0;
    }
    buf = map(dev, 64 * KIB, mi.in_mmap_offset);
    if (buf == MAP_FAILED) {
        return 0;
    }
    v = buf[0];
    munmap(buf, 64 * KIB);
    return v;
}

/* A child opens the device, exports the testdev's BAR 0 through VFIO into window 1, asks a
 * keep of @keep_ms and dies (exit, no close, no munmap: as a daemon that crashes).  Its exit
 * status: 0 when it got that far. */
static int bar_owner_dies(uint32_t keep_ms)
{
    pid_t c = fork();
    int st;

    if (c == 0) {
        struct tcase ct = { .name = "bar-owner", .ok = true };
        int fds[3] = { -1, -1, -1 }, d = open_linked(&ct);
        void *vbar = d >= 0 ? vfio_bar0(&ct, fds) : MAP_FAILED;

        if (vbar == MAP_FAILED || mw_export(d, 1, vbar, page) != 0 ||
            u32_ioctl(d, VN_NTB_KEEP, keep_ms) != 0) {
            _exit(1);
        }
        _exit(0);
    }
    st = c > 0 ? reap(c, 20) : -1;
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void bar_kept(struct tcase *t)
{
    int fds[3] = { -1, -1, -1 }, dev, r;

    r = bar_owner_dies(10000);
    check(t, r == 0, "the BAR's owner did not get to its keep: %d", r);
    r = mock_translations();
    kv(t, "bar_kept_translations=%d", r);
    check(t, r == 1, "%d translations once the BAR's owner died with a keep, not 1", r);
    dev = dev_open();
    if (check(t, dev >= 0, "reopen: %s", strerror(-dev))) {
        check(t, took_over(dev), "the BAR's owner's state was not taken over");
        vn_ioctl(dev, VN_NTB_RESET, NULL);
        check(t, mock_translations() == 0, "the BAR's translation outlived RESET");
        close(dev);
    }
    r = bar_owner_dies(0);
    check(t, r == 0, "the BAR's second owner did not get that far: %d", r);
    r = mock_translations();
    kv(t, "bar_unkept_translations=%d", r);
    check(t, r == 0, "%d translations once the BAR's owner died with no keep", r);
    vfio_unbind(fds);
}

void case_keep(void)
{
    struct tcase t = { .name = "kmod-keep", .ok = true };
    int dev, efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), sig = eventfd(0, EFD_CLOEXEC);
    void *mem = anon(64 * KIB);
    char got[VN_NTB_MAX_STASH], big[VN_NTB_MAX_STASH + 1];
    char first[200] = "";
    int r;

    dev = open_linked(&t);
    if (dev < 0 || efd < 0 || sig < 0 || mem == MAP_FAILED) {
        check(&t, false, "setup: device %d, eventfds %d %d", dev, efd, sig);
        goto out;
    }
    check(&t, !took_over(dev), "a first open said it took a state over");
    set_up(&t, dev, mem, efd, sig, 0x4b454550);

    /* The refusals change nothing. */
    memset(big, 'x', sizeof(big));
    check(&t, u32_ioctl(dev, VN_NTB_KEEP, VN_NTB_MAX_KEEP_MS + 1) == -EINVAL,
          "a keep longer than VN_NTB_MAX_KEEP_MS was taken");
    check(&t, stash_set(dev, big, sizeof(big), 0) == -EINVAL, "a stash too large was taken");
    check(&t, stash_set(dev, big, 8, 1) == -EINVAL, "a stash with a reserved field was taken");
    check(&t, stash_get(dev, got, 4) == -ENOSPC, "a stash was read into too small a buffer");
    r = stash_get(dev, got, sizeof(got));
    check(&t, r == (int)sizeof(stash_text) && memcmp(got, stash_text, sizeof(stash_text)) == 0,
          "the stash after the refusals: %d", r);

    /* Closed with a keep: everything works on with no owner. */
    r = u32_ioctl(dev, VN_NTB_KEEP, 10000);
    check(&t, r == 0, "KEEP: %s", strerror(-r));
    close(dev);
    r = mock_translations();
    kv(&t, "kept_translations=%d", r);
    check(&t, r == 2, "%d translations kept, not 2", r);
    check(&t, ev_signal(sig), "signal: %s", strerror(errno));
    check(&t, ev_readable(efd, 2000),
          "with no owner, a kept trigger did not reach the kept doorbell eventfd");

    /* Taken over by the next open, as it was. */
    dev = dev_open();
    if (!check(&t, dev >= 0, "reopen: %s", strerror(-dev))) {
        goto out;
    }
    check(&t, took_over(dev), "the next open did not say it took the state over");
    r = stash_get(dev, got, sizeof(got));
    check(&t, r == (int)sizeof(stash_text) && memcmp(got, stash_text, sizeof(stash_text)) == 0,
          "the stash taken over: %d", r);
    check(&t, buffer_word(dev) == 0x4b454550, "buffer 0 lost its contents");
    check(&t, mock_translations() == 2, "translations lost at the takeover");

    /* RESET: all of it goes. */
    r = vn_ioctl(dev, VN_NTB_RESET, NULL);
    check(&t, r == 0, "RESET: %s", strerror(-r));
    r = mock_translations();
    kv(&t, "reset_translations=%d", r);
    check(&t, r == 0, "%d translations left after RESET", r);
    check(&t, !took_over(dev), "still taken over after RESET");
    check(&t, stash_get(dev, got, sizeof(got)) == 0, "a stash left after RESET");
    check(&t, ev_signal(sig), "signal: %s", strerror(errno));
    check(&t, !ev_readable(efd, 300), "a trigger rang after RESET");
    close(dev);

    /* A keep nobody takes over is torn down by itself. */
    dev = open_linked(&t);
    if (dev < 0) {
        goto out;
    }
    set_up(&t, dev, mem, efd, sig, 0x4b454551);
    check(&t, u32_ioctl(dev, VN_NTB_KEEP, 300) == 0, "KEEP 300");
    close(dev);
    sleep_ms(1000);
    r = mock_translations();
    kv(&t, "expired_translations=%d", r);
    check(&t, r == 0, "%d translations left once the keep expired", r);
    dev = dev_open();
    check(&t, dev >= 0 && !took_over(dev), "an expired state was taken over");

    /* The keep was the last owner's: without one of its own, a close tears down. */
    if (dev >= 0) {
        r = link_set(dev, true);
        check(&t, r == 0, "link up again: %s", strerror(-r));
        set_up(&t, dev, mem, efd, sig, 0x4b454552);
        close(dev);
        r = mock_translations();
        check(&t, r == 0, "%d translations left after a close with no keep", r);
        dev = dev_open();
        check(&t, dev >= 0 && !took_over(dev), "a state was kept with no keep");
    }
    if (dev >= 0) {
        close(dev);
        dev = -1;
    }
    if (opt.testdev[0]) {
        bar_kept(&t);
    }
    r = kmsg_bad(first, sizeof(first));
    check(&t, r == 0, "the kernel log tells of a bug: %s", first);
out:
    if (dev >= 0) {
        close(dev);
    }
    if (efd >= 0) {
        close(efd);
    }
    if (sig >= 0) {
        close(sig);
    }
    finish(&t);
}
