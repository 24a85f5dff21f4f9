/*
 * A borrower worker that dies under its VM replaced without QEMU seeing it go
 * (takeover.c).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_TAKEOVER_H
#define VN_TAKEOVER_H

#include "daemon.h"
#include "devices.h"

#include <glib.h>
#include <stdbool.h>

/* takeover.c: a borrower worker that died (@status, as waitpid() says) is replaced by one
 * that serves its QEMU, when it kept what that takes and has not died too often: the new
 * worker runs @argv (its usual arguments, NULL-terminated; one is added) with what the dead
 * one kept, b->worker_pid is its pid, and the caller watches it.  False: it was not
 * replaced (said why in the log when that is news). */
bool vn_takeover_start(VnDaemon *d, VnBorrowed *b, int status, GPtrArray *argv);

#endif /* VN_TAKEOVER_H */
