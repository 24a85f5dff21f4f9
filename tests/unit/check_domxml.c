/*
 * Unit tests of the libvirt domain XML convention (vfio-ntb/libvirt/domxml.c).
 */
#include "libvirt/domxml.h"

#include "check-main.h"

#include <check.h>
#include <string.h>

#define QEMU_DECL "xmlns:qemu='" VN_DOMXML_QEMU_NS "'"
#define VN_DECL "xmlns:vn='" VN_DOMXML_NS "'"
#define DEVICE_ARG(json) "<qemu:arg value='-device'/><qemu:arg value='" json "'/>"
#define VFIO_USER(id, path)                                                          \
    "{\"driver\":\"vfio-user-pci\",\"id\":\"" id "\",\"socket\":{\"type\":\"unix\"," \
    "\"path\":\"" path "\"}}"

static const char ok_meta[] =
    "<vn:devices " VN_DECL "><vn:device name='hosta/nvme0' alias='ntb0'/></vn:devices>";
static const char ok_mem[] =
    "<memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>";
static const char ok_args[] = DEVICE_ARG(VFIO_USER("ntb0", "/run/vfio-ntb/a.sock"));

/*
 * A domain named @name around the given parts: NULL takes the valid default,
 * "" leaves the part out (meta and args go inside their wrapper element).
 */
static char *domain_xml(const char *name, const char *meta, const char *mem, const char *args)
{
    meta = meta != NULL ? meta : ok_meta;
    mem = mem != NULL ? mem : ok_mem;
    args = args != NULL ? args : ok_args;
    return g_strdup_printf("<domain type='qemu' " QEMU_DECL ">\n  <name>%s</name>\n"
                           "  <memory unit='KiB'>1048576</memory>\n%s%s%s%s%s%s%s"
                           "  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator>"
                           "</devices>\n</domain>\n",
                           name != NULL ? name : "vm1", *meta ? "  <metadata>" : "", meta,
                           *meta ? "</metadata>\n" : "", mem, *args ? "\n  <qemu:commandline>" : "",
                           args, *args ? "</qemu:commandline>\n" : "");
}

static VnDomain *parse(const char *xml, GError **error)
{
    return vn_domxml_parse(xml, strlen(xml), error);
}

/* ---- parse-ok ------------------------------------------------------------- */

START_TEST(test_two_devices)
{
    const char meta[] = "<app:x xmlns:app='http://example.com/app'><app:device name='x'/></app:x>"
                        "<vn:devices " VN_DECL ">\n"
                        "  <!-- the NVMe drive -->\n"
                        "  <vn:device name='hosta/nvme0' alias='ntb0' irq-mode='relay'/>\n"
                        "  <vn:device alias='ntb1' name='hostb/gpu.0' p2p='yes'/>\n"
                        "</vn:devices>";
    const char args[] = "<qemu:arg value='-device'/><qemu:arg value='e1000,id=net9'/>" DEVICE_ARG(
        "{\"driver\":\"virtio-net-pci\",\"id\":\"net0\"}") "<qemu:arg value='-device'/><qemu:arg value='{\"driver\":\"vfio-user-pci\","
                                                           "\"id\":\"ntb0\",\"bus\":\"pci.1\",\"socket\":{\"type\":\"unix\","
                                                           "\"path\":\"/run/vfio-ntb/hosta-nvme0.sock\"}}'/>"
                                                           "<qemu:env name='X' value='1'/>" DEVICE_ARG(
                                                               VFIO_USER(
                                                                   "ntb1",
                                                                   "/run/vfio-ntb/hostb-gpu.0.sock"));
    g_autofree char *xml = domain_xml("vm-1_a.b", meta, NULL, args);
    g_autoptr(GError) error = NULL;
    g_autoptr(VnDomain) dom = parse(xml, &error);
    const VnDomDevice *d;

    ck_assert_msg(dom != NULL, "%s", error != NULL ? error->message : "");
    ck_assert_str_eq(dom->name, "vm-1_a.b");
    ck_assert_uint_eq(dom->devices->len, 2);

    d = g_ptr_array_index(dom->devices, 0); /* document order */
    ck_assert_str_eq(d->device, "hosta/nvme0");
    ck_assert_str_eq(d->alias, "ntb0");
    ck_assert_str_eq(d->irq_mode, "relay");
    ck_assert_str_eq(d->socket, "/run/vfio-ntb/hosta-nvme0.sock");
    ck_assert_str_eq(d->bus, "pci.1");

    d = vn_domain_find(dom, "hostb/gpu.0");
    ck_assert_ptr_eq(d, g_ptr_array_index(dom->devices, 1));
    ck_assert_str_eq(d->alias, "ntb1");
    ck_assert_ptr_null(d->irq_mode);
    ck_assert(d->p2p);
    ck_assert(!((const VnDomDevice *)g_ptr_array_index(dom->devices, 0))->p2p);
    ck_assert_str_eq(d->socket, "/run/vfio-ntb/hostb-gpu.0.sock");
    ck_assert_ptr_null(d->bus);

    ck_assert_ptr_null(vn_domain_find(dom, "hostc/nvme0"));
    ck_assert_ptr_null(vn_domain_find(dom, NULL));
    ck_assert_ptr_null(vn_domain_find(NULL, "hosta/nvme0"));
}
END_TEST

