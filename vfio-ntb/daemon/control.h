/*
 * vfio-ntbd's control socket (control.c): QMP-style JSON lines (docs/control.md), transport
 * only: requests are framed and checked here, then dispatched to a command table it is
 * given (commands.h); each request's reply is answered exactly once; events go to every
 * client that subscribed.  Clients are untrusted (control.c says how they are bounded).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_CONTROL_H
#define VN_CONTROL_H

#include "daemon.h"

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

typedef struct VnControl VnControl;
typedef struct VnControlReply VnControlReply;

/* Error classes of docs/control.md. */
#define VN_ERR_COMMAND "CommandNotFound"
#define VN_ERR_PARAM "InvalidParameter"
#define VN_ERR_NODEV "DeviceNotFound"
#define VN_ERR_ACCESS "AccessDenied"
#define VN_ERR_BUSY "DeviceBusy"
#define VN_ERR_NOTBORROWED "NotBorrowed"
#define VN_ERR_UNREACHABLE "NodeUnreachable"
#define VN_ERR_GENERIC "GenericError"

/* False (G_IO_ERROR_ADDRESS_IN_USE) when a live daemon answers on @path, or
 * G_IO_ERROR_EXISTS when @path is not a socket; true when it is free or a
 * dead daemon's socket, which vn_control_new() replaces. */
bool vn_control_path_free(const char *path, GError **error);
/* A command's handler answers @r once, now or later. */
typedef void (*VnCommandFn)(VnDaemon *d, JsonObject *args, VnControlReply *r);
/* The handler of @name, or NULL; *@allowed lists its argument names. */
typedef VnCommandFn (*VnCommandLookup)(const char *name, const char *const **allowed);
/* The control socket at @path, dispatching through @lookup (transport only:
 * it knows no command). */
VnControl *vn_control_new(VnDaemon *d, const char *path, VnCommandLookup lookup, GError **error);
void vn_control_free(VnControl *c);
/* Answer a request (takes @value; NULL means {}), or fail it.  Each reply
 * is answered exactly once; it may be kept and answered later. */
void vn_control_return(VnControlReply *r, JsonNode *value);
void vn_control_error(VnControlReply *r, const char *klass, const char *fmt, ...)
    G_GNUC_PRINTF(3, 4);
/* To every client that subscribed, and kept for late subscribers; takes
 * @data. */
void vn_control_event(VnControl *c, const char *name, JsonNode *data);
/* subscribe-events: answers @r, then sends @r's client every event from
 * now on, after those kept that came after @since_us (real time, as the
 * events' timestamps say; 0: none of them). */
void vn_control_subscribe(VnControlReply *r, gint64 since_us);
/* The "device" argument, host/name, split and checked; false once an error
 * answers @r. */
bool vn_control_arg_device(JsonObject *a, VnControlReply *r, char **node, char **name);

#endif /* VN_CONTROL_H */
