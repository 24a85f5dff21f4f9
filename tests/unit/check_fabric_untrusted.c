/*
 * Unit tests of the NTB fabric against untrusted input: parameters and names
 * vn_fabric_open() must refuse, and a raw socket that speaks the shm wire
 * format by hand sending malformed frames, handshakes and streams to a node,
 * which must count each, close its fds, answer a bad request with an error,
 * change nothing else and keep serving its good peer; and a raw peer of the
 * ntb backend writing malformed records into a node's ring.  The rig is in
 * fabric-rig.h.
 */
#include "check-main.h"
#include "fabric-rig.h"
#include "common/util.h"
#include "fabric/ntb.h"
#include "fabric/ntbport.h"

#include <sys/eventfd.h>

/* ---- parameters ---------------------------------------------------------- */

/* Parameters or names vn_fabric_open() must refuse: the node, then key,
 * value pairs over the test's {"dir": tmpdir} (a NULL value removes). */
static const struct {
    const char *node;
    const char *kv[5];
} open_bad[] = {
    { "a", { "dir", NULL } },
    { "a", { "dir", "" } },
    { "A", { NULL } },
    { "-a", { NULL } },
    { "", { NULL } },
    { "a_b", { NULL } },
    { "abcdefghijklmnopqrstuvwxyz012345", { NULL } }, /* 32 characters */
    { "a", { "max-windows", "0" } },
    { "a", { "max-windows", "257" } },
    { "a", { "max-windows", "two" } },
    { "a", { "max-windows", "-1" } },
    { "a", { "max-window-size", "12345" } },
    { "a", { "max-window-size", "1024" } },
    { "a", { "max-window-size", "2199023255552" } }, /* 2 TiB */
    { "a", { "window-align", "0" } },
    { "a", { "window-align", "6000" } },
    { "a", { "xlat-granularity", "3000" } },
    { "a", { "max-window-size", "65536", "xlat-granularity", "131072" } },
    { "a", { "crossing-delay-ns", "1000001" } },
    { "a", { "crossing-delay-ns", "-1" } },
    { "a", { "crossing-delay-ns", "fast" } },
    { "a", { "doorbells", "0" } },
    { "a", { "doorbells", "65" } },
    { "a", { "max-segments", "0" } },
    { "a", { "max-segments", "1025" } },
    { "a", { "colour", "blue" } },
    { "a", { "request-timeout-ms", "0" } },
    { "a", { "request-timeout-ms", "soon" } },
};

START_TEST(test_open_refused)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    g_autofree char *sock = NULL;
    VnFabric *fab;

    g_hash_table_insert(params, "dir", tmpdir);
    for (const char *const *kv = open_bad[_i].kv; kv[0] != NULL; kv += 2) {
        if (kv[1] == NULL) {
            g_hash_table_remove(params, kv[0]);
        } else {
            g_hash_table_insert(params, (char *)kv[0], (char *)kv[1]);
        }
    }
    fab = vn_fabric_open("shm", open_bad[_i].node, params, &handlers, NULL, ctx, &error);
    ck_assert_ptr_null(fab);
    ck_assert_ptr_nonnull(error);
    ck_assert_ptr_nonnull(error->message);
    sock = g_build_filename(tmpdir, "a.sock", NULL);
    ck_assert(!g_file_test(sock, G_FILE_TEST_EXISTS));
}
END_TEST

START_TEST(test_open_dir_and_names)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GError) error = NULL;
    g_autofree char *gw = g_build_filename(tmpdir, "gw", NULL);
    g_autofree char *fresh = g_build_filename(tmpdir, "new", "sub", NULL);
    g_autofree char *stale = g_build_filename(tmpdir, "c.sock", NULL);
    g_autofree char *plain = g_build_filename(tmpdir, "d.sock", NULL);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    struct stat st;
    VnFabric *fab;
    Node *a, *b;
    int fd;

    /* A group-writable directory is refused. */
    ck_assert_int_eq(g_mkdir(gw, 0700), 0);
    ck_assert_int_eq(chmod(gw, 0770), 0);
    g_hash_table_insert(params, "dir", gw);
    fab = vn_fabric_open("shm", "a", params, &handlers, NULL, ctx, &error);
    ck_assert_ptr_null(fab);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED));
    g_clear_error(&error);

    /* A missing one is created, 0700. */
    g_hash_table_insert(params, "dir", fresh);
    fab = vn_fabric_open("shm", "a", params, &handlers, NULL, ctx, &error);
    ck_assert_msg(fab != NULL, "%s", error ? error->message : "");
    ck_assert_int_eq(stat(fresh, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    vn_fabric_close(fab);

    /* A live node's name is taken; the first node keeps working. */
    a = node_open("a", false);
    g_hash_table_insert(params, "dir", tmpdir);
    fab = vn_fabric_open("shm", "a", params, &handlers, NULL, ctx, &error);
    ck_assert_ptr_null(fab);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_EXISTS));
    g_clear_error(&error);
    b = node_open("b", false);
    link_nodes(b, a);

    /* A dead node's socket file is replaced. */
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    g_strlcpy(addr.sun_path, stale, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    close(fd);
    node_open("c", false);

    /* A file that is not a socket is left alone. */
    ck_assert(g_file_set_contents(plain, "keep", -1, NULL));
    fab = vn_fabric_open("shm", "d", params, &handlers, NULL, ctx, &error);
    ck_assert_ptr_null(fab);
    ck_assert(g_file_test(plain, G_FILE_TEST_IS_REGULAR));

    /* No such backend. */
    g_clear_error(&error);
    ck_assert_ptr_null(vn_fabric_open("rdma", "e", params, &handlers, NULL, ctx, &error));
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND));
}
END_TEST

/* ---- frames ------------------------------------------------------------ */

/* Send one shm record by hand: length, bytes, fds on the first byte. */
static void raw_record(int fd, const void *buf, size_t len, const int *fds, unsigned nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * 64)];
        struct cmsghdr align;
    } cbuf;
    uint32_t prefix = GUINT32_TO_LE((uint32_t)len);
    struct iovec iov[2] = { { &prefix, 4 }, { (void *)buf, len } };
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = len > 0 ? 2 : 1 };

    ck_assert_uint_le(nfds, 64);
    if (nfds > 0) {
        struct cmsghdr *cm;

        memset(cbuf.buf, 0, sizeof(cbuf.buf));
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    ck_assert_int_eq(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)(4 + len));
}

static int raw_connect(const char *node)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    g_autofree char *path = g_strdup_printf("%s/%s.sock", tmpdir, node);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    return fd;
}