START_TEST(test_no_metadata)
{
    /* Neither memfd nor a -device is required of a domain that borrows nothing. */
    g_autofree char *xml = domain_xml("vm1", "", "", "");
    g_autoptr(GError) error = NULL;
    g_autoptr(VnDomain) dom = parse(xml, &error);

    ck_assert_msg(dom != NULL, "%s", error != NULL ? error->message : "");
    ck_assert_str_eq(dom->name, "vm1");
    ck_assert_uint_eq(dom->devices->len, 0);
    vn_domain_free(NULL);
}
END_TEST

START_TEST(test_other_metadata)
{
    g_autofree char *xml = domain_xml("vm1",
                                      "<libosinfo:libosinfo xmlns:libosinfo='http://libosinfo"
                                      ".org/xmlns/libvirt/domain/1.0'><libosinfo:os id='x'/>"
                                      "</libosinfo:libosinfo><devices/>",
                                      "", "");
    g_autoptr(GError) error = NULL;
    g_autoptr(VnDomain) dom = parse(xml, &error);

    ck_assert_msg(dom != NULL, "%s", error != NULL ? error->message : "");
    ck_assert_uint_eq(dom->devices->len, 0);
}
END_TEST

START_TEST(test_foreign_device_ignored)
{
    /* Someone else's vfio-user-pci, broken by our rules: not ours to check. */
    g_autofree char *xml = domain_xml("vm1", NULL, NULL,
                                      DEVICE_ARG(VFIO_USER("other0", "relative.sock"))
                                          DEVICE_ARG(VFIO_USER("ntb0", "/run/a.sock"))
                                              DEVICE_ARG(VFIO_USER("other1", "/run/a.sock"))
                                      /* nested as deep as we let json-glib go */
                                      DEVICE_ARG("{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]"
                                                 "]]]]]]]]]]]]]]]]]]]]]]]]]]}"));
    g_autoptr(GError) error = NULL;
    g_autoptr(VnDomain) dom = parse(xml, &error);

    ck_assert_msg(dom != NULL, "%s", error != NULL ? error->message : "");
    ck_assert_uint_eq(dom->devices->len, 1);
    ck_assert_str_eq(vn_domain_find(dom, "hosta/nvme0")->socket, "/run/a.sock");

    /* and an empty vn:devices declares nothing, so requires nothing */
    g_autofree char *empty = domain_xml("vm1", "<vn:devices " VN_DECL "/>", "", "");
    g_autoptr(VnDomain) dom2 = parse(empty, &error);
    ck_assert_msg(dom2 != NULL, "%s", error != NULL ? error->message : "");
    ck_assert_uint_eq(dom2->devices->len, 0);
}
END_TEST

START_TEST(test_alias_valid)
{
    char a[VN_MAX_QDEV_ID + 2];

    ck_assert(vn_name_valid(VN_NAME_QDEV_ID, "a"));
    ck_assert(vn_name_valid(VN_NAME_QDEV_ID, "Ntb_0.a-b"));
    ck_assert(!vn_name_valid(VN_NAME_QDEV_ID, NULL));
    ck_assert(!vn_name_valid(VN_NAME_QDEV_ID, ""));
    ck_assert(!vn_name_valid(VN_NAME_QDEV_ID, "1x"));
    ck_assert(!vn_name_valid(VN_NAME_QDEV_ID, "_x"));
    ck_assert(!vn_name_valid(VN_NAME_QDEV_ID, "x y"));
    ck_assert(!vn_name_valid(VN_NAME_QDEV_ID, "x,y"));
    memset(a, 'a', sizeof(a) - 1);
    a[sizeof(a) - 1] = '\0';
    ck_assert(!vn_name_valid(VN_NAME_QDEV_ID, a));
    a[VN_MAX_QDEV_ID] = '\0';
    ck_assert(vn_name_valid(VN_NAME_QDEV_ID, a));
}
END_TEST

