/*
 * Unit tests of ntbctl (vfio-ntb/ctl/): the output formats, device-name
 * checks, the control client against a fake daemon (ctl-fake.h) that
 * answers well, refuses, misbehaves or stays silent, and the ntbctl
 * binary's exit codes (docs/control.md "ntbctl exit codes").
 */
#include "client/ctl-client.h"
#include "ctl/format.h"
#include "ctl-fake.h"

#include <sys/wait.h>

/* build/ntbctl, found next to this test binary (main). */
static char *ntbctl_path;

static JsonNode *json(const char *text)
{
    /* Test data, not peer input: any JSON value, as a daemon's "return" may hold. */
    JsonNode *n = json_from_string(text, NULL);

    ck_assert_msg(n != NULL, "bad test JSON %s", text);
    return n;
}

/* ---- format ------------------------------------------------------------- */

START_TEST(test_format_devices)
{
    g_autoptr(JsonNode) ret =
        json("[{\"device\": \"hosta/nvme0\", \"node\": \"hosta\", \"name\": \"nvme0\","
             "  \"state\": \"lent\", \"borrower\": \"hostb\", \"lease\": 17,"
             "  \"id\": {\"pci\": \"0000:3b:00.0\", \"vendor\": 6966, \"device\": 16,"
             "          \"class\": 67586, \"name\": \"Non-Volatile memory controller: X\","
             "          \"size\": 68719476736}, \"attached_to\": \"vm1\"},"
             " {\"device\": \"hosta/gpu-long.1\", \"node\": \"hosta\", \"name\": \"gpu-long.1\","
             "  \"state\": \"available\", \"borrower\": null, \"lease\": null},"
             " {\"device\": \"hostc/nic\", \"state\": \"lent\", \"borrower\": \"hostd\","
             "  \"lease\": 3, \"attached_to\": null, \"expires_in_ms\": 7250},"
             " {\"device\": \"hostc/gpu\", \"state\": \"lent\", \"borrower\": \"hostd\","
             "  \"lease\": 4, \"attached_to\": null, \"expires_in_ms\": 3000,"
             "  \"job\": \"revoke\"},"
             " {\"device\": \"hostc/fpga\", \"state\": \"lent\", \"borrower\": \"hostb\","
             "  \"lease\": 5, \"attached_to\": \"vm2\", \"job\": \"attach\", \"job_ms\": 400,"
             "  \"job_owner\": \"control\"}]");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(vn_ctl_format_devices(out, ret, &error));
    ck_assert_str_eq(out->str,
                     "DEVICE            STATE                              BORROWER  LEASE  "
                     "ATTACHED  IDENTITY\n"
                     "hosta/nvme0       lent                               hostb     17     "
                     "vm1       0000:3b:00.0 1b36:0010 "
                     "Non-Volatile memory controller: X (64.0 GiB)\n"
                     "hosta/gpu-long.1  available                          -         -      "
                     "-         -\n"
                     "hostc/nic         lent (holder down, ends in 7.2 s)  hostd     3      "
                     "-         -\n"
                     "hostc/gpu         lent (revoked, ends in 3.0 s)      hostd     4      "
                     "-         -\n"
                     "hostc/fpga        lent (attach, 0.4 s)               hostb     5      "
                     "vm2       -\n");
    /* --name: what completion and scripts read */
    g_string_truncate(out, 0);
    ck_assert(vn_ctl_format_device_names(out, ret, &error));
    ck_assert_str_eq(out->str, "hosta/nvme0\nhosta/gpu-long.1\nhostc/nic\nhostc/gpu\nhostc/fpga\n");
}
END_TEST

START_TEST(test_format_nodes)
{
    g_autoptr(JsonNode) ret = json("[{\"node\": \"hosta\", \"link\": \"self\", \"devices\": 2,"
                                   "  \"last_seen_ms\": null, \"version\": \"0.1.0\"},"
                                   " {\"node\": \"hostbb\", \"link\": \"down\", \"devices\": 0,"
                                   "  \"last_seen_ms\": 12345, \"version\": null}]");
    g_autoptr(JsonNode) none = json("[]");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(vn_ctl_format_nodes(out, ret, &error));
    ck_assert_str_eq(out->str, "NODE    LINK  DEVICES  LAST SEEN   VERSION\n"
                               "hosta   self  2        -           0.1.0\n"
                               "hostbb  down  0        12.3 s ago  -\n");
    g_string_truncate(out, 0);
    ck_assert(vn_ctl_format_nodes(out, none, &error));
    ck_assert_str_eq(out->str, "NODE  LINK  DEVICES  LAST SEEN  VERSION\n");
}
END_TEST

START_TEST(test_format_show)
{
    g_autoptr(JsonNode) lent =
        json("{\"device\": \"hosta/nvme0\", \"node\": \"hosta\", \"name\": \"nvme0\","
             " \"state\": \"lent\", \"borrower\": \"hostb\", \"lease\": 17,"
             " \"allow\": [\"hostb\", \"hostc\"], \"job\": \"revoke\", \"job_ms\": 2100,"
             " \"job_owner\": \"kernel\"}");
    g_autoptr(JsonNode) avail =
        json("{\"device\": \"hosta/nvme0\", \"state\": \"available\", \"borrower\": null,"
             " \"lease\": null, \"allow\": []}");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(vn_ctl_format_device(out, lent, &error));
    ck_assert_str_eq(out->str, "device:   hosta/nvme0\n"
                               "node:     hosta\n"
                               "name:     nvme0\n"
                               "state:    lent\n"
                               "borrower: hostb\n"
                               "lease:    17\n"
                               "allow:    hostb, hostc\n"
                               "job:      revoke (2.1 s, asked by kernel)\n");
    g_string_truncate(out, 0);
    ck_assert(vn_ctl_format_device(out, avail, &error));
    ck_assert_str_eq(out->str, "device:   hosta/nvme0\n"
                               "state:    available\n"
                               "borrower: -\n"
                               "lease:    -\n"
                               "allow:    -\n");
}
END_TEST

