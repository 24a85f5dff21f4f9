/*
 * Fabric messages (see fabric.h): requests with ids, replies by token,
 * events and doorbells.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "fabric-int.h"

#include "common/json.h"
#include "common/name.h"
#include "common/util.h"
#include "trace-fabric.h"

#include <errno.h>
#include <inttypes.h>
#include <json-glib/json-glib.h>
#include <string.h>

/* Past this the send buffer is dropped after use rather than kept: one
 * large region access must not pin a megabyte per node. */
#define VN_FABRIC_OUT_KEEP (64u * 1024u)

/* An owned message: the view, then the sender's name and the payload. */
typedef struct VnFabricMsgOwned {
    VnFabricMsg msg;
    char peer[VN_MAX_NODE_NAME + 1];
    uint8_t payload[];
} VnFabricMsgOwned;

VnFabricMsg *vn_fabric_msg_copy(const char *peer, const VnFabricFrame *f)
{
    /* Both lengths were bounded by VN_FABRIC_MAX_PAYLOAD in the decoder. */
    size_t n = (size_t)f->hdr.json_len + f->hdr.data_len;
    VnFabricMsgOwned *o = g_malloc0(sizeof(*o) + n);

    vn_fabric_msg_view(&o->msg, o->peer, f);
    g_strlcpy(o->peer, peer, sizeof(o->peer));
    if (f->json != NULL) {
        memcpy(o->payload, f->json, f->hdr.json_len);
        o->msg.json = (const char *)o->payload;
    }
    if (f->data != NULL) {
        memcpy(o->payload + f->hdr.json_len, f->data, f->hdr.data_len);
        o->msg.data = o->payload + f->hdr.json_len;
    }
    return &o->msg;
}

VnFabricMsg *vn_fabric_msg_dup(const VnFabricMsg *msg)
{
    size_t json_len = msg->json != NULL ? strlen(msg->json) + 1 : 0;
    VnFabricMsgOwned *o = g_malloc0(sizeof(*o) + json_len + msg->data_len);

    o->msg = *msg;
    g_strlcpy(o->peer, msg->peer, sizeof(o->peer));
    o->msg.peer = o->peer;
    if (msg->json != NULL) {
        memcpy(o->payload, msg->json, json_len);
        o->msg.json = (const char *)o->payload;
    }
    if (msg->data_len > 0) {
        memcpy(o->payload + json_len, msg->data, msg->data_len);
        o->msg.data = o->payload + json_len;
    }
    return &o->msg;
}

void vn_fabric_msg_free(VnFabricMsg *msg)
{
    g_free((VnFabricMsgOwned *)msg);
}

void vn_fabric_msg_view(VnFabricMsg *msg, const char *peer, const VnFabricFrame *f)
{
    memset(msg, 0, sizeof(*msg));
    msg->peer = peer;
    msg->type = f->hdr.type;
    msg->json = f->json;
    msg->data = f->data;
    msg->data_len = f->hdr.data_len;
}

void vn_fabric_bad_frame(VnFabric *fab, const char *peer, const VnFabricFrame *f, int err,
                         const char *why)
{
    g_autofree char *message = g_strdup_printf("%s: %s", why, g_strerror(-err));

    fab->stats.bad_messages++;
    g_info("node %s: bad frame from %s (%s id %" PRIu64 " type 0x%x): %s", fab->node, peer,
           vn_fabric_kind_to_string(f->hdr.flags), f->hdr.id, f->hdr.type, message);
    if (vn_fabric_frame_replyable(f)) {
        vn_fabric_send_error(fab, peer, f->hdr.id, f->hdr.type, err, message);
    }
}

/* ---- sending ---------------------------------------------------------- */

