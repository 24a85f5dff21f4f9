/*
 * The config file read again (reload.c: SIGHUP, the control command `reload`): what a
 * running daemon can change without a restart is applied, the rest is said and left.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_RELOAD_H
#define VN_RELOAD_H

#include "daemon.h"

#include <glib.h>
#include <stdbool.h>

/*
 * Read the config at @path again and apply what needs no restart (reload.c
 * says what); false with @error (vn_conf_load()'s, the message
 * `vfio-ntbd --check-config` prints) when the file does not pass, and then
 * nothing changed.  Logs what it changed and what it ignored, and gives that
 * line in *@summary (NULL: not wanted).
 */
bool vn_daemon_reload(VnDaemon *d, const char *path, char **summary, GError **error);
/* The `reload` command's way to the config (VnReloadFn, above VnDaemon). */
void vn_daemon_set_reload(VnDaemon *d, VnReloadFn fn, void *data);
/* One line for systemd's STATUS=: "lending 2 (1 lent), borrowing 1, 3 nodes up". */
char *vn_daemon_status(VnDaemon *d);

#endif /* VN_RELOAD_H */
