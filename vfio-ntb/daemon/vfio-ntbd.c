/*
 * vfio-ntbd: one per host.  This first, static form attaches the node to the
 * fabric, lends the devices its config file names and borrows the ones it
 * names, each borrowed device exposed as a vfio-user socket for QEMU.
 *
 *   vfio-ntbd --config FILE [--verbose]
 *
 * SIGUSR1 writes the counters to the stats file; SIGTERM/SIGINT stop.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "borrower/borrower.h"
#include "conf.h"
#include "lending/lender.h"

#include <errno.h>
#include <glib-unix.h>
#include <json-glib/json-glib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* A borrow waits this long for its lender node to come up. */
#define VN_DAEMON_BORROW_RETRY_MS 200
#define VN_DAEMON_BORROW_WARN_EVERY 25

typedef struct Daemon {
    VnConfig *conf;
    VnFabric *fab;
    GPtrArray *lenders;         /* VnLender */
    GPtrArray *borrowers;       /* VnBorrower, NULL until borrowed */
    GMainLoop *loop;
    guint retry_src;
    unsigned retries;
} Daemon;

static VnLender *lender_for(Daemon *d, const char *device)
{
    for (guint i = 0; i < d->lenders->len; i++) {
        VnLender *l = d->lenders->pdata[i];

        if (strcmp(vn_lender_name(l), device) == 0) {
            return l;
        }
    }
    return NULL;
}

static void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    Daemon *d = opaque;
    char device[VN_PROTO_MAX_DEVICE_NAME + 1];
    g_autoptr(GError) error = NULL;
    VnLender *l;

    if (!vn_proto_device_name(msg->json, device, &error)) {
        vn_fabric_reply_error(d->fab, token, EINVAL, error->message);
        return;
    }
    l = lender_for(d, device);
    if (l == NULL) {
        g_autofree char *why = g_strdup_printf("node %s lends no device \"%s\"",
                                               d->conf->node, device);

        vn_fabric_reply_error(d->fab, token, ENODEV, why);
        return;
    }
    vn_lender_request(l, msg, token);
}

static void on_link(void *opaque, const char *peer, bool up)
{
    Daemon *d = opaque;

    g_message("node %s: link to %s %s", d->conf->node, peer, up ? "up" : "down");
    if (up) {
        return;
    }
    for (guint i = 0; i < d->lenders->len; i++) {
        vn_lender_peer_down(d->lenders->pdata[i], peer);
    }
    for (guint i = 0; i < d->borrowers->len; i++) {
        VnBorrower *b = d->borrowers->pdata[i];

        if (b != NULL && strcmp(vn_borrower_lender(b), peer) == 0) {
            vn_borrower_lender_down(b);
        }
    }
}

static void on_doorbell(void *opaque, const char *peer, uint32_t bit)
{
    Daemon *d = opaque;

    for (guint i = 0; i < d->borrowers->len; i++) {
        VnBorrower *b = d->borrowers->pdata[i];

        if (b != NULL && strcmp(vn_borrower_lender(b), peer) == 0) {
            vn_borrower_doorbell(b, bit);
        }
    }
}

static const VnFabricHandlers handlers = {
    .on_link = on_link,
    .on_request = on_request,
    .on_doorbell = on_doorbell,
};

/* Borrow what is not borrowed yet; true when everything is. */
static bool borrow_pending(Daemon *d)
{
    bool all = true;

    for (guint i = 0; i < d->conf->borrows->len; i++) {
        VnBorrowConf *bc = d->conf->borrows->pdata[i];
        g_autoptr(GError) error = NULL;

        if (d->borrowers->pdata[i] != NULL) {
            continue;
        }
        d->borrowers->pdata[i] = vn_borrower_new(d->fab, bc->lender, bc->device, bc->irq_mode,
                                                 bc->socket, NULL, &error);
        if (d->borrowers->pdata[i] == NULL) {
            all = false;
            if (d->retries % VN_DAEMON_BORROW_WARN_EVERY == 0) {
                g_message("node %s: borrow %s from %s: %s (retrying)", d->conf->node,
                          bc->device, bc->lender, error->message);
            }
        }
    }
    return all;
}