int vn_fabric_send_frame(VnFabric *fab, const char *peer, uint16_t flags, uint32_t type,
                         uint64_t id, int32_t error, const char *json, const void *data, size_t len)
{
    int ret;

    if (fab->backend == NULL) {
        return -ESHUTDOWN;
    }
    ret = vn_fabric_frame_encode(fab->out, flags, type, id, error, json, data, len);
    if (ret == 0) {
        fab->defer++;
        ret = fab->ops->send(fab->backend, peer, fab->out->data, fab->out->len);
        fab->defer--;
    }
    trace_fabric_send(fab->node, peer, vn_fabric_kind_to_string(flags), id, type,
                      vn_fabric_type_to_string(type), len, ret);
    if (fab->out->len > VN_FABRIC_OUT_KEEP) {
        g_byte_array_unref(fab->out);
        fab->out = g_byte_array_new();
    }
    if (ret < 0) {
        return ret;
    }
    if (type == VN_FABRIC_TYPE_DOORBELL && (flags & VN_FABRIC_FLAG_EVENT)) {
        fab->stats.doorbells_sent++;
    } else {
        fab->stats.msgs_sent++;
    }
    return 0;
}

int vn_fabric_send_error(VnFabric *fab, const char *peer, uint64_t id, uint32_t type, int err,
                         const char *message)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonGenerator) gen = json_generator_new();
    g_autoptr(JsonNode) root = NULL;
    g_autofree char *text = NULL;
    g_autofree char *json = NULL;
    int e = err < 0 ? -err : err;

    if (e <= 0 || e > VN_FABRIC_MAX_ERRNO) {
        e = EIO;
    }
    /* The peer checks our JSON as we check its: it must be valid UTF-8. */
    text = g_utf8_make_valid(message != NULL ? message : g_strerror(e), -1);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "error");
    json_builder_add_string_value(b, text);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    json_generator_set_root(gen, root);
    json = json_generator_to_data(gen, NULL);
    return vn_fabric_send_frame(fab, peer, VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR, type, id, e,
                                json, NULL, 0);
}

/* ---- requests we send ------------------------------------------------- */

static void pending_free(VnFabricPending *pend)
{
    if (pend->timeout != NULL) {
        g_source_destroy(pend->timeout);
        g_source_unref(pend->timeout);
    }
    g_free(pend->peer);
    g_free(pend->json);
    g_free(pend->data);
    g_free(pend);
}

/* The link @pend was asked on, while it is up. */
static VnFabricPeer *pending_link(VnFabric *fab, const VnFabricPending *pend)
{
    VnFabricPeer *p = vn_fabric_peer(fab, pend->peer);

    return p != NULL && p->gen == pend->gen ? p : NULL;
}

/* What a held request holds of its link's VN_FABRIC_MAX_HELD_BYTES. */
static size_t held_size(const VnFabricPending *pend)
{
    return pend->len + (pend->json != NULL ? strlen(pend->json) : 0);
}

/* @pend leaves @p's held requests without being sent (answered, timed out, cancelled). */
static void held_unlink(VnFabricPeer *p, VnFabricPending *pend)
{
    g_queue_remove(&p->held, pend);
    p->held_bytes -= held_size(pend);
}

static void pending_send(VnFabric *fab, VnFabricPeer *p, VnFabricPending *pend, const char *json,
                         const void *data, size_t len, int *err)
{
    *err = vn_fabric_send_frame(fab, p->name, VN_FABRIC_FLAG_REQUEST, pend->type, pend->id, 0, json,
                                data, len);
    if (*err == 0) {
        p->asked++;
        pend->sent = true;
    }
}

static void pending_complete(VnFabric *fab, VnFabricPending *pend, VnFabricMsg *reply, int err);

/* @p answered one of ours: the oldest it held back go, as many as it takes now.  False when
 * one could not be sent (and was failed): @p may be gone then. */
static bool held_release(VnFabric *fab, VnFabricPeer *p)
{
    VnFabricPending *pend;
    int err;

    while (p->asked < fab->max_asked && (pend = g_queue_pop_head(&p->held)) != NULL) {
        p->held_bytes -= held_size(pend);
        pend->held = false;
        pending_send(fab, p, pend, pend->json, pend->data, pend->len, &err);
        g_clear_pointer(&pend->json, g_free);
        g_clear_pointer(&pend->data, g_free);
        if (err < 0) {
            pending_complete(fab, pend, NULL, err);
            return false;
        }
    }
    return true;
}

/* Take @pend out of the table (and out of its link's count or queue), call its callback
 * once, free it. */
