/*
 * A worker's privileges, given up once it is set up: it becomes the worker user vfio-ntbd
 * names (--run-as UID:GID, from [node] worker-user), with no supplementary groups and, as a
 * uid other than 0, no capabilities, and can gain none back (no_new_privs: no setuid binary
 * or file capability helps it).  It keeps the fds it holds.  The borrower worker then also
 * enters its seccomp filter (borrower/sandbox.h).
 *
 * Threads: call from the process's only thread (setresuid binds the calling thread only
 * under some libcs; GLib's helper threads must not have started).
 */
#ifndef VN_PRIVS_H
#define VN_PRIVS_H

#include <glib.h>
#include <stdbool.h>
#include <sys/types.h>

typedef struct VnPrivs {
    bool drop; /* become @uid/@gid (false: stay who we are) */
    uid_t uid;
    gid_t gid;
} VnPrivs;

/* "UID:GID" (vfio-ntbd's --run-as) into @p; false with @error for anything else, a uid or
 * gid of 0 included (uid 0 keeps its capabilities, gid 0 root's files). */
bool vn_privs_parse_run_as(const char *text, VnPrivs *p, GError **error);
/* Give them up: @p's user (when @p->drop), then no_new_privs.  False with @error when any
 * step fails: the caller must then not serve (it exits). */
bool vn_privs_drop(const VnPrivs *p, GError **error);

#endif /* VN_PRIVS_H */
