// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* Pharos I/O tracer, kernel side.
 *
 * Syscall tracepoints (sys_enter_* / sys_exit_*) of the read/write family and of metadata
 * operations, filtered in the kernel to tasks below the watched root cgroups, plus block-layer
 * device requests (raw tracepoints block_rq_issue / block_rq_complete).
 *
 * Beacon's online compression (Yang et al., NSDI'19, section 3): per thread one pending
 * record; a read/write-family request merges into it when op, fd, file, size and result are
 * equal, result >= 0 and the offset is contiguous. The pending entry is guarded by a cmpxchg
 * word (`state`): the owning thread takes 0 -> 1, the periodic sweeper (program `sweep`, run by
 * user space through BPF_PROG_TEST_RUN) takes 0 -> 2. Whoever holds it may emit and reset the
 * pending record; an owner that finds it held emits its own request standalone. Hence every
 * request is emitted exactly once.
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

/* Set by the loader before load. */
const volatile struct ph_root roots[PH_MAX_ROOTS] = {};
const volatile __u32 nroots = 0;
const volatile bool block_all = true; /* record block requests of tasks outside jobs too */

/* Makes the event types visible in the skeleton's BTF-generated types. */
struct ph_path_event ph_path_event_type_ = {};
struct ph_pending ph_pending_type_ = {};
struct ph_counters ph_counters_type_ = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct ph_pending);
} pending SEC(".maps");

/* Call state of threads that found `pending` full: never merged. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct ph_pending);
} overflow SEC(".maps");

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

static const struct ph_pending zero_pending;
static const struct ph_counters zero_counters;

static __always_inline bool traced(void)
{
	for (int i = 0; i < PH_MAX_ROOTS; i++) {
		if (i >= nroots)
			break;
		if (bpf_get_current_ancestor_cgroup_id(roots[i].level) == roots[i].id)
			return true;
	}
	return false;
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

/* struct file * behind `fd` of the current task, NULL if none. BTF pointers are read
 * directly (exception-handled loads, cheaper than bpf_probe_read_kernel calls). */
static __always_inline struct file *fd_file(int fd)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct fdtable *fdt = t->files->fdt;
	struct file **arr;
	struct file *f = NULL;

	if (!fdt || fd < 0 || (unsigned int)fd >= fdt->max_fds)
		return NULL;
	arr = fdt->fd;
	bpf_probe_read_kernel(&f, sizeof(f), &arr[fd]);
	return f;
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

/* The calling thread's state: its `pending` entry, or an `overflow` entry when `pending` is
 * full (*ovf = true). */
static __always_inline struct ph_pending *thread_state(__u32 tid, bool create, bool *ovf)
{
	struct ph_pending *p = bpf_map_lookup_elem(&pending, &tid);

	*ovf = false;
	if (p || !create)
		goto out;
	bpf_map_update_elem(&pending, &tid, &zero_pending, BPF_NOEXIST);
	p = bpf_map_lookup_elem(&pending, &tid);
out:
	if (p)
		return p;
	*ovf = true;
	p = bpf_map_lookup_elem(&overflow, &tid);
	if (p || !create)
		return p;
	bpf_map_update_elem(&overflow, &tid, &zero_pending, BPF_ANY);
	return bpf_map_lookup_elem(&overflow, &tid);
}