static void raw_hello(int fd, const char *name)
{
    VnShmHello h = { .magic = VN_SHM_HELLO_MAGIC, .version = VN_SHM_HELLO_VERSION };

    g_strlcpy(h.node, name, sizeof(h.node));
    raw_record(fd, &h, sizeof(h), NULL, 0);
}

/* Receive one record, iterating the shared context meanwhile: 1 with @out
 * filled, 0 on timeout, -1 at EOF. */
static int raw_recv(int fd, GByteArray *out, int timeout_ms)
{
    gint64 end = now_ms() + timeout_ms;
    uint32_t len = 0;

    g_byte_array_set_size(out, 0);
    while (now_ms() < end) {
        uint8_t buf[4096];
        ssize_t n;
        size_t want;

        if (out->len >= 4) {
            memcpy(&len, out->data, 4);
            if (out->len >= 4 + (size_t)len) {
                g_byte_array_remove_range(out, 0, 4);
                g_byte_array_set_size(out, len);
                return 1;
            }
            want = 4 + len - out->len;
        } else {
            want = 4 - out->len;
        }
        n = recv(fd, buf, MIN(want, sizeof(buf)), MSG_DONTWAIT);
        if (n == 0) {
            return -1;
        }
        if (n > 0) {
            g_byte_array_append(out, buf, (guint)n);
            continue;
        }
        if (!g_main_context_iteration(ctx, FALSE)) {
            g_usleep(500);
        }
    }
    return 0;
}

static void frame(GByteArray *m, uint16_t flags, uint32_t type, uint64_t id, const char *json,
                  const void *data, size_t len)
{
    ck_assert_int_eq(vn_fabric_frame_encode(m, flags, type, id, 0, json, data, len), 0);
}

static VnFabricFrameHdr *hdr_of(GByteArray *m)
{
    return (VnFabricFrameHdr *)m->data;
}

/* A good request over the raw socket is answered: the node still serves
 * this peer, and nothing (no stray error reply) came before the answer. */
static void raw_echo_ok(int fd, uint64_t id)
{
    g_autoptr(GByteArray) m = g_byte_array_new();
    VnFabricFrameHdr h;

    frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, id, "{\"ok\":true}", NULL, 0);
    raw_record(fd, m->data, m->len, NULL, 0);
    ck_assert_int_eq(raw_recv(fd, m, 3000), 1);
    ck_assert_uint_ge(m->len, sizeof(h));
    memcpy(&h, m->data, sizeof(h));
    ck_assert_uint_eq(h.id, id);
    ck_assert_uint_eq(h.flags, VN_FABRIC_FLAG_REPLY);
}

/* The good peer is still served. */
static void good_peer_ok(Node *b)
{
    assert_echo(b, "a", "{\"still\":1}");
}

/* True once every copy of a pipe's write end is closed. */
static bool pipe_closed(int rd)
{
    struct pollfd p = { .fd = rd, .events = POLLIN };

    return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

enum {
    BAD_MAGIC,
    BAD_VERSION,
    BAD_SHORT,
    BAD_EMPTY,
    BAD_JSON_LEN_HUGE,
    BAD_DATA_LEN_HUGE,
    BAD_LEN_MISMATCH,
    BAD_JSON_NO_NUL,
    BAD_JSON_NUL_INSIDE,
    BAD_JSON_ARRAY,
    BAD_JSON_SYNTAX,
    BAD_JSON_UTF8,
    BAD_JSON_DEEP,
    BAD_REPLY_UNKNOWN_ID,
    BAD_RESERVED_TYPE,
    BAD_RESERVED_EVENT,
    BAD_FLAGS,
    BAD_NO_KIND,
    BAD_ERROR_ON_REQUEST,
    BAD_RESERVED_FIELD,
    BAD_RESERVED0_FIELD,
    BAD_ID_ZERO,
    BAD_DOORBELL_BIT,
    BAD_DOORBELL_JSON,
    BAD_DOORBELL_REQUEST,
    BAD_LAST
};

/* Each is counted bad, a request among them gets an error reply (errno
 * here; 0: no reply), and nothing else happens. */
static const struct {
    const char *name;
    int reply;
} bad_frames[BAD_LAST] = {
    [BAD_MAGIC] = { "bad magic", 0 },
    [BAD_VERSION] = { "another version", EPROTONOSUPPORT },
    [BAD_SHORT] = { "shorter than a header", 0 },
    [BAD_EMPTY] = { "an empty record", 0 },
    [BAD_JSON_LEN_HUGE] = { "json_len beyond the payload limit", EMSGSIZE },
    [BAD_DATA_LEN_HUGE] = { "data_len beyond the payload limit", EMSGSIZE },
    [BAD_LEN_MISMATCH] = { "lengths that do not add up", EINVAL },
    [BAD_JSON_NO_NUL] = { "JSON not NUL-terminated", EINVAL },
    [BAD_JSON_NUL_INSIDE] = { "JSON with a NUL inside", EINVAL },
    [BAD_JSON_ARRAY] = { "JSON that is not an object", EINVAL },
    [BAD_JSON_SYNTAX] = { "JSON that does not parse", EINVAL },
    [BAD_JSON_UTF8] = { "JSON that is not UTF-8", EINVAL },
    [BAD_JSON_DEEP] = { "JSON nested too deep", EINVAL },
    [BAD_REPLY_UNKNOWN_ID] = { "a reply with an unknown id", 0 },
    [BAD_RESERVED_TYPE] = { "a request of an unknown reserved type", ENOTSUP },
    [BAD_RESERVED_EVENT] = { "an event of an unknown reserved type", 0 },
    [BAD_FLAGS] = { "unknown flag bits", 0 },
    [BAD_NO_KIND] = { "two kinds at once", 0 },
    [BAD_ERROR_ON_REQUEST] = { "the error flag on a request", EINVAL },
    [BAD_RESERVED_FIELD] = { "the reserved field set", EINVAL },
    [BAD_RESERVED0_FIELD] = { "the first reserved field set", EINVAL },
    [BAD_ID_ZERO] = { "a request with id 0", 0 },
    [BAD_DOORBELL_BIT] = { "doorbell bit 99", 0 },
    [BAD_DOORBELL_JSON] = { "a doorbell with JSON", 0 },
    [BAD_DOORBELL_REQUEST] = { "a doorbell sent as a request", EINVAL },
};

static void build_bad(int which, GByteArray *m)
{
    const uint64_t id = 900 + (uint64_t)which;
    const uint8_t latin1[] = "{\"k\":\"\xe9t\xe9\"}";
    uint32_t bit = 99;
    GString *deep = NULL;

    frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, id, "{\"a\":1}", "bin", 3);
    switch (which) {
    case BAD_MAGIC:
        hdr_of(m)->magic = 0xdeadbeef;
        break;
    case BAD_VERSION:
        hdr_of(m)->version = VN_FABRIC_FRAME_VERSION + 1;
        break;
    case BAD_SHORT:
        g_byte_array_set_size(m, 10);
        break;
    case BAD_EMPTY:
        g_byte_array_set_size(m, 0);
        break;
    case BAD_JSON_LEN_HUGE:
        hdr_of(m)->json_len = VN_FABRIC_MAX_PAYLOAD + 1;
        break;
    case BAD_DATA_LEN_HUGE:
        hdr_of(m)->data_len = 0xffffffffu;
        break;
    case BAD_LEN_MISMATCH:
        hdr_of(m)->data_len = 2;
        break;
    case BAD_JSON_NO_NUL:
        m->data[VN_FABRIC_FRAME_HDR_SIZE + hdr_of(m)->json_len - 1] = ' ';
        break;
    case BAD_JSON_NUL_INSIDE:
        m->data[VN_FABRIC_FRAME_HDR_SIZE + 3] = '\0';
        break;
    case BAD_JSON_ARRAY:
        frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, id, "[1,2]", NULL, 0);
        break;
    case BAD_JSON_SYNTAX:
        frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, id, "{\"a\":", NULL, 0);
        break;
    case BAD_JSON_UTF8:
        frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, id, (const char *)latin1, NULL, 0);
        break;
    case BAD_JSON_DEEP:
        /* Well-formed, so only the depth bound refuses it (deep enough
         * to overflow a recursive parser's stack without one). */
        deep = g_string_new("{\"a\":");
        for (int i = 0; i < 30000; i++) {
            g_string_append_c(deep, '[');
        }
        for (int i = 0; i < 30000; i++) {
            g_string_append_c(deep, ']');
        }
        g_string_append_c(deep, '}');
        frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, id, deep->str, NULL, 0);
        g_string_free(deep, TRUE);
        break;
    case BAD_REPLY_UNKNOWN_ID:
        frame(m, VN_FABRIC_FLAG_REPLY, T_ECHO, 4242, NULL, NULL, 0);
        break;
    case BAD_RESERVED_TYPE:
        hdr_of(m)->type = VN_FABRIC_TYPE_RESERVED + 0x7f;
        break;
    case BAD_RESERVED_EVENT:
        frame(m, VN_FABRIC_FLAG_EVENT, VN_FABRIC_TYPE_RESERVED, 0, NULL, NULL, 0);
        break;
    case BAD_FLAGS:
        hdr_of(m)->flags |= 0x100;
        break;
    case BAD_NO_KIND:
        hdr_of(m)->flags = VN_FABRIC_FLAG_REQUEST | VN_FABRIC_FLAG_EVENT;
        break;
    case BAD_ERROR_ON_REQUEST:
        hdr_of(m)->flags |= VN_FABRIC_FLAG_ERROR;
        hdr_of(m)->error = EIO;
        break;
    case BAD_RESERVED_FIELD:
        hdr_of(m)->reserved = 1;
        break;
    case BAD_RESERVED0_FIELD:
        hdr_of(m)->reserved0 = 1;
        break;
    case BAD_ID_ZERO:
        hdr_of(m)->id = 0;
        break;
    case BAD_DOORBELL_BIT:
        frame(m, VN_FABRIC_FLAG_EVENT, VN_FABRIC_TYPE_DOORBELL, 1, NULL, &bit, sizeof(bit));
        break;
    case BAD_DOORBELL_JSON:
        bit = 1;
        frame(m, VN_FABRIC_FLAG_EVENT, VN_FABRIC_TYPE_DOORBELL, 1, "{}", &bit, sizeof(bit));
        break;
    case BAD_DOORBELL_REQUEST:
        bit = 1;
        frame(m, VN_FABRIC_FLAG_REQUEST, VN_FABRIC_TYPE_DOORBELL, id, NULL, &bit, sizeof(bit));
        break;
    }
}

