/*
 * Unit tests of the NTB fabric over its shm backend (vfio-ntb/fabric/):
 * links, messages, failures, segments and windows, doorbells.  Refused
 * parameters and malformed input from peers are in check_fabric_untrusted.c;
 * the rig is in fabric-rig.h.
 */
#include "check-main.h"
#include "fabric-rig.h"
#include "fabric/ntb.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "common/util.h"

/* ---- link --------------------------------------------------------------- */

START_TEST(test_link_up_down)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autoptr(GError) error = NULL;
    gint64 t0;

    ck_assert(vn_fabric_connect(a->fab, "b", &error));
    /* True at once; on_link runs from the loop, not inside connect. */
    ck_assert(vn_fabric_link_up(a->fab, "b"));
    ck_assert_uint_eq(log_count(a, "up:"), 0);
    WAIT_FOR(log_has(a, "up:b") && log_has(b, "up:a"));
    ck_assert(vn_fabric_link_up(b->fab, "a"));
    /* Idempotent, from either side: still one link. */
    ck_assert(vn_fabric_connect(a->fab, "b", NULL));
    ck_assert(vn_fabric_connect(b->fab, "a", NULL));
    spin(50);
    ck_assert_uint_eq(log_count(a, "up:"), 1);
    ck_assert_uint_eq(log_count(b, "up:"), 1);

    t0 = now_ms();
    node_close(b);
    WAIT_FOR(log_has(a, "down:b"));
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert(!vn_fabric_link_up(a->fab, "b"));
}
END_TEST

START_TEST(test_simultaneous_connect)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    Reply r1 = { 0 }, r2 = { 0 };

    /* Both connect before either has read anything: two sockets, and both
     * ends must settle on the same one without the link flapping. */
    ck_assert(vn_fabric_connect(a->fab, "b", NULL));
    ck_assert(vn_fabric_connect(b->fab, "a", NULL));
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_ECHO, "{\"n\":1}", NULL, 0, on_reply, &r1),
                     0);
    ck_assert_int_eq(vn_fabric_request(b->fab, "a", T_ECHO, "{\"n\":2}", NULL, 0, on_reply, &r2),
                     0);
    WAIT_FOR(r1.done && r2.done);
    ck_assert_int_eq(r1.err, 0);
    ck_assert_int_eq(r2.err, 0);
    spin(100);
    ck_assert_uint_eq(log_count(a, "up:"), 1);
    ck_assert_uint_eq(log_count(b, "up:"), 1);
    ck_assert_uint_eq(log_count(a, "down:"), 0);
    ck_assert_uint_eq(log_count(b, "down:"), 0);
    reply_clear(&r1);
    reply_clear(&r2);
    /* ...and the one left carries traffic both ways. */
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_ECHO, NULL, "x", 1, on_reply, &r1), 0);
    ck_assert_int_eq(vn_fabric_request(b->fab, "a", T_ECHO, NULL, "y", 1, on_reply, &r2), 0);
    WAIT_FOR(r1.done && r2.done);
    ck_assert_int_eq(r1.err + r2.err, 0);
    reply_clear(&r1);
    reply_clear(&r2);
}
END_TEST

START_TEST(test_connect_errors)
{
    Node *a = node_open("a", false);
    g_autoptr(GError) error = NULL;

    ck_assert(!vn_fabric_connect(a->fab, "nobody", &error));
    ck_assert_ptr_nonnull(error);
    g_clear_error(&error);
    ck_assert(!vn_fabric_connect(a->fab, "a", &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT));
    g_clear_error(&error);
    ck_assert(!vn_fabric_connect(a->fab, "../etc", &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT));
    ck_assert(!vn_fabric_link_up(a->fab, "nobody"));
}
END_TEST

START_TEST(test_connect_async)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    Conn up = { 0 }, nobody = { 0 }, bad = { 0 }, cancelled = { 0 };

    (void)b;
    ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "b", on_conn, &up));
    ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "nobody", on_conn, &nobody));
    ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "../x", on_conn, &bad));
    vn_fabric_connect_cancel(vn_fabric_connect_async(a->fab, "b", on_conn, &cancelled));
    /* Answered from the loop, never inside the call. */
    ck_assert_int_eq(up.calls + nobody.calls + bad.calls, 0);
    WAIT_FOR(up.calls > 0 && nobody.calls > 0 && bad.calls > 0);
    ck_assert_int_eq(up.err, 0);
    ck_assert(vn_fabric_link_up(a->fab, "b"));
    ck_assert_int_lt(nobody.err, 0);
    ck_assert_int_eq(bad.err, -EINVAL);
    spin(50);
    ck_assert_int_eq(up.calls + nobody.calls + bad.calls, 3); /* once each */
    ck_assert_int_eq(cancelled.calls, 0);
}
END_TEST

START_TEST(test_connect_async_close_cancels)
{
    Node *a = node_open("a", false);
    Conn c = { 0 };

    node_open("b", false);
    ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "b", on_conn, &c));
    node_close(a);
    ck_assert_int_eq(c.calls, 1);
    ck_assert_int_eq(c.err, -ECANCELED);
}
END_TEST

static void *bogus_open(VnFabric *fab, const char *node, GHashTable *params, GError **error)
{
    return NULL;
}

START_TEST(test_register)
{
    g_autoptr(GError) error = NULL;
    VnFabricOps ops = { .name = "bogus", .open = bogus_open };
    static const VnFabricOps shm_again = { .name = "shm" };

    node_open("a", false); /* the built-in backend is registered now */
    ck_assert(!vn_fabric_ops_valid(NULL, &error));
    g_clear_error(&error);
    ck_assert(!vn_fabric_register(&ops, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "close"));
    g_clear_error(&error);
    ck_assert(!vn_fabric_register(&shm_again, &error));
    g_clear_error(&error);
    /* The built-in registers itself: a second one by that name is refused. */
    ck_assert(!vn_fabric_register(&vn_shm_ops, &error));
    g_clear_error(&error);
    /* Every backend maps segments; routes need their op; no unknown caps. */
    ops = vn_shm_ops;
    ops.name = "no-map";
    ops.map_segment_async = NULL;
    ck_assert(!vn_fabric_register(&ops, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "map_segment"));
    g_clear_error(&error);
    ops = vn_shm_ops;
    ops.name = "no-route";
    ops.open_route_async = NULL;
    ck_assert(!vn_fabric_register(&ops, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "open_route"));
    g_clear_error(&error);
    ops = vn_shm_ops;
    ops.name = "odd-caps";
    ops.caps |= 0x80;
    ck_assert(!vn_fabric_register(&ops, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "capability"));
    ck_assert(vn_name_valid(VN_NAME_NODE, "node-7"));
    ck_assert(!vn_name_valid(VN_NAME_NODE, "Node"));
    ck_assert(!vn_name_valid(VN_NAME_NODE, NULL));
}
END_TEST

/* ---- messages ----------------------------------------------------------- */

START_TEST(test_request_reply)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    const uint8_t bin[5] = { 0, 1, 2, 0xfe, 0xff };
    Reply r = { 0 };
    VnFabricStats sa, sb;

    link_nodes(a, b);
    /* JSON + binary, handed to the handler as sent. */
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_ECHO, "{\"hello\":\"world\"}", bin,
                                       sizeof(bin), on_reply, &r),
                     0);
    WAIT_FOR(r.done);
    ck_assert_int_eq(r.err, 0);
    ck_assert(log_has(b, "req:1:{\"hello\":\"world\"}:5"));
    reply_clear(&r);

    /* An echo brings both back. */
    ck_assert_int_eq(
        vn_fabric_request(a->fab, "b", T_ECHO, "{\"k\":[1,2]}", bin, sizeof(bin), on_reply, &r), 0);
    WAIT_FOR(r.done);
    ck_assert_int_eq(r.err, 0);
    ck_assert_str_eq(r.json, "{\"k\":[1,2]}");
    ck_assert_uint_eq(r.data->len, sizeof(bin));
    ck_assert_mem_eq(r.data->data, bin, sizeof(bin));
    ck_assert_int_eq(r.calls, 1);
    reply_clear(&r);

    sa = stats_of(a);
    sb = stats_of(b);
    ck_assert_uint_eq(sa.msgs_sent, 2);
    ck_assert_uint_eq(sa.msgs_received, 2);
    ck_assert_uint_eq(sb.msgs_received, 2);
    ck_assert_uint_eq(sb.msgs_sent, 2);
    ck_assert_uint_eq(sa.bad_messages + sb.bad_messages, 0);
}
END_TEST

START_TEST(test_event)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);

    link_nodes(a, b);
    ck_assert_int_eq(vn_fabric_event(a->fab, "b", 9, "{\"x\":1}", "abc", 3), 0);
    ck_assert_int_eq(vn_fabric_event(a->fab, "b", 10, NULL, NULL, 0), 0);
    WAIT_FOR(log_has(b, "ev:10:-:0"));
    /* In order, with what they carried. */
    ck_assert(log_has(b, "ev:9:{\"x\":1}:3"));
    ck_assert_str_eq(b->log->pdata[b->log->len - 2], "ev:9:{\"x\":1}:3");
    ck_assert_uint_eq(stats_of(b).msgs_received, 2);
}
END_TEST

START_TEST(test_error_reply)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    Reply r = { 0 };

    link_nodes(a, b);
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_FAIL, NULL, NULL, 0, on_reply, &r), 0);
    WAIT_FOR(r.done);
    ck_assert_int_eq(r.err, -EPERM);
    ck_assert_ptr_nonnull(r.json);
    ck_assert_ptr_nonnull(strstr(r.json, "not allowed here"));
    reply_clear(&r);
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", 999, NULL, NULL, 0, on_reply, &r), 0);
    WAIT_FOR(r.done);
    ck_assert_int_eq(r.err, -ENOTSUP);
    reply_clear(&r);
    /* A token that was never handed out. */
    ck_assert_int_eq(vn_fabric_reply(b->fab, 4242, NULL, NULL, 0), -ENOENT);
    ck_assert_uint_eq(stats_of(a).bad_messages, 0);
}
END_TEST

