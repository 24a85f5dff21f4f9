/*
 * The daemon's VnWorkerOps seam (workers.h): a table is checked once, when a
 * daemon is made with it (vn_daemon_new), for the members it requires.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "workers.h"

#include <gio/gio.h>

bool vn_worker_ops_valid(const VnWorkerOps *ops, GError **error)
{
    const char *missing = NULL;

    if (ops == NULL) {
        missing = "the table";
    } else if (ops->name == NULL || ops->name[0] == '\0') {
        missing = "name";
    } else if (ops->start == NULL) {
        missing = "start";
    } else if (ops->stop == NULL) {
        missing = "stop";
    } else if (ops->adopt == NULL) {
        missing = "adopt";
    } else if (ops->stats == NULL) {
        missing = "stats";
    } else if (ops->request_unplug == NULL) {
        missing = "request_unplug";
    } else if (ops->client_state == NULL) {
        missing = "client_state";
    } else if (ops->lend_start == NULL || ops->lend_stop == NULL || ops->lend_adopt == NULL ||
               ops->lend_kill == NULL || ops->lend_stats == NULL) {
        missing = "lend_start, lend_stop, lend_adopt, lend_kill and lend_stats";
    }
    if (missing != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "worker ops: %s is required",
                    missing);
        return false;
    }
    return true;
}
