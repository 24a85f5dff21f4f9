/*
 * Unit tests of declaring and undeclaring a device in a domain's XML
 * (vfio-ntb/libvirt/domedit.c): what ntbctl --config writes into libvirt's
 * persistent definitions.  Each result is read back with vn_domxml_parse().
 */
#include "libvirt/domedit.h"
#include "libvirt/domxml.h"

#include "check-main.h"

#include <check.h>
#include <string.h>

#define VN_DECL "xmlns:vn='" VN_DOMXML_NS "'"
#define QEMU_DECL "xmlns:qemu='" VN_DOMXML_QEMU_NS "'"
#define MEM "<memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>"
#define SOCK_A "/run/vfio-ntb/hosta-nvme0.sock"
#define SOCK_B "/run/vfio-ntb/hostb-gpu0.sock"

/* A domain with no vfio-ntb device, its own metadata and a foreign -device. */
static const char plain[] =
    "<domain type='qemu' " QEMU_DECL ">\n"
    "  <name>vm4</name>\n"
    "  <metadata><app:x xmlns:app='http://example.com/app'>keep</app:x></metadata>\n"
    "  " MEM "\n"
    "  <devices><controller type='pci' index='1' model='pcie-root-port'/></devices>\n"
    "  <qemu:commandline><qemu:arg value='-device'/>"
    "<qemu:arg value='{\"driver\":\"virtio-rng-pci\",\"id\":\"rng0\"}'/></qemu:commandline>\n"
    "</domain>\n";

/* A domain without metadata, commandline or the qemu namespace. */
static const char bare[] = "<domain type='qemu'><name>vm5</name>" MEM "<devices/></domain>";

/* Two declared devices; the second's pair straddles two commandlines. */
static const char two[] =
    "<domain type='qemu' " QEMU_DECL "><name>vm3</name>"
    "<metadata><vn:devices " VN_DECL ">"
    "<vn:device name='hosta/nvme0' alias='ntb0'/><vn:device name='hostb/gpu0' alias='ntb1'/>"
    "</vn:devices></metadata>" MEM
    "<qemu:commandline><qemu:arg value='-device'/><qemu:arg value='{\"driver\":"
    "\"vfio-user-pci\",\"id\":\"ntb0\",\"socket\":{\"type\":\"unix\",\"path\":\"" SOCK_A
    "\"}}'/><qemu:arg value='-device'/></qemu:commandline>"
    "<qemu:commandline><qemu:arg value='{\"driver\":\"vfio-user-pci\",\"id\":\"ntb1\","
    "\"socket\":{\"type\":\"unix\",\"path\":\"" SOCK_B "\"}}'/>"
    "<qemu:env name='X' value='1'/></qemu:commandline>"
    "</domain>";

static VnDomain *reparse(const char *xml)
{
    g_autoptr(GError) error = NULL;
    VnDomain *dom = vn_domxml_parse(xml, strlen(xml), &error);

    ck_assert_msg(dom != NULL, "%s\n%s", error != NULL ? error->message : "", xml);
    return dom;
}

/* ---- declare -------------------------------------------------------------- */

/* The declared domain, or NULL with @error set (never NULL without one here). */
static char *declare(const char *xml, const char *device, const char *alias, const char *sock,
                     const char *bus, GError **error)
{
    char *out = NULL;
    bool ok = vn_domedit_declare(xml, strlen(xml), device, alias, sock, bus, &out, error);

    ck_assert(ok == (out != NULL));
    ck_assert(ok == (*error == NULL));
    return out;
}

START_TEST(test_declare_keeps_the_rest)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *out =
        declare(plain, "hosta/nvme0", "ntb-hosta-nvme0", SOCK_A, "pci.1", &error);
    g_autoptr(VnDomain) dom = NULL;
    const VnDomDevice *d;

    ck_assert_msg(out != NULL, "%s", error != NULL ? error->message : "");
    dom = reparse(out);
    ck_assert_str_eq(dom->name, "vm4");
    ck_assert_uint_eq(dom->devices->len, 1);
    d = vn_domain_find(dom, "hosta/nvme0");
    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(d->alias, "ntb-hosta-nvme0");
    ck_assert_str_eq(d->socket, SOCK_A);
    ck_assert_str_eq(d->bus, "pci.1");
    /* Nothing else went: foreign metadata, the other -device, the controller. */
    ck_assert_ptr_nonnull(strstr(out, ">keep</app:x>"));
    ck_assert_ptr_nonnull(strstr(out, "virtio-rng-pci"));
    ck_assert_ptr_nonnull(strstr(out, "pcie-root-port"));
}
END_TEST

