// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* Pharos I/O tracer, kernel side.
 *
 * System calls of the read/write family and of metadata operations, filtered in the kernel to
 * tasks below the watched root cgroups, plus block-layer device requests (raw tracepoints
 * block_rq_issue / block_rq_complete), plus the environment of every task of those cgroups that
 * execs (sched_process_exec, for its rank: see on_exec).
 *
 * System calls are seen through two BTF raw tracepoint programs (tp_btf/sys_enter and
 * tp_btf/sys_exit) that dispatch on the syscall number through `sys_kind`, a table the loader
 * fills for its architecture. No perf trace buffer is built per event, and a task outside the
 * watched cgroups costs a table load and a cgroup check. Where those cannot be used (no table
 * for the architecture, load or attach failure), the loader falls back to the per-syscall
 * tracepoints (tracepoint/syscalls/sys_enter_* / sys_exit_*), which share all the code below.
 *
 * Per-thread state lives in task local storage (map `tstate`): the call in flight (stashed at
 * entry, the least possible work there) and the pending record of Beacon's online compression
 * (Yang et al., NSDI'19, section 3): a read/write-family request merges into it when op, fd,
 * file, size and result are equal, result >= 0 and the offset is contiguous. The file behind
 * the fd (identity, f_pos) is read at exit only. The pending record is guarded by a cmpxchg
 * word (`state`): the owning thread takes 0 -> 1, the periodic sweeper (program `sweep`, run by
 * user space through BPF_PROG_TEST_RUN, which walks every thread with a task iterator) takes
 * 0 -> 2. Whoever holds it may emit and reset the pending record; an owner that finds it held
 * emits its own request standalone. Hence every request is emitted exactly once.
 *
 * Layout: the maps and loader-set constants in iotrace_maps.bpf.h, the cgroup filter in
 * iotrace_attribution.bpf.h, emitting and per-thread state in iotrace_helpers.bpf.h, the system
 * calls' entry/exit and merge in iotrace_syscalls.bpf.h; the programs (SEC) are in this file.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "iotrace.h"

char LICENSE[] SEC("license") = "GPL";

#define MERGE_WINDOW_NS (100ULL * 1000 * 1000) /* a run is closed 100 ms after it started */
#define WAKEUP_BYTES (256 * 1024)              /* wake the reader when this much is queued */
#define AT_FDCWD_ (-100)
#define REQ_OP_MASK_ 0xff
#define MAX_IOV 16
#define TS_COMPAT_ 0x0002 /* x86 thread_info.status: in a 32-bit (ia32) system call */

#include "iotrace_maps.bpf.h"
#include "iotrace_attribution.bpf.h"
#include "iotrace_helpers.bpf.h"
#include "iotrace_syscalls.bpf.h"

#if defined(__TARGET_ARCH_x86)
/* Preferred attachment: one program per direction for all system calls (BTF raw
 * tracepoints; no per-event perf buffer). Filter first: syscall number, then cgroup. */
SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	struct task_struct *t;
	__u32 kind;

	if ((__u64)id >= PH_NR_SYSCALLS)
		return 0; /* also x32 (__X32_SYSCALL_BIT) */
	kind = sys_kind[id];
	if (!kind)
		return 0;
	t = bpf_get_current_task_btf();
	if (!traced_task(t))
		return 0;
	/* ia32 system calls have other numbers; the per-syscall tracepoints ignore them too */
	if (t->thread_info.status & TS_COMPAT_)
		return 0;
	return enter_sys(t, kind, regs->di, regs->si, regs->dx, regs->r10);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	__u64 nr = regs->orig_ax;
	__u32 kind;

	if (nr >= PH_NR_SYSCALLS)
		return 0;
	kind = sys_kind[nr];
	if (!kind)
		return 0;
	return exit_sys(kind, ret); /* nothing unless this thread's entry stashed the call */
}
#endif

/* Fallback: per-syscall tracepoints (one program pair per system call). */
#define ARG(i) (ctx->args[i])

#define SYS(name, KIND)                                                                \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                       \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)                           \
	{                                                                                 \
		struct task_struct *t = bpf_get_current_task_btf();                       \
                                                                                          \
		if (!traced_task(t))                                                      \
			return 0;                                                         \
		return enter_sys(t, KIND, ARG(0), ARG(1), ARG(2), ARG(3));                \
	}                                                                                 \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                        \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                             \
	{                                                                                 \
		return exit_sys(KIND, ctx->ret);                                          \
	}