static void pending_complete(VnFabric *fab, VnFabricPending *pend, VnFabricMsg *reply, int err)
{
    VnFabricPeer *p = pending_link(fab, pend);

    g_hash_table_remove(fab->pending, &pend->id);
    if (p != NULL && pend->held) {
        held_unlink(p, pend);
    } else if (p != NULL && pend->sent) {
        p->asked--;
        /* Before the callback: what it asks goes behind those that waited. */
        held_release(fab, p);
    }
    trace_fabric_request_done(fab->node, pend->id, pend->peer, err);
    pend->done(pend->opaque, reply, err);
    pending_free(pend);
}

static gboolean pending_timeout(gpointer data)
{
    VnFabricPending *pend = data;

    g_info("node %s: request id %" PRIu64 " type 0x%x to %s timed out%s", pend->fab->node, pend->id,
           pend->type, pend->peer, pend->held ? " (held back: never sent)" : "");
    /* The source is being dispatched and goes when we return REMOVE. */
    g_clear_pointer(&pend->timeout, g_source_unref);
    pending_complete(pend->fab, pend, NULL, -ETIMEDOUT);
    return G_SOURCE_REMOVE;
}

int vn_fabric_request(VnFabric *fab, const char *peer, uint32_t type, const char *json,
                      const void *data, size_t len, VnFabricReplyFn done, void *opaque)
{
    VnFabricPeer *p;
    VnFabricPending *pend;
    size_t bytes = len + (json != NULL ? strlen(json) : 0);
    bool hold;
    int ret;

    if (type >= VN_FABRIC_TYPE_RESERVED || done == NULL || peer == NULL) {
        return -EINVAL;
    }
    if (fab->backend == NULL) {
        return -ESHUTDOWN;
    }
    p = vn_fabric_peer(fab, peer);
    if (p == NULL) {
        return -ENOTCONN;
    }
    /* The peer refuses what is past the number it takes: the rest wait here, in order. */
    hold = p->asked >= fab->max_asked || p->held.length > 0;
    if (hold && (p->held.length >= VN_FABRIC_MAX_HELD || len > VN_FABRIC_MAX_PAYLOAD ||
                 bytes > VN_FABRIC_MAX_HELD_BYTES - p->held_bytes)) {
        return -EBUSY;
    }
    pend = g_new0(VnFabricPending, 1);
    pend->id = ++fab->last_id;
    pend->fab = fab;
    pend->peer = g_strdup(peer);
    pend->gen = p->gen;
    pend->type = type;
    pend->done = done;
    pend->opaque = opaque;
    if (hold) {
        pend->held = true;
        pend->json = g_strdup(json);
        pend->data = len > 0 ? g_memdup2(data, len) : NULL;
        pend->len = len;
        p->held_bytes += bytes;
        g_queue_push_tail(&p->held, pend);
        fab->stats.requests_held++;
        trace_fabric_request_held(fab->node, pend->id, peer, p->asked, p->held.length);
    } else {
        pending_send(fab, p, pend, json, data, len, &ret);
        if (ret < 0) {
            pending_free(pend);
            return ret;
        }
    }
    /* No reply can be handled before we return: nothing runs the loop. */
    pend->timeout = g_timeout_source_new((guint)fab->request_timeout_ms);
    g_source_set_callback(pend->timeout, pending_timeout, pend, NULL);
    g_source_attach(pend->timeout, fab->ctx);
    g_hash_table_insert(fab->pending, &pend->id, pend);
    return 0;
}

void vn_fabric_reply_received(VnFabric *fab, const char *peer, uint64_t gen, const VnFabricFrame *f)
{
    VnFabricPending *pend = g_hash_table_lookup(fab->pending, &f->hdr.id);
    VnFabricMsg msg;
    int err;

    /* Only an answer to what we asked this very link counts; a late reply
     * (after its timeout) is as unknown as a forged one. */
    if (pend == NULL || pend->gen != gen || strcmp(pend->peer, peer) != 0) {
        vn_fabric_bad_frame(fab, peer, f, -ENOENT, "reply to no request of ours");
        return;
    }
    fab->stats.msgs_received++;
    err = (f->hdr.flags & VN_FABRIC_FLAG_ERROR) ? -f->hdr.error : 0;
    vn_fabric_msg_view(&msg, peer, f);
    pending_complete(fab, pend, &msg, err);
}

