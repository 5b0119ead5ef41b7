//! Job and rank attribution: the one rule the eBPF agent (`pharos-agent`, client layer) and the
//! FUSE client (`pharos-mount`, forwarder layer) both apply, so a request carries the same job
//! id and rank on every layer.
//!
//! **Job id**: the last `job_<ID>` component of the process's cgroup v2 path, a `.scope` suffix
//! stripped, never the environment (joining a cgroup needs privilege, setting a variable does
//! not: a user-set `PHAROS_JOB_ID` is ignored). Layouts this covers:
//!
//! * `pharos run`: `<parent>/job_<ID>/rank_<r>`;
//! * Slurm's cgroup/v2 plugin: `.../slurmstepd.scope/job_<id>/step_<n>/user/task_<t>`;
//! * a systemd unit named after the job: `.../job_<ID>.scope`.
//!
//! From `/proc/<pid>/cgroup` text only the v2 line (`0::/path`) counts: on a hybrid host the v1
//! controllers' paths are not where jobs live for Pharos.
//!
//! **Rank**: the innermost launcher wins, i.e. the first valid of [`RANK_VARS`] in the process's
//! environment: MPI process managers set the rank on the MPI processes themselves (the leaves
//! of the process tree): `PMI_RANK` (MPICH's hydra, Slurm's pmi2), `PMIX_RANK` (PMIx, Open MPI
//! 4+), `OMPI_COMM_WORLD_RANK` (Open MPI); then `PHAROS_RANK` (`pharos run`, inherited by
//! whatever its rank launches); then `SLURM_PROCID` (srun; every process of an sbatch batch
//! script inherits 0 too, hence last). A value is valid when it is decimal digits only and at
//! most `i32::MAX`; an invalid one (empty, negative, `x`, ` 3`) is skipped as if absent. When
//! the environment holds none (or cannot be read: the process is gone), the rank is the
//! cgroup's: the last `rank_<r>` (`pharos run`) or `task_<r>` (Slurm) component below the job
//! component. Else, and for every process outside a job, -1.
//!
//! The cases both layers are tested on are in `vectors.json` beside this crate ([`VECTORS`]).

/// Rank variables, innermost launcher first: the first valid one present decides.
pub const RANK_VARS: [&str; 5] = ["PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PHAROS_RANK", "SLURM_PROCID"];

/// Path of the shared test vectors (`vectors.json`): cgroup text and environment → job and rank.
pub const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors.json");

/// What a process's cgroup v2 path says: its job ("" when none) and, below the job, its rank.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobCgroup {
    /// Job id, "" when the path has no `job_<ID>` component.
    pub job: String,
    /// The `rank_<r>` / `task_<r>` component below the job, if any.
    pub rank: Option<i32>,
}

/// Job id of a path component `job_<ID>` or `job_<ID>.scope`; None for anything else.
fn job_component(c: &str) -> Option<&str> {
    let id = c.strip_prefix("job_")?;
    let id = id.strip_suffix(".scope").unwrap_or(id);
    (!id.is_empty()).then_some(id)
}

/// A rank value: decimal digits only, at most `i32::MAX`.
fn parse_rank(v: &[u8]) -> Option<i32> {
    if v.is_empty() || v.len() > 10 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse::<i32>().ok()
}

impl JobCgroup {
    /// From a cgroup v2 path (absolute under the cgroup2 mount, or as in `/proc/<pid>/cgroup`).
    pub fn from_path(path: &str) -> JobCgroup {
        let comps: Vec<&str> = path.split('/').collect();
        let Some(at) = comps.iter().rposition(|c| job_component(c).is_some()) else {
            return JobCgroup::default();
        };
        let job = job_component(comps[at]).unwrap_or_default().to_string();
        let rank = comps[at + 1..].iter().rev().find_map(|c| {
            let r = c.strip_prefix("rank_").or_else(|| c.strip_prefix("task_"))?;
            parse_rank(r.as_bytes())
        });
        JobCgroup { job, rank }
    }

    /// From `/proc/<pid>/cgroup` text: its v2 line (`0::/path`), [`JobCgroup::default`] without one.
    pub fn from_proc_cgroup(text: &str) -> JobCgroup {
        cgroup_v2_path(text).map(JobCgroup::from_path).unwrap_or_default()
    }

    /// Rank of a process in this cgroup whose environment (NUL-separated `K=V` block, None when
    /// unreadable) is `environ`: the environment's rank, else the cgroup's, else -1; always -1
    /// outside a job.
    pub fn rank(&self, environ: Option<&[u8]>) -> i32 {
        if self.job.is_empty() {
            return -1;
        }
        environ.and_then(rank_of_environ).or(self.rank).unwrap_or(-1)
    }
}

/// The cgroup v2 path of `/proc/<pid>/cgroup` text (the `0::` line), None without one.
pub fn cgroup_v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim_end)
}

/// Rank from a NUL-separated environment block: the first valid of [`RANK_VARS`], None if none.
pub fn rank_of_environ(env: &[u8]) -> Option<i32> {
    let mut best: Option<(usize, i32)> = None;
    for kv in env.split(|&b| b == 0) {
        let Some(eq) = kv.iter().position(|&b| b == b'=') else { continue };
        let Some(prio) = RANK_VARS.iter().position(|v| v.as_bytes() == &kv[..eq]) else { continue };
        if best.is_some_and(|(p, _)| p <= prio) {
            continue;
        }
        if let Some(r) = parse_rank(&kv[eq + 1..]) {
            best = Some((prio, r));
        }
    }
    best.map(|(_, r)| r)
}

/// Job id ("" when none) and rank (-1 when none) of a process from its `/proc/<pid>/cgroup`
/// text and its environment block (None: unreadable, e.g. the process has exited).
pub fn attribute(proc_cgroup: &str, environ: Option<&[u8]>) -> (String, i32) {
    let cg = JobCgroup::from_proc_cgroup(proc_cgroup);
    let rank = cg.rank(environ);
    (cg.job, rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_vectors() {
        let text = std::fs::read_to_string(VECTORS).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 20, "{} cases", cases.len());
        for c in cases {
            let env = c["environ"]
                .as_array()
                .map(|vars| vars.iter().map(|v| v.as_str().unwrap()).collect::<Vec<_>>().join("\0").into_bytes());
            let got = attribute(c["cgroup"].as_str().unwrap(), env.as_deref());
            let want = (c["job"].as_str().unwrap().to_string(), c["rank"].as_i64().unwrap() as i32);
            assert_eq!(got, want, "case {}", c["name"]);
        }
    }
}