/* ---- parse-bad ------------------------------------------------------------ */

typedef enum Gen {
    GEN_NONE,
    GEN_17_DEVICES,
    GEN_LONG_SOCKET,
    GEN_OVERSIZED,
} Gen;

typedef struct Bad {
    const char *what;
    const char *raw;                      /* the whole document, or NULL to build one */
    const char *name, *meta, *mem, *args; /* for domain_xml() */
    Gen gen;
    int code;
    const char *expect; /* in the message */
} Bad;

#define INVALID G_MARKUP_ERROR_INVALID_CONTENT
#define DEV(attrs) "<vn:devices " VN_DECL "><vn:device " attrs "/></vn:devices>"
#define TWO(a1, a2) "<vn:devices " VN_DECL "><vn:device " a1 "/><vn:device " a2 "/></vn:devices>"

static const Bad bad[] = {
    { "not XML", "this is not XML", .code = G_MARKUP_ERROR_PARSE,
      .expect = "does not parse: line 1: " },
    { "unclosed element", "<domain>\n<name>vm1</name>\n", .code = G_MARKUP_ERROR_PARSE,
      .expect = "line 3" },
    { "undeclared entity", "<domain><name>&x;</name></domain>", .code = G_MARKUP_ERROR_PARSE,
      .expect = "'x'" },
    { "empty", "", .code = G_MARKUP_ERROR_PARSE, .expect = "does not parse" },
    { "DOCTYPE", "<!DOCTYPE domain [<!ENTITY x 'vm1'>]><domain><name>&x;</name></domain>",
      .code = INVALID, .expect = "<!DOCTYPE>" },
    { "root not domain", "<vm><name>vm1</name></vm>", .code = INVALID,
      .expect = "root element is <vm>, not <domain>" },
    { "root in a namespace", "<domain xmlns='http://example.com/'><name>vm1</name></domain>",
      .code = INVALID, .expect = "<domain> in a namespace, not <domain>" },
    { "no name", "<domain type='kvm'/>", .code = INVALID, .expect = "<name> \"\"" },
    { "bad name", .name = "vm 1", .code = INVALID, .expect = "<name> \"vm 1\" is not 1-63" },
    { "missing alias", .meta = DEV("name='hosta/nvme0'"), .code = INVALID,
      .expect = "device hosta/nvme0 has no alias attribute" },
    { "missing name", .meta = DEV("alias='ntb0'"), .code = INVALID,
      .expect = "<vn:device> 1 has no name attribute" },
    { "bad alias 1x", .meta = DEV("name='hosta/nvme0' alias='1x'"), .code = INVALID,
      .expect = "alias \"1x\" is not a QEMU id" },
    { "bad device hosta", .meta = DEV("name='hosta' alias='ntb0'"), .code = INVALID,
      .expect = "\"hosta\" names no host" },
    { "bad irq-mode", .meta = DEV("name='hosta/nvme0' alias='ntb0' irq-mode='msi'"),
      .code = INVALID, .expect = "irq-mode is \"msi\", not fd or relay" },
    { "bad p2p", .meta = DEV("name='hosta/nvme0' alias='ntb0' p2p='sure'"), .code = INVALID,
      .expect = "p2p is \"sure\", not yes or no" },
    { "unknown attribute", .meta = DEV("name='hosta/nvme0' alias='ntb0' bogus='1'"),
      .code = INVALID, .expect = "unknown attribute \"bogus\"" },
    { "namespaced attribute", .meta = DEV("name='hosta/nvme0' alias='ntb0' vn:alias='x'"),
      .code = INVALID, .expect = "unknown attribute \"vn:alias\"" },
    { "unknown element in our namespace",
      .meta = "<vn:devices " VN_DECL "><vn:gadget name='hosta/nvme0'/></vn:devices>",
      .code = INVALID, .expect = "unknown element <gadget> inside <vn:devices>" },
    { "text in vn:devices", .meta = "<vn:devices " VN_DECL ">hosta/nvme0</vn:devices>",
      .code = INVALID, .expect = "text inside <vn:devices>" },
    { "our namespace, not devices", .meta = "<vn:device " VN_DECL " name='hosta/nvme0'/>",
      .code = INVALID, .expect = "unknown element <device> of namespace" },
    { "two vn:devices",
      .meta = DEV("name='hosta/nvme0' alias='ntb0'") DEV("name='hosta/nvme1' alias='ntb1'"),
      .code = INVALID, .expect = "more than one <vn:devices>" },
    { "duplicate alias",
      .meta = TWO("name='hosta/nvme0' alias='ntb0'", "name='hosta/nvme1' alias='ntb0'"),
      .code = INVALID, .expect = "devices hosta/nvme0 and hosta/nvme1 have the same alias ntb0" },
    { "duplicate device",
      .meta = TWO("name='hosta/nvme0' alias='ntb0'", "name='hosta/nvme0' alias='ntb1'"),
      .code = INVALID, .expect = "device hosta/nvme0 is declared twice" },
    { "no memfd backing", .mem = "", .code = INVALID,
      .expect = "add <memoryBacking><source type='memfd'/><access mode='shared'/>" },
    { "memfd not shared", .mem = "<memoryBacking><source type='memfd'/></memoryBacking>",
      .code = INVALID, .expect = "not shared: add <access mode='shared'/>" },
    { "shared but anonymous",
      .mem = "<memoryBacking><source type='anonymous'/>"
             "<access mode='shared'/></memoryBacking>",
      .code = INVALID, .expect = "type='memfd'" },
    { "no -device for alias", .args = "", .code = INVALID,
      .expect = "no <qemu:arg> -device has id ntb0 (device hosta/nvme0): "
                "`ntbctl xml hosta/nvme0 --alias ntb0` prints one" },
    { "legacy -device syntax",
      .args = "<qemu:arg value='-device'/>"
              "<qemu:arg value='vfio-user-pci,id=ntb0,socket.type=unix,socket.path=/a.sock'/>",
      .code = INVALID, .expect = "--alias ntb0` prints one" },
    { "-device as the last arg", .args = "<qemu:arg value='-device'/>", .code = INVALID,
      .expect = "no <qemu:arg> -device has id ntb0" },
    { "wrong driver", .args = DEVICE_ARG("{\"driver\":\"vfio-pci\",\"id\":\"ntb0\"}"),
      .code = INVALID, .expect = "(alias ntb0): its -device has driver \"vfio-pci\"" },
    { "no socket", .args = DEVICE_ARG("{\"driver\":\"vfio-user-pci\",\"id\":\"ntb0\"}"),
      .code = INVALID, .expect = "needs \"socket\"" },
    { "inet socket",
      .args = DEVICE_ARG("{\"driver\":\"vfio-user-pci\",\"id\":\"ntb0\","
                         "\"socket\":{\"type\":\"inet\",\"path\":\"/a\"}}"),
      .code = INVALID, .expect = "needs \"socket\"" },
    { "bus not a string",
      .args = DEVICE_ARG("{\"driver\":\"vfio-user-pci\",\"id\":\"ntb0\","
                         "\"bus\":1,\"socket\":{\"type\":\"unix\","
                         "\"path\":\"/a\"}}"),
      .code = INVALID, .expect = "\"bus\" that is not a string" },
    { "bus with an escape",
      .args = DEVICE_ARG("{\"driver\":\"vfio-user-pci\",\"id\":\"ntb0\","
                         "\"bus\":\"pci\\u001b[2J\",\"socket\":{"
                         "\"type\":\"unix\",\"path\":\"/a\"}}"),
      .code = INVALID, .expect = "\"bus\" is not 1-63 printable characters" },
    { "relative socket path", .args = DEVICE_ARG(VFIO_USER("ntb0", "run/a.sock")), .code = INVALID,
      .expect = "socket path \"run/a.sock\" is not absolute" },
    { "socket path with ..", .args = DEVICE_ARG(VFIO_USER("ntb0", "/run/../tmp/a.sock")),
      .code = INVALID, .expect = "has a \"..\" component" },
    { "socket path ending in ..", .args = DEVICE_ARG(VFIO_USER("ntb0", "/run/..")), .code = INVALID,
      .expect = "has a \"..\" component" },
    { "socket path too long", .gen = GEN_LONG_SOCKET, .code = INVALID,
      .expect = "is longer than 107 bytes" },
    { "two -device with one id",
      .args = DEVICE_ARG(VFIO_USER("ntb0", "/a.sock")) DEVICE_ARG(VFIO_USER("ntb0", "/b.sock")),
      .code = INVALID, .expect = "two -device arguments have id ntb0" },
    { "two devices, one socket",
      .meta = TWO("name='hosta/nvme0' alias='ntb0'", "name='hosta/nvme1' alias='ntb1'"),
      .args = DEVICE_ARG(VFIO_USER("ntb0", "/a.sock")) DEVICE_ARG(VFIO_USER("ntb1", "/a.sock")),
      .code = INVALID, .expect = "use the same socket /a.sock" },
    { "-device JSON that does not parse", .args = DEVICE_ARG("{\"driver\":"), .code = INVALID,
      .expect = "a -device argument is not JSON" },
    { "-device JSON nested too deep",
      .args = DEVICE_ARG("{\"id\":\"ntb0\",\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]"
                         "]]]]]]]]]]]]]]]]]]]]]]]]}"),
      .code = INVALID, .expect = "nested deeper than 32" },
    { "too many devices (17)", .gen = GEN_17_DEVICES, .code = INVALID,
      .expect = "more than 16 devices" },
    { "oversized input", .gen = GEN_OVERSIZED, .code = INVALID,
      .expect = "is 4194305 bytes, more than the 4194304 accepted" },
};