START_TEST(test_bad_frame)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autoptr(GByteArray) m = g_byte_array_new();
    VnFabricStats before, after;
    VnFabricFrameHdr h;
    int raw;

    link_nodes(b, a);
    raw = raw_connect("a");
    raw_hello(raw, "evil");
    WAIT_FOR(log_has(a, "up:evil"));
    before = stats_of(a);

    build_bad(_i, m);
    raw_record(raw, m->data, m->len, NULL, 0);

    WAIT_FOR(stats_of(a).bad_messages == before.bad_messages + 1);
    ck_assert_msg(stats_of(a).msgs_received == before.msgs_received, "%s", bad_frames[_i].name);
    if (bad_frames[_i].reply != 0) {
        ck_assert_int_eq(raw_recv(raw, m, 3000), 1);
        memcpy(&h, m->data, sizeof(h));
        ck_assert_uint_eq(h.magic, VN_FABRIC_FRAME_MAGIC);
        ck_assert_uint_eq(h.flags, VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR);
        ck_assert_uint_eq(h.id, 900 + (uint64_t)_i);
        ck_assert_int_eq(h.error, bad_frames[_i].reply);
    }
    raw_echo_ok(raw, 77);
    good_peer_ok(b);

    after = stats_of(a);
    ck_assert_uint_eq(after.bad_messages, before.bad_messages + 1);
    ck_assert_uint_eq(after.msgs_received, before.msgs_received + 2); /* the two echoes */
    ck_assert_uint_eq(after.doorbells_received, 0);
    ck_assert_uint_eq(log_count(a, "req:"), 2);
    ck_assert_uint_eq(log_count(a, "ev:") + log_count(a, "db:"), 0);
    ck_assert_uint_eq(log_count(a, "down:"), 0);
    close(raw);
}
END_TEST

enum {
    HELLO_UPPER,
    HELLO_DASH_FIRST,
    HELLO_EMPTY,
    HELLO_UNTERMINATED,
    HELLO_SELF,
    HELLO_MAGIC,
    HELLO_VERSION,
    HELLO_SHORT,
    HELLO_LONG,
    HELLO_FDS,
    HELLO_LAST
};

static const char *const hello_names[HELLO_LAST] = {
    [HELLO_UPPER] = "a name in capitals", [HELLO_DASH_FIRST] = "a name starting with a dash",
    [HELLO_EMPTY] = "an empty name",      [HELLO_UNTERMINATED] = "a name with no NUL",
    [HELLO_SELF] = "the node's own name", [HELLO_MAGIC] = "bad magic",
    [HELLO_VERSION] = "another version",  [HELLO_SHORT] = "a short HELLO",
    [HELLO_LONG] = "a HELLO of 1 GiB",    [HELLO_FDS] = "a HELLO with an fd",
};