START_TEST(test_declare_into_bare_domain)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *out = declare(bare, "hosta/nvme0", "ntb0", SOCK_A, NULL, &error);
    g_autoptr(VnDomain) dom = NULL;
    const VnDomDevice *d;

    ck_assert_msg(out != NULL, "%s", error != NULL ? error->message : "");
    dom = reparse(out);
    d = vn_domain_find(dom, "hosta/nvme0");
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_null(d->bus);
    ck_assert_ptr_nonnull(strstr(out, "xmlns:qemu=\"" VN_DOMXML_QEMU_NS "\""));
}
END_TEST

/* A second device next to one declared already. */
START_TEST(test_declare_second)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *once = declare(bare, "hosta/nvme0", "ntb0", SOCK_A, NULL, &error);
    g_autofree char *twice = NULL;
    g_autoptr(VnDomain) dom = NULL;

    ck_assert_ptr_nonnull(once);
    twice = declare(once, "hostb/gpu0", "ntb1", SOCK_B, "pci.2", &error);
    ck_assert_msg(twice != NULL, "%s", error != NULL ? error->message : "");
    dom = reparse(twice);
    ck_assert_uint_eq(dom->devices->len, 2);
    ck_assert_str_eq(vn_domain_find(dom, "hostb/gpu0")->socket, SOCK_B);
    ck_assert_str_eq(vn_domain_find(dom, "hosta/nvme0")->socket, SOCK_A);
}
END_TEST

/* Declared already: nothing to change, and that declaration stays. */
START_TEST(test_declare_already)
{
    g_autoptr(GError) error = NULL;
    char *out = (char *)"unset";

    ck_assert(vn_domedit_declare(two, strlen(two), "hosta/nvme0", "ntbz", "/run/vfio-ntb/z.sock",
                                 NULL, &out, &error));
    ck_assert_ptr_null(out);
    ck_assert_ptr_null(error);
}
END_TEST

/* Appended after every existing argument: a "-device" whose value is in the
 * next commandline keeps it. */
START_TEST(test_declare_after_straddling_pair)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *out = declare(two, "hostc/x", "ntbz", "/run/vfio-ntb/z.sock", NULL, &error);
    g_autoptr(VnDomain) dom = NULL;

    ck_assert_msg(out != NULL, "%s", error != NULL ? error->message : "");
    dom = reparse(out);
    ck_assert_uint_eq(dom->devices->len, 3);
    ck_assert_str_eq(vn_domain_find(dom, "hostb/gpu0")->socket, SOCK_B);
}
END_TEST

static const struct {
    const char *xml;
    const char *device, *alias, *socket;
    const char *why;
} refused[] = {
    { two, "hostc/x", "ntb1", "/run/vfio-ntb/z.sock", "alias ntb1 is hostb/gpu0's" },
    { two, "hostc/x", "ntbz", SOCK_A, "the same socket" },
    { "<domain><name>m</name><devices/></domain>", "hosta/nvme0", "ntb0", SOCK_A, "memoryBacking" },
    { "<domain><name>m</name>", "hosta/nvme0", "ntb0", SOCK_A, "does not parse" },
    { "<!DOCTYPE d [<!ENTITY e 'x'>]><domain><name>&e;</name></domain>", "hosta/nvme0", "ntb0",
      SOCK_A, "DOCTYPE" },
    { "<domain xmlns:qemu='urn:other'><name>m</name>" MEM "</domain>", "hosta/nvme0", "ntb0",
      SOCK_A, "prefix \"qemu\"" },
};

/* Refused with a reason, and nothing is returned to define. */
START_TEST(test_declare_refused)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *out = declare(refused[_i].xml, refused[_i].device, refused[_i].alias,
                                   refused[_i].socket, NULL, &error);

    ck_assert_msg(out == NULL, "accepted: %s", out);
    ck_assert_ptr_nonnull(error);
    ck_assert_msg(strstr(error->message, refused[_i].why) != NULL, "%s", error->message);
}
END_TEST

/* ---- undeclare ------------------------------------------------------------ */

