/*
 * The borrower's requests to its lender (borrower-int.h), none waited for: answered later
 * -- QEMU's reply waits for the lender's answer while the worker's loop goes on
 * (vn_borrower_ask_later) -- or posted (forwarded BAR writes).  All go on the one link to
 * the lender, which takes them in order.
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower-int.h"

#include "common/util.h"
#include "trace-borrower.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* What every request to the lender starts with: -ENOTCONN when it is lost; else the
 * posted writes before it go first, and, traced, @json gains its correlation id (the
 * lender's trace shows it too; *traced owns the new text). */
static int call_begin(VnBorrower *b, uint32_t type, const char **json, char **traced,
                      char corr[VN_TRACE_MAX_CORR], size_t len)
{
    if (b->stats.lender_lost) {
        return -ENOTCONN;
    }
    if (!b->flushing) {
        vn_borrower_posted_flush(b); /* what QEMU wrote before reaches the device first */
    }
    b->stats.fabric_requests++;
    if (trace_borrower_request_enabled() || trace_borrower_reply_enabled()) {
        g_snprintf(corr, VN_TRACE_MAX_CORR, "%s:%" PRIu64, vn_fabric_node(b->fab), ++b->corr_seq);
        *json = *traced = vn_proto_with_corr(*json, corr);
        trace_borrower_request(b->device, corr, vn_proto_type_to_string(type), b->lender, len);
    }
    return 0;
}

/* vn_borrower_call_async(), the correlation id (traced) in @corr. */
static int call_async(VnBorrower *b, uint32_t type, const char *json, const void *data, size_t len,
                      VnFabricReplyFn done, void *opaque, char corr[VN_TRACE_MAX_CORR])
{
    g_autofree char *traced = NULL;
    int ret = call_begin(b, type, &json, &traced, corr, len);

    if (ret < 0) {
        return ret;
    }
    ret = vn_fabric_request(b->fab, b->lender, type, json, data, len, done, opaque);
    if (ret < 0) {
        trace_borrower_request_failed(b->device, vn_proto_type_to_string(type), b->lender,
                                      g_strerror(-ret));
    }
    return ret;
}

int vn_borrower_call_async(VnBorrower *b, uint32_t type, const char *json, const void *data,
                           size_t len, VnFabricReplyFn done, void *opaque)
{
    char corr[VN_TRACE_MAX_CORR] = "-";

    return call_async(b, type, json, data, len, done, opaque, corr);
}

/* ---- posted writes (borrower-int.h) ---- */

typedef struct PostedWrite {
    VnBorrowerPosted *p;
    uint32_t region, count;
    uint64_t offset;
} PostedWrite;

static void posted_unref(VnBorrowerPosted *p)
{
    if (--p->refs == 0) {
        g_free(p);
    }
}

static void on_posted(void *opaque, VnFabricMsg *reply, int err)
{
    PostedWrite *w = opaque;
    VnBorrowerPosted *p = w->p;

    p->in_flight--;
    if (err < 0) {
        g_autofree char *why = reply != NULL ? vn_fabric_error_message(reply) : NULL;

        /* The first and then one in a thousand: a device that refuses every write must
         * not flood the log. */
        if (p->failures++ % 1000 == 0) {
            g_warning("borrower %s: a posted write of %u bytes to region %u at 0x%" PRIx64
                      " failed on the lender: %s (%" PRIu64 " failed so far)",
                      p->device, w->count, w->region, w->offset,
                      why != NULL ? why : g_strerror(-err), p->failures);
        }
    }
    posted_unref(p);
    g_free(w);
}

/*
 * A write sent as a request nobody waits for.  Handling QEMU's write (@in_op) with
 * VN_BORROWER_MAX_POSTED already in flight (or QEMU going), it is asked instead: QEMU's
 * reply waits for its answer, and so for every write before it; the loop does not.
 */
