/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Pharos I/O tracer, kernel side: the constants the loader sets before load, the types
 * the skeleton sees, the maps and the kfuncs used.
 * Part of iotrace.bpf.c: included there once, after the libbpf headers, iotrace.h and the
 * tracer's #defines, in the order maps, attribution, helpers, syscalls. */
#pragma once

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
