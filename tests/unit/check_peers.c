/*
 * Unit tests of the daemon-to-daemon codec (vfio-ntb/daemon/peers.c): what
 * we encode decodes to the same, and a table of hostile or broken messages
 * is refused whole with a reason (nothing read in part).
 */
#include "daemon/peers.h"

#include "check-main.h"

#include <check.h>
#include <string.h>

static VnPeersAnnounce *sample(void)
{
    VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);

    g_strlcpy(a->node, "hosta", sizeof(a->node));
    a->n_devices = 2;
    g_strlcpy(a->devices[0].name, "nvme0", sizeof(a->devices[0].name));
    a->devices[0].lent = true;
    g_strlcpy(a->devices[0].borrower, "hostb", sizeof(a->devices[0].borrower));
    a->devices[0].lease = 7;
    a->devices[0].server_down = true; /* its device server died (and came back twice) */
    a->devices[0].server_gen = 2;
    a->devices[0].id = (VnIdentity){ .known = true,
                                     .pci = "0000:3b:00.0",
                                     .vendor = 0x1b36,
                                     .device = 0x0010,
                                     .class_code = 0x010802,
                                     .name = "Non-Volatile memory controller: QEMU",
                                     .size = 64 << 20 };
    g_strlcpy(a->devices[1].name, "gpu0", sizeof(a->devices[1].name));
    a->devices[1].denied = true; /* its access list does not name the node told */
    a->n_holds = 1;
    g_strlcpy(a->holds[0].lender, "hostc", sizeof(a->holds[0].lender));
    g_strlcpy(a->holds[0].name, "nic0", sizeof(a->holds[0].name));
    a->holds[0].lease = 12;
    g_strlcpy(a->holds[0].domain, "vm-7", sizeof(a->holds[0].domain));
    a->answer = true; /* its link to the node told flapped */
    return a;
}

START_TEST(test_announce_round_trip)
{
    g_autofree VnPeersAnnounce *a = sample();
    g_autofree VnPeersAnnounce *b = g_new0(VnPeersAnnounce, 1);
    g_autofree char *json = vn_peers_announce_to_json(a);
    g_autoptr(GError) error = NULL;

    ck_assert_msg(vn_peers_announce_from_json(json, "hosta", b, &error), "%s",
                  error ? error->message : "");
    ck_assert_mem_eq(a, b, sizeof(*a));
    ck_assert(vn_peers_announce_holds(b, "hostc", "nic0", 12));
    ck_assert(!vn_peers_announce_holds(b, "hostc", "nic0", 11));
    ck_assert(!vn_peers_announce_holds(b, "hosta", "nic0", 12));
    /* Someone else's announcement, relayed or forged, is not taken. */
    ck_assert(!vn_peers_announce_from_json(json, "hostb", b, &error));
}
END_TEST

/* The most a node has, and one more. */
START_TEST(test_announce_bounds)
{
    g_autofree VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);
    g_autofree VnPeersAnnounce *b = g_new0(VnPeersAnnounce, 1);
    g_autoptr(GError) error = NULL;
    g_autofree char *json = NULL;
    g_autoptr(GString) over = NULL;

    g_strlcpy(a->node, "hosta", sizeof(a->node));
    a->n_devices = a->n_holds = VN_CONF_MAX_DEVICES;
    for (unsigned i = 0; i < VN_CONF_MAX_DEVICES; i++) {
        g_snprintf(a->devices[i].name, sizeof(a->devices[i].name), "d%u", i);
        g_strlcpy(a->holds[i].lender, "hostb", sizeof(a->holds[i].lender));
        g_snprintf(a->holds[i].name, sizeof(a->holds[i].name), "h%u", i);
        a->holds[i].lease = i + 1;
    }
    json = vn_peers_announce_to_json(a);
    ck_assert(vn_peers_announce_from_json(json, "hosta", b, NULL));
    ck_assert_uint_eq(b->n_holds, VN_CONF_MAX_DEVICES);
    /* 65 holds: refused whole, not read up to 64 (a lease past the part read
     * would look given up). */
    over = g_string_new("{\"node\":\"hosta\",\"devices\":[],\"holds\":[");
    for (unsigned i = 0; i <= VN_CONF_MAX_DEVICES; i++) {
        g_string_append_printf(over, "%s{\"lender\":\"hostb\",\"name\":\"h%u\",\"lease\":%u}",
                               i ? "," : "", i, i + 1);
    }
    g_string_append(over, "]}");
    ck_assert(!vn_peers_announce_from_json(over->str, "hosta", b, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "holds"));
}
END_TEST