START_TEST(test_format_stats)
{
    /* The shape of the daemon's stats file (vfio-ntbd.c stats_write). */
    g_autoptr(JsonNode) file =
        json("{\"node\": \"hosta\", \"fabric\": {\"msgs_sent\": 3, \"bad_messages\": 0},"
             " \"lent\": [{\"device\": \"hosta/nvme0\", \"borrower\": null, \"requests\": 120}],"
             " \"borrowed\": [{\"device\": \"hostc/disk\", \"lender_lost\": false,"
             "                 \"vfio_user\": {\"requests\": 9}}]}");
    g_autoptr(JsonNode) list = json("[{\"device\": \"hosta/nvme0\", \"fences\": 1}]");
    g_autoptr(JsonNode) empty = json("{\"lent\": [], \"borrowed\": []}");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(vn_ctl_format_stats(out, file, &error));
    ck_assert_str_eq(out->str, "fabric\n"
                               "COUNTER       VALUE\n"
                               "msgs_sent     3\n"
                               "bad_messages  0\n"
                               "\n"
                               "hosta/nvme0 (lent)\n"
                               "COUNTER   VALUE\n"
                               "borrower  -\n"
                               "requests  120\n"
                               "\n"
                               "hostc/disk (borrowed)\n"
                               "COUNTER             VALUE\n"
                               "lender_lost         no\n"
                               "vfio_user.requests  9\n"
                               "\n"
                               "Counted: what passes through vfio-ntb: fabric and lease "
                               "messages, the accesses it\n"
                               "forwards (config space, and BAR accesses only where it traps "
                               "them), interrupts it\n"
                               "relays (irq-mode relay), DMA map and unmap requests, resets.\n"
                               "Not counted: data-path I/O, which never passes through "
                               "vfio-ntb: the guest's accesses\n"
                               "to mapped BARs, the device's DMA, and interrupts delivered as "
                               "eventfds (irq-mode fd).\n");
    g_string_truncate(out, 0);
    ck_assert(vn_ctl_format_stats(out, list, &error));
    ck_assert(g_str_has_prefix(out->str, "hosta/nvme0\nCOUNTER  VALUE\nfences   1\n\nCounted: "));
    g_string_truncate(out, 0);
    ck_assert(vn_ctl_format_stats(out, empty, &error));
    ck_assert(g_str_has_prefix(out->str, "no counters\n\nCounted: "));
    ck_assert_ptr_nonnull(strstr(out->str, "Not counted: data-path I/O"));
}
END_TEST

START_TEST(test_format_actions)
{
    g_autoptr(JsonNode) borrow = json("{\"device\": \"hosta/nvme0\", \"lease\": 17}");
    g_autoptr(JsonNode) attach = json("{\"device\": \"hosta/nvme0\", \"lease\": 17,"
                                      " \"socket\": \"/run/vfio-ntb/nvme0.sock\"}");
    g_autoptr(JsonNode) forced = json("{\"forced\": true}");
    g_autoptr(JsonNode) clean = json("{\"forced\": false}");
    g_autoptr(JsonNode) empty = json("{}");
    g_autoptr(JsonNode) asked = json("{\"requested\": true}");
    g_autoptr(JsonNode) not_asked = json("{\"requested\": false}");
    g_autoptr(JsonNode) same = json("{\"changed\": false}");
    g_autoptr(JsonNode) held = json("{\"device\": \"hosta/nvme0\", \"lease\": 17, "
                                    "\"changed\": false, \"socket\": \"/run/vfio-ntb/n.sock\"}");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    ck_assert(vn_ctl_format_borrow(out, "hostb", borrow, &error));
    ck_assert(vn_ctl_format_attach(out, "vm1", attach, &error));
    ck_assert(vn_ctl_format_revoke(out, "hosta/nvme0", forced, &error));
    ck_assert(vn_ctl_format_revoke(out, "hosta/nvme0", clean, &error));
    ck_assert(vn_ctl_format_return(out, "hosta/nvme0", empty, &error));
    ck_assert(vn_ctl_format_detach(out, "hosta/nvme0", empty, &error));
    ck_assert(vn_ctl_format_unplug(out, "hosta/nvme0", asked, &error));
    ck_assert_str_eq(
        out->str,
        "hostb holds hosta/nvme0 (lease 17)\n"
        "serving hosta/nvme0 for vm1 (lease 17): QEMU socket "
        "/run/vfio-ntb/nvme0.sock\n"
        "(give the VM: -device '{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\","
        "\"path\":\"/run/vfio-ntb/nvme0.sock\"}}')\n"
        "revoked hosta/nvme0: the borrower did not let go within the grace "
        "period, so the lender fenced it\n"
        "revoked hosta/nvme0: the borrower let go\n"
        "returned hosta/nvme0\n"
        "detached hosta/nvme0 (still borrowed: `ntbctl return hosta/nvme0` "
        "gives it back)\n"
        "asked the VM to release hosta/nvme0 (device request); it is out once the "
        "guest lets go\n");
    /* "changed": false says there was nothing to do */
    g_string_truncate(out, 0);
    ck_assert(vn_ctl_format_borrow(out, "hostb", held, &error));
    ck_assert(vn_ctl_format_attach(out, "vm1", held, &error));
    ck_assert(vn_ctl_format_return(out, "hosta/nvme0", same, &error));
    ck_assert(vn_ctl_format_detach(out, "hosta/nvme0", same, &error));
    ck_assert_str_eq(
        out->str,
        "hostb already holds hosta/nvme0 (lease 17)\n"
        "already serving hosta/nvme0 for vm1 (lease 17): QEMU socket "
        "/run/vfio-ntb/n.sock\n"
        "(give the VM: -device '{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\","
        "\"path\":\"/run/vfio-ntb/n.sock\"}}')\n"
        "hosta/nvme0 was not borrowed here: nothing to return\n"
        "hosta/nvme0 was not attached here: nothing to detach\n");
    /* Not asked is not done: an error that says what to do instead. */
    ck_assert(!vn_ctl_format_unplug(out, "hosta/nvme0", not_asked, &error));
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_GENERIC));
    ck_assert_ptr_nonnull(strstr(error->message, "takes no device requests"));
}
END_TEST

