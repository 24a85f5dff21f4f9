/*
 * A set of fds watched through one epoll fd, itself one source of a GLib
 * context.  GLib polls every fd of every source at every wake-up, so a
 * daemon with a link to each of n peers paid n polls (and n checks) for
 * each message or timer, from any peer: at 64 and 128 idle daemons that
 * was the largest part of their CPU.  Fds whose number grows with the
 * cluster (the shm fabric's links) go in a set; a wake-up costs what is
 * ready, not what is watched.
 *
 * Level-triggered, as GLib's own sources are.  A watch may be removed from
 * any callback, its own included; it is not called again after.
 */
#ifndef VN_FDSET_H
#define VN_FDSET_H

#include <glib.h>

typedef struct VnFdSet VnFdSet;
typedef struct VnFdSetWatch VnFdSetWatch;

/* @fd has @cond (G_IO_IN, G_IO_OUT, G_IO_HUP, G_IO_ERR, as GLib says them). */
typedef void (*VnFdSetFn)(int fd, GIOCondition cond, void *opaque);

/* A set whose callbacks run from @ctx; NULL with errno set when the kernel
 * gives no epoll fd. */
VnFdSet *vn_fdset_new(GMainContext *ctx);
/* Its watches are removed; their fds stay open (they are their owners'). */
void vn_fdset_free(VnFdSet *s);

/* Watch @fd (not in the set already) for @cond; NULL with errno set when the
 * kernel refuses it (EPERM: a regular file, which cannot be watched so). */
VnFdSetWatch *vn_fdset_add(VnFdSet *s, int fd, GIOCondition cond, VnFdSetFn fn, void *opaque);
/* Stop watching (before its fd is closed); NULL is nothing. */
void vn_fdset_remove(VnFdSetWatch *w);

/* Watches in the set (for tests and stats). */
unsigned vn_fdset_size(const VnFdSet *s);

#endif /* VN_FDSET_H */
