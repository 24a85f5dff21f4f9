/*
 * Trace points, as QEMU has them: each directory declares its events in a trace-events file
 * (name, typed arguments, format); scripts/tracetool turns them into inline trace_NAME()
 * functions (build/trace/trace-DIR.h).  An event that is off costs one branch; one that is on
 * logs its message at debug priority with structured fields: VFIO_NTB_EVENT (its name) and,
 * from arguments so named, VFIO_NTB_NODE, _PEER, _DEVICE, _LEASE, _MSG_ID and _CORR (the
 * correlation id that follows a request across processes and hosts).  With the journal as
 * stderr (systemd) they go to the journal with those fields; otherwise to stderr as lines.
 *
 * Events are switched at run time by glob patterns, as QEMU's -trace: "fabric_*,lender_*"
 * turns those on, "-fabric_doorbell*" off again, "*" everything.  Every program takes
 * --trace PATTERN and reads VN_TRACE (the daemon passes its patterns on to the workers it
 * starts); `ntbctl trace PATTERN` switches a running daemon and its workers.
 *
 * Threads: switching runs on one thread; trace points may run on any (the switch is an
 * atomic int per event).
 */
#ifndef VN_TRACE_H
#define VN_TRACE_H

#include <glib.h>
#include <stdbool.h>

typedef struct VnTraceEvent {
    const char *name;
    int *state;
} VnTraceEvent;

/* Every event (build/trace/trace-table.c). */
extern const VnTraceEvent vn_trace_events[];
extern const unsigned vn_trace_event_count;

/* Longest pattern list accepted (`ntbctl trace` passes it on to every worker in one
 * control-channel request, common/wctl.h). */
#define VN_TRACE_MAX_PATTERNS 512
/* A correlation id: "node:number", a node name (common/name.h) and a decimal u64. */
#define VN_TRACE_MAX_CORR 96

static inline bool vn_trace_on(int *state)
{
    return __atomic_load_n(state, __ATOMIC_RELAXED) != 0;
}

/* Log one event (the generated trace points call this). */
void vn_trace_emit(const char *event, const GLogField *fields, size_t n_fields, const char *fmt,
                   ...) G_GNUC_PRINTF(4, 5);

/*
 * Apply @patterns, comma-separated globs, each turning the events it matches on, or off with
 * a leading '-', left to right.  Returns how many events are on afterwards, or -1 with
 * @error for a list that is too long, empty or holds an empty pattern or a character other
 * than [a-z0-9_*?-] (nothing changes then).
 */
int vn_trace_enable(const char *patterns, GError **error);
/* The --trace option every program takes, as a GOptionEntry initializer (char *@var). */
#define VN_TRACE_OPTION_ENTRY(var)                                                           \
    {                                                                                        \
        "trace", 0, 0, G_OPTION_ARG_STRING, &(var),                                          \
            "turn trace events on: globs, comma-separated; -GLOB turns off (also VN_TRACE)", \
            "PATTERNS"                                                                       \
    }
/*
 * At a program's start: the VN_TRACE environment variable's patterns, then @option's (the
 * --trace option; may be NULL).  @verbose (a program's --verbose): every event too when
 * @option is NULL, and every debug line (G_MESSAGES_DEBUG=all).  What was applied is left
 * in VN_TRACE (vn_trace_keep()), so the processes this one starts trace the same.  False
 * with @error for a bad pattern.
 */
bool vn_trace_setup(const char *option, bool verbose, GError **error);
/* Add @patterns (applied already) to VN_TRACE for the processes started from now on; when
 * that is too long, VN_TRACE names the events on now; when that is too, it stays (and a
 * warning says so). */
void vn_trace_keep(const char *patterns);
/* The names of the events that are on, comma-separated (g_free it). */
char *vn_trace_enabled_list(void);
/* A worker's "trace PATTERNS" command (its control channel): vn_trace_enable(), answered
 * as {"on": N} (g_free it), or NULL with @error. */
char *vn_trace_command(const char *patterns, GError **error);

#endif /* VN_TRACE_H */
