/*
 * libFuzzer target for the shm fabric's record reader (fabric/shm.c): what
 * a connecting node sends on a node socket (a HELLO or a FETCH record, then
 * length-prefixed frames, which must come without fds), or what the
 * answer to our own FETCH brings (one reply record, with an fd).  The bytes
 * go through a real socketpair, in chunks, some with fds attached, and are
 * read the way a connection reads them: vn_record_step() after every
 * chunk, the first record checked as a HELLO, the others decoded as frames
 * (or, for an answer, each checked as one).  Nothing may crash, leak an fd
 * or hand up a record beyond the limits.
 *
 * Input: byte 0 fds per attachment, byte 1 chunk size (0: all at once),
 * byte 2 which chunks carry fds (bit i for chunk i mod 8), byte 3 bit 0:
 * read as a fetch's answer, then the stream.
 */
#include "common/fdpass.h"
#include "common/util.h"
#include "fabric/frame.h"
#include "fabric/record.h"
#include "fabric/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Two more than a record may carry: one to notice, one beyond. */
#define MAX_SENT_FDS (VN_RECORD_MAX_FDS + 2)

typedef struct Reader {
    VnRecordReader r;
    int fd;
    bool answer; /* a fetch's answer, not an accepted connection */
    bool named;
    bool gone; /* the connection would have been dropped */
} Reader;

static VnShmRecordKind kind_of(const Reader *rd)
{
    if (rd->answer) {
        return VN_SHM_RECORD_FETCH_REPLY;
    }
    return rd->named ? VN_SHM_RECORD_FRAME : VN_SHM_RECORD_FIRST;
}

static void handle(Reader *rd, VnRecord *rec)
{
    VnFabricFrame f;

    if (rec->len > vn_shm_record_max(kind_of(rd)) || rec->nfds > G_N_ELEMENTS(rec->fds)) {
        abort(); /* the reader let through what it must refuse */
    }
    if (rd->answer) {
        rd->gone = true; /* one answer, then the connection is closed */
    } else if (!rd->named) {
        char peer[VN_MAX_NODE_NAME + 1];
        VnShmFetch fetch;
        g_autofree char *why =
            vn_shm_hello_check(rec->buf, rec->len, rec->nfds, rec->overflow, "fuzz", peer, &fetch);

        rd->named = why == NULL && fetch.hello.magic == 0;
        /* A fetch is answered and closed. */
        rd->gone = !rd->named;
    } else if (rec->nfds > 0 || rec->overflow) {
        rd->gone = true; /* frames carry no fds: the link is dropped */
    } else {
        (void)vn_fabric_frame_decode(rec->buf, rec->len, &f);
    }
    vn_util_close_fds(rec->fds, rec->nfds);
    g_free(rec->buf);
}

/* Read what the socket holds, as one wake-up of the connection would. */
static void drain(Reader *rd)
{
    while (!rd->gone) {
        VnRecord rec;
        int ret = vn_record_step(&rd->r, rd->fd, vn_shm_record_max(kind_of(rd)), &rec);

        if (ret <= 0) {
            rd->gone = ret < 0;
            return;
        }
        handle(rd, &rec);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int devnull = -1;
    int fds[MAX_SENT_FDS];
    unsigned nfds;
    size_t chunk;
    uint8_t mask;
    Reader rd = { .fd = -1 };
    int sv[2];

    if (size < 4) {
        return 0;
    }
    if (devnull < 0) {
        devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    nfds = data[0] % (MAX_SENT_FDS + 1);
    chunk = data[1] != 0 ? data[1] : size;
    mask = data[2];
    rd.answer = data[3] & 1;
    data += 4;
    size -= 4;
    for (unsigned i = 0; i < nfds; i++) {
        fds[i] = devnull;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
        abort();
    }
    rd.fd = sv[1];
    for (size_t off = 0, i = 0; off < size && !rd.gone; off += chunk, i++) {
        struct iovec iov = { (void *)(data + off), MIN(chunk, size - off) };
        bool with_fds = mask & (1u << (i % 8));

        if (vn_fdpass_send(sv[0], &iov, 1, fds, with_fds ? nfds : 0) != (ssize_t)iov.iov_len) {
            abort(); /* a drained socket takes a chunk this small */
        }
        drain(&rd);
    }
    /* The peer goes: what is left is read to the end of the stream. */
    shutdown(sv[0], SHUT_WR);
    drain(&rd);
    if (!rd.gone) {
        abort(); /* the end of the stream must end the reader */
    }
    vn_record_reader_clear(&rd.r);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
