/*
 * One NTB port as the `ntb` fabric backend (fabric/ntb.h) uses it: Linux's
 * NTB API (include/linux/ntb.h) reduced to what a userspace node needs, behind
 * a const ops table, so the backend's protocol is the same code over every
 * provider:
 *
 *   - "kmod": a real port, /dev/vfio-ntb/<pci name>, through our kernel
 *     module (vfio-ntb/kmod/vfio_ntb_uapi.h), whatever adapter Linux drives;
 *   - "pair": two ports joined inside one process (memfds as inbound
 *     memory, eventfds as doorbells and link events), so that the fabric unit
 *     suite runs the backend on a machine without an NTB.
 *
 * A port reaches one peer.  Windows are numbered as Linux numbers them: our
 * outbound window N reaches what the peer set as the target of its inbound
 * window N.  Doorbell bits ring the peer's register; ours ring eventfds.
 * Scratchpads: we write the peer's (it reads them as its own) and read ours.
 *
 * Every call returns 0 or -errno; an index beyond the port's counts is
 * -EINVAL.  Threads: a port belongs to the thread of its fabric node.
 */
#ifndef VN_NTBPORT_H
#define VN_NTBPORT_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Windows a port may have (the kmod's VN_NTB_MAX_MWS). */
#define VN_NTBPORT_MAX_WINDOWS 8u
/* Doorbell bits a port may have. */
#define VN_NTBPORT_MAX_DOORBELLS 64u
/* Scratchpads a port needs: the backend's handshake (fabric/ntb.c). */
#define VN_NTBPORT_MIN_SPADS 2u
/* A port spec's longest text. */
#define VN_NTBPORT_MAX_SPEC 256u
/* Bytes a port keeps for its successor (the kmod's VN_NTB_MAX_STASH). */
#define VN_NTBPORT_MAX_STASH 4096u

typedef struct VnNtbPort VnNtbPort;

/* A port's shape, fixed once opened. */
typedef struct VnNtbPortInfo {
    uint32_t windows;   /* usable both ways: min(inbound, outbound) */
    uint32_t spads;     /* ours (and the peer's) */
    uint32_t doorbells; /* bits 0..doorbells-1 are valid */
    uint64_t out_size;  /* the smallest outbound window's size, bytes, among those
                         * that carry segments (1.., or 0 when it is the only one) */
    /* It has doorbell_route and peer_doorbell_fd (the kmod: a module that has
     * VN_NTB_PEER_DB_EVENTFD). */
    bool doorbell_routes;
} VnNtbPortInfo;

