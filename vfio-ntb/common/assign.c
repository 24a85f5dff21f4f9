/*
 * A spare worker's assignment (see assign.h).
 */
#include "assign.h"

#include "fdpass.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

size_t vn_assign_length(const char *const *argv)
{
    size_t len = 0;

    for (size_t i = 0; argv[i] != NULL; i++) {
        len += strlen(argv[i]) + 1;
    }
    return len;
}

bool vn_assign_send(int sock, const char *const *argv, const int *fds, unsigned nfds,
                    GError **error)
{
    size_t len = vn_assign_length(argv), argc = g_strv_length((char **)argv);
    g_autofree char *buf = NULL;
    struct iovec iov;
    ssize_t n;
    char *p;

    if (argc == 0 || argc > VN_ASSIGN_MAX_ARGS || len > VN_ASSIGN_MAX_BYTES ||
        nfds > VN_ASSIGN_MAX_FDS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "an assignment of %zu arguments (%zu bytes) and %u fds is more than a "
                    "spare takes (%d, %d, %d)",
                    argc, len, nfds, VN_ASSIGN_MAX_ARGS, VN_ASSIGN_MAX_BYTES, VN_ASSIGN_MAX_FDS);
        return false;
    }
    p = buf = g_malloc(len);
    for (size_t i = 0; i < argc; i++) {
        size_t l = strlen(argv[i]) + 1;

        memcpy(p, argv[i], l);
        p += l;
    }
    iov = (struct iovec){ .iov_base = buf, .iov_len = len };
    n = vn_fdpass_send_flags(sock, &iov, 1, fds, nfds, MSG_DONTWAIT);
    if (n != (ssize_t)len) {
        int e = n < 0 ? (int)-n : EMSGSIZE;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e),
                    "the spare did not take its assignment: %s", g_strerror(e));
        return false;
    }
    return true;
}

/* @buf's @n bytes as arguments: NUL-terminated strings, VN_ASSIGN_MAX_ARGS at most. */
static char **split_args(const char *buf, size_t n, GError **error)
{
    g_autoptr(GPtrArray) args = g_ptr_array_new_with_free_func(g_free);

    if (n == 0 || buf[n - 1] != '\0') {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "an assignment whose arguments do not end with a NUL");
        return NULL;
    }
    for (size_t off = 0; off < n; off += strlen(buf + off) + 1) {
        if (args->len == VN_ASSIGN_MAX_ARGS) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "an assignment of more than %d arguments", VN_ASSIGN_MAX_ARGS);
            return NULL;
        }
        g_ptr_array_add(args, g_strdup(buf + off));
    }
    g_ptr_array_add(args, NULL);
    return (char **)g_ptr_array_free(g_steal_pointer(&args), FALSE);
}

char **vn_assign_receive(int sock, int *fds, unsigned nfds, GError **error)
{
    /* One byte more than allowed: a message that fills it was too long (and truncated). */
    g_autofree char *buf = g_malloc(VN_ASSIGN_MAX_BYTES + 1);
    int got[VN_ASSIGN_MAX_FDS];
    unsigned ngot = 0;
    bool overflow = false;
    char **argv;
    ssize_t n;

    g_return_val_if_fail(nfds <= VN_ASSIGN_MAX_FDS, NULL);
    for (;;) {
        struct pollfd p = { .fd = sock, .events = POLLIN };

        if (poll(&p, 1, -1) < 0 && errno != EINTR) {
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                        "waiting for an assignment: %s", g_strerror(errno));
            return NULL;
        }
        n = vn_fdpass_recv(sock, buf, VN_ASSIGN_MAX_BYTES + 1, got, VN_ASSIGN_MAX_FDS, &ngot,
                           &overflow);
        if (n != 0) {
            break; /* 0: woken for nothing */
        }
    }
    if (n == -ECONNRESET) {
        return NULL; /* the sender went: no job comes */
    }
    if (n < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno((int)-n),
                    "waiting for an assignment: %s", g_strerror((int)-n));
        return NULL;
    }
    argv = n <= VN_ASSIGN_MAX_BYTES ? split_args(buf, (size_t)n, error) : NULL;
    if (n > VN_ASSIGN_MAX_BYTES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "an assignment of more than %d bytes", VN_ASSIGN_MAX_BYTES);
    } else if (argv != NULL && (overflow || ngot != nfds)) {
        g_clear_pointer(&argv, g_strfreev);
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "an assignment with %s%u fds, not %u", overflow ? "more than " : "", ngot,
                    nfds);
    }
    if (argv == NULL) {
        vn_util_close_fds(got, ngot);
        return NULL;
    }
    memcpy(fds, got, sizeof(int) * nfds);
    return argv;
}

bool vn_assign_install(const int *fds, unsigned nfds, GError **error)
{
    /* Each moved above the target numbers first, so no fd lands on one still to be moved. */
    int high[VN_ASSIGN_MAX_FDS];
    unsigned moved = 0;
    bool ok = true;

    g_return_val_if_fail(nfds <= VN_ASSIGN_MAX_FDS, false);
    for (; moved < nfds; moved++) {
        high[moved] = fcntl(fds[moved], F_DUPFD_CLOEXEC, VN_ASSIGN_FIRST_FD + VN_ASSIGN_MAX_FDS);
        if (high[moved] < 0) {
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                        "moving an assigned fd: %s", g_strerror(errno));
            ok = false;
            break;
        }
    }
    for (unsigned i = 0; i < nfds; i++) {
        close(fds[i]);
    }
    for (unsigned i = 0; ok && i < nfds; i++) {
        if (dup2(high[i], VN_ASSIGN_FIRST_FD + (int)i) < 0) {
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                        "installing an assigned fd: %s", g_strerror(errno));
            ok = false;
        }
    }
    for (unsigned i = 0; i < moved; i++) {
        close(high[i]);
    }
    return ok;
}

bool vn_assign_retitle(int argc, char **orig, const char *const *argv)
{
    size_t room, len = vn_assign_length(argv);
    char *p;

    if (argc < 1) {
        return false;
    }
    /* The kernel shows the area the arguments were placed in: one run of strings. */
    for (int i = 1; i < argc; i++) {
        if (orig[i] != orig[i - 1] + strlen(orig[i - 1]) + 1) {
            return false;
        }
    }
    room = (size_t)(orig[argc - 1] + strlen(orig[argc - 1]) + 1 - orig[0]);
    if (len > room) {
        return false;
    }
    p = orig[0];
    for (size_t i = 0; argv[i] != NULL; i++) {
        size_t l = strlen(argv[i]) + 1;

        memmove(p, argv[i], l);
        p += l;
    }
    memset(p, 0, room - len);
    return true;
}
