/*
 * ntbctl's human output: the daemon's "return" values (docs/control.md
 * "Commands") as aligned tables and sentences.  Pure functions: they append
 * to a GString and do no I/O, so tests compare text.
 *
 * Each checks the shape it is given (the daemon is a peer like any other)
 * and fails with VN_CTL_ERROR_PROTOCOL naming the command and the member
 * that is wrong, appending nothing useful to rely on in that case.
 * Text that came from the daemon passes through vn_ctl_format_sanitize(),
 * so a hostile string cannot drive the operator's terminal.
 * Missing values and JSON null are shown as "-".
 */
#ifndef VN_CTL_FORMAT_H
#define VN_CTL_FORMAT_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

/* s with every control character (C0, DEL, C1) replaced by '?' and invalid
 * UTF-8 by U+FFFD.  The caller frees the result. */
char *vn_ctl_format_sanitize(const char *s);

/* ret as JSON (pretty: indented over lines, else one line), with a final
 * newline: what --json prints. */
void vn_ctl_format_json(GString *out, JsonNode *ret, bool pretty);
/* One value as table text: null and missing "-", booleans yes/no, arrays
 * joined with ", ", objects as compact JSON; always sanitized (g_free). */
char *vn_ctl_format_value(JsonNode *n);

/* query-nodes: NODE LINK DEVICES LAST SEEN VERSION. */
bool vn_ctl_format_nodes(GString *out, JsonNode *ret, GError **error);
/* query-devices: DEVICE STATE BORROWER LEASE ATTACHED IDENTITY. */
bool vn_ctl_format_devices(GString *out, JsonNode *ret, GError **error);
/* query-devices: the devices' names, one per line (ntbctl list --name). */
bool vn_ctl_format_device_names(GString *out, JsonNode *ret, GError **error);
/* query-device: "key: value" lines, in the daemon's order. */
bool vn_ctl_format_device(GString *out, JsonNode *ret, GError **error);
/* query-stats: one COUNTER VALUE table per device (and the fabric's), then
 * a note of what is counted and that the data path is not. */
bool vn_ctl_format_stats(GString *out, JsonNode *ret, GError **error);

/* The actions' answers may say "changed": false (nothing to do): the text
 * says so ("already holds", "nothing to detach").
 * borrow: "hostb holds hosta/nvme0 (lease 17)"; node is the local node. */
bool vn_ctl_format_borrow(GString *out, const char *node, JsonNode *ret, GError **error);
/* attach (serve only): "serving hosta/nvme0 for vm1 (lease 17): QEMU socket /run/..." */
bool vn_ctl_format_attach(GString *out, const char *domain, JsonNode *ret, GError **error);
/* revoke: whether the borrower let go within the grace period. */
bool vn_ctl_format_revoke(GString *out, const char *device, JsonNode *ret, GError **error);
/* return / detach: {} -> "returned hosta/nvme0" / "detached hosta/nvme0 ...". */
bool vn_ctl_format_return(GString *out, const char *device, JsonNode *ret, GError **error);
bool vn_ctl_format_detach(GString *out, const char *device, JsonNode *ret, GError **error);
/* unplug: {"requested": true} -> the VM was asked to release the device;
 * false is an error (VN_CTL_ERROR_GENERIC) saying what to do instead. */
bool vn_ctl_format_unplug(GString *out, const char *device, JsonNode *ret, GError **error);

/* lend / unlend {} -> "hostb lends hostb/nvme1 ..." / "hostb no longer lends ...". */
bool vn_ctl_format_lend(GString *out, const char *node, const char *name, JsonNode *ret,
                        GError **error);
bool vn_ctl_format_unlend(GString *out, const char *node, const char *name, JsonNode *ret,
                          GError **error);
/* trace {"events", "on", "workers"} -> "hostb: 3 trace events on: ...". */
bool vn_ctl_format_trace(GString *out, const char *node, JsonNode *ret, GError **error);
/* query-trace's [{"event", "on"}] as a table. */
bool vn_ctl_format_trace_list(GString *out, JsonNode *ret, GError **error);

#endif /* VN_CTL_FORMAT_H */