START_TEST(test_format_json_and_sanitize)
{
    g_autoptr(JsonNode) ret = json("{\"device\": \"hosta/nvme0\", \"lease\": 17}");
    g_autoptr(JsonNode) evil = json("[{\"node\": \"\\u001b[2Jx\\u009b\", \"link\": \"up\","
                                    " \"devices\": 1}]");
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;
    g_autofree char *s = NULL;
    g_autoptr(JsonNode) back = NULL;

    vn_ctl_format_json(out, ret, true);
    ck_assert(g_str_has_suffix(out->str, "}\n"));
    ck_assert_ptr_nonnull(strstr(out->str, "\n  \"lease\" : 17")); /* pretty */
    back = json(out->str);
    ck_assert(json_node_equal(back, ret));

    s = vn_ctl_format_sanitize("ok\x1b[31m\tred\x7f\xff");
    ck_assert_str_eq(s, "ok?[31m?red?\xef\xbf\xbd");
    /* a peer's escape sequences never reach the terminal through a table */
    g_string_truncate(out, 0);
    ck_assert(vn_ctl_format_nodes(out, evil, &error));
    ck_assert_ptr_null(strchr(out->str, '\x1b'));
    ck_assert_ptr_nonnull(strstr(out->str, "?[2Jx? "));
}
END_TEST

enum {
    F_NODES,
    F_DEVICES,
    F_SHOW,
    F_STATS,
    F_BORROW,
    F_ATTACH,
    F_REVOKE,
    F_RETURN,
    F_DETACH,
    F_UNPLUG
};

static const struct {
    int fmt;
    const char *json;
    const char *why; /* in the error message */
} bad_answers[] = {
    { F_NODES, "{}", "not a JSON array" },
    { F_NODES, "[1]", "entry 0: not a JSON object" },
    { F_NODES, "[{\"node\": \"a\", \"link\": \"up\"}]", "\"devices\" is missing" },
    { F_NODES, "[{\"node\": \"a\", \"link\": 1, \"devices\": 0}]", "\"link\" is not a string" },
    { F_DEVICES, "[{\"device\": \"a/b\", \"state\": \"lent\", \"borrower\": 3, \"lease\": 1}]",
      "\"borrower\" is not a string or null" },
    { F_DEVICES, "[{\"device\": \"a/b\", \"state\": \"lent\", \"lease\": \"17\"}]",
      "\"lease\" is not an integer or null" },
    { F_DEVICES, "[{\"state\": \"lent\"}]", "\"device\" is missing" },
    { F_DEVICES, "null", "not a JSON array" },
    { F_SHOW, "[]", "not a JSON object" },
    { F_SHOW, "{\"device\": 1}", "\"device\" is not a string" },
    { F_SHOW, "{\"device\": \"a/b\", \"state\": \"lent\", \"lease\": 1.5}", "\"lease\"" },
    { F_STATS, "{\"x\": 1}", "no \"device\", \"fabric\"" },
    { F_STATS, "3", "not a JSON object" },
    { F_STATS, "{\"lent\": {}}", "not a JSON array" },
    { F_STATS, "[{\"requests\": 1}]", "\"device\" is missing" },
    { F_STATS, "{\"fabric\": []}", "\"fabric\" is not an object" },
    { F_BORROW, "{\"device\": \"a/b\"}", "\"lease\" is missing" },
    { F_BORROW, "{\"device\": \"a/b\", \"lease\": \"x\"}", "\"lease\" is not an integer" },
    { F_ATTACH, "{\"device\": \"a/b\", \"lease\": 1}", "\"socket\" is missing" },
    { F_REVOKE, "{\"forced\": \"yes\"}", "\"forced\" is not a boolean" },
    { F_REVOKE, "{}", "\"forced\" is missing" },
    { F_RETURN, "[]", "not a JSON object" },
    { F_DETACH, "null", "not a JSON object" },
    { F_UNPLUG, "{}", "\"requested\" is missing" },
    { F_UNPLUG, "{\"requested\": 1}", "\"requested\" is not a boolean" },
};

START_TEST(test_format_malformed)
{
    g_autoptr(JsonNode) ret = json(bad_answers[_i].json);
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GError) error = NULL;
    bool ok = true;

    switch (bad_answers[_i].fmt) {
    case F_NODES:
        ok = vn_ctl_format_nodes(out, ret, &error);
        break;
    case F_DEVICES:
        ok = vn_ctl_format_devices(out, ret, &error);
        break;
    case F_SHOW:
        ok = vn_ctl_format_device(out, ret, &error);
        break;
    case F_STATS:
        ok = vn_ctl_format_stats(out, ret, &error);
        break;
    case F_BORROW:
        ok = vn_ctl_format_borrow(out, "hostb", ret, &error);
        break;
    case F_ATTACH:
        ok = vn_ctl_format_attach(out, "vm1", ret, &error);
        break;
    case F_REVOKE:
        ok = vn_ctl_format_revoke(out, "a/b", ret, &error);
        break;
    case F_RETURN:
        ok = vn_ctl_format_return(out, "a/b", ret, &error);
        break;
    case F_DETACH:
        ok = vn_ctl_format_detach(out, "a/b", ret, &error);
        break;
    case F_UNPLUG:
        ok = vn_ctl_format_unplug(out, "a/b", ret, &error);
        break;
    }
    ck_assert_msg(!ok, "accepted %s", bad_answers[_i].json);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL));
    ck_assert_msg(strstr(error->message, bad_answers[_i].why) != NULL, "%s: %s",
                  bad_answers[_i].json, error->message);
    ck_assert(g_str_has_prefix(error->message, "malformed answer to "));
}
END_TEST

/* ---- device names ------------------------------------------------------- */

static const struct {
    const char *dev;
    bool ok;
} devices[] = {
    { "hosta/nvme0", true },
    { "a/b", true },
    { "0/x", true },
    { "host-1/Name_with.dots-and-dash", true },
    { "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/x", true },                                 /* host: 31 */
    { "h/nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", true }, /* 63 */
    { "", false },
    { "nvme0", false },
    { "/nvme0", false },
    { "hosta/", false },
    { "Hosta/nvme0", false },
    { "-host/x", false },
    { "host_a/x", false },
    { "host a/x", false },
    { "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/x", false },                                 /* host: 32 */
    { "h/nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", false }, /* 64 */
    { "hosta/nv me0", false },
    { "hosta/a/b", false },
    { "hosta/nvme0\n", false },
    { "hosta/nvm\xc3\xa9", false },
    { "hosta//", false },
};

START_TEST(test_device_names)
{
    g_autoptr(GError) error = NULL;
    bool ok = vn_ctl_device_valid(devices[_i].dev, &error);

    ck_assert_msg(ok == devices[_i].ok, "\"%s\": %s", devices[_i].dev,
                  error != NULL ? error->message : "accepted");
    if (!ok) {
        ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE));
    }
}
END_TEST