char *vn_fabric_error_message(const VnFabricMsg *reply)
{
    g_autoptr(JsonObject) o = NULL;

    if (reply == NULL || reply->json == NULL) {
        return NULL;
    }
    o = vn_json_parse_object(reply->json, -1, VN_FABRIC_MAX_PAYLOAD, NULL);
    return g_strdup(vn_util_json_string(o, "error"));
}

/* ---- requests we answer ----------------------------------------------- */

static void token_free(gpointer data)
{
    VnFabricToken *tok = data;

    g_free(tok->peer);
    g_free(tok);
}

void vn_fabric_request_received(VnFabric *fab, const char *peer, uint64_t gen,
                                const VnFabricFrame *f)
{
    VnFabricPeer *p = vn_fabric_peer(fab, peer);
    VnFabricToken *tok;
    VnFabricMsg msg;

    if (p == NULL || p->gen != gen) {
        /* Queued before its link went: no answer could reach the asker. */
        trace_fabric_request_stale(fab->node, f->hdr.id, peer);
        return;
    }
    fab->stats.msgs_received++;
    if (fab->handlers.on_request == NULL || p->inflight >= VN_FABRIC_MAX_INFLIGHT) {
        int err = fab->handlers.on_request == NULL ? -ENOTSUP : -EBUSY;

        vn_fabric_send_error(fab, peer, f->hdr.id, f->hdr.type, err, NULL);
        return;
    }
    tok = g_new0(VnFabricToken, 1);
    tok->token = ++fab->last_token;
    tok->peer = g_strdup(peer);
    tok->gen = gen;
    tok->id = f->hdr.id;
    tok->type = f->hdr.type;
    g_hash_table_insert(fab->tokens, &tok->token, tok);
    p->inflight++;
    vn_fabric_msg_view(&msg, peer, f);
    /* The handler may answer in here and free @tok. */
    fab->handlers.on_request(fab->opaque, &msg, tok->token);
}

/* Take the token out; NULL with *err when it is unknown or its link gone. */
static VnFabricToken *token_take(VnFabric *fab, uint64_t token, int *err)
{
    VnFabricToken *tok = g_hash_table_lookup(fab->tokens, &token);
    VnFabricPeer *p;

    if (tok == NULL) {
        *err = -ENOENT;
        return NULL;
    }
    g_hash_table_steal(fab->tokens, &token);
    p = vn_fabric_peer(fab, tok->peer);
    if (p == NULL || p->gen != tok->gen) {
        token_free(tok);
        *err = -ENOTCONN;
        return NULL;
    }
    p->inflight--;
    return tok;
}

int vn_fabric_reply(VnFabric *fab, uint64_t token, const char *json, const void *data, size_t len)
{
    VnFabricToken *tok;
    int ret;

    if (fab->backend == NULL) {
        return -ESHUTDOWN;
    }
    tok = token_take(fab, token, &ret);
    if (tok == NULL) {
        return ret;
    }
    ret = vn_fabric_send_frame(fab, tok->peer, VN_FABRIC_FLAG_REPLY, tok->type, tok->id, 0, json,
                               data, len);
    if (ret == -EMSGSIZE || ret == -EINVAL) {
        /* The asker still gets its one answer rather than a timeout. */
        vn_fabric_send_error(fab, tok->peer, tok->id, tok->type, ret, "reply not sendable");
    }
    token_free(tok);
    return ret;
}

int vn_fabric_reply_error(VnFabric *fab, uint64_t token, int err, const char *message)
{
    VnFabricToken *tok;
    int ret;

    if (fab->backend == NULL) {
        return -ESHUTDOWN;
    }
    tok = token_take(fab, token, &ret);
    if (tok == NULL) {
        return ret;
    }
    /* Either sign is taken: -EPERM and EPERM both answer EPERM. */
    ret = vn_fabric_send_error(fab, tok->peer, tok->id, tok->type, err, message);
    token_free(tok);
    return ret;
}

