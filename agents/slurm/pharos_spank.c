/*
 * pharos_spank.so: the Pharos SPANK plugin for Slurm (spank(8), slurm/spank.h). This file holds
 * Slurm's hooks, the options and the counters; pharos_api.c the API calls and the event spool;
 * pharos_cgroup.c the cgroup v2 paths (pharos_spank.h, pharos_cgroup.h).
 *
 * What it does, and where Slurm runs it:
 *  - slurm_spank_job_prolog (slurmd, as root, before the job's first step on the node, so before
 *    its first I/O), on the allocation's first node only (the batch host, which starts the job's
 *    steps): records the job's start on Pharos (POST {api}/v1/jobs/{id}/events: Slurm job id,
 *    name, user, node list, task count, time) and claims the job's DFRA forwarding-node decision
 *    with apply=true (POST {api}/v1/hints/jobs/{id}), which the Pharos control loop pushes to
 *    every compute node's FUSE mount at once (Ji et al., FAST'19: decided at dispatch from the
 *    job's history). A job on N nodes costs the API one start, one hint and one end, not N.
 *  - slurm_spank_task_post_fork (slurmstepd, as root, after it forked each task and before the
 *    task may exec; the plugin's own I/O stays out of the job): a task that Slurm's cgroup/v2
 *    plugin already put in its job's cgroup (.../job_<id>/step_<n>/...) stays there (Slurm's
 *    limits and accounting; the agent traces it there); any other task is moved into
 *    <cgroup2>/<cgroup_parent>/job_<id>/step_<step>/rank_<global task id> (the batch script into
 *    job_<id>/batch), the cgroup layout from which the eBPF agent and the mount take the job id
 *    and (for ranks that already exited) the rank; see proto/attribution for the rule.
 *  - slurm_spank_job_epilog (slurmd, as root, after the job): on the first node, records the job's
 *    end (which makes the control loop release the job's reserved forwarding nodes); on every
 *    node, removes the job's cgroups 5 s later (the agent resolves the cgroups of the job's last
 *    records first).
 *  Every job prolog and epilog first sends again the job events spooled on its node.
 *
 * Pharos never fails a job: when the API is down or slow (bounded by timeout=), the hint is
 * skipped and a job event is spooled in <statedir>/spool, to be sent again, with its own time, by
 * the plugin's next job prolog or epilog on the node; all of it is logged in slurmd's log and
 * counted in <statedir>/counters (read it with `pharos slurm status`); a task that cannot be
 * moved into its cgroup runs untraced, counted.
 *
 *  - --pharos-node-local=MOUNT (a user option of srun/sbatch/salloc): slurm_spank_task_init (in
 *    each task, as the job's user, before it execs) makes the task's node-local directory
 *    MOUNT/.nodelocal/<job id>/<global task id> on the pharos-mount at MOUNT (the forwarding
 *    layer puts it on the storage target the rank id hashes to, and attaches it to this compute
 *    node: forwarder/README.md "Node-local mode") and names it in PHAROS_NODELOCAL. A directory
 *    that cannot be made is logged and the task runs without it (Pharos never fails a job).
 *
 * plugstack.conf options (all optional):
 *   api=URL            Pharos API (default http://127.0.0.1:8400)
 *   socket=PATH        reach the API over its Unix socket (e.g. <API state dir>/api.sock; the
 *                      URL's host is then ignored): the listener takes root's peer credentials
 *                      as the admin identity, no token needed (default: TCP)
 *   cgroup_parent=DIR  cgroup under the cgroup v2 mount that the agent watches (default pharos);
 *                      %n stands for the Slurm node name (SLURMD_NODENAME, which slurmd sets for
 *                      the job prolog and epilog and slurmstepd in its own environment; else the
 *                      short host name) and %% for a '%': cgroup_parent=pharos/%n puts each node's
 *                      tasks under pharos/<node>, for nodes that share one cgroup tree (several
 *                      slurmd on one host, as multiple-slurmd or a test rig runs them)
 *   timeout=SECONDS    bound on each API request (default 2)
 *   hint=yes|no        ask for and apply the DFRA hint (default yes)
 *   statedir=DIR       where the counters file and the spool live (default /var/lib/pharos/slurm)
 *   token=FILE         file holding an API token sent as "Authorization: Bearer" (default none)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "pharos_cgroup.h"
#include "pharos_spank.h"

SPANK_PLUGIN(pharos, 1);

struct ph_options ph_opt = {
    .api = "http://127.0.0.1:8400",
    .socket = "",
    .parent = "pharos",
    .statedir = "/var/lib/pharos/slurm",
    .token = "",
    .timeout_ms = 2000,
    .hint = 1,
};

int slurm_spank_init(spank_t sp, int ac, char **av);
int slurm_spank_job_prolog(spank_t sp, int ac, char **av);
int slurm_spank_job_epilog(spank_t sp, int ac, char **av);
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av);
int slurm_spank_task_init(spank_t sp, int ac, char **av);

/* ---- --pharos-node-local=MOUNT (issue 27, item 2) ----------------------------------------- */