START_TEST(test_default_socket)
{
    g_unsetenv(VN_CTL_SOCKET_ENV);
    ck_assert_str_eq(vn_ctl_default_socket(), "/run/vfio-ntb/control.sock");
    g_setenv(VN_CTL_SOCKET_ENV, "", TRUE);
    ck_assert_str_eq(vn_ctl_default_socket(), "/run/vfio-ntb/control.sock");
    g_setenv(VN_CTL_SOCKET_ENV, "/tmp/x.sock", TRUE);
    ck_assert_str_eq(vn_ctl_default_socket(), "/tmp/x.sock");
    g_unsetenv(VN_CTL_SOCKET_ENV);
    ck_assert_int_eq(vn_ctl_error_from_class("DeviceBusy"), VN_CTL_ERROR_DEVICE_BUSY);
    ck_assert_int_eq(vn_ctl_error_from_class("Unreachable"), VN_CTL_ERROR_GENERIC);
    ck_assert_int_eq(vn_ctl_error_from_class("NoSuchClass"), VN_CTL_ERROR_GENERIC);
    ck_assert_str_eq(vn_ctl_error_to_string(VN_CTL_ERROR_NOT_BORROWED), "NotBorrowed");
    ck_assert_str_eq(vn_ctl_error_to_string(VN_CTL_ERROR_LAST), "unknown");
}
END_TEST

/* ---- client against the fake daemon ---------------------------------- */

#define ANSWER_OK "{\"return\": {\"device\": \"hosta/nvme0\", \"lease\": 17}, \"id\": %ID%}\n"
#define ANSWER_BUSY                                                            \
    "{\"error\": {\"class\": \"DeviceBusy\", \"desc\": \"hosta/nvme0 is lent " \
    "to hostc (lease 17); use `ntbctl revoke` on hosta\"}, \"id\": %ID%}\n"
#define EVENT_LINE                                                 \
    "{\"event\": \"LINK_DOWN\", \"data\": {\"node\": \"hostc\"}, " \
    "\"timestamp\": {\"seconds\": 1764460000, \"microseconds\": 12}}\n"

/* Start a fake with these answers and borrow hosta/nvme0 from it. */
static JsonNode *borrow_from(CtlFake *f, const char *const *answers, int timeout_ms, GError **error)
{
    g_autoptr(VnCtlClient) c = NULL;
    g_autoptr(JsonObject) args = json_object_new();

    f->answers = answers;
    ctl_fake_start(f);
    c = vn_ctl_client_connect(f->path, timeout_ms, error);
    if (c == NULL) {
        return NULL;
    }
    json_object_set_string_member(args, "device", "hosta/nvme0");
    return vn_ctl_client_execute(c, "borrow", args, error);
}

START_TEST(test_client_ok)
{
    static const char *const answers[] = { ANSWER_OK, NULL };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(VnCtlClient) c = NULL;
    g_autoptr(JsonNode) ret = NULL;
    g_autoptr(JsonNode) req = NULL;
    g_autoptr(JsonNode) want = json("{\"execute\": \"query-nodes\", \"id\": 1}");

    f->answers = answers;
    ctl_fake_start(f);
    c = vn_ctl_client_connect(f->path, 2000, &error);
    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert_str_eq(vn_ctl_client_node(c), "hostb");
    ck_assert_str_eq(vn_ctl_client_version(c), "0.1.0");
    ck_assert_str_eq(vn_ctl_client_path(c), f->path);
    ret = vn_ctl_client_execute(c, "query-nodes", NULL, &error);
    ck_assert_msg(ret != NULL, "%s", error ? error->message : "");
    ck_assert_int_eq(json_object_get_int_member(json_node_get_object(ret), "lease"), 17);
    g_clear_pointer(&c, vn_ctl_client_free);
    ctl_fake_stop(f);
    ck_assert_uint_eq(f->conns, 1);
    ck_assert_uint_eq(f->requests->len, 1);
    req = json(f->requests->pdata[0]);
    ck_assert(json_node_equal(req, want));
}
END_TEST

START_TEST(test_client_arguments)
{
    static const char *const answers[] = { EVENT_LINE, EVENT_LINE, ANSWER_OK, NULL };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonNode) ret = borrow_from(f, answers, 2000, &error);
    g_autoptr(JsonNode) req = NULL;
    g_autoptr(JsonNode) want = json("{\"execute\": \"borrow\", \"arguments\": "
                                    "{\"device\": \"hosta/nvme0\"}, \"id\": 1}");

    /* the events before the answer were skipped */
    ck_assert_msg(ret != NULL, "%s", error ? error->message : "");
    ctl_fake_stop(f);
    req = json(f->requests->pdata[0]);
    ck_assert(json_node_equal(req, want));
}
END_TEST

START_TEST(test_client_refused)
{
    static const char *const busy[] = { ANSWER_BUSY, NULL };
    static const char *const odd[] = {
        "{\"error\": {\"class\": \"SomethingNew\", \"desc\": \"try later\"}, \"id\": %ID%}\n", NULL
    };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(CtlFake) g = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonNode) ret = borrow_from(f, busy, 2000, &error);

    ck_assert_ptr_null(ret);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_DEVICE_BUSY));
    /* the daemon's desc, verbatim */
    ck_assert_str_eq(error->message,
                     "hosta/nvme0 is lent to hostc (lease 17); use `ntbctl revoke` on hosta");
    g_clear_error(&error);
    ret = borrow_from(g, odd, 2000, &error);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_GENERIC));
    ck_assert_str_eq(error->message, "try later");
}
END_TEST

/* Answers the client must refuse as malformed (VN_CTL_ERROR_PROTOCOL). */
static const struct {
    const char *answer; /* NULL: a line over VN_CTL_MAX_LINE */
    const char *why;
} malformed_answers[] = {
    /* refused before json-glib reads it: one object or array, nothing else */
    { "this is not json\n", "is not a JSON object" },
    { "{\"return\": {}, \"id\": %ID%} trailing\n", "is not a JSON object" },
    { "{bad json}\n", "is not JSON" },
    { "[1, 2]\n", "is not a JSON object" },
    { "\n", "is not a JSON object" },
    { "{\"return\": {}, \"id\": 99}\n", "another id" },
    { "{\"return\": {}}\n", "another id" },
    { "{\"return\": {}, \"id\": \"1\"}\n", "another id" },
    { "{\"id\": %ID%}\n", "neither" },
    { "{\"return\": {}, \"error\": {}, \"id\": %ID%}\n", "both" },
    { "{\"error\": {\"class\": \"DeviceBusy\"}, \"id\": %ID%}\n", "malformed error answer" },
    { "{\"error\": \"busy\", \"id\": %ID%}\n", "malformed error answer" },
    { "{\"return\": {\"device\": \"hosta/nvme0\", \"lea", "in the middle of" },
    { "", "closed the connection before" },
    { "{\"return\": {}, \"id\": %ID%}\xff\n", "not valid UTF-8" },
    /* 33 levels: refused before json-glib recurses into them */
    { "{\"return\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], "
      "\"id\": %ID%}\n",
      "nested deeper than 32" },
    { NULL, "line limit" },
};

