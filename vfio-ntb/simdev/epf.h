/*
 * A simulated non-transparent bridge: two PCI functions ("ports", one in each host) joined
 * by an NTB, with the register interface that Linux's unmodified ntb_hw_epf driver programs
 * (drivers/ntb/hw/epf/ntb_hw_epf.c, the host side of a PCI endpoint NTB function; we take its
 * Freescale 1957:0809 BAR map).  What the endpoint's firmware does on real hardware, this
 * model does: it runs the commands, raises the interrupts and translates the windows.
 *
 * Each port has, as that driver expects:
 *   BAR0  control registers (command, argument, status, link, window translation, counts,
 *         the doorbell table) and the scratchpads: the port's own at VN_EPF_SPAD_OFFSET,
 *         then the peer's (reading or writing there is reading or writing the peer's own).
 *   BAR2  doorbells: a write to entry N (VN_EPF_DB_ENTRY_SIZE bytes each) raises the
 *         peer's interrupt vector N.  Vector 0 is the link event, vector 1 is never used
 *         (ntb_hw_epf skips it), vectors 2.. are doorbell bits 0...
 *   BAR4  the memory window (64-bit, prefetchable): an access at offset O lands at the
 *         peer's translation for it (CMD_CONFIGURE_MW on the peer: address A, size S) as a
 *         DMA by the peer's function to A + O, when O is inside S.  That DMA goes through
 *         the peer host's IOMMU like any device's (VnEpfOps.dma_read/dma_write).
 *   With two windows (MW_COUNT 2), BAR4 and BAR5 are one each, 32-bit prefetchable (the
 *   map has window 2 in BAR5), translated each by its own CMD_CONFIGURE_MW on the peer.
 *   and MSI-X (the caller's config space and table), up to VN_EPF_MAX_VECTORS vectors.
 *
 * With three windows the port takes ntb_hw_epf's other map, TI J721E's (104c:b00d), the one
 * that has room for them: BAR0 control and its own scratchpads, BAR1 the peer's scratchpads
 * (and MSI-X after them), BAR2 the doorbells then window 1 (MW1_OFFSET says where: its second
 * half), BAR3 window 2 (32-bit), BAR4 window 3 (64-bit).  Windows may differ in size (a small
 * one for messages, large ones for a GPU's memory); vn_epf_layout() says where each part is.
 *
 * The link is up while both ports are connected (a host is there) and both asked for it
 * (CMD_LINK_UP); each change raises vector 0 on the ports that configured their doorbells.
 *
 * Everything a host writes is checked: bad commands answer COMMAND_STATUS_ERROR, accesses
 * outside a window or to a peer that is absent read as all ones and drop writes, and each
 * is counted.  No I/O here: interrupts and DMA go through VnEpfOps.
 *
 * Threads: one (the caller's); nothing here locks.
 */
#ifndef VN_EPF_H
#define VN_EPF_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* ntb_hw_epf binds to these (its mx8_map: config and peer scratchpads in BAR0, doorbells in
 * BAR2, the window in BAR4), class memory controller / RAM (PCI_CLASS_MEMORY_RAM << 8). */
#define VN_EPF_VENDOR_ID 0x1957u
#define VN_EPF_DEVICE_ID 0x0809u
#define VN_EPF_CLASS 0x050000u

#define VN_EPF_CTRL_BAR 0u
#define VN_EPF_MSIX_BAR 1u
#define VN_EPF_DB_BAR 2u
#define VN_EPF_WINDOW_BAR 4u

#define VN_EPF_CTRL_SIZE 4096u
#define VN_EPF_DB_SIZE 4096u
/* Scratchpads: the port's own, then the peer's (ntb_hw_epf finds the peer's right after). */
#define VN_EPF_SPAD_OFFSET 0x200u
#define VN_EPF_SPADS 64u
/* ntb_hw_epf asks for 4..32 vectors (link + reserved + doorbells); its table has 32. */
#define VN_EPF_MAX_VECTORS 32u
#define VN_EPF_DB_ENTRY_SIZE 4u
/* Window sizes we accept: a page at least (the translation's alignment, mw_get_align), and
 * at most what one host lends in a window (a 64-bit BAR). */
#define VN_EPF_MIN_WINDOW (4ull << 10)
#define VN_EPF_MAX_WINDOW (64ull << 30)
/* Windows a port may have: mx8's two (BAR4, BAR5), j721e's three; a 32-bit BAR is 1 GiB
 * at most. */
