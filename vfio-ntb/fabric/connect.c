/*
 * Connects under way (vn_fabric_connect_async, fabric.h): who waits for which peer's link,
 * until when.  A backend's connect never waits (an NTB session on its way comes up from the
 * loop), so a caller that needs the link is called back: when fabric.c reports the link up
 * (vn_fabric_connects_link_up), at its deadline, or at the fabric's close.  Nothing here
 * calls back into fabric.c.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "fabric-int.h"

#include <errno.h>
#include <string.h>

struct VnFabricConnect {
    GPtrArray *list; /* the fabric's fab->connects, which holds us */
    char peer[VN_MAX_NODE_NAME + 1];
    VnFabricConnected done;
    void *opaque;
    GSource *src; /* the deadline, or an idle with an answer known at once */
    int err;      /* the answer when @src fires: that one, or -EHOSTUNREACH at the deadline */
};

static void connect_free(VnFabricConnect *c)
{
    if (c->src != NULL) {
        g_source_destroy(c->src);
        g_source_unref(c->src);
    }
    g_free(c);
}

/* Off the list, then called: the callback may start or cancel other connects. */
static void finish(VnFabricConnect *c, int err)
{
    VnFabricConnected done = c->done;
    void *opaque = c->opaque;

    g_ptr_array_remove_fast(c->list, c);
    connect_free(c);
    done(opaque, err);
}

static gboolean on_deadline(gpointer data)
{
    VnFabricConnect *c = data;

    finish(c, c->err);
    return G_SOURCE_REMOVE; /* destroyed already: its return is not looked at */
}

VnFabricConnect *vn_fabric_connects_add(GPtrArray *list, GMainContext *ctx, const char *peer,
                                        int now, VnFabricConnected done, void *opaque)
{
    VnFabricConnect *c = g_new0(VnFabricConnect, 1);

    c->list = list;
    g_strlcpy(c->peer, peer != NULL ? peer : "", sizeof(c->peer));
    c->done = done;
    c->opaque = opaque;
    /* Every entry holds a source until it is answered, a waiting one for up to a second:
     * past the bound, the answer is no. */
    if (list->len >= VN_FABRIC_MAX_CONNECTS) {
        now = -EAGAIN;
    }
    /* -EINPROGRESS waits for the link until the deadline; anything else (0 too) is the
     * answer, from the loop. */
    c->err = now == -EINPROGRESS ? -EHOSTUNREACH : now;
    c->src =
        now == -EINPROGRESS ? g_timeout_source_new(VN_FABRIC_CONNECT_WAIT_MS) : g_idle_source_new();
    /* An idle's own priority is below every fd's: a busy loop would hold the answer. */
    g_source_set_priority(c->src, G_PRIORITY_DEFAULT);
    g_source_set_callback(c->src, on_deadline, c, NULL);
    g_source_attach(c->src, ctx);
    g_ptr_array_add(list, c);
    return c;
}

void vn_fabric_connect_cancel(VnFabricConnect *c)
{
    if (c != NULL) {
        g_ptr_array_remove_fast(c->list, c);
        connect_free(c);
    }
}

void vn_fabric_connects_link_up(GPtrArray *list, const char *peer)
{
    /* One at a time, looked for again after each: a callback may cancel or add others. */
    for (;;) {
        VnFabricConnect *c = NULL;

        for (guint i = 0; i < list->len && c == NULL; i++) {
            VnFabricConnect *x = list->pdata[i];

            if (strcmp(x->peer, peer) == 0) {
                c = x;
            }
        }
        if (c == NULL) {
            return;
        }
        finish(c, 0);
    }
}

void vn_fabric_connects_close(GPtrArray *list)
{
    /* The fabric took the list away first (no connect starts now): each is answered. */
    while (list->len > 0) {
        finish(list->pdata[list->len - 1], -ECANCELED);
    }
    g_ptr_array_unref(list);
}