/* The document a row describes; *len is its length. */
static char *bad_xml(const Bad *b, size_t *len)
{
    g_autoptr(GString) s = g_string_new(NULL);
    char *xml;

    switch (b->gen) {
    case GEN_17_DEVICES:
        g_string_append(s, "<vn:devices " VN_DECL ">");
        for (unsigned i = 0; i < VN_DOMXML_MAX_DEVICES + 1; i++) {
            g_string_append_printf(s, "<vn:device name='hosta/nvme%u' alias='ntb%u'/>", i, i);
        }
        g_string_append(s, "</vn:devices>");
        xml = domain_xml(NULL, s->str, NULL, NULL);
        break;
    case GEN_LONG_SOCKET:
        g_string_append(s, "<qemu:arg value='-device'/><qemu:arg value='{\"driver\":"
                           "\"vfio-user-pci\",\"id\":\"ntb0\",\"socket\":{\"type\":\"unix\","
                           "\"path\":\"/");
        for (unsigned i = 0; i < VN_DOMXML_MAX_SOCKET; i++) { /* one more with the '/' */
            g_string_append_c(s, 's');
        }
        g_string_append(s, "\"}}'/>");
        xml = domain_xml(NULL, NULL, NULL, s->str);
        break;
    case GEN_OVERSIZED:
        /* Refused on its size alone: the content would otherwise be fine. */
        *len = VN_DOMXML_MAX_BYTES + 1;
        xml = g_malloc(*len);
        memset(xml, ' ', *len);
        memcpy(xml, "<domain><name>vm1</name>", 24);
        memcpy(xml + *len - 9, "</domain>", 9);
        return xml;
    default:
        xml = b->raw != NULL ? g_strdup(b->raw) : domain_xml(b->name, b->meta, b->mem, b->args);
        break;
    }
    *len = strlen(xml);
    return xml;
}

