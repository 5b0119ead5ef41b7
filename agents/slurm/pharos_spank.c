/*
 * pharos_spank.so: the Pharos SPANK plugin for Slurm (spank(8), slurm/spank.h).
 *
 * What it does, and where Slurm runs it:
 *  - slurm_spank_job_prolog (slurmd, as root, before the job's first step on the node, so before
 *    its first I/O), on the allocation's first node only (the batch host, which starts the job's
 *    steps): records the job's start on Pharos (POST {api}/v1/jobs/{id}/events: Slurm job id,
 *    name, user, node list, task count) and asks for the job's DFRA forwarding-node decision with
 *    apply=true (GET {api}/v1/hints/jobs/{id}), which the Pharos control loop pushes to every
 *    compute node's FUSE mount at once (Ji et al., FAST'19: decided at dispatch from the job's
 *    history). A job on N nodes costs the API one start, one hint and one end, not N of each.
 *  - slurm_spank_task_post_fork (slurmstepd, as root, after it forked each task and before the
 *    task may exec; the plugin's own I/O stays out of the job): moves the task into <cgroup2>/<cgroup_parent>/job_<id>/step_<step>/rank_<global task id> (the batch
 *    script into job_<id>/batch), the cgroup layout from which the eBPF agent and the mount take
 *    the job id and (for ranks that already exited) the rank; see proto/attribution for the rule.
 *  - slurm_spank_job_epilog (slurmd, as root, after the job): on the first node, records the job's
 *    end (which makes the control loop release the job's reserved forwarding nodes); on every
 *    node, removes the job's cgroups 5 s later (the agent resolves the cgroups of the job's last
 *    records first).
 *
 * Pharos never fails a job: when the API is down or slow (bounded by timeout=), the hint or the
 * event is skipped, logged in slurmd's log and counted in <statedir>/counters (read it with
 * `pharos slurm status`); a task that cannot be moved into its cgroup runs untraced, counted.
 *
 * plugstack.conf options (all optional):
 *   api=URL            Pharos API (default http://127.0.0.1:8400)
 *   cgroup_parent=DIR  cgroup under the cgroup v2 mount that the agent watches (default pharos);
 *                      %n stands for the Slurm node name (SLURMD_NODENAME, which slurmd sets for
 *                      the job prolog and epilog and slurmstepd in its own environment; else the
 *                      short host name) and %% for a '%': cgroup_parent=pharos/%n puts each node's
 *                      tasks under pharos/<node>, for nodes that share one cgroup tree (several
 *                      slurmd on one host, as multiple-slurmd or a test rig runs them)
 *   timeout=SECONDS    bound on each API request (default 2)
 *   hint=yes|no        ask for and apply the DFRA hint (default yes)
 *   statedir=DIR       where the counters file lives (default /var/lib/pharos/slurm)
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
#include <unistd.h>

#include <curl/curl.h>
#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(pharos, 1);

#define PH_LOG "pharos: "

static char opt_api[512] = "http://127.0.0.1:8400";
static char opt_parent[256] = "pharos";
static char opt_statedir[PATH_MAX] = "/var/lib/pharos/slurm";
static char opt_token[PATH_MAX] = "";
static long opt_timeout_ms = 2000;
static int opt_hint = 1;

int slurm_spank_init(spank_t sp, int ac, char **av);
int slurm_spank_job_prolog(spank_t sp, int ac, char **av);
int slurm_spank_job_epilog(spank_t sp, int ac, char **av);
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av);

/* ---- options ------------------------------------------------------------------------------ */