/* read/write family */
SYS(read, PH_SYS_READ)
SYS(write, PH_SYS_WRITE)
SYS(pread64, PH_SYS_PREAD64)
SYS(pwrite64, PH_SYS_PWRITE64)
SYS(readv, PH_SYS_READV)
SYS(writev, PH_SYS_WRITEV)
/* fd-based metadata ops */
SYS(close, PH_SYS_CLOSE)
SYS(fsync, PH_SYS_FSYNC)
SYS(fdatasync, PH_SYS_FDATASYNC)
SYS(newfstat, PH_SYS_NEWFSTAT)
/* path-based ops */
SYS(open, PH_SYS_OPEN)
SYS(openat, PH_SYS_OPENAT)
SYS(openat2, PH_SYS_OPENAT2)
SYS(newstat, PH_SYS_NEWSTAT)
SYS(newlstat, PH_SYS_NEWLSTAT)
SYS(newfstatat, PH_SYS_NEWFSTATAT)
SYS(statx, PH_SYS_STATX)
SYS(unlink, PH_SYS_UNLINK)
SYS(unlinkat, PH_SYS_UNLINKAT)
SYS(mkdir, PH_SYS_MKDIR)
SYS(mkdirat, PH_SYS_MKDIRAT)
SYS(rename, PH_SYS_RENAME)
SYS(renameat, PH_SYS_RENAMEAT)
SYS(renameat2, PH_SYS_RENAMEAT2)

/* A thread exits: emit its pending record (its storage is freed with the task). */
SEC("tracepoint/sched/sched_process_exit")
int on_exit(void *ctx)
{
	struct ph_pending *p = thread_state(bpf_get_current_task_btf(), false);

	if (!p)
		return 0;
	p->cur_op = 0;
	for (int i = 0; i < 64; i++) {
		if (__sync_val_compare_and_swap(&p->state, 0, 1) == 0) {
			if (p->ev.count > 0) {
				emit(&p->ev);
				p->ev.count = 0;
			}
			return 0; /* never unlocked: the thread is gone */
		}
	}
	return 0; /* the sweeper held it throughout: it emits the record */
}

/* A process of a watched cgroup exec'd: send its new environment (the strings exec copied to the
 * top of the new stack, mm->env_start..env_end, resident now) so that user space learns the
 * rank from it (pharos-attribution) even if the process exits before its first record is read,
 * when /proc/<pid>/environ is gone. In chunks of PH_ENV_CHUNK bytes, each event only as long as
 * its chunk; beyond PH_ENV_CHUNKS chunks the rest is not sent (flagged). A chunk the ring buffer
 * cannot take ends the exec's events: user space then reads /proc/<pid>/environ. */
SEC("tracepoint/sched/sched_process_exec")
int on_exec(void *ctx)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct ph_env_event *e;
	struct mm_struct *mm;
	__u32 zero = 0;
	__u64 id, start, total;

	if (!traced_task(t))
		return 0;
	mm = t->mm;
	e = bpf_map_lookup_elem(&env_scratch, &zero);
	if (!mm || !e)
		return 0;
	start = mm->env_start;
	total = mm->env_end > start ? mm->env_end - start : 0;
	__builtin_memset(&e->ev, 0, sizeof(e->ev));
	id = bpf_get_current_pid_tgid();
	e->ev.start_ns = e->ev.end_ns = bpf_ktime_get_ns();
	e->ev.cgroup_id = bpf_get_current_cgroup_id();
	e->ev.pid = id >> 32;
	e->ev.tid = (__u32)id;
	e->ev.fd = -1;
	e->ev.op = PH_OP_EXEC;
	e->ev.path_kind = PH_PATH_ENV;
	e->ev.size = total;
	e->ev.flags = total > (__u64)PH_ENV_CHUNK * PH_ENV_CHUNKS ? PH_F_ENV_TRUNCATED : 0;
	bpf_get_current_comm(&e->ev.comm, sizeof(e->ev.comm));
	for (int i = 0; i < PH_ENV_CHUNKS; i++) {
		__u64 off = (__u64)i * PH_ENV_CHUNK, len;

		if (off >= total && i > 0)
			break;
		len = total - off < PH_ENV_CHUNK ? total - off : PH_ENV_CHUNK;
		if (off >= total)
			len = 0; /* an empty environment: one empty event */
		if (len && bpf_probe_read_user(e->env, len, (const void *)(start + off)))
			break;
		e->ev.offset = off;
		e->ev.path_len = len;
		if (bpf_ringbuf_output(&events, e, sizeof(e->ev) + len, wakeup_flag()))
			break;
	}
	return 0;
}

