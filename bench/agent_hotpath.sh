#!/usr/bin/env bash
# Hot-path cost of pharos-agent (run as root).
#
# Runs fio (psync, sequential page-cache writes) inside a traced job cgroup
# (<cgroup2 mount>/pharos/job_<name>) alternately with the agent running and with no agent at
# all, in ABBA order (with, without, without, with, ...), and prints
#   * per BPF program of the agent (bpf_stats: run_time_ns / run_cnt): the average ns per run
#     during the fio runs, during 1 s idle windows (agent running, no fio), and an estimate of
#     its cost per fio write: (fio-window time - other runs * idle average) / writes. With the
#     raw sys_enter/sys_exit programs every system call of every process is a run, hence the
#     estimate (shown when fio's writes are at least half the runs). Taken in one extra fio
#     run per block size with bpf_stats on, which itself adds two clock reads per program run;
#     the timed runs have bpf_stats off;
#   * fio wall time and job-cgroup CPU time with/without per block size, ratio of the medians;
#   * a micro benchmark (bench/pwloop.c, if cc exists): ns per 4 KiB pwrite() over a
#     page-cache-resident file, traced (in the job cgroup) and untraced, min of 15 passes;
#     and, if clang and libbpf's headers exist, with no agent but two empty programs attached
#     to the raw sys_enter / sys_exit tracepoints (the floor: what attaching any syscall
#     program costs every system call of the node, before the agent's programs do anything).
#
# Usage: bench/agent_hotpath.sh [PAIRS=3] [BLOCK SIZES="4k 1m"]
#   env: AGENT (default target/release/pharos-agent), SIZE (512m), DIR (fio directory,
#        default /dev/shm/pharos-agent-hotpath: tmpfs), JOB (job cgroup name, default bench)
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${AGENT:-$HERE/target/release/pharos-agent}
PAIRS=${1:-3}
BSS=${2:-"4k 1m"}
SIZE=${SIZE:-512m}
DIR=${DIR:-/dev/shm/pharos-agent-hotpath}
JOB=${JOB:-bench}

