//! Data generations shared by every daemon of the site (issue 26, item 6): the file
//! `<mdt>/data-gens`, [`SLOTS`] counters mapped `MAP_SHARED` by each daemon (as the targets'
//! `.pharos-target`, [`crate::shm`]). Every change of a file's data through any daemon (a write
//! or a gathered run reaching the targets, a truncate, a removal) bumps the counter of the file's
//! object id (`oid mod SLOTS`) once its bytes are on the targets. A page cache remembers the
//! counter it saw when it cached a file's pages and drops them when it differs at the next read:
//! a read through one daemon sees what another daemon wrote before it (a job moved to another
//! forwarding node, a file served by two). Two files sharing a counter only cost each other
//! pages. Cost: one atomic add per write and one atomic load per cached read.
use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use memmap2::MmapMut;

/// Counters in the file (64 KiB).
pub const SLOTS: usize = 8192;
const FILE: &str = "data-gens";

/// The mapped counters.
pub struct DataGens {
    map: MmapMut,
}

impl DataGens {
    /// Maps (creating if needed) `<mdt>/data-gens`.
    pub fn open(mdt: &Path) -> io::Result<DataGens> {
        Self::open_file(mdt, FILE)
    }

    /// Maps (creating if needed) counters of the same kind in `<mdt>/<name>` (e.g. the object
    /// moves of online migration, `backend/migrate.rs`).
    pub fn open_file(mdt: &Path, name: &str) -> io::Result<DataGens> {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(mdt.join(name))?;
        let size = (SLOTS * 8) as u64;
        if f.metadata()?.len() < size {
            f.set_len(size)?;
        }
        Ok(DataGens { map: unsafe { MmapMut::map_mut(&f)? } })
    }

    fn slot(&self, oid: u64) -> &AtomicU64 {
        let i = (oid % SLOTS as u64) as usize;
        // SAFETY: the map is page aligned and holds SLOTS u64s; they are only used atomically.
        unsafe { &*(self.map.as_ptr() as *const AtomicU64).add(i) }
    }

    /// The counter of `oid` now.
    pub fn get(&self, oid: u64) -> u64 {
        self.slot(oid).load(SeqCst)
    }

    /// The data of `oid` changed (its bytes are on the targets): returns the counter before.
    pub fn bump(&self, oid: u64) -> u64 {
        self.slot(oid).fetch_add(1, SeqCst)
    }
}
