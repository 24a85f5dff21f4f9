/*
 * File descriptors over UNIX stream sockets (SCM_RIGHTS): the part of
 * recvmsg/sendmsg that the vfio-user transport and the shm fabric share.
 *
 * Receiving is one non-blocking recvmsg that keeps at most @cap fds and
 * closes the rest, so a peer that sends too many cannot make us hold them;
 * the caller learns of it through *overflow and refuses the message.
 */
#ifndef VN_FDPASS_H
#define VN_FDPASS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* fds one control message may carry in either direction (both users need
 * at most 16, plus one to notice a peer that sends more). */
#define VN_FDPASS_MAX 32u

/*
 * Read what is there (MSG_DONTWAIT) into @dst.  Received fds are appended
 * to fds[*nfds..@cap); beyond that they are closed and *overflow is set
 * (also when the kernel truncated the control data).  Returns bytes read,
 * 0 when nothing was there, -ECONNRESET at end of stream, or -errno.
 */
ssize_t vn_fdpass_recv(int sock, void *dst, size_t len, int *fds, unsigned cap, unsigned *nfds,
                       bool *overflow);

/*
 * One sendmsg of @iov with @nfds fds (<= VN_FDPASS_MAX, borrowed) attached.
 * Returns bytes sent (maybe fewer than asked: the caller sends the rest
 * without fds) or -errno; EINTR is retried.
 */
ssize_t vn_fdpass_send(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                       unsigned nfds);
/* The same with sendmsg() @flags besides MSG_NOSIGNAL (MSG_DONTWAIT: -EAGAIN when the socket
 * takes nothing now). */
ssize_t vn_fdpass_send_flags(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                             unsigned nfds, int flags);

#endif /* VN_FDPASS_H */
