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

/* Set by the loader before load. */
const volatile struct ph_root roots[PH_MAX_ROOTS] = {};
const volatile __u32 nroots = 0;
const volatile bool block_all = true; /* record block requests of tasks outside jobs too */
/* Syscall number -> enum ph_sys (0: not traced), for tp_btf/sys_enter and sys_exit. */
const volatile __u8 sys_kind[PH_NR_SYSCALLS] = {};

/* Makes the event types visible in the skeleton's BTF-generated types. */
struct ph_path_event ph_path_event_type_ = {};
struct ph_env_event ph_env_event_type_ = {};
struct ph_pending ph_pending_type_ = {};
struct ph_counters ph_counters_type_ = {};
enum ph_sys ph_sys_type_ = PH_SYS_NONE;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024 * 1024);
} events SEC(".maps");

/* Per-thread state: call in flight and pending record. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ph_pending);
} tstate SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct ph_counters);
} counters SEC(".maps");

struct blk_start {
	__u64 start_ns;
	__u64 cgroup_id;
	__u64 dev;
	__u64 offset;
	__u64 size;
	__u32 pid;
	__u32 tid;
	__u32 op;
	__u32 pad;
	char comm[PH_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* struct request * */
	__type(value, struct blk_start);
} blk_inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ph_path_event);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ph_env_event);
} env_scratch SEC(".maps");

extern int bpf_iter_task_new(struct bpf_iter_task *it, struct task_struct *task,
			     unsigned int flags) __weak __ksym;
extern struct task_struct *bpf_iter_task_next(struct bpf_iter_task *it) __weak __ksym;
extern void bpf_iter_task_destroy(struct bpf_iter_task *it) __weak __ksym;

static const struct ph_counters zero_counters;

/* True when `t` (the current task) is below a watched root: its cgroup v2 ancestor at
 * roots[i].level has id roots[i].id. Same test as bpf_get_current_ancestor_cgroup_id(), with
 * direct loads instead of a helper call (the levels are load-time constants). */
static __always_inline bool traced_task(struct task_struct *t)
{
	struct cgroup *cg = t->cgroups->dfl_cgrp;

	if (!cg)
		return false;
	for (int i = 0; i < PH_MAX_ROOTS; i++) {
		if (i >= nroots)
			break;
		struct cgroup *anc;

		if (roots[i].level > cg->level)
			continue;
		/* cg->ancestors[level]: a flexible array, read through a pointer-sized type */
		anc = (struct cgroup *)bpf_core_cast(&cg->ancestors[roots[i].level],
						     struct llist_node)->next;
		if (anc && bpf_core_cast(anc, struct cgroup)->kn->id == roots[i].id)
			return true;
	}
	return false;
}

static __always_inline bool traced(void)
{
	return traced_task(bpf_get_current_task_btf());
}

static __always_inline struct ph_counters *counters_of(__u64 cgid)
{
	struct ph_counters *c = bpf_map_lookup_elem(&counters, &cgid);
	if (c)
		return c;
	bpf_map_update_elem(&counters, &cgid, &zero_counters, BPF_NOEXIST);
	return bpf_map_lookup_elem(&counters, &cgid);
}

static __always_inline __u64 wakeup_flag(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP
									      : BPF_RB_NO_WAKEUP;
}

static __always_inline void count_drop(__u64 cgid)
{
	struct ph_counters *c = counters_of(cgid);
	if (c)
		__sync_fetch_and_add(&c->ringbuf_drops, 1);
}

static __always_inline void emit(struct ph_event *ev)
{
	if (bpf_ringbuf_output(&events, ev, sizeof(*ev), wakeup_flag()))
		count_drop(ev->cgroup_id);
}

/* struct file * behind `fd` of the current task, NULL if none. Only exception-handled direct
 * loads (BTF pointers and bpf_core_cast), no bpf_probe_read_kernel call. */
