/*
 * kselftest.h: kmod-selftest's harness (kselftest.c), shared by its cases: the options and the
 * device under test, the result of a case (one `RESULT <name> PASS|FAIL key=value...` line),
 * the helpers every case uses (files, mappings, children, guarded accesses) and thin wrappers
 * of the module's ioctls (vfio_ntb_uapi.h).  Plain libc, no GLib: it runs wherever the module
 * does.
 *
 * The cases: kmod-selftest.c (main, kmod-window-revoke, kmod-accounting, kmod-release),
 * kmod-refusals.c, kmod-span.c (kmod-window-span), kmod-bar.c (kmod-bar-revoke), kmod-races.c (kmod-map-races),
 * kmod-trigger.c (kmod-doorbell-trigger), kmod-keep.c (kmod-keep).
 *
 * Threads: the options and the device's names are set by main() before any case runs and only
 * read after; a struct tcase and the pass/fail counts belong to the main thread.  touch() and
 * peek() may be called from any thread once catch_faults() ran (the jump target is per thread).
 *
 * Errors: the ioctl wrappers and the file helpers return 0 (or an fd, or a count) or -errno.
 */
#ifndef KSELFTEST_H
#define KSELFTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kmod/vfio_ntb_uapi.h"

#define KIB 1024ul
#define MIB (1024ul * 1024ul)

/* The command line (main() parses it; the defaults are kselftest.c's). */
struct kselftest_opts {
    char bdf[64];     /* the mock's PCI function */
    char testdev[64]; /* a pci-testdev for the BAR exports; "" when there is none */
    const char *only; /* --case: the one case to run; NULL: all */
    long iterations;  /* kmod-map-races */
    int max_seconds;
    long removal_every;
};

extern struct kselftest_opts opt;
extern char dev_path[128];    /* /dev/vfio-ntb/BDF */
extern char debugfs_dir[160]; /* the mock's debugfs directory */
extern long page;             /* the page size */
extern int n_passed, n_failed;
extern int kmsg_fd; /* /dev/kmsg, at its end when the suite started; -1 when unreadable */

/* --- results ------------------------------------------------------------------------------ */

/* One case: set .name and .ok = true, check(), kv(), then finish() prints and counts it. */
struct tcase {
    const char *name;
    bool ok;
    char kv[2048];
    char why[200];
};

/* Appends " key=value..." to the case's line. */
void kv(struct tcase *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* @cond, or the case fails and (the first time) says why. */
bool check(struct tcase *t, bool cond, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prints the RESULT line and counts the case in n_passed or n_failed. */
void finish(struct tcase *t);

/* --- small helpers ------------------------------------------------------------------------ */

double now_s(void);
void sleep_ms(long ms);
/* An ioctl's result: what it returned, or -errno. */
int vn_ioctl(int fd, unsigned long req, void *arg);
int write_text(const char *path, const char *text);
int read_text(const char *path, char *buf, size_t size);
/* kB of VmLck in /proc/@pid/status (0: self); -1 when unreadable. */
long vmlck_kb(pid_t pid);
/* A shared read-write mapping of @fd; MAP_FAILED (errno set) on failure. */
void *map(int fd, size_t size, uint64_t offset);
/* Anonymous memory filled with 0x5a; MAP_FAILED on failure. */
void *anon(size_t size);

/* --- faults and children ------------------------------------------------------------------ */

/* SIGBUS and SIGSEGV: caught inside touch() and peek(), the default action elsewhere. */
void catch_faults(void);
/* Reads, then writes @val to (unless 0), the word at @p: 0, or the signal the access raised. */
int touch(volatile uint32_t *p, uint32_t *seen, uint32_t val);
int peek(volatile uint32_t *p, uint32_t *seen);
/* Waits for @pid up to @secs; its wait status, or -1 (then it was killed). */
int reap(pid_t pid, double secs);
/* What a status of reap() says: "hung", "SIGBUS", "SIGSEGV", "signal" or "exitN". */
const char *how_died(int st, char *buf, size_t size);

/* --- the device --------------------------------------------------------------------------- */

int dev_open(void);
int info(int dev, struct vn_ntb_info *in);
int mw_info(int dev, unsigned idx, struct vn_ntb_mw_info *mi);
int u32_ioctl(int dev, unsigned long req, __u32 v);
int window_fd(int dev, unsigned idx, unsigned flags);
int mw_export(int dev, unsigned idx, const void *vaddr, size_t size);
int mw_alloc(int dev, unsigned idx, size_t size);
/* Link @on, and waits (5 s) until VN_NTB_INFO says so: 0 or -errno (-ETIMEDOUT). */
int link_set(int dev, bool on);
/* The device opened with its link up; -1 (and the case failed) if not. */
int open_linked(struct tcase *t);

/* Eventfds: whether @fd became readable within @ms (its count read then); one signal. */
bool ev_readable(int fd, int ms);
bool ev_signal(int fd);
/* VN_NTB_PEER_DB_EVENTFD: eventfd @fd rings the peer's @bits (-1: removes that trigger). */
int peer_trigger(int dev, int fd, uint64_t bits);
#define BIT1 (1ull << 1)

/* --- the kernel log ----------------------------------------------------------------------- */

/* Kernel log lines since the suite started that tell of a kernel bug; the first in @first. */
int kmsg_bad(char *first, size_t size);

/* --- the cases ---------------------------------------------------------------------------- */

/* The mock's debugfs file @file (read_text()); how many inbound windows it translates. */
int mock_state(const char *file, char *buf, size_t size);
int mock_translations(void);
/* The pci-testdev's BAR0, its first page, mapped through VFIO (it is bound to vfio-pci, a
 * type1v2 container made): fds (container, group, device) in @fds; MAP_FAILED (and @t
 * failed) when not.  vfio_unbind() closes them and gives the function back. */
void *vfio_bar0(struct tcase *t, int fds[3]);
void vfio_unbind(int fds[3]);

void case_window_revoke(void);    /* kmod-selftest.c */
void case_accounting(void);       /* kmod-selftest.c */
void case_release(void);          /* kmod-selftest.c */
void case_refusals(void);         /* kmod-refusals.c */
void case_window_span(void);      /* kmod-span.c */
void case_bar_revoke(void);       /* kmod-bar.c */
void case_doorbell_trigger(void); /* kmod-trigger.c */
void case_keep(void);             /* kmod-keep.c */
void case_map_races(void);        /* kmod-races.c: runs last, it unloads vfio_ntb */

#endif /* KSELFTEST_H */
