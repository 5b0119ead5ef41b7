//! The job and rank of the process behind a FUSE request, for its [`pharos_fwd_proto::Ctx`].
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Job id and rank of processes, cached per pid (bounded, 30 s TTL against pid reuse), by the
/// rule the eBPF agent applies too (`pharos-attribution`, proto/attribution): the job from the
/// `job_<ID>` component of the cgroup v2 path only (never the environment: a user can set
/// PHAROS_JOB_ID, not join a cgroup), the rank from the innermost launcher's variable (PMI_RANK,
/// PMIX_RANK, OMPI_COMM_WORLD_RANK, PHAROS_RANK, SLURM_PROCID), else the cgroup path's
/// `rank_<r>` / `task_<r>`. The process is alive: it is waiting for this request.
pub struct JobCache {
    m: Mutex<HashMap<u32, (Instant, String, i32)>>,
}

const JOB_CACHE_MAX: usize = 8192;
const JOB_TTL: Duration = Duration::from_secs(30);

/// Job id ("" none) and rank (-1 none) from /proc/<pid>/cgroup text and the environment block
/// (None: unreadable).
pub fn job_from_cgroup(cgroup: &str, environ: Option<&[u8]>) -> (String, i32) {
    pharos_attribution::attribute(cgroup, environ)
}

/// The environment block of `pid`, None when unreadable.
fn env_of(pid: u32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ")).ok()
}

impl JobCache {
    /// An empty cache.
    pub fn new() -> JobCache {
        JobCache { m: Mutex::new(HashMap::new()) }
    }

    /// Job id ("" none) and rank (-1 none) of process `pid` (pid 0, or a process gone: none),
    /// from the cache while its entry is younger than 30 s, else read from /proc.
    pub fn get(&self, pid: u32) -> (String, i32) {
        if pid == 0 {
            return (String::new(), -1);
        }
        if let Some((t, j, r)) = self.m.lock().unwrap().get(&pid) {
            if t.elapsed() < JOB_TTL {
                return (j.clone(), *r);
            }
        }
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return (String::new(), -1); // gone: nothing to cache
        };
        let (job, rank) = job_from_cgroup(&cgroup, env_of(pid).as_deref());
        let mut m = self.m.lock().unwrap();
        if m.len() >= JOB_CACHE_MAX {
            m.clear();
        }
        m.insert(pid, (Instant::now(), job.clone(), rank));
        (job, rank)
    }
}

impl Default for JobCache {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared attribution vectors (proto/attribution/vectors.json) through the mount's
    /// attribution: /proc/<pid>/cgroup text and environment → job and rank.
    #[test]
    fn attribution_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(pharos_attribution::VECTORS).unwrap()).unwrap();
        for c in doc["cases"].as_array().unwrap() {
            let env = c["environ"]
                .as_array()
                .map(|vars| vars.iter().map(|v| format!("{}\0", v.as_str().unwrap())).collect::<String>().into_bytes());
            let want = (c["job"].as_str().unwrap().to_string(), c["rank"].as_i64().unwrap() as i32);
            assert_eq!(job_from_cgroup(c["cgroup"].as_str().unwrap(), env.as_deref()), want, "case {}", c["name"]);
        }
    }

    /// A live process: its cgroup decides the job (a PHAROS_JOB_ID it sets is ignored), its
    /// environment the rank.
    #[test]
    fn job_cache_reads_a_live_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .env("PHAROS_JOB_ID", "spoofed")
            .env("PHAROS_RANK", "1")
            .env("PMI_RANK", "3")
            .spawn()
            .unwrap();
        let pid = child.id();
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let got = JobCache::new().get(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let in_job = !pharos_attribution::JobCgroup::from_proc_cgroup(&cgroup).job.is_empty();
        assert_ne!(got.0, "spoofed");
        assert_eq!(got, job_from_cgroup(&cgroup, Some(b"PHAROS_RANK=1\0PMI_RANK=3\0")));
        assert_eq!(got.1, if in_job { 3 } else { -1 });
    }
}