static __always_inline struct file *fd_file(struct task_struct *t, int fd)
{
	struct fdtable *fdt = t->files->fdt;
	__u64 slot;

	if (!fdt || fd < 0 || (unsigned int)fd >= fdt->max_fds)
		return NULL;
	/* fdt->fd is a pointer to pointers: a scalar to the verifier. Read the slot through a
	 * kernel type whose first member is a pointer. */
	slot = (__u64)fdt->fd + (__u64)fd * sizeof(void *);
	return (struct file *)bpf_core_cast((void *)slot, struct llist_node)->next;
}

/* Caches the identity (dev, ino, mode) of `f` in `p`; re-read when the file or inode changes. */
static __always_inline void file_identity(struct ph_pending *p, struct file *f)
{
	struct inode *ino;

	if (!f) {
		p->cur_file = 0;
		p->cur_inode = 0;
		p->file_dev = 0;
		p->file_ino = 0;
		p->file_mode = 0;
		return;
	}
	ino = bpf_core_cast(f, struct file)->f_inode;
	if ((__u64)f == p->cur_file && (__u64)ino == p->cur_inode)
		return;
	p->cur_file = (__u64)f;
	p->cur_inode = (__u64)ino;
	ino = bpf_core_cast(ino, struct inode);
	p->file_dev = ino->i_sb->s_dev;
	p->file_ino = ino->i_ino;
	p->file_mode = ino->i_mode;
}

