/*
 * A device's interrupt state as a vfio-user client configures it with
 * SET_IRQS: per index (INTx, MSI, MSI-X, ERR, REQ) and vector, an eventfd
 * and a mask bit.
 *
 * The server applies SET_IRQS here (every flag combination of linux/vfio.h);
 * a device signals with vn_irqs_signal().  A masked vector's signal is held
 * pending and delivered on unmask.
 *
 * Threads: signalled from a device's engine thread while the socket thread
 * reconfigures it; a mutex (common/lock.h) guards the table, but no eventfd is written
 * under it: a signal takes a reference on the vector's eventfd, drops the
 * lock, then writes (irqs.c), so a slow or hostile consumer cannot hold up
 * reconfiguration or other vectors.
 */
#ifndef VN_IRQS_H
#define VN_IRQS_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnIrqs VnIrqs;

/* @counts[i] is the number of vectors of index i, i < n <= VN_MAX_IRQ_INDEXES. */
VnIrqs *vn_irqs_new(const uint32_t *counts, uint32_t n);
void vn_irqs_free(VnIrqs *irqs);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnIrqs, vn_irqs_free)

/*
 * Apply one SET_IRQS request (already decoded by vn_wire_decode_request).
 * @fds holds @nfds eventfds for DATA_EVENTFD (nfds == 0 de-assigns the
 * range), already checked with vn_peerfd_eventfd() (so non-blocking: the
 * server does it for what a client sends); they are consumed on success and
 * left to the caller on failure.
 * @bools holds count bytes for DATA_BOOL.  Returns 0 or -EINVAL for an
 * index or range the device does not have.
 */
int vn_irqs_set(VnIrqs *irqs, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                const uint8_t *bools, int *fds, unsigned nfds);

/* Signal vector @vector of @index: writes its eventfd unless masked (then
 * it stays pending), never blocking.  Returns true if an eventfd was
 * written (false also when its counter was saturated: that signal is
 * dropped). */
bool vn_irqs_signal(VnIrqs *irqs, uint32_t index, uint32_t vector);

/* True if @index/@vector has an eventfd assigned. */
bool vn_irqs_enabled(VnIrqs *irqs, uint32_t index, uint32_t vector);

/* A copy of the eventfd of @index/@vector (the caller's to close), or -1: none. */
int vn_irqs_fd_dup(VnIrqs *irqs, uint32_t index, uint32_t vector);

/* How many vectors have an eventfd assigned now (a fenced device has none). */
uint32_t vn_irqs_armed(VnIrqs *irqs);

/* Drop every eventfd and clear masks and pending bits (reset, disconnect). */
void vn_irqs_reset(VnIrqs *irqs);

/* Total signals written to eventfds since creation (a counter for stats). */
uint64_t vn_irqs_signalled(VnIrqs *irqs);

#endif /* VN_IRQS_H */
