/*
 * A set of fds behind one epoll fd, dispatched from one GLib source
 * (fdset.h says why).
 */
#include "fdset.h"

#include <errno.h>
#include <stdbool.h>
#include <sys/epoll.h>
#include <unistd.h>

/* Events taken from the kernel per dispatch; more wait for the next one. */
#define VN_FDSET_BATCH 64

struct VnFdSetWatch {
    VnFdSet *set;
    int fd;
    VnFdSetFn fn;
    void *opaque;
    bool removed;
};

struct VnFdSet {
    GSource source; /* first: the set is the source */
    int epfd;
    GPtrArray *watches; /* VnFdSetWatch *, live ones */
    GPtrArray *dead;    /* removed while a dispatch may still meet them */
    int dispatching;
    bool closing;
};

static GIOCondition condition(uint32_t events)
{
    return ((events & EPOLLIN) ? G_IO_IN : 0) | ((events & EPOLLPRI) ? G_IO_PRI : 0) |
           ((events & EPOLLOUT) ? G_IO_OUT : 0) |
           ((events & (EPOLLHUP | EPOLLRDHUP)) ? G_IO_HUP : 0) |
           ((events & EPOLLERR) ? G_IO_ERR : 0);
}

static gboolean set_dispatch(GSource *source, GSourceFunc cb, gpointer data)
{
    VnFdSet *s = (VnFdSet *)source;
    struct epoll_event ev[VN_FDSET_BATCH];
    int n = epoll_wait(s->epfd, ev, VN_FDSET_BATCH, 0);

    s->dispatching++;
    for (int i = 0; i < n && !s->closing; i++) {
        VnFdSetWatch *w = ev[i].data.ptr;

        /* Removed by an earlier callback of this batch: its memory waits in s->dead. */
        if (!w->removed) {
            w->fn(w->fd, condition(ev[i].events), w->opaque);
        }
    }
    if (--s->dispatching == 0) {
        g_ptr_array_set_size(s->dead, 0);
    }
    return G_SOURCE_CONTINUE;
}

static void set_finalize(GSource *source)
{
    VnFdSet *s = (VnFdSet *)source;

    g_ptr_array_unref(s->watches);
    g_ptr_array_unref(s->dead);
}

static GSourceFuncs set_funcs = {
    .dispatch = set_dispatch,
    .finalize = set_finalize,
};

VnFdSet *vn_fdset_new(GMainContext *ctx)
{
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    VnFdSet *s;

    if (epfd < 0) {
        return NULL;
    }
    s = (VnFdSet *)g_source_new(&set_funcs, sizeof(VnFdSet));
    s->epfd = epfd;
    s->watches = g_ptr_array_new();
    s->dead = g_ptr_array_new_with_free_func(g_free);
    g_source_set_name(&s->source, "vn-fdset");
    /* As vn_util_fd_source_new(): nothing of ours recurses, and a source that may not
     * is taken out of the poll set and put back around every dispatch. */
    g_source_set_can_recurse(&s->source, TRUE);
    g_source_add_unix_fd(&s->source, epfd, G_IO_IN);
    g_source_attach(&s->source, ctx);
    return s;
}

static void watch_drop(VnFdSetWatch *w)
{
    VnFdSet *s = w->set;

    /* The fd is still open (fdset.h): the kernel forgets it now, not at its close. */
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, w->fd, NULL);
    w->removed = true;
    g_ptr_array_remove_fast(s->watches, w);
    if (s->dispatching > 0) {
        g_ptr_array_add(s->dead, w);
    } else {
        g_free(w);
    }
}

void vn_fdset_free(VnFdSet *s)
{
    if (s == NULL) {
        return;
    }
    while (s->watches->len > 0) {
        watch_drop(s->watches->pdata[s->watches->len - 1]);
    }
    s->closing = true; /* a dispatch under way calls nobody more */
    close(s->epfd);
    s->epfd = -1;
    g_source_destroy(&s->source);
    g_source_unref(&s->source); /* a dispatch under way holds its own reference */
}

VnFdSetWatch *vn_fdset_add(VnFdSet *s, int fd, GIOCondition cond, VnFdSetFn fn, void *opaque)
{
    VnFdSetWatch *w = g_new0(VnFdSetWatch, 1);
    struct epoll_event ev = {
        .events = ((cond & G_IO_IN) ? EPOLLIN : 0) | ((cond & G_IO_PRI) ? EPOLLPRI : 0) |
                  ((cond & G_IO_OUT) ? EPOLLOUT : 0),
        .data.ptr = w,
    };

    *w = (VnFdSetWatch){ .set = s, .fd = fd, .fn = fn, .opaque = opaque };
    /* EPOLLHUP and EPOLLERR are always reported, asked or not. */
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int e = errno;

        g_free(w);
        errno = e;
        return NULL;
    }
    g_ptr_array_add(s->watches, w);
    return w;
}

void vn_fdset_remove(VnFdSetWatch *w)
{
    if (w != NULL && !w->removed) {
        watch_drop(w);
    }
}

unsigned vn_fdset_size(const VnFdSet *s)
{
    return s->watches->len;
}
