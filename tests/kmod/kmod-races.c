/*
 * kmod-map-races: three threads race over one device: T1 maps, touches and unmaps window files
 * (and keeps one mapping it touches across iterations), T2 revokes the window and makes its
 * next file, T3 sets, maps and clears an inbound buffer (and pins and unpins exported pages);
 * every removal_every iterations the main thread removes the mock (PCI unbind) under them,
 * checks what it had mapped, binds it again and reopens the device.  The case runs last: it
 * ends by unloading vfio_ntb and reading the kernel log.
 *
 * The checker: a window file made after the g-th completed revoke is "of generation g";
 * once revokes_done > g (read before the access), a mapping of it that still reads is
 * stale, and so is one of an inbound buffer after its MW_CLEAR returned.  A fault or an
 * error is expected only after a revoke started (revokes_started > g) or while the device
 * is being removed; anything else is "unexpected".
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "kselftest.h"

struct races {
    pthread_rwlock_t dev_lock; /* read: a worker's iteration; write: main swaps the device */
    int dev;                   /* under dev_lock (written by main with it held for writing) */
    uint64_t out_off;
    pthread_mutex_t wfd_lock;
    int wfd;      /* the current window file (T2 replaces it), under wfd_lock */
    long wfd_gen; /* revokes_done when it was made */
    atomic_long revokes_started, revokes_done;
    atomic_int removing, stop;
    atomic_long iters, removals, faults;
    atomic_long stale, unexpected, checks;
    pthread_mutex_t err_lock;
    char first[160]; /* the first stale access or unexpected error, under err_lock */
};