START_TEST(test_undeclare_first)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *out = NULL;
    g_autoptr(VnDomain) dom = NULL;

    ck_assert(vn_domedit_undeclare(two, strlen(two), "hosta/nvme0", &out, &error));
    ck_assert_ptr_nonnull(out);
    dom = reparse(out);
    ck_assert_uint_eq(dom->devices->len, 1);
    ck_assert_ptr_null(vn_domain_find(dom, "hosta/nvme0"));
    ck_assert_str_eq(vn_domain_find(dom, "hostb/gpu0")->socket, SOCK_B);
    ck_assert_ptr_null(strstr(out, SOCK_A));
    ck_assert_ptr_nonnull(strstr(out, "<qemu:env"));
}
END_TEST

/* The pair straddling two commandlines goes, and so does the first
 * commandline it empties; then the last device, and with it <vn:devices>. */
START_TEST(test_undeclare_all)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *one = NULL, *none = NULL;
    g_autoptr(VnDomain) dom = NULL;

    ck_assert(vn_domedit_undeclare(two, strlen(two), "hostb/gpu0", &one, &error));
    ck_assert_ptr_nonnull(one);
    ck_assert_ptr_null(strstr(one, SOCK_B));
    ck_assert(vn_domedit_undeclare(one, strlen(one), "hosta/nvme0", &none, &error));
    ck_assert_ptr_nonnull(none);
    dom = reparse(none);
    ck_assert_uint_eq(dom->devices->len, 0);
    ck_assert_ptr_null(strstr(none, "-device"));
    ck_assert_ptr_null(strstr(none, "vn:devices"));
    /* the commandline with the env stays; the emptied one is gone */
    ck_assert_ptr_nonnull(strstr(none, "<qemu:env"));
    ck_assert_ptr_null(strstr(strstr(none, "<qemu:commandline") + 1, "<qemu:commandline"));
}
END_TEST

/* Not declared: nothing to change, no error. */
START_TEST(test_undeclare_absent)
{
    g_autoptr(GError) error = NULL;
    char *out = (char *)"unset";

    ck_assert(vn_domedit_undeclare(plain, strlen(plain), "hosta/nvme0", &out, &error));
    ck_assert_ptr_null(out);
    ck_assert_ptr_null(error);
}
END_TEST

/* A domain that breaks the convention is refused, not edited. */
START_TEST(test_undeclare_invalid)
{
    static const char bad[] =
        "<domain " QEMU_DECL "><name>vm3</name><metadata><vn:devices " VN_DECL ">"
        "<vn:device name='hosta/nvme0' alias='ntb0'/></vn:devices></metadata>" MEM "</domain>";
    g_autoptr(GError) error = NULL;
    char *out = NULL;

    ck_assert(!vn_domedit_undeclare(bad, strlen(bad), "hosta/nvme0", &out, &error));
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(error->message, "no <qemu:arg> -device has id ntb0"));
}
END_TEST

/* Declared then undeclared: the device list is back to what it was. */
START_TEST(test_round_trip)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *in = declare(plain, "h/n", "ntb9", "/run/vfio-ntb/h-n.sock", "pci.1", &error);
    g_autofree char *out = NULL;
    g_autoptr(VnDomain) dom = NULL;

    ck_assert_ptr_nonnull(in);
    ck_assert(vn_domedit_undeclare(in, strlen(in), "h/n", &out, &error));
    dom = reparse(out);
    ck_assert_uint_eq(dom->devices->len, 0);
    ck_assert_ptr_nonnull(strstr(out, "virtio-rng-pci"));
    ck_assert_ptr_null(strstr(out, "ntb9"));
}
END_TEST

static Suite *domedit_suite(void)
{
    Suite *s = suite_create("domedit");
    TCase *tc;

    tc = tcase_create("declare");
    tcase_add_test(tc, test_declare_keeps_the_rest);
    tcase_add_test(tc, test_declare_into_bare_domain);
    tcase_add_test(tc, test_declare_second);
    tcase_add_test(tc, test_declare_after_straddling_pair);
    tcase_add_test(tc, test_declare_already);
    tcase_add_loop_test(tc, test_declare_refused, 0, G_N_ELEMENTS(refused));
    suite_add_tcase(s, tc);

    tc = tcase_create("undeclare");
    tcase_add_test(tc, test_undeclare_first);
    tcase_add_test(tc, test_undeclare_all);
    tcase_add_test(tc, test_undeclare_absent);
    tcase_add_test(tc, test_undeclare_invalid);
    tcase_add_test(tc, test_round_trip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(domedit_suite());
}