/* The calling thread's state, created on first use (NULL only if that fails). */
static __always_inline struct ph_pending *thread_state(struct task_struct *t, bool create)
{
	return bpf_task_storage_get(&tstate, t, 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

/* A traced call whose state could not be created: counted, as it is never emitted. */
static __always_inline void lost_call(void)
{
	count_drop(bpf_get_current_cgroup_id());
}

/* Entry of a read/write-family call: stash the arguments only; the file is read at exit.
 * `off` is the offset argument, or ~0 for calls at the file position (read at exit). */
static __always_inline int enter_rw(struct task_struct *t, __u32 op, int fd, __u64 size,
				    __u64 off)
{
	struct ph_pending *p = thread_state(t, true);

	if (!p) {
		lost_call();
		return 0;
	}
	p->cur_offset = off;
	p->cur_arg0 = 0;
	p->cur_fd = fd;
	p->cur_size = size;
	p->cur_op = op;
	p->cur_start_ns = bpf_ktime_get_ns();
	return 0;
}

/* Entry of an fd-based metadata call: the file is read now (close removes the fd). */
static __always_inline int enter_meta_fd(struct task_struct *t, __u32 op, int fd)
{
	struct ph_pending *p = thread_state(t, true);

	if (!p) {
		lost_call();
		return 0;
	}
	file_identity(p, fd_file(t, fd));
	p->cur_offset = 0;
	p->cur_arg0 = 0;
	p->cur_fd = fd;
	p->cur_size = 0;
	p->cur_op = op;
	p->cur_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int enter_path(struct task_struct *t, __u32 op, int dirfd,
				      const void *upath)
{
	struct ph_pending *p = thread_state(t, true);

	if (!p) {
		lost_call();
		return 0;
	}
	file_identity(p, NULL); /* no file: path-based */
	p->cur_arg0 = (__u64)upath;
	p->cur_fd = dirfd;
	p->cur_size = 0;
	p->cur_offset = 0;
	p->cur_op = op;
	p->cur_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline void fill(struct ph_event *e, struct ph_pending *p, __u32 op, __u64 now,
				 long ret)
{
	__u64 id = bpf_get_current_pid_tgid();

	e->start_ns = p->cur_start_ns;
	e->end_ns = now;
	e->duration_ns = now - p->cur_start_ns;
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->dev = p->file_dev;
	e->ino = p->file_ino;
	e->mode = p->file_mode;
	e->offset = p->cur_offset;
	e->size = p->cur_size;
	e->result = ret;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->count = 1;
	e->fd = p->cur_fd;
	e->op = op;
	e->path_len = 0;
	e->path_kind = PH_PATH_NONE;
	e->flags = p->cur_file ? 0 : PH_F_NO_FILE;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
}

static __always_inline void unlock(struct ph_pending *p)
{
#if defined(__TARGET_ARCH_x86)
	/* x86 stores are release stores: the record's updates are visible before it */
	asm volatile("" ::: "memory");
	*(volatile __u32 *)&p->state = 0;
#else
	__sync_fetch_and_and(&p->state, 0);
#endif
}

/* Emits the pending record of `p` if the lock can be taken (else its holder emits it). */
static __always_inline void flush_own(struct ph_pending *p)
{
	if (__sync_val_compare_and_swap(&p->state, 0, 1) != 0)
		return;
	if (p->ev.count > 0) {
		emit(&p->ev);
		p->ev.count = 0;
	}
	unlock(p);
}

static __always_inline int exit_rw(struct task_struct *t, __u32 op, long ret)
{
	struct ph_pending *p = thread_state(t, false);
	struct ph_event *e;
	struct ph_event single;
	struct file *f;
	__u64 now;

	if (!p || p->cur_op != op)
		return 0;
	p->cur_op = 0;
	now = bpf_ktime_get_ns();
	f = fd_file(t, p->cur_fd);
	file_identity(p, f);
	if (p->cur_offset == ~0ULL) {
		/* at the file position: where it ended minus what was transferred (also right
		 * for O_APPEND); files without a position (pipes, sockets) keep 0 */
		__u64 pos = f ? bpf_core_cast(f, struct file)->f_pos : 0;

		p->cur_offset = ret > 0 && pos >= (__u64)ret ? pos - ret : pos;
	}
	if (__sync_val_compare_and_swap(&p->state, 0, 1) != 0) {
		/* The sweeper holds the pending record: emit this request on its own. */
		fill(&single, p, op, now, ret);
		emit(&single);
		return 0;
	}
	e = &p->ev;
	if (e->count > 0) {
		if (e->op == op && e->fd == p->cur_fd && e->size == p->cur_size && ret >= 0 &&
		    e->result == ret && e->dev == p->file_dev && e->ino == p->file_ino &&
		    p->cur_offset == e->offset + (__u64)e->count * (__u64)ret &&
		    now - e->start_ns < MERGE_WINDOW_NS) {
			e->count += 1;
			e->duration_ns += now - p->cur_start_ns;
			e->end_ns = now;
			unlock(p);
			return 0;
		}
		emit(e);
	}
	fill(e, p, op, now, ret);
	unlock(p);
	return 0;
}

struct walk_ctx {
	struct dentry *d;
	struct dentry *mroot;
	struct mount *m;
	__u32 off;
	__u32 flags;
};

/* One step of the dentry walk (bpf_loop callback): append d's name, or cross a mount. */
static long walk_step(__u32 i, struct walk_ctx *w)
{
	__u32 zero = 0;
	struct ph_path_event *pe = bpf_map_lookup_elem(&scratch, &zero);
	struct dentry *d = w->d, *parent;
	struct mount *m = w->m;
	const unsigned char *name;
	__u32 off = w->off;
	long n;

	if (!pe)
		return 1;
	parent = BPF_CORE_READ(d, d_parent);
	if (d == w->mroot || d == parent) {
		struct mount *mp;

		if (d != w->mroot)
			return 1; /* root of a file system that is not mounted here */
		mp = BPF_CORE_READ(m, mnt_parent);
		if (mp == m)
			return 1; /* global root */
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->m = mp;
		w->mroot = BPF_CORE_READ(mp, mnt.mnt_root);
		return 0;
	}
	if (off > PH_PATH_BUF - PH_NAME_MAX) {
		w->flags |= PH_F_PATH_TRUNCATED;
		return 1;
	}
	name = BPF_CORE_READ(d, d_name.name);
	n = bpf_probe_read_kernel_str(&pe->path[off], PH_NAME_MAX, name);
	if (n <= 0)
		return 1;
	w->off = off + n;
	w->d = parent;
	if (i == PH_PATH_DEPTH - 1)
		w->flags |= PH_F_PATH_TRUNCATED;
	return 0;
}

/* Builds the absolute path of `f` into the scratch event's path, leaf component first, each
 * NUL-terminated, crossing mount points (mnt_mountpoint / mnt_parent), at most
 * PH_PATH_DEPTH steps. Returns bytes used. */
static __always_inline __u32 dentry_path(struct ph_path_event *pe, struct file *f)
{
	struct vfsmount *vm = BPF_CORE_READ(f, f_path.mnt);
	struct walk_ctx w = {};

	w.d = BPF_CORE_READ(f, f_path.dentry);
	w.m = container_of(vm, struct mount, mnt);
	w.mroot = BPF_CORE_READ(vm, mnt_root);
	bpf_loop(PH_PATH_DEPTH, walk_step, &w, 0);
	pe->ev.flags |= w.flags;
	return w.off;
}

static __always_inline int exit_meta(struct task_struct *t, __u32 op, long ret)
{
	struct ph_pending *p = thread_state(t, false);
	struct ph_path_event *pe;
	__u32 zero = 0, len = 0;
	__u64 now;

	if (!p || p->cur_op != op)
		return 0;
	p->cur_op = 0;
	now = bpf_ktime_get_ns();
	flush_own(p); /* keep per-thread order: the pending run goes first */
	pe = bpf_map_lookup_elem(&scratch, &zero);
	if (!pe)
		return 0;
	fill(&pe->ev, p, op, now, ret);
	if (op == PH_OP_OPEN && ret >= 0) {
		struct file *f = fd_file(t, (int)ret);

		p->cur_file = 0;
		file_identity(p, f);
		pe->ev.dev = p->file_dev;
		pe->ev.ino = p->file_ino;
		pe->ev.mode = p->file_mode;
		pe->ev.fd = (int)ret;
		pe->ev.flags = f ? 0 : PH_F_NO_FILE;
		if (f) {
			len = dentry_path(pe, f);
			pe->ev.path_kind = PH_PATH_DENTRY;
		}
		p->cur_file = 0; /* fd table changed: drop the cache */
	} else if (op == PH_OP_OPEN || op == PH_OP_STAT || op == PH_OP_UNLINK ||
		   op == PH_OP_MKDIR || op == PH_OP_RENAME) {
		if (p->cur_arg0) { /* path-based */
			long n = bpf_probe_read_user_str(pe->path, PH_PATH_BUF,
							 (const void *)p->cur_arg0);
			if (n > 0) {
				len = n;
				pe->ev.path_kind = PH_PATH_USER;
			}
			pe->ev.flags &= ~PH_F_NO_FILE;
		}
	} else if (op == PH_OP_CLOSE) {
		p->cur_file = 0;
	}
	if (len > PH_PATH_BUF)
		len = PH_PATH_BUF;
	pe->ev.path_len = len;
	if (bpf_ringbuf_output(&events, pe, sizeof(struct ph_event) + len, wakeup_flag()))
		count_drop(pe->ev.cgroup_id);
	return 0;
}

static __always_inline __u64 iov_bytes(const struct iovec *iov, unsigned long n)
{
	__u64 total = 0;

	for (int i = 0; i < MAX_IOV; i++) {
		struct iovec v;

		if (i >= n)
			break;
		if (bpf_probe_read_user(&v, sizeof(v), &iov[i]))
			break;
		total += v.iov_len;
	}
	return total;
}

/* Operation of each traced system call (enum ph_sys -> enum ph_op). */
static __always_inline __u32 sys_op(__u32 kind)
{
	switch (kind) {
	case PH_SYS_READ: return PH_OP_READ;
	case PH_SYS_WRITE: return PH_OP_WRITE;
	case PH_SYS_PREAD64: return PH_OP_PREAD;
	case PH_SYS_PWRITE64: return PH_OP_PWRITE;
	case PH_SYS_READV: return PH_OP_READV;
	case PH_SYS_WRITEV: return PH_OP_WRITEV;
	case PH_SYS_CLOSE: return PH_OP_CLOSE;
	case PH_SYS_FSYNC: return PH_OP_FSYNC;
	case PH_SYS_FDATASYNC: return PH_OP_FDATASYNC;
	case PH_SYS_NEWFSTAT:
	case PH_SYS_NEWSTAT:
	case PH_SYS_NEWLSTAT:
	case PH_SYS_NEWFSTATAT:
	case PH_SYS_STATX: return PH_OP_STAT;
	case PH_SYS_OPEN:
	case PH_SYS_OPENAT:
	case PH_SYS_OPENAT2: return PH_OP_OPEN;
	case PH_SYS_UNLINK:
	case PH_SYS_UNLINKAT: return PH_OP_UNLINK;
	case PH_SYS_MKDIR:
	case PH_SYS_MKDIRAT: return PH_OP_MKDIR;
	case PH_SYS_RENAME:
	case PH_SYS_RENAMEAT:
	case PH_SYS_RENAMEAT2: return PH_OP_RENAME;
	}
	return 0;
}

#define POS (~0ULL) /* enter_rw: at the file position */

/* Entry of traced system call `kind` with arguments a0..a3 (the caller checked the filter). */
static __always_inline int enter_sys(struct task_struct *t, __u32 kind, __u64 a0, __u64 a1,
				     __u64 a2, __u64 a3)
{
	switch (kind) {
	case PH_SYS_READ: return enter_rw(t, PH_OP_READ, (int)a0, a2, POS);
	case PH_SYS_WRITE: return enter_rw(t, PH_OP_WRITE, (int)a0, a2, POS);
	case PH_SYS_PREAD64: return enter_rw(t, PH_OP_PREAD, (int)a0, a2, a3);
	case PH_SYS_PWRITE64: return enter_rw(t, PH_OP_PWRITE, (int)a0, a2, a3);
	case PH_SYS_READV:
		return enter_rw(t, PH_OP_READV, (int)a0, iov_bytes((const void *)a1, a2), POS);
	case PH_SYS_WRITEV:
		return enter_rw(t, PH_OP_WRITEV, (int)a0, iov_bytes((const void *)a1, a2), POS);
	case PH_SYS_CLOSE: return enter_meta_fd(t, PH_OP_CLOSE, (int)a0);
	case PH_SYS_FSYNC: return enter_meta_fd(t, PH_OP_FSYNC, (int)a0);
	case PH_SYS_FDATASYNC: return enter_meta_fd(t, PH_OP_FDATASYNC, (int)a0);
	case PH_SYS_NEWFSTAT: return enter_meta_fd(t, PH_OP_STAT, (int)a0);
	/* path-based ops: (dirfd, user path) */
	case PH_SYS_OPEN: return enter_path(t, PH_OP_OPEN, AT_FDCWD_, (const void *)a0);
	case PH_SYS_NEWSTAT:
	case PH_SYS_NEWLSTAT: return enter_path(t, PH_OP_STAT, AT_FDCWD_, (const void *)a0);
	case PH_SYS_UNLINK: return enter_path(t, PH_OP_UNLINK, AT_FDCWD_, (const void *)a0);
	case PH_SYS_MKDIR: return enter_path(t, PH_OP_MKDIR, AT_FDCWD_, (const void *)a0);
	case PH_SYS_RENAME: return enter_path(t, PH_OP_RENAME, AT_FDCWD_, (const void *)a0);
	case PH_SYS_OPENAT:
	case PH_SYS_OPENAT2: return enter_path(t, PH_OP_OPEN, (int)a0, (const void *)a1);
	case PH_SYS_NEWFSTATAT:
	case PH_SYS_STATX: return enter_path(t, PH_OP_STAT, (int)a0, (const void *)a1);
	case PH_SYS_UNLINKAT: return enter_path(t, PH_OP_UNLINK, (int)a0, (const void *)a1);
	case PH_SYS_MKDIRAT: return enter_path(t, PH_OP_MKDIR, (int)a0, (const void *)a1);
	case PH_SYS_RENAMEAT:
	case PH_SYS_RENAMEAT2: return enter_path(t, PH_OP_RENAME, (int)a0, (const void *)a1);
	}
	return 0;
}

static __always_inline int exit_sys(__u32 kind, long ret)
{
	struct task_struct *t = bpf_get_current_task_btf();
	__u32 op = sys_op(kind);

	if (op == 0)
		return 0;
	if (op <= PH_OP_WRITEV)
		return exit_rw(t, op, ret);
	return exit_meta(t, op, ret);
}

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