static char node_local_mount[PATH_MAX];

static int node_local_opt(int val, const char *optarg, int remote) {
    (void)val;
    (void)remote;
    if (!optarg || optarg[0] != '/') {
        slurm_error(PH_LOG "--pharos-node-local wants the absolute path of a pharos-mount");
        return -1;
    }
    snprintf(node_local_mount, sizeof node_local_mount, "%s", optarg);
    return 0;
}

struct spank_option spank_options[] = {
    {"pharos-node-local", "MOUNT",
     "Give each task the node-local directory MOUNT/.nodelocal/<job>/<task id> of the pharos-mount "
     "at MOUNT (PHAROS_NODELOCAL)",
     1, 0, node_local_opt},
    SPANK_OPTIONS_TABLE_END,
};

int slurm_spank_task_init(spank_t sp, int ac, char **av) {
    (void)ac;
    (void)av;
    uint32_t job = 0, rank = 0;
    char dir[PATH_MAX + 64];
    if (!node_local_mount[0] || !spank_remote(sp)) return 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_TASK_GLOBAL_ID, &rank) != ESPANK_SUCCESS)
        return 0;
    snprintf(dir, sizeof dir, "%s/.nodelocal/%u/%u", node_local_mount, job, rank);
    if (ph_mkdirs(dir, 0755)) {
        slurm_error(PH_LOG "job %u task %u: cannot make its node-local directory %s: %m", job, rank, dir);
        return 0;
    }
    if (spank_setenv(sp, "PHAROS_NODELOCAL", dir, 1) != ESPANK_SUCCESS)
        slurm_error(PH_LOG "job %u task %u: cannot set PHAROS_NODELOCAL", job, rank);
    return 0;
}

/* ---- options ------------------------------------------------------------------------------ */

static int parse_options(int ac, char **av) {
    for (int i = 0; i < ac; i++) {
        const char *a = av[i];
        if (!strncmp(a, "api=", 4)) {
            snprintf(ph_opt.api, sizeof ph_opt.api, "%s", a + 4);
            size_t n = strlen(ph_opt.api);
            while (n && ph_opt.api[n - 1] == '/') ph_opt.api[--n] = 0;
        } else if (!strncmp(a, "cgroup_parent=", 14)) {
            snprintf(ph_opt.parent, sizeof ph_opt.parent, "%s", a + 14);
            for (const char *p = strchr(ph_opt.parent, '%'); p; p = strchr(p + 2, '%')) {
                if (p[1] != 'n' && p[1] != '%') {
                    slurm_error(PH_LOG "bad option %s (placeholders: %%n the node name, %%%% a '%%')", a);
                    return -1;
                }
            }
        } else if (!strncmp(a, "statedir=", 9)) {
            snprintf(ph_opt.statedir, sizeof ph_opt.statedir, "%s", a + 9);
        } else if (!strncmp(a, "socket=", 7)) {
            snprintf(ph_opt.socket, sizeof ph_opt.socket, "%s", a + 7);
        } else if (!strncmp(a, "token=", 6)) {
            snprintf(ph_opt.token, sizeof ph_opt.token, "%s", a + 6);
        } else if (!strncmp(a, "timeout=", 8)) {
            double s = atof(a + 8);
            if (s <= 0) {
                slurm_error(PH_LOG "bad option %s (seconds > 0)", a);
                return -1;
            }
            ph_opt.timeout_ms = (long)(s * 1000);
        } else if (!strncmp(a, "hint=", 5)) {
            ph_opt.hint = !strcmp(a + 5, "yes") || !strcmp(a + 5, "1") || !strcmp(a + 5, "true");
        } else {
            slurm_error(PH_LOG "unknown option %s (api=, socket=, cgroup_parent=, timeout=, hint=, statedir=, token=)", a);
            return -1;
        }
    }
    return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
    (void)sp;
    return parse_options(ac, av) ? -1 : 0;
}

/* ---- counters: <statedir>/counters, "name value" lines, updated under flock ---------------- */

static const char *COUNTERS[] = {"events_sent",   "events_failed", "spooled",        "resent",
                                 "dropped",       "hints_applied", "hints_skipped",  "tasks_placed",
                                 "tasks_unplaced", "tasks_in_slurm_cgroup", NULL};

