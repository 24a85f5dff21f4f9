/*
 * libFuzzer target for vfio-ntbd's QMP reader (daemon/qmp.c): whatever QEMU
 * answers on its monitor (greeting, replies, events, junk) while the daemon
 * asks for device_del.  The bytes are QEMU's side of a socketpair, then its
 * end of the stream; the reader must succeed or fail with an error, never
 * crash, and never wait (everything is there already).
 */
#include "daemon/qmp.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(GError) error = NULL;
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        abort();
    }
    /* -max_len keeps this far below a socket buffer: one send takes it. */
    if (size > 0 && send(sv[1], data, size, MSG_NOSIGNAL) != (ssize_t)size) {
        abort();
    }
    shutdown(sv[1], SHUT_WR);
    if (!vn_qmp_device_del_fd(sv[0], "ntb0", &error) && error == NULL) {
        abort(); /* a failure says why */
    }
    close(sv[0]);
    close(sv[1]);
    return 0;
}