START_TEST(test_bad_hello)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autoptr(GByteArray) m = g_byte_array_new();
    VnShmHello h = { .magic = VN_SHM_HELLO_MAGIC, .version = VN_SHM_HELLO_VERSION };
    VnFabricStats before;
    uint32_t huge = GUINT32_TO_LE(1u << 30);
    int raw, pipefd[2];

    link_nodes(b, a);
    before = stats_of(a);
    ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
    raw = raw_connect("a");
    g_strlcpy(h.node, "evil", sizeof(h.node));
    switch (_i) {
    case HELLO_UPPER:
        g_strlcpy(h.node, "Evil", sizeof(h.node));
        break;
    case HELLO_DASH_FIRST:
        g_strlcpy(h.node, "-evil", sizeof(h.node));
        break;
    case HELLO_EMPTY:
        h.node[0] = '\0';
        break;
    case HELLO_UNTERMINATED:
        memset(h.node, 'e', sizeof(h.node));
        break;
    case HELLO_SELF:
        g_strlcpy(h.node, "a", sizeof(h.node));
        break;
    case HELLO_MAGIC:
        h.magic = 0;
        break;
    case HELLO_VERSION:
        h.version = 9;
        break;
    }
    if (_i == HELLO_SHORT) {
        raw_record(raw, &h, sizeof(h) - 1, NULL, 0);
    } else if (_i == HELLO_LONG) {
        ck_assert_int_eq(send(raw, &huge, sizeof(huge), MSG_NOSIGNAL), 4);
    } else {
        raw_record(raw, &h, sizeof(h), &pipefd[1], _i == HELLO_FDS ? 1 : 0);
    }
    close(pipefd[1]);

    /* Counted, the connection closed, no link for it. */
    WAIT_FOR(stats_of(a).bad_messages == before.bad_messages + 1);
    ck_assert_msg(stats_of(a).bad_messages == before.bad_messages + 1, "%s", hello_names[_i]);
    ck_assert_int_eq(raw_recv(raw, m, 3000), -1);
    WAIT_FOR(pipe_closed(pipefd[0]));
    ck_assert_uint_eq(log_count(a, "up:"), 1);
    ck_assert(!vn_fabric_link_up(a->fab, "evil"));
    good_peer_ok(b);
    close(pipefd[0]);
    close(raw);
}
END_TEST

/* A host that joins a cluster is dialled by every other node in the same instant (their
 * heartbeats are whole-second timers).  Each says HELLO with its connect: all are named and
 * get their link, none is refused as a connection that did not say who it is, and no dial
 * waits on a full backlog. */
#define DIALLERS 40
START_TEST(test_joining_host_dialled_by_many)
{
    Node *a = node_open("a", false);
    int fds[DIALLERS];

    for (int i = 0; i < DIALLERS; i++) {
        g_autofree char *name = g_strdup_printf("p%d", i);

        fds[i] = raw_connect("a"); /* a's loop does not run meanwhile */
        raw_hello(fds[i], name);
    }
    WAIT_FOR(log_count(a, "up:") == DIALLERS);
    for (int i = 0; i < DIALLERS; i++) {
        g_autofree char *name = g_strdup_printf("p%d", i);

        ck_assert_msg(vn_fabric_link_up(a->fab, name), "%s has no link", name);
        close(fds[i]);
    }
}
END_TEST

/* How many of fds[0..n) the node closed. */
static unsigned count_closed(const int *fds, int n)
{
    unsigned closed = 0;

    for (int i = 0; i < n; i++) {
        closed += pipe_closed(fds[i]);
    }
    return closed;
}

/* Connections that never say who they are hold no more than VN_SHM_MAX_UNNAMED places: the
 * rest are closed at once, those held are closed after VN_SHM_HELLO_TIMEOUT_MS, and then a
 * real peer is let in. */
#define SILENT (VN_SHM_MAX_UNNAMED + 8)
START_TEST(test_silent_connections_bounded)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    int fds[SILENT];
    gint64 t0 = now_ms();

    for (int i = 0; i < SILENT; i++) {
        fds[i] = raw_connect("a");
    }
    WAIT_FOR(count_closed(fds, SILENT) == SILENT - VN_SHM_MAX_UNNAMED);
    spin(200);
    ck_assert_uint_eq(count_closed(fds, SILENT), SILENT - VN_SHM_MAX_UNNAMED);
    WAIT_FOR_MS(count_closed(fds, SILENT) == SILENT, VN_SHM_HELLO_TIMEOUT_MS + 3000);
    ck_assert_int_ge(now_ms() - t0, VN_SHM_HELLO_TIMEOUT_MS - 100);
    link_nodes(b, a);
    good_peer_ok(b);
    for (int i = 0; i < SILENT; i++) {
        close(fds[i]);
    }
}
END_TEST

/* A node that does not accept (stopped, stuck) with its backlog full: dialling it fails at
 * once, where a blocking connect held the dialler's loop for VN_SHM_SEND_TIMEOUT_S at each of
 * its heartbeats. */
START_TEST(test_dial_to_stuck_node_does_not_wait)
{
    Node *a = node_open("a", false);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    g_autofree char *path = g_strdup_printf("%s/stuck.sock", tmpdir);
    g_autoptr(GError) error = NULL;
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), queued[8], n = 0;
    gint64 t0;

    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(lfd, 0), 0);
    while (n < (int)G_N_ELEMENTS(queued) && (queued[n] = vn_util_dial_unix(path)) >= 0) {
        n++;
    }
    ck_assert_int_lt(n, (int)G_N_ELEMENTS(queued)); /* the backlog is full */
    t0 = now_ms();
    ck_assert(!vn_fabric_connect(a->fab, "stuck", &error));
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert(!vn_fabric_link_up(a->fab, "stuck"));
    for (int i = 0; i < n; i++) {
        close(queued[i]);
    }
    close(lfd);
    unlink(path);
}
END_TEST

START_TEST(test_reply_from_another_peer)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autoptr(GByteArray) m = g_byte_array_new();
    static Reply r;
    int raw;

    link_nodes(a, b);
    raw = raw_connect("a");
    raw_hello(raw, "evil");
    WAIT_FOR(log_has(a, "up:evil"));
    /* a's first request to b has id 1: evil answers it in b's place. */
    memset(&r, 0, sizeof(r));
    ck_assert_int_eq(vn_fabric_request(a->fab, "b", T_HOLD, NULL, NULL, 0, on_reply, &r), 0);
    frame(m, VN_FABRIC_FLAG_REPLY, T_HOLD, 1, "{\"forged\":true}", NULL, 0);
    raw_record(raw, m->data, m->len, NULL, 0);
    WAIT_FOR(stats_of(a).bad_messages == 1);
    spin(20);
    ck_assert(!r.done);
    node_close(a);
    ck_assert_int_eq(r.err, -ECANCELED);
    reply_clear(&r);
    close(raw);
}
END_TEST

