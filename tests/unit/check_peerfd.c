/*
 * Unit tests of the checks of fds from peers (vfio-ntb/common/peerfd.c):
 * which fds pass as eventfds and as memory, and that our own memfds pass.
 * The receivers' refusals are tested where they receive (check_server,
 * check_fabric_untrusted, check_lender_untrusted).
 */
#include "common/peerfd.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

START_TEST(test_eventfd_kinds)
{
    int p[2], s[2];
    int efd = eventfd(0, EFD_CLOEXEC); /* blocking, as a peer may send it */
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    int mfd = vn_peerfd_memfd_new("x", 4096);

    ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s), 0);
    ck_assert_int_eq(vn_peerfd_eventfd(efd), 0);
    ck_assert(fcntl(efd, F_GETFL) & O_NONBLOCK);
    ck_assert_int_eq(vn_peerfd_eventfd(p[1]), -EINVAL);
    ck_assert_int_eq(vn_peerfd_eventfd(s[0]), -EINVAL);
    /* an anonymous inode, but no counter: fstat alone would let it in */
    ck_assert_int_eq(vn_peerfd_eventfd(tfd), -EINVAL);
    ck_assert_int_eq(vn_peerfd_eventfd(mfd), -EINVAL);
    ck_assert_int_eq(vn_peerfd_eventfd(-1), -EBADF);
    close(p[0]);
    close(p[1]);
    close(s[0]);
    close(s[1]);
    close(tfd);
    close(mfd);
    close(efd);
}
END_TEST

START_TEST(test_signal_saturated)
{
    uint64_t most = UINT64_C(0xfffffffffffffffe), n = 0;
    int efd = eventfd(0, EFD_CLOEXEC);

    ck_assert_int_eq(vn_peerfd_eventfd(efd), 0);
    ck_assert_int_eq(vn_peerfd_signal(efd), 0);
    ck_assert_int_eq(read(efd, &n, sizeof(n)), sizeof(n));
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(write(efd, &most, sizeof(most)), sizeof(most));
    ck_assert_int_eq(vn_peerfd_signal(efd), -EAGAIN); /* dropped, not waited for */
    close(efd);
}
END_TEST

START_TEST(test_memory_kinds)
{
    g_autofree char *dir = g_dir_make_tmp("vn-peerfd-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "ram", NULL);
    int sealed = vn_peerfd_memfd_new("sealed", 0x10000);
    int unsealed = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int nosealing = memfd_create("nosealing", MFD_CLOEXEC); /* F_SEAL_SEAL only */
    int file = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    int efd = eventfd(0, EFD_CLOEXEC);
    const char *why = NULL;

    ck_assert_int_eq(ftruncate(unsealed, 0x10000), 0);
    ck_assert_int_eq(ftruncate(nosealing, 0x10000), 0);
    ck_assert_int_eq(ftruncate(file, 0x10000), 0);

    ck_assert_int_eq(vn_peerfd_memory(sealed, 0, 0x10000, &why), 0);
    ck_assert_int_eq(vn_peerfd_memory(sealed, 0x8000, 0x8000, NULL), 0);
    ck_assert_int_eq(vn_peerfd_memory(sealed, 0x8000, 0x8001, &why), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "smaller"));
    ck_assert_int_eq(vn_peerfd_memory(sealed, UINT64_MAX, 2, NULL), -EINVAL); /* wraps */
    ck_assert_int_eq(vn_peerfd_memory(unsealed, 0, 0x1000, &why), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "F_SEAL_SHRINK"));
    ck_assert_int_eq(vn_peerfd_memory(nosealing, 0, 0x1000, NULL), -EINVAL);
    ck_assert_int_eq(vn_peerfd_memory(file, 0, 0x1000, &why), -EINVAL);
    ck_assert_int_eq(vn_peerfd_memory(efd, 0, 8, NULL), -EINVAL);
    /* A device's memory is a VFIO device fd's (the lender host's e2e tests
     * map real ones); nothing else passes for one. */
    ck_assert_int_eq(vn_peerfd_device_memory(sealed, 0, 0x1000, &why), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "not a VFIO device"));
    ck_assert_int_eq(vn_peerfd_device_memory(efd, 0, 8, NULL), -EINVAL);
    ck_assert_int_eq(vn_peerfd_device_memory(-1, 0, 8, &why), -EBADF);
    {
        bool device = true;

        ck_assert_int_eq(vn_peerfd_window(sealed, 0x8000, 0x8000, &device, &why), 0);
        ck_assert(!device);
        ck_assert_int_eq(vn_peerfd_window(unsealed, 0, 0x1000, &device, &why), -EINVAL);
        ck_assert(!device);
        ck_assert_ptr_nonnull(strstr(why, "F_SEAL_SHRINK"));
    }
    /* Ours cannot be shrunk or grown, and the seals cannot be undone. */
    ck_assert_int_lt(ftruncate(sealed, 0x1000), 0);
    ck_assert_int_lt(ftruncate(sealed, 0x20000), 0);
    ck_assert_int_lt(fcntl(sealed, F_ADD_SEALS, F_SEAL_WRITE), 0);
    close(sealed);
    close(unsealed);
    close(nosealing);
    close(file);
    close(efd);
    unlink(path);
    g_rmdir(dir);
}
END_TEST

static Suite *peerfd_suite(void)
{
    Suite *s = suite_create("peerfd");
    TCase *tc = tcase_create("kinds");

    tcase_add_test(tc, test_eventfd_kinds);
    tcase_add_test(tc, test_signal_saturated);
    tcase_add_test(tc, test_memory_kinds);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(peerfd_suite());
}