static const struct {
    const char *json;
    const char *why; /* in the error message */
} bad_announcements[] = {
    { NULL, "not a JSON object" },
    { "", "" },
    { "[]", "object" },
    { "{\"node\":\"hosta\"}", "devices" },
    { "{\"node\":\"hostb\",\"devices\":[]}", "another node" },
    { "{\"node\":\"HOSTA\",\"devices\":[]}", "node" },
    { "{\"node\":7,\"devices\":[]}", "node" },
    { "{\"node\":\"hosta\",\"devices\":{}}", "devices" },
    { "{\"node\":\"hosta\",\"answer\":1,\"devices\":[]}", "answer" },
    { "{\"node\":\"hosta\",\"devices\":[7]}", "devices" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"../x\",\"state\":\"available\"}]}", "name" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"broken\"}]}", "state" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"lent\"}]}", "borrower" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"lent\",\"borrower\":"
      "\"hostb\",\"lease\":0}]}",
      "lease" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"lent\",\"borrower\":"
      "\"hostb\",\"lease\":-3}]}",
      "lease" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"lent\",\"borrower\":"
      "\"hostb\",\"lease\":9007199254740993}]}",
      "lease" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"lent\",\"borrower\":"
      "\"hostb\",\"lease\":\"5\"}]}",
      "lease" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\",\"borrower\":"
      "\"hostb\"}]}",
      "borrower" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\"},"
      "{\"name\":\"x\",\"state\":\"available\"}]}",
      "devices" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"id\":7}]}",
      "id" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"id\":{\"pci\":\"../../etc\",\"name\":\"n\",\"vendor\":1,\"device\":1,\"class\":1,"
      "\"size\":0}}]}",
      "id" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"id\":{\"pci\":\"0000:3b:00.0\",\"name\":\"n\",\"vendor\":65536,\"device\":1,"
      "\"class\":1,\"size\":0}}]}",
      "vendor" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"id\":{\"pci\":\"0000:3b:00.0\",\"name\":\"0123456789012345678901234567890123456789"
      "01234567890123456789012345678901234567890123456789012345678901234567890123456789012345"
      "6789\",\"vendor\":1,\"device\":1,\"class\":1,\"size\":0}}]}",
      "id" },
    /* a device server's state that is not one */
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"server\":true}]}",
      "server" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"server\":{\"up\":1,\"generation\":1}}]}",
      "server" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"server\":{\"up\":true,\"generation\":4294967296}}]}",
      "generation" },
    { "{\"node\":\"hosta\",\"devices\":[{\"name\":\"x\",\"state\":\"available\","
      "\"server\":{\"up\":true}}]}",
      "generation" },
    { "{\"node\":\"hosta\",\"devices\":[],\"holds\":7}", "holds" },
    { "{\"node\":\"hosta\",\"devices\":[],\"holds\":[{\"lender\":\"hostb\",\"name\":\"x\"}]}",
      "lease" },
    { "{\"node\":\"hosta\",\"devices\":[],\"holds\":[\"x\"]}", "holds" },
    /* a domain name a VM cannot have: it would end up in list's output and metrics labels */
    { "{\"node\":\"hosta\",\"devices\":[],\"holds\":[{\"lender\":\"hostb\",\"name\":\"x\","
      "\"lease\":1,\"domain\":\"vm\\\"}\"}]}",
      "domain" },
    { "{\"node\":\"hosta\",\"devices\":[],\"holds\":[{\"lender\":\"\",\"name\":\"x\","
      "\"lease\":1}]}",
      "lender" },
    { "{\"node\":\"hosta\",\"devices\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]"
      "]]]]]]]]]]]]}",
      "" },
};

