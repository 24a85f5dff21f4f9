/*
 * Unit tests of the ntb backend's link keys (vfio-ntb/fabric/ntb-auth.c and their use in
 * ntb.c): nodes over emulated port pairs (fabric-rig.h) that hold the link's key come up,
 * a node with another key or none never does, a raw peer that skips or repeats a step of
 * the exchange is refused, and the key file is checked.
 */
#include "check-main.h"
#include "fabric-rig.h"
#include "fabric/ntb-auth.h"
#include "fabric/ntb.h"
#include "fabric/ntbport.h"

#define KEY_AB "000102030405060708090a0b0c0d0e0f"
#define KEY_AC "101112131415161718191a1b1c1d1e1f"
#define KEY_BC "202122232425262728292a2b2c2d2e2f"
#define KEY_WRONG "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"

/* A key file in the rig's directory with @text, mode @mode; its path. */
static char *key_file(const char *name, const char *text, int mode)
{
    char *path = g_build_filename(tmpdir, name, NULL);

    ck_assert(g_file_set_contents(path, text, -1, NULL));
    ck_assert_int_eq(chmod(path, (mode_t)mode), 0);
    return path;
}

/* Node @name ("a" or "b": the rig cables each to b/a and c) with the key file @text. */
static Node *keyed_node(const char *name, const char *text)
{
    g_autofree char *file = g_strdup_printf("keys-%s-%u", name, g_random_int());
    g_autofree char *path = key_file(file, text, 0600);
    const char *kv[] = { "key-file", path, NULL };

    return node_open_kv(name, false, kv);
}

/* ---- the exchange ------------------------------------------------------- */

/* Both ends of a link hold its key: the link comes up and carries messages. */
START_TEST(test_keyed_link_up)
{
    Node *a = keyed_node("a", "# hosta's links\nb " KEY_AB "\nc\t" KEY_AC "\n");
    Node *b = keyed_node("b", "a " KEY_AB "\nc " KEY_BC "\n");

    link_nodes(a, b);
    WAIT_FOR(log_has(b, "up:a"));
    assert_echo(a, "b", "{\"keyed\":1}");
    ck_assert_uint_eq(stats_of(a).bad_messages, 0);
}
END_TEST

/* A host that names itself after b (the port says =b) with another key is refused, and
 * keeps being refused at most once a second; once the real b comes, the link comes up. */
START_TEST(test_wrong_key_refused)
{
    Node *a = keyed_node("a", "b " KEY_AB "\nc " KEY_AC "\n");
    Node *b = keyed_node("b", "a " KEY_WRONG "\nc " KEY_BC "\n");
    uint64_t refused;

    spin(2500);
    ck_assert_uint_eq(log_count(a, "up:"), 0);
    ck_assert_uint_eq(log_count(b, "up:"), 0);
    refused = stats_of(a).bad_messages;
    ck_assert_uint_ge(refused, 1);
    /* Not a session as fast as the impostor asks: about one a second after the first two. */
    ck_assert_uint_le(refused, 6);
    node_close(b);
    b = keyed_node("b", "a " KEY_AB "\nc " KEY_BC "\n");
    WAIT_FOR(log_has(a, "up:b") && log_has(b, "up:a"));
    assert_echo(a, "b", "{\"real\":1}");
}
END_TEST

/* A keyed link does not come up with a peer that has no key file.  (The peer's side may
 * come up on the HELLO, until the CHALLENGE it cannot answer ends it.) */
START_TEST(test_unkeyed_peer_refused)
{
    Node *a = keyed_node("a", "b " KEY_AB "\nc " KEY_AC "\n");
    Node *b = node_open("b", false);

    spin(2000);
    ck_assert_uint_eq(log_count(a, "up:"), 0);
    WAIT_FOR(log_count(b, "up:") == log_count(b, "down:"));
    ck_assert_uint_ge(stats_of(a).bad_messages + stats_of(b).bad_messages, 1);
}
END_TEST