START_TEST(test_client_malformed)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(GString) big = g_string_new("{\"return\": \"");
    g_autoptr(VnCtlClient) c = NULL;
    g_autoptr(JsonNode) ret = NULL;
    const char *answers[] = { malformed_answers[_i].answer, NULL };

    if (answers[0] == NULL) {
        for (int i = 0; i < VN_CTL_MAX_LINE; i++) {
            g_string_append_c(big, 'a');
        }
        g_string_append(big, "\", \"id\": %ID%}\n");
        answers[0] = big->str;
    }
    f->answers = answers;
    ctl_fake_start(f);
    c = vn_ctl_client_connect(f->path, 2000, &error);
    ck_assert_ptr_nonnull(c);
    ret = vn_ctl_client_execute(c, "query-devices", NULL, &error);
    ck_assert_ptr_null(ret);
    ck_assert_msg(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL), "%s: %s",
                  vn_ctl_error_to_string(error->code), error->message);
    ck_assert_msg(strstr(error->message, malformed_answers[_i].why) != NULL, "%s", error->message);
    ck_assert_msg(strstr(error->message, f->path) != NULL, "%s", error->message);
    /* the stream is out of step: nothing more goes over it */
    g_clear_error(&error);
    ck_assert_ptr_null(vn_ctl_client_execute(c, "query-devices", NULL, &error));
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL));
    ck_assert_ptr_nonnull(strstr(error->message, "unusable"));
}
END_TEST

static const char *const bad_greetings[] = {
    "{\"qemu\": {\"version\": \"0.1.0\"}}",
    "{\"vfio-ntbd\": {\"version\": \"0.1.0\", \"node\": \"Host A\"}}",
    "{\"vfio-ntbd\": {\"version\": 1, \"node\": \"hosta\"}}",
    "{\"vfio-ntbd\": \"0.1.0\"}",
    "hello",
};

START_TEST(test_client_bad_greeting)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(VnCtlClient) c = NULL;

    f->greeting = bad_greetings[_i];
    ctl_fake_start(f);
    c = vn_ctl_client_connect(f->path, 2000, &error);
    ck_assert_ptr_null(c);
    ck_assert_msg(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL), "%s",
                  error->message);
}
END_TEST

START_TEST(test_client_timeout)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(CtlFake) mute = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonNode) ret = NULL;
    g_autoptr(VnCtlClient) c = NULL;
    gint64 t0 = g_get_monotonic_time();
    gint64 ms;

    /* greets, takes the request, never answers */
    f->hold = true;
    ret = borrow_from(f, NULL, 200, &error);
    ms = (g_get_monotonic_time() - t0) / 1000;
    ck_assert_ptr_null(ret);
    ck_assert_msg(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_TIMEOUT), "%s", error->message);
    ck_assert_ptr_nonnull(strstr(error->message, "did not come within 200 ms"));
    ck_assert_int_ge(ms, 200);
    ck_assert_int_lt(ms, 2000);

    /* accepts, never greets: the daemon is not usable */
    g_clear_error(&error);
    mute->greeting = NULL;
    mute->hold = true;
    ctl_fake_start(mute);
    c = vn_ctl_client_connect(mute->path, 200, &error);
    ck_assert_ptr_null(c);
    ck_assert_msg(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE), "%s",
                  error->message);
}
END_TEST

START_TEST(test_client_connect_timeout)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int filler = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    gint64 t0;
    VnCtlClient *c;

    /* A daemon that does not accept: its backlog (0: one pending) is full. */
    ck_assert_int_eq(listen(f->lfd, 0), 0);
    strcpy(sa.sun_path, f->path);
    ck_assert_int_eq(connect(filler, (struct sockaddr *)&sa, sizeof(sa)), 0);
    t0 = g_get_monotonic_time();
    c = vn_ctl_client_connect(f->path, 200, &error);
    ck_assert_ptr_null(c);
    ck_assert_msg(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE), "%s",
                  error->message);
    ck_assert_ptr_nonnull(strstr(error->message, "connect timed out"));
    ck_assert_int_lt(g_get_monotonic_time() - t0, 2 * G_USEC_PER_SEC);
    close(filler);
}
END_TEST

START_TEST(test_client_unreachable)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(GError) error = NULL;
    g_autofree char *missing = g_build_filename(f->dir, "missing.sock", NULL);
    g_autofree char *dead = g_build_filename(f->dir, "dead.sock", NULL);
    g_autofree char *longp = g_strnfill(200, 'x');
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    VnCtlClient *c;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);

    c = vn_ctl_client_connect(missing, 1000, &error);
    ck_assert_ptr_null(c);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE));
    ck_assert_ptr_nonnull(strstr(error->message, missing));
    g_clear_error(&error);

    /* a socket file nobody listens on (a daemon that died) */
    strcpy(sa.sun_path, dead);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
    c = vn_ctl_client_connect(dead, 1000, &error);
    ck_assert_ptr_null(c);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE));
    ck_assert_ptr_nonnull(strstr(error->message, "refused"));
    g_unlink(dead);
    g_clear_error(&error);

    c = vn_ctl_client_connect(longp, 1000, &error);
    ck_assert_ptr_null(c);
    ck_assert(g_error_matches(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE));
}
END_TEST

/* ---- the ntbctl binary -------------------------------------------------- */

/* Run ntbctl with args (NULL-terminated) and env VFIO_NTB_CONTROL=env_sock
 * (unset when NULL); returns its exit code. */