START_TEST(test_announce_refused)
{
    g_autofree VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);
    g_autoptr(GError) error = NULL;

    ck_assert_msg(!vn_peers_announce_from_json(bad_announcements[_i].json, "hosta", a, &error),
                  "took %s", bad_announcements[_i].json);
    ck_assert_ptr_nonnull(error);
    ck_assert_msg(strstr(error->message, bad_announcements[_i].why) != NULL, "%s: %s",
                  bad_announcements[_i].json ? bad_announcements[_i].json : "NULL", error->message);
}
END_TEST

START_TEST(test_requests_round_trip)
{
    static const VnPeersType types[] = { VN_PEERS_BORROW, VN_PEERS_RETURN, VN_PEERS_REVOKE };
    VnPeersRequest rq = { .lease = 42, .grace_ms = 5000 }, got;
    uint64_t lease = 0;

    g_strlcpy(rq.device, "nvme0", sizeof(rq.device));
    for (unsigned i = 0; i < G_N_ELEMENTS(types); i++) {
        g_autofree char *json = vn_peers_request_to_json(types[i], &rq);
        g_autoptr(GError) error = NULL;

        ck_assert_msg(vn_peers_request_from_json(types[i], json, &got, &error), "%s: %s", json,
                      error ? error->message : "");
        ck_assert_str_eq(got.device, "nvme0");
        ck_assert_uint_eq(got.lease, types[i] == VN_PEERS_BORROW ? 0 : 42);
        ck_assert_uint_eq(got.grace_ms, types[i] == VN_PEERS_REVOKE ? 5000 : 0);
    }
    {
        g_autofree char *json = vn_peers_lease_to_json(9);

        ck_assert(vn_peers_lease_from_json(json, &lease, NULL));
        ck_assert_uint_eq(lease, 9);
    }
    ck_assert(!vn_peers_lease_from_json("{\"lease\":0}", &lease, NULL));
    ck_assert(!vn_peers_lease_from_json("{}", &lease, NULL));
    ck_assert(!vn_peers_lease_from_json(NULL, &lease, NULL));
}
END_TEST

/* P2P_SHARE and P2P_ALLOW (docs/p2p.md): the node and the segments come back as sent; a
 * share's reply has as many segments as were asked for, no more, no fewer. */
START_TEST(test_p2p_round_trip)
{
    static const VnPeersType types[] = { VN_PEERS_P2P_SHARE, VN_PEERS_P2P_ALLOW };
    VnPeersRequest rq = { .lease = 7, .nr_segments = 3, .segments = { 11, 12, 13 } }, got;
    uint64_t segs[VN_PEERS_MAX_SEGMENTS] = { 0 };
    g_autofree char *reply = NULL;

    g_strlcpy(rq.device, "nvme1", sizeof(rq.device));
    g_strlcpy(rq.node, "hosta", sizeof(rq.node));
    for (unsigned i = 0; i < G_N_ELEMENTS(types); i++) {
        g_autofree char *json = vn_peers_request_to_json(types[i], &rq);
        g_autoptr(GError) error = NULL;

        ck_assert_msg(vn_peers_request_from_json(types[i], json, &got, &error), "%s: %s", json,
                      error ? error->message : "");
        ck_assert_str_eq(got.node, "hosta");
        ck_assert_uint_eq(got.lease, 7);
        ck_assert_uint_eq(got.nr_segments, 3);
        ck_assert_uint_eq(got.segments[2], 13);
    }
    reply = vn_peers_segments_to_json(rq.segments, 3);
    ck_assert(vn_peers_segments_from_json(reply, segs, 3, NULL));
    ck_assert_uint_eq(segs[0], 11);
    ck_assert(!vn_peers_segments_from_json(reply, segs, 2, NULL));
    ck_assert(!vn_peers_segments_from_json(reply, segs, 4, NULL));
    ck_assert(!vn_peers_segments_from_json("{\"segments\":[0]}", segs, 1, NULL));
    ck_assert(!vn_peers_segments_from_json(NULL, segs, 1, NULL));
}
END_TEST

