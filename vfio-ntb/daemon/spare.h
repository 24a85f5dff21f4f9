/*
 * The spare borrower worker (spare.c).  Starting a worker process for an attach costs a
 * fork, an exec and loading its libraries: about a third of what a VM waits for its
 * device.  So once this host has attached a device, vfio-ntbd keeps one worker started
 * ahead of need (vfio-ntb-borrower --spare-fd, borrower/worker.c), idle on a socket, and
 * the next attach gives it its arguments and fds (common/assign.h) instead of starting one.
 * A spare costs memory (its libraries, a few MiB) and no CPU: it sleeps in one read.
 *
 * A spare is nobody's worker until it is given a device: the state file does not name it,
 * and when the daemon goes its socket closes and it exits (a restarted daemon starts its
 * own).  Once given a device it is that device's worker like any other (its command line
 * says so: it rewrote it).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_SPARE_H
#define VN_SPARE_H

#include <glib.h>
#include <stdbool.h>

/* Room a spare's command line keeps for the one it is given (a worker's is under 1 KiB:
 * its paths are socket paths, each under 108 bytes). */
#define VN_SPARE_TITLE_ROOM 1536

typedef struct VnSpare VnSpare;

/* None started yet: vn_spare_fill() starts one.  @node and @run_dir name whose it is (in
 * its command line, for an operator and a restarted daemon's stray search). */
VnSpare *vn_spare_new(const char *node, const char *run_dir);
/* Its socket closes: a spare that waits exits. */
void vn_spare_free(VnSpare *s);

/* Start a spare of @binary if none waits, without waiting for it: false with @error when it
 * cannot be started (nothing changes: the next attach starts its worker itself). */
bool vn_spare_fill(VnSpare *s, const char *binary, GError **error);

/*
 * Hand the waiting spare its job: @argv (argv[0] the binary it must be; NULL-terminated)
 * and @nfds fds (borrowed; fds[i] is what a spawn would put at descriptor 3 + i).  Returns
 * its pid, the caller's child from now on (to watch and reap), or 0 when no spare could
 * take it: none waits, it runs another binary, @argv does not fit its command line, or it
 * died meanwhile.  The caller then starts a worker itself.
 */
GPid vn_spare_give(VnSpare *s, const char *const *argv, const int *fds, unsigned nfds);

#endif /* VN_SPARE_H */