int vn_fabric_reply_errorf(VnFabric *fab, uint64_t token, int err, const char *fmt, ...)
{
    g_autofree char *message = NULL;
    va_list ap;

    va_start(ap, fmt);
    message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    return vn_fabric_reply_error(fab, token, err, message);
}

/* ---- events and doorbells --------------------------------------------- */

int vn_fabric_event(VnFabric *fab, const char *peer, uint32_t type, const char *json,
                    const void *data, size_t len)
{
    if (type >= VN_FABRIC_TYPE_RESERVED || peer == NULL) {
        return -EINVAL;
    }
    if (fab->backend == NULL) {
        return -ESHUTDOWN;
    }
    if (vn_fabric_peer(fab, peer) == NULL) {
        return -ENOTCONN;
    }
    /* Events get an id too: it names them in traces on both sides. */
    return vn_fabric_send_frame(fab, peer, VN_FABRIC_FLAG_EVENT, type, ++fab->last_id, 0, json,
                                data, len);
}

int vn_fabric_doorbell(VnFabric *fab, const char *peer, uint32_t bit)
{
    uint32_t le = GUINT32_TO_LE(bit);

    if (bit >= VN_FABRIC_MAX_DOORBELLS || peer == NULL) {
        return -EINVAL;
    }
    if (fab->backend == NULL) {
        return -ESHUTDOWN;
    }
    if (vn_fabric_peer(fab, peer) == NULL) {
        return -ENOTCONN;
    }
    return vn_fabric_send_frame(fab, peer, VN_FABRIC_FLAG_EVENT, VN_FABRIC_TYPE_DOORBELL,
                                ++fab->last_id, 0, NULL, &le, sizeof(le));
}

/* A mask of @count bits from @first (count <= 64, first + count <= 64). */
static uint64_t doorbell_mask(uint32_t first, uint32_t count)
{
    return (count >= 64 ? ~UINT64_C(0) : ((UINT64_C(1) << count) - 1)) << first;
}

int vn_fabric_doorbells_alloc(VnFabric *fab, uint32_t count, GError **error)
{
    uint32_t n = fab->limits.doorbells;

    if (vn_fabric_waits_refused(fab, fab->ops->doorbells_alloc_async != NULL, "doorbell bits",
                                error)) {
        return -EOPNOTSUPP;
    }
    if (count == 0 || count > n) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: %u doorbell bits asked for; the host has %u", fab->node, count, n);
        return -EINVAL;
    }
    for (uint32_t first = 0; first + count <= n; first++) {
        uint64_t m = doorbell_mask(first, count);

        if ((fab->doorbells_taken & m) == 0) {
            fab->doorbells_taken |= m;
            trace_fabric_doorbells_taken(fab->node, first, first + count - 1);
            return (int)first;
        }
    }
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                "node %s: no %u free doorbell bits in a row (the host has %u, %u in use)",
                fab->node, count, n, (uint32_t)__builtin_popcountll(fab->doorbells_taken));
    return -ENOSPC;
}

/* Bits asked of the backend. */
typedef struct VnFabricBits {
    VnFabric *fab;
    uint32_t count;
    VnFabricBitsFn done;
    void *opaque;
} VnFabricBits;

static void bits_answered(void *opaque, int status, uint64_t value, int fd)
{
    VnFabricBits *b = opaque;
    g_autoptr(GError) error = NULL;

    vn_util_close_fd(&fd);
    /* The first bit, as the daemon says: inside the register, or a protocol error. */
    if (status == 0 &&
        (value >= VN_FABRIC_MAX_DOORBELLS || b->count > VN_FABRIC_MAX_DOORBELLS - value)) {
        status = -EPROTO;
    }
    if (status < 0) {
        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-status),
                    "node %s: the host has no %u doorbell bits free%s", b->fab->node, b->count,
                    status == -ENOSPC ? "" : " (the daemon did not answer)");
    }
    b->done(b->opaque, status < 0 ? status : (int)value, error);
    g_free(b);
}