void ph_count(const char *name) {
    char path[PATH_MAX + 16];
    if (ph_mkdirs(ph_opt.statedir, 0755)) {
        slurm_error(PH_LOG "cannot create statedir %s: %m", ph_opt.statedir);
        return;
    }
    snprintf(path, sizeof path, "%s/counters", ph_opt.statedir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        slurm_error(PH_LOG "cannot open %s: %m", path);
        return;
    }
    if (flock(fd, LOCK_EX) == 0) {
        long v[16] = {0};
        char text[1024] = {0}, *save = NULL;
        ssize_t n = pread(fd, text, sizeof text - 1, 0);
        for (char *line = n > 0 ? strtok_r(text, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
            char key[64];
            long val;
            if (sscanf(line, "%63s %ld", key, &val) == 2)
                for (int i = 0; COUNTERS[i]; i++)
                    if (!strcmp(key, COUNTERS[i])) v[i] = val;
        }
        char out[1024];
        int len = 0;
        for (int i = 0; COUNTERS[i]; i++)
            len += snprintf(out + len, sizeof out - len, "%s %ld\n", COUNTERS[i], v[i] + !strcmp(name, COUNTERS[i]));
        if (pwrite(fd, out, len, 0) != len || ftruncate(fd, len)) slurm_error(PH_LOG "cannot write %s: %m", path);
        flock(fd, LOCK_UN);
    }
    close(fd);
}

/* The job's user name: SLURM_JOB_USER, else the passwd entry of the job's uid. */
static void job_user(spank_t sp, char *out, size_t n) {
    uid_t uid;
    const char *u = getenv("SLURM_JOB_USER");
    out[0] = 0;
    if (u && *u) {
        snprintf(out, n, "%s", u);
    } else if (spank_get_item(sp, S_JOB_UID, &uid) == ESPANK_SUCCESS) {
        struct passwd *pw = getpwuid(uid);
        snprintf(out, n, "%s", pw ? pw->pw_name : "");
    }
}

static const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static long long wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- cgroups -------------------------------------------------------------------------------- */

/* The Slurm name of this node: SLURMD_NODENAME (slurmd sets it in the job prolog's and epilog's
 * environment, slurmstepd in its own), else the host name up to its first dot. */
static int node_name(char *out, size_t n) {
    const char *v = getenv("SLURMD_NODENAME");
    if (v && *v) {
        snprintf(out, n, "%s", v);
    } else {
        if (gethostname(out, n)) return -1;
        out[n - 1] = 0;
        out[strcspn(out, ".")] = 0;
    }
    return *out && !strchr(out, '/') && strcmp(out, ".") && strcmp(out, "..") ? 0 : -1;
}

/* Whether this node is the first of the job's allocation (SLURM_NODELIST, expanded by libslurm's
 * hostlist functions: Slurm's batch host), or the list or the node's name is unknown. */
static int first_node(void) {
    const char *list = getenv("SLURM_NODELIST");
    char me[256];
    if (!list || !*list || node_name(me, sizeof me)) return 1;
    hostlist_t hl = slurm_hostlist_create(list);
    if (!hl) return 1;
    char *first = slurm_hostlist_shift(hl);
    int yes = !first || strcmp(first, me) == 0;
    free(first);
    slurm_hostlist_destroy(hl);
    return yes;
}

/* cgroup_parent with %n (the node name) and %% expanded. */
static int cgroup_parent(char *out, size_t n) {
    char node[256] = "";
    size_t o = 0;
    for (const char *p = ph_opt.parent; *p; p++) {
        const char *add = p;
        size_t len = 1;
        if (p[0] == '%' && (p[1] == 'n' || p[1] == '%')) {
            if (p[1] == 'n' && !*node && node_name(node, sizeof node)) {
                slurm_error(PH_LOG "cgroup_parent=%s: this node's name is unknown", ph_opt.parent);
                return -1;
            }
            add = p[1] == 'n' ? node : "%";
            len = strlen(add);
            p++;
        }
        if (o + len >= n) return -1;
        memcpy(out + o, add, len);
        o += len;
    }
    out[o] = 0;
    return 0;
}

/* <cgroup2 mount>/<cgroup_parent>/job_<job> in `out`, the expanded cgroup_parent in `parent`. */
static int job_cgroup(uint32_t job, char *out, size_t n, char *parent, size_t pn) {
    char root[PATH_MAX];
    if (ph_cgroup2_mount(root, sizeof root) || cgroup_parent(parent, pn)) return -1;
    if ((size_t)snprintf(out, n, "%s/%s/job_%u", root, parent, job) >= n) return -1;
    return 0;
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av) {
    (void)ac;
    (void)av;
    uint32_t job, step, rank;
    pid_t pid;
    char dir[PATH_MAX], parent[PATH_MAX], now[PATH_MAX], procs[PATH_MAX + 32], text[32];
    if (!spank_remote(sp)) return 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_TASK_GLOBAL_ID, &rank) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS ||
        job_cgroup(job, dir, sizeof dir, parent, sizeof parent)) {
        slurm_error(PH_LOG "task not placed: no job/step/task id or pid, no cgroup v2 mount or no cgroup_parent");
        ph_count("tasks_unplaced");
        return 0;
    }
    /* Slurm's cgroup/v2 plugin placed it already: leave it (limits, accounting); traced there */
    if (ph_proc_cgroup_v2(pid, now, sizeof now) == 0 && ph_in_slurm_cgroup(now, job, parent)) {
        slurm_info(PH_LOG "job %u task %u (pid %d) stays in Slurm's cgroup %s", job, rank, (int)pid, now);
        ph_count("tasks_in_slurm_cgroup");
        return 0;
    }
    size_t l = strlen(dir);
    if (step == SLURM_BATCH_SCRIPT)
        snprintf(dir + l, sizeof dir - l, "/batch");
    else
        snprintf(dir + l, sizeof dir - l, "/step_%u/rank_%u", step, rank);
    snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
    int n = snprintf(text, sizeof text, "%d", (int)pid);
    int fd = -1;
    if (ph_mkdirs(dir, 0755) == 0) fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, n) != n) {
        slurm_error(PH_LOG "job %u task %u (pid %d) not placed in %s: %m (it runs untraced)", job, rank, (int)pid, dir);
        ph_count("tasks_unplaced");
    } else {
        ph_count("tasks_placed");
    }
    if (fd >= 0) close(fd);
    return 0;
}

