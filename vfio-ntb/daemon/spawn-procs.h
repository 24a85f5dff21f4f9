/*
 * The daemon's worker processes, whichever side they serve (spawn-procs.c): their
 * binaries, whether a pid is still one of ours, an adopted one's exit, the run dir and
 * ports they reach, and asking one over its control channel (common/wctl.h) without
 * waiting.  It takes pids, paths and ports, never a device.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_SPAWN_PROCS_H
#define VN_SPAWN_PROCS_H

#include "daemon.h"
#include "devices.h"
#include "port.h"
#include "common/wctl.h"

#include <glib.h>
#include <stdbool.h>

/* The workers' binaries: vfio-ntb-borrower (spawn.c) and vfio-ntb-lender (lenders.c)
 * processes, which outlive the daemon. */
#define VN_SPAWN_BINARY "vfio-ntb-borrower"
#define VN_LENDERS_BINARY "vfio-ntb-lender"

/* Command @name on the control channel @channel of worker @pid (@what: its
 * device, for the log), answered from the loop as VnWorkerOps.stats says. */
VnWctlCall *vn_spawn_ask(GPid pid, const char *channel, const char *what, const char *name,
                         VnWctlDone done, void *opaque);
/* What a borrower worker's counters (@stats, its "stats" answer; NULL: no
 * answer) say of its QEMU. */
VnClientState vn_spawn_client_of(const char *stats);
/* Worker @name (a file name): next to our own binary, else in VN_LIBEXECDIR,
 * else on PATH; NULL with @error naming where it looked when in none. */
char *vn_spawn_binary(const char *name, GError **error);
/* @name in the first of @dirs (NULL-terminated) that has it executable,
 * else on PATH; NULL with @error (G_IO_ERROR_NOT_FOUND) when in none. */
char *vn_spawn_find(const char *name, const char *const *dirs, GError **error);
/* The run dir, made when missing, passable (not listable) by others: QEMU's user reaches its
 * socket there, the worker user its port.  False with @error. */
bool vn_spawn_run_dir(VnDaemon *d, GError **error);
/* @port's socket given to the worker user ([node] worker-user), whose worker must be able to
 * dial it again after a restart of ours.  False with @error. */
bool vn_spawn_port_for_worker_user(VnDaemon *d, VnPort *port, GError **error);
/* The fd a worker finds its port's connection at (port.h: vn_port_pair). */
#define VN_SPAWN_PORT_FD 3
/* @pid (> 0) runs: a signal reaches it (whether it is still ours, vn_spawn_alive says). */
bool vn_spawn_running(GPid pid);
/* @pid runs and is @binary (a process of ours, not a reused pid). */
bool vn_spawn_alive(GPid pid, const char *binary);
/* An adopted worker (not our child) still runs: @pid is @binary, and its @port (NULL: none)
 * did not refuse it as an impostor. */
bool vn_spawn_adopted_alive(VnPort *port, GPid pid, const char *binary);
/* A source (its id) that calls @fn(@data) once @pid has exited, heard through a pidfd
 * (pidfd_open(2)): for a worker adopted after a restart, which is not our child.  0 when no
 * pidfd could be had (the process is gone already, or the kernel has none): look another
 * way.  @destroy(@data) when the source goes. */
guint vn_spawn_watch_exit(GPid pid, GSourceFunc fn, void *data, GDestroyNotify destroy);
/* Some thirty counters, a few KiB; a longer file is not one the worker
 * wrote, and is not parsed. */
#define VN_SPAWN_MAX_STATS (64 * 1024)
/* SIGTERM, then SIGKILL this much later. */
#define VN_SPAWN_STOP_TIMEOUT_MS 5000
#define VN_SPAWN_STATS_TIMEOUT_MS 1000

#endif /* VN_SPAWN_PROCS_H */