START_TEST(test_stream_faults)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autoptr(GByteArray) m = g_byte_array_new();
    uint32_t huge = GUINT32_TO_LE(VN_FABRIC_MAX_FRAME + 1);
    int raw, quiet;

    link_nodes(b, a);
    raw = raw_connect("a");
    raw_hello(raw, "evil");
    WAIT_FOR(log_has(a, "up:evil"));

    /* Half a frame stalls nobody; the rest completes it later. */
    frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, 5, "{\"half\":true}", "0123456789", 10);
    {
        uint32_t prefix = GUINT32_TO_LE(m->len);

        ck_assert_int_eq(send(raw, &prefix, 4, MSG_NOSIGNAL), 4);
        ck_assert_int_eq(send(raw, m->data, 20, MSG_NOSIGNAL), 20);
        good_peer_ok(b);
        ck_assert_int_eq(send(raw, m->data + 20, m->len - 20, MSG_NOSIGNAL), (ssize_t)m->len - 20);
    }
    ck_assert_int_eq(raw_recv(raw, m, 3000), 1);
    ck_assert_uint_eq(((VnFabricFrameHdr *)m->data)->id, 5);

    /* A second connection under a name that is connected is refused; the
     * first goes on. */
    quiet = raw_connect("a");
    raw_hello(quiet, "evil");
    ck_assert_int_eq(raw_recv(quiet, m, 3000), -1);
    close(quiet);
    ck_assert_uint_eq(log_count(a, "up:evil"), 1);
    raw_echo_ok(raw, 6);

    /* A connection that never says HELLO holds nothing up either. */
    quiet = raw_connect("a");
    good_peer_ok(b);

    /* A record length no frame can have: that link is dropped. */
    ck_assert_int_eq(send(raw, &huge, sizeof(huge), MSG_NOSIGNAL), 4);
    WAIT_FOR(log_has(a, "down:evil"));
    ck_assert_int_eq(raw_recv(raw, m, 3000), -1);
    ck_assert_uint_eq(stats_of(a).bad_messages, 1);
    good_peer_ok(b);
    close(raw);
    close(quiet);
}
END_TEST

/* ---- segment fds ------------------------------------------------------- */

/* Memory no segment may be: it could shrink under a window (SIGBUS in the
 * mapper), or does not hold the size claimed, or is no memory at all. */
enum { SEG_UNSEALED, SEG_FILE, SEG_SHORT, SEG_PIPE, SEG_LAST };

static const char *const seg_names[SEG_LAST] = {
    [SEG_UNSEALED] = "a memfd not sealed against shrinking",
    [SEG_FILE] = "a plain file",
    [SEG_SHORT] = "a sealed memfd smaller than the segment",
    [SEG_PIPE] = "a pipe",
};

#define SEG_SIZE 16384u

static int bad_segment_fd(int kind, int *keep)
{
    g_autofree char *path = g_build_filename(tmpdir, "segment", NULL);
    int fd, p[2];

    *keep = -1;
    switch (kind) {
    case SEG_UNSEALED:
        fd = memfd_create("unsealed", MFD_CLOEXEC);
        ck_assert_int_eq(ftruncate(fd, SEG_SIZE), 0);
        return fd;
    case SEG_FILE:
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        ck_assert_int_eq(ftruncate(fd, SEG_SIZE), 0);
        unlink(path);
        return fd;
    case SEG_SHORT:
        return vn_peerfd_memfd_new("short", SEG_SIZE / 2);
    default:
        ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
        *keep = p[1];
        return p[0];
    }
}

START_TEST(test_export_refuses_bad_fd)
{
    Node *a = node_open("a", false);
    g_autoptr(GError) error = NULL;
    int keep;
    int fd = bad_segment_fd(_i, &keep);

    ck_assert_int_ge(fd, 0);
    ck_assert_msg(vn_fabric_segment_export(a->fab, fd, SEG_SIZE, "b", &error) == 0, "%s exported",
                  seg_names[_i]);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT));
    close(fd);
    if (keep >= 0) {
        close(keep);
    }
}
END_TEST

/* evil's side of a map: a node socket of its own that answers the one
 * FETCH it gets with SEG_SIZE bytes at @offset of @fd. */
typedef struct MapAnswer {
    int listen;
    int fd;
    uint64_t offset;
    bool fetched;
} MapAnswer;

static bool read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);

        if (n <= 0) {
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static int raw_listen(const char *node)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    g_autofree char *path = g_strdup_printf("%s/%s.sock", tmpdir, node);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(fd, 4), 0);
    return fd;
}

static gpointer answer_map(gpointer data)
{
    MapAnswer *ans = data;
    VnShmFetchReply rep = { .magic = VN_SHM_FETCH_MAGIC,
                            .size = GUINT64_TO_LE(SEG_SIZE),
                            .offset = ans->offset };
    VnShmFetch f;
    uint32_t len;
    int c = accept4(ans->listen, NULL, NULL, SOCK_CLOEXEC);

    if (c < 0) {
        return NULL;
    }
    if (read_full(c, &len, sizeof(len)) && GUINT32_FROM_LE(len) == sizeof(f) &&
        read_full(c, &f, sizeof(f)) && f.hello.magic == VN_SHM_FETCH_MAGIC &&
        f.kind == VN_SHM_FETCH_SEGMENT && f.id == 1) {
        ans->fetched = true;
        raw_record(c, &rep, sizeof(rep), &ans->fd, 1);
    }
    close(c);
    return NULL;
}

/* A map answered with @fd at @offset is refused as malformed; evil stays a
 * peer (the error is the map's, not the link's). */
static void map_refused(int fd, uint64_t offset, const char *what)
{
    Node *a = node_open("a", false);
    g_autoptr(GError) error = NULL;
    MapAnswer ans = { .fd = fd, .offset = offset };
    int raw;
    GThread *t;

    ans.listen = raw_listen("evil");
    raw = raw_connect("a");
    raw_hello(raw, "evil");
    WAIT_FOR(log_has(a, "up:evil"));
    t = g_thread_new("evil", answer_map, &ans);

    ck_assert_msg(fw_window_map(a->fab, "evil", 1, &error) == NULL, "%s mapped", what);
    g_thread_join(t);
    ck_assert_msg(ans.fetched, "%s: no fetch came", what);
    ck_assert_msg(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA), "%s: %s", what,
                  error->message);
    ck_assert_uint_eq(vn_fabric_windows_in_use(a->fab), 0);
    ck_assert_uint_eq(stats_of(a).bad_messages, 1);
    raw_echo_ok(raw, 9);
    close(raw);
    close(ans.listen);
}