#define VN_EPF_MAX_WINDOWS 3u
#define VN_EPF_MAX_WINDOW32 (1ull << 30)
/* The j721e map's ids (three windows). */
#define VN_EPF_J721E_VENDOR_ID 0x104cu
#define VN_EPF_J721E_DEVICE_ID 0xb00du
#define VN_EPF_BARS 6u

/* Where a port's parts are, in the map its window count chose. */
typedef struct VnEpfLayout {
    uint16_t vendor_id, device_id;
    uint64_t bar_size[VN_EPF_BARS]; /* 0: no BAR there */
    bool bar_is64[VN_EPF_BARS];
    bool bar_prefetch[VN_EPF_BARS];
    unsigned peer_spad_bar; /* VN_EPF_CTRL_BAR (the peer's after ours) or 1 (from 0) */
    unsigned msix_bar;
    uint64_t msix_offset; /* the table; the PBA VN_EPF_PBA_OFFSET after it */
    unsigned window_bar[VN_EPF_MAX_WINDOWS];
    uint64_t window_offset[VN_EPF_MAX_WINDOWS]; /* in its BAR */
} VnEpfLayout;
#define VN_EPF_MSIX_SIZE 4096u /* the table and the PBA */
#define VN_EPF_PBA_OFFSET 0x800u
/* The peer's scratchpads in BAR0 (mx8), after ours. */
#define VN_EPF_PEER_SPAD_OFFSET (VN_EPF_SPAD_OFFSET + 4u * VN_EPF_SPADS)
/* The largest access a host makes at once (a trapped load or store). */
#define VN_EPF_MAX_ACCESS 8u

/* Registers of BAR0 (ntb_hw_epf.c's NTB_EPF_*). */
enum {
    VN_EPF_REG_COMMAND = 0x00,
    VN_EPF_REG_ARGUMENT = 0x04,
    VN_EPF_REG_CMD_STATUS = 0x08,  /* 16 bits */
    VN_EPF_REG_LINK_STATUS = 0x0a, /* 16 bits, read-only */
    VN_EPF_REG_TOPOLOGY = 0x0c,
    VN_EPF_REG_LOWER_ADDR = 0x10,
    VN_EPF_REG_UPPER_ADDR = 0x14,
    VN_EPF_REG_LOWER_SIZE = 0x18,
    VN_EPF_REG_UPPER_SIZE = 0x1c,
    VN_EPF_REG_MW_COUNT = 0x20,
    VN_EPF_REG_MW1_OFFSET = 0x24,
    VN_EPF_REG_SPAD_OFFSET = 0x28,
    VN_EPF_REG_SPAD_COUNT = 0x2c,
    VN_EPF_REG_DB_ENTRY_SIZE = 0x30,
    VN_EPF_REG_DB_DATA = 0x34,   /* + 4 * n */
    VN_EPF_REG_DB_OFFSET = 0xb4, /* + 4 * n */
};

typedef enum VnEpfCommand {
    VN_EPF_CMD_NONE = 0,
    VN_EPF_CMD_CONFIGURE_DOORBELL = 1,
    VN_EPF_CMD_TEARDOWN_DOORBELL = 2,
    VN_EPF_CMD_CONFIGURE_MW = 3,
    VN_EPF_CMD_TEARDOWN_MW = 4,
    VN_EPF_CMD_LINK_UP = 5,
    VN_EPF_CMD_LINK_DOWN = 6,
    VN_EPF_CMD_LAST
} VnEpfCommand;

#define VN_EPF_STATUS_OK 1u
#define VN_EPF_STATUS_ERROR 2u
#define VN_EPF_ARG_MSIX 0x10000u

const char *vn_epf_command_to_string(VnEpfCommand cmd);

typedef struct VnEpfOps {
    /* Raise interrupt @vector of @port (< the count it configured). */
    void (*signal)(void *opaque, unsigned port, uint32_t vector);
    /* A DMA by @port's function at @addr of its host (through its IOMMU): 0, or -errno
     * when nothing is there. */
    int (*dma_read)(void *opaque, unsigned port, uint64_t addr, void *buf, uint32_t len);
    int (*dma_write)(void *opaque, unsigned port, uint64_t addr, const void *buf, uint32_t len);
    /* Optional: may @port's function master the bus now (its Bus Master Enable)? */
    bool (*bus_master)(void *opaque, unsigned port);
} VnEpfOps;

