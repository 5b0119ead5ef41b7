/* SPDX-License-Identifier: Apache-2.0 */
/* Pharos I/O tracer: types shared by the kernel side (iotrace.bpf.c) and the loader.
 * Plain C types only. User space reads them through the skeleton's BTF-generated types. */
#ifndef PHAROS_IOTRACE_H
#define PHAROS_IOTRACE_H

#define PH_MAX_ROOTS 8          /* watched root cgroups (id, level) */
#define PH_COMM_LEN 16
#define PH_PATH_BUF 4096        /* path bytes in a path event */
#define PH_NAME_MAX 256         /* bytes read per path component */
#define PH_PATH_DEPTH 32        /* path components walked in the kernel */
#define PH_ENV_CHUNK 16384      /* environment bytes per exec event (the scratch map is per-CPU) */
#define PH_ENV_CHUNKS 16        /* exec events per exec at most: 256 KiB of environment */

/* Values equal pharos.v1.Op (proto/pharos/v1/io.proto). */
enum ph_op {
	PH_OP_READ = 1,
	PH_OP_WRITE = 2,
	PH_OP_PREAD = 3,
	PH_OP_PWRITE = 4,
	PH_OP_READV = 5,
	PH_OP_WRITEV = 6,
	PH_OP_OPEN = 7,
	PH_OP_CLOSE = 8,
	PH_OP_FSYNC = 9,
	PH_OP_FDATASYNC = 10,
	PH_OP_STAT = 11,
	PH_OP_UNLINK = 12,
	PH_OP_MKDIR = 13,
	PH_OP_RENAME = 14,
	PH_OP_BLOCK_READ = 15,
	PH_OP_BLOCK_WRITE = 16,
	PH_OP_BLOCK_OTHER = 17,
	/* Not a pharos.v1.Op, never on the wire: a process of a watched cgroup exec'd; the event
	 * carries a chunk of its new environment (ph_env_event) for rank attribution. */
	PH_OP_EXEC = 255,
	/* Not a pharos.v1.Op either: a process of a watched cgroup forked a process; ev.pid is the
	 * parent, ev.tid the child (rank attribution until the child execs). */
	PH_OP_FORK = 254,
};

/* Traced system calls, the values of the loader-filled table `sys_kind` (syscall number ->
 * kind, 0: not traced). Named after their tracepoints (sys_enter_<name>). */
enum ph_sys {
	PH_SYS_NONE = 0,
	PH_SYS_READ = 1,
	PH_SYS_WRITE = 2,
	PH_SYS_PREAD64 = 3,
	PH_SYS_PWRITE64 = 4,
	PH_SYS_READV = 5,
	PH_SYS_WRITEV = 6,
	PH_SYS_CLOSE = 7,
	PH_SYS_FSYNC = 8,
	PH_SYS_FDATASYNC = 9,
	PH_SYS_NEWFSTAT = 10,
	PH_SYS_OPEN = 11,
	PH_SYS_OPENAT = 12,
	PH_SYS_OPENAT2 = 13,
	PH_SYS_NEWSTAT = 14,
	PH_SYS_NEWLSTAT = 15,
	PH_SYS_NEWFSTATAT = 16,
	PH_SYS_STATX = 17,
	PH_SYS_UNLINK = 18,
	PH_SYS_UNLINKAT = 19,
	PH_SYS_MKDIR = 20,
	PH_SYS_MKDIRAT = 21,
	PH_SYS_RENAME = 22,
	PH_SYS_RENAMEAT = 23,
	PH_SYS_RENAMEAT2 = 24,
};

#define PH_NR_SYSCALLS 512      /* size of the syscall number table */

/* ph_event.path_kind: what follows the fixed part of the event (ph_path_event.path). */
enum ph_path_kind {
	PH_PATH_NONE = 0,
	PH_PATH_DENTRY = 1,   /* components leaf first, each NUL-terminated ("c\0b\0a\0") */
	PH_PATH_USER = 2,     /* the user-space path argument, NUL-terminated, maybe relative */
	PH_PATH_ENV = 3,      /* PH_OP_EXEC: the environment block, NUL-separated K=V strings */
};

/* ph_event.flags */
#define PH_F_PATH_TRUNCATED 1  /* dentry walk stopped at PH_PATH_DEPTH or PH_PATH_BUF */
#define PH_F_NO_FILE 2         /* fd did not resolve to a struct file */
#define PH_F_ENV_TRUNCATED 4   /* PH_OP_EXEC: the environment is longer than the chunks sent */

/* One request or a merged run of `count` requests (Beacon's online compression).
 * Times are CLOCK_MONOTONIC ns (bpf_ktime_get_ns). dev is the kernel dev_t
 * ((major << 20) | minor). For path ops, fd holds the dirfd argument (AT_FDCWD = -100). */
struct ph_event {
	unsigned long long start_ns;
	unsigned long long end_ns;
	unsigned long long duration_ns;
	unsigned long long cgroup_id;
	unsigned long long dev;
	unsigned long long ino;
	unsigned long long offset;
	unsigned long long size;
	long long result;
	unsigned int pid;
	unsigned int tid;
	unsigned int count;
	int fd;
	unsigned int op;
	unsigned int mode;          /* i_mode of the file (S_IFMT bits give its type), 0 unknown */
	unsigned short path_len;    /* bytes used in ph_path_event.path */
	unsigned char path_kind;
	unsigned char flags;
	unsigned int pad;
	char comm[PH_COMM_LEN];
};

struct ph_path_event {
	struct ph_event ev;
	char path[PH_PATH_BUF];
};

/* PH_OP_EXEC: ev.path_len bytes of the environment from byte ev.offset follow the fixed part;
 * ev.size is the environment's whole length. Chunks of one exec are sent in order. */
struct ph_env_event {
	struct ph_event ev;
	char env[PH_ENV_CHUNK];
};

/* Per-thread state (task local storage map `tstate`).
 * `state`: 0 free, 1 held by the owning thread, 2 held by the sweeper (cmpxchg lock).
 * `ev` is the pending (mergeable) record, protected by `state`; ev.count == 0 means none.
 * The cur_* fields describe the system call in flight; only the owning thread touches them.
 * cur_offset is ~0 from the entry of a call at the file position until its exit. */
struct ph_pending {
	unsigned int state;
	unsigned int cur_op;        /* 0: no call in flight */
	struct ph_event ev;
	unsigned long long cur_start_ns;
	unsigned long long cur_offset;
	unsigned long long cur_size;
	unsigned long long cur_arg0;   /* user pointer of the path argument (path ops), else 0 */
	unsigned long long cur_file;   /* struct file * of cur_fd, cached with its identity */
	unsigned long long cur_inode;  /* struct inode * of cur_file */
	unsigned long long file_dev;
	unsigned long long file_ino;
	unsigned int file_mode;
	int cur_fd;
};

/* Per-cgroup-id loss counters (map `counters`). */
struct ph_counters {
	unsigned long long ringbuf_drops;       /* records bpf_ringbuf_output could not place */
	unsigned long long unmerged_fallbacks;  /* requests emitted unmerged (none since per-thread
						 * state is task local storage; kept for the metric) */
};

/* A watched root cgroup: a task is traced when its ancestor at `level` has id `id`. */
struct ph_root {
	unsigned long long id;
	unsigned int level;
	unsigned int pad;
};

#endif