static __always_inline int enter_fd(__u32 op, int fd, __u64 size, __u64 off, bool use_pos)
{
	struct ph_pending *p;
	struct file *f;
	bool ovf;
	__u32 tid;

	if (!traced())
		return 0;
	tid = (__u32)bpf_get_current_pid_tgid();
	p = thread_state(tid, true, &ovf);
	if (!p)
		return 0;
	if (ovf) /* fresh entry: no valid cache */
		p->cur_file = 0;
	f = fd_file(fd);
	file_identity(p, f);
	p->cur_offset = use_pos && f ? bpf_core_cast(f, struct file)->f_pos : off;
	p->cur_arg0 = 0;
	p->cur_fd = fd;
	p->cur_size = size;
	p->cur_op = op;
	p->cur_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int enter_path(__u32 op, int dirfd, const void *upath)
{
	struct ph_pending *p;
	bool ovf;
	__u32 tid;

	if (!traced())
		return 0;
	tid = (__u32)bpf_get_current_pid_tgid();
	p = thread_state(tid, true, &ovf);
	if (!p)
		return 0;
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
	__sync_fetch_and_and(&p->state, 0);
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

static __always_inline int exit_rw(__u32 op, long ret)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct ph_pending *p;
	struct ph_event *e;
	struct ph_event single;
	__u64 now;
	bool ovf;

	p = thread_state(tid, false, &ovf);
	if (!p || p->cur_op != op)
		return 0;
	p->cur_op = 0;
	now = bpf_ktime_get_ns();
	if (ovf) {
		struct ph_counters *c;

		fill(&single, p, op, now, ret);
		emit(&single);
		c = counters_of(single.cgroup_id);
		if (c)
			__sync_fetch_and_add(&c->unmerged_fallbacks, 1);
		return 0;
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

static __always_inline int exit_meta(__u32 op, long ret)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct ph_path_event *pe;
	struct ph_pending *p;
	__u32 zero = 0, len = 0;
	__u64 now;
	bool ovf;

	p = thread_state(tid, false, &ovf);
	if (!p || p->cur_op != op)
		return 0;
	p->cur_op = 0;
	now = bpf_ktime_get_ns();
	if (!ovf)
		flush_own(p); /* keep per-thread order: the pending run goes first */
	pe = bpf_map_lookup_elem(&scratch, &zero);
	if (!pe)
		return 0;
	fill(&pe->ev, p, op, now, ret);
	if (op == PH_OP_OPEN && ret >= 0) {
		struct file *f = fd_file((int)ret);

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
	if (ovf) {
		struct ph_counters *c = counters_of(pe->ev.cgroup_id);
		if (c)
			__sync_fetch_and_add(&c->unmerged_fallbacks, 1);
	}
	return 0;
}

#define ARG(i) (ctx->args[i])

/* read/write family */
#define RW(name, OP, FD, SIZE, OFF, USEPOS)                                            \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                       \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)                           \
	{                                                                                 \
		return enter_fd(OP, (int)(FD), (SIZE), (OFF), USEPOS);                        \
	}                                                                                 \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                        \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                             \
	{                                                                                 \
		return exit_rw(OP, ctx->ret);                                                 \
	}

RW(read, PH_OP_READ, ARG(0), ARG(2), 0, true)
RW(write, PH_OP_WRITE, ARG(0), ARG(2), 0, true)
RW(pread64, PH_OP_PREAD, ARG(0), ARG(2), ARG(3), false)
RW(pwrite64, PH_OP_PWRITE, ARG(0), ARG(2), ARG(3), false)

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

RW(readv, PH_OP_READV, ARG(0), iov_bytes((const void *)ARG(1), ARG(2)), 0, true)
RW(writev, PH_OP_WRITEV, ARG(0), iov_bytes((const void *)ARG(1), ARG(2)), 0, true)

/* fd-based metadata ops */
#define META_FD(name, OP)                                                              \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                       \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)                           \
	{                                                                                 \
		return enter_fd(OP, (int)ARG(0), 0, 0, false);                                \
	}                                                                                 \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                        \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                             \
	{                                                                                 \
		return exit_meta(OP, ctx->ret);                                               \
	}

META_FD(close, PH_OP_CLOSE)
META_FD(fsync, PH_OP_FSYNC)
META_FD(fdatasync, PH_OP_FDATASYNC)
META_FD(newfstat, PH_OP_STAT)

/* path-based ops: (dirfd, user path) */
#define META_PATH(name, OP, DIRFD, PATH)                                               \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                       \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)                           \
	{                                                                                 \
		return enter_path(OP, (int)(DIRFD), (const void *)(PATH));                    \
	}                                                                                 \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                        \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                             \
	{                                                                                 \
		return exit_meta(OP, ctx->ret);                                               \
	}

META_PATH(open, PH_OP_OPEN, AT_FDCWD_, ARG(0))
META_PATH(openat, PH_OP_OPEN, ARG(0), ARG(1))
META_PATH(openat2, PH_OP_OPEN, ARG(0), ARG(1))
META_PATH(newstat, PH_OP_STAT, AT_FDCWD_, ARG(0))
META_PATH(newlstat, PH_OP_STAT, AT_FDCWD_, ARG(0))
META_PATH(newfstatat, PH_OP_STAT, ARG(0), ARG(1))
META_PATH(statx, PH_OP_STAT, ARG(0), ARG(1))
META_PATH(unlink, PH_OP_UNLINK, AT_FDCWD_, ARG(0))
META_PATH(unlinkat, PH_OP_UNLINK, ARG(0), ARG(1))
META_PATH(mkdir, PH_OP_MKDIR, AT_FDCWD_, ARG(0))
META_PATH(mkdirat, PH_OP_MKDIR, ARG(0), ARG(1))
META_PATH(rename, PH_OP_RENAME, AT_FDCWD_, ARG(0))
META_PATH(renameat, PH_OP_RENAME, ARG(0), ARG(1))
META_PATH(renameat2, PH_OP_RENAME, ARG(0), ARG(1))

/* A thread exits: emit its pending record and free its entry. */
SEC("tracepoint/sched/sched_process_exit")
int on_exit(void *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct ph_pending *p = bpf_map_lookup_elem(&pending, &tid);

	bpf_map_delete_elem(&overflow, &tid);
	if (!p)
		return 0;
	for (int i = 0; i < 64; i++) {
		if (__sync_val_compare_and_swap(&p->state, 0, 1) == 0) {
			if (p->ev.count > 0) {
				emit(&p->ev);
				p->ev.count = 0;
			}
			/* never unlocked: a sweeper still holding a stale pointer cannot take it */
			bpf_map_delete_elem(&pending, &tid);
			return 0;
		}
	}
	return 0; /* the sweeper held it throughout: it emits the record; entry stays (count 0) */
}

struct sweep_ctx {
	__u64 now;
	__u64 min_age;
	__u64 emitted;
};

static long sweep_one(struct bpf_map *map, __u32 *key, struct ph_pending *p, struct sweep_ctx *c)
{
	if (p->ev.count == 0)
		return 0;
	if ((__s64)(c->now - p->ev.start_ns) < (__s64)c->min_age)
		return 0;
	if (__sync_val_compare_and_swap(&p->state, 0, 2) != 0)
		return 0;
	if (p->ev.count > 0) {
		emit(&p->ev);
		p->ev.count = 0;
		c->emitted++;
	}
	unlock(p);
	return 0;
}

/* Sweeper, run from user space with BPF_PROG_TEST_RUN every ~50 ms: emits every pending
 * record whose run started at least args[0] ns ago (0: all). Returns the number emitted. */
SEC("raw_tp")
int sweep(struct bpf_raw_tracepoint_args *ctx)
{
	struct sweep_ctx c = {};

	c.now = bpf_ktime_get_ns();
	c.min_age = ctx->args[0];
	bpf_for_each_map_elem(&pending, sweep_one, &c, 0);
	return (int)c.emitted;
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
