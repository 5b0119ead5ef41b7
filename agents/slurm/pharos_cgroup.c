/*
 * pharos_cgroup.c: cgroup v2 paths for the Pharos SPANK plugin; see pharos_cgroup.h for the
 * placement decision and docs/slurm.md ("Slurm's own cgroups") for the supported modes.
 */
#define _GNU_SOURCE
#include "pharos_cgroup.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ph_cgroup2_mount(char *out, size_t n) {
    FILE *f = fopen("/proc/mounts", "re");
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

int ph_proc_cgroup_v2(pid_t pid, char *out, size_t n) {
    char file[64], line[PATH_MAX + 8];
    int found = -1;
    snprintf(file, sizeof file, "/proc/%d/cgroup", (int)pid);
    FILE *f = fopen(file, "re");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(out, n, "%s", line + 3);
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

/* Whether `path` is `dir` or below it (both as in /proc/<pid>/cgroup: '/'-separated). */
static int below(const char *path, const char *dir) {
    while (*path == '/') path++;
    while (*dir == '/') dir++;
    size_t n = strlen(dir);
    while (n && dir[n - 1] == '/') n--;
    return n && !strncmp(path, dir, n) && (path[n] == 0 || path[n] == '/');
}

int ph_in_slurm_cgroup(const char *path, uint32_t job, const char *parent) {
    char want[32];
    size_t wn = (size_t)snprintf(want, sizeof want, "job_%u", job);
    if (!path || (parent && below(path, parent))) return 0;
    for (const char *c = path; c; c = strchr(c, '/')) {
        while (*c == '/') c++;
        if (strncmp(c, want, wn) || c[wn] != '/') continue;
        const char *step = c + wn + 1;
        if (strcspn(step, "/") > 5 && !strncmp(step, "step_", 5)) return 1;
    }
    return 0;
}

int ph_mkdirs(const char *path, mode_t mode) {
    char buf[PATH_MAX];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, mode) && errno != EEXIST) return -1;
            *p = '/';
        }
    }
    return (mkdir(buf, mode) && errno != EEXIST) ? -1 : 0;
}