static int ntbctl(const char *env_sock, char **out, char **err, ...)
{
    g_autoptr(GPtrArray) argv = g_ptr_array_new();
    g_auto(GStrv) envp = g_get_environ();
    g_autoptr(GError) error = NULL;
    int status = 0;
    const char *a;
    va_list ap;

    g_ptr_array_add(argv, ntbctl_path);
    va_start(ap, err);
    while ((a = va_arg(ap, const char *)) != NULL) {
        g_ptr_array_add(argv, (char *)a);
    }
    va_end(ap);
    g_ptr_array_add(argv, NULL);
    envp = env_sock != NULL ? g_environ_setenv(envp, VN_CTL_SOCKET_ENV, env_sock, TRUE)
                            : g_environ_unsetenv(envp, VN_CTL_SOCKET_ENV);
    ck_assert_msg(g_spawn_sync(NULL, (char **)argv->pdata, envp, G_SPAWN_DEFAULT, NULL, NULL, out,
                               err, &status, &error),
                  "%s", error ? error->message : "");
    ck_assert_msg(WIFEXITED(status), "ntbctl died: status %d", status);
    return WEXITSTATUS(status);
}

START_TEST(test_ntbctl_usage_and_version)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autofree char *out = NULL;
    g_autofree char *err = NULL;

    ck_assert_msg(g_file_test(ntbctl_path, G_FILE_TEST_IS_EXECUTABLE), "no %s", ntbctl_path);
    ck_assert_int_eq(ntbctl("/nonexistent.sock", &out, &err, "--version", NULL), 0);
    ck_assert_str_eq(out, "ntbctl 0.1.0\n");

    /* every usage error leaves the daemon alone */
    ctl_fake_start(f);
#define USAGE(...)                                                           \
    do {                                                                     \
        g_clear_pointer(&out, g_free);                                       \
        g_clear_pointer(&err, g_free);                                       \
        ck_assert_int_eq(ntbctl(f->path, &out, &err, __VA_ARGS__, NULL), 2); \
        ck_assert(g_str_has_prefix(err, "ntbctl: "));                        \
        ck_assert_ptr_nonnull(strstr(err, "usage: ntbctl"));                 \
        ck_assert_str_eq(out, "");                                           \
    } while (0)
    USAGE("frobnicate");
    USAGE("show", "nvme0");
    USAGE("show", "hosta/nv me0");
    USAGE("borrow");
    USAGE("list", "extra");
    USAGE("list", "--bogus");
    USAGE("revoke", "hosta/nvme0", "--grace-ms", "soon");
    USAGE("attach", "hosta/nvme0");
    USAGE("attach", "hosta/nvme0", "--domain", "vm1", "--qmp", "relative.sock");
    USAGE("list", "--domain", "vm1");
    USAGE("show", "hosta/nvme0", "--to", "hostc:vm1");
    USAGE("reassign", "hosta/nvme0");
    USAGE("reassign", "hosta/nvme0", "--to", "hostc:");
    USAGE("reassign", "hosta/nvme0", "--to", "Host C:vm1");
    USAGE("reassign", "hosta/nvme0", "--to", "hostc:vm/1");
    USAGE("reassign", "hosta/nvme0", "--to", "hostc:vm1", "--bus", "pci.1");
    USAGE("xml");
    USAGE("xml", "hosta/nvme0", "--alias", "1bad");
    USAGE("xml", "--check", "f.xml", "hosta/nvme0");
    USAGE("attach", "hosta/nvme0", "--domain", "vm1", "--alias", "has space");
    USAGE("--timeout-ms", "0", "list");
    USAGE("list", "--config");
    USAGE("detach", "hosta/nvme0", "--config");
    USAGE("attach", "hosta/nvme0", "--domain", "vm1", "--qmp", "/q.sock", "--qdev-id", "d0",
          "--config");
    USAGE("attach", "hosta/nvme0", "--domain", "vm1", "--serve-only", "--alias", "a1");
    USAGE("attach", "hosta/nvme0", "--domain", "vm1", "--grace-ms", "5");
    USAGE("lend", "nvme1", "--allow", "hostb");
    USAGE("lend", "nvme1", "--pci", "0000:03:00.0", "--device-socket", "/d.sock", "--allow", "*");
    USAGE("lend", "nvme1", "--device-socket", "/d.sock", "--allow", "Host B");
    USAGE("lend", "nvme1", "--device-socket", "relative.sock", "--allow", "hostb");
    USAGE("lend", "nvme1", "--device-socket", "/d.sock");
    USAGE("lend", "nvme1", "--device-socket", "/d.sock", "--managed", "--allow", "hostb");
    USAGE("lend", "host/nvme1", "--device-socket", "/d.sock", "--allow", "hostb");
    USAGE("unlend");
    USAGE("events", "--count", "0");
    USAGE("help", "frobnicate");
    USAGE("version", "extra");
    USAGE("reassign", "hosta/nvme0", "--to", "hostc:vm1", "--hosts", "/nonexistent/hosts.conf");
#undef USAGE
    /* An option of another command says whose it is. */
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(
        ntbctl(f->path, &out, &err, "attach", "hosta/nvme0", "--domain", "v", "--to", "x", NULL),
        2);
    ck_assert_ptr_nonnull(strstr(err, "attach: --to is an option of reassign, not of attach"));
    /* --json: a usage error is JSON on stdout too */
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "--json", "list", "--name", NULL), 2);
    {
        g_autoptr(JsonNode) got = json(out);
        g_autoptr(JsonNode) want =
            json("{\"schema\": 1, \"command\": \"list\", \"error\": {\"class\": \"UsageError\","
                 " \"desc\": \"list: --name prints names only, --json everything: choose one\"}}");

        ck_assert_msg(json_node_equal(got, want), "%s", out);
    }
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, NULL), 2);
    ctl_fake_stop(f);
    ck_assert_uint_eq(f->conns, 0);
}
END_TEST

START_TEST(test_ntbctl_unreachable)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autofree char *missing = g_build_filename(f->dir, "missing.sock", NULL);
    g_autofree char *out = NULL;
    g_autofree char *err = NULL;

    ck_assert_int_eq(ntbctl(NULL, &out, &err, "--socket", missing, "list", NULL), 3);
    ck_assert_ptr_nonnull(strstr(err, missing));
    ck_assert_ptr_nonnull(strstr(err, "systemctl start vfio-ntbd"));
    ck_assert_str_eq(out, "");
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    /* the environment names the socket when --socket does not */
    ck_assert_int_eq(ntbctl(missing, &out, &err, "nodes", NULL), 3);
    ck_assert_ptr_nonnull(strstr(err, missing));
}
END_TEST