START_TEST(test_malformed)
{
    const Bad *b = &bad[_i];
    g_autoptr(GError) error = NULL;
    size_t len = 0;
    g_autofree char *xml = bad_xml(b, &len);
    g_autoptr(VnDomain) dom = vn_domxml_parse(xml, len, &error);

    ck_assert_msg(dom == NULL, "%s: accepted", b->what);
    ck_assert_msg(error != NULL, "%s: no error", b->what);
    ck_assert_msg(error->domain == G_MARKUP_ERROR && error->code == b->code,
                  "%s: error code %d, want %d (%s)", b->what, error->code, b->code, error->message);
    ck_assert_msg(strstr(error->message, b->expect) != NULL, "%s: \"%s\" lacks \"%s\"", b->what,
                  error->message, b->expect);
    /* Once the name is known, every message says which domain it is about. */
    if (b->raw == NULL && b->name == NULL && b->gen != GEN_OVERSIZED) {
        ck_assert_msg(g_str_has_prefix(error->message, "domain vm1: "), "%s: \"%s\"", b->what,
                      error->message);
    }
}
END_TEST

START_TEST(test_too_many_args)
{
    /* Past VN_DOMXML_MAX_ARGS nothing more is read, even the -device we need. */
    g_autoptr(GString) args = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    for (unsigned i = 0; i < VN_DOMXML_MAX_ARGS; i++) {
        g_string_append(args, "<qemu:arg value='-S'/>");
    }
    g_string_append(args, ok_args);
    g_autofree char *xml = domain_xml(NULL, NULL, NULL, args->str);
    ck_assert_ptr_null(parse(xml, &error));
    ck_assert_int_eq(error->code, G_MARKUP_ERROR_INVALID_CONTENT);
    ck_assert_ptr_nonnull(strstr(error->message, "more than 512 <qemu:arg>"));
}
END_TEST

