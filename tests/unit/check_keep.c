/*
 * Unit tests of what a borrower worker keeps with its daemon (vfio-ntb/daemon/keep.c): the
 * fds are the store's (closed when replaced, forgotten or cleared, and when refused), keys
 * come back in order, and a worker cannot make it hold more than its bounds.
 */
#include "daemon/keep.h"

#include "check-main.h"

#include <check.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <sys/eventfd.h>
#include <unistd.h>

static bool is_open(int fd)
{
    return fcntl(fd, F_GETFD) >= 0;
}

static int new_fd(void)
{
    int fd = eventfd(0, EFD_CLOEXEC);

    ck_assert_int_ge(fd, 0);
    return fd;
}

START_TEST(test_fds_are_the_stores)
{
    g_autoptr(VnKeep) k = vn_keep_new();
    int a = new_fd(), b = new_fd(), c = new_fd();
    uint64_t keys[4];

    ck_assert(vn_keep_fd(k, 7, a, NULL));
    ck_assert(vn_keep_fd(k, 2, b, NULL));
    ck_assert_int_eq(vn_keep_get_fd(k, 7), a);
    /* Replaced: the old one is closed. */
    ck_assert(vn_keep_fd(k, 7, c, NULL));
    ck_assert(!is_open(a));
    ck_assert_int_eq(vn_keep_get_fd(k, 7), c);
    ck_assert_uint_eq(vn_keep_keys(k, keys, 4), 2);
    ck_assert_uint_eq(keys[0], 2);
    ck_assert_uint_eq(keys[1], 7);
    /* Forgotten by range: closed. */
    vn_keep_forget(k, 3, 100);
    ck_assert(!is_open(c));
    ck_assert_int_eq(vn_keep_get_fd(k, 7), -1);
    ck_assert(is_open(b));
    vn_keep_forget(k, 0, UINT64_MAX); /* everything */
    ck_assert(!is_open(b));
    ck_assert_uint_eq(vn_keep_keys(k, keys, 4), 0);
}
END_TEST

START_TEST(test_state)
{
    g_autoptr(VnKeep) k = vn_keep_new();
    g_autoptr(GBytes) st = NULL;
    g_autofree char *big = g_malloc0(VN_KEEP_MAX_STATE + 1);
    g_autoptr(GError) error = NULL;

    ck_assert_ptr_null(vn_keep_get_state(k));
    ck_assert(vn_keep_state(k, "{\"a\":1}", 7, NULL));
    ck_assert(!vn_keep_state(k, big, VN_KEEP_MAX_STATE + 1, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE));
    /* The refused one left the last in place. */
    st = vn_keep_get_state(k);
    ck_assert_uint_eq(g_bytes_get_size(st), 7);
    /* A range from key 0 takes the state with it; one from 1 does not. */
    vn_keep_forget(k, 1, UINT64_MAX);
    g_clear_pointer(&st, g_bytes_unref);
    st = vn_keep_get_state(k);
    ck_assert_ptr_nonnull(st);
    vn_keep_forget(k, 0, 0);
    ck_assert_ptr_null(vn_keep_get_state(k));
}
END_TEST

/* A worker that sends fd after fd: the store takes VN_KEEP_MAX_FDS, closes each one past
 * it, and key 0 is never an fd's. */
START_TEST(test_bounded)
{
    g_autoptr(VnKeep) k = vn_keep_new();
    g_autoptr(GError) error = NULL;
    int fd;

    for (uint64_t key = 1; key <= VN_KEEP_MAX_FDS; key++) {
        ck_assert(vn_keep_fd(k, key, new_fd(), NULL));
    }
    fd = new_fd();
    ck_assert(!vn_keep_fd(k, VN_KEEP_MAX_FDS + 1, fd, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    ck_assert(!is_open(fd));
    /* Full, a key kept already may still be replaced. */
    ck_assert(vn_keep_fd(k, 1, new_fd(), NULL));
    fd = new_fd();
    ck_assert(!vn_keep_fd(k, 0, fd, NULL));
    ck_assert(!is_open(fd));
}
END_TEST

static Suite *keep_suite(void)
{
    Suite *s = suite_create("keep");
    TCase *tc = tcase_create("keep");

    tcase_add_test(tc, test_fds_are_the_stores);
    tcase_add_test(tc, test_state);
    tcase_add_test(tc, test_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(keep_suite());
}