typedef struct VnNtbPortOps {
    const char *name;
    void (*close)(VnNtbPort *p);
    /* Whether the link is up now; link_fd is readable (an eventfd: read it
     * to clear) after each change. */
    bool (*link_up)(VnNtbPort *p);
    int (*link_fd)(VnNtbPort *p);
    /* An eventfd readable when our doorbell @bit rang (read it to clear). */
    int (*doorbell_fd)(VnNtbPort *p, uint32_t bit);
    int (*peer_doorbell)(VnNtbPort *p, uint64_t bits);
    /*
     * Doorbells that reach no process of ours (with info.doorbell_routes):
     * doorbell_route: our doorbell @bit signals @fd (an eventfd, borrowed: the
     * port keeps what it needs) instead of doorbell_fd's; -1 gives it back.
     * peer_doorbell_fd: a new eventfd of ours whose signals ring the peer's
     * doorbell @bit, whoever signals it (a VFIO device's interrupt), until
     * peer_doorbell_drop(@bit), after which they ring nothing where the
     * provider can tell (the kmod; the in-process pair cannot).
     */
    int (*doorbell_route)(VnNtbPort *p, uint32_t bit, int fd);
    int (*peer_doorbell_fd)(VnNtbPort *p, uint32_t bit);
    void (*peer_doorbell_drop)(VnNtbPort *p, uint32_t bit);
    int (*spad_read)(VnNtbPort *p, uint32_t index, uint32_t *value);
    int (*peer_spad_write)(VnNtbPort *p, uint32_t index, uint32_t value);
    /*
     * Inbound window @win's target: a buffer of the adapter's of @size bytes
     * (page multiple), mapped here in *@map (the port's until in_clear); or
     * @size bytes of @fd from @offset (memory: a sealed memfd; the port
     * keeps what it needs).  in_clear: no target (the peer's window then
     * reaches nothing).  A window with a target is refused (-EBUSY).
     */
    int (*in_alloc)(VnNtbPort *p, uint32_t win, uint64_t size, uint8_t **map);
    int (*in_export)(VnNtbPort *p, uint32_t win, int fd, uint64_t offset, uint64_t size);
    int (*in_clear)(VnNtbPort *p, uint32_t win);
    /* A new fd of ours whose bytes from *@offset are outbound window @win
     * (*@size of them), for mmap, bound to the window's target now; -ENXIO
     * when the peer set no target there and the provider can tell.  @memory:
     * the target is memory (mapped write-combining where the provider can);
     * else a device's registers (uncached).  The in-process pair ignores it
     * (memfds: the caching is the kernel's). */
    int (*out_fd)(VnNtbPort *p, uint32_t win, bool memory, uint64_t *offset, uint64_t *size);
    /* Optional: the window's target is gone or about to change: every
     * mapping of outbound window @win made from out_fd's fds faults from now
     * on, and those fds cannot be mapped again (out_fd gives one for the next
     * target).  Without it (the in-process pair: memfds) mappings stay. */
    int (*out_revoke)(VnNtbPort *p, uint32_t win);
    /* Optional: a new fd of ours whose bytes from 0 are outbound windows
     * @wins (@n of them) in order, @chunk bytes of each, bound to their
     * targets now as out_fd's (a revoke of any of them ends it).  Without
     * it (the in-process pair: slices of one memfd) windows are not joined. */
    int (*out_span_fd)(VnNtbPort *p, const uint32_t *wins, uint32_t n, uint64_t chunk, bool memory);
    /*
     * Optional, all together: what a port set up outlives it, for the next open of the
     * same port (a daemon's restart).  keep: targets, doorbell routes, triggers and the link
     * stay @ms milliseconds after close (0: they go at close; the provider may end them
     * earlier only with the device), the stash with them.  The next open then has
     * took_over set, and registers no doorbell eventfd of its own: the backend gives each
     * bit it does not route back to doorbell_fd's (doorbell_route(bit, -1)), drops the
     * triggers it does not know of (peer_doorbell_drop) and clears the targets it does not
     * know of (in_clear: -ENOENT when there is none).  stash_set, stash_get: the backend's
     * own bytes (at most VN_NTBPORT_MAX_STASH; _get returns their count).  reset: all that
     * was taken over goes, as at a close without a keep, and the port is as opened anew.
     * in_take: in_alloc's buffer of window @win (@size bytes), made before the takeover,
     * mapped in *@map as in_alloc maps it (-ENOENT: no such buffer).
     */
    int (*keep)(VnNtbPort *p, uint32_t ms);
    int (*stash_set)(VnNtbPort *p, const void *buf, uint32_t len);
    int (*stash_get)(VnNtbPort *p, void *buf, uint32_t size);
    int (*reset)(VnNtbPort *p);
    int (*in_take)(VnNtbPort *p, uint32_t win, uint64_t size, uint8_t **map);
} VnNtbPortOps;

struct VnNtbPort {
    const VnNtbPortOps *ops;
    VnNtbPortInfo info;
    char *spec;     /* as given */
    bool took_over; /* what the last opener kept is ours (ops->keep) */
};

/*
 * Open a port from its spec: "/dev/vfio-ntb/NAME" (kmod) or "pair:KEY/SIDE"
 * (the in-process emulation; SIDE 0 or 1, KEY any text: the two sides of one
 * KEY are joined).  Enables the link.  NULL with @error.
 */
VnNtbPort *vn_ntbport_open(const char *spec, GError **error);
/* @spec is one of those forms (opens nothing); false with @error. */
bool vn_ntbport_spec_ok(const char *spec, GError **error);
void vn_ntbport_close(VnNtbPort *p);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnNtbPort, vn_ntbport_close)

/* The providers (ntbport-kmod.c, ntbport-pair.c). */
VnNtbPort *vn_ntbport_kmod_open(const char *path, GError **error);
VnNtbPort *vn_ntbport_pair_open(const char *key, unsigned side, GError **error);

#endif /* VN_NTBPORT_H */