static int post_now(VnBorrower *b, uint32_t index, uint64_t offset, const void *buf, uint32_t count,
                    bool in_op)
{
    VnProtoRegionRw rw = { .region = index, .offset = offset, .count = count, .write = true };
    g_autofree char *json = vn_proto_region_rw_to_json(b->device, &rw);
    PostedWrite *w;
    int ret;

    if (in_op && (b->posted->in_flight >= VN_BORROWER_MAX_POSTED || b->client_leaving)) {
        return vn_borrower_ask_later(b, VN_PROTO_REGION_RW, json, buf, count, 0, NULL, NULL, NULL);
    }
    w = g_new(PostedWrite, 1);
    *w = (PostedWrite){ .p = b->posted, .region = index, .count = count, .offset = offset };
    b->posted->refs++;
    b->posted->in_flight++;
    ret = vn_fabric_request(b->fab, b->lender, VN_PROTO_REGION_RW, json, buf, count, on_posted, w);
    if (ret < 0) {
        b->posted->in_flight--;
        posted_unref(b->posted);
        g_free(w);
        return ret;
    }
    b->stats.fabric_requests++;
    b->posted->writes++;
    return 0;
}

typedef struct Deferred {
    uint32_t region, count;
    uint64_t offset;
    uint8_t data[VN_BORROWER_DEFER_MAX];
} Deferred;

void vn_borrower_posted_flush(VnBorrower *b)
{
    Deferred *w;

    if (b->flush_src != NULL) {
        g_source_destroy(b->flush_src);
        g_clear_pointer(&b->flush_src, g_source_unref);
    }
    b->flushing = true; /* a write that must wait sends no later one before it */
    while ((w = g_queue_pop_head(&b->deferred)) != NULL) {
        if (!b->stats.lender_lost &&
            post_now(b, w->region, w->offset, w->data, w->count, false) < 0) {
            b->posted->failures++; /* not sent: QEMU had its answer already */
        }
        g_free(w);
    }
    b->flushing = false;
}

static gboolean on_flush(gpointer data)
{
    VnBorrower *b = data;

    g_clear_pointer(&b->flush_src, g_source_unref); /* the source ends with this call */
    vn_borrower_posted_flush(b);
    return G_SOURCE_REMOVE;
}

int vn_borrower_region_write_posted(VnBorrower *b, uint32_t index, uint64_t offset, const void *buf,
                                    uint32_t count)
{
    Deferred *w;

    if (count > VN_BORROWER_DEFER_MAX || b->client_leaving ||
        b->posted->in_flight + b->deferred.length >= VN_BORROWER_MAX_POSTED) {
        vn_borrower_posted_flush(b);
        return post_now(b, index, offset, buf, count, true);
    }
    w = g_new(Deferred, 1);
    *w = (Deferred){ .region = index, .count = count, .offset = offset };
    memcpy(w->data, buf, count);
    g_queue_push_tail(&b->deferred, w);
    if (b->flush_src == NULL) {
        /* Before QEMU's next message is read, after our answer to this one is sent. */
        b->flush_src = g_idle_source_new();
        g_source_set_priority(b->flush_src, G_PRIORITY_HIGH);
        g_source_set_callback(b->flush_src, on_flush, b, NULL);
        g_source_attach(b->flush_src, b->ctx);
    }
    return 0;
}

/* ---- answered later (borrower-int.h) ---- */

/* A request whose answer is QEMU's reply to the command being handled. */
typedef struct Asked {
    VnBorrower *b;       /* NULL once the borrower is gone */
    uint64_t reply_id;   /* vn_server_later()'s */
    uint32_t read_count; /* a REGION_READ: the bytes QEMU gets */
    uint32_t type;
    char corr[VN_TRACE_MAX_CORR]; /* traced: the request's correlation id */
    VnBorrowerAnswerFn done;
    void *opaque;           /* @done's; NULL once forgotten (vn_borrower_asks_forget) */
    GDestroyNotify destroy; /* @opaque's, once the answer came or nobody waits */
} Asked;

static void asked_free(Asked *a)
{
    if (a->destroy != NULL && a->opaque != NULL) {
        a->destroy(a->opaque);
    }
    g_free(a);
}

