/*
 * A fake vfio-ntbd control socket for check_ctl.c: a thread serving a UNIX
 * socket in a directory of its own.  Each connection gets the scripted
 * greeting, has one request line read (kept in requests), gets the
 * scripted answer lines ("%ID%" replaced by the request's id), and is then
 * closed, or held open until the client hangs up (hold: for timeouts).
 *
 * Threads: the script fields are set before ctl_fake_start() and only read
 * by the fake's thread; conns and requests are the thread's until
 * ctl_fake_stop() has joined it.
 */
#ifndef VN_CHECK_CTL_FAKE_H
#define VN_CHECK_CTL_FAKE_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "common/json.h"
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* No wait of the fake lasts longer, so a broken test fails instead of hanging. */
#define CTL_FAKE_WAIT_MS 10000

typedef struct CtlFake {
    char *dir;
    char *path; /* the control socket */
    int lfd;
    int stop[2]; /* a pipe: written to stop the thread */
    GThread *thread;
    /* script */
    const char *greeting;       /* sent with a '\n'; NULL: none */
    const char *const *answers; /* NULL-terminated, sent as they are (add '\n') */
    bool hold;                  /* keep the connection until the client closes */
    /* results */
    unsigned conns;
    GPtrArray *requests; /* char *: the request line of each connection */
} CtlFake;

#define CTL_GREETING "{\"vfio-ntbd\": {\"version\": \"0.1.0\", \"node\": \"hostb\"}}"

/* Wait for fd to be readable; false on stop, timeout or error. */
static bool fake_wait(CtlFake *f, int fd)
{
    struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = f->stop[0], .events = POLLIN } };

    return poll(p, 2, CTL_FAKE_WAIT_MS) > 0 && !(p[1].revents & POLLIN);
}

/* Read a line (without '\n'); NULL on EOF first. */
static char *fake_read_line(CtlFake *f, int fd)
{
    g_autoptr(GString) s = g_string_new(NULL);
    char ch;

    while (fake_wait(f, fd) && read(fd, &ch, 1) == 1) {
        if (ch == '\n') {
            return g_string_free(g_steal_pointer(&s), FALSE);
        }
        g_string_append_c(s, ch);
    }
    return NULL;
}

static void fake_send(int fd, const char *text)
{
    size_t len = strlen(text), done = 0;

    while (done < len) {
        ssize_t n = send(fd, text + done, len - done, MSG_NOSIGNAL);

        if (n <= 0) {
            return; /* the client went away: that is its test */
        }
        done += (size_t)n;
    }
}

static char *fake_request_id(const char *line)
{
    g_autoptr(JsonObject) o = vn_json_parse_object(line, -1, VN_CTL_MAX_LINE, NULL);

    if (o == NULL || !json_object_has_member(o, "id")) {
        return g_strdup("null");
    }
    return g_strdup_printf("%" G_GINT64_FORMAT, json_object_get_int_member(o, "id"));
}

static void fake_serve(CtlFake *f, int fd)
{
    g_autofree char *req = NULL;
    g_autofree char *id = NULL;

    if (f->greeting != NULL) {
        g_autofree char *g = g_strdup_printf("%s\n", f->greeting);

        fake_send(fd, g);
    }
    req = fake_read_line(f, fd);
    if (req != NULL) {
        id = fake_request_id(req);
        for (size_t i = 0; f->answers != NULL && f->answers[i] != NULL; i++) {
            g_autoptr(GString) a = g_string_new(f->answers[i]);

            g_string_replace(a, "%ID%", id, 0);
            fake_send(fd, a->str);
        }
        g_ptr_array_add(f->requests, g_steal_pointer(&req));
    }
    if (f->hold) {
        g_autofree char *rest = NULL;

        while ((rest = fake_read_line(f, fd)) != NULL) {
            g_clear_pointer(&rest, g_free);
        }
    }
}

static gpointer fake_thread(gpointer data)
{
    CtlFake *f = data;

    while (fake_wait(f, f->lfd)) {
        int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);

        if (fd < 0) {
            continue;
        }
        f->conns++;
        fake_serve(f, fd);
        close(fd);
    }
    return NULL;
}

static CtlFake *ctl_fake_new(void)
{
    CtlFake *f = g_new0(CtlFake, 1);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };

    f->dir = g_dir_make_tmp("vn-ctl-XXXXXX", NULL);
    ck_assert_ptr_nonnull(f->dir);
    f->path = g_build_filename(f->dir, "control.sock", NULL);
    ck_assert_uint_lt(strlen(f->path), sizeof(sa.sun_path));
    strcpy(sa.sun_path, f->path);
    f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(f->lfd, 0);
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(f->lfd, 8), 0);
    ck_assert_int_eq(pipe2(f->stop, O_CLOEXEC), 0);
    f->greeting = CTL_GREETING;
    f->requests = g_ptr_array_new_with_free_func(g_free);
    return f;
}

static void ctl_fake_start(CtlFake *f)
{
    f->thread = g_thread_new("ctl-fake", fake_thread, f);
}

/* Stop and join the thread; results may be read afterwards. */
static void ctl_fake_stop(CtlFake *f)
{
    if (f->thread != NULL) {
        char x;

        ck_assert_int_eq(write(f->stop[1], "x", 1), 1);
        g_thread_join(f->thread);
        f->thread = NULL;
        /* drained, so the fake can be started again */
        ck_assert_int_eq(read(f->stop[0], &x, 1), 1);
    }
}

static void ctl_fake_free(CtlFake *f)
{
    ctl_fake_stop(f);
    close(f->lfd);
    close(f->stop[0]);
    close(f->stop[1]);
    g_unlink(f->path);
    g_rmdir(f->dir);
    g_ptr_array_unref(f->requests);
    g_free(f->path);
    g_free(f->dir);
    g_free(f);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC(CtlFake, ctl_fake_free)

#endif /* VN_CHECK_CTL_FAKE_H */