START_TEST(test_message_args)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autofree uint8_t *big = g_malloc0(VN_FABRIC_MAX_PAYLOAD + 1);
    Reply r = { 0 };

    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_ECHO, NULL, NULL, 0, on_reply, &r),
                     -ENOTCONN);
    ck_assert_int_eq(vn_fabric_event(a->fab, "b", 1, NULL, NULL, 0), -ENOTCONN);
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", 1), -ENOTCONN);
    link_nodes(a, b);
    ck_assert_int_eq(
        vn_fabric_request(a->fab, "b", VN_FABRIC_TYPE_RESERVED, NULL, NULL, 0, on_reply, &r),
        -EINVAL);
    ck_assert_int_eq(vn_fabric_event(a->fab, "b", VN_FABRIC_TYPE_DOORBELL, NULL, NULL, 0), -EINVAL);
    ck_assert_int_eq(
        vn_fabric_request(a->fab, "b", T_ECHO, NULL, big, VN_FABRIC_MAX_PAYLOAD + 1, on_reply, &r),
        -EMSGSIZE);
    ck_assert_int_eq(
        vn_fabric_request(a->fab, "b", T_ECHO, "{}", big, VN_FABRIC_MAX_PAYLOAD, on_reply, &r),
        -EMSGSIZE);
    ck_assert_int_eq(fw_request(a->fab, "b", VN_FABRIC_TYPE_DOORBELL, NULL, NULL, 0, NULL),
                     -EINVAL);
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", VN_FABRIC_MAX_DOORBELLS), -EINVAL);
    spin(20);
    ck_assert(!r.done); /* refused requests never call back */
    ck_assert_uint_eq(stats_of(a).msgs_sent, 0);
    ck_assert_uint_eq(log_count(b, "req:"), 0);
}
END_TEST

/* A peer in a thread of its own answers; its error reply carries its explanation. */
START_TEST(test_threaded_peer_answers)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(VnFabricMsg) reply = NULL;
    VnFabricMsg *none = (VnFabricMsg *)&none;

    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    ck_assert_int_eq(fw_request(a->fab, "b", T_ECHO, "{\"s\":\"sync\"}", "xyz", 3, &reply), 0);
    ck_assert_ptr_nonnull(reply);
    ck_assert_str_eq(reply->json, "{\"s\":\"sync\"}");
    ck_assert_str_eq(reply->peer, "b");
    ck_assert_uint_eq(reply->data_len, 3);
    ck_assert_mem_eq(reply->data, "xyz", 3);
    ck_assert_int_eq(fw_request(a->fab, "b", T_FAIL, NULL, NULL, 0, &none), -EPERM);
    /* An error reply leaves the peer's explanation. */
    ck_assert_ptr_nonnull(none);
    {
        g_autofree char *why = vn_fabric_error_message(none);

        ck_assert_str_eq(why, "not allowed here");
        vn_fabric_msg_free(none);
    }
    WAIT_FOR(log_has(a, "up:b"));
}
END_TEST

/* A handler that connects (to the asker, known, and to a node that is not there) is told at
 * once; on an NTB that is without reading the rings again from inside the one being read. */
START_TEST(test_connect_inside_handler)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autoptr(VnFabricMsg) known = NULL;
    g_autoptr(VnFabricMsg) absent = NULL;

    /* A ring read inside itself is a critical (ntb.c's receive): fatal here. */
    g_log_set_always_fatal(G_LOG_FATAL_MASK | G_LOG_LEVEL_CRITICAL);
    link_nodes(a, b);
    ck_assert_int_eq(fw_request(a->fab, "b", T_CONNECT, NULL, "a", 1, &known), 0);
    ck_assert_str_eq(known->json, "{\"up\":1}");
    ck_assert_int_eq(fw_request(a->fab, "b", T_CONNECT, NULL, "zz", 2, &absent), 0);
    ck_assert_str_eq(absent->json, "{\"up\":0}");
    /* The link that carried them is as it was. */
    ck_assert_int_eq(fw_request(a->fab, "b", T_ECHO, "{}", NULL, 0, NULL), 0);
}
END_TEST

START_TEST(test_map_back_while_asking)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(VnFabricMsg) reply = NULL;
    uint8_t *map;
    int memfd = memfd_new(8192, &map);
    uint64_t seg;

    node_start(b);
    a = node_open("a", false);
    seg = vn_fabric_segment_export(a->fab, memfd, 8192, "b", NULL);
    ck_assert_uint_ne(seg, 0);
    memcpy(map, "a's data", 8);
    connect_wait(a, "b");
    /* a waits on b; b's handler maps a's segment, which a's loop answers meanwhile. */
    ck_assert_int_eq(fw_request(a->fab, "b", T_MAP_BACK, NULL, &seg, sizeof(seg), &reply), 0);
    ck_assert_uint_eq(reply->data_len, 8);
    ck_assert_mem_eq(reply->data, "a's data", 8);
    munmap(map, 8192);
    close(memfd);
}
END_TEST

/* ---- failures ----------------------------------------------------------- */

/* Replies counted, and whether they came in the order asked. */
typedef struct Answers {
    unsigned n, errors, out_of_order;
    int last_err;
} Answers;

typedef struct Asked {
    Answers *a;
    unsigned i;
} Asked;

static void on_answer(void *opaque, VnFabricMsg *msg, int err)
{
    Asked *q = opaque;

    q->a->out_of_order += q->i != q->a->n;
    q->a->n++;
    q->a->errors += err != 0;
    q->a->last_err = err != 0 ? err : q->a->last_err;
    g_free(q);
}

static int ask_kept(Node *from, const char *to, Answers *a, unsigned i, size_t len)
{
    g_autofree char *json = g_strdup_printf("{\"i\":%u}", i);
    g_autofree uint8_t *data = len > 0 ? g_malloc0(len) : NULL;
    Asked *q = g_new(Asked, 1);
    int ret;

    *q = (Asked){ .a = a, .i = i };
    ret = vn_fabric_request(from->fab, to, T_KEEP, json, data, len, on_answer, q);
    if (ret < 0) {
        g_free(q);
    }
    return ret;
}

/* A peer takes VN_FABRIC_MAX_INFLIGHT of our requests at once and refuses the rest (EBUSY):
 * past that, they wait here and go, in order, as it answers; none is refused.  What waits
 * is bounded too. */
START_TEST(test_requests_past_what_peer_takes_wait)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    const unsigned n = 256 + 20;
    Answers got = { 0 };

    link_nodes(a, b);
    for (unsigned i = 0; i < n; i++) {
        ck_assert_int_eq(ask_kept(a, "b", &got, i, 0), 0);
    }
    WAIT_FOR(log_count(b, "req:") == 256);
    spin(100);
    ck_assert_uint_eq(log_count(b, "req:"), 256); /* the rest were not sent */
    ck_assert_uint_eq(stats_of(a).requests_held, 20);
    ck_assert_uint_eq(got.n, 0);

    /* Held ones are bounded by their bytes: 16 MiB waits, the next MiB is refused. */
    for (unsigned i = 0; i < 16; i++) {
        ck_assert_int_eq(ask_kept(a, "b", &got, n + i, 1024 * 1024 - 64), 0);
    }
    ck_assert_int_eq(ask_kept(a, "b", &got, n + 16, 1024 * 1024), -EBUSY);

    /* b answers: the held ones go as it does, oldest first. */
    for (unsigned round = 0; round < 64 && got.n < n + 16; round++) {
        node_answer_kept(b);
        WAIT_FOR(b->kept->len > 0 || got.n == n + 16);
    }
    ck_assert_uint_eq(got.n, n + 16);
    ck_assert_uint_eq(got.errors, 0);
    ck_assert_uint_eq(got.out_of_order, 0);
    for (unsigned i = 0; i < n + 16; i++) {
        g_autofree char *want =
            g_strdup_printf("req:%u:{\"i\":%u}:%u", T_KEEP, i, i < n ? 0 : 1024 * 1024 - 64);

        ck_assert_msg(log_at_is(b, i + 1, want), "request %u not in order", i); /* 0: up:a */
    }
}
END_TEST

/* A peer that takes our requests and never answers cannot keep them, or those held behind
 * them, forever: each ends once, by its timeout or the peer's refusal, and what is asked
 * after goes out at once instead of waiting behind them. */
START_TEST(test_held_requests_end_when_peer_never_answers)
{
    static const char *const fast[] = { "request-timeout-ms", "300", NULL };
    Node *a = node_open_kv("a", false, fast);
    Node *b = node_open("b", false);
    Answers got = { 0 };
    Reply r = { 0 };
    uint64_t held;

    link_nodes(a, b);
    for (unsigned i = 0; i < 260; i++) {
        g_autofree char *json = g_strdup_printf("{\"i\":%u}", i);
        Asked *q = g_new(Asked, 1);

        *q = (Asked){ .a = &got, .i = i };
        ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_HOLD, json, NULL, 0, on_answer, q), 0);
    }
    held = stats_of(a).requests_held;
    ck_assert_uint_eq(held, 4);
    WAIT_FOR(got.n == 260);
    ck_assert_uint_eq(got.errors, 260); /* in no set order: refusals overtake timeouts */
    /* Sent at once (b, holding 256 it never answers, refuses it), not held. */
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_ECHO, NULL, NULL, 0, on_reply, &r), 0);
    WAIT_FOR(r.done);
    ck_assert_int_ne(r.err, 0);
    ck_assert_uint_eq(stats_of(a).requests_held, held);
    spin(400);
    ck_assert_uint_eq(got.n, 260);
    ck_assert_int_eq(r.calls, 1);
    reply_clear(&r);
}
END_TEST

/* Requests held back fail with those sent when the link goes, and are cancelled when the
 * node closes; each is answered once. */
START_TEST(test_held_requests_fail_with_link)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    Node *c = node_open("c", false);
    Answers via_b = { 0 }, via_c = { 0 };

    link_nodes(a, b);
    link_nodes(a, c);
    for (unsigned i = 0; i < 260; i++) {
        ck_assert_int_eq(ask_kept(a, "b", &via_b, i, 0), 0);
        ck_assert_int_eq(ask_kept(a, "c", &via_c, i, 0), 0);
    }
    WAIT_FOR(log_count(b, "req:") == 256 && log_count(c, "req:") == 256);
    node_close(b);
    WAIT_FOR(via_b.n == 260);
    ck_assert_uint_eq(via_b.errors, 260);
    ck_assert_int_eq(via_b.last_err, -ECONNRESET);
    ck_assert_uint_eq(via_b.out_of_order, 0);
    ck_assert_uint_eq(via_c.n, 0); /* another link's are not touched */

    node_close(a);
    ck_assert_uint_eq(via_c.n, 260);
    ck_assert_uint_eq(via_c.errors, 260);
    ck_assert_int_eq(via_c.last_err, -ECANCELED);
    spin(50);
    ck_assert_uint_eq(via_b.n + via_c.n, 520);
}
END_TEST

START_TEST(test_request_timeout)
{
    static const char *const fast[] = { "request-timeout-ms", "200", NULL };
    Node *a = node_open_kv("a", false, fast);
    Node *b = node_open("b", false);
    Reply r = { 0 };
    gint64 t0;

    link_nodes(a, b);
    t0 = now_ms();
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_HOLD, NULL, NULL, 0, on_reply, &r), 0);
    WAIT_FOR(r.done);
    ck_assert_int_eq(r.err, -ETIMEDOUT);
    ck_assert_int_ge(now_ms() - t0, 150);
    ck_assert_int_eq(r.calls, 1);
    spin(50);
    ck_assert_int_eq(r.calls, 1);
}
END_TEST

