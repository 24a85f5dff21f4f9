/*
 * A worker's privileges, given up (see privs.h).
 */
#define G_LOG_DOMAIN "vfio-ntb"

#include "privs.h"

#include <errno.h>
#include <gio/gio.h>
#include <grp.h>
#include <sys/prctl.h>
#include <unistd.h>

bool vn_privs_parse_run_as(const char *text, VnPrivs *p, GError **error)
{
    g_auto(GStrv) parts = text != NULL ? g_strsplit(text, ":", 3) : NULL;
    guint64 uid, gid;

    if (parts == NULL || g_strv_length(parts) != 2 ||
        !g_ascii_string_to_unsigned(parts[0], 10, 1, G_MAXINT32, &uid, NULL) ||
        !g_ascii_string_to_unsigned(parts[1], 10, 1, G_MAXINT32, &gid, NULL)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "--run-as must be UID:GID, neither 0, not \"%.40s\"", text != NULL ? text : "");
        return false;
    }
    p->drop = true;
    p->uid = (uid_t)uid;
    p->gid = (gid_t)gid;
    return true;
}

static bool become(const VnPrivs *p, GError **error)
{
    uid_t r, e, s;

    if (setgroups(0, NULL) < 0 || setresgid(p->gid, p->gid, p->gid) < 0 ||
        setresuid(p->uid, p->uid, p->uid) < 0) {
        int err = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(err),
                    "privileges: cannot become uid %u gid %u: %s", (unsigned)p->uid,
                    (unsigned)p->gid, g_strerror(err));
        return false;
    }
    /* No way back: a uid of 0 left anywhere would give the capabilities back. */
    if (getresuid(&r, &e, &s) < 0 || r != p->uid || e != p->uid || s != p->uid || setuid(0) == 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "privileges: uid %u did not stick",
                    (unsigned)p->uid);
        return false;
    }
    return true;
}

bool vn_privs_drop(const VnPrivs *p, GError **error)
{
    if (p->drop && !become(p, error)) {
        return false;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        int err = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(err), "privileges: no_new_privs: %s",
                    g_strerror(err));
        return false;
    }
    return true;
}
