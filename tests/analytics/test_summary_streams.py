"""Standard streams are not data files (Darshan's STDIO records, <STDOUT>): a Slurm job's srun
writes its tasks' output through the descriptor 1 it inherited; the agent names that <STDOUT>.
The job stays N-1 with exactly its data bytes; the stream I/O is counted as non-file ``stdio``."""

from __future__ import annotations

from pharos_synthetic_jobs import MiB, event, rec

from pharos_analytics.pattern import is_system_path
from pharos_analytics.summary import job_summary


def test_stdout_is_stream_io_not_a_data_file(store):
    rows = [rec("slurm-42", r, "pwrite", "/scratch/shared.dat", MiB, MiB, 4, start=1 + r) for r in range(4)]
    rows += [rec("slurm-42", 0, "write", "<STDOUT>", 64, 64, 4, start=9), rec("slurm-42", 0, "read", "<STDIN>", 0, 0)]
    store.insert_rows("io_requests", rows)
    store.insert_rows("job_events", [event("slurm-42", "start", 0, name="mpi", ranks=4), event("slurm-42", "end", 10)])
    s = job_summary(store, "slurm-42")
    assert (s.pattern, s.io_ranks, s.n_files) == ("N-1", 4, 1), s
    assert s.bytes_written == 16 * MiB and [f.path for f in s.files] == ["/scratch/shared.dat"]
    assert s.non_file_ops.by_type == {"stdio": 5} and s.non_file_ops.bytes == 256
    assert sum(s.ops.values()) + s.non_file_ops.requests + sum(s.other_ops.values()) == s.requests
    assert is_system_path("<STDOUT>") and not is_system_path("/scratch/<STDOUT>")