void vn_fabric_doorbells_alloc_async(VnFabric *fab, uint32_t count, VnFabricBitsFn done,
                                     void *opaque)
{
    g_autoptr(GError) error = NULL;
    VnFabricBits *b;
    int first;

    if (fab->ops->doorbells_alloc_async == NULL || fab->backend == NULL ||
        count > VN_FABRIC_MAX_DOORBELLS || count == 0) {
        first = fab->ops->doorbells_alloc_async == NULL
                    ? vn_fabric_doorbells_alloc(fab, count, &error)
                    : -EINVAL;
        if (first == -EINVAL && error == NULL) {
            g_set_error(&error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "node %s: %u doorbell bits asked for%s", fab->node, count,
                        fab->backend == NULL ? " while closing" : "");
        }
        done(opaque, first, error);
        return;
    }
    b = g_new0(VnFabricBits, 1);
    *b = (VnFabricBits){ .fab = fab, .count = count, .done = done, .opaque = opaque };
    fab->ops->doorbells_alloc_async(fab->backend, count, bits_answered, b);
}

void vn_fabric_doorbells_free(VnFabric *fab, uint32_t first, uint32_t count)
{
    if (count == 0 || first >= VN_FABRIC_MAX_DOORBELLS || count > VN_FABRIC_MAX_DOORBELLS - first) {
        return;
    }
    if (fab->ops->doorbells_free != NULL) {
        if (fab->backend != NULL) {
            fab->ops->doorbells_free(fab->backend, first, count);
        }
        return;
    }
    fab->doorbells_taken &= ~doorbell_mask(first, count);
}

int vn_fabric_doorbells_claim(VnFabric *fab, uint32_t first, uint32_t count)
{
    uint64_t m;

    if (count == 0 || first >= fab->limits.doorbells || count > fab->limits.doorbells - first ||
        fab->ops->doorbells_alloc_async != NULL) {
        return -EINVAL;
    }
    m = doorbell_mask(first, count);
    if (fab->doorbells_taken & m) {
        return -EBUSY;
    }
    fab->doorbells_taken |= m;
    return 0;
}

uint32_t vn_fabric_doorbells_in_use(VnFabric *fab)
{
    return (uint32_t)__builtin_popcountll(fab->doorbells_taken);
}

/* The bits @p rang beyond its budget, once each. */
static gboolean doorbells_flush(gpointer data)
{
    VnFabricPeer *p = data;
    VnFabric *fab = p->fab;
    char peer[VN_MAX_NODE_NAME + 1];
    uint64_t bits = p->db_pending;

    /* A handler may take the link down, and @p with it: nothing of it is read after. */
    g_strlcpy(peer, p->name, sizeof(peer));
    /* What they cost comes out of the budget: a flood stays at the rate. */
    p->db_tokens -= __builtin_popcountll(bits);
    p->db_pending = 0;
    g_clear_pointer(&p->db_flush, g_source_unref);
    for (uint32_t bit = 0; bits != 0; bit++, bits >>= 1) {
        if ((bits & 1) && fab->handlers.on_doorbell != NULL) {
            fab->handlers.on_doorbell(fab->opaque, peer, bit);
        }
    }
    return G_SOURCE_REMOVE;
}

/* Whether @peer's doorbell @bit is delivered now; if not, it is folded into the next
 * flush (see VN_FABRIC_DOORBELL_RATE). */
static bool doorbell_within_budget(VnFabric *fab, const char *peer, uint32_t bit)
{
    VnFabricPeer *p = vn_fabric_peer(fab, peer);
    gint64 now = g_get_monotonic_time();
    double rate = fab->doorbell_rate;
    guint wait_ms;

    if (p == NULL) {
        return true; /* queued before its link went: as it always was */
    }
    p->db_tokens = MIN(MIN((double)VN_FABRIC_DOORBELL_BURST, rate),
                       p->db_tokens + (double)(now - p->db_refilled) * rate / 1e6);
    p->db_refilled = now;
    if (p->db_tokens >= 1.0 && p->db_flush == NULL) {
        p->db_tokens -= 1.0;
        return true;
    }
    fab->stats.doorbells_coalesced++;
    p->db_pending |= UINT64_C(1) << bit;
    if (p->db_flush == NULL) {
        /* When the budget has a token again. */
        wait_ms = (guint)MAX((1.0 - p->db_tokens) * 1000.0 / rate + 0.999,
                             (double)VN_FABRIC_DOORBELL_TICK_MS);
        p->db_flush = g_timeout_source_new(wait_ms);
        g_source_set_callback(p->db_flush, doorbells_flush, p, NULL);
        g_source_attach(p->db_flush, fab->ctx);
    }
    return false;
}