START_TEST(test_reset_on_peer_close)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    Reply r1 = { 0 }, r2 = { 0 };
    gint64 t0;

    link_nodes(a, b);
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_HOLD, NULL, NULL, 0, on_reply, &r1), 0);
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_HOLD, NULL, NULL, 0, on_reply, &r2), 0);
    WAIT_FOR(log_count(b, "req:") == 2);
    t0 = now_ms();
    node_close(b);
    WAIT_FOR(r1.done && r2.done);
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert_int_eq(r1.err, -ECONNRESET);
    ck_assert_int_eq(r2.err, -ECONNRESET);
    WAIT_FOR(log_has(a, "down:b"));
    ck_assert_int_eq(r1.calls + r2.calls, 2);
}
END_TEST

START_TEST(test_reset_on_peer_quit)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(VnFabricMsg) reply = NULL;
    gint64 t0;

    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    t0 = now_ms();
    /* b stops and closes while a waits. */
    ck_assert_int_eq(fw_request(a->fab, "b", T_HOLD_QUIT, NULL, NULL, 0, &reply), -ECONNRESET);
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert(!vn_fabric_link_up(a->fab, "b"));
    WAIT_FOR(log_has(a, "down:b"));
    ck_assert_int_eq(fw_request(a->fab, "b", T_ECHO, NULL, NULL, 0, &reply), -ENOTCONN);
}
END_TEST

START_TEST(test_close_cancels)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    Reply r = { 0 };

    link_nodes(a, b);
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_HOLD, NULL, NULL, 0, on_reply, &r), 0);
    node_close(a);
    ck_assert(r.done);
    ck_assert_int_eq(r.err, -ECANCELED);
    ck_assert_int_eq(r.calls, 1);
}
END_TEST

/* ---- segments and windows ----------------------------------------------- */

START_TEST(test_window_map)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(GError) error = NULL;
    uint8_t *map;
    int memfd = memfd_new(16384, &map);
    VnFabricWindow *w;
    uint64_t seg;
    char buf[16] = { 0 };

    seg = vn_fabric_segment_export(b->fab, memfd, 16384, "a", &error);
    ck_assert_msg(seg != 0, "%s", error ? error->message : "");
    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    w = fw_window_map(a->fab, "b", seg, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    ck_assert_str_eq(w->peer, "b");
    ck_assert_uint_eq(w->segment, seg);
    ck_assert_uint_eq(w->size, 16384);
    ck_assert_uint_eq(w->window_size, 16384);
    ck_assert_int_ge(w->fd, 0);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 1);
    ck_assert_uint_eq(stats_of(a).windows_mapped, 1);

    /* Stores through the window land in the exporter's memfd... */
    memcpy(w->host + 100, "through-window", 14);
    ck_assert_mem_eq(map + 100, "through-window", 14);
    ck_assert_int_eq(pread(memfd, buf, 14, 100), 14);
    ck_assert_str_eq(buf, "through-window");
    /* ...and the exporter's stores show in the window. */
    ck_assert_int_eq(pwrite(memfd, "from-owner", 10, 16000), 10);
    ck_assert_mem_eq(w->host + 16000, "from-owner", 10);

    vn_fabric_window_unmap(a->fab, w);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 0);
    munmap(map, 16384);
    close(memfd);
}
END_TEST

typedef struct Mapped {
    bool done;
    VnFabricWindow *w;
    int code;
} Mapped;

static void on_mapped(void *opaque, VnFabricWindow *w, const GError *error)
{
    Mapped *m = opaque;

    m->done = true;
    m->w = w;
    m->code = error != NULL ? error->code : 0;
}

/* A map that does not wait: the call returns at once, the window comes on
 * the loop; refusals come the same way. */
/* A segment from an offset of its fd (a BAR at its VFIO region's offset):
 * the mapper's window starts there. */
START_TEST(test_window_map_at_offset)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(GError) error = NULL;
    uint8_t *map;
    int memfd = memfd_new(3 * 4096, &map);
    VnFabricWindow *w;
    uint64_t seg;

    /* Not on a window boundary: an NTB translates whole windows. */
    ck_assert_uint_eq(vn_fabric_segment_export_at(b->fab, memfd, 100, 4096, "a", &error), 0);
    ck_assert_ptr_nonnull(strstr(error->message, "not aligned"));
    g_clear_error(&error);
    /* Past the end of the fd. */
    ck_assert_uint_eq(vn_fabric_segment_export_at(b->fab, memfd, 8192, 8192, "a", &error), 0);
    ck_assert_ptr_nonnull(strstr(error->message, "smaller"));
    g_clear_error(&error);
    seg = vn_fabric_segment_export_at(b->fab, memfd, 8192, 4096, "a", &error);
    ck_assert_msg(seg != 0, "%s", error ? error->message : "");
    memcpy(map + 8192, "third page", 10);
    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    w = fw_window_map(a->fab, "b", seg, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(w->size, 4096);
    ck_assert_uint_eq(w->offset, 8192);
    ck_assert(!w->device);
    ck_assert_mem_eq(w->host, "third page", 10);
    vn_fabric_window_unmap(a->fab, w);
    munmap(map, 3 * 4096);
    close(memfd);
}
END_TEST

/* Windows onto consecutive slices of one memory join into one fd (shm: the slices' own file,
 * at the first one's offset); windows out of order, onto two memories, or not ours do not. */
START_TEST(test_windows_join)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(GError) error = NULL;
    uint8_t *map, *map2, *joined;
    int memfd = memfd_new(2 * 4096, &map), memfd2 = memfd_new(4096, &map2), fd;
    VnFabricWindow *w[3], fake = { .size = 4096 }, *pair[2];
    uint64_t seg[3], offset = 1;

    /* Three windows: what an ntb pair has besides its messages'. */
    for (int k = 0; k < 2; k++) {
        seg[k] = vn_fabric_segment_export_at(b->fab, memfd, (uint64_t)k * 4096, 4096, "a", NULL);
        map[k * 4096] = (uint8_t)('A' + k);
    }
    seg[2] = vn_fabric_segment_export(b->fab, memfd2, 4096, "a", NULL);
    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    for (int k = 0; k < 3; k++) {
        w[k] = fw_window_map(a->fab, "b", seg[k], &error);
        ck_assert_msg(w[k] != NULL, "%s", error ? error->message : "");
    }
    fd = vn_fabric_windows_join(a->fab, w, 2, &offset, &error);
    ck_assert_msg(fd >= 0, "%s", error ? error->message : "");
    joined = mmap(NULL, 2 * 4096, PROT_READ, MAP_SHARED, fd, (off_t)offset);
    ck_assert(joined != MAP_FAILED);
    ck_assert_uint_eq(joined[0], 'A');
    ck_assert_uint_eq(joined[4096], 'B');
    munmap(joined, 2 * 4096);
    close(fd);

    /* Two memories, and the right slices in the wrong order: shm cannot join them. */
    ck_assert_int_eq(vn_fabric_windows_join(a->fab, &w[1], 2, &offset, &error), -ENOTSUP);
    ck_assert_ptr_nonnull(strstr(error->message, "not one file"));
    g_clear_error(&error);
    pair[0] = w[1];
    pair[1] = w[0];
    ck_assert_int_eq(vn_fabric_windows_join(a->fab, pair, 2, &offset, &error), -ENOTSUP);
    g_clear_error(&error);
    /* One window, and one that is not ours. */
    ck_assert_int_eq(vn_fabric_windows_join(a->fab, w, 1, &offset, &error), -EINVAL);
    g_clear_error(&error);
    pair[1] = &fake;
    ck_assert_int_eq(vn_fabric_windows_join(a->fab, pair, 2, &offset, &error), -EINVAL);
    ck_assert_ptr_nonnull(strstr(error->message, "not mapped here"));
    for (int k = 0; k < 3; k++) {
        vn_fabric_window_unmap(a->fab, w[k]);
    }
    munmap(map, 2 * 4096);
    munmap(map2, 4096);
    close(memfd);
    close(memfd2);
}
END_TEST

START_TEST(test_window_map_async)
{
    Node *b = node_open("b", false);
    Node *a = node_open("a", false);
    uint8_t *map;
    int memfd = memfd_new(16384, &map);
    Mapped m = { 0 }, bad = { 0 };
    uint64_t seg;

    link_nodes(a, b);
    seg = vn_fabric_segment_export(b->fab, memfd, 16384, "a", NULL);
    ck_assert_uint_ne(seg, 0);
    /* b answers from the same loop: only an asynchronous map can work. */
    vn_fabric_window_map_async(a->fab, "b", seg, on_mapped, &m);
    ck_assert(!m.done);
    WAIT_FOR(m.done);
    ck_assert_ptr_nonnull(m.w);
    ck_assert_uint_eq(m.w->size, 16384);
    memcpy(m.w->host + 5, "async", 5);
    ck_assert_mem_eq(map + 5, "async", 5);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 1);
    vn_fabric_window_map_async(a->fab, "b", 999, on_mapped, &bad);
    WAIT_FOR(bad.done);
    ck_assert_ptr_null(bad.w);
    ck_assert_int_eq(bad.code, G_IO_ERROR_NOT_FOUND);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 1);
    vn_fabric_window_unmap(a->fab, m.w);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 0);
    munmap(map, 16384);
    close(memfd);
}
END_TEST

START_TEST(test_map_not_granted)
{
    Node *b = node_open("b", true);
    Node *a, *c;
    g_autoptr(GError) error = NULL;
    int memfd = memfd_new(4096, NULL);
    VnFabricWindow *w;
    uint64_t seg, gone;

    seg = vn_fabric_segment_export(b->fab, memfd, 4096, "c", NULL);
    gone = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
    ck_assert_uint_ne(seg, 0);
    vn_fabric_segment_unexport(b->fab, gone);
    node_start(b);
    a = node_open("a", false);
    c = node_open("c", false);
    connect_wait(a, "b");
    connect_wait(c, "b");

    /* Exported to c, not to a. */
    ck_assert_ptr_null(fw_window_map(a->fab, "b", seg, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED));
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 0);
    ck_assert_uint_eq(stats_of(a).windows_mapped, 0);
    g_clear_error(&error);
    /* Unknown and withdrawn ids. */
    ck_assert_ptr_null(fw_window_map(a->fab, "b", 999, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND));
    g_clear_error(&error);
    ck_assert_ptr_null(fw_window_map(a->fab, "b", gone, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND));
    g_clear_error(&error);
    ck_assert_ptr_null(fw_window_map(a->fab, "b", 0, &error));
    g_clear_error(&error);
    ck_assert_ptr_null(fw_window_map(a->fab, "nobody", seg, &error));
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 0);
    ck_assert_uint_eq(stats_of(a).bad_messages, 0);

    /* c may. */
    w = fw_window_map(c->fab, "b", seg, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    vn_fabric_window_unmap(c->fab, w);
    close(memfd);
}
END_TEST

