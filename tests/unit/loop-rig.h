/*
 * A GMainContext run by a thread of its own, for the unit suites whose parts must answer
 * while the test's thread waits (lender-rig.h, check_borrower_untrusted.c): start and stop
 * it, and run a function in it, waiting for it to return.
 */
#ifndef VN_CHECK_LOOP_RIG_H
#define VN_CHECK_LOOP_RIG_H

#include <glib.h>
#include <stdbool.h>

typedef struct Loop {
    GMainContext *ctx; /* set before loop_start(); loop_stop() drops it */
    GMainLoop *loop;
    GThread *thread;
} Loop;

static inline gpointer loop_thread(gpointer data)
{
    Loop *lp = data;

    g_main_context_push_thread_default(lp->ctx);
    g_main_loop_run(lp->loop);
    g_main_context_pop_thread_default(lp->ctx);
    return NULL;
}

static inline void loop_start(Loop *lp, const char *name)
{
    lp->loop = g_main_loop_new(lp->ctx, FALSE);
    lp->thread = g_thread_new(name, loop_thread, lp);
}

static inline gboolean quit_cb(gpointer data)
{
    g_main_loop_quit(data);
    return G_SOURCE_REMOVE;
}

static inline void loop_stop(Loop *lp)
{
    g_main_context_invoke(lp->ctx, quit_cb, lp->loop);
    g_thread_join(lp->thread);
    g_main_loop_unref(lp->loop);
    g_main_context_unref(lp->ctx);
}

/* Run @fn(@data) in @lp's thread and wait for it. */
typedef struct Call {
    void (*fn)(void *data);
    void *data;
    GMutex lock;
    GCond cond;
    bool done;
} Call;

static inline gboolean call_cb(gpointer p)
{
    Call *c = p;

    c->fn(c->data);
    g_mutex_lock(&c->lock);
    c->done = true;
    g_cond_signal(&c->cond);
    g_mutex_unlock(&c->lock);
    return G_SOURCE_REMOVE;
}

static inline void on_loop(Loop *lp, void (*fn)(void *data), void *data)
{
    Call c = { .fn = fn, .data = data };

    g_mutex_init(&c.lock);
    g_cond_init(&c.cond);
    g_main_context_invoke(lp->ctx, call_cb, &c);
    g_mutex_lock(&c.lock);
    while (!c.done) {
        g_cond_wait(&c.cond, &c.lock);
    }
    g_mutex_unlock(&c.lock);
    g_mutex_clear(&c.lock);
    g_cond_clear(&c.cond);
}

#endif /* VN_CHECK_LOOP_RIG_H */