START_TEST(test_map_refuses_bad_fd)
{
    int keep;
    int fd = bad_segment_fd(_i, &keep);

    ck_assert_int_ge(fd, 0);
    map_refused(fd, 0, seg_names[_i]);
    close(fd);
    if (keep >= 0) {
        close(keep);
    }
}
END_TEST

/* A good memfd, but the segment is said to start where it would run past
 * its end, or at an offset no window translates. */
START_TEST(test_map_refuses_bad_offset)
{
    int fd = vn_peerfd_memfd_new("seg", SEG_SIZE);

    map_refused(fd, SEG_SIZE, "a segment past the memfd's end");
    close(fd);
}
END_TEST

START_TEST(test_map_refuses_unaligned_offset)
{
    int fd = vn_peerfd_memfd_new("seg", 2 * SEG_SIZE);

    map_refused(fd, 100, "a segment at an unaligned offset");
    close(fd);
}
END_TEST

/* Frames carry bytes only: a record with an fd ends the link, and the fd
 * is closed. */
START_TEST(test_frame_with_fd)
{
    Node *a = node_open("a", false);
    Node *b = node_open("b", false);
    g_autoptr(GByteArray) m = g_byte_array_new();
    int raw, pipefd[2];

    link_nodes(b, a);
    raw = raw_connect("a");
    raw_hello(raw, "evil");
    WAIT_FOR(log_has(a, "up:evil"));
    ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
    frame(m, VN_FABRIC_FLAG_REQUEST, T_ECHO, 5, "{}", NULL, 0);
    raw_record(raw, m->data, m->len, &pipefd[1], 1);
    close(pipefd[1]);
    WAIT_FOR(log_has(a, "down:evil"));
    ck_assert_uint_eq(stats_of(a).bad_messages, 1);
    ck_assert_uint_eq(log_count(a, "req:"), 0);
    WAIT_FOR(pipe_closed(pipefd[0]));
    close(pipefd[0]);
    good_peer_ok(b);
    close(raw);
}
END_TEST

/* ---- the ntb backend's ring ---------------------------------------------- */

/* What a raw peer of an ntb node writes into its ring: each row is records (a VnNtbRec and
 * payload bytes) the node must refuse, ending the session, counting it, and starting a new
 * one of its own (a new epoch in our scratchpad). */
typedef enum RingFault {
    RING_KIND_ZERO,
    RING_KIND_UNKNOWN,
    RING_TOO_LONG,      /* longer than a quarter of the ring */
    RING_PAST_PROD,     /* longer than what prod says was written */
    RING_FLAGS,         /* an unknown flag */
    RING_HELLO_SIZE,    /* a HELLO of the wrong size */
    RING_HELLO_OTHER,   /* naming another node than the port's cabling */
    RING_MAP_SIZE,      /* a MAP of the wrong size */
    RING_MAPPED_WINDOW, /* an answer naming window 0 */
    RING_MAPPED_FLAGS,  /* an answer with a flag nobody defined */
    RING_ROUTE_SIZE,    /* a ROUTE of the wrong size */
    RING_ROUTED_BIT,    /* a route's answer naming a doorbell of the backend's own */
    RING_ROUTED_SIZE,   /* a route's answer with a size (a window's answer) */
    RING_UNROUTE_SIZE,  /* an UNROUTE of the wrong size */
    RING_RESUMED_SIZE,  /* a RESUMED of the wrong size */
    RING_PROD_AHEAD,    /* prod more than a ring ahead */
    RING_FRAGMENT_HUGE, /* pieces adding up past the largest frame */
    RING_LAST
} RingFault;

static size_t ring_fault(RingFault f, uint8_t *buf, uint64_t *prod)
{
    VnNtbRec *rec = (VnNtbRec *)buf;
    VnNtbHello hello = { .version = VN_NTB_VERSION, .node = "c" };
    VnNtbMapped mapped = { .seq = 1, .window = 0, .size = 4096 };

    memset(buf, 0, vn_ntb_rec_max(VN_NTB_MIN_RING) + 16);
    *rec = (VnNtbRec){ .len = 8, .kind = VN_NTB_REC_FRAME };
    switch (f) {
    case RING_KIND_ZERO:
        rec->kind = 0;
        break;
    case RING_KIND_UNKNOWN:
        rec->kind = VN_NTB_REC_LAST;
        break;
    case RING_TOO_LONG:
        rec->len = vn_ntb_rec_max(VN_NTB_MIN_RING) + 8;
        *prod = sizeof(*rec) + rec->len;
        return 0;
    case RING_PAST_PROD:
        rec->len = 64;
        *prod = 32;
        return 0;
    case RING_FLAGS:
        rec->flags = 0x80;
        break;
    case RING_HELLO_SIZE:
        *rec = (VnNtbRec){ .len = 8, .kind = VN_NTB_REC_HELLO };
        break;
    case RING_HELLO_OTHER:
        *rec = (VnNtbRec){ .len = sizeof(hello), .kind = VN_NTB_REC_HELLO };
        memcpy(rec + 1, &hello, sizeof(hello));
        *prod = sizeof(*rec) + ((sizeof(hello) + 7) & ~7u);
        return 0;
    case RING_MAP_SIZE:
        *rec = (VnNtbRec){ .len = 8, .kind = VN_NTB_REC_MAP };
        break;
    case RING_ROUTE_SIZE:
        *rec = (VnNtbRec){ .len = 8, .kind = VN_NTB_REC_ROUTE };
        break;
    case RING_UNROUTE_SIZE:
        *rec = (VnNtbRec){ .len = 8, .kind = VN_NTB_REC_UNROUTE };
        break;
    case RING_RESUMED_SIZE:
        *rec = (VnNtbRec){ .len = 16, .kind = VN_NTB_REC_RESUMED };
        break;
    case RING_ROUTED_SIZE:
        mapped.window = VN_NTB_DB_FIRST_ROUTE;
        /* fall through */
    case RING_ROUTED_BIT:
        mapped.window = mapped.window != 0 ? mapped.window : VN_NTB_DB_CTRL;
        *rec = (VnNtbRec){ .len = sizeof(mapped), .kind = VN_NTB_REC_ROUTED };
        memcpy(rec + 1, &mapped, sizeof(mapped));
        *prod = sizeof(*rec) + sizeof(mapped);
        return 0;
    case RING_MAPPED_FLAGS:
        mapped.window = 1;
        mapped.flags = 0x80;
        /* fall through */
    case RING_MAPPED_WINDOW:
        *rec = (VnNtbRec){ .len = sizeof(mapped), .kind = VN_NTB_REC_MAPPED };
        memcpy(rec + 1, &mapped, sizeof(mapped));
        *prod = sizeof(*rec) + sizeof(mapped);
        return 0;
    case RING_PROD_AHEAD:
        *prod = VN_NTB_MIN_RING + 8;
        return 0;
    case RING_FRAGMENT_HUGE: {
        uint32_t piece = vn_ntb_rec_max(VN_NTB_MIN_RING) & ~7u;

        /* More pieces than the ring holds: written as it drains (see below). */
        rec->len = piece;
        rec->flags = VN_NTB_REC_MORE;
        *prod = sizeof(*rec) + piece;
        return (VN_FABRIC_MAX_FRAME / piece) + 2;
    }
    default:
        break;
    }
    *prod = sizeof(*rec) + 8;
    return 0;
}

