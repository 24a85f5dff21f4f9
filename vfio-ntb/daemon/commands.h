/*
 * vfio-ntbd's control commands (commands.c, docs/control.md): the table control.c
 * dispatches through; each command checks its arguments before it changes anything.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_COMMANDS_H
#define VN_COMMANDS_H

#include "control.h"

/* The daemon's command table (a VnCommandLookup). */
VnCommandFn vn_commands_lookup(const char *name, const char *const **allowed);

#endif /* VN_COMMANDS_H */
