/*
 * The borrower worker's sandbox: what it may still do once it serves QEMU.
 *
 * A borrower worker parses every message a tenant's QEMU sends; one parser bug must not be
 * the host.  Once it has set itself up (its fabric connection, its control channel, its
 * vfio-user socket, the device's windows: all of it as fds), it enters the sandbox and is
 * from then on
 *   - a process of the worker user (vfio-ntbd's `worker-user`), with no supplementary
 *     groups and no capabilities (a uid other than 0 has none after setresuid),
 *   - unable to gain any (no_new_privs: no setuid binary, no file capability helps it),
 *   - under a seccomp filter that lets through only the system calls the worker makes while
 *     it serves (VN_SANDBOX_ALLOWED in sandbox.c, the one list), and kills the process on any
 *     other (SIGSYS; vfio-ntbd reports it and does not start another).
 * It keeps the fds it holds: they are its whole world.
 *
 * Threads: call from the worker's only thread, before any other starts (seccomp filters
 * bind the calling thread and what it creates later).
 */
#ifndef VN_SANDBOX_H
#define VN_SANDBOX_H

#include "common/privs.h"

#include <glib.h>
#include <stdbool.h>

/* Enter it: give up @p's privileges (common/privs.h), then the filter.  False with @error
 * when any step fails: the caller must then not serve (it exits). */
bool vn_sandbox_enter(const VnPrivs *p, GError **error);
/* The allowed system calls' names, NULL-terminated (for tests and docs). */
const char *const *vn_sandbox_allowed(void);

#endif /* VN_SANDBOX_H */
