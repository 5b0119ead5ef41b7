/*
 * pharos_api.c: the Pharos SPANK plugin's calls to the Pharos API (libcurl; over TCP to api=, or
 * over the API's Unix socket with socket=, whose listener takes root's peer credentials as the
 * admin identity, so no token is needed) and the spool of job events the API did not accept.
 *
 * The spool, <statedir>/spool (mode 0700, root's): one file per event, written atomically (a
 * temporary file in the folder, fsync, renamed), named <time_ns, 20 digits>-<job>-<kind>.json so
 * that names sort oldest first; its first line is the request path (/v1/jobs/<id>/events), its
 * second the JSON body, which carries the event's own time (time_ns), so a job's start or end sent
 * again later keeps the time it happened. ph_resend_spool sends them again at the plugin's next
 * job prolog or epilog on the node (bounded: PH_RESEND_MAX events, timeout= seconds).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <slurm/spank.h>

#include "pharos_cgroup.h"
#include "pharos_spank.h"

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

/* `method` {api}`path` with the JSON body `json` (NULL: none; "" an empty POST). Returns the HTTP
 * status (0: no answer); the reply's first bytes (or curl's error) in `reply`. */
static long http(const char *method, const char *path, const char *json, char *reply, size_t reply_len) {
    CURL *c = curl_easy_init();
    struct body b = {.len = 0};
    struct curl_slist *h = NULL;
    long status = 0;
    char auth[600], url[4096];
    if (!c) {
        snprintf(reply, reply_len, "curl_easy_init failed");
        return 0;
    }
    b.buf[0] = 0;
    snprintf(url, sizeof url, "%s%s", ph_opt.api, path);
    if (ph_opt.token[0]) {
        FILE *f = fopen(ph_opt.token, "re");
        char tok[512] = "";
        if (f && fgets(tok, sizeof tok, f)) {
            tok[strcspn(tok, "\r\n")] = 0;
            snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
            h = curl_slist_append(h, auth);
        }
        if (f) fclose(f);
    }
    if (json) {
        if (*json) h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    }
    if (ph_opt.socket[0]) curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, ph_opt.socket);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ph_opt.timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ph_opt.timeout_ms);
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

/* A status after which the same request may succeed later: no answer or a timeout (0), 5xx,
 * 401/403 (the token file is fixed), 408, 429. Any other non-2xx can never succeed. */
static int retryable(long st) { return st == 0 || st >= 500 || st == 401 || st == 403 || st == 408 || st == 429; }

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

/* ---- the spool ------------------------------------------------------------------------------ */

/* <statedir>/spool (or its `sub` folder), created 0700; refused unless it is a directory of
 * this (root) user, not a link. 0, or -1 (logged). */
static int spool_dir(const char *sub, char *out, size_t n) {
    struct stat st;
    if ((size_t)snprintf(out, n, "%s/spool%s%s", ph_opt.statedir, sub ? "/" : "", sub ? sub : "") >= n) return -1;
    if (ph_mkdirs(out, 0700)) {
        slurm_error(PH_LOG "cannot create %s: %m", out);
        return -1;
    }
    if (lstat(out, &st) || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || chmod(out, 0700)) {
        slurm_error(PH_LOG "%s: not a folder of uid %d only (events are not spooled)", out, (int)geteuid());
        return -1;
    }
    return 0;
}

static int is_event_file(const struct dirent *e) {
    size_t n = strlen(e->d_name);
    return e->d_name[0] != '.' && n > 5 && !strcmp(e->d_name + n - 5, ".json");
}