/* A segment shared with another node (docs/p2p.md): that node maps the same memory, the
 * first holder keeps its own, nobody else gets it, and withdrawing the segment withdraws its
 * shares.  Shared with the exporter itself, its own workers map it without a window. */
START_TEST(test_segment_share)
{
    Node *b = node_open("b", true);
    Node *a, *c;
    g_autoptr(GError) error = NULL;
    uint8_t *map;
    int memfd = memfd_new(8192, &map);
    VnFabricWindow *w, *own;
    uint64_t seg, share, self, other;

    seg = vn_fabric_segment_export(b->fab, memfd, 8192, "a", &error);
    ck_assert_uint_ne(seg, 0);
    share = vn_fabric_segment_share(b->fab, seg, "c", &error);
    ck_assert_msg(share != 0 && share != seg, "%s", error ? error->message : "");
    ck_assert_str_eq(vn_fabric_segment_peer(b->fab, share), "c");
    /* Asked again: the same share; with its own holder: the segment itself. */
    ck_assert_uint_eq(vn_fabric_segment_share(b->fab, seg, "c", NULL), share);
    ck_assert_uint_eq(vn_fabric_segment_share(b->fab, seg, "a", NULL), seg);
    /* No share of a share, of nothing, or with no node. */
    ck_assert_uint_eq(vn_fabric_segment_share(b->fab, share, "c", &error), 0);
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_segment_share(b->fab, 999, "c", &error), 0);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND));
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_segment_share(b->fab, seg, "../c", &error), 0);
    g_clear_error(&error);
    self = vn_fabric_segment_share(b->fab, seg, "b", &error);
    ck_assert_uint_ne(self, 0);
    node_start(b);
    a = node_open("a", false);
    c = node_open("c", false);
    connect_wait(a, "b");
    connect_wait(c, "b");

    w = fw_window_map(c->fab, "b", share, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    memcpy(w->host + 64, "shared", 6);
    ck_assert_mem_eq(map + 64, "shared", 6);
    vn_fabric_window_unmap(c->fab, w);
    /* The share is c's alone: not a's (which holds the segment), c's window onto the
     * segment itself is refused. */
    ck_assert_ptr_null(fw_window_map(a->fab, "b", share, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED));
    g_clear_error(&error);
    ck_assert_ptr_null(fw_window_map(c->fab, "b", seg, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED));
    g_clear_error(&error);

    /* The exporter's own share: its memory as it is, no window spent. */
    own = fw_window_map(b->fab, "b", self, &error);
    ck_assert_msg(own != NULL, "%s", error ? error->message : "");
    ck_assert(own->local);
    ck_assert_mem_eq(own->host + 64, "shared", 6);
    ck_assert_uint_eq(vn_fabric_windows_in_use(b->fab), 0);
    vn_fabric_window_unmap(b->fab, own);
    /* Another node's segment shared with b is not b's own. */
    other = vn_fabric_segment_export(a->fab, memfd, 4096, "b", NULL);
    ck_assert_ptr_null(fw_window_map(b->fab, "b", other, &error));
    g_clear_error(&error);

    /* Withdrawn: its shares go with it. */
    vn_fabric_segment_unexport(b->fab, seg);
    ck_assert_ptr_null(vn_fabric_segment_peer(b->fab, share));
    ck_assert_ptr_null(vn_fabric_segment_peer(b->fab, self));
    ck_assert_ptr_null(fw_window_map(c->fab, "b", share, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND));
    munmap(map, 8192);
    close(memfd);
}
END_TEST

START_TEST(test_window_limits)
{
    static const char *const small[] = { "max-windows", "2", "max-window-size", "8192", NULL };
    static const char *const coarse[] = { "xlat-granularity", "8192", NULL };
    Node *b = node_open("b", true);
    Node *a, *d;
    g_autoptr(GError) error = NULL;
    int fd5 = memfd_new(5 * 1024, NULL);
    int fd1 = memfd_new(1024, NULL);
    int fd9 = memfd_new(9 * 1024, NULL);
    uint64_t s5, s1, s9, s1b, s1d;
    VnFabricWindow *w5, *w1, *w1b;

    s5 = vn_fabric_segment_export(b->fab, fd5, 5 * 1024, "a", NULL);
    s1 = vn_fabric_segment_export(b->fab, fd1, 1024, "a", NULL);
    s9 = vn_fabric_segment_export(b->fab, fd9, 9 * 1024, "a", NULL);
    s1b = vn_fabric_segment_export(b->fab, fd1, 1024, "a", NULL);
    s1d = vn_fabric_segment_export(b->fab, fd1, 1024, "d", NULL);
    ck_assert(s5 && s1 && s9 && s1b && s1d);
    node_start(b);
    a = node_open_kv("a", false, small);
    d = node_open_kv("d", false, coarse);
    ck_assert_uint_eq(vn_fabric_limits(a->fab)->max_windows, 2);
    ck_assert_uint_eq(vn_fabric_limits(a->fab)->max_window_size, 8192);
    ck_assert_uint_eq(vn_fabric_limits(d->fab)->xlat_granularity, 8192);
    connect_wait(a, "b");
    connect_wait(d, "b");

    /* A 5 KiB segment takes an 8 KiB window. */
    w5 = fw_window_map(a->fab, "b", s5, &error);
    ck_assert_msg(w5 != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(w5->size, 5 * 1024);
    ck_assert_uint_eq(w5->window_size, 8192);
    /* 9 KiB would need 16 KiB: above the limit, nothing mapped. */
    ck_assert_ptr_null(fw_window_map(a->fab, "b", s9, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 1);
    /* 1 KiB takes the 4 KiB granularity. */
    w1 = fw_window_map(a->fab, "b", s1, &error);
    ck_assert_msg(w1 != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(w1->window_size, 4096);
    /* Both windows in use: a third is refused. */
    ck_assert_ptr_null(fw_window_map(a->fab, "b", s1b, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 2);
    /* Freeing one makes room. */
    vn_fabric_window_unmap(a->fab, w1);
    w1b = fw_window_map(a->fab, "b", s1b, &error);
    ck_assert_msg(w1b != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(stats_of(a).windows_mapped, 3);
    /* A coarser granularity rounds 1 KiB up to 8 KiB. */
    w1 = fw_window_map(d->fab, "b", s1d, &error);
    ck_assert_msg(w1 != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(w1->window_size, 8192);
    /* Windows stay until unmapped; closing the node unmaps what is left. */
    vn_fabric_window_unmap(a->fab, w5);
    close(fd5);
    close(fd1);
    close(fd9);
}
END_TEST

START_TEST(test_window_outlives_link)
{
    Node *b = node_open("b", true);
    Node *a;
    int memfd = memfd_new(4096, NULL);
    VnFabricWindow *w;
    uint64_t seg = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
    char buf[4];

    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    w = fw_window_map(a->fab, "b", seg, NULL);
    ck_assert_ptr_nonnull(w);
    node_close(b);
    WAIT_FOR(log_has(a, "down:b"));
    /* The mapping is the user's to drop, and still reaches the memory. */
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 1);
    memcpy(w->host, "live", 4);
    ck_assert_int_eq(pread(memfd, buf, 4, 0), 4);
    ck_assert_mem_eq(buf, "live", 4);
    vn_fabric_window_unmap(a->fab, w);
    close(memfd);
}
END_TEST

START_TEST(test_export_errors)
{
    Node *a = node_open("a", false);
    g_autoptr(GError) error = NULL;
    int memfd = memfd_new(4096, NULL);
    int sv[2];

    ck_assert_uint_eq(vn_fabric_segment_export(a->fab, memfd, 0, "b", &error), 0);
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_segment_export(a->fab, memfd, 8192, "b", &error), 0);
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_segment_export(a->fab, memfd, 4096, "B", &error), 0);
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_segment_export(a->fab, -1, 4096, "b", &error), 0);
    g_clear_error(&error);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ck_assert_uint_eq(vn_fabric_segment_export(a->fab, sv[0], 4096, "b", &error), 0);
    ck_assert_ptr_nonnull(error);
    ck_assert_uint_ne(vn_fabric_segment_export(a->fab, memfd, 4096, "b", NULL), 0);
    vn_fabric_segment_unexport(a->fab, 12345); /* unknown: nothing */
    close(sv[0]);
    close(sv[1]);
    close(memfd);
}
END_TEST

/* ---- interrupt routes -------------------------------------------------- */

static uint64_t route_id_le(uint64_t id)
{
    return GUINT64_TO_LE(id);
}

static bool readable(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };

    return poll(&p, 1, 0) == 1;
}

/* a's eventfd, exported as a route to b; b's handler opens it and signals
 * it; a sees the signal with nothing of a's in between. */
START_TEST(test_route)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(GError) error = NULL;
    g_autoptr(VnFabricMsg) reply = NULL;
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    uint64_t id, le, n = 0;

    node_start(b);
    a = node_open("a", false);
    ck_assert(vn_fabric_caps(a->fab) & VN_FABRIC_CAP_DIRECT_ROUTES);
    connect_wait(a, "b");
    id = vn_fabric_route_export(a->fab, efd, "b", &error);
    ck_assert_msg(id != 0, "%s", error ? error->message : "");
    le = route_id_le(id);
    /* a waits synchronously; its backend still answers b's open. */
    ck_assert_int_eq(fw_request(a->fab, "b", T_SIGNAL_ROUTE, NULL, &le, sizeof(le), &reply), 0);
    ck_assert_int_eq(read(efd, &n, sizeof(n)), sizeof(n));
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(stats_of(a).msgs_received, 1); /* the reply, nothing else */
    ck_assert_uint_eq(stats_of(a).bad_messages, 0);
    vn_fabric_route_unexport(a->fab, id);
    close(efd);
}
END_TEST

typedef struct Routed {
    bool done;
    int fd;
    int code;
    int calls;
} Routed;

static void on_routed(void *opaque, int fd, const GError *error)
{
    Routed *r = opaque;

    r->done = true;
    r->fd = fd;
    r->code = error != NULL ? error->code : 0;
    r->calls++;
}

/* b and a on one loop: a's open of b's route can only be answered if a does not wait for
 * it; a refused one says why; one under way when a closes is cancelled, once. */
