/*
 * A client of vfio-ntbd's control socket (docs/control.md): connect, read
 * the greeting, execute commands.  ntbctl uses it; so can the libvirt hook.
 *
 *   g_autoptr(VnCtlClient) c = vn_ctl_client_connect(path, 10000, &error);
 *   g_autoptr(JsonNode) ret = c ? vn_ctl_client_execute(c, "query-devices",
 *                                                       NULL, &error) : NULL;
 *
 * The daemon is a peer like any other: every line it sends is bounded
 * (VN_CTL_MAX_LINE), must be valid UTF-8 and one JSON object of the expected
 * shape; anything else fails with VN_CTL_ERROR_PROTOCOL.  Event lines
 * (after subscribe-events) are skipped.  Every wait (connect + greeting, and
 * each request's answer) is bounded by the client's timeout.
 *
 * Errors: GErrors in VN_CTL_ERROR whose code is the daemon's error class
 * (its "desc" is the message, verbatim) or one of the client's own classes.
 * After a PROTOCOL or TIMEOUT error the stream is in an unknown state and
 * every further execute fails; connect again.
 *
 * Threads: a VnCtlClient is used by one thread at a time; it has none of
 * its own.  Blocking: every call blocks the caller (at most the timeout).
 */
#ifndef VN_CTL_CLIENT_H
#define VN_CTL_CLIENT_H

#include "common/name.h"

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

/* Where the daemon listens unless told otherwise ([node] control-socket). */
#define VN_CTL_DEFAULT_SOCKET "/run/vfio-ntb/control.sock"
/* The environment variable that overrides VN_CTL_DEFAULT_SOCKET. */
#define VN_CTL_SOCKET_ENV "VFIO_NTB_CONTROL"
#define VN_CTL_DEFAULT_TIMEOUT_MS 10000
/* docs/control.md "Framing": at most 64 KiB per line, here counted without
 * the '\n'.  A longer line in either direction is a broken or hostile peer. */
#define VN_CTL_MAX_LINE (64 * 1024)
/* Device names are host/name: a node name and a device name (common/name.h). */
#define VN_CTL_MAX_DEVICE (VN_MAX_NODE_NAME + 1 + VN_MAX_DEVICE_NAME)

#define VN_CTL_ERROR (vn_ctl_error_quark())
GQuark vn_ctl_error_quark(void);

/* The daemon's error classes (docs/control.md), then the client's own. */
typedef enum VnCtlError {
    VN_CTL_ERROR_COMMAND_NOT_FOUND = 0,
    VN_CTL_ERROR_INVALID_PARAMETER,
    VN_CTL_ERROR_DEVICE_NOT_FOUND,
    VN_CTL_ERROR_ACCESS_DENIED,
    VN_CTL_ERROR_DEVICE_BUSY,
    VN_CTL_ERROR_NOT_BORROWED,
    VN_CTL_ERROR_NODE_UNREACHABLE,
    VN_CTL_ERROR_GENERIC,     /* GenericError, and a class this client does not know */
    VN_CTL_ERROR_UNREACHABLE, /* could not connect to the socket, or no greeting in time */
    VN_CTL_ERROR_TIMEOUT,     /* connected, but no answer in time */
    VN_CTL_ERROR_PROTOCOL,    /* a malformed line, or the daemon closed the connection */
    VN_CTL_ERROR_USAGE,       /* a bad argument, refused before anything is sent */
    /* ntbctl's libvirt commands: */
    VN_CTL_ERROR_DOMAIN_NOT_FOUND, /* libvirt runs no such domain */
    VN_CTL_ERROR_LIBVIRT,          /* libvirt unreachable, or it refused */
    VN_CTL_ERROR_LAST
} VnCtlError;

/* The class name ("DeviceBusy"; "DaemonUnreachable", "Timeout",
 * "ProtocolError", "UsageError", "DomainNotFound" and "LibvirtError" for
 * the client's own); "unknown" when out of range. */
const char *vn_ctl_error_to_string(VnCtlError code);
/* The code for a daemon's class name; VN_CTL_ERROR_GENERIC when unknown. */
VnCtlError vn_ctl_error_from_class(const char *cls);

/*
 * True for a device name "host/name" (host: [a-z0-9][a-z0-9-]*, at most
 * VN_MAX_NODE_NAME; name: [A-Za-z0-9_.-], 1..VN_MAX_DEVICE_NAME).  Otherwise
 * VN_CTL_ERROR_USAGE saying what is wrong.
 */
bool vn_ctl_device_valid(const char *dev, GError **error);

/* $VFIO_NTB_CONTROL if set and not empty, else VN_CTL_DEFAULT_SOCKET. */
const char *vn_ctl_default_socket(void);

typedef struct VnCtlClient VnCtlClient;

/*
 * Connect to the control socket at path and read the greeting, together
 * within timeout_ms (> 0), which also bounds each later answer.
 * Errors: UNREACHABLE (no socket, refused, permission, connect or greeting
 * timed out; the message names path), PROTOCOL (not a vfio-ntbd greeting).
 */
VnCtlClient *vn_ctl_client_connect(const char *path, int timeout_ms, GError **error);
void vn_ctl_client_free(VnCtlClient *c);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnCtlClient, vn_ctl_client_free)

/* From the greeting: the daemon's node name and version. */
const char *vn_ctl_client_node(const VnCtlClient *c);
const char *vn_ctl_client_version(const VnCtlClient *c);
const char *vn_ctl_client_path(const VnCtlClient *c);

/*
 * Send {"execute": command, "arguments": arguments, "id": N} and wait for
 * the answer with id N.  arguments may be NULL; it is only read.
 * Returns the answer's "return" value (the caller owns it), or NULL with
 * the daemon's error (code from its class, message its desc) or
 * TIMEOUT / PROTOCOL / INVALID_PARAMETER (request over VN_CTL_MAX_LINE).
 */
JsonNode *vn_ctl_client_execute(VnCtlClient *c, const char *command, JsonObject *arguments,
                                GError **error);

/*
 * After execute("subscribe-events"): the next event line, checked
 * ({"event": NAME, "data": {...}, "timestamp": {"seconds", "microseconds"}}),
 * waiting at most timeout_ms (-1: until one comes).  NULL with TIMEOUT when
 * none came in time (the client stays usable), PROTOCOL for a malformed
 * line or a closed connection.  Answers to requests are not expected here.
 */
JsonObject *vn_ctl_client_next_event(VnCtlClient *c, int timeout_ms, GError **error);

#endif /* VN_CTL_CLIENT_H */
