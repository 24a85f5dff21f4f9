/*
 * Stopping the workers a stopped daemon left (vfio-ntbd --stop-workers, the units'
 * ExecStopPost= on `systemctl stop`): workers outlive their daemon by design (a restart or
 * a crash adopts them), so a stop that is meant for good has to end them itself.  They are
 * found in the unit's cgroup, where systemd's KillMode=process left them.
 */
#ifndef VN_STOPWORKERS_H
#define VN_STOPWORKERS_H

#include <glib.h>

/* A managed function's lender worker keeps its driver in RUN_DIR/lend-NAME-driver (the
 * daemon names it: lenders.c); what such files name is given back here. */
#define VN_LENDERS_KEPT_PREFIX "lend-"
#define VN_LENDERS_KEPT_SUFFIX "-driver"

/* How long the workers get to fence their devices and give managed functions back. */
#define VN_STOPWORKERS_WAIT_MS 20000

/* The cgroup.procs file of this process's cgroup (the unified hierarchy's, else systemd's
 * named one), or NULL (none, or the root cgroup: not a unit's). */
char *vn_stopworkers_own_procs(void);
/*
 * The workers (vfio-ntb-lender, vfio-ntb-borrower: their command line's first word) among the
 * pids @procs_path lists, not us: SIGTERM each, then SIGKILL those still there @wait_ms
 * later.  How many there were (*@killed of them needed SIGKILL); -errno when @procs_path
 * cannot be read.
 */
int vn_stopworkers_run(const char *procs_path, unsigned wait_ms, unsigned *killed);
/*
 * Then: the managed functions whose workers could not give them back (they served as the
 * worker user) go back to their drivers (through sysfs at @sys), as the files in @run_dir that such workers keep
 * say (lending/pcibind.h; only regular files of ours, named lend-NAME-driver).  How many
 * went back; *@failed could not (said on stderr, their files left).
 */
unsigned vn_stopworkers_give_back(const char *sys, const char *run_dir, unsigned *failed);

#endif /* VN_STOPWORKERS_H */