/* A process of a watched cgroup forked a new process (not a thread): tell user space, so that the
 * child has its parent's rank until it execs. A forked child that does its I/O and exits without
 * exec (fio's job processes, a rank's helper) is otherwise gone before its first record is read,
 * and /proc/<pid>/environ with it: its records would get the cgroup path's rank. The event
 * carries the parent's pid in `pid` and the child's in `tid`; nothing follows the fixed part. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	struct ph_event e;

	if (child->pid != child->tgid || !traced_task(parent))
		return 0;
	__builtin_memset(&e, 0, sizeof(e));
	e.start_ns = e.end_ns = bpf_ktime_get_ns();
	e.cgroup_id = bpf_get_current_cgroup_id();
	e.pid = parent->tgid;
	e.tid = child->tgid;
	e.fd = -1;
	e.op = PH_OP_FORK;
	bpf_get_current_comm(&e.comm, sizeof(e.comm));
	bpf_ringbuf_output(&events, &e, sizeof(e), wakeup_flag());
	return 0;
}

/* Sweeper, run from user space with BPF_PROG_TEST_RUN every ~50 ms: emits every pending
 * record whose run started at least args[0] ns ago (0: all). Returns the number emitted.
 * Walks all threads (task local storage cannot be iterated as a map). */
SEC("raw_tp")
int sweep(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 now = bpf_ktime_get_ns(), min_age = ctx->args[0];
	struct bpf_iter_task it;
	struct task_struct *t;
	int emitted = 0;

	bpf_iter_task_new(&it, NULL, BPF_TASK_ITER_ALL_THREADS);
	while ((t = bpf_iter_task_next(&it))) {
		struct ph_pending *p = bpf_task_storage_get(&tstate, t, 0, 0);

		if (!p || p->ev.count == 0)
			continue;
		if ((__s64)(now - p->ev.start_ns) < (__s64)min_age)
			continue;
		if (__sync_val_compare_and_swap(&p->state, 0, 2) != 0)
			continue;
		if (p->ev.count > 0) {
			emit(&p->ev);
			p->ev.count = 0;
			emitted++;
		}
		unlock(p);
	}
	bpf_iter_task_destroy(&it);
	return emitted;
}

/* Block layer: device requests, keyed by struct request *. */
SEC("raw_tp/block_rq_issue")
int BPF_PROG(blk_issue, struct request *rq)
{
	struct blk_start s = {};
	__u64 key = (__u64)rq;
	__u64 id = bpf_get_current_pid_tgid();
	struct gendisk *disk;
	__u32 opf;

	if (traced())
		s.cgroup_id = bpf_get_current_cgroup_id();
	else if (!block_all)
		return 0;
	s.start_ns = bpf_ktime_get_ns();
	disk = BPF_CORE_READ(rq, q, disk);
	if (disk)
		s.dev = ((__u64)BPF_CORE_READ(disk, major) << 20) | BPF_CORE_READ(disk, first_minor);
	s.offset = BPF_CORE_READ(rq, __sector);
	s.offset = s.offset == (__u64)-1 ? 0 : s.offset * 512; /* flushes have no sector */
	s.size = BPF_CORE_READ(rq, __data_len);
	opf = BPF_CORE_READ(rq, cmd_flags) & REQ_OP_MASK_;
	s.op = opf == 0 ? PH_OP_BLOCK_READ : opf == 1 ? PH_OP_BLOCK_WRITE : PH_OP_BLOCK_OTHER;
	s.pid = id >> 32;
	s.tid = (__u32)id;
	bpf_get_current_comm(&s.comm, sizeof(s.comm));
	bpf_map_update_elem(&blk_inflight, &key, &s, BPF_ANY);
	return 0;
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(blk_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	__u64 key = (__u64)rq;
	struct blk_start *s = bpf_map_lookup_elem(&blk_inflight, &key);
	struct ph_event e = {};
	__u64 now;

	if (!s)
		return 0;
	now = bpf_ktime_get_ns();
	e.start_ns = s->start_ns;
	e.end_ns = now;
	e.duration_ns = now - s->start_ns;
	e.cgroup_id = s->cgroup_id;
	e.dev = s->dev;
	e.offset = s->offset;
	e.size = s->size;
	e.result = error ? -5 /* EIO */ : (long long)nr_bytes;
	e.pid = s->pid;
	e.tid = s->tid;
	e.count = 1;
	e.fd = -1;
	e.op = s->op;
	__builtin_memcpy(e.comm, s->comm, sizeof(e.comm));
	emit(&e);
	if (!error && nr_bytes < BPF_CORE_READ(rq, __data_len)) {
		/* partial completion: the rest completes later */
		s->offset += nr_bytes;
		s->size -= nr_bytes;
		s->start_ns = now;
		return 0;
	}
	bpf_map_delete_elem(&blk_inflight, &key);
	return 0;
}
