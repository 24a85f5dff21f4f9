/*
 * Length-prefixed records on a UNIX stream socket, with at most one fd each
 * (SCM_RIGHTS on the record's first byte): the framing the shm backend
 * speaks between nodes and the host backend between a worker and its
 * daemon.  A record is a u32 little-endian length, then that many bytes.
 *
 * Reading never blocks (one record's state per connection), so a peer that
 * sends half a record stalls nothing; lengths are checked before the bytes
 * are read, so a peer cannot make us allocate more than the caller allows.
 */
#ifndef VN_RECORD_H
#define VN_RECORD_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* fds a record may bring: one; the second slot shows a peer sent more. */
#define VN_RECORD_MAX_FDS 2

/* A record as it arrived: @buf (len bytes) and @fds are the receiver's.
 * @overflow: more fds came than fds[] holds (those beyond were closed). */
typedef struct VnRecord {
    uint8_t *buf;
    uint32_t len;
    int fds[VN_RECORD_MAX_FDS];
    unsigned nfds;
    bool overflow;
} VnRecord;

/* One connection's record in progress; zero-initialised to start. */
typedef struct VnRecordReader {
    uint8_t len_buf[4];
    size_t len_got;
    uint8_t *buf; /* need bytes, once the length is in */
    uint32_t need;
    size_t got;
    int fds[VN_RECORD_MAX_FDS];
    unsigned nfds;
    bool fds_overflow;
} VnRecordReader;

/*
 * Read toward one record from the non-blocking socket @fd.  Returns 1 with
 * the record in @out (@r is ready for the next), 0 when @fd has no more for
 * now, -EMSGSIZE for a length above @max_len (in r->need; the stream cannot
 * be trusted past it), or -errno (-ECONNRESET at the end of the stream).
 */
int vn_record_step(VnRecordReader *r, int fd, uint32_t max_len, VnRecord *out);
/* Free what a record in progress holds. */
void vn_record_reader_clear(VnRecordReader *r);

/*
 * Send one record of @len bytes (at most @max_len) with @nfds (0 or 1) fds
 * on a blocking socket bounded by SO_SNDTIMEO: 0, -EMSGSIZE, -EINVAL, or
 * the socket's -errno (part of the record may be out then).
 */
int vn_record_send(int fd, const void *buf, size_t len, size_t max_len, const int *fds,
                   unsigned nfds);

/* The same, without waiting, for a small record (VN_RECORD_MAX_FRESH bytes at most) on a
 * socket nothing was sent on yet (a greeting, a FETCH, its answer): a fresh socket's buffer
 * takes it whole, or it is -EAGAIN (and the stream unusable). */
#define VN_RECORD_MAX_FRESH 4096
int vn_record_send_fresh(int fd, const void *buf, size_t len, const int *fds, unsigned nfds);

/* A blocking UNIX stream socket connected to @path, sends bounded by
 * @send_timeout_s (SO_SNDTIMEO, which bounds connect() too), or -errno. */
int vn_record_dial(const char *path, int send_timeout_s);

/*
 * Records sent without blocking (record-out.c), on a connected stream socket @sock
 * (borrowed): what the socket does not take at once waits, in order, and goes as it
 * drains, from @ctx's loop.  @fail (once, from a send or the loop, as the last thing done
 * with the queue: it may free it) says the stream is lost: more than @max_queued bytes
 * would wait (-ENOBUFS), the socket took nothing for @stall_ms (-ETIMEDOUT: a peer that
 * stopped reading), or it failed (-errno).  The caller then ends the connection.
 * send: a record of @len bytes (at most @max_len) and @fd (borrowed, -1 for none: a dup
 * waits with it); 0 (sent or queued), -EMSGSIZE (nothing sent), -errno of the dup (nothing
 * sent), or the stream's loss (-ENOBUFS, -EPIPE after it, -errno).
 */
typedef struct VnRecordOut VnRecordOut;
typedef void (*VnRecordOutFailFn)(void *opaque, int err);
VnRecordOut *vn_record_out_new(int sock, GMainContext *ctx, size_t max_queued, unsigned stall_ms,
                               VnRecordOutFailFn fail, void *opaque);
int vn_record_out_send(VnRecordOut *o, const void *buf, size_t len, size_t max_len, int fd);
/* Send what waits, as far as the socket takes it now, for a caller that waits on the socket
 * outside the loop (its writable source does not run then): 0, or the stream's loss (said to
 * @fail first). */
int vn_record_out_flush(VnRecordOut *o);
/* Bytes waiting for the socket. */
size_t vn_record_out_queued(const VnRecordOut *o);
/* What @fail's @err says of the peer, for a log line ("it reads nothing", ...). */
const char *vn_record_out_why(int err);
void vn_record_out_free(VnRecordOut *o);

#endif /* VN_RECORD_H */
