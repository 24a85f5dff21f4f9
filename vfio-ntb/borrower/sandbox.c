/*
 * The borrower worker's sandbox (see sandbox.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "sandbox.h"

#include <errno.h>
#include <gio/gio.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * Every system call a borrower worker makes once it serves, and no other: what strace shows
 * of workers under the e2e suites (fd and relay interrupts, guests' I/O, a daemon restart and
 * its reconnection, a takeover), and what GLib's loop and allocator may call on a path those
 * did not take (marked).  A call missing here kills the worker the first time it is made:
 * the e2e suites run every borrower worker under this filter, so a new one is seen there.
 */
static const char *const VN_SANDBOX_ALLOWED[] = {
    /* QEMU's socket, the port, the control channel: messages and fds */
    "recvmsg",
    "sendmsg",
    "recvfrom",
    "sendto",
    "read",
    "write",
    "readv",
    "writev",
    "poll",
    "ppoll",
    "accept",
    "accept4",
    "shutdown",
    "getsockopt",
    "setsockopt",
    "getsockname",
    "getpeername",
    /* the port again after vfio-ntbd restarted (socket() is AF_UNIX only, below) */
    "connect",
    /* fds: what QEMU and the daemon pass (checked: fstat, fstatfs, /proc/self/fd) */
    "close",
    "fcntl",
    "fstat",
    "newfstatat",
    "fstatfs",
    "readlink",
    "lseek",
    "dup",
    "dup3",
    /* guest memory, windows, BARs: mappings of fds we hold; the allocator */
    "mmap",
    "munmap",
    "mprotect",
    "madvise",
    "mremap",
    "brk",
    /* eventfds for QEMU's interrupts */
    "eventfd2",
    /* GLib's loop, time, wake-ups (mostly vDSO; the syscalls are the fallbacks) */
    "futex",
    "clock_gettime",
    "gettimeofday",
    "clock_nanosleep",
    "nanosleep",
    "restart_syscall",
    "sched_yield",
    "getrandom",
    "gettid",
    /* GLib's log lines: "(process:PID)", and whether stderr is a terminal (ioctl, TCGETS
     * only: below) */
    "getpid",
    /* signals (SIGTERM ends the worker; GLib's unix signal sources) */
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sigaltstack",
    /* its own files on the way out: refused in the daemon's directory (the daemon removes
     * them once the worker is gone), but tried */
    "unlink",
    "exit",
    "exit_group",
    NULL,
};

const char *const *vn_sandbox_allowed(void)
{
    return VN_SANDBOX_ALLOWED;
}

static bool load_filter(GError **error)
{
    scmp_filter_ctx f = seccomp_init(SCMP_ACT_KILL_PROCESS);
    int ret = f != NULL ? 0 : -ENOMEM;

    for (const char *const *name = VN_SANDBOX_ALLOWED; *name != NULL && ret == 0; name++) {
        int nr = seccomp_syscall_resolve_name(*name);

        /* A name this architecture lacks (an alias of another here) is not needed. */
        if (nr != __NR_SCMP_ERROR) {
            ret = seccomp_rule_add(f, SCMP_ACT_ALLOW, nr, 0);
        }
    }
    /* Sockets: only local ones (the port again). */
    if (ret == 0) {
        ret =
            seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, AF_UNIX));
    }
    if (ret == 0) {
        ret = seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_EQ, TCGETS));
    }
    if (ret == 0) {
        ret = seccomp_load(f);
    }
    if (f != NULL) {
        seccomp_release(f);
    }
    if (ret < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret),
                    "sandbox: cannot load the seccomp filter: %s", g_strerror(-ret));
        return false;
    }
    return true;
}

bool vn_sandbox_enter(const VnPrivs *p, GError **error)
{
    return vn_privs_drop(p, error) && load_filter(error);
}