/* Writes the event atomically into the spool (sub NULL) or its rejected/ folder. 0, or -1. */
static int spool_write(const char *sub, const char *path, const char *body, long long time_ns, uint32_t job,
                       const char *kind) {
    char dir[PATH_MAX], tmp[PATH_MAX + 32], name[PATH_MAX + 96];
    struct dirent **list = NULL;
    if (spool_dir(sub, dir, sizeof dir)) return -1;
    int have = scandir(dir, &list, is_event_file, NULL);
    for (int i = 0; i < have; i++) free(list[i]);
    free(list);
    if (have >= PH_SPOOL_MAX) {
        slurm_error(PH_LOG "%s holds %d events already: job %u's %s event dropped", dir, have, job, kind);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s/.tmp-XXXXXX", dir);
    snprintf(name, sizeof name, "%s/%020lld-%u-%s.json", dir, time_ns, job, kind);
    int fd = mkostemp(tmp, O_CLOEXEC); /* mode 0600 */
    if (fd < 0) {
        slurm_error(PH_LOG "cannot create %s: %m", tmp);
        return -1;
    }
    FILE *f = fdopen(fd, "w");
    int ok = f && fprintf(f, "%s\n%s\n", path, body) > 0 && fflush(f) == 0 && fsync(fd) == 0;
    if (f ? fclose(f) : close(fd)) ok = 0;
    if (!ok || rename(tmp, name)) {
        slurm_error(PH_LOG "cannot write %s: %m", name);
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Keeps an event the API did not accept: spooled (retryable) or moved aside (rejected/). */
static void keep(long st, const char *path, const char *body, long long time_ns, uint32_t job, const char *kind) {
    if (!retryable(st)) {
        spool_write("rejected", path, body, time_ns, job, kind);
        ph_count("dropped");
    } else if (spool_write(NULL, path, body, time_ns, job, kind) == 0) {
        ph_count("spooled");
    } else {
        ph_count("dropped");
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int ph_resend_spool(void) {
    char dir[PATH_MAX], lock[PATH_MAX + 16], file[PATH_MAX + 300], text[8192], reply[512];
    struct dirent **list = NULL;
    int down = 0;
    if (spool_dir(NULL, dir, sizeof dir)) return 0;
    snprintf(lock, sizeof lock, "%s/.lock", dir);
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd < 0 || flock(lfd, LOCK_EX | LOCK_NB)) { /* another prolog or epilog is resending */
        if (lfd >= 0) close(lfd);
        return 0;
    }
    int n = scandir(dir, &list, is_event_file, alphasort), sent = 0;
    double until = now_s() + ph_opt.timeout_ms / 1000.0;
    for (int i = 0; i < n; i++) {
        if (!down && sent < PH_RESEND_MAX && now_s() < until) {
            snprintf(file, sizeof file, "%s/%s", dir, list[i]->d_name);
            FILE *f = fopen(file, "re");
            size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
            if (f) fclose(f);
            text[len] = 0;
            char *body = strchr(text, '\n');
            if (body) *body++ = 0;
            if (!body || strncmp(text, "/v1/", 4)) {
                slurm_error(PH_LOG "%s: not a spooled event, left alone", file);
            } else {
                body[strcspn(body, "\n")] = 0;
                long st = http("POST", text, body, reply, sizeof reply);
                sent++;
                if (st / 100 == 2) {
                    unlink(file);
                    ph_count("resent");
                } else if (retryable(st)) {
                    slurm_error(PH_LOG "spooled %s not sent again (HTTP %ld %.200s)", list[i]->d_name, st, reply);
                    down = st == 0 || st >= 500;
                    if (!down) sent = PH_RESEND_MAX; /* 401/403/408/429: later */
                } else {
                    char aside[PATH_MAX + 320], rej[PATH_MAX];
                    slurm_error(PH_LOG "spooled %s rejected (HTTP %ld %.200s): moved to %s/rejected", list[i]->d_name,
                                st, reply, dir);
                    snprintf(aside, sizeof aside, "%s/rejected/%s", dir, list[i]->d_name);
                    if (spool_dir("rejected", rej, sizeof rej) || rename(file, aside)) unlink(file);
                    ph_count("dropped");
                }
            }
        }
        free(list[i]);
    }
    free(list);
    flock(lfd, LOCK_UN);
    close(lfd);
    return down ? -1 : 0;
}

/* ---- job events and hints ------------------------------------------------------------------- */

void ph_send_event(uint32_t job, const char *kind, const char *name, const char *user, const char *nodes,
                   long tasks, long exit_code, long long time_ns) {
    char path[64], body[4096], reply[512] = "", jname[600], juser[300], jnodes[1200];
    json_str(jname, sizeof jname, name);
    json_str(juser, sizeof juser, user);
    json_str(jnodes, sizeof jnodes, nodes);
    snprintf(path, sizeof path, "/v1/jobs/%u/events", job);
    snprintf(body, sizeof body,
             "{\"kind\":\"%s\",\"name\":\"%s\",\"user\":\"%s\",\"host\":\"%s\",\"ranks\":%ld,\"exit_code\":%ld,"
             "\"time_ns\":%lld}",
             kind, jname, juser, jnodes, tasks, exit_code, time_ns);
    /* the older events first (in order), and not a second wait when the API just did not answer */
    long st = ph_resend_spool() ? 0 : http("POST", path, body, reply, sizeof reply);
    if (st / 100 == 2) {
        ph_count("events_sent");
        return;
    }
    if (st == 0 && !reply[0]) snprintf(reply, sizeof reply, "no answer to the spooled events just before");
    slurm_error(PH_LOG "job %u: %s event not recorded yet (%s%s: HTTP %ld %.200s)", job, kind, ph_opt.api, path, st,
                reply);
    ph_count("events_failed");
    keep(st, path, body, time_ns, job, kind);
}

void ph_ask_hint(uint32_t job, const char *name, const char *user, long tasks) {
    char path[1400], ranks[32] = "", reply[1024];
    CURL *c = curl_easy_init();
    char *ename = c ? curl_easy_escape(c, name, 0) : NULL;
    char *euser = c ? curl_easy_escape(c, user, 0) : NULL;
    if (tasks > 0) snprintf(ranks, sizeof ranks, "&ranks=%ld", tasks);
    snprintf(path, sizeof path, "/v1/hints/jobs/%u?apply=true&name=%s&user=%s%s", job, ename ? ename : "",
             euser ? euser : "", ranks);
    curl_free(ename);
    curl_free(euser);
    if (c) curl_easy_cleanup(c);
    long st = http("POST", path, "", reply, sizeof reply);
    if (st == 200 && !strstr(reply, "\"status\":\"failed\"")) {
        slurm_info(PH_LOG "job %u: forwarding hint %.300s", job, reply);
        ph_count("hints_applied");
    } else {
        slurm_error(PH_LOG "job %u: hint skipped, default mapping (%s%s: HTTP %ld %.200s)", job, ph_opt.api, path, st,
                    reply);
        ph_count("hints_skipped");
    }
}