static const struct {
    VnPeersType type;
    const char *json;
    const char *why;
} bad_requests[] = {
    { VN_PEERS_BORROW, "{}", "device" },
    { VN_PEERS_BORROW, "{\"device\":\"a/b\"}", "device" },
    { VN_PEERS_BORROW,
      "{\"device\":\""
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
      "device" },
    { VN_PEERS_RETURN, "{\"device\":\"nvme0\"}", "lease" },
    { VN_PEERS_RETURN, "{\"device\":\"nvme0\",\"lease\":0}", "lease" },
    { VN_PEERS_REVOKE, "{\"device\":\"nvme0\",\"lease\":3}", "grace_ms" },
    { VN_PEERS_REVOKE, "{\"device\":\"nvme0\",\"lease\":3,\"grace_ms\":600001}", "grace_ms" },
    { VN_PEERS_ANNOUNCE, "{\"device\":\"nvme0\"}", "not a request" },
    { VN_PEERS_TYPE_LAST, "{\"device\":\"nvme0\"}", "not a request" },
    { VN_PEERS_BORROW, "nope", "" },
    { VN_PEERS_P2P_SHARE, "{\"device\":\"nvme0\",\"lease\":3,\"segments\":[1]}", "node" },
    { VN_PEERS_P2P_SHARE, "{\"device\":\"nvme0\",\"lease\":3,\"node\":\"../x\",\"segments\":[1]}",
      "node" },
    { VN_PEERS_P2P_SHARE, "{\"device\":\"nvme0\",\"lease\":3,\"node\":\"a\",\"segments\":[]}",
      "segments" },
    { VN_PEERS_P2P_ALLOW, "{\"device\":\"nvme0\",\"lease\":3,\"node\":\"a\",\"segments\":[0]}",
      "segments" },
    { VN_PEERS_P2P_ALLOW, "{\"device\":\"nvme0\",\"lease\":3,\"node\":\"a\",\"segments\":[-1]}",
      "segments" },
    { VN_PEERS_P2P_ALLOW, "{\"device\":\"nvme0\",\"lease\":3,\"node\":\"a\",\"segments\":\"x\"}",
      "segments" },
    { VN_PEERS_P2P_ALLOW,
      "{\"device\":\"nvme0\",\"lease\":3,\"node\":\"a\",\"segments\":[1,2,3,4,5,6,7,8,9,10,11,12,"
      "13,14,15,16,17]}",
      "segments" },
    { VN_PEERS_P2P_ALLOW, "{\"device\":\"nvme0\",\"node\":\"a\",\"segments\":[1]}", "lease" },
};

START_TEST(test_requests_refused)
{
    VnPeersRequest got;
    g_autoptr(GError) error = NULL;

    ck_assert_msg(
        !vn_peers_request_from_json(bad_requests[_i].type, bad_requests[_i].json, &got, &error),
        "took %s", bad_requests[_i].json);
    ck_assert_msg(strstr(error->message, bad_requests[_i].why) != NULL, "%s: %s",
                  bad_requests[_i].json, error->message);
}
END_TEST

static Suite *peers_suite(void)
{
    Suite *s = suite_create("peers");
    TCase *tc = tcase_create("announce");

    tcase_add_test(tc, test_announce_round_trip);
    tcase_add_test(tc, test_announce_bounds);
    tcase_add_loop_test(tc, test_announce_refused, 0, G_N_ELEMENTS(bad_announcements));
    suite_add_tcase(s, tc);
    tc = tcase_create("requests");
    tcase_add_test(tc, test_requests_round_trip);
    tcase_add_test(tc, test_p2p_round_trip);
    tcase_add_loop_test(tc, test_requests_refused, 0, G_N_ELEMENTS(bad_requests));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(peers_suite());
}