[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
[ -x "$AGENT" ] || { echo "no agent binary at $AGENT (cargo build --release -p pharos-agent)" >&2; exit 1; }
command -v fio >/dev/null && command -v bpftool >/dev/null && command -v jq >/dev/null \
	|| { echo "needs fio, bpftool, jq" >&2; exit 1; }
if bpftool prog show | grep -qE ' name (sweep|sys_enter|enter_pwrite64) '; then
	echo "warning: BPF programs of another pharos-agent are loaded ($(pgrep -f pharos-agent | tr '\n' ' '));" \
		"they distort the 'without' runs" >&2
fi

CG2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
CG=$CG2/pharos/job_$JOB
mkdir -p "$CG" "$DIR"
TMP=$(mktemp -d)
OLD_STATS=$(cat /proc/sys/kernel/bpf_stats_enabled)
AGENT_PID=
FLOOR_PID=
cleanup() {
	[ -n "$AGENT_PID" ] && kill -TERM "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
	[ -n "$FLOOR_PID" ] && kill -TERM "$FLOOR_PID" 2>/dev/null && wait "$FLOOR_PID" 2>/dev/null
	echo "$OLD_STATS" >/proc/sys/kernel/bpf_stats_enabled
	rm -rf "$TMP" "$DIR"/w.*
	rmdir "$DIR" 2>/dev/null || true
	rmdir "$CG" 2>/dev/null || true
}
trap cleanup EXIT
echo 0 >/proc/sys/kernel/bpf_stats_enabled

start_agent() {
	rm -f "$TMP/ready"
	"$AGENT" --stdout-json --metrics-addr "" --stats-secs 0 --ready-file "$TMP/ready" \
		>/dev/null 2>"$TMP/agent.err" &
	AGENT_PID=$!
	for _ in $(seq 600); do
		[ -e "$TMP/ready" ] && return
		kill -0 "$AGENT_PID" 2>/dev/null || { cat "$TMP/agent.err" >&2; exit 1; }
		sleep 0.05
	done
	echo "agent not ready" >&2
	exit 1
}

# Prints "name run_cnt run_time_ns" of every program of the running agent.
prog_stats() {
	local ids
	ids=$(cat /proc/"$AGENT_PID"/fdinfo/* 2>/dev/null | awk '$1 == "prog_id:" { print $2 }' | sort -un |
		jq -sc .)
	bpftool prog show -j | jq -r --argjson ids "$ids" \
		'.[] | select(.id as $i | $ids | index($i)) | "\(.name) \(.run_cnt // 0) \(.run_time_ns // 0)"'
}

# Appends "bs name n_idle t_idle n_fio t_fio" per program to $TMP/stats, from snapshots before
# and after a 1 s idle window ($1) and after the fio run ($2, $3).
stats_delta() { # bs s0 s1 s2
	join <(sort "$2") <(sort "$3") | join - <(sort "$4") |
		awk -v bs="$1" '{ print bs, $1, $4 - $2, $5 - $3, $6 - $4, $7 - $5 }' >>"$TMP/stats"
}

stop_agent() {
	kill -TERM "$AGENT_PID"
	wait "$AGENT_PID" || true
	AGENT_PID=
}

cpu_usec() { awk '$1 == "usage_usec" { print $2 }' "$CG/cpu.stat"; }

# One fio run in the job cgroup; appends its wall time (s) to $TMP/<bs>.<mode> and the CPU
# time of the job cgroup (s, user + system, less sensitive to other load) to
# $TMP/<bs>.<mode>.cpu.
run_fio() { # bs mode
	local bs=$1 mode=$2 t0 t1 c0 c1
	rm -f "$DIR"/w.*
	c0=$(cpu_usec)
	t0=$(date +%s%N)
	sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CG" \
		fio --name=w --ioengine=psync --rw=write --bs="$bs" --size="$SIZE" \
		--directory="$DIR" --filename=w.dat >/dev/null
	t1=$(date +%s%N)
	c1=$(cpu_usec)
	rm -f "$DIR"/w.*
	echo "scale=4; ($t1 - $t0) / 1000000000" | bc >>"$TMP/$bs.$mode"
	echo "scale=4; ($c1 - $c0) / 1000000" | bc >>"$TMP/$bs.$mode.cpu"
}

pwloop() { # mode
	[ -x "$TMP/pwloop" ] || return 0
	sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CG" "$TMP/pwloop" "$DIR/w.pw" 15 |
		awk '{ print $1 }' >>"$TMP/pw.$1"
	[ "$1" = with ] && "$TMP/pwloop" "$DIR/w.pw" 15 | awk '{ print $1 }' >>"$TMP/pw.outside"
	[ "$1" = without ] && [ -x "$TMP/floor" ] && {
		rm -f "$TMP/floor.ready"
		"$TMP/floor" "$TMP/floor.bpf.o" "$TMP/floor.ready" &
		FLOOR_PID=$!
		while [ ! -e "$TMP/floor.ready" ] && kill -0 "$FLOOR_PID" 2>/dev/null; do sleep 0.02; done
		[ -e "$TMP/floor.ready" ] && "$TMP/pwloop" "$DIR/w.pw" 15 | awk '{ print $1 }' >>"$TMP/pw.floor"
		kill -TERM "$FLOOR_PID" 2>/dev/null
		wait "$FLOOR_PID" || true
		FLOOR_PID=
	}
	return 0
}

# The floor: two empty programs on the raw sys_enter / sys_exit tracepoints (raw_tp: the same
# dispatch as the agent's tp_btf programs, bpf_trace_run2) and a loader that keeps them attached
# until SIGTERM. Built only where clang and libbpf's headers are.
build_floor() {
	command -v clang >/dev/null && command -v cc >/dev/null || return 0
	cat >"$TMP/floor.bpf.c" <<'BPF'
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
SEC("raw_tp/sys_enter") int floor_enter(void *ctx) { return 0; }
SEC("raw_tp/sys_exit") int floor_exit(void *ctx) { return 0; }
BPF
	cat >"$TMP/floor.c" <<'LOADER'
#include <bpf/libbpf.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static void on_term(int sig) { (void)sig; }
int main(int argc, char **argv)
{
	struct bpf_object *o = bpf_object__open_file(argv[1], NULL);
	struct bpf_program *p;
	FILE *f;

	if (!o || bpf_object__load(o))
		return 1;
	bpf_object__for_each_program(p, o)
		if (!bpf_program__attach(p))
			return 1;
	signal(SIGTERM, on_term);
	if (!(f = fopen(argv[2], "w")))
		return 1;
	fclose(f);
	pause();
	return 0;
}
LOADER
	clang -O2 -target bpf -I/usr/include/"$(cc -dumpmachine)" -c "$TMP/floor.bpf.c" -o "$TMP/floor.bpf.o" 2>/dev/null &&
		cc -O2 -o "$TMP/floor" "$TMP/floor.c" -lbpf 2>/dev/null || rm -f "$TMP/floor"
}

# bpf_stats run (not timed: the statistics cost two clock reads per program run).
stats_run() { # bs
	start_agent
	echo 1 >/proc/sys/kernel/bpf_stats_enabled
	prog_stats >"$TMP/s0"
	sleep 1
	prog_stats >"$TMP/s1"
	run_fio "$1" stats
	prog_stats >"$TMP/s2"
	echo 0 >/proc/sys/kernel/bpf_stats_enabled
	stats_delta "$1" "$TMP/s0" "$TMP/s1" "$TMP/s2"
	stop_agent
}

with_agent() { # bs
	start_agent
	run_fio "$1" with
	pwloop with
	stop_agent
}

without_agent() { # bs
	run_fio "$1" without
	pwloop without
}

bytes() { numfmt --from=iec "$(echo "$1" | tr a-z A-Z)"; }

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

command -v cc >/dev/null && cc -O2 -o "$TMP/pwloop" "$HERE/bench/pwloop.c"
[ -x "$TMP/pwloop" ] && build_floor
for bs in $BSS; do
	run_fio "$bs" warmup
	stats_run "$bs"
	for p in $(seq "$PAIRS"); do
		if [ $((p % 2)) = 1 ]; then
			with_agent "$bs"; without_agent "$bs"
		else
			without_agent "$bs"; with_agent "$bs"
		fi
	done
done

echo "== BPF programs (bpf_stats), avg ns per run: fio window / idle window; est. ns per fio write"
for bs in $BSS; do
	n=$(($(bytes "$SIZE") / $(bytes "$bs")))
	awk -v bs="$bs" -v n="$n" '$1 == bs {
		ci[$2] += $3; ti[$2] += $4; cf[$2] += $5; tf[$2] += $6 }
	END { for (p in cf) if (cf[p] > 0) {
		idle = ci[p] > 0 ? ti[p] / ci[p] : 0; w = n
		est = cf[p] >= w && w * 2 >= cf[p] ? (tf[p] - (cf[p] - w) * idle) / w : 0
		printf "bs=%-3s %-16s %10d runs %8.1f ns / %8.1f ns idle", bs, p, cf[p], tf[p] / cf[p], idle
		if (est > 0) printf "   ~%6.1f ns per write", est
		printf "\n" } }' "$TMP/stats" | sort
done
echo "== fio $SIZE psync sequential write in $CG, $PAIRS ABBA pairs: seconds, ratio of medians with/without"
for bs in $BSS; do
	for kind in wall cpu; do
		suf=; [ $kind = cpu ] && suf=.cpu
		w=$(median <"$TMP/$bs.with$suf")
		wo=$(median <"$TMP/$bs.without$suf")
		mw=$(sort -g "$TMP/$bs.with$suf" | head -1)
		mwo=$(sort -g "$TMP/$bs.without$suf" | head -1)
		printf "bs=%-3s %-4s ratio %-6s median %s / %s (ratio of minima %s)   with: %s  without: %s\n" \
			"$bs" $kind "$(echo "scale=3; $w / $wo" | bc)" "$w" "$wo" "$(echo "scale=3; $mw / $mwo" | bc)" \
			"$(tr '\n' ' ' <"$TMP/$bs.with$suf")" "$(tr '\n' ' ' <"$TMP/$bs.without$suf")"
	done
done
if [ -s "$TMP/pw.with" ]; then
	echo "== micro: ns per 4 KiB pwrite (min of 15 passes; median over runs)"
	printf "without agent %s   traced %s   untraced (agent running) %s" "$(median <"$TMP/pw.without")" \
		"$(median <"$TMP/pw.with")" "$(median <"$TMP/pw.outside")"
	[ -s "$TMP/pw.floor" ] && printf "   floor (no agent, two empty sys_enter/sys_exit programs) %s" \
		"$(median <"$TMP/pw.floor")"
	printf "\n"
fi