/* Names the missing required member in @error. */
bool vn_epf_ops_valid(const VnEpfOps *ops, GError **error);

/* Counters of one port. */
typedef struct VnEpfStats {
    uint64_t commands; /* commands run (OK or not) */
    uint64_t command_errors;
    uint64_t doorbells;      /* doorbells this port rang on its peer */
    uint64_t doorbells_lost; /* rung at a vector the peer had not configured */
    uint64_t window_reads;   /* accesses through this port's window ... */
    uint64_t window_writes;
    uint64_t window_faults; /* ... that reached nothing (no translation, outside it,
                                 * the peer absent or not mastering, or the DMA failed) */
    uint64_t link_events;   /* link interrupts raised on this port */
    uint64_t link_ups;      /* CMD_LINK_UP run on this port */
    uint64_t link_downs;    /* CMD_LINK_DOWN run on this port */
    uint64_t resets;        /* the port reset (FLR, DEVICE_RESET, its host gone) */
    uint64_t connects;      /* a host connected to this port */
    bool connected;         /* a host is connected now */
    bool link_wanted;       /* its host asked for the link and did not take it down */
} VnEpfStats;

typedef struct VnEpf VnEpf;

/* A pair of ports with @windows (1..VN_EPF_MAX_WINDOWS) windows, window w of @sizes[w] bytes
 * (a power of two, at least VN_EPF_MIN_WINDOW, and what its BAR allows: VN_EPF_MAX_WINDOW in
 * a 64-bit BAR, VN_EPF_MAX_WINDOW32 in a 32-bit one, half that for j721e's window 1, which
 * shares BAR2 with the doorbells).  Both ports start disconnected. */
VnEpf *vn_epf_new(const uint64_t *sizes, unsigned windows, const VnEpfOps *ops, void *opaque,
                  GError **error);
void vn_epf_free(VnEpf *epf);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnEpf, vn_epf_free)

uint64_t vn_epf_window_size(VnEpf *epf, unsigned mw);
unsigned vn_epf_windows(VnEpf *epf);
void vn_epf_layout(VnEpf *epf, VnEpfLayout *out);

/* A host is there (its client connected) or gone.  Gone resets the port. */
void vn_epf_set_connected(VnEpf *epf, unsigned port, bool connected);
/* Power-on state of @port's registers, scratchpads, doorbells and translation (a reset or
 * an FLR of its function); the link goes down if it was up. */
void vn_epf_reset(VnEpf *epf, unsigned port);

/* BAR0: any size 1..VN_EPF_MAX_ACCESS at any offset inside VN_EPF_CTRL_SIZE.
 * 0, or -EINVAL outside. */
int vn_epf_ctrl_read(VnEpf *epf, unsigned port, uint64_t offset, void *buf, uint32_t len);
int vn_epf_ctrl_write(VnEpf *epf, unsigned port, uint64_t offset, const void *buf, uint32_t len);
/* BAR2: writes ring, reads return 0. */
int vn_epf_db_read(VnEpf *epf, unsigned port, uint64_t offset, void *buf, uint32_t len);
int vn_epf_db_write(VnEpf *epf, unsigned port, uint64_t offset, const void *buf, uint32_t len);
/* An access through @port's window @mw at @offset of the window (see above and the layout).  0
 * even when it reached nothing (a read then sees all ones); -EINVAL outside the BAR, for a
 * window the port does not have, or larger than VN_EPF_MAX_ACCESS. */
int vn_epf_window_read(VnEpf *epf, unsigned port, unsigned mw, uint64_t offset, void *buf,
                       uint32_t len);
int vn_epf_window_write(VnEpf *epf, unsigned port, unsigned mw, uint64_t offset, const void *buf,
                        uint32_t len);

/* Where @port's window @mw reaches now: true when the peer is there, translates the window
 * and may master the bus (what each access is checked against), with the peer's address for
 * the window's offset 0 in *@addr and how much of the window it translates in *@size (at most
 * the window's size).  What lets a caller map the window onto the peer's memory instead. */
bool vn_epf_window_reach(VnEpf *epf, unsigned port, unsigned mw, uint64_t *addr, uint64_t *size);

bool vn_epf_link_up(VnEpf *epf);
void vn_epf_stats(VnEpf *epf, unsigned port, VnEpfStats *out);

#endif /* VN_EPF_H */