START_TEST(test_ntbctl_answers)
{
    static const char *const ok[] = {
        "{\"return\": [{\"device\": \"hosta/nvme0\", \"state\": \"available\", "
        "\"borrower\": null, \"lease\": null}], \"id\": %ID%}\n",
        NULL
    };
    static const char *const busy[] = { ANSWER_BUSY, NULL };
    static const char *const bad[] = { "{\"return\": 7, \"id\": %ID%}\n", NULL };
    static const char *const not_asked[] = { "{\"return\": {\"requested\": false}, "
                                             "\"id\": %ID%}\n",
                                             NULL };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autoptr(JsonNode) got = NULL;
    g_autoptr(JsonNode) want =
        json("{\"schema\": 1, \"command\": \"list\", \"changed\": false, \"return\":"
             " [{\"device\": \"hosta/nvme0\", \"state\": \"available\","
             " \"borrower\": null, \"lease\": null}]}");
    g_autofree char *out = NULL;
    g_autofree char *err = NULL;

    /* One fake, rescripted between runs: each run is one connection, over
     * before ntbctl exits, so the fake's thread is idle in accept(). */
    f->answers = ok;
    ctl_fake_start(f);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "list", NULL), 0);
    ck_assert_str_eq(out, "DEVICE       STATE      BORROWER  LEASE  ATTACHED  IDENTITY\n"
                          "hosta/nvme0  available  -         -      -         -\n");
    ck_assert_str_eq(err, "");
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(NULL, &out, &err, "--socket", f->path, "--json", "list", NULL), 0);
    got = json(out);
    ck_assert(json_node_equal(got, want));
    ctl_fake_stop(f);

    f->answers = busy;
    ctl_fake_start(f);
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "borrow", "hosta/nvme0", NULL), 6);
    ck_assert_str_eq(err, "ntbctl: hosta/nvme0 is lent to hostc (lease 17); "
                          "use `ntbctl revoke` on hosta\n");
    ck_assert_str_eq(out, "");
    ctl_fake_stop(f);

    f->answers = bad;
    ctl_fake_start(f);
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "nodes", NULL), 1);
    ck_assert_ptr_nonnull(strstr(err, "malformed answer to query-nodes"));
    ctl_fake_stop(f);

    /* An unplug QEMU could not be asked for is refused (exit 1), saying what to do. */
    f->answers = not_asked;
    ctl_fake_start(f);
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "unplug", "hosta/nvme0", NULL), 1);
    ck_assert(g_str_has_prefix(err, "ntbctl: hosta/nvme0: its QEMU takes no device requests"));
    ck_assert_str_eq(out, "");
    ctl_fake_stop(f);

    f->answers = NULL;
    f->hold = true;
    ctl_fake_start(f);
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "--timeout-ms", "200", "stats", NULL), 3);
    ck_assert_ptr_nonnull(strstr(err, "the answer to query-stats did not come within 200 ms"));
    ctl_fake_stop(f);
    ck_assert_uint_eq(f->conns, 6);
}
END_TEST

/* Each of the daemon's error classes, and one it does not know yet: the
 * exit code a script reads, and --json's error object. */
static const struct {
    const char *cls;
    int code;
} classes[] = {
    { "CommandNotFound", 2 }, { "InvalidParameter", 2 }, { "DeviceNotFound", 4 },
    { "AccessDenied", 5 },    { "DeviceBusy", 6 },       { "NotBorrowed", 7 },
    { "NodeUnreachable", 8 }, { "GenericError", 1 },     { "SomethingNew", 1 },
};

START_TEST(test_ntbctl_error_classes)
{
    g_autofree char *answer =
        g_strdup_printf("{\"error\": {\"class\": \"%s\", \"desc\": \"no luck\"}, \"id\": %%ID%%}\n",
                        classes[_i].cls);
    const char *answers[] = { answer, NULL };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autofree char *out = NULL;
    g_autofree char *err = NULL;
    g_autoptr(JsonNode) got = NULL;
    g_autoptr(JsonNode) want = NULL;
    g_autofree char *want_text = g_strdup_printf(
        "{\"schema\": 1, \"command\": \"borrow\", \"error\": {\"class\": \"%s\", \"desc\": "
        "\"no luck\"}}",
        strcmp(classes[_i].cls, "SomethingNew") == 0 ? "GenericError" : classes[_i].cls);

    f->answers = answers;
    ctl_fake_start(f);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "--json", "borrow", "hosta/nvme0", NULL),
                     classes[_i].code);
    got = json(out);
    want = json(want_text);
    ck_assert_msg(json_node_equal(got, want), "%s", out);
    ck_assert_str_eq(err, "ntbctl: no luck\n");
    ctl_fake_stop(f);
}
END_TEST

START_TEST(test_ntbctl_help)
{
    g_autofree char *out = NULL, *err = NULL, *again = NULL;

    ck_assert_int_eq(ntbctl("/nonexistent.sock", &out, &err, "help", "attach", NULL), 0);
    ck_assert(g_str_has_prefix(out, "usage: ntbctl attach DEV --domain D"));
    ck_assert_ptr_nonnull(strstr(out, "--serve-only"));
    ck_assert_ptr_nonnull(strstr(out, "example:\n  ntbctl attach hosta/nvme0 --domain vm1\n"));
    ck_assert_ptr_null(strstr(out, "--grace-ms")); /* revoke's, not attach's */
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl("/nonexistent.sock", &again, &err, "attach", "--help", NULL), 0);
    ck_assert_str_eq(out, again);
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl("/nonexistent.sock", &out, &err, "help", NULL), 0);
    for (const char *const *c = (const char *const[]){ "nodes", "list", "attach", "lend", "unlend",
                                                       "events", "version", "help", NULL };
         *c != NULL; c++) {
        g_autofree char *line = g_strdup_printf("\n  %-10s ", *c);

        ck_assert_msg(strstr(out, line) != NULL, "help lists no %s", *c);
    }
}
END_TEST

START_TEST(test_ntbctl_version)
{
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autofree char *out = NULL, *err = NULL;
    g_autofree char *want = NULL;

    ctl_fake_start(f);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "version", NULL), 0);
    want = g_strdup_printf("ntbctl 0.1.0\nvfio-ntbd 0.1.0 (node hostb, %s)\n", f->path);
    ck_assert_str_eq(out, want);
    ctl_fake_stop(f);
    /* ours even when the daemon is away, which exits 3 */
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl("/nonexistent.sock", &out, &err, "version", NULL), 3);
    ck_assert_str_eq(out, "ntbctl 0.1.0\n");
}
END_TEST

