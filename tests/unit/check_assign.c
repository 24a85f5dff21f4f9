/*
 * Unit tests of a spare worker's assignment (vfio-ntb/common/assign.c): what the daemon sends
 * arrives whole with its fds; a message out of bounds, with the wrong fds or without its
 * NULs is refused and its fds closed; the daemon going first is no error; the fds land
 * where a spawn puts them; the process title takes the assignment only when it fits.
 */
#include "common/assign.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int sv[2] = { -1, -1 };

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void teardown(void)
{
    for (int i = 0; i < 2; i++) {
        if (sv[i] >= 0) {
            close(sv[i]);
            sv[i] = -1;
        }
    }
}

/* Is the read end of @wfd's pipe closed everywhere (the receiver closed its copy)? */
static bool reader_gone(int wfd)
{
    return write(wfd, "x", 1) < 0 && errno == EPIPE;
}

static bool same_file(int a, int b)
{
    struct stat sa, sb;

    return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

START_TEST(test_round_trip)
{
    const char *argv[] = { "/usr/bin/worker", "--port=/run/x", "", "--node=b", NULL };
    int p[2], got[2] = { -1, -1 };
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) back = NULL;

    ck_assert_int_eq(pipe(p), 0);
    ck_assert(vn_assign_send(sv[0], argv, (const int[]){ p[0], p[1] }, 2, &error));
    back = vn_assign_receive(sv[1], got, 2, &error);
    ck_assert_msg(back != NULL, "%s", error != NULL ? error->message : "EOF");
    ck_assert_uint_eq(g_strv_length(back), 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(back[i], argv[i]);
    }
    ck_assert(same_file(got[0], p[0]));
    ck_assert(same_file(got[1], p[1]));
    ck_assert_uint_eq(vn_assign_length(argv), 16 + 14 + 1 + 9); /* each with its NUL */
    close(got[0]);
    close(got[1]);
    close(p[0]);
    close(p[1]);
}
END_TEST

START_TEST(test_sender_gone_is_no_error)
{
    int got[2];
    g_autoptr(GError) error = NULL;

    close(sv[0]);
    sv[0] = -1;
    ck_assert_ptr_null(vn_assign_receive(sv[1], got, 2, &error));
    ck_assert_ptr_null(error);
}
END_TEST

START_TEST(test_wrong_fds_refused_and_closed)
{
    const char *argv[] = { "w", "--a", NULL };
    int p[2], got[2];
    g_autoptr(GError) error = NULL;

    ck_assert_int_eq(pipe(p), 0);
    /* One fd where two are expected. */
    ck_assert(vn_assign_send(sv[0], argv, &p[0], 1, &error));
    close(p[0]);
    ck_assert_ptr_null(vn_assign_receive(sv[1], got, 2, &error));
    ck_assert_ptr_nonnull(error);
    ck_assert_ptr_nonnull(strstr(error->message, "1 fds, not 2"));
    ck_assert(reader_gone(p[1])); /* the receiver kept nothing */
    close(p[1]);
}
END_TEST

START_TEST(test_raw_messages_refused)
{
    /* What a peer that is not vn_assign_send could put on the socket. */
    static const struct {
        size_t len;
        char fill;
        const char *why;
    } bad[] = {
        { 5, 'a', "do not end with a NUL" },
        { VN_ASSIGN_MAX_BYTES + 64, 'a', "more than 4096 bytes" },
        { 2 * (VN_ASSIGN_MAX_ARGS + 1), '\0', "more than 32 arguments" },
    };

    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *buf = g_malloc(bad[i].len);
        g_autoptr(GError) error = NULL;
        int got[1];

        memset(buf, bad[i].fill, bad[i].len);
        if (bad[i].fill == '\0') {
            for (size_t k = 0; k < bad[i].len; k += 2) {
                buf[k] = 'a'; /* "a\0a\0...": one argument too many */
            }
        }
        ck_assert_int_eq(send(sv[0], buf, bad[i].len, 0), (ssize_t)bad[i].len);
        ck_assert_ptr_null(vn_assign_receive(sv[1], got, 0, &error));
        ck_assert_msg(error != NULL && strstr(error->message, bad[i].why) != NULL, "%zu: %s", i,
                      error != NULL ? error->message : "no error");
    }
}
END_TEST

