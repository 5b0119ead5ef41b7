/*
 * pharos_cgroup.h: the cgroup v2 side of the Pharos SPANK plugin (pharos_cgroup.c), without
 * Slurm or libcurl, so that a test can compile it alone and call the placement decision.
 *
 * The decision (ph_in_slurm_cgroup): a task that Slurm's cgroup/v2 plugin (proctrack/cgroup or
 * task/cgroup on a unified hierarchy) already put in its job's cgroup stays there; Pharos traces
 * it there (the attribution rule, proto/attribution: job from the job_<id> component, rank from
 * the environment or task_<t>). Any other task is moved into Pharos's own cgroup. On a hybrid
 * host (Slurm's cgroup/v1 plugin) Slurm's job cgroups are in the v1 hierarchies only, so the
 * task's v2 path is not Slurm's and Pharos places it: moving a process in the v2 hierarchy does
 * not change its v1 cgroups (Slurm's limits and accounting stay).
 */
#ifndef PHAROS_CGROUP_H
#define PHAROS_CGROUP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The cgroup v2 mount point from /proc/mounts (a hybrid host: /sys/fs/cgroup/unified) in `out`;
 * 0, or -1 when there is no cgroup2 mount. */
int ph_cgroup2_mount(char *out, size_t n);

/* The cgroup v2 path of process `pid` (its /proc/<pid>/cgroup "0::" line, e.g.
 * "/system.slice/slurmstepd.scope/job_17/step_0/user/task_2") in `out`; 0, or -1 when the
 * file cannot be read or has no v2 line. */
int ph_proc_cgroup_v2(pid_t pid, char *out, size_t n);

/* 1 when the cgroup v2 path `path` (as in /proc/<pid>/cgroup) is Slurm's own cgroup of job
 * `job`: a component "job_<job>" directly followed by a step component "step_<x>" (step_0,
 * step_batch, step_extern, ...), as Slurm's cgroup/v2 plugin lays them out
 * (.../slurmstepd.scope/job_<id>/step_<n>/user/task_<t>, or .../step_<n>/slurm before the task
 * is moved to its task_<t>), and the path is not below Pharos's own `parent` (cgroup_parent,
 * relative to the mount, e.g. "pharos" or "pharos/cn1"), whose layout is the same; else 0. */
int ph_in_slurm_cgroup(const char *path, uint32_t job, const char *parent);

/* mkdir -p with `mode` for the directories it creates; 0, or -1 (errno set). */
int ph_mkdirs(const char *path, mode_t mode);

#endif
