/*
 * pharos_spank.h: what the Pharos SPANK plugin's sources share: pharos_spank.c (Slurm's hooks,
 * the options, the counters), pharos_api.c (the Pharos API over libcurl and the spool of job
 * events not yet accepted) and pharos_cgroup.c (cgroup v2 paths, pharos_cgroup.h).
 */
#ifndef PHAROS_SPANK_H
#define PHAROS_SPANK_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define PH_LOG "pharos: "

/* The plugstack.conf options (pharos_spank.c parses them; defaults in the comment there). */
struct ph_options {
    char api[512];           /* api=URL, no trailing '/' */
    char socket[PATH_MAX];   /* socket=PATH: the API's Unix socket ("" = TCP to api's host) */
    char parent[256];        /* cgroup_parent=DIR (%n, %% not yet expanded) */
    char statedir[PATH_MAX]; /* statedir=DIR: counters, spool/ */
    char token[PATH_MAX];    /* token=FILE ("" = none) */
    long timeout_ms;         /* timeout=SECONDS, in ms */
    int hint;                /* hint=yes|no */
};
extern struct ph_options ph_opt;

/* Adds 1 to counter `name` (one of the plugin's COUNTERS) in <statedir>/counters. */
void ph_count(const char *name);

/* The job's start or end: POST {api}/v1/jobs/{job}/events with the wall-clock time `time_ns`
 * of the event; when the API does not accept it (no answer, timeout, 5xx, 401/403/408/429) the
 * event is written to <statedir>/spool and sent again by a later ph_resend_spool. Counted:
 * events_sent, or events_failed and spooled (or dropped: a 4xx that can never succeed, or the
 * spool cannot take it). */
void ph_send_event(uint32_t job, const char *kind, const char *name, const char *user, const char *nodes,
                   long tasks, long exit_code, long long time_ns);

/* Sends the spooled events again, oldest first: at most PH_RESEND_MAX, and none started after
 * timeout= seconds; stops at the first that gets no answer, a timeout or a 5xx (the API is still
 * down). Deletes each accepted one (counted resent); moves one that got a 4xx that can never
 * succeed into <statedir>/spool/rejected (counted dropped). Returns -1 when the API did not
 * answer (the caller then spools its own event at once), else 0. Skipped (0) when another
 * invocation on this node is resending. */
int ph_resend_spool(void);

/* Claims the job's DFRA hint: POST {api}/v1/hints/jobs/{job}?apply=true&name=&user=&ranks=
 * (counted hints_applied or hints_skipped). */
void ph_ask_hint(uint32_t job, const char *name, const char *user, long tasks);

#define PH_RESEND_MAX 32 /* spooled events sent again per invocation */
#define PH_SPOOL_MAX 10000 /* events kept in the spool; more are dropped */

#endif