START_TEST(test_sender_bounds)
{
    g_autofree char *big = g_strnfill(VN_ASSIGN_MAX_BYTES, 'a');
    const char *too_long[] = { big, NULL };
    const char *none[] = { NULL };
    g_autoptr(GError) e1 = NULL;
    g_autoptr(GError) e2 = NULL;

    ck_assert(!vn_assign_send(sv[0], too_long, NULL, 0, &e1));
    ck_assert(!vn_assign_send(sv[0], none, NULL, 0, &e2));
    ck_assert_int_eq(e1->code, G_IO_ERROR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_receiver_gone_refused)
{
    const char *argv[] = { "w", NULL };
    g_autoptr(GError) error = NULL;

    close(sv[1]);
    sv[1] = -1;
    ck_assert(!vn_assign_send(sv[0], argv, NULL, 0, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "did not take"));
}
END_TEST

/* In a child of its own: it moves descriptors 3 and 4, which the test runner may use. */
START_TEST(test_install_where_a_spawn_puts_them)
{
    pid_t pid;
    int status;

    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int a, b[2], ok;
        struct stat st;
        char c = 0;

        /* Crossed: the pipe's read end at 4 is to go to 3, /dev/null at 3 to 4. */
        close(3);
        close(4);
        a = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (a != 3 || pipe2(b, O_CLOEXEC) < 0 || b[0] != 4) {
            _exit(10);
        }
        ok = vn_assign_install((const int[]){ b[0], a }, 2, NULL);
        ok = ok && write(b[1], "y", 1) == 1 && read(3, &c, 1) == 1 && c == 'y' &&
             fstat(4, &st) == 0 && S_ISCHR(st.st_mode) && fcntl(3, F_GETFD) == 0 &&
             fcntl(4, F_GETFD) == 0;
        _exit(ok ? 0 : 11);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
}
END_TEST

START_TEST(test_retitle)
{
    /* One area, as the kernel lays out a process's arguments. */
    char area[] = "bin\0--spare-fd=3\0--title-room=                    ";
    char *orig[3] = { area, area + 4, area + 17 };
    const char *fits[] = { "bin", "--device=nvme0", "--port=/p", NULL };
    const char *too_long[] = { "bin", "--device=a-name-that-is-longer-than-the-room-left", NULL };
    char apart_a[] = "bin", apart_b[] = "--x";
    char *apart[2] = { apart_a, apart_b };

    ck_assert(!vn_assign_retitle(3, orig, too_long));
    ck_assert_str_eq(area + 4, "--spare-fd=3"); /* unchanged */
    ck_assert(!vn_assign_retitle(2, apart, fits));
    ck_assert(vn_assign_retitle(3, orig, fits));
    ck_assert_int_eq(memcmp(area, "bin\0--device=nvme0\0--port=/p\0", 29), 0);
    for (size_t i = 29; i < sizeof(area); i++) {
        ck_assert_int_eq(area[i], '\0');
    }
}
END_TEST

static Suite *assign_suite(void)
{
    Suite *s = suite_create("assign");
    TCase *tc = tcase_create("assign");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_sender_gone_is_no_error);
    tcase_add_test(tc, test_wrong_fds_refused_and_closed);
    tcase_add_test(tc, test_raw_messages_refused);
    tcase_add_test(tc, test_sender_bounds);
    tcase_add_test(tc, test_receiver_gone_refused);
    tcase_add_test(tc, test_install_where_a_spawn_puts_them);
    tcase_add_test(tc, test_retitle);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(assign_suite());
}
