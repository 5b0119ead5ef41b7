/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Pharos I/O tracer, kernel side: what every program uses: the loss counters, emitting a
 * record to the ring buffer, the file behind an fd and its identity, the per-thread state.
 * Part of iotrace.bpf.c: included there once, after the libbpf headers, iotrace.h and the
 * tracer's #defines, in the order maps, attribution, helpers, syscalls. */
#pragma once

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
