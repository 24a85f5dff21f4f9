/*
 * kmod-doorbell-trigger: an eventfd that rings the peer's doorbell in the kernel
 * (VN_NTB_PEER_DB_EVENTFD).  The mock loops the peer's doorbells back to ours, so a trigger on
 * bit 1 signals our own eventfd of bit 1.  Checked: a signal rings it and leaves nothing for a
 * process to read; its refusals; once removed, and once the device is closed, a signal rings
 * nothing; a thread signalling it without pause while it is set, removed and replaced
 * thousands of times, and while the device closes under it, leaves no kernel complaint.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kselftest.h"

#define TOGGLES 5000

struct signaller {
    int fd;
    atomic_bool stop;
    unsigned long signals;
};

static void *signal_loop(void *opaque)
{
    struct signaller *s = opaque;
    uint64_t one = 1;

    while (!atomic_load(&s->stop)) {
        if (write(s->fd, &one, sizeof(one)) == sizeof(one)) {
            s->signals++;
        }
    }
    return NULL;
}

void case_doorbell_trigger(void)
{
    struct tcase t = { .name = "kmod-doorbell-trigger", .ok = true };
    struct signaller sig = { .fd = -1 };
    struct vn_ntb_db_eventfd listen;
    int dev, efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), r, not_eventfd = -1;
    pthread_t thread;
    bool running = false;
    char first[200] = "";

    sig.fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    dev = open_linked(&t);
    if (dev < 0 || efd < 0 || sig.fd < 0) {
        check(&t, false, "setup: device %d, eventfds %d %d", dev, efd, sig.fd);
        goto out;
    }
    listen = (struct vn_ntb_db_eventfd){ .fd = efd, .bits = BIT1 };
    r = vn_ioctl(dev, VN_NTB_DB_EVENTFD, &listen);
    check(&t, r == 0, "DB_EVENTFD: %s", strerror(-r));

    /* A signal rings the bit; the kernel took the count. */
    r = peer_trigger(dev, sig.fd, BIT1);
    check(&t, r == 0, "PEER_DB_EVENTFD: %s", strerror(-r));
    check(&t, ev_signal(sig.fd), "signal: %s", strerror(errno));
    check(&t, ev_readable(efd, 2000), "a signal of the trigger did not ring the doorbell");
    check(&t, !ev_readable(sig.fd, 0), "the trigger's count was left for a process to read");

    /* Its refusals. */
    not_eventfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    check(&t, peer_trigger(dev, sig.fd, 0x3) == -EINVAL, "two bits were taken");
    check(&t, peer_trigger(dev, sig.fd, 0) == -EINVAL, "no bit was taken");
    check(&t, peer_trigger(dev, sig.fd, 1ull << 63) == -EINVAL,
          "a bit beyond the device's was taken");
    check(&t, peer_trigger(dev, not_eventfd, BIT1) == -EINVAL,
          "a file that is no eventfd was taken");
    check(&t, peer_trigger(dev, -5, BIT1) == -EINVAL, "fd -5 was taken");
    check(&t, peer_trigger(dev, -1, 1ull << 2) == -ENOENT, "a removal of no trigger succeeded");

    /* Removed: a signal rings nothing. */
    r = peer_trigger(dev, -1, BIT1);
    check(&t, r == 0, "removal: %s", strerror(-r));
    check(&t, ev_signal(sig.fd), "signal: %s", strerror(errno));
    check(&t, !ev_readable(efd, 300), "a removed trigger rang the doorbell");
    check(&t, ev_readable(sig.fd, 0), "a removed trigger still took the count");

    /* Set, removed and replaced under a thread that signals without pause, then the device
     * closed under it. */
    running = pthread_create(&thread, NULL, signal_loop, &sig) == 0;
    check(&t, running, "no signalling thread");
    for (int i = 0; running && i < TOGGLES; i++) {
        r = peer_trigger(dev, (i % 3) == 2 ? -1 : sig.fd, BIT1);
        if (r != 0 && !((i % 3) == 2 && r == -ENOENT)) {
            check(&t, false, "toggle %d: %s", i, strerror(-r));
            break;
        }
    }
    r = peer_trigger(dev, sig.fd, BIT1);
    check(&t, r == 0, "set again: %s", strerror(-r));
    close(dev);
    dev = -1;
    sleep_ms(200);
    if (running) {
        atomic_store(&sig.stop, true);
        pthread_join(thread, NULL);
    }
    kv(&t, "toggles=%d signals=%lu", TOGGLES, sig.signals);

    /* Closed: the trigger went with the device's owner. */
    dev = open_linked(&t);
    if (dev >= 0) {
        while (ev_readable(efd, 0)) {
        }
        r = vn_ioctl(dev, VN_NTB_DB_EVENTFD, &listen);
        check(&t, r == 0, "DB_EVENTFD after reopening: %s", strerror(-r));
        while (ev_readable(sig.fd, 0)) {
        }
        check(&t, ev_signal(sig.fd), "signal: %s", strerror(errno));
        check(&t, !ev_readable(efd, 300), "a trigger of the closed device's rang the doorbell");
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
    if (sig.fd >= 0) {
        close(sig.fd);
    }
    if (not_eventfd >= 0) {
        close(not_eventfd);
    }
    finish(&t);
}
