/*
 * Unit tests of the borrower worker's sandbox (vfio-ntb/borrower/sandbox.c): a process in it
 * is killed by the first system call the list does not have, makes those it has, and (as
 * root) serves as the user it was given, with no capabilities and no way to gain any.  Each
 * case runs the sandbox in a child of its own: it cannot be left.
 */
#include "borrower/sandbox.h"

#include "check-main.h"

#include <check.h>
#include <seccomp.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* Fork a child that enters @sb and runs @body (its exit status is @body's); its wait
 * status.  @sync: a pipe the child reads one byte from before @body (the parent looks at
 * it meanwhile), or NULL. */
static int in_sandbox(const VnPrivs *sb, int (*body)(int fd), int *sync, pid_t *child)
{
    int status = -1, to_child[2], from_child[2];
    pid_t pid;

    ck_assert_int_eq(pipe(to_child), 0);
    ck_assert_int_eq(pipe(from_child), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char c;

        close(to_child[1]);
        close(from_child[0]);
        if (!vn_sandbox_enter(sb, NULL)) {
            _exit(99);
        }
        (void)!write(from_child[1], "s", 1);
        if (sync != NULL && read(to_child[0], &c, 1) != 1) {
            _exit(98);
        }
        _exit(body(from_child[1]));
    }
    close(to_child[0]);
    close(from_child[1]);
    if (sync != NULL) {
        char c;

        ck_assert_int_eq(read(from_child[0], &c, 1), 1); /* in the sandbox now */
        *sync = to_child[1];
        *child = pid;
        close(from_child[0]);
        return 0;
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    close(to_child[1]);
    close(from_child[0]);
    return status;
}

static int forbidden(int fd)
{
    (void)!getppid(); /* on no worker's path */
    return 0;
}

/* What a worker does while it serves: messages, fds, mappings, eventfds. */
static int allowed(int fd)
{
    int efd = eventfd(0, EFD_CLOEXEC);
    void *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (efd < 0 || m == MAP_FAILED || munmap(m, 8192) < 0 || close(efd) < 0 ||
        write(fd, "ok", 2) != 2) {
        return 1;
    }
    return 0;
}

START_TEST(test_forbidden_call_kills)
{
    VnPrivs sb = { 0 };
    int status = in_sandbox(&sb, forbidden, NULL, NULL);

    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS, "status %#x", status);
}
END_TEST

START_TEST(test_allowed_calls_work)
{
    VnPrivs sb = { 0 };
    int status = in_sandbox(&sb, allowed, NULL, NULL);

    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
}
END_TEST

/* Every name on the list is a system call here: a misspelt one would be skipped and the
 * call it meant would kill the worker. */
START_TEST(test_list_resolves)
{
    const char *const *names = vn_sandbox_allowed();

    ck_assert_uint_gt(g_strv_length((char **)names), 20);
    for (; *names != NULL; names++) {
        ck_assert_msg(seccomp_syscall_resolve_name(*names) != __NR_SCMP_ERROR, "%s", *names);
    }
}
END_TEST

static char *status_field(pid_t pid, const char *field)
{
    g_autofree char *path = g_strdup_printf("/proc/%d/status", pid);
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;

    ck_assert(g_file_get_contents(path, &text, NULL, NULL));
    lines = g_strsplit(text, "\n", -1);
    for (char **l = lines; *l != NULL; l++) {
        if (g_str_has_prefix(*l, field) && (*l)[strlen(field)] == ':') {
            return g_strstrip(g_strdup(*l + strlen(field) + 1));
        }
    }
    return NULL;
}

static int nothing(int fd)
{
    return 0;
}

/* As root: the child is nobody's, with no capability, no_new_privs and the filter. */
START_TEST(test_drops_to_the_user)
{
    VnPrivs sb = { .drop = true, .uid = 65534, .gid = 65534 };
    g_autofree char *uid = NULL, *gid = NULL, *caps = NULL, *nnp = NULL, *seccomp = NULL;
    g_autofree char *groups = NULL;
    int sync, status;
    pid_t child;

    if (geteuid() != 0) {
        return; /* only root can become another user */
    }
    in_sandbox(&sb, nothing, &sync, &child);
    uid = status_field(child, "Uid");
    gid = status_field(child, "Gid");
    groups = status_field(child, "Groups");
    caps = status_field(child, "CapEff");
    nnp = status_field(child, "NoNewPrivs");
    seccomp = status_field(child, "Seccomp");
    ck_assert_int_eq(write(sync, "g", 1), 1);
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    close(sync);
    ck_assert_str_eq(uid, "65534\t65534\t65534\t65534");
    ck_assert_str_eq(gid, "65534\t65534\t65534\t65534");
    ck_assert_str_eq(groups, "");
    ck_assert_str_eq(caps, "0000000000000000");
    ck_assert_str_eq(nnp, "1");
    ck_assert_str_eq(seccomp, "2");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
}
END_TEST

static Suite *sandbox_suite(void)
{
    Suite *s = suite_create("sandbox");
    TCase *tc = tcase_create("sandbox");

    tcase_add_test(tc, test_forbidden_call_kills);
    tcase_add_test(tc, test_allowed_calls_work);
    tcase_add_test(tc, test_list_resolves);
    tcase_add_test(tc, test_drops_to_the_user);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(sandbox_suite());
}