/* ---- snippets ------------------------------------------------------------- */

/* The snippets pasted into a minimal domain, parsed. */
static VnDomain *round_trip(const char *device, const char *alias, const char *socket,
                            const char *bus)
{
    g_autofree char *snippets = vn_domxml_snippets(device, alias, socket, bus);
    g_autofree char *xml = g_strdup_printf("<domain type='qemu' " QEMU_DECL ">"
                                           "<name>vm1</name>\n%s</domain>\n",
                                           snippets);
    g_autoptr(GError) error = NULL;
    VnDomain *dom = parse(xml, &error);

    ck_assert_msg(dom != NULL, "%s\n%s", error != NULL ? error->message : "", xml);
    ck_assert_uint_eq(dom->devices->len, 1);
    return dom;
}

START_TEST(test_snippets_bus)
{
    g_autoptr(VnDomain) dom = round_trip("hosta/nvme0", "ntb0", "/run/vfio-ntb/a.sock", "pci.1");
    const VnDomDevice *d = vn_domain_find(dom, "hosta/nvme0");

    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(d->alias, "ntb0");
    ck_assert_str_eq(d->socket, "/run/vfio-ntb/a.sock");
    ck_assert_str_eq(d->bus, "pci.1");
    ck_assert_ptr_null(d->irq_mode);
}
END_TEST

START_TEST(test_snippets_no_bus)
{
    g_autoptr(VnDomain) dom = round_trip("hostb/gpu.0", "gpu_0", "/run/b.sock", NULL);
    const VnDomDevice *d = vn_domain_find(dom, "hostb/gpu.0");
    g_autofree char *text = vn_domxml_snippets("hostb/gpu.0", "gpu_0", "/run/b.sock", NULL);
    g_auto(GStrv) parts = g_strsplit(text, "<!--", -1);

    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(d->alias, "gpu_0");
    ck_assert_ptr_null(d->bus);
    /* a comment before each of the three snippets, saying where it goes */
    ck_assert_uint_eq(g_strv_length(parts), 4);
    ck_assert_ptr_nonnull(strstr(parts[1], "<metadata>"));
    ck_assert_ptr_nonnull(strstr(parts[3], "xmlns:qemu='" VN_DOMXML_QEMU_NS "'"));
    ck_assert_ptr_null(strstr(text, "\"bus\""));
}
END_TEST

START_TEST(test_snippets_escaping)
{
    const char sock[] = "/run/vfio-ntb/a&b'c\"d<e>\\f\tg.sock";
    g_autoptr(VnDomain) dom = round_trip("hosta/nvme0", "ntb0", sock, "pci'1&");
    const VnDomDevice *d = g_ptr_array_index(dom->devices, 0);

    ck_assert_str_eq(d->socket, sock);
    ck_assert_str_eq(d->bus, "pci'1&");
}
END_TEST

static Suite *domxml_suite(void)
{
    Suite *s = suite_create("domxml");
    TCase *tc;

    tc = tcase_create("parse-ok");
    tcase_add_test(tc, test_two_devices);
    tcase_add_test(tc, test_no_metadata);
    tcase_add_test(tc, test_other_metadata);
    tcase_add_test(tc, test_foreign_device_ignored);
    tcase_add_test(tc, test_alias_valid);
    suite_add_tcase(s, tc);

    tc = tcase_create("parse-bad");
    tcase_add_loop_test(tc, test_malformed, 0, G_N_ELEMENTS(bad));
    tcase_add_test(tc, test_too_many_args);
    suite_add_tcase(s, tc);

    tc = tcase_create("snippets");
    tcase_add_test(tc, test_snippets_bus);
    tcase_add_test(tc, test_snippets_no_bus);
    tcase_add_test(tc, test_snippets_escaping);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(domxml_suite());
}