static int parse_options(int ac, char **av) {
    for (int i = 0; i < ac; i++) {
        const char *a = av[i];
        if (!strncmp(a, "api=", 4)) {
            snprintf(opt_api, sizeof opt_api, "%s", a + 4);
            size_t n = strlen(opt_api);
            while (n && opt_api[n - 1] == '/') opt_api[--n] = 0;
        } else if (!strncmp(a, "cgroup_parent=", 14)) {
            snprintf(opt_parent, sizeof opt_parent, "%s", a + 14);
            for (const char *p = strchr(opt_parent, '%'); p; p = strchr(p + 2, '%')) {
                if (p[1] != 'n' && p[1] != '%') {
                    slurm_error(PH_LOG "bad option %s (placeholders: %%n the node name, %%%% a '%%')", a);
                    return -1;
                }
            }
        } else if (!strncmp(a, "statedir=", 9)) {
            snprintf(opt_statedir, sizeof opt_statedir, "%s", a + 9);
        } else if (!strncmp(a, "token=", 6)) {
            snprintf(opt_token, sizeof opt_token, "%s", a + 6);
        } else if (!strncmp(a, "timeout=", 8)) {
            double s = atof(a + 8);
            if (s <= 0) {
                slurm_error(PH_LOG "bad option %s (seconds > 0)", a);
                return -1;
            }
            opt_timeout_ms = (long)(s * 1000);
        } else if (!strncmp(a, "hint=", 5)) {
            opt_hint = !strcmp(a + 5, "yes") || !strcmp(a + 5, "1") || !strcmp(a + 5, "true");
        } else {
            slurm_error(PH_LOG "unknown option %s (api=, cgroup_parent=, timeout=, hint=, statedir=, token=)", a);
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

static const char *COUNTERS[] = {"events_sent",  "events_failed",  "hints_applied", "hints_skipped",
                                 "tasks_placed", "tasks_unplaced", NULL};

static int mkdirs(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    }
    return (mkdir(buf, 0755) && errno != EEXIST) ? -1 : 0;
}

static void count(const char *name) {
    char path[PATH_MAX + 16];
    if (mkdirs(opt_statedir)) {
        slurm_error(PH_LOG "cannot create statedir %s: %m", opt_statedir);
        return;
    }
    snprintf(path, sizeof path, "%s/counters", opt_statedir);
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

/* ---- HTTP to the Pharos API (libcurl) ------------------------------------------------------- */

struct body {
    char buf[2048];
    size_t len;
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *userp) {
    struct body *b = userp;
    size_t n = size * nmemb, room = sizeof b->buf - 1 - b->len;
    memcpy(b->buf + b->len, data, n < room ? n : room);
    b->len += n < room ? n : room;
    b->buf[b->len] = 0;
    return n;
}

/* Returns the HTTP status (0: no answer); the reply's first bytes (or curl's error) in `reply`. */
static long http(const char *method, const char *url, const char *json, char *reply, size_t reply_len) {
    CURL *c = curl_easy_init();
    struct body b = {.len = 0};
    struct curl_slist *h = NULL;
    long status = 0;
    char auth[600];
    if (!c) {
        snprintf(reply, reply_len, "curl_easy_init failed");
        return 0;
    }
    b.buf[0] = 0;
    if (opt_token[0]) {
        FILE *f = fopen(opt_token, "r");
        char tok[512] = "";
        if (f && fgets(tok, sizeof tok, f)) {
            tok[strcspn(tok, "\r\n")] = 0;
            snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
            h = curl_slist_append(h, auth);
        }
        if (f) fclose(f);
    }
    if (json) {
        h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    }
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, opt_timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, opt_timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK) {
        snprintf(reply, reply_len, "%s", curl_easy_strerror(rc));
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        snprintf(reply, reply_len, "%s", b.buf);
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return status;
}

/* JSON string body of `s` (quotes, backslashes and control characters escaped). */
static void json_str(char *dst, size_t n, const char *s) {
    size_t o = 0;
    for (; s && *s && o + 7 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            dst[o++] = '\\';
            dst[o++] = ch;
        } else if (ch < 0x20) {
            o += snprintf(dst + o, n - o, "\\u%04x", ch);
        } else {
            dst[o++] = ch;
        }
    }
    dst[o] = 0;
}

static const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
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

static void send_event(uint32_t job, const char *kind, const char *name, const char *user, const char *nodes,
                       long tasks, long exit_code) {
    char url[700], body[4096], reply[512], jname[600], juser[300], jnodes[1200];
    json_str(jname, sizeof jname, name);
    json_str(juser, sizeof juser, user);
    json_str(jnodes, sizeof jnodes, nodes);
    snprintf(url, sizeof url, "%s/v1/jobs/%u/events", opt_api, job);
    snprintf(body, sizeof body,
             "{\"kind\":\"%s\",\"name\":\"%s\",\"user\":\"%s\",\"host\":\"%s\",\"ranks\":%ld,\"exit_code\":%ld}",
             kind, jname, juser, jnodes, tasks, exit_code);
    long st = http("POST", url, body, reply, sizeof reply);
    if (st / 100 == 2) {
        count("events_sent");
    } else {
        slurm_error(PH_LOG "job %u: %s event not recorded (%s: HTTP %ld %.200s)", job, kind, url, st, reply);
        count("events_failed");
    }
}

static void ask_hint(uint32_t job, const char *name, const char *user) {
    char url[1400], reply[1024];
    CURL *c = curl_easy_init();
    char *ename = c ? curl_easy_escape(c, name, 0) : NULL;
    char *euser = c ? curl_easy_escape(c, user, 0) : NULL;
    snprintf(url, sizeof url, "%s/v1/hints/jobs/%u?apply=true&name=%s&user=%s", opt_api, job, ename ? ename : "",
             euser ? euser : "");
    curl_free(ename);
    curl_free(euser);
    if (c) curl_easy_cleanup(c);
    long st = http("GET", url, NULL, reply, sizeof reply);
    if (st == 200 && !strstr(reply, "\"status\":\"failed\"")) {
        slurm_info(PH_LOG "job %u: forwarding hint %.300s", job, reply);
        count("hints_applied");
    } else {
        slurm_error(PH_LOG "job %u: hint skipped, default mapping (%s: HTTP %ld %.200s)", job, url, st, reply);
        count("hints_skipped");
    }
}

/* ---- cgroups -------------------------------------------------------------------------------- */

/* The cgroup v2 mount point from /proc/mounts (hybrid: /sys/fs/cgroup/unified). */
static int cgroup2_mount(char *out, size_t n) {
    FILE *f = fopen("/proc/mounts", "r");
    char dev[256], dir[PATH_MAX], type[64];
    int found = -1;
    if (!f) return -1;
    while (fscanf(f, "%255s %4095s %63s %*[^\n]", dev, dir, type) == 3) {
        if (!strcmp(type, "cgroup2")) {
            snprintf(out, n, "%s", dir);
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

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
    for (const char *p = opt_parent; *p; p++) {
        const char *add = p;
        size_t len = 1;
        if (p[0] == '%' && (p[1] == 'n' || p[1] == '%')) {
            if (p[1] == 'n' && !*node && node_name(node, sizeof node)) {
                slurm_error(PH_LOG "cgroup_parent=%s: this node's name is unknown", opt_parent);
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

static int job_cgroup(uint32_t job, char *out, size_t n) {
    char root[PATH_MAX], parent[PATH_MAX];
    if (cgroup2_mount(root, sizeof root) || cgroup_parent(parent, sizeof parent)) return -1;
    if ((size_t)snprintf(out, n, "%s/%s/job_%u", root, parent, job) >= n) return -1;
    return 0;
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av) {
    (void)ac;
    (void)av;
    uint32_t job, step, rank;
    pid_t pid;
    char dir[PATH_MAX], procs[PATH_MAX + 32], text[32];
    if (!spank_remote(sp)) return 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_TASK_GLOBAL_ID, &rank) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || job_cgroup(job, dir, sizeof dir)) {
        slurm_error(PH_LOG "task not placed: no job/step/task id or pid, no cgroup v2 mount or no cgroup_parent");
        count("tasks_unplaced");
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
    if (mkdirs(dir) == 0) fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, n) != n) {
        slurm_error(PH_LOG "job %u task %u (pid %d) not placed in %s: %m (it runs untraced)", job, rank, (int)pid, dir);
        count("tasks_unplaced");
    } else {
        count("tasks_placed");
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
    if (!first_node()) return 0; /* the first node speaks for the job */
    job_user(sp, user, sizeof user);
    job_name(job, name, sizeof name);
    long tasks = atol(env_or("SLURM_JOB_NTASKS", "0"));
    curl_global_init(CURL_GLOBAL_DEFAULT);
    send_event(job, "start", name, user, env_or("SLURM_NODELIST", ""), tasks, 0);
    if (!opt_hint) return 0;
    if (!*name) {
        slurm_error(PH_LOG "job %u: hint skipped: the job's name is unknown", job);
        count("hints_skipped");
    } else {
        ask_hint(job, name, user);
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
    char user[256], name[256], dir[PATH_MAX];
    if (parse_options(ac, av)) return 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
    if (first_node()) {
        job_user(sp, user, sizeof user);
        job_name(job, name, sizeof name); /* the end event names the job too: history matches on it */
        long exit_code = atol(env_or("SLURM_JOB_EXIT_CODE2", "0"));
        curl_global_init(CURL_GLOBAL_DEFAULT);
        send_event(job, "end", name, user, env_or("SLURM_NODELIST", ""), atol(env_or("SLURM_JOB_NTASKS", "0")),
                   exit_code);
    }
    if (job_cgroup(job, dir, sizeof dir) == 0) remove_later(dir, 5);
    return 0;
}