START_TEST(test_ntbctl_events)
{
    static const char *const answers[] = {
        "{\"return\": {}, \"id\": %ID%}\n",
        "{\"event\": \"LINK_UP\", \"data\": {\"node\": \"hosta\"}, \"timestamp\": "
        "{\"seconds\": 1764460000, \"microseconds\": 12}}\n",
        "{\"event\": \"LEASE_GRANTED\", \"data\": {\"device\": \"hosta/nvme0\", \"lease\": 17, "
        "\"node\": \"hosta\"}, \"timestamp\": {\"seconds\": 1764460001, \"microseconds\": 5}}\n",
        NULL
    };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autofree char *out = NULL, *err = NULL;
    g_auto(GStrv) lines = NULL;

    f->answers = answers;
    ctl_fake_start(f);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "events", "--count", "2", NULL), 0);
    ck_assert_str_eq(out, "2025-11-29T23:46:40.000012Z LINK_UP node=hosta\n"
                          "2025-11-29T23:46:41.000005Z LEASE_GRANTED device=hosta/nvme0 "
                          "lease=17 node=hosta\n");
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    /* --json: one object per line; the stream ends when the daemon goes (3) */
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "--json", "events", NULL), 3);
    lines = g_strsplit(out, "\n", -1);
    ck_assert_uint_eq(g_strv_length(lines), 4); /* two events, an error object, "" */
    {
        g_autoptr(JsonNode) got = json(lines[1]);
        g_autoptr(JsonNode) want = json(
            "{\"schema\": 1, \"event\": \"LEASE_GRANTED\", \"data\": {\"device\": \"hosta/nvme0\","
            " \"lease\": 17, \"node\": \"hosta\"}, \"timestamp\": \"2025-11-29T23:46:41.000005Z\"}");

        ck_assert_msg(json_node_equal(got, want), "%s", lines[1]);
    }
    ck_assert_ptr_nonnull(strstr(lines[2], "\"DaemonUnreachable\""));
    ctl_fake_stop(f);
    ck_assert_ptr_nonnull(strstr(f->requests->pdata[0], "\"subscribe-events\""));
}
END_TEST

/* attach without --serve-only needs libvirt to run the domain: a typo in its
 * name must not leave a device borrowed and served for nobody. */
START_TEST(test_ntbctl_attach_needs_domain)
{
    static const char *const served[] = {
        "{\"return\": {\"device\": \"hosta/nvme0\", \"lease\": 4, \"changed\": true, "
        "\"socket\": \"/run/vfio-ntb/vm-1-hosta-nvme0.sock\"}, \"id\": %ID%}\n",
        NULL
    };
    g_autoptr(CtlFake) f = ctl_fake_new();
    g_autofree char *out = NULL, *err = NULL;

    g_setenv("LIBVIRT_DEFAULT_URI", "qemu:///system?socket=/nonexistent/libvirt-sock", TRUE);
    f->answers = served;
    ctl_fake_start(f);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "attach", "hosta/nvme0", "--domain", "vm-1", NULL),
                     10);
    ck_assert_ptr_nonnull(strstr(err, "nothing changed"));
    ck_assert_ptr_nonnull(strstr(err, "--serve-only"));
    ck_assert_str_eq(out, "");
    ck_assert_uint_eq(f->conns, 0);
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    ck_assert_int_eq(ntbctl(f->path, &out, &err, "--json", "attach", "hosta/nvme0", "--domain",
                            "vm-1", "--serve-only", NULL),
                     0);
    ctl_fake_stop(f);
    g_unsetenv("LIBVIRT_DEFAULT_URI");
    ck_assert_uint_eq(f->conns, 1);
    ck_assert_ptr_nonnull(strstr(f->requests->pdata[0], "\"domain\":\"vm-1\""));
    ck_assert_ptr_nonnull(strstr(out, "\"changed\" : true"));
}
END_TEST

static Suite *ctl_suite(void)
{
    Suite *s = suite_create("ctl");
    TCase *tc = tcase_create("format");

    tcase_add_test(tc, test_format_devices);
    tcase_add_test(tc, test_format_nodes);
    tcase_add_test(tc, test_format_show);
    tcase_add_test(tc, test_format_stats);
    tcase_add_test(tc, test_format_actions);
    tcase_add_test(tc, test_format_json_and_sanitize);
    tcase_add_loop_test(tc, test_format_malformed, 0, G_N_ELEMENTS(bad_answers));
    suite_add_tcase(s, tc);

    tc = tcase_create("names");
    tcase_add_loop_test(tc, test_device_names, 0, G_N_ELEMENTS(devices));
    tcase_add_test(tc, test_default_socket);
    suite_add_tcase(s, tc);

    tc = tcase_create("client");
    tcase_add_test(tc, test_client_ok);
    tcase_add_test(tc, test_client_arguments);
    tcase_add_test(tc, test_client_refused);
    tcase_add_loop_test(tc, test_client_malformed, 0, G_N_ELEMENTS(malformed_answers));
    tcase_add_loop_test(tc, test_client_bad_greeting, 0, G_N_ELEMENTS(bad_greetings));
    tcase_add_test(tc, test_client_timeout);
    tcase_add_test(tc, test_client_connect_timeout);
    tcase_add_test(tc, test_client_unreachable);
    suite_add_tcase(s, tc);

    tc = tcase_create("ntbctl");
    /* spawns; slow under valgrind */
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_ntbctl_usage_and_version);
    tcase_add_test(tc, test_ntbctl_unreachable);
    tcase_add_test(tc, test_ntbctl_answers);
    tcase_add_loop_test(tc, test_ntbctl_error_classes, 0, G_N_ELEMENTS(classes));
    tcase_add_test(tc, test_ntbctl_help);
    tcase_add_test(tc, test_ntbctl_version);
    tcase_add_test(tc, test_ntbctl_events);
    tcase_add_test(tc, test_ntbctl_attach_needs_domain);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    g_autofree char *dir = g_path_get_dirname(argv[0]);
    SRunner *sr = srunner_create(ctl_suite());
    int failed;

    ntbctl_path = g_build_filename(dir, "..", "ntbctl", NULL);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    g_free(ntbctl_path);
    return failed == 0 ? 0 : 1;
}