/* The PROOF is HMAC-SHA256 of what ntb-auth.h says (a value computed apart, with Python's
 * hmac), and every input changes it: one made for another session or direction proves
 * nothing. */
START_TEST(test_proof)
{
    static const uint8_t key[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
    static const char want[] = "5973f948ea3157052ac16dac90ad034d50f0c85b6d8ee11b927e7bf999600043";
    uint8_t n1[VN_NTB_AUTH_NONCE_LEN], n2[VN_NTB_AUTH_NONCE_LEN];
    uint8_t p[VN_NTB_AUTH_PROOF_LEN], q[VN_NTB_AUTH_PROOF_LEN];
    char hex[2 * VN_NTB_AUTH_PROOF_LEN + 1];

    memset(n1, 0x11, sizeof(n1));
    memset(n2, 0x22, sizeof(n2));
    vn_ntb_auth_proof(key, sizeof(key), "a", "b", 0x1234, 0xabcd, n1, n2, p);
    for (unsigned i = 0; i < sizeof(p); i++) {
        g_snprintf(hex + 2 * i, 3, "%02x", p[i]);
    }
    ck_assert_str_eq(hex, want);
    vn_ntb_auth_proof(key, sizeof(key), "b", "a", 0x1234, 0xabcd, n1, n2, q);
    ck_assert_mem_ne(p, q, sizeof(p));
    vn_ntb_auth_proof(key, sizeof(key), "a", "b", 0xabcd, 0x1234, n1, n2, q);
    ck_assert_mem_ne(p, q, sizeof(p));
    vn_ntb_auth_proof(key, sizeof(key), "a", "b", 0x1234, 0xabcd, n2, n1, q);
    ck_assert_mem_ne(p, q, sizeof(p));
    vn_ntb_auth_proof(key, sizeof(key), "ab", "", 0x1234, 0xabcd, n1, n2, q);
    ck_assert_mem_ne(p, q, sizeof(p));
    vn_ntb_auth_proof(key, 15, "a", "b", 0x1234, 0xabcd, n1, n2, q);
    ck_assert_mem_ne(p, q, sizeof(p));
}
END_TEST

/* ---- a peer that does not follow the exchange ----------------------------- */

/* What a raw peer of keyed node b writes after its HELLO: each row must end the session
 * without the link coming up. */
typedef enum AuthFault {
    AUTH_PROOF_FIRST,     /* a PROOF before any CHALLENGE */
    AUTH_FRAME_FIRST,     /* a fabric frame before its PROOF */
    AUTH_CHALLENGE_TWICE, /* two CHALLENGEs in one session */
    AUTH_CHALLENGE_SHORT, /* a CHALLENGE of the wrong size */
    AUTH_LAST
} AuthFault;

/* Put record @kind with @len bytes of @payload at @pos of the ring behind @ring; the index
 * after it. */
static uint64_t put_rec(uint8_t *ring, uint64_t pos, uint16_t kind, const void *payload,
                        uint32_t len)
{
    uint8_t rec[sizeof(VnNtbRec) + 64] = { 0 };
    uint32_t padded = (len + 7) & ~7u;

    ck_assert_uint_le(len, 64);
    *(VnNtbRec *)rec = (VnNtbRec){ .len = len, .kind = kind };
    memcpy(rec + sizeof(VnNtbRec), payload, len);
    vn_ntb_ring_put(ring + VN_NTB_RING_DATA, VN_NTB_MIN_RING, pos, rec, sizeof(VnNtbRec) + padded);
    return pos + sizeof(VnNtbRec) + padded;
}

START_TEST(test_out_of_order)
{
    static const char *const small[] = { "ring-size", "65536", NULL };
    g_autoptr(VnNtbPort) raw = NULL;
    g_autofree char *key = g_strdup_printf("%s/raw", tmpdir);
    g_autofree char *spec = g_strdup_printf("pair:%s/0", key);
    g_autofree char *port = g_strdup_printf("pair:%s/1=a", key);
    g_autofree char *keys = key_file("keys-b", "a " KEY_AB "\n", 0600);
    const char *kv[] = { "ports", port, small[0], small[1], "key-file", keys, NULL };
    VnNtbHello hello = { .version = VN_NTB_VERSION, .node = "a" };
    VnNtbChallenge challenge = { .nonce = { 1, 2, 3 } };
    VnNtbProof proof = { .mac = { 4, 5, 6 } };
    uint8_t frame[8] = { 0 }, *mine = NULL, *theirs;
    uint64_t offset = 0, size = 0, prod, bytes = VN_NTB_RING_DATA + VN_NTB_MIN_RING;
    uint32_t announced = 0, again = 0;
    uint16_t tag;
    Node *b;
    int fd;

    /* The raw peer's side of a session (ntb.h): a buffer, an epoch, announced. */
    raw = vn_ntbport_open(spec, NULL);
    ck_assert_ptr_nonnull(raw);
    ck_assert_int_eq(raw->ops->in_alloc(raw, 0, bytes, &mine), 0);
    ck_assert_int_eq(raw->ops->peer_spad_write(raw, VN_NTB_SPAD_PAGES, (uint32_t)(bytes / 4096)),
                     0);
    ck_assert_int_eq(
        raw->ops->peer_spad_write(raw, VN_NTB_SPAD_HELLO, VN_NTB_SPAD_MAGIC << 16 | 0x77), 0);
    b = node_open_kv("b", false, kv);
    WAIT_FOR(raw->ops->spad_read(raw, VN_NTB_SPAD_HELLO, &announced) == 0 &&
             announced >> 16 == VN_NTB_SPAD_MAGIC);
    tag = vn_ntb_tag(0x77, (uint16_t)announced);
    fd = raw->ops->out_fd(raw, 0, true, &offset, &size);
    ck_assert_int_ge(fd, 0);
    theirs = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    close(fd);
    ck_assert(theirs != MAP_FAILED);

    prod = put_rec(theirs, 0, VN_NTB_REC_HELLO, &hello, sizeof(hello));
    switch (_i) {
    case AUTH_PROOF_FIRST:
        prod = put_rec(theirs, prod, VN_NTB_REC_PROOF, &proof, sizeof(proof));
        break;
    case AUTH_FRAME_FIRST:
        prod = put_rec(theirs, prod, VN_NTB_REC_CHALLENGE, &challenge, sizeof(challenge));
        prod = put_rec(theirs, prod, VN_NTB_REC_FRAME, frame, sizeof(frame));
        break;
    case AUTH_CHALLENGE_TWICE:
        prod = put_rec(theirs, prod, VN_NTB_REC_CHALLENGE, &challenge, sizeof(challenge));
        prod = put_rec(theirs, prod, VN_NTB_REC_CHALLENGE, &challenge, sizeof(challenge));
        break;
    default:
        prod = put_rec(theirs, prod, VN_NTB_REC_CHALLENGE, &challenge, 8);
        break;
    }
    __atomic_store_n((uint64_t *)theirs, (uint64_t)tag << 48 | prod, __ATOMIC_RELEASE);
    raw->ops->peer_doorbell(raw, UINT64_C(1) << VN_NTB_DB_MSG);
    /* b refuses it and starts over: a new epoch of its own in our scratchpad. */
    WAIT_FOR(stats_of(b).bad_messages == 1);
    WAIT_FOR(raw->ops->spad_read(raw, VN_NTB_SPAD_HELLO, &again) == 0 && again != announced);
    ck_assert_uint_eq(log_count(b, "up:"), 0);
    ck_assert_uint_eq(stats_of(b).msgs_received, 0);
    munmap(theirs, bytes);
}
END_TEST

/* ---- the key file -------------------------------------------------------- */

static const struct {
    const char *text;
    int mode;
    const char *why;
} bad_files[] = {
    { "b " KEY_AB "\nc " KEY_AC "\n", 0640, "chmod 600" },
    { "b " KEY_AB "\nc " KEY_AC "\n", 0604, "chmod 600" },
    { "b\n", 0600, "line 1: expected \"NODE KEY\"" },
    { "b " KEY_AB " extra\n", 0600, "more words" },
    { "# fine\nNot/A/Node " KEY_AB "\n", 0600, "line 2: the first word is not a node name" },
    { "b 0001020304\n", 0600, "16 to 64 bytes" },
    { "b " KEY_AB "0\n", 0600, "16 to 64 bytes" },
    { "b 000102030405060708090a0b0c0d0e0g\n", 0600, "not hex" },
    { "b " KEY_AB "\nb " KEY_AC "\n", 0600, "line 2: a second key for the same node" },
    /* The ports' nodes (b and c) must each have a key. */
    { "b " KEY_AB "\n", 0600, "holds that node's key" },
};

START_TEST(test_bad_key_file)
{
    g_autofree char *path = key_file("keys", bad_files[_i].text, bad_files[_i].mode);
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autofree char *ports = g_strdup_printf("pair:%s/a+b/0=b,pair:%s/a+c/0=c", tmpdir, tmpdir);
    g_autoptr(GError) error = NULL;
    const char *bad = NULL;

    g_hash_table_insert(params, "ports", ports);
    g_hash_table_insert(params, "key-file", path);
    ck_assert(!vn_fabric_params_check("ntb", params, &bad, &error));
    ck_assert_msg(strstr(error->message, bad_files[_i].why) != NULL, "%s", error->message);
    ck_assert_str_eq(bad, strstr(bad_files[_i].why, "node's key") ? "ports" : "key-file");
    /* Opening refuses it the same way, and opens no port. */
    g_clear_error(&error);
    ck_assert_ptr_null(vn_fabric_open("ntb", "a", params, &handlers, NULL, ctx, &error));
    ck_assert_msg(strstr(error->message, bad_files[_i].why) != NULL, "%s", error->message);
}
END_TEST

/* With a key file, a port that does not name its node is refused; an absent file too. */
START_TEST(test_key_file_needs_names)
{
    g_autofree char *path = key_file("keys", "b " KEY_AB "\n", 0600);
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autofree char *ports = g_strdup_printf("pair:%s/a+b/0", tmpdir);
    g_autoptr(GError) error = NULL;
    const char *bad = NULL;

    g_hash_table_insert(params, "ports", ports);
    g_hash_table_insert(params, "key-file", path);
    ck_assert(!vn_fabric_params_check("ntb", params, &bad, &error));
    ck_assert_msg(strstr(error->message, "PORT=NODE") != NULL, "%s", error->message);
    g_clear_error(&error);
    g_hash_table_insert(params, "key-file", "/nonexistent/keys");
    ck_assert(!vn_fabric_params_check("ntb", params, &bad, &error));
    ck_assert_msg(strstr(error->message, "No such file") != NULL, "%s", error->message);
    ck_assert_str_eq(bad, "key-file");
}
END_TEST

static Suite *ntb_auth_suite(void)
{
    Suite *s = suite_create("ntb-auth");
    TCase *tc = tcase_create("exchange");

    tcase_add_checked_fixture(tc, setup_ntb, teardown);
    tcase_add_test(tc, test_keyed_link_up);
    tcase_add_test(tc, test_wrong_key_refused);
    tcase_add_test(tc, test_unkeyed_peer_refused);
    tcase_add_test(tc, test_proof);
    tcase_add_loop_test(tc, test_out_of_order, 0, AUTH_LAST);
    suite_add_tcase(s, tc);

    tc = tcase_create("key-file");
    tcase_add_checked_fixture(tc, setup_ntb, teardown);
    tcase_add_loop_test(tc, test_bad_key_file, 0, G_N_ELEMENTS(bad_files));
    tcase_add_test(tc, test_key_file_needs_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(ntb_auth_suite());
}