static void races_note(struct races *r, atomic_long *counter, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void races_note(struct races *r, atomic_long *counter, const char *fmt, ...)
{
    va_list ap;

    atomic_fetch_add(counter, 1);
    pthread_mutex_lock(&r->err_lock);
    if (!r->first[0]) {
        va_start(ap, fmt);
        vsnprintf(r->first, sizeof(r->first), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&r->err_lock);
}

/* An error @what (-errno or a signal) the worker met: fine while removing, else unexpected. */
static void races_error(struct races *r, const char *what, int err)
{
    if (!atomic_load(&r->removing)) {
        races_note(r, &r->unexpected, "%s: %d", what, err);
    }
}

static int races_wfd(struct races *r, long *gen)
{
    int fd;

    pthread_mutex_lock(&r->wfd_lock);
    fd = r->wfd >= 0 ? fcntl(r->wfd, F_DUPFD_CLOEXEC, 0) : -1;
    *gen = r->wfd_gen;
    pthread_mutex_unlock(&r->wfd_lock);
    return fd;
}

/* After a fault on a mapping of generation @gen: was a revoke under way, or a removal? */
static void races_fault(struct races *r, const char *what, int sig, long gen)
{
    atomic_fetch_add(&r->faults, 1);
    if (sig != SIGBUS) {
        races_note(r, &r->unexpected, "%s: signal %d", what, sig);
    } else if (atomic_load(&r->revokes_started) <= gen) {
        races_error(r, what, -EFAULT);
    }
}

struct t1_keep {
    volatile uint32_t *p;
    long gen;
    long epoch; /* removals when it was made */
};

static void t1_once(struct races *r, struct t1_keep *keep)
{
    /* Before the file is taken: a removal that completes during this iteration (main does
     * not wait for our read lock to remove) must count as after the mapping was made. */
    long epoch = atomic_load(&r->removals);
    long gen, done;
    volatile uint32_t *p;
    uint32_t seen;
    int fd = races_wfd(r, &gen), sig;

    if (fd < 0) {
        return;
    }
    done = atomic_load(&r->revokes_done);
    p = map(fd, page, 0);
    if (p == MAP_FAILED) {
        if (!(errno == ENODEV && atomic_load(&r->revokes_started) > gen)) {
            races_error(r, "t1 mmap", -errno);
        }
        close(fd);
        return;
    }
    if (done > gen) {
        races_note(r, &r->stale, "t1: a file revoked before mmap mapped");
    }
    done = atomic_load(&r->revokes_done);
    sig = touch(p, &seen, 0x71717171);
    atomic_fetch_add(&r->checks, 1);
    if (!sig && done > gen) {
        races_note(r, &r->stale, "t1: a mapping read after its file's revoke");
    } else if (sig) {
        races_fault(r, "t1 touch", sig, gen);
    }
    /* The long-lived mapping: made from an earlier file (of a device since removed,
     * maybe), touched now. */
    if (keep->p) {
        bool removed = atomic_load(&r->removals) != keep->epoch;

        done = atomic_load(&r->revokes_done);
        sig = peek(keep->p, &seen);
        atomic_fetch_add(&r->checks, 1);
        if (!sig && removed) {
            races_note(r, &r->stale, "t1: a kept mapping read after its device was removed");
        } else if (!sig && done > keep->gen) {
            races_note(r, &r->stale, "t1: a kept mapping read after its revoke");
        } else if (sig && removed) {
            atomic_fetch_add(&r->faults, 1);
        } else if (sig) {
            races_fault(r, "t1 kept", sig, keep->gen);
        }
        if (sig) {
            munmap((void *)keep->p, page);
            keep->p = NULL;
        }
    }
    if (!keep->p) {
        keep->p = p;
        keep->gen = gen;
        keep->epoch = epoch;
    } else {
        munmap((void *)p, page);
    }
    close(fd);
}

static void t2_once(struct races *r)
{
    volatile uint32_t *wm, *dm;
    long gen, started;
    uint32_t seen;
    int fd = races_wfd(r, &gen), nf, err, sig;
    void *x;

    if (fd < 0) {
        return;
    }
    /* Mappings made before the revoke: through the file, through the device. */
    wm = map(fd, page, 0);
    dm = map(r->dev, page, r->out_off);
    if (wm == MAP_FAILED || dm == MAP_FAILED) {
        races_error(r, "t2 mmap", -errno);
        goto out;
    }
    if ((sig = peek(wm, &seen)) || (sig = peek(dm, &seen))) {
        races_fault(r, "t2 before", sig, gen);
    }
    started = atomic_fetch_add(&r->revokes_started, 1);
    err = u32_ioctl(r->dev, VN_NTB_MW_REVOKE, 0);
    if (err) {
        atomic_store(&r->revokes_started, started);
        races_error(r, "t2 revoke", err);
        goto out;
    }
    atomic_fetch_add(&r->revokes_done, 1);
    atomic_fetch_add(&r->checks, 3);
    if (!peek(wm, &seen)) {
        races_note(r, &r->stale, "t2: the file's mapping read after the revoke");
    }
    if (!peek(dm, &seen)) {
        races_note(r, &r->stale, "t2: the device's mapping read after the revoke");
    }
    x = map(fd, page, 0);
    if (x != MAP_FAILED) {
        races_note(r, &r->stale, "t2: a revoked file mapped again");
        munmap(x, page);
    } else if (errno != ENODEV) {
        races_error(r, "t2 dead file mmap", -errno);
    }
    nf = window_fd(r->dev, 0, 0);
    if (nf < 0) {
        races_error(r, "t2 MW_FD", nf);
        goto out;
    }
    pthread_mutex_lock(&r->wfd_lock);
    close(r->wfd);
    r->wfd = nf;
    r->wfd_gen = atomic_load(&r->revokes_done);
    pthread_mutex_unlock(&r->wfd_lock);
out:
    if (wm != MAP_FAILED) {
        munmap((void *)wm, page);
    }
    if (dm != MAP_FAILED) {
        munmap((void *)dm, page);
    }
    close(fd);
}

static void t3_once(struct races *r, void *pages, long n)
{
    struct vn_ntb_mw_info mi;
    volatile uint32_t *p;
    uint32_t seen;
    int err, sig;

    if (n % 4 == 3) {
        /* Pages pinned and unpinned. */
        err = mw_export(r->dev, 0, pages, 64 * KIB);
        if (err) {
            races_error(r, "t3 export", err);
            return;
        }
        err = u32_ioctl(r->dev, VN_NTB_MW_CLEAR, 0);
        if (err) {
            races_error(r, "t3 clear export", err);
        }
        return;
    }
    err = mw_alloc(r->dev, 0, 64 * KIB);
    if (err) {
        races_error(r, "t3 alloc", err);
        return;
    }
    err = mw_info(r->dev, 0, &mi);
    p = err ? MAP_FAILED : map(r->dev, 64 * KIB, mi.in_mmap_offset);
    if (p == MAP_FAILED) {
        races_error(r, "t3 mmap", err ? err : -errno);
    } else if ((sig = touch(p, &seen, 0x73737373))) {
        atomic_fetch_add(&r->faults, 1);
        races_error(r, "t3 touch", sig);
    }
    err = u32_ioctl(r->dev, VN_NTB_MW_CLEAR, 0);
    if (err) {
        races_error(r, "t3 clear", err);
    } else if (p != MAP_FAILED) {
        atomic_fetch_add(&r->checks, 1);
        if (!peek(p, &seen)) {
            races_note(r, &r->stale, "t3: an inbound buffer read after its MW_CLEAR");
        } else {
            atomic_fetch_add(&r->faults, 1);
        }
    }
    if (p != MAP_FAILED) {
        munmap((void *)p, 64 * KIB);
    }
}

struct worker {
    struct races *r;
    int which;
    pthread_t thread;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct races *r = w->r;
    struct t1_keep keep = { NULL, 0, 0 };
    void *pages = anon(64 * KIB);
    long n = 0;

    while (!atomic_load(&r->stop)) {
        pthread_rwlock_rdlock(&r->dev_lock);
        if (w->which == 1) {
            t1_once(r, &keep);
        } else if (w->which == 2) {
            t2_once(r);
        } else {
            t3_once(r, pages, n);
        }
        pthread_rwlock_unlock(&r->dev_lock);
        atomic_fetch_add(&r->iters, 1);
        n++;
        if (atomic_load(&r->removing)) {
            sleep_ms(1);
        }
    }
    if (keep.p) {
        munmap((void *)keep.p, page);
    }
    munmap(pages, 64 * KIB);
    return NULL;
}

static void *unbind_main(void *arg)
{
    intptr_t r = write_text("/sys/bus/pci/drivers/ntb_mock/unbind", opt.bdf);

    return (void *)r;
}

/* The device again after a bind: open it (10 s), link up, a window file. 0 or -errno. */
static int races_attach(struct races *r)
{
    struct vn_ntb_mw_info mi;
    double end = now_s() + 10;
    int dev, err;

    do {
        dev = dev_open();
        if (dev >= 0) {
            break;
        }
        sleep_ms(10);
    } while (now_s() < end);
    if (dev < 0) {
        return dev;
    }
    err = link_set(dev, true);
    if (!err) {
        err = mw_info(dev, 0, &mi);
    }
    if (!err) {
        err = window_fd(dev, 0, 0);
    }
    if (err < 0) {
        close(dev);
        return err;
    }
    r->dev = dev;
    r->out_off = mi.out_mmap_offset;
    r->wfd = err;
    r->wfd_gen = atomic_load(&r->revokes_done);
    return 0;
}

/*
 * The mock removed under the workers: what main had mapped (the window through the device
 * and a file, an inbound buffer) faults and every call answers ENODEV; then the device comes
 * back.  false when the removal hung or the device did not come back (the case cannot go on).
 */
static bool races_remove(struct races *r, struct tcase *t)
{
    volatile uint32_t *dm, *wm = MAP_FAILED, *im = MAP_FAILED;
    struct vn_ntb_mw_info mi;
    struct vn_ntb_info in;
    struct timespec ts;
    pthread_t th;
    uint32_t seen;
    void *ret;
    long gen;
    int fd, err;

    pthread_rwlock_rdlock(&r->dev_lock);
    dm = map(r->dev, page, r->out_off);
    fd = races_wfd(r, &gen);
    if (fd >= 0) {
        wm = map(fd, page, 0);
        close(fd);
    }
    if (!mw_alloc(r->dev, 1, 64 * KIB) && !mw_info(r->dev, 1, &mi)) {
        im = map(r->dev, 64 * KIB, mi.in_mmap_offset);
    }
    pthread_rwlock_unlock(&r->dev_lock);

    atomic_store(&r->removing, 1);
    pthread_create(&th, NULL, unbind_main, NULL);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    if (pthread_timedjoin_np(th, &ret, &ts)) {
        check(t, false, "unbind of the mock hung (60 s)");
        return false;
    }
    if (!check(t, ret == NULL, "unbind: %s", strerror(-(int)(intptr_t)ret))) {
        return false;
    }
    atomic_fetch_add(&r->removals, 1);
    /* Gone: every mapping faults, every call is ENODEV. */
    atomic_fetch_add(&r->checks, 3);
    if (dm != MAP_FAILED && !peek(dm, &seen)) {
        races_note(r, &r->stale, "removal: the device's mapping still reads");
    }
    if (wm != MAP_FAILED && !peek(wm, &seen)) {
        races_note(r, &r->stale, "removal: a window file's mapping still reads");
    }
    if (im != MAP_FAILED && !peek(im, &seen)) {
        races_note(r, &r->stale, "removal: an inbound buffer's mapping still reads");
    }

    pthread_rwlock_wrlock(&r->dev_lock);
    err = info(r->dev, &in);
    if (err != -ENODEV) {
        races_note(r, &r->unexpected, "removal: INFO answered %d, not ENODEV", err);
    }
    if (dm != MAP_FAILED) {
        munmap((void *)dm, page);
    }
    if (wm != MAP_FAILED) {
        munmap((void *)wm, page);
    }
    if (im != MAP_FAILED) {
        munmap((void *)im, 64 * KIB);
    }
    close(r->dev);
    close(r->wfd);
    r->dev = r->wfd = -1;
    err = write_text("/sys/bus/pci/drivers/ntb_mock/bind", opt.bdf);
    if (check(t, err == 0, "bind of the mock: %s", strerror(-err))) {
        err = races_attach(r);
        check(t, err == 0, "the device after the bind: %s", strerror(-err));
    }
    atomic_store(&r->removing, 0);
    pthread_rwlock_unlock(&r->dev_lock);
    return err == 0;
}

void case_map_races(void)
{
    struct tcase t = { .name = "kmod-map-races", .ok = true };
    struct races r = { .dev = -1, .wfd = -1 };
    struct worker w[3];
    pthread_rwlockattr_t attr;
    long next_removal = opt.removal_every;
    double t0 = now_s(), last_progress = t0, elapsed;
    char first_bad[80] = "";
    int err, bad;
    bool alive = true;

    pthread_rwlockattr_init(&attr);
    /* The main thread must get its turn between the workers' iterations. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r.dev_lock, &attr);
    pthread_mutex_init(&r.wfd_lock, NULL);
    pthread_mutex_init(&r.err_lock, NULL);
    err = races_attach(&r);
    if (!check(&t, err == 0, "the device: %s", strerror(-err))) {
        finish(&t);
        return;
    }
    for (int i = 0; i < 3; i++) {
        w[i] = (struct worker){ .r = &r, .which = i + 1 };
        pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
    }
    while (atomic_load(&r.iters) < opt.iterations && now_s() - t0 < opt.max_seconds) {
        sleep_ms(20);
        if (now_s() - last_progress >= 10) {
            last_progress = now_s();
            printf("kmod-map-races: %.0f s: iterations=%ld revokes=%ld removals=%ld checks=%ld "
                   "faults=%ld stale=%ld unexpected=%ld\n",
                   last_progress - t0, atomic_load(&r.iters), atomic_load(&r.revokes_done),
                   atomic_load(&r.removals), atomic_load(&r.checks), atomic_load(&r.faults),
                   atomic_load(&r.stale), atomic_load(&r.unexpected));
            fflush(stdout);
        }
        if (opt.removal_every > 0 && atomic_load(&r.iters) >= next_removal) {
            next_removal += opt.removal_every;
            alive = races_remove(&r, &t);
            if (!alive) {
                break;
            }
        }
    }
    if (!alive) {
        /* A worker may be stuck in the module: report and leave without them. */
        kv(&t, "iterations=%ld removals=%ld", atomic_load(&r.iters), atomic_load(&r.removals));
        finish(&t);
        printf("kmod-selftest: %d passed, %d failed\n", n_passed, n_failed);
        fflush(stdout);
        _exit(1);
    }
    atomic_store(&r.stop, 1);
    for (int i = 0; i < 3; i++) {
        pthread_join(w[i].thread, NULL);
    }
    elapsed = now_s() - t0;
    close(r.wfd);
    close(r.dev);

    kv(&t,
       "iterations=%ld elapsed_s=%.1f revokes=%ld removals=%ld checks=%ld faults=%ld "
       "stale=%ld unexpected=%ld",
       atomic_load(&r.iters), elapsed, atomic_load(&r.revokes_done), atomic_load(&r.removals),
       atomic_load(&r.checks), atomic_load(&r.faults), atomic_load(&r.stale),
       atomic_load(&r.unexpected));
    check(&t, atomic_load(&r.stale) == 0 && atomic_load(&r.unexpected) == 0, "%s", r.first);
    check(&t, atomic_load(&r.iters) >= opt.iterations, "only %ld iterations in %d s",
          atomic_load(&r.iters), opt.max_seconds);
    check(&t, atomic_load(&r.revokes_done) > 0 && atomic_load(&r.faults) > 0,
          "no revoke or no fault seen: nothing was checked");
    check(&t, opt.removal_every <= 0 || atomic_load(&r.removals) > 0, "no removal done");

    err = syscall(SYS_delete_module, "vfio_ntb", O_NONBLOCK) ? -errno : 0;
    kv(&t, "rmmod=%s", err ? strerror(-err) : "ok");
    check(&t, err == 0, "rmmod vfio_ntb: %s", strerror(-err));
    sleep_ms(200);
    bad = kmsg_bad(first_bad, sizeof(first_bad));
    kv(&t, "kernel_log_bad=%d%s%s", bad, bad ? " first=" : "", first_bad);
    check(&t, bad == 0, "the kernel log has %d bad lines", bad);
    finish(&t);
}
