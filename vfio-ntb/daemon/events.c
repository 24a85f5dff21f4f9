/*
 * The daemon's events (docs/control.md "Events"): what happened to a device,
 * a lease or a link, in one shape, for control.c to send to every client
 * that subscribed.  Below the parts that say what happened (cluster.c,
 * devices.c, unplug.c, ...): it calls nothing of theirs.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "events.h"

#include "control.h"

void vn_events_emit(VnDaemon *d, const char *event, const char *device, uint64_t lease,
                    const char *node, const char *domain)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    if (device != NULL) {
        json_builder_set_member_name(b, "device");
        json_builder_add_string_value(b, device);
    }
    if (lease != 0) {
        json_builder_set_member_name(b, "lease");
        json_builder_add_int_value(b, (gint64)lease);
    }
    if (node != NULL) {
        json_builder_set_member_name(b, "node");
        json_builder_add_string_value(b, node);
    }
    if (domain != NULL) {
        json_builder_set_member_name(b, "domain");
        json_builder_add_string_value(b, domain);
    }
    json_builder_end_object(b);
    vn_control_event(d->control, event, json_builder_get_root(b));
}
