/*
 * Unit tests of the one name rule (vfio-ntb/common/name.c): each kind takes
 * what it should and refuses the rest, "." and ".." everywhere, and the
 * bounds are exactly VN_MAX_*.
 */
#include "common/name.h"

#include "check-main.h"

#include <check.h>
#include <glib.h>
#include <string.h>

#define N VN_NAME_NODE
#define D VN_NAME_DEVICE
#define M VN_NAME_DOMAIN
#define Q VN_NAME_QDEV_ID
#define S VN_NAME_SOCKET

/* A name of @len 'a's (plus @tail), for the length bounds. */
#define LONG_NAME 1
#define LONG_NAME_OVER 2

static const struct {
    VnNameKind kind;
    const char *name; /* NULL with gen: generated */
    int gen;          /* LONG_NAME: exactly the kind's max; _OVER: one more */
    bool ok;
} cases[] = {
    /* node: [a-z0-9][a-z0-9-]* */
    { N, "hosta", 0, true },
    { N, "0host-b", 0, true },
    { N, "a", 0, true },
    { N, "Hosta", 0, false },
    { N, "-a", 0, false },
    { N, "a_b", 0, false },
    { N, "a.b", 0, false },
    { N, ".", 0, false },
    { N, "..", 0, false },
    { N, "", 0, false },
    { N, NULL, 0, false },
    { N, NULL, LONG_NAME, true },
    { N, NULL, LONG_NAME_OVER, false },
    /* device: [A-Za-z0-9_.-], not . or .. */
    { D, "nvme0", 0, true },
    { D, "a-b_c.D", 0, true },
    { D, "...", 0, true },
    { D, ".hidden", 0, true },
    { D, ".", 0, false },
    { D, "..", 0, false },
    { D, "a/b", 0, false },
    { D, "../x", 0, false },
    { D, "a b", 0, false },
    { D, "\x1b[2J", 0, false },
    { D, "é", 0, false },
    { D, "", 0, false },
    { D, NULL, 0, false },
    { D, NULL, LONG_NAME, true },
    { D, NULL, LONG_NAME_OVER, false },
    /* domain: the same set */
    { M, "vm1", 0, true },
    { M, "VM_1.test-x", 0, true },
    { M, ".", 0, false },
    { M, "..", 0, false },
    { M, "vm/1", 0, false },
    { M, "vm 1", 0, false },
    { M, NULL, LONG_NAME, true },
    { M, NULL, LONG_NAME_OVER, false },
    /* qdev id: a letter first */
    { Q, "ntb0", 0, true },
    { Q, "ntb-hosta-nvme0", 0, true },
    { Q, "pci.1", 0, true },
    { Q, "0ntb", 0, false },
    { Q, "_x", 0, false },
    { Q, ".", 0, false },
    { Q, "..", 0, false },
    { Q, "a,b", 0, false },
    { Q, NULL, LONG_NAME, true },
    { Q, NULL, LONG_NAME_OVER, false },
    /* socket: the set, ending in .sock */
    { S, "vm1-nvme0.sock", 0, true },
    { S, "x.sock", 0, true },
    { S, ".sock", 0, false },
    { S, "vm1", 0, false },
    { S, "..", 0, false },
    { S, "a/b.sock", 0, false },
    { S, NULL, LONG_NAME, true },
    { S, NULL, LONG_NAME_OVER, false },
};

static unsigned max_of(VnNameKind k)
{
    switch (k) {
    case VN_NAME_NODE:
        return VN_MAX_NODE_NAME;
    case VN_NAME_DEVICE:
        return VN_MAX_DEVICE_NAME;
    case VN_NAME_DOMAIN:
        return VN_MAX_DOMAIN_NAME;
    case VN_NAME_QDEV_ID:
        return VN_MAX_QDEV_ID;
    default:
        return VN_MAX_SOCKET_NAME;
    }
}

START_TEST(test_rule)
{
    g_autofree char *gen = NULL;
    const char *name = cases[_i].name;

    if (cases[_i].gen != 0) {
        unsigned len = max_of(cases[_i].kind) + (cases[_i].gen == LONG_NAME_OVER ? 1 : 0);
        const char *tail = cases[_i].kind == VN_NAME_SOCKET ? ".sock" : "";

        g_autofree char *body = g_strnfill(len - strlen(tail), 'a');

        gen = g_strconcat(body, tail, NULL);
        ck_assert_uint_eq(strlen(gen), len);
        name = gen;
    }
    ck_assert_msg(vn_name_valid(cases[_i].kind, name) == cases[_i].ok, "%s \"%s\": %s",
                  vn_name_kind_to_string(cases[_i].kind), name ? name : "(null)",
                  cases[_i].ok ? "refused" : "accepted");
}
END_TEST

/* Every kind has words for its messages and a name; no kind beyond. */
START_TEST(test_kinds)
{
    for (int k = 0; k < VN_NAME_LAST; k++) {
        ck_assert(strstr(vn_name_rule(k), "[A-Za-z0-9_.-]") != NULL ||
                  strstr(vn_name_rule(k), "[a-z0-9-]") != NULL);
        ck_assert_str_ne(vn_name_kind_to_string(k), "unknown");
    }
    ck_assert(!vn_name_valid(VN_NAME_LAST, "a"));
    ck_assert_str_eq(vn_name_kind_to_string(VN_NAME_LAST), "unknown");
}
END_TEST

static Suite *name_suite(void)
{
    Suite *s = suite_create("name");
    TCase *tc = tcase_create("rule");

    tcase_add_loop_test(tc, test_rule, 0, G_N_ELEMENTS(cases));
    tcase_add_test(tc, test_kinds);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(name_suite());
}