/* A raw peer's HELLO naming "a" at the start of b's ring (@ring: the window onto it),
 * published under @tag; the ring's index after it. */
static uint64_t ring_hello(uint8_t *ring, uint16_t tag)
{
    VnNtbHello h = { .version = VN_NTB_VERSION, .features = VN_NTB_FEATURE_RESUME, .node = "a" };
    uint8_t rec[sizeof(VnNtbRec) + ((sizeof(h) + 7) & ~7u)] = { 0 };

    *(VnNtbRec *)rec = (VnNtbRec){ .len = sizeof(h), .kind = VN_NTB_REC_HELLO };
    memcpy(rec + sizeof(VnNtbRec), &h, sizeof(h));
    vn_ntb_ring_put(ring + VN_NTB_RING_DATA, VN_NTB_MIN_RING, 0, rec, sizeof(rec));
    __atomic_store_n((uint64_t *)ring, (uint64_t)tag << 48 | sizeof(rec), __ATOMIC_RELEASE);
    return sizeof(rec);
}

/* A raw peer of node b on an ntb pair port, in a session with it as ntb.h says (a buffer, an
 * epoch, announced; b's window mapped; its HELLO naming "a" sent): b's link to "a" is up. */
typedef struct RawPeer {
    VnNtbPort *port;
    uint8_t *mine;   /* our ring buffer, which b writes */
    uint8_t *theirs; /* b's, through our window 0 */
    uint64_t bytes;
    uint16_t tag;
    uint32_t hello; /* b's announcement */
    uint64_t prod;  /* what we wrote into b's ring */
    Node *b;
} RawPeer;

/* b's parameters: its port to us, the smallest ring, and keep-ms. */
static const char **raw_peer_kv(void)
{
    static char port[512];
    static const char *kv[] = { "ports",   port,    "ring-size", "65536", /* VN_NTB_MIN_RING */
                                "keep-ms", "60000", NULL };

    g_snprintf(port, sizeof(port), "pair:%s/raw/1=a", tmpdir);
    return kv;
}

static void raw_peer_open(RawPeer *r)
{
    g_autofree char *spec = g_strdup_printf("pair:%s/raw/0", tmpdir);
    const char **kv = raw_peer_kv();
    uint64_t offset = 0, size = 0;
    int fd;

    *r = (RawPeer){ .bytes = VN_NTB_RING_DATA + VN_NTB_MIN_RING };
    r->port = vn_ntbport_open(spec, NULL);
    ck_assert_ptr_nonnull(r->port);
    ck_assert_int_eq(r->port->ops->in_alloc(r->port, 0, r->bytes, &r->mine), 0);
    ck_assert_int_eq(
        r->port->ops->peer_spad_write(r->port, VN_NTB_SPAD_PAGES, (uint32_t)(r->bytes / 4096)), 0);
    ck_assert_int_eq(
        r->port->ops->peer_spad_write(r->port, VN_NTB_SPAD_HELLO, VN_NTB_SPAD_MAGIC << 16 | 0x77),
        0);
    r->b = node_open_kv("b", false, kv);
    WAIT_FOR(r->port->ops->spad_read(r->port, VN_NTB_SPAD_HELLO, &r->hello) == 0 &&
             r->hello >> 16 == VN_NTB_SPAD_MAGIC);
    r->tag = vn_ntb_tag(0x77, (uint16_t)r->hello);
    fd = r->port->ops->out_fd(r->port, 0, true, &offset, &size);
    ck_assert_int_ge(fd, 0);
    r->theirs = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    close(fd);
    ck_assert(r->theirs != MAP_FAILED);
    /* Its HELLO first, as a node's session starts: b's link is up once it comes. */
    r->prod = ring_hello(r->theirs, r->tag);
    r->port->ops->peer_doorbell(r->port, UINT64_C(1) << VN_NTB_DB_MSG);
    WAIT_FOR(log_has(r->b, "up:a"));
}

static void raw_peer_close(RawPeer *r)
{
    munmap(r->theirs, r->bytes);
    vn_ntbport_close(r->port);
}

/* One record of ours into b's ring, published and rung. */
static void raw_peer_send(RawPeer *r, uint16_t kind, const void *payload, uint32_t len)
{
    uint8_t rec[sizeof(VnNtbRec) + 64] = { 0 };
    uint32_t padded = (len + 7) & ~7u;

    ck_assert_uint_le(padded, 64);
    *(VnNtbRec *)rec = (VnNtbRec){ .len = len, .kind = kind };
    memcpy(rec + sizeof(VnNtbRec), payload, len);
    vn_ntb_ring_put(r->theirs + VN_NTB_RING_DATA, VN_NTB_MIN_RING, r->prod, rec,
                    sizeof(VnNtbRec) + padded);
    r->prod += sizeof(VnNtbRec) + padded;
    __atomic_store_n((uint64_t *)r->theirs, (uint64_t)r->tag << 48 | r->prod, __ATOMIC_RELEASE);
    r->port->ops->peer_doorbell(r->port, UINT64_C(1) << VN_NTB_DB_MSG);
}