START_TEST(test_route_open_async)
{
    Node *b = node_open("b", false);
    Node *a = node_open("a", false);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    Routed r = { 0 }, bad = { 0 }, cut = { 0 };
    uint64_t id, one = 1, n = 0;

    link_nodes(a, b);
    id = vn_fabric_route_export(b->fab, efd, "a", NULL);
    ck_assert_uint_ne(id, 0);
    vn_fabric_route_open_async(a->fab, "b", id, on_routed, &r);
    ck_assert(!r.done);
    WAIT_FOR(r.done);
    ck_assert_int_ge(r.fd, 0);
    ck_assert_int_eq(write(r.fd, &one, sizeof(one)), sizeof(one));
    ck_assert_int_eq(read(efd, &n, sizeof(n)), sizeof(n));
    ck_assert_uint_eq(n, 1);
    close(r.fd);
    ck_assert_uint_eq(stats_of(a).routes_opened, 1);

    vn_fabric_route_open_async(a->fab, "b", id + 100, on_routed, &bad);
    WAIT_FOR(bad.done);
    ck_assert_int_eq(bad.fd, -ENOENT);
    ck_assert_int_eq(bad.code, G_IO_ERROR_NOT_FOUND);

    vn_fabric_route_open_async(a->fab, "b", id, on_routed, &cut);
    ck_assert(!cut.done);
    node_close(a);
    ck_assert(cut.done);
    ck_assert_int_eq(cut.calls, 1);
    ck_assert_int_eq(cut.fd, -ECANCELED);
    ck_assert_int_eq(cut.code, G_IO_ERROR_CANCELLED);
    vn_fabric_route_unexport(b->fab, id);
    close(efd);
}
END_TEST

/* A peer that stops accepting (its listen backlog full) is refused at once: a fetch never
 * waits in connect() on the caller's loop. */
START_TEST(test_fetch_peer_not_accepting)
{
    Node *b = node_open("b", false);
    Node *a = node_open("a", false);
    g_autofree char *path = g_build_filename(tmpdir, "b.sock", NULL);
    g_autofree char *real = g_build_filename(tmpdir, "b.sock.real", NULL);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), lfd, queued[16];
    unsigned n = 0;
    Routed r = { 0 };
    uint64_t id;
    gint64 t0;

    link_nodes(a, b);
    id = vn_fabric_route_export(b->fab, efd, "a", NULL);
    ck_assert_uint_ne(id, 0);
    /* b's socket path now leads to a listener that never accepts, its backlog full. */
    ck_assert_int_eq(rename(path, real), 0);
    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(lfd, 0), 0);
    while (n < G_N_ELEMENTS(queued)) {
        queued[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (connect(queued[n], (struct sockaddr *)&addr, sizeof(addr)) < 0) {
            ck_assert_int_eq(errno, EAGAIN);
            close(queued[n]);
            break;
        }
        n++;
    }
    ck_assert_uint_lt(n, G_N_ELEMENTS(queued));
    t0 = g_get_monotonic_time();
    vn_fabric_route_open_async(a->fab, "b", id, on_routed, &r);
    ck_assert(r.done);
    ck_assert_int_eq(r.fd, -EAGAIN);
    /* Not a speed: a blocking connect gives the same EAGAIN, but only after
     * VN_SHM_SEND_TIMEOUT_S (5 s); half of that tells the two apart on any machine. */
    ck_assert_int_lt(g_get_monotonic_time() - t0, VN_SHM_SEND_TIMEOUT_S * G_USEC_PER_SEC / 2);
    for (unsigned i = 0; i < n; i++) {
        close(queued[i]);
    }
    close(lfd);
    ck_assert_int_eq(rename(real, path), 0);
    vn_fabric_route_unexport(b->fab, id);
    close(efd);
}
END_TEST

START_TEST(test_route_not_granted)
{
    Node *b = node_open("b", true);
    Node *a;
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    uint64_t to_c, gone, ids[3];

    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    to_c = vn_fabric_route_export(a->fab, efd, "c", NULL);
    gone = vn_fabric_route_export(a->fab, efd, "b", NULL);
    ck_assert(to_c != 0 && gone != 0 && gone != to_c);
    vn_fabric_route_unexport(a->fab, gone);
    ids[0] = to_c;
    ids[1] = gone;
    ids[2] = 999;
    for (unsigned i = 0; i < G_N_ELEMENTS(ids); i++) {
        g_autoptr(VnFabricMsg) reply = NULL;
        uint64_t le = route_id_le(ids[i]);

        ck_assert_int_eq(fw_request(a->fab, "b", T_SIGNAL_ROUTE, NULL, &le, sizeof(le), &reply),
                         i == 0 ? -EACCES : -ENOENT);
    }
    /* Nothing was signalled; each refusal was counted where it was asked. */
    ck_assert(!readable(efd));
    ck_assert_uint_eq(stats_of(a).bad_messages, 3);
    /* Ids are never reused. */
    ck_assert_uint_gt(vn_fabric_route_export(a->fab, efd, "b", NULL), gone);
    close(efd);
}
END_TEST

START_TEST(test_route_errors)
{
    static VnFabricOps plain;
    Node *a = node_open("a", false);
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    int efd = eventfd(0, EFD_CLOEXEC);
    int memfd = memfd_new(4096, NULL);
    VnFabric *f;

    ck_assert_uint_eq(vn_fabric_route_export(a->fab, memfd, "b", &error), 0);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT));
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_route_export(a->fab, efd, "B", &error), 0);
    g_clear_error(&error);
    ck_assert_uint_eq(vn_fabric_route_export(a->fab, -1, "b", &error), 0);
    g_clear_error(&error);
    ck_assert_int_eq(fw_route_open(a->fab, "b", 1, &error), -ENOTCONN);
    g_clear_error(&error);
    vn_fabric_route_unexport(a->fab, 12345); /* unknown: nothing */

    /* A backend without the capability carries no routes at all. */
    plain = vn_shm_ops;
    plain.name = "shm-plain";
    plain.caps = 0;
    plain.open_route_async = NULL;
    ck_assert(vn_fabric_register(&plain, NULL));
    g_hash_table_insert(params, "dir", tmpdir);
    f = vn_fabric_open("shm-plain", "p", params, &handlers, NULL, ctx, &error);
    ck_assert_msg(f != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(vn_fabric_caps(f), 0);
    ck_assert_uint_eq(vn_fabric_route_export(f, efd, "a", &error), 0);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED));
    g_clear_error(&error);
    ck_assert_int_eq(fw_route_open(f, "a", 1, &error), -ENOTSUP);
    vn_fabric_close(f);
    close(memfd);
    close(efd);
}
END_TEST

/* Exports take the host's inbound windows: max-segments of them. */
START_TEST(test_export_budget)
{
    static const char *const two[] = { "max-segments", "2", NULL };
    Node *a = node_open_kv("a", false, two);
    g_autoptr(GError) error = NULL;
    int memfd = memfd_new(4096, NULL);
    uint64_t first;

    ck_assert_uint_eq(vn_fabric_limits(a->fab)->max_segments, 2);
    first = vn_fabric_segment_export(a->fab, memfd, 4096, "b", NULL);
    ck_assert_uint_ne(first, 0);
    ck_assert_uint_ne(vn_fabric_segment_export(a->fab, memfd, 4096, "c", NULL), 0);
    ck_assert_uint_eq(vn_fabric_segment_export(a->fab, memfd, 4096, "b", &error), 0);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    ck_assert_ptr_nonnull(strstr(error->message, "max-segments"));
    /* One given back makes room for one. */
    vn_fabric_segment_unexport(a->fab, first);
    ck_assert_uint_ne(vn_fabric_segment_export(a->fab, memfd, 4096, "b", NULL), 0);
    close(memfd);
}
END_TEST

/* ---- doorbells ---------------------------------------------------------- */

START_TEST(test_doorbells)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);

    link_nodes(a, b);
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", 5), 0);
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", 31), 0);
    ck_assert_int_eq(vn_fabric_doorbell(b->fab, "a", 0), 0);
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", VN_FABRIC_MAX_DOORBELLS), -EINVAL);
    WAIT_FOR(log_has(b, "db:a:31") && log_has(a, "db:b:0"));
    ck_assert(log_has(b, "db:a:5"));
    ck_assert_uint_eq(stats_of(a).doorbells_sent, 2);
    ck_assert_uint_eq(stats_of(b).doorbells_received, 2);
    ck_assert_uint_eq(stats_of(b).msgs_received, 0);
}
END_TEST

/* A bit beyond the receiver's register (32 by default) is refused there. */
START_TEST(test_doorbell_beyond_register)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);

    link_nodes(a, b);
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", 40), 0);
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", 2), 0);
    WAIT_FOR(log_has(b, "db:a:2"));
    ck_assert(!log_has(b, "db:a:40"));
    ck_assert_uint_eq(stats_of(b).doorbells_received, 1);
    ck_assert_uint_eq(stats_of(b).bad_messages, 1);
}
END_TEST

/* A peer's flood of doorbells beyond its rate (doorbell-rate, here the least) is counted and
 * folded, a delivery per bit when the budget has room, not one per ring; the last ring of
 * each bit is still delivered (nothing a driver waits for is lost). */
START_TEST(test_doorbell_flood_coalesced)
{
    static const char *const kv[] = { "doorbell-rate", "100", NULL };
    Node *a = node_open("a", false);
    Node *b = node_open_kv("b", false, kv);
    const unsigned rings = 4000;
    VnFabricStats st;

    link_nodes(a, b);
    for (unsigned i = 0; i < rings; i++) {
        ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", 3), 0);
        if (i % 64 == 0) {
            g_main_context_iteration(ctx, FALSE); /* the sender's ring drains (ntb) */
        }
    }
    ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", 4), 0);
    WAIT_FOR(stats_of(b).doorbells_received == rings + 1 && log_has(b, "db:a:4"));
    st = stats_of(b);
    ck_assert_uint_ge(st.doorbells_coalesced, rings / 2);
    /* The burst (100) and a delivery per 10 ms budget tick after it. */
    ck_assert_uint_lt(log_count(b, "db:a:3"), rings / 4);
    ck_assert_uint_ge(log_count(b, "db:a:3"), 1);
    ck_assert_uint_eq(st.bad_messages, 0);
}
END_TEST

/* A doorbell-rate out of its range is refused. */
START_TEST(test_doorbell_rate_param)
{
    static const char *const bad[] = { "99", "10000001", "fast" };

    for (unsigned i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
        g_autoptr(GError) error = NULL;
        const char *key = NULL;

        g_hash_table_insert(params, "dir", tmpdir);
        g_hash_table_insert(params, "doorbell-rate", (char *)bad[i]);
        ck_assert(!vn_fabric_params_check("shm", params, &key, &error));
        ck_assert_str_eq(key, "doorbell-rate");
        ck_assert_msg(strstr(error->message, "doorbell-rate") != NULL, "%s", error->message);
    }
}
END_TEST