void vn_fabric_event_received(VnFabric *fab, const char *peer, const VnFabricFrame *f)
{
    VnFabricMsg msg;

    if (f->hdr.type == VN_FABRIC_TYPE_DOORBELL) {
        uint32_t bit;

        if (f->hdr.data_len != sizeof(bit) || f->json != NULL) {
            vn_fabric_bad_frame(fab, peer, f, -EINVAL, "doorbell frame");
            return;
        }
        memcpy(&bit, f->data, sizeof(bit));
        bit = GUINT32_FROM_LE(bit);
        if (bit >= fab->limits.doorbells) {
            vn_fabric_bad_frame(fab, peer, f, -EINVAL, "doorbell bit");
            return;
        }
        fab->stats.doorbells_received++;
        trace_fabric_doorbell_rung(fab->node, bit, peer);
        if (doorbell_within_budget(fab, peer, bit) && fab->handlers.on_doorbell != NULL) {
            fab->handlers.on_doorbell(fab->opaque, peer, bit);
        }
        return;
    }
    fab->stats.msgs_received++;
    if (fab->handlers.on_event != NULL) {
        vn_fabric_msg_view(&msg, peer, f);
        fab->handlers.on_event(fab->opaque, &msg);
    }
}

/* ---- links going, the node closing ------------------------------------ */

static gint pending_by_id(gconstpointer a, gconstpointer b)
{
    const VnFabricPending *x = *(VnFabricPending *const *)a;
    const VnFabricPending *y = *(VnFabricPending *const *)b;

    return x->id < y->id ? -1 : x->id > y->id;
}

/* Fail every pending request of link @gen (0: all) with @err, oldest first.
 * They leave the table before any callback runs, so callbacks may send. */
static void pending_fail(VnFabric *fab, uint64_t gen, int err)
{
    g_autoptr(GPtrArray) victims = g_ptr_array_new();
    GHashTableIter it;
    gpointer value;

    g_hash_table_iter_init(&it, fab->pending);
    while (g_hash_table_iter_next(&it, NULL, &value)) {
        VnFabricPending *pend = value;

        if (gen == 0 || pend->gen == gen) {
            g_ptr_array_add(victims, pend);
            g_hash_table_iter_steal(&it);
        }
    }
    g_ptr_array_sort(victims, pending_by_id);
    for (guint i = 0; i < victims->len; i++) {
        VnFabricPending *pend = victims->pdata[i];
        VnFabricPeer *p = pend->held ? pending_link(fab, pend) : NULL;

        if (p != NULL) { /* the node closing: its links are still up */
            held_unlink(p, pend);
        }
        trace_fabric_request_failed(fab->node, pend->id, pend->peer, g_strerror(-err));
        pend->done(pend->opaque, NULL, err);
        pending_free(pend);
    }
}

static gboolean token_of_gen(gpointer key, gpointer value, gpointer data)
{
    VnFabricToken *tok = value;
    uint64_t gen = *(uint64_t *)data;

    if (gen != 0 && tok->gen != gen) {
        return FALSE;
    }
    token_free(tok);
    return TRUE;
}

void vn_fabric_link_lost(VnFabric *fab, uint64_t gen)
{
    g_hash_table_foreach_remove(fab->tokens, token_of_gen, &gen);
    pending_fail(fab, gen, -ECONNRESET);
}

void vn_fabric_msgs_close(VnFabric *fab)
{
    uint64_t all = 0;

    if (fab->pending != NULL) {
        pending_fail(fab, 0, -ECANCELED);
    }
    if (fab->tokens != NULL) {
        g_hash_table_foreach_remove(fab->tokens, token_of_gen, &all);
    }
}
