/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Pharos I/O tracer, kernel side: attribution of a task to a watched root cgroup (the
 * in-kernel filter every program applies first).
 * Part of iotrace.bpf.c: included there once, after the libbpf headers, iotrace.h and the
 * tracer's #defines, in the order maps, attribution, helpers, syscalls. */
#pragma once

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