/* The host's bits are a budget: blocks are handed out once each. */
START_TEST(test_doorbell_budget)
{
    static const char *const sixteen[] = { "doorbells", "16", NULL };
    Node *a = node_open("a", false);
    Node *s = node_open_kv("s", false, sixteen);
    g_autoptr(GError) error = NULL;

    ck_assert_uint_eq(vn_fabric_limits(a->fab)->doorbells, 32);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 4, NULL), 0);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 2, NULL), 4);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 27, &error), -ENOSPC);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    ck_assert_ptr_nonnull(strstr(error->message, "has 32"));
    g_clear_error(&error);
    /* Freed bits are reused, first fit; a hole too small is skipped. */
    vn_fabric_doorbells_free(a->fab, 1, 2);
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(a->fab), 4);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 3, NULL), 6);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 2, NULL), 1);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 23, NULL), 9);
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(a->fab), 32);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 1, NULL), -ENOSPC);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 0, NULL), -EINVAL);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(a->fab, 33, NULL), -EINVAL);
    vn_fabric_doorbells_free(a->fab, 60, 10); /* out of range: nothing */
    ck_assert_uint_eq(vn_fabric_doorbells_in_use(a->fab), 32);

    /* A node with 16 bits has 16. */
    ck_assert_uint_eq(vn_fabric_limits(s->fab)->doorbells, 16);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(s->fab, 17, NULL), -EINVAL);
    ck_assert_int_eq(vn_fabric_doorbells_alloc(s->fab, 16, NULL), 0);
}
END_TEST

/* ---- crossing delay ----------------------------------------------------- */

/* A delay the sender spins for before each record: the time taken is at
 * least the delay times the records sent.  Only a lower bound is checked (a
 * loaded machine makes anything slower, never faster). */
START_TEST(test_crossing_delay)
{
    static const char *const kv[] = { "crossing-delay-ns", "200000", NULL }; /* 200 us */
    const unsigned requests = 10, doorbells = 10;
    Node *b = node_open_kv("b", true, kv);
    Node *a;
    uint64_t t0, elapsed;

    node_start(b);
    a = node_open_kv("a", false, kv);
    connect_wait(a, "b");
    t0 = vn_util_now_ns();
    for (unsigned i = 0; i < requests; i++) {
        g_autoptr(VnFabricMsg) reply = NULL;

        ck_assert_int_eq(fw_request(a->fab, "b", T_ECHO, "{}", NULL, 0, &reply), 0);
    }
    /* a request and its reply: two crossings, one on each side */
    elapsed = vn_util_now_ns() - t0;
    ck_assert_uint_ge(elapsed, 2ull * requests * 200000);
    t0 = vn_util_now_ns();
    for (unsigned i = 0; i < doorbells; i++) {
        ck_assert_int_eq(vn_fabric_doorbell(a->fab, "b", i), 0);
    }
    elapsed = vn_util_now_ns() - t0;
    ck_assert_uint_ge(elapsed, (uint64_t)doorbells * 200000);
    WAIT_FOR(log_has(b, "db:a:9"));
}
END_TEST

/* ---- the ntb backend's own ---------------------------------------------- */

/* An emulated port has 4 windows: window 0 carries the messages, so 3 segments are mapped
 * at a time through one port; a 4th map is refused by the exporter, and an unmap gives the
 * window back. */
START_TEST(test_ntb_window_budget)
{
    Node *b = node_open("b", true);
    Node *a;
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w[4] = { NULL };
    int memfd = memfd_new(4096, NULL);
    uint64_t seg[4];

    for (unsigned i = 0; i < 4; i++) {
        seg[i] = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
        ck_assert_uint_ne(seg[i], 0);
    }
    node_start(b);
    a = node_open("a", false);
    connect_wait(a, "b");
    /* Two ports (to b and to c) of 3 segment windows each. */
    ck_assert_uint_eq(vn_fabric_limits(a->fab)->max_windows, 6);
    for (unsigned i = 0; i < 3; i++) {
        w[i] = fw_window_map(a->fab, "b", seg[i], &error);
        ck_assert_msg(w[i] != NULL, "%s", error ? error->message : "");
    }
    ck_assert_ptr_null(fw_window_map(a->fab, "b", seg[3], &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    g_clear_error(&error);
    vn_fabric_window_unmap(a->fab, w[1]);
    /* The UNMAP is ahead of the MAP in b's ring: the window is free by then. */
    w[1] = fw_window_map(a->fab, "b", seg[3], &error);
    ck_assert_msg(w[1] != NULL, "%s", error ? error->message : "");
    memcpy(w[1]->host, "four", 4);
    ck_assert_mem_eq(w[0]->host, "four", 4); /* one memfd behind all four */
    for (unsigned i = 0; i < 3; i++) {
        vn_fabric_window_unmap(a->fab, w[i]);
    }
    close(memfd);
}
END_TEST

/* A peer that goes and comes back (a restarted daemon) is a new session: its link goes
 * down and comes up again, in that order, and carries messages. */
START_TEST(test_ntb_peer_restart)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);

    link_nodes(a, b);
    node_close(b);
    WAIT_FOR(log_has(a, "down:b"));
    b = node_open("b", false);
    WAIT_FOR(log_count(a, "up:b") == 2 && log_has(b, "up:a"));
    ck_assert_str_eq(a->log->pdata[a->log->len - 1], "up:b");
    assert_echo(a, "b", "{\"again\":1}");
    ck_assert_int_eq(log_count(a, "lost:"), 0); /* no window or route went with it */
}
END_TEST

/* A session that ends takes its windows and routes with it: once the link is down, the
 * fabric says so (on_paths_lost), on the side that stays as on the other; a link whose
 * session is taken over by the peer's next node (keep-ms) flaps with no such word. */
START_TEST(test_ntb_paths_lost)
{
    static const char *const keep[] = { "keep-ms", "60000", NULL };
    Node *a = node_open("a", false);
    Node *b = node_open_kv("b", false, keep);
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w;
    int memfd = memfd_new(4096, NULL);
    uint64_t seg = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);

    link_nodes(a, b);
    w = fw_window_map(a->fab, "b", seg, &error);
    ck_assert_msg(w != NULL, "%s", error ? error->message : "");
    node_close(b); /* kept */
    b = node_open_kv("b", false, keep);
    WAIT_FOR(log_count(a, "up:b") == 2);
    ck_assert_int_eq(log_count(a, "lost:"), 0);
    node_close(a); /* not kept: b's window and a's map end with the session */
    WAIT_FOR(log_has(b, "down:a") && log_has(b, "lost:a"));
    ck_assert_int_lt(log_index(b, "down:a"), log_index(b, "lost:a"));
    close(memfd);
}
END_TEST

/* A node that restarts on ports that keep its session (keep-ms): the next node takes the
 * session over.  Its peer sees the link go down and come up (RESUMED) but keeps the windows
 * it exported (so the budget left is what it was) and carries messages both ways; a node of
 * another configuration (another ring size) starts a new session instead, which frees them. */
