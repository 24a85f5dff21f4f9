/*
 * libFuzzer target for vfio-ntbd's control socket (daemon/control.c): a
 * client's bytes, split into JSON lines, checked and dispatched.  The real
 * socket code runs (vn_control_new() on a socket in a temporary directory);
 * the command table is this file's lookup(), harmless fakes
 * that answer at once, fail, echo their arguments or keep the reply to
 * answer after the client has gone.  Each input is one client: connect,
 * the bytes in chunks (the first byte picks their size) with the daemon's
 * loop run and the answers read after each, an event, then the client
 * hangs up.
 */
#include "daemon/conf.h"
#include "daemon/control.h"
#include "daemon/daemon.h"

#include "common/util.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Replies "defer" kept; answered once the client is gone. */
static GPtrArray *deferred;

static void cmd_ok(VnDaemon *d, JsonObject *args, VnControlReply *r)
{
    vn_control_return(r, NULL);
}

static void cmd_echo(VnDaemon *d, JsonObject *args, VnControlReply *r)
{
    vn_control_return(r, json_node_init_object(json_node_alloc(), args));
}

static void cmd_fail(VnDaemon *d, JsonObject *args, VnControlReply *r)
{
    const char *desc = vn_util_json_string(args, "desc");

    vn_control_error(r, VN_ERR_GENERIC, "%s", desc != NULL ? desc : "failed");
}

static void cmd_defer(VnDaemon *d, JsonObject *args, VnControlReply *r)
{
    g_ptr_array_add(deferred, r);
}

static const char *const echo_args[] = { "device", "value", NULL };
static const char *const fail_args[] = { "desc", NULL };

static const struct {
    const char *name;
    VnCommandFn fn;
    const char *const *args;
} commands[] = {
    { "query-status", cmd_ok, NULL },  { "subscribe-events", cmd_ok, NULL },
    { "echo", cmd_echo, echo_args },   { "fail", cmd_fail, fail_args },
    { "defer", cmd_defer, echo_args },
};

static VnCommandFn lookup(const char *name, const char *const **allowed)
{
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++) {
        if (strcmp(name, commands[i].name) == 0) {
            *allowed = commands[i].args;
            return commands[i].fn;
        }
    }
    return NULL;
}

static VnConfig conf = { .node = (char *)"fuzz" };
static VnDaemon daemon_state = { .conf = &conf };
static VnControl *ctl;
static char *dir, *path;

static void cleanup(void)
{
    vn_control_free(ctl);
    rmdir(dir);
}

static void setup(void)
{
    g_autoptr(GError) error = NULL;

    dir = g_dir_make_tmp("vn-fuzz-control-XXXXXX", &error);
    path = dir != NULL ? g_build_filename(dir, "control.sock", NULL) : NULL;
    ctl = path != NULL ? vn_control_new(&daemon_state, path, lookup, &error) : NULL;
    if (ctl == NULL) {
        g_printerr("fuzz_control: %s\n", error->message);
        abort();
    }
    deferred = g_ptr_array_new();
    atexit(cleanup);
}

/* Run the daemon's loop until nothing is ready. */
static void settle(void)
{
    while (g_main_context_iteration(NULL, FALSE)) {
    }
}

/* Read and drop what the daemon sent; the number of bytes. */
static size_t drain(int fd)
{
    char buf[4096];
    size_t total = 0;
    ssize_t n;

    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
        total += (size_t)n;
    }
    return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    size_t chunk;
    int fd;

    if (size < 1) {
        return 0;
    }
    if (ctl == NULL) {
        setup();
    }
    /* Chunks of 8..128 bytes: the answers to one (64 lines at most) fit in
     * the socket, so the daemon's blocking send never waits for us. */
    chunk = 8 * (1 + data[0] % 16);
    data++;
    size--;
    g_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        abort();
    }
    settle();
    if (drain(fd) == 0) {
        abort(); /* no greeting: the last client is still there */
    }
    for (size_t off = 0; off < size; off += chunk) {
        size_t len = MIN(chunk, size - off);

        if (send(fd, data + off, len, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)len) {
            break; /* the daemon hung up (a line too long) */
        }
        settle();
        drain(fd);
    }
    vn_control_event(ctl, "FUZZ", json_node_init_null(json_node_alloc()));
    drain(fd);
    close(fd);
    settle();
    for (guint i = 0; i < deferred->len; i++) {
        if (i % 2) {
            vn_control_error(deferred->pdata[i], VN_ERR_BUSY, "deferred %u", i);
        } else {
            vn_control_return(deferred->pdata[i], NULL);
        }
    }
    g_ptr_array_set_size(deferred, 0);
    return 0;
}
