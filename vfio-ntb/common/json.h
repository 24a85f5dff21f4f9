/*
 * The one way vfio-ntb parses JSON text: bounded in length and nesting.
 *
 * json-glib's parser recurses once per nesting level with no limit of its
 * own (about 115 bytes of stack per level in 1.6), so a line of 64 KiB of
 * "[" overflows a 64 KiB thread stack and a 1 MiB state file or fabric
 * message an 8 MiB one.  Every text from a peer (control socket, QMP, the
 * state file, worker counters, fabric messages, vfio-user VERSION, domain
 * XML) goes through vn_json_parse*(), which refuses it before the parser
 * sees it when it is longer than the caller's bound or nests deeper than
 * VN_MAX_JSON_DEPTH.
 *
 * Threads: no state; callable from any thread.
 */
#ifndef VN_JSON_H
#define VN_JSON_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * Objects and arrays one text may nest.  Our deepest document (the state
 * file: root, leases, a lease) nests 4; a QMP reply or a libvirt -device
 * argument a few more.  32 leaves room for any of them and costs the
 * parser about 4 KiB of stack at most.
 */
#define VN_MAX_JSON_DEPTH 32u

/* What JSON text looks like before it is parsed. */
typedef enum VnJsonShape {
    VN_JSON_ONE,      /* one object or array (perhaps unclosed: the parser says) */
    VN_JSON_TOO_DEEP, /* objects and arrays nest deeper than the bound */
    VN_JSON_NOT_ONE,  /* a bare value, or more than whitespace after the value */
    VN_JSON_NOT_JSON, /* a byte JSON does not allow where it is (a control character in a
                       * string; outside strings anything but structure, numbers, literals
                       * and whitespace): json-glib's scanner reads such text otherwise than
                       * this scan does, and leaks on some of it */
    VN_JSON_SHAPE_LAST
} VnJsonShape;

/*
 * The shape of @s (@len bytes) with at most @max_depth levels of objects
 * and arrays allowed; brackets in strings (escapes included) do not count.
 * One pass, no recursion: json-glib 1.6 recurses once per level with no
 * limit of its own, and keeps (leaks) the value it parsed when more text
 * follows ("{} x", "[1] [2]", "7{}"), so peer text is looked at first.
 */
VnJsonShape vn_json_shape(const char *s, size_t len, unsigned max_depth);

/*
 * Parse @text (@len bytes, or -1 when NUL-terminated): one object or array,
 * then nothing but whitespace.  Refused with G_IO_ERROR_MESSAGE_TOO_LARGE
 * when longer than @max_len bytes or nested deeper than VN_MAX_JSON_DEPTH
 * (checked without recursion, before the parser runs), with
 * G_IO_ERROR_INVALID_DATA when NULL, empty, a bare value or followed by more
 * text (json-glib 1.6 leaks what it parsed then), with json-glib's
 * JSON_PARSER_ERROR when malformed.  Returns the root (owned:
 * json_node_unref(), or g_autoptr(JsonNode)).
 */
JsonNode *vn_json_parse(const char *text, gssize len, size_t max_len, GError **error);

/* The same when the root must be an object: a new reference to it
 * (json_object_unref(), or g_autoptr(JsonObject)); any other root, and an
 * empty text, is refused with G_IO_ERROR_INVALID_DATA "not a JSON object". */
JsonObject *vn_json_parse_object(const char *text, gssize len, size_t max_len, GError **error);

/* Set @member to the string @value, or to JSON null when @value is NULL. */
void vn_json_add_string_or_null(JsonBuilder *b, const char *member, const char *value);

#endif /* VN_JSON_H */
