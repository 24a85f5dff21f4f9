/*
 * What a borrower worker keeps with its daemon for the worker after it: the fds by which
 * QEMU reaches the device (its listening socket, its connection, interrupt eventfds), and
 * its state (what it set up for QEMU, as it describes it).  systemd's file-descriptor store
 * is the model: QEMU cannot reconnect to a vfio-user server, so a worker that dies must
 * not take QEMU's connection with it (daemon/takeover.c hands all of it to the next).
 *
 * The worker is a peer like any other: keys, fds and bytes are bounded, and nothing kept
 * is read here; the next worker of the same device checks the state it is given.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_KEEP_H
#define VN_KEEP_H

#include "fabric/host.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Fds one worker may keep: its two sockets, an eventfd per relayed vector (at most
 * VN_PROTO_RELAY_VECTORS of three indexes) and the device request's. */
#define VN_KEEP_MAX_FDS 128u
/* The state's bytes: what fabric/host.h lets a worker send. */
#define VN_KEEP_MAX_STATE VN_HOST_MAX_KEPT_STATE

typedef struct VnKeep VnKeep;

VnKeep *vn_keep_new(void);
/* Closes what it holds. */
void vn_keep_free(VnKeep *k);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnKeep, vn_keep_free)

/* Keep @fd (taken: closed on failure too) under @key (> 0), replacing what was kept
 * there; false with @error when the store is full. */
bool vn_keep_fd(VnKeep *k, uint64_t key, int fd, GError **error);
/* Keep @len bytes of state, replacing the last; false with @error when too long. */
bool vn_keep_state(VnKeep *k, const void *data, size_t len, GError **error);
/* Close and forget the fds kept under [@first, @last] (the state too when @first is 0). */
void vn_keep_forget(VnKeep *k, uint64_t first, uint64_t last);

/* The fd kept under @key (still the store's), or -1. */
int vn_keep_get_fd(VnKeep *k, uint64_t key);
/* The state, or NULL when none was kept (a new reference). */
GBytes *vn_keep_get_state(VnKeep *k);
/* How many fds are kept; their keys, ascending, in @keys (up to @max). */
guint vn_keep_keys(VnKeep *k, uint64_t *keys, guint max);

#endif /* VN_KEEP_H */
