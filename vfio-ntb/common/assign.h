/*
 * A spare worker's assignment (assign.c).  A worker process started ahead of need (its
 * exec done, its libraries loaded) waits on a socket; when it is needed it is sent the
 * arguments and file descriptors it would have been started with, and goes on as if it had
 * been.  vfio-ntbd keeps one spare borrower worker (daemon/spare.h) so that an attach does
 * not wait for a process to start.
 *
 * One message on a SOCK_SEQPACKET socket: the arguments, each NUL-terminated, argv[0]
 * first (VN_ASSIGN_MAX_BYTES and VN_ASSIGN_MAX_ARGS at most), with exactly the fds the
 * receiver expects.  fds[i] is the one a spawn would have put at descriptor
 * VN_ASSIGN_FIRST_FD + i.
 *
 * Threads: any; each call blocks at most as its comment says.
 */
#ifndef VN_ASSIGN_H
#define VN_ASSIGN_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>

#define VN_ASSIGN_MAX_BYTES 4096
#define VN_ASSIGN_MAX_ARGS 32
#define VN_ASSIGN_MAX_FDS 4
#define VN_ASSIGN_FIRST_FD 3

/* Bytes @argv takes as one message (and in a process title): each argument and its NUL. */
size_t vn_assign_length(const char *const *argv);

/* Send @argv (NULL-terminated) and @nfds fds (borrowed) without waiting: false with @error
 * when the receiver is gone or its socket is full (it takes one assignment only), or the
 * message exceeds the bounds above. */
bool vn_assign_send(int sock, const char *const *argv, const int *fds, unsigned nfds,
                    GError **error);

/*
 * Wait for one assignment (as long as it takes: a spare has nothing else to do) with
 * exactly @nfds fds, stored in @fds.  Returns its arguments (g_strfreev), or NULL: without
 * @error set when the sender closed the socket first (no job ever comes), with @error when
 * the message breaks the bounds above (its fds closed).
 */
char **vn_assign_receive(int sock, int *fds, unsigned nfds, GError **error);

/* Put fds[i] at descriptor VN_ASSIGN_FIRST_FD + i (not close-on-exec, as a spawn leaves
 * them); the descriptors there before are closed, and so are @fds.  False with @error (what
 * was at those numbers may be gone then). */
bool vn_assign_install(const int *fds, unsigned nfds, GError **error);

/*
 * Retitle the process: what /proc/PID/cmdline (and ps) shows becomes @argv in place of the
 * @argc arguments @orig it was started with, written over their strings (from orig[0] to
 * the end of orig[argc - 1]; the rest filled with NULs).  A spare is started with room for
 * it.  False, nothing changed, when @argv does not fit or the strings are not one area.
 */
bool vn_assign_retitle(int argc, char **orig, const char *const *argv);

#endif /* VN_ASSIGN_H */