/* ---- job prolog and epilog ------------------------------------------------------------------ */

/* The job's name from the controller (slurm_load_job: slurmd's prolog environment has no
 * SLURM_JOB_NAME); the libslurm symbols resolve in slurmd/slurmstepd, which load this plugin. */
static void job_name(uint32_t job, char *out, size_t n) {
    job_info_msg_t *msg = NULL;
    out[0] = 0;
    if (slurm_load_job(&msg, job, SHOW_DETAIL) == SLURM_SUCCESS && msg && msg->record_count > 0 &&
        msg->job_array[0].name)
        snprintf(out, n, "%s", msg->job_array[0].name);
    else
        slurm_error(PH_LOG "job %u: cannot read its name from slurmctld: %s", job, slurm_strerror(slurm_get_errno()));
    if (msg) slurm_free_job_info_msg(msg);
}

int slurm_spank_job_prolog(spank_t sp, int ac, char **av) {
    uint32_t job;
    char user[256], name[256];
    if (parse_options(ac, av)) return 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
    long long t = wall_ns();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!first_node()) { /* the first node speaks for the job; this one only sends its spool */
        ph_resend_spool();
        return 0;
    }
    job_user(sp, user, sizeof user);
    job_name(job, name, sizeof name);
    long tasks = atol(env_or("SLURM_JOB_NTASKS", "0"));
    ph_send_event(job, "start", name, user, env_or("SLURM_NODELIST", ""), tasks, 0, t);
    if (!ph_opt.hint) return 0;
    if (!*name) {
        slurm_error(PH_LOG "job %u: hint skipped: the job's name is unknown", job);
        ph_count("hints_skipped");
    } else {
        ph_ask_hint(job, name, user, tasks);
    }
    return 0;
}

static int rmdir_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    if (flag == FTW_DP) rmdir(path);
    return 0;
}

/* Removes the job's cgroups (directories only, deepest first) `delay_s` later, in a detached
 * process, so that the agent has resolved the cgroups of the job's last records by then. */
static void remove_later(const char *dir, unsigned delay_s) {
    pid_t pid = fork();
    if (pid < 0) {
        slurm_error(PH_LOG "cannot remove %s: fork: %m", dir);
        return;
    }
    if (pid > 0) {
        waitpid(pid, NULL, 0);
        return;
    }
    setsid();
    if (fork() == 0) {
        sleep(delay_s);
        nftw(dir, rmdir_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    _exit(0);
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av) {
    uint32_t job;
    char user[256], name[256], dir[PATH_MAX], parent[PATH_MAX];
    if (parse_options(ac, av)) return 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
    long long t = wall_ns();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (first_node()) {
        job_user(sp, user, sizeof user);
        job_name(job, name, sizeof name); /* the end event names the job too: history matches on it */
        long exit_code = atol(env_or("SLURM_JOB_EXIT_CODE2", "0"));
        ph_send_event(job, "end", name, user, env_or("SLURM_NODELIST", ""), atol(env_or("SLURM_JOB_NTASKS", "0")),
                      exit_code, t);
    } else {
        ph_resend_spool();
    }
    if (job_cgroup(job, dir, sizeof dir, parent, sizeof parent) == 0) remove_later(dir, 5);
    return 0;
}
