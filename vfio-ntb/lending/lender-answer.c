/*
 * A request refused: the one answer every part of the lender gives (lender-int.h:
 * vn_lender_fail), below them all.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"
#include "trace-lending.h"

#include <stdarg.h>

void vn_lender_fail(VnLender *l, uint64_t token, int err, const char *fmt, ...)
{
    g_autofree char *what = NULL;
    g_autofree char *message = NULL;
    va_list ap;

    va_start(ap, fmt);
    what = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    message = g_strdup_printf("%s: %s", l->name, what);
    trace_lender_error_reply(l->name, err < 0 ? -err : err, what);
    vn_fabric_reply_error(l->fab, token, err, message);
}
