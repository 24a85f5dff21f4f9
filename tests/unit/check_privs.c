/*
 * Unit tests of giving up a worker's privileges (vfio-ntb/common/privs.c): --run-as takes
 * UID:GID and nothing else (never 0), and (as root) a process that gives them up is that
 * user's, with no groups, no capability and no_new_privs, and cannot become root again.
 * Each drop runs in a child of its own.
 */
#include "common/privs.h"

#include "check-main.h"

#include <check.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const struct {
    const char *text;
    bool ok;
} run_as_cases[] = {
    { "65534:65534", true }, { "1000:0", false },        { "0:0", false },
    { "0:1000", false },     { "1000", false },          { "a:b", false },
    { "", false },           { "1:2:3", false },         { "-1:5", false },
    { "1:-5", false },       { "99999999999:1", false },
};

START_TEST(test_run_as)
{
    VnPrivs p = { 0 };
    g_autoptr(GError) error = NULL;
    bool ok = vn_privs_parse_run_as(run_as_cases[_i].text, &p, &error);

    ck_assert_msg(ok == run_as_cases[_i].ok, "\"%s\"", run_as_cases[_i].text);
    ck_assert(ok ? error == NULL && p.drop : error != NULL && !p.drop);
}
END_TEST

static char *status_field(const char *text, const char *field)
{
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);

    for (char **l = lines; *l != NULL; l++) {
        if (g_str_has_prefix(*l, field) && (*l)[strlen(field)] == ':') {
            return g_strstrip(g_strdup(*l + strlen(field) + 1));
        }
    }
    return NULL;
}

/* As root: the child that gave them up is nobody's, with no groups, no capability and
 * no_new_privs, no seccomp filter (that is the borrower's sandbox), and setuid(0) fails. */
START_TEST(test_dropped)
{
    VnPrivs p = { .drop = true, .uid = 65534, .gid = 65534 };
    g_autofree char *text = NULL, *uid = NULL, *groups = NULL, *caps = NULL, *nnp = NULL;
    g_autofree char *seccomp = NULL;
    int to_parent[2], status;
    pid_t pid;
    GString *got = g_string_new(NULL);
    char buf[4096];
    ssize_t n;

    if (geteuid() != 0) {
        g_string_free(got, TRUE);
        return; /* only root can become another user */
    }
    ck_assert_int_eq(pipe(to_parent), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        g_autofree char *mine = NULL;

        close(to_parent[0]);
        if (!vn_privs_drop(&p, NULL) || setuid(0) == 0 ||
            !g_file_get_contents("/proc/self/status", &mine, NULL, NULL)) {
            _exit(1);
        }
        _exit(write(to_parent[1], mine, strlen(mine)) > 0 ? 0 : 2);
    }
    close(to_parent[1]);
    while ((n = read(to_parent[0], buf, sizeof(buf))) > 0) {
        g_string_append_len(got, buf, n);
    }
    close(to_parent[0]);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
    text = g_string_free(got, FALSE);
    uid = status_field(text, "Uid");
    groups = status_field(text, "Groups");
    caps = status_field(text, "CapEff");
    nnp = status_field(text, "NoNewPrivs");
    seccomp = status_field(text, "Seccomp");
    ck_assert_str_eq(uid, "65534\t65534\t65534\t65534");
    ck_assert_str_eq(groups, "");
    ck_assert_str_eq(caps, "0000000000000000");
    ck_assert_str_eq(nnp, "1");
    ck_assert_str_eq(seccomp, "0");
}
END_TEST

static Suite *privs_suite(void)
{
    Suite *s = suite_create("privs");
    TCase *tc = tcase_create("privs");

    tcase_add_loop_test(tc, test_run_as, 0, G_N_ELEMENTS(run_as_cases));
    tcase_add_test(tc, test_dropped);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(privs_suite());
}