static gboolean on_retry(gpointer data)
{
    Daemon *d = data;

    d->retries++;
    if (borrow_pending(d)) {
        d->retry_src = 0;
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_CONTINUE;
}

static void add_json(JsonBuilder *b, char *json)
{
    g_autoptr(JsonParser) p = json_parser_new();

    if (json_parser_load_from_data(p, json, -1, NULL)) {
        json_builder_add_value(b, json_node_copy(json_parser_get_root(p)));
    }
    g_free(json);
}

static void stats_write(Daemon *d)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;
    VnFabricStats fs;

    if (d->conf->stats_file == NULL) {
        return;
    }
    vn_fabric_stats(d->fab, &fs);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, d->conf->node);
    json_builder_set_member_name(b, "fabric");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "msgs_sent");
    json_builder_add_int_value(b, (gint64)fs.msgs_sent);
    json_builder_set_member_name(b, "msgs_received");
    json_builder_add_int_value(b, (gint64)fs.msgs_received);
    json_builder_set_member_name(b, "doorbells_sent");
    json_builder_add_int_value(b, (gint64)fs.doorbells_sent);
    json_builder_set_member_name(b, "doorbells_received");
    json_builder_add_int_value(b, (gint64)fs.doorbells_received);
    json_builder_set_member_name(b, "bad_messages");
    json_builder_add_int_value(b, (gint64)fs.bad_messages);
    json_builder_end_object(b);
    json_builder_set_member_name(b, "lent");
    json_builder_begin_array(b);
    for (guint i = 0; i < d->lenders->len; i++) {
        add_json(b, vn_lender_stats_json(d->lenders->pdata[i]));
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "borrowed");
    json_builder_begin_array(b);
    for (guint i = 0; i < d->borrowers->len; i++) {
        if (d->borrowers->pdata[i] != NULL) {
            add_json(b, vn_borrower_stats_json(d->borrowers->pdata[i]));
        }
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    text = json_to_string(root, TRUE);
    /* g_file_set_contents renames into place: readers see whole files. */
    if (!g_file_set_contents(d->conf->stats_file, text, -1, &error)) {
        g_warning("node %s: stats file: %s", d->conf->node, error->message);
    }
}

static gboolean on_usr1(gpointer data)
{
    stats_write(data);
    return G_SOURCE_CONTINUE;
}

static gboolean on_stop(gpointer data)
{
    Daemon *d = data;

    g_message("node %s: stopping", d->conf->node);
    g_main_loop_quit(d->loop);
    return G_SOURCE_CONTINUE;
}

static void borrower_free0(gpointer p)
{
    vn_borrower_free(p);
}

static void lender_free0(gpointer p)
{
    vn_lender_free(p);
}

int main(int argc, char **argv)
{
    g_autofree char *config_path = NULL;
    gboolean verbose = FALSE;
    GOptionEntry entries[] = {
        { "config", 'c', 0, G_OPTION_ARG_FILENAME, &config_path,
          "configuration file (default /etc/vfio-ntb/vfio-ntbd.conf)", "FILE" },
        { "verbose", 'v', 0, G_OPTION_ARG_NONE, &verbose, "trace every message", NULL },
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) oc = g_option_context_new("- vfio-ntb host daemon");
    g_autoptr(GError) error = NULL;
    Daemon d = { 0 };
    guint sigs[3];
    int rc = 0;

    g_option_context_add_main_entries(oc, entries, NULL);
    if (!g_option_context_parse(oc, &argc, &argv, &error)) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 2;
    }
    if (verbose) {
        g_setenv("G_MESSAGES_DEBUG", "all", TRUE);
    }
    signal(SIGPIPE, SIG_IGN);
    d.conf = vn_conf_load(config_path ? config_path : "/etc/vfio-ntb/vfio-ntbd.conf", &error);
    if (d.conf == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        return 2;
    }
    d.lenders = g_ptr_array_new_with_free_func(lender_free0);
    d.borrowers = g_ptr_array_new_with_free_func(borrower_free0);
    d.fab = vn_fabric_open(d.conf->fabric, d.conf->node, d.conf->fabric_params, &handlers, &d,
                           NULL, &error);
    if (d.fab == NULL) {
        fprintf(stderr, "vfio-ntbd: %s\n", error->message);
        rc = 1;
        goto out;
    }
    for (guint i = 0; i < d.conf->lends->len; i++) {
        VnLendConf *lc = d.conf->lends->pdata[i];
        VnLender *l = vn_lender_new(d.fab, lc->name, lc->socket, &error);

        if (l == NULL) {
            fprintf(stderr, "vfio-ntbd: %s\n", error->message);
            rc = 1;
            goto out;
        }
        g_ptr_array_add(d.lenders, l);
        g_message("node %s: lending %s (device server %s)", d.conf->node, lc->name, lc->socket);
    }
    g_ptr_array_set_size(d.borrowers, (gint)d.conf->borrows->len);
    d.loop = g_main_loop_new(NULL, FALSE);
    if (!borrow_pending(&d)) {
        d.retry_src = g_timeout_add(VN_DAEMON_BORROW_RETRY_MS, on_retry, &d);
    }
    sigs[0] = g_unix_signal_add(SIGTERM, on_stop, &d);
    sigs[1] = g_unix_signal_add(SIGINT, on_stop, &d);
    sigs[2] = g_unix_signal_add(SIGUSR1, on_usr1, &d);
    g_message("node %s: up on fabric %s", d.conf->node, d.conf->fabric);
    g_main_loop_run(d.loop);
    for (int i = 0; i < 3; i++) {
        g_source_remove(sigs[i]);
    }
    if (d.retry_src != 0) {
        g_source_remove(d.retry_src);
    }
    stats_write(&d);

out:
    /* Borrowers first: they DETACH from lenders that may be this node's. */
    g_clear_pointer(&d.borrowers, g_ptr_array_unref);
    g_clear_pointer(&d.lenders, g_ptr_array_unref);
    g_clear_pointer(&d.fab, vn_fabric_close);
    g_clear_pointer(&d.loop, g_main_loop_unref);
    vn_conf_free(d.conf);
    return rc;
}