START_TEST(test_ntb_bad_ring)
{
    const size_t piece_size = vn_ntb_rec_max(VN_NTB_MIN_RING) + 16;
    uint8_t *piece = g_malloc0(piece_size);
    uint64_t prod = 0, base;
    uint32_t again = 0;
    size_t repeat;
    RawPeer r;

    raw_peer_open(&r);
    base = r.prod;
    repeat = ring_fault(_i, piece, &prod);
    prod += base;
    vn_ntb_ring_put(r.theirs + VN_NTB_RING_DATA, VN_NTB_MIN_RING, base, piece,
                    MIN(prod - base, (uint64_t)piece_size));
    __atomic_store_n((uint64_t *)r.theirs, (uint64_t)r.tag << 48 | prod, __ATOMIC_RELEASE);
    r.port->ops->peer_doorbell(r.port, UINT64_C(1) << VN_NTB_DB_MSG);
    for (size_t i = 1; i < repeat && !log_has(r.b, "down:a"); i++) {
        /* Each piece once b took the last (it says so in our buffer's cons). */
        uint64_t want = (uint64_t)r.tag << 48 | prod;

        WAIT_FOR(__atomic_load_n(&((VnNtbRingHdr *)r.mine)->cons, __ATOMIC_ACQUIRE) == want ||
                 log_has(r.b, "down:a"));
        vn_ntb_ring_put(r.theirs + VN_NTB_RING_DATA, VN_NTB_MIN_RING, prod, piece,
                        sizeof(VnNtbRec) + ((VnNtbRec *)piece)->len);
        prod += sizeof(VnNtbRec) + ((VnNtbRec *)piece)->len;
        __atomic_store_n((uint64_t *)r.theirs, (uint64_t)r.tag << 48 | prod, __ATOMIC_RELEASE);
        r.port->ops->peer_doorbell(r.port, UINT64_C(1) << VN_NTB_DB_MSG);
    }
    WAIT_FOR(log_has(r.b, "down:a"));
    ck_assert_uint_eq(stats_of(r.b).bad_messages, 1);
    ck_assert_uint_eq(stats_of(r.b).msgs_received, 0);
    /* b started over: a new epoch of its own in our scratchpad. */
    WAIT_FOR(r.port->ops->spad_read(r.port, VN_NTB_SPAD_HELLO, &again) == 0 && again != r.hello);
    raw_peer_close(&r);
    g_free(piece);
}
END_TEST

/* A peer that writes into the words of b's own buffer that b's next daemon resumes from, while
 * b is away: another session's tag (_i 0), or this session's with a read position far past
 * what the peer wrote (_i 1).  The first is not taken over, the second breaks the session at
 * its first read; either way b starts a new session (a new epoch in our scratchpad), and
 * nothing of b's reads outside its ring. */
START_TEST(test_ntb_forged_resume_words)
{
    VnNtbResumeWords *w;
    uint32_t again = 0;
    RawPeer r;

    raw_peer_open(&r);
    node_close(r.b); /* kept: the port keeps its session */
    w = (VnNtbResumeWords *)(r.theirs + VN_NTB_RESUME_OFFSET);
    w->rx_cons = _i == 0 ? (uint64_t)(uint16_t)(r.tag + 1) << 48
                         : (uint64_t)r.tag << 48 | (r.prod + 3 * VN_NTB_MIN_RING);
    r.b = node_open_kv("b", false, raw_peer_kv());
    WAIT_FOR(r.port->ops->spad_read(r.port, VN_NTB_SPAD_HELLO, &again) == 0 && again != r.hello);
    if (_i == 1) {
        WAIT_FOR(log_has(r.b, "down:a"));
        ck_assert_uint_eq(stats_of(r.b).bad_messages, 1);
    } else {
        ck_assert(!log_has(r.b, "up:a"));
    }
    raw_peer_close(&r);
}
END_TEST

/* A lender that keeps ringing a route's doorbell once the borrower withdrew the route (its
 * attachment ended) reaches nothing: b's bit no longer signals the VM's eventfd.  A bit b
 * never routed reaches nothing either. */
START_TEST(test_ntb_withdrawn_route_rings_nothing)
{
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    const uint64_t bit = UINT64_C(1) << VN_NTB_DB_FIRST_ROUTE; /* b's lowest: the first route's */
    VnNtbMap ask = { .seq = 1 };
    uint64_t n;
    RawPeer r;

    raw_peer_open(&r);
    ask.id = vn_fabric_route_export(r.b->fab, efd, "a", NULL);
    ck_assert_uint_ne(ask.id, 0);
    raw_peer_send(&r, VN_NTB_REC_ROUTE, &ask, sizeof(ask));
    /* Routed once b took the ROUTE: its bit signals the VM's eventfd. */
    WAIT_FOR((r.port->ops->peer_doorbell(r.port, bit), read(efd, &n, sizeof(n)) == sizeof(n)));
    r.port->ops->peer_doorbell(r.port, bit << 1);
    spin(100);
    ck_assert_int_lt(read(efd, &n, sizeof(n)), 0);

    vn_fabric_route_unexport(r.b->fab, ask.id);
    for (int i = 0; i < 10; i++) {
        r.port->ops->peer_doorbell(r.port, bit);
    }
    spin(100);
    ck_assert_int_lt(read(efd, &n, sizeof(n)), 0);
    ck_assert_uint_eq(stats_of(r.b).bad_messages, 0);
    raw_peer_close(&r);
    close(efd);
}
END_TEST

static Suite *fabric_untrusted_suite(void)
{
    Suite *s = suite_create("fabric-untrusted");
    TCase *tc;

    tc = tcase_create("params");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_open_refused, 0, G_N_ELEMENTS(open_bad));
    tcase_add_test(tc, test_open_dir_and_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("frames");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_bad_frame, 0, BAD_LAST);
    tcase_add_test(tc, test_reply_from_another_peer);
    suite_add_tcase(s, tc);

    tc = tcase_create("handshake");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_bad_hello, 0, HELLO_LAST);
    tcase_add_test(tc, test_joining_host_dialled_by_many);
    tcase_add_test(tc, test_silent_connections_bounded);
    tcase_add_test(tc, test_dial_to_stuck_node_does_not_wait);
    tcase_set_timeout(tc, 20);
    suite_add_tcase(s, tc);

    tc = tcase_create("stream");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_stream_faults);
    suite_add_tcase(s, tc);

    tc = tcase_create("segment-fds");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_export_refuses_bad_fd, 0, SEG_LAST);
    tcase_add_loop_test(tc, test_map_refuses_bad_fd, 0, SEG_LAST);
    tcase_add_test(tc, test_map_refuses_bad_offset);
    tcase_add_test(tc, test_map_refuses_unaligned_offset);
    tcase_add_test(tc, test_frame_with_fd);
    suite_add_tcase(s, tc);

    tc = tcase_create("ntb-ring");
    tcase_add_checked_fixture(tc, setup_ntb, teardown);
    tcase_add_loop_test(tc, test_ntb_bad_ring, 0, RING_LAST);
    tcase_add_test(tc, test_ntb_withdrawn_route_rings_nothing);
    tcase_add_loop_test(tc, test_ntb_forged_resume_words, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(fabric_untrusted_suite());
}
