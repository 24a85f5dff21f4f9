/*
 * The simulated NTB's ports (ntbdev.c) and how their windows are mapped (ntbdev-map.c).
 *
 * Mapped windows: where a port's window reaches the peer's RAM (the peer's translation lies
 * in one file of the peer QEMU's DMA table, in at most VN_WIRE_REGION_MAP_MAX_EXTENTS pieces,
 * mapped for reading and writing), the
 * port's client is asked to map the window onto that memory itself (vn_server_region_map():
 * QEMU's patch 0008), so the guest's loads and stores there need no message; elsewhere (no
 * translation, the link or the peer away, bus mastering off, a BAR of another device of the
 * peer's, a client without the extension) every access stays a message, as before.  Each
 * event that can move a window's target (a command or config write of either port, a reset,
 * a client's coming or going, the peer's DMA table changing) checks both ports' windows.
 * When the peer unmaps memory a window is mapped onto, its DMA_UNMAP is answered only once
 * the client has taken the window back (vfio-user: after the answer, nothing may reach that
 * memory): a client that never answers holds the unmap until it goes.
 *
 * What it costs: the client is handed an fd of the peer's whole guest RAM (a memfd cannot be
 * handed out in part), so a test's two QEMUs can reach each other's memory.  That is the
 * simulated hardware's reach, not a guest's: the guest still reaches only the window.
 */
#ifndef VN_NTBDEV_INT_H
#define VN_NTBDEV_INT_H

#include "ntbdev.h"
#include "pcicfg.h"

#include <sys/types.h>

/* One window's target, as a client was asked to map it (on: mapped; else trapped). */
typedef struct NtbTarget {
    bool on;
    uint64_t iova, len; /* the peer's addresses it reaches */
    dev_t dev;          /* the peer's file they are in */
    ino_t ino;
    unsigned extents; /* how many pieces of it, and a hash of where they are */
    uint64_t where;
} NtbTarget;

typedef struct NtbPort NtbPort;

typedef struct NtbWindowMap {
    NtbPort *port;
    unsigned mw;
    NtbTarget now;     /* what the client was last asked */
    NtbTarget refused; /* a target the client refused: not asked again */
    unsigned asked;    /* asks unanswered */
    uint64_t maps, traps, refusals;
} NtbWindowMap;

struct NtbPort {
    VnNtbDev *dev;
    unsigned index;
    VnPciCfg *cfg;
    uint8_t msix[VN_EPF_MSIX_SIZE];
    VnServer *server; /* borrowed; NULL when detached */
    VnDma *dma;       /* the server's */
    VnIrqs *irqs;
    /* DMA the client did for us; refused by it (an address nothing decodes there: what a
     * real host sees as an unsupported request); not answered (a busy TCG VM: no answer in
     * time, or its own commands piled up while we waited, or it went). */
    uint64_t p2p_reads, p2p_writes, p2p_failures, p2p_unanswered;
    NtbWindowMap map[VN_EPF_MAX_WINDOWS];
};

struct VnNtbDev {
    VnEpf *epf;
    VnEpfLayout layout;
    VnDeviceInfo info;
    NtbPort port[2];
    /* DMA_UNMAPs of the peer's that wait for a window to be taken back (NtbOwed *). */
    GQueue owed;
    /* Bumped by every event that may move a target: a trapped access looks again only
     * when something changed since its window was last looked at. */
    uint64_t epoch;
    uint64_t looked[2][VN_EPF_MAX_WINDOWS];
    bool trap_all; /* vn_ntbdev_set_mapping(false) */
};

/* Look at every window of both ports again (after an event that may move a target). */
void vn_ntbdev_map_sync(VnNtbDev *d);
/* Port @q's client mapped [iova, iova + size): windows of the other port whose translation
 * it touches may be mapped now. */
void vn_ntbdev_map_mapped(NtbPort *q, uint64_t iova, uint64_t size);
/* Port @q's client unmaps [iova, iova + size) (@all: everything): windows of the other port
 * mapped onto it are taken back first, and the unmap's answer waits for that. */
void vn_ntbdev_map_unmapping(NtbPort *q, uint64_t iova, uint64_t size, bool all);
/* An access of @p's trapped window @mw: map it, if it can be, once per change. */
void vn_ntbdev_map_trapped(NtbPort *p, unsigned mw);
/* @p's client went (its mappings with it); the unmaps it owed are nobody's now. */
void vn_ntbdev_map_client_gone(NtbPort *p);
/* Drop what waits (the device is going). */
void vn_ntbdev_map_clear(VnNtbDev *d);
/* Counters of @p's windows, appended to a stats JSON object being built. */
void vn_ntbdev_map_stats(NtbPort *p, GString *s);

#endif /* VN_NTBDEV_INT_H */
