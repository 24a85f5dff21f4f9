/*
 * Unit tests of the epoll-backed fd set (vfio-ntb/common/fdset.c): what is
 * ready is called, what was removed is not (even later in the same batch),
 * and however many fds it watches, its context polls one.
 */
#include "common/fdset.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PAIRS 200

typedef struct Rig {
    GMainContext *ctx;
    VnFdSet *set;
    int pair[PAIRS][2];
    VnFdSetWatch *w[PAIRS];
    unsigned calls[PAIRS];
    GIOCondition last[PAIRS];
    int remove_on_call; /* this index's callback removes watch @victim (or frees the set) */
    int victim;         /* -1: the set */
    int mutual[2];      /* each one's callback removes the other's watch */
} Rig;

static Rig rig;

static void on_ready(int fd, GIOCondition cond, void *opaque)
{
    int i = GPOINTER_TO_INT(opaque);
    char c;

    rig.calls[i]++;
    rig.last[i] = cond;
    if ((cond & G_IO_IN) && read(fd, &c, 1) < 0) {
        ck_abort_msg("read: %s", strerror(errno));
    }
    for (int k = 0; k < 2; k++) {
        if (i == rig.mutual[k] && rig.w[rig.mutual[!k]] != NULL) {
            vn_fdset_remove(rig.w[rig.mutual[!k]]);
            rig.w[rig.mutual[!k]] = NULL;
        }
    }
    if (i == rig.remove_on_call) {
        if (rig.victim < 0) {
            vn_fdset_free(rig.set);
            rig.set = NULL;
        } else {
            vn_fdset_remove(rig.w[rig.victim]);
            rig.w[rig.victim] = NULL;
        }
    }
}

static void setup(void)
{
    memset(&rig, 0, sizeof(rig));
    rig.remove_on_call = rig.mutual[0] = rig.mutual[1] = -1;
    rig.ctx = g_main_context_new();
    rig.set = vn_fdset_new(rig.ctx);
    ck_assert_ptr_nonnull(rig.set);
    for (int i = 0; i < PAIRS; i++) {
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, rig.pair[i]), 0);
        rig.w[i] = vn_fdset_add(rig.set, rig.pair[i][0], G_IO_IN, on_ready, GINT_TO_POINTER(i));
        ck_assert_ptr_nonnull(rig.w[i]);
    }
}

static void teardown(void)
{
    vn_fdset_free(rig.set);
    for (int i = 0; i < PAIRS; i++) {
        close(rig.pair[i][0]);
        if (rig.pair[i][1] >= 0) {
            close(rig.pair[i][1]);
        }
    }
    g_main_context_unref(rig.ctx);
}

static void ring(int i)
{
    ck_assert_int_eq(write(rig.pair[i][1], "x", 1), 1);
}

static void run(void)
{
    for (int n = 0; n < 10; n++) {
        g_main_context_iteration(rig.ctx, FALSE);
    }
}

/* Only what is ready is called, once per byte (level-triggered, read each time). */
START_TEST(test_ready_called)
{
    ring(3);
    ring(150);
    run();
    for (int i = 0; i < PAIRS; i++) {
        ck_assert_uint_eq(rig.calls[i], i == 3 || i == 150 ? 1 : 0);
    }
    ck_assert(rig.last[3] & G_IO_IN);
    ck_assert_uint_eq(vn_fdset_size(rig.set), PAIRS);
}
END_TEST

/* A peer's close is a hang-up, reported though not asked for. */
START_TEST(test_hangup)
{
    close(rig.pair[7][1]);
    rig.pair[7][1] = -1;
    rig.remove_on_call = 7; /* else it is reported at every iteration */
    rig.victim = 7;
    run();
    ck_assert_uint_eq(rig.calls[7], 1);
    ck_assert(rig.last[7] & G_IO_HUP);
}
END_TEST

/* Both ready in one batch, each removing the other when called: whichever the kernel lists
 * first is called, the other not (its memory outlives the batch: ASan checks). */
START_TEST(test_removed_in_batch_not_called)
{
    rig.mutual[0] = 10;
    rig.mutual[1] = 11;
    ring(10);
    ring(11);
    run();
    ck_assert_uint_eq(rig.calls[10] + rig.calls[11], 1);
    ck_assert_uint_eq(vn_fdset_size(rig.set), PAIRS - 1);
}
END_TEST

/* A callback may remove its own watch, or free the whole set. */
START_TEST(test_remove_self_and_free_inside)
{
    rig.remove_on_call = 20;
    rig.victim = 20;
    ring(20);
    run();
    ring(20);
    run();
    ck_assert_uint_eq(rig.calls[20], 1);

    rig.remove_on_call = 30;
    rig.victim = -1;
    for (int i = 0; i < PAIRS; i++) {
        ring(i);
    }
    run();
    ck_assert_ptr_null(rig.set);
    ck_assert_uint_eq(rig.calls[30], 1);
    /* Nobody is called once the set is gone, though all their bytes wait. */
    for (int i = 0; i < PAIRS; i++) {
        rig.calls[i] = 0;
    }
    run();
    for (int i = 0; i < PAIRS; i++) {
        ck_assert_uint_eq(rig.calls[i], 0);
    }
}
END_TEST

/* The point of the set: the context polls its one fd (and its own wake-up), not 200. */
START_TEST(test_context_polls_one_fd)
{
    GPollFD fds[16];
    gint timeout, max_priority;

    ck_assert(g_main_context_acquire(rig.ctx));
    g_main_context_prepare(rig.ctx, &max_priority);
    ck_assert_int_le(g_main_context_query(rig.ctx, max_priority, &timeout, fds, 16), 2);
    g_main_context_release(rig.ctx);
}
END_TEST

/* What epoll cannot watch (a regular file) is refused, not half-added. */
START_TEST(test_regular_file_refused)
{
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);

    ck_assert_int_ge(fd, 0);
    errno = 0;
    ck_assert_ptr_null(vn_fdset_add(rig.set, fd, G_IO_IN, on_ready, NULL));
    ck_assert_int_eq(errno, EPERM);
    ck_assert_uint_eq(vn_fdset_size(rig.set), PAIRS);
    close(fd);
}
END_TEST

static Suite *fdset_suite(void)
{
    Suite *s = suite_create("fdset");
    TCase *tc = tcase_create("set");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_ready_called);
    tcase_add_test(tc, test_hangup);
    tcase_add_test(tc, test_removed_in_batch_not_called);
    tcase_add_test(tc, test_remove_self_and_free_inside);
    tcase_add_test(tc, test_context_polls_one_fd);
    tcase_add_test(tc, test_regular_file_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(fdset_suite());
}