/* What QEMU gets for the lender's answer: @done's say, or the lender's (a read's bytes). */
static void answer_qemu(VnBorrower *b, Asked *a, VnFabricMsg *reply, int err)
{
    if (a->done != NULL) {
        err = a->done(b, reply, err, a->opaque);
    }
    /* No command of QEMU's was being handled (its client going): nobody to answer. */
    if (b->server == NULL || a->reply_id == 0 || err == VN_BORROWER_ANSWERED) {
        return;
    }
    if (err == 0 && a->read_count > 0) {
        if (reply == NULL || reply->data_len != a->read_count) {
            vn_server_complete(b->server, a->reply_id, -EPROTO);
        } else {
            vn_server_complete_read(b->server, a->reply_id, reply->data, a->read_count);
        }
        return;
    }
    vn_server_complete(b->server, a->reply_id, err);
}

static void on_asked(void *opaque, VnFabricMsg *reply, int err)
{
    Asked *a = opaque;
    VnBorrower *b = a->b;

    if (b != NULL) {
        b->asked = g_list_remove(b->asked, a);
        trace_borrower_reply(b->device, a->corr, vn_proto_type_to_string(a->type), err);
        answer_qemu(b, a, reply, err);
    }
    asked_free(a);
}

/* vn_borrower_ask_later(), QEMU's reply @id (0: none). */
static int ask(VnBorrower *b, uint64_t id, uint32_t type, const char *json, const void *data,
               size_t len, uint32_t read_count, VnBorrowerAnswerFn done, void *opaque,
               GDestroyNotify destroy)
{
    Asked *a = g_new0(Asked, 1);
    int ret;

    *a = (Asked){ .b = b,
                  .reply_id = id,
                  .read_count = read_count,
                  .type = type,
                  .corr = "-",
                  .done = done,
                  .opaque = opaque,
                  .destroy = destroy };
    ret = call_async(b, type, json, data, len, on_asked, a, a->corr);
    if (ret < 0) {
        answer_qemu(b, a, NULL, ret); /* QEMU's reply is owed: the error, in its place */
        asked_free(a);
        return id != 0 ? 0 : ret;
    }
    b->asked = g_list_prepend(b->asked, a);
    return 0;
}

int vn_borrower_ask_later(VnBorrower *b, uint32_t type, const char *json, const void *data,
                          size_t len, uint32_t read_count, VnBorrowerAnswerFn done, void *opaque,
                          GDestroyNotify destroy)
{
    uint64_t id = b->server != NULL ? vn_server_later(b->server) : 0;

    return ask(b, id, type, json, data, len, read_count, done, opaque, destroy);
}

int vn_borrower_ask_answering(VnBorrower *b, uint64_t reply_id, uint32_t type, const char *json,
                              const void *data, size_t len, VnBorrowerAnswerFn done, void *opaque,
                              GDestroyNotify destroy)
{
    return ask(b, reply_id, type, json, data, len, 0, done, opaque, destroy);
}

void vn_borrower_pending_begin(VnBorrower *b, VnBorrowerPending *p)
{
    p->b = b;
    p->fab = b->fab;
    b->pending = g_list_prepend(b->pending, p);
}

VnBorrower *vn_borrower_pending_end(VnBorrowerPending *p)
{
    VnBorrower *b = p->b;

    if (b != NULL) {
        b->pending = g_list_remove(b->pending, p);
        p->b = NULL;
    }
    return b;
}

void vn_borrower_pending_orphan(VnBorrower *b)
{
    for (GList *l = b->pending; l != NULL; l = l->next) {
        ((VnBorrowerPending *)l->data)->b = NULL;
    }
    g_clear_pointer(&b->pending, g_list_free);
}

int vn_borrower_ask_posted(VnBorrower *b, uint32_t type, const char *json, VnBorrowerAnswerFn done,
                           void *opaque, GDestroyNotify destroy)
{
    return ask(b, 0, type, json, NULL, 0, 0, done, opaque, destroy);
}

void vn_borrower_asks_forget(VnBorrower *b, const void *opaque)
{
    for (GList *l = b->asked; l != NULL; l = l->next) {
        Asked *a = l->data;

        if (a->opaque == opaque) {
            a->opaque = NULL;
        }
    }
}

void vn_borrower_asks_orphan(VnBorrower *b)
{
    for (GList *l = b->asked; l != NULL; l = l->next) {
        ((Asked *)l->data)->b = NULL; /* their answers find nobody (and free them) */
    }
    g_clear_pointer(&b->asked, g_list_free);
}

void vn_borrower_posted_release(VnBorrowerPosted *p)
{
    posted_unref(p);
}
