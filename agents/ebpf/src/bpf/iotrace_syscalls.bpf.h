/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Pharos I/O tracer, kernel side: system calls, entry and exit: the call stashed at entry,
 * the file read at exit, Beacon's online merge of read/write-family requests into the pending
 * record, metadata calls with their path (dentry walk or user string), and the dispatch on
 * enum ph_sys shared by both attachments.
 * Part of iotrace.bpf.c: included there once, after the libbpf headers, iotrace.h and the
 * tracer's #defines, in the order maps, attribution, helpers, syscalls. */
#pragma once

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

/* Operation of each traced system call (enum ph_sys -> enum ph_op, 0 for none): a table, one
 * load at every exit of a traced kind of call (a switch compiles to a chain of branches). A
 * global (read-only data, not set by the loader): a static one has no valid BTF offset here. */
const volatile __u8 sys_op_table[32] = {
	[PH_SYS_READ] = PH_OP_READ,
	[PH_SYS_WRITE] = PH_OP_WRITE,
	[PH_SYS_PREAD64] = PH_OP_PREAD,
	[PH_SYS_PWRITE64] = PH_OP_PWRITE,
	[PH_SYS_READV] = PH_OP_READV,
	[PH_SYS_WRITEV] = PH_OP_WRITEV,
	[PH_SYS_CLOSE] = PH_OP_CLOSE,
	[PH_SYS_FSYNC] = PH_OP_FSYNC,
	[PH_SYS_FDATASYNC] = PH_OP_FDATASYNC,
	[PH_SYS_NEWFSTAT] = PH_OP_STAT,
	[PH_SYS_OPEN] = PH_OP_OPEN,
	[PH_SYS_OPENAT] = PH_OP_OPEN,
	[PH_SYS_OPENAT2] = PH_OP_OPEN,
	[PH_SYS_NEWSTAT] = PH_OP_STAT,
	[PH_SYS_NEWLSTAT] = PH_OP_STAT,
	[PH_SYS_NEWFSTATAT] = PH_OP_STAT,
	[PH_SYS_STATX] = PH_OP_STAT,
	[PH_SYS_UNLINK] = PH_OP_UNLINK,
	[PH_SYS_UNLINKAT] = PH_OP_UNLINK,
	[PH_SYS_MKDIR] = PH_OP_MKDIR,
	[PH_SYS_MKDIRAT] = PH_OP_MKDIR,
	[PH_SYS_RENAME] = PH_OP_RENAME,
	[PH_SYS_RENAMEAT] = PH_OP_RENAME,
	[PH_SYS_RENAMEAT2] = PH_OP_RENAME,
};

static __always_inline __u32 sys_op(__u32 kind)
{
	return kind < sizeof(sys_op_table) ? sys_op_table[kind] : 0;
}

#define POS (~0ULL) /* enter_rw: at the file position */

/* Entry of traced system call `kind` with arguments a0..a3 (the caller checked the filter). */
static __always_inline int enter_sys(struct task_struct *t, __u32 kind, __u64 a0, __u64 a1,
				     __u64 a2, __u64 a3)
{
	_Static_assert(PH_SYS_READ == PH_OP_READ && PH_SYS_WRITE == PH_OP_WRITE &&
			       PH_SYS_PREAD64 == PH_OP_PREAD && PH_SYS_PWRITE64 == PH_OP_PWRITE,
		       "read/write/pread64/pwrite64: kind == op");
	/* The most frequent calls first, with one branch (a switch is a chain of them): read,
	 * write (at the file position), pread64, pwrite64 (at their offset argument). */
	if (kind - PH_SYS_READ <= PH_SYS_PWRITE64 - PH_SYS_READ)
		return enter_rw(t, kind, (int)a0, a2, kind >= PH_SYS_PREAD64 ? a3 : POS);
	switch (kind) {
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

	/* A thread without any task local storage has no call stashed by enter_*: done with one
	 * load instead of a bpf_task_storage_get call (the exit of every untraced thread's I/O). */
	if (op == 0 || !t->bpf_storage)
		return 0;
	if (op <= PH_OP_WRITEV)
		return exit_rw(t, op, ret);
	return exit_meta(t, op, ret);
}
