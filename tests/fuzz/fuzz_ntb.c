/*
 * libFuzzer target for the ntb fabric backend's receive path (fabric/ntb.c,
 * ntb-map.c, ntb-ring.c): what a peer writes into our message ring.  A node
 * "b" runs on an emulated port pair; the fuzzer is the other end, "a": it
 * announces a session the way a peer does, writes the input into b's ring
 * as the bytes its records would be (after a u32: how many bytes it says it
 * wrote), rings the doorbell and lets b's loop run.  b has a segment
 * exported to a, so maps are answered.  Nothing may crash, hang or leak;
 * whatever b refuses ends the session only.
 */
#include "common/peerfd.h"
#include "fabric/fabric.h"
#include "fabric/ntb.h"
#include "fabric/ntbport.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RING VN_NTB_MIN_RING
#define EPOCH 0x1234u

static VnFabric *b;

static void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    vn_fabric_reply_error(b, token, -EPERM, "fuzz");
}

static const VnFabricHandlers handlers = { .on_request = on_request };

static VnFabric *node_b(GMainContext *ctx)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    VnFabric *fab;

    g_hash_table_insert(params, "ports", "pair:fuzz/1=a");
    g_hash_table_insert(params, "ring-size", G_STRINGIFY(65536));
    fab = vn_fabric_open("ntb", "b", params, &handlers, NULL, ctx, NULL);
    if (fab == NULL) {
        abort();
    }
    return fab;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(GMainContext) ctx = g_main_context_new();
    VnNtbPort *a = vn_ntbport_open("pair:fuzz/0", NULL);
    uint64_t offset = 0, wsize = 0, bytes;
    uint8_t *mine = NULL, *theirs;
    uint32_t hello = 0, claimed;
    int fd, memfd;

    if (a == NULL || size < 4) {
        vn_ntbport_close(a);
        return 0;
    }
    /* a's side of a session: a buffer and an epoch, announced. */
    if (a->ops->in_alloc(a, 0, VN_NTB_RING_DATA + RING, &mine) < 0 ||
        a->ops->peer_spad_write(a, VN_NTB_SPAD_PAGES, (VN_NTB_RING_DATA + RING) / 4096) < 0 ||
        a->ops->peer_spad_write(a, VN_NTB_SPAD_HELLO, VN_NTB_SPAD_MAGIC << 16 | EPOCH) < 0) {
        abort();
    }
    b = node_b(ctx);
    memfd = vn_peerfd_memfd_new("fuzz-segment", 4096);
    if (memfd < 0 || vn_fabric_segment_export(b, memfd, 4096, "a", NULL) == 0) {
        abort();
    }
    /* b answered at once: its announcement is in our scratchpads. */
    if (a->ops->spad_read(a, VN_NTB_SPAD_HELLO, &hello) < 0 || hello >> 16 != VN_NTB_SPAD_MAGIC) {
        abort();
    }
    fd = a->ops->out_fd(a, 0, true, &offset, &wsize);
    if (fd < 0) {
        abort();
    }
    bytes = VN_NTB_RING_DATA + 65536;
    theirs = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    close(fd);
    if (theirs == MAP_FAILED) {
        abort();
    }
    memcpy(&claimed, data, sizeof(claimed));
    data += 4;
    size = MIN(size - 4, (size_t)65536);
    memcpy(theirs + VN_NTB_RING_DATA, data, size);
    __atomic_store_n((uint64_t *)theirs,
                     (uint64_t)vn_ntb_tag(EPOCH, (uint16_t)hello) << 48 | claimed,
                     __ATOMIC_RELEASE);
    a->ops->peer_doorbell(a, UINT64_C(1) << VN_NTB_DB_MSG);
    for (int i = 0; i < 64 && g_main_context_iteration(ctx, FALSE); i++) {
    }
    vn_fabric_close(b);
    munmap(theirs, bytes);
    close(memfd);
    vn_ntbport_close(a);
    return 0;
}