START_TEST(test_ntb_resume)
{
    static const char *const keep[] = { "keep-ms", "60000", NULL };
    static const char *const other[] = { "keep-ms", "60000", "ring-size", "131072", NULL };
    Node *b = node_open_kv("b", false, keep);
    Node *a = node_open_kv("a", false, keep);
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w[3] = { NULL };
    int memfd = memfd_new(4096, NULL);
    uint64_t seg[4];

    for (unsigned i = 0; i < 4; i++) {
        seg[i] = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
        ck_assert_uint_ne(seg[i], 0);
    }
    link_nodes(a, b);
    for (unsigned i = 0; i < 2; i++) {
        w[i] = fw_window_map(a->fab, "b", seg[i], &error);
        ck_assert_msg(w[i] != NULL, "%s", error ? error->message : "");
    }
    node_close(a); /* its windows go with it, here only */
    spin(100);
    ck_assert_int_eq(log_count(b, "down:a"), 0);

    a = node_open_kv("a", false, keep);
    WAIT_FOR(log_count(b, "up:a") == 2 && log_has(a, "up:b"));
    ck_assert(log_has(b, "down:a"));
    w[2] = fw_window_map(a->fab, "b", seg[2], &error);
    ck_assert_msg(w[2] != NULL, "%s", error ? error->message : "");
    ck_assert_ptr_null(fw_window_map(a->fab, "b", seg[3], &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    g_clear_error(&error);
    assert_echo(a, "b", "{\"resumed\":1}");
    assert_echo(b, "a", "{\"resumed\":2}");

    node_close(a);
    a = node_open_kv("a", false, other);
    WAIT_FOR(log_count(b, "up:a") == 3 && log_has(a, "up:b"));
    for (unsigned i = 0; i < 3; i++) {
        w[i] = fw_window_map(a->fab, "b", seg[i + 1], &error);
        ck_assert_msg(w[i] != NULL, "%s", error ? error->message : "");
    }
    assert_echo(a, "b", "{\"new\":1}");
    for (unsigned i = 0; i < 3; i++) {
        vn_fabric_window_unmap(a->fab, w[i]);
    }
    close(memfd);
}
END_TEST

/* A session is not taken over once its peer is gone (its link down): the node starts anew,
 * and its link comes up only with the peer's next session. */
START_TEST(test_ntb_resume_peer_gone)
{
    static const char *const keep[] = { "keep-ms", "60000", NULL };
    Node *a = node_open_kv("a", false, keep);
    Node *b = node_open("b", false);

    link_nodes(a, b);
    node_close(a);
    node_close(b);
    a = node_open_kv("a", false, keep);
    spin(100);
    ck_assert_int_eq(log_count(a, "up:b"), 0);
    b = node_open("b", false);
    WAIT_FOR(log_count(a, "up:b") == 1 && log_count(b, "up:a") == 1);
    assert_echo(a, "b", "{\"anew\":1}");
}
END_TEST

/* An exporter that restarts keeps its windows for the workers that still hold the segments:
 * what a worker claims back (vn_fabric_adopt: its own peer's, once) is the new node's to
 * withdraw again; what nobody claims is withdrawn at vn_fabric_adopt_end, which frees the
 * peer's windows.  A mapper that restarts gives back, at vn_fabric_adopt_end, the windows
 * nobody claimed, and the one claimed at its unmap. */
START_TEST(test_ntb_resume_adopt)
{
    static const char *const keep[] = { "keep-ms", "60000", NULL };
    Node *a = node_open_kv("a", false, keep);
    Node *b = node_open_kv("b", false, keep);
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w[4] = { NULL };
    int memfd = memfd_new(4096, NULL);
    uint64_t seg[5], fresh[3];

    for (unsigned i = 0; i < 4; i++) {
        seg[i] = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
        ck_assert_uint_ne(seg[i], 0);
    }
    link_nodes(a, b);
    for (unsigned i = 0; i < 3; i++) {
        w[i] = fw_window_map(a->fab, "b", seg[i], &error);
        ck_assert_msg(w[i] != NULL, "%s", error ? error->message : "");
    }
    node_close(b);
    b = node_open_kv("b", false, keep);
    WAIT_FOR(log_count(a, "up:b") == 2);

    /* Claims: its own (once), not another peer's, not one never exported. */
    ck_assert(vn_fabric_adopt(b->fab, VN_FABRIC_HELD_SEGMENT, seg[0], "a"));
    ck_assert(!vn_fabric_adopt(b->fab, VN_FABRIC_HELD_SEGMENT, seg[0], "a"));
    ck_assert(!vn_fabric_adopt(b->fab, VN_FABRIC_HELD_SEGMENT, seg[1], "c"));
    ck_assert(!vn_fabric_adopt(b->fab, VN_FABRIC_HELD_SEGMENT, seg[3], "a"));
    ck_assert(!vn_fabric_adopt(b->fab, VN_FABRIC_HELD_ROUTE, seg[1], "a"));
    ck_assert(!vn_fabric_adopt(b->fab, VN_FABRIC_HELD_WINDOW, seg[1], "a"));
    ck_assert(!vn_fabric_adopt(b->fab, VN_FABRIC_HELD_LAST, seg[1], "a"));
    /* All three windows still exported: nothing more fits. */
    seg[4] = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
    ck_assert_ptr_null(fw_window_map(a->fab, "b", seg[4], &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE));
    g_clear_error(&error);
    /* The adopted segment is withdrawn as any; the two nobody claimed at adopt_end. */
    vn_fabric_segment_unexport(b->fab, seg[0]);
    vn_fabric_adopt_end(b->fab);
    vn_fabric_window_unmap(a->fab, w[0]);
    for (unsigned i = 1; i < 3; i++) {
        vn_fabric_window_unmap(a->fab, w[i]);
    }
    /* b's segment entries of before are gone with it: export anew, then all three fit. */
    for (unsigned i = 0; i < 3; i++) {
        fresh[i] = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
        w[i] = fw_window_map(a->fab, "b", fresh[i], &error);
        ck_assert_msg(w[i] != NULL, "%s", error ? error->message : "");
    }

    /* Now a restarts, holding those three windows: one claimed back and unmapped, the others
     * given back at adopt_end; then b has all three windows free again. */
    node_close(a); /* the rig's windows go with it; the port keeps them */
    a = node_open_kv("a", false, keep);
    WAIT_FOR(log_count(b, "up:a") == 2);
    ck_assert(vn_fabric_adopt(a->fab, VN_FABRIC_HELD_WINDOW, fresh[0], "b"));
    ck_assert(!vn_fabric_adopt(a->fab, VN_FABRIC_HELD_WINDOW, fresh[0], "b"));
    ck_assert(!vn_fabric_adopt(a->fab, VN_FABRIC_HELD_WINDOW, seg[4], "b"));
    vn_fabric_adopted_unmap(a->fab, "b", fresh[0]);
    vn_fabric_adopt_end(a->fab);
    for (unsigned i = 0; i < 3; i++) {
        uint64_t id = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);

        w[i] = fw_window_map(a->fab, "b", id, &error);
        ck_assert_msg(w[i] != NULL, "%s", error ? error->message : "");
    }
    for (unsigned i = 0; i < 3; i++) {
        vn_fabric_window_unmap(a->fab, w[i]);
    }
    close(memfd);
}
END_TEST

/* A session on its way is not waited for (the daemon's loop would stall: up to 1 s each); a
 * caller that needs the link is called back once it is up, or at the deadline. */
START_TEST(test_ntb_connect_does_not_wait)
{
    /* Opened first, their loops not run: they greet a only from their loop, b later and c
     * never. */
    Node *b = node_open("b", true);
    Node *a;
    Conn to_b = { 0 }, to_c = { 0 };
    g_autoptr(GError) error = NULL;
    gint64 t0;

    node_open("c", true);
    a = node_open("a", false);
    t0 = now_ms();

    ck_assert(!vn_fabric_connect(a->fab, "b", &error));
    ck_assert_msg(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PENDING), "%s", error->message);
    ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "b", on_conn, &to_b));
    ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "c", on_conn, &to_c));
    /* The old connect waited VN_FABRIC_CONNECT_WAIT_MS for each. */
    ck_assert_int_lt(now_ms() - t0, VN_FABRIC_CONNECT_WAIT_MS / 2);
    spin(100);
    ck_assert_int_eq(to_b.calls + to_c.calls, 0); /* on their way */
    node_start(b);
    WAIT_FOR(to_b.calls == 1);
    ck_assert_int_eq(to_b.err, 0);
    ck_assert(vn_fabric_link_up(a->fab, "b"));
    WAIT_FOR_MS(to_c.calls == 1, VN_FABRIC_CONNECT_WAIT_MS * 3);
    ck_assert_int_eq(to_c.err, -EHOSTUNREACH);
}
END_TEST

/* Connects waiting for a link on its way are bounded: past VN_FABRIC_MAX_CONNECTS the answer
 * is no, at once (each waiting one holds a timer for a second). */
START_TEST(test_ntb_connects_bounded)
{
    Node *b = node_open("b", true); /* never greets: its connects wait */
    Node *a = node_open("a", false);
    g_autofree Conn *waiting = g_new0(Conn, VN_FABRIC_MAX_CONNECTS);
    Conn over = { 0 };

    (void)b;
    for (unsigned i = 0; i < VN_FABRIC_MAX_CONNECTS; i++) {
        ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "b", on_conn, &waiting[i]));
    }
    ck_assert_ptr_nonnull(vn_fabric_connect_async(a->fab, "b", on_conn, &over));
    WAIT_FOR_MS(over.calls == 1, VN_FABRIC_CONNECT_WAIT_MS / 2);
    ck_assert_int_eq(over.err, -EAGAIN);
    ck_assert_int_eq(waiting[0].calls, 0); /* the others still wait */
    WAIT_FOR_MS(waiting[VN_FABRIC_MAX_CONNECTS - 1].calls == 1, VN_FABRIC_CONNECT_WAIT_MS * 3);
    ck_assert_int_eq(waiting[0].err, -EHOSTUNREACH);
}
END_TEST

/* A peer that reads nothing (its loop does not run) does not hold its sender's loop: what
 * its ring does not take is queued up to VN_NTB_MAX_QUEUED, and the send past that fails at
 * once and ends the link (a send waited up to VN_NTB_SEND_TIMEOUT_MS for room). */
START_TEST(test_ntb_send_does_not_wait)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autofree uint8_t *mib = g_malloc0(1024u * 1024u);
    unsigned sent = 0;
    int ret = 0;
    gint64 t0;

    link_nodes(a, b);
    /* b reads only when the loop runs, which it does not while a sends. */
    t0 = now_ms();
    while (sent < 64 && (ret = vn_fabric_event(a->fab, "b", 9, NULL, mib, 1024u * 1024u)) == 0) {
        sent++;
    }
    ck_assert_int_lt(now_ms() - t0, VN_NTB_SEND_TIMEOUT_MS / 2);
    ck_assert_int_lt(ret, 0);
    ck_assert_uint_le(sent, VN_NTB_MAX_QUEUED / (1024u * 1024u) + 1);
    WAIT_FOR(log_has(a, "down:b"));
}
END_TEST

/* Frames of every size cross a ring of the smallest size, whole and in order. */
START_TEST(test_ntb_fragments)
{
    static const char *const small[] = { "ring-size", "65536", NULL };
    Node *b = node_open_kv("b", true, small);
    Node *a;
    g_autofree uint8_t *big = g_malloc(VN_FABRIC_MAX_PAYLOAD - 64);

    for (size_t i = 0; i < VN_FABRIC_MAX_PAYLOAD - 64; i++) {
        big[i] = (uint8_t)(i * 7);
    }
    node_start(b);
    a = node_open_kv("a", false, small);
    connect_wait(a, "b");
    for (size_t len = 1; len < VN_FABRIC_MAX_PAYLOAD - 64; len = len * 5 + 3) {
        g_autoptr(VnFabricMsg) reply = NULL;

        ck_assert_int_eq(fw_request(a->fab, "b", T_ECHO, NULL, big, len, &reply), 0);
        ck_assert_uint_eq(reply->data_len, len);
        ck_assert_mem_eq(reply->data, big, len);
    }
}
END_TEST

/* A burst of more records than one wake-up takes (the peer rang once for all) is all
 * received, in order. */
START_TEST(test_ntb_burst)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autofree char *last = NULL;

    link_nodes(a, b);
    for (unsigned i = 0; i < 5 * VN_NTB_RECORDS_PER_WAKEUP; i++) {
        g_autofree char *json = g_strdup_printf("{\"n\":%u}", i);

        ck_assert_int_eq(vn_fabric_event(a->fab, "b", 5, json, NULL, 0), 0);
    }
    last = g_strdup_printf("ev:5:{\"n\":%u}:0", 5 * VN_NTB_RECORDS_PER_WAKEUP - 1);
    WAIT_FOR(log_count(b, "ev:5:") == 5 * VN_NTB_RECORDS_PER_WAKEUP);
    ck_assert_str_eq(b->log->pdata[b->log->len - 1], last);
}
END_TEST

/* An asynchronous map still waiting when its node closes is told once, cancelled; and one
 * whose answer came but was not told yet too: nothing of either runs after the close (a
 * delivery left on the loop would touch the freed node; ASan sees it). */
START_TEST(test_ntb_close_cancels_map)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    int memfd = memfd_new(4096, NULL);
    Mapped m = { 0 };
    uint64_t seg;

    link_nodes(a, b);
    seg = vn_fabric_segment_export(b->fab, memfd, 4096, "a", NULL);
    for (int answered = 0; answered < 2; answered++) {
        m = (Mapped){ 0 };
        vn_fabric_window_map_async(a->fab, "b", seg, on_mapped, &m);
        if (answered) {
            /* A connect serves the node's ports (c is not there): b answers, a reads the
             * answer, and only the loop would tell it. */
            vn_fabric_connect(b->fab, "c", NULL);
            vn_fabric_connect(a->fab, "c", NULL);
        }
        ck_assert(!m.done);
        node_close(a);
        ck_assert(m.done);
        ck_assert_ptr_null(m.w);
        ck_assert_int_eq(m.code, G_IO_ERROR_CANCELLED);
        m.done = false;
        spin(50);
        ck_assert(!m.done);
        a = node_open("a", false);
        WAIT_FOR(vn_fabric_link_up(a->fab, "b") && vn_fabric_link_up(b->fab, "a"));
    }
    close(memfd);
}
END_TEST

/* Routes through doorbells: each of a's opens takes a doorbell bit of b's (the pair's 64,
 * less the backend's), one more is refused, and a route b withdraws gives its bit back; so
 * does a's restart (the session's end), all of them. */
START_TEST(test_ntb_route_bits)
{
    enum { BITS = 64 - VN_NTB_DB_FIRST_ROUTE };
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    uint64_t ids[BITS + 1], one = 1, n = 0;
    Routed r[BITS + 1] = { { 0 } }, again = { 0 }, restarted = { 0 };

    link_nodes(a, b);
    for (unsigned i = 0; i <= BITS; i++) {
        ids[i] = vn_fabric_route_export(b->fab, efd, "a", NULL);
        ck_assert_uint_ne(ids[i], 0);
        vn_fabric_route_open_async(a->fab, "b", ids[i], on_routed, &r[i]);
        WAIT_FOR(r[i].done);
        ck_assert_int_eq(r[i].fd >= 0, i < BITS);
    }
    ck_assert_int_eq(r[BITS].fd, -ENOSPC);
    ck_assert_int_eq(write(r[BITS - 1].fd, &one, sizeof(one)), sizeof(one));
    ck_assert_int_eq(read(efd, &n, sizeof(n)), sizeof(n));

    vn_fabric_route_unexport(b->fab, ids[0]);
    vn_fabric_route_open_async(a->fab, "b", ids[BITS], on_routed, &again);
    WAIT_FOR(again.done);
    ck_assert_int_ge(again.fd, 0);

    node_close(a);
    a = node_open("a", false);
    WAIT_FOR(vn_fabric_link_up(a->fab, "b") && vn_fabric_link_up(b->fab, "a"));
    vn_fabric_route_open_async(a->fab, "b", ids[1], on_routed, &restarted);
    WAIT_FOR(restarted.done);
    ck_assert_int_ge(restarted.fd, 0);
    for (unsigned i = 0; i <= BITS; i++) {
        if (r[i].fd >= 0) {
            close(r[i].fd);
        }
        vn_fabric_route_unexport(b->fab, ids[i]);
    }
    close(again.fd);
    close(restarted.fd);
    close(efd);
}
END_TEST

/* A link has at most VN_NTB_MAX_MAPS_PENDING (48) requests waiting for the peer: one more is
 * refused (EBUSY) at once, and the others are answered. */
START_TEST(test_ntb_asks_bounded)
{
    enum { ASKS = 49 };
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    uint64_t ids[ASKS];
    Routed r[ASKS] = { { 0 } };
    unsigned opened = 0;

    link_nodes(a, b);
    for (unsigned i = 0; i < ASKS; i++) {
        ids[i] = vn_fabric_route_export(b->fab, efd, "a", NULL);
        /* No loop turns between them: every one is still waiting when the next is asked. */
        vn_fabric_route_open_async(a->fab, "b", ids[i], on_routed, &r[i]);
    }
    for (unsigned i = 0; i < ASKS; i++) {
        WAIT_FOR(r[i].done);
        opened += r[i].fd >= 0;
        if (r[i].fd >= 0) {
            close(r[i].fd);
        }
        vn_fabric_route_unexport(b->fab, ids[i]);
    }
    ck_assert_uint_eq(opened, ASKS - 1);
    ck_assert_int_eq(r[ASKS - 1].fd, -EBUSY);
    close(efd);
}
END_TEST

static const struct {
    const char *key, *value, *why;
} ntb_bad[] = {
    { "ring-size", "1000", "ring-size" },
    { "ring-size", "100000", "not a power of two" },
    { "ring-size", "1073741824", "ring-size" },
    { "ports", "", "must list 1 to" },
    { "ports", "/tmp/x", "not /dev/vfio-ntb/NAME" },
    { "ports", "pair:k/2", "pair:KEY/0 or pair:KEY/1" },
    { "ports", "pair:k/0=Not A Node", "is not a node name" },
    { "ports", "/dev/vfio-ntb/absent", "No such file" },
    { "dir", "/tmp", "unknown parameter \"dir\"" },
};

START_TEST(test_ntb_params)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    VnFabric *f;

    g_hash_table_insert(params, "ports", "pair:params/0");
    g_hash_table_insert(params, (char *)ntb_bad[_i].key, (char *)ntb_bad[_i].value);
    f = vn_fabric_open("ntb", "a", params, &handlers, NULL, ctx, &error);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(error->message, ntb_bad[_i].why) != NULL, "%s", error->message);
}
END_TEST

/* ---- a peer that does not read -------------------------------------------- */

#define MIB (1024u * 1024u)

/* b's node is never run: it reads nothing.  a's sends to it never wait (each returns at
 * once, what b's socket does not take waits in a's queue) until VN_SHM_MAX_QUEUED would be
 * passed: that send fails and b's link is dropped. */
START_TEST(test_reader_that_stops_loses_link)
{
    g_autofree uint8_t *mib = g_malloc0(MIB);
    Node *a;

    node_open("b", true); /* never started */
    a = node_open("a", false);
    unsigned sent = 0;
    int ret = 0;

    connect_wait(a, "b");
    while (sent < 64 && (ret = vn_fabric_event(a->fab, "b", 9, NULL, mib, MIB)) == 0) {
        sent++;
    }
    ck_assert_int_eq(ret, -ENOBUFS);
    /* What the queue holds (and the socket took) passed, nothing more. */
    ck_assert_uint_ge(sent, VN_SHM_MAX_QUEUED / VN_FABRIC_MAX_FRAME - 1);
    ck_assert_uint_le(sent, VN_SHM_MAX_QUEUED / MIB + 4);
    WAIT_FOR(log_has(a, "down:b"));
}
END_TEST

/* A reader that is only slow gets everything, in order, once it reads again. */
START_TEST(test_slow_reader_gets_all)
{
    Node *b = node_open("b", true);
    Node *a = node_open("a", false);
    g_autofree uint8_t *mib = g_malloc0(MIB);
    char json[32];

    connect_wait(a, "b");
    for (unsigned i = 0; i < 8; i++) {
        g_snprintf(json, sizeof(json), "{\"n\":%u}", i);
        ck_assert_int_eq(vn_fabric_event(a->fab, "b", 9, json, mib, MIB), 0);
    }
    node_start(b);
    /* a's queue goes as b's socket drains, from a's loop (the one WAIT_FOR runs). */
    WAIT_FOR_MS(log_count(b, "ev:9:") == 8, 5000);
    for (unsigned i = 0; i < 8; i++) {
        char entry[64];

        g_snprintf(entry, sizeof(entry), "ev:9:{\"n\":%u}:%u", i, MIB);
        ck_assert_msg(log_at_is(b, i + 1, entry), "event %u out of order", i); /* after up:a */
    }
    ck_assert(vn_fabric_link_up(a->fab, "b"));
}
END_TEST

/* A reader that takes nothing for VN_SHM_SEND_TIMEOUT_S loses its link, however little
 * waits for it. */
START_TEST(test_reader_that_stalls_loses_link)
{
    g_autofree uint8_t *mib = g_malloc0(MIB);
    Node *a;

    node_open("b", true); /* never started */
    a = node_open("a", false);

    connect_wait(a, "b");
    ck_assert_int_eq(vn_fabric_event(a->fab, "b", 9, NULL, mib, MIB), 0);
    ck_assert(vn_fabric_link_up(a->fab, "b"));
    WAIT_FOR_MS(log_has(a, "down:b"), (VN_SHM_SEND_TIMEOUT_S + 3) * 1000);
}
END_TEST

static Suite *fabric_suite(void)
{
    Suite *s = suite_create("fabric");
    TCase *tc;

    /* What every backend must do, run over each (one suite, two backends). */
    const struct {
        const char *tcase;
        const TTest *tests[12];
    } shared[] = {
        { "link",
          { test_link_up_down, test_simultaneous_connect, test_connect_errors, test_connect_async,
            test_connect_async_close_cancels } },
        { "messages",
          { test_request_reply, test_event, test_error_reply, test_message_args,
            test_threaded_peer_answers, test_map_back_while_asking, test_connect_inside_handler,
            test_requests_past_what_peer_takes_wait, test_held_requests_fail_with_link,
            test_held_requests_end_when_peer_never_answers } },
        { "failures",
          { test_request_timeout, test_reset_on_peer_close, test_reset_on_peer_quit,
            test_close_cancels } },
        { "windows",
          { test_window_map, test_window_map_at_offset, test_windows_join, test_window_map_async,
            test_map_not_granted, test_window_outlives_link, test_export_errors,
            test_segment_share } },
        { "doorbells",
          { test_doorbells, test_doorbell_beyond_register, test_doorbell_flood_coalesced } },
        { "routes", { test_route, test_route_open_async, test_route_not_granted } },
    };

    for (unsigned i = 0; i < G_N_ELEMENTS(shared); i++) {
        for (unsigned b = 0; b < 2; b++) {
            /* libcheck keeps the pointer: the names live as long as the run. */
            static char names[2 * 8][32];
            char *name = names[2 * i + b];

            g_snprintf(name, sizeof(names[0]), "%s-%s", shared[i].tcase, b ? "ntb" : "shm");
            tc = tcase_create(name);
            tcase_add_checked_fixture(tc, b ? setup_ntb : setup, teardown);
            for (unsigned t = 0; shared[i].tests[t] != NULL; t++) {
                tcase_add_test(tc, shared[i].tests[t]);
            }
            suite_add_tcase(s, tc);
        }
    }

    tc = tcase_create("ntb");
    tcase_add_checked_fixture(tc, setup_ntb, teardown);
    tcase_add_test(tc, test_ntb_window_budget);
    tcase_add_test(tc, test_ntb_peer_restart);
    tcase_add_test(tc, test_ntb_resume);
    tcase_add_test(tc, test_ntb_resume_adopt);
    tcase_add_test(tc, test_ntb_resume_peer_gone);
    tcase_add_test(tc, test_ntb_paths_lost);
    tcase_add_test(tc, test_ntb_connect_does_not_wait);
    tcase_add_test(tc, test_ntb_connects_bounded);
    tcase_add_test(tc, test_ntb_send_does_not_wait);
    tcase_add_test(tc, test_ntb_fragments);
    tcase_add_test(tc, test_ntb_close_cancels_map);
    tcase_add_test(tc, test_ntb_route_bits);
    tcase_add_test(tc, test_ntb_asks_bounded);
    tcase_add_test(tc, test_ntb_burst);
    tcase_add_loop_test(tc, test_ntb_params, 0, G_N_ELEMENTS(ntb_bad));
    suite_add_tcase(s, tc);

    /* What the shm backend's parameters and capabilities add. */
    tc = tcase_create("shm");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_register);
    tcase_add_test(tc, test_window_limits);
    tcase_add_test(tc, test_export_budget);
    tcase_add_test(tc, test_fetch_peer_not_accepting);
    tcase_add_test(tc, test_route_errors);
    tcase_add_test(tc, test_doorbell_budget);
    tcase_add_test(tc, test_doorbell_rate_param);
    tcase_add_test(tc, test_crossing_delay);
    suite_add_tcase(s, tc);

    tc = tcase_create("shm-slow-reader");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_reader_that_stops_loses_link);
    tcase_add_test(tc, test_slow_reader_gets_all);
    tcase_add_test(tc, test_reader_that_stalls_loses_link);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(fabric_suite());
}
