//! The library's one state behind a mutex: the init count, the machine read from the file
//! (re-read when the file changes), the event sets and what each has delivered.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::config::{self, MAX_FILE_BYTES, MAX_GPUS};
use crate::machine::Machine;

/// The environment variable naming the configuration file.
pub const CONFIG_ENV: &str = "FAKE_NVML_CONFIG";
/// How often calls look at the file's modification time.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// How many event sets may be open at once.
pub const MAX_EVENT_SETS: usize = 64;

/// Why init failed, as the NVML code it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitError {
    /// No `FAKE_NVML_CONFIG`: the fake behaves as a machine whose driver is not loaded.
    NoConfig,
    /// The file is missing, too large or malformed.
    BadConfig,
}

#[derive(Debug)]
pub struct Library {
    init_count: u32,
    source: Option<Source>,
    machine: Option<Arc<Machine>>,
    pub event_sets: [Option<EventSet>; MAX_EVENT_SETS],
    started: Option<Instant>,
}

#[derive(Debug)]
struct Source {
    path: PathBuf,
    stamp: Option<(SystemTime, u64)>,
    checked_at: Instant,
}

/// One event set: the event types each GPU registered, and how many of each GPU's Xid codes
/// this set has delivered (each set sees every code once, as NVML delivers to every set).
#[derive(Debug, Clone)]
pub struct EventSet {
    pub registered: [u64; MAX_GPUS],
    pub delivered: [usize; MAX_GPUS],
}

impl Default for EventSet {
    fn default() -> Self {
        EventSet { registered: [0; MAX_GPUS], delivered: [0; MAX_GPUS] }
    }
}

static LIBRARY: Mutex<Library> = Mutex::new(Library {
    init_count: 0,
    source: None,
    machine: None,
    event_sets: [const { None }; MAX_EVENT_SETS],
    started: None,
});

/// The state, locked; a panic in another call does not poison it for the rest.
pub fn lock() -> MutexGuard<'static, Library> {
    LIBRARY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Library {
    /// nvmlInit: (re)reads the file named by the environment, then counts one more user.
    pub fn init(&mut self) -> Result<(), InitError> {
        let Some(path) = std::env::var_os(CONFIG_ENV) else {
            eprintln!("fake NVML: {CONFIG_ENV} is not set; answering as a machine without the NVIDIA driver");
            return Err(InitError::NoConfig);
        };
        let path = PathBuf::from(path);
        let stamp = stamp_of(&path);
        let machine = load(&path).map_err(|e| {
            eprintln!("fake NVML: {}: {e}", path.display());
            InitError::BadConfig
        })?;
        self.machine = Some(Arc::new(machine));
        self.source = Some(Source { path, stamp, checked_at: Instant::now() });
        self.started.get_or_insert_with(Instant::now);
        self.init_count = self.init_count.saturating_add(1);
        Ok(())
    }

    /// nvmlShutdown: one user fewer; the last one closes the event sets. False: not initialized.
    pub fn shutdown(&mut self) -> bool {
        if self.init_count == 0 {
            return false;
        }
        self.init_count -= 1;
        if self.init_count == 0 {
            self.event_sets = [const { None }; MAX_EVENT_SETS];
        }
        true
    }

    /// The machine as the file says now (re-read if it changed), or None before init.
    pub fn machine(&mut self) -> Option<Arc<Machine>> {
        if self.init_count == 0 {
            return None;
        }
        self.refresh();
        self.machine.clone()
    }

    /// Milliseconds since the first init, for the energy counter.
    pub fn uptime_ms(&self) -> u64 {
        self.started.map_or(0, |s| u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// Re-reads the file when its modification time or size changed, at most every
    /// CHECK_EVERY; a bad edit is said once on stderr and the last good machine stays.
    fn refresh(&mut self) {
        let Some(source) = self.source.as_mut() else { return };
        if source.checked_at.elapsed() < CHECK_EVERY {
            return;
        }
        source.checked_at = Instant::now();
        let stamp = stamp_of(&source.path);
        if stamp == source.stamp {
            return;
        }
        source.stamp = stamp;
        match load(&source.path) {
            Ok(machine) => self.machine = Some(Arc::new(machine)),
            Err(e) => eprintln!("fake NVML: {}: {e}; keeping the previous configuration", source.path.display()),
        }
    }
}

fn stamp_of(path: &std::path::Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The machine a file describes; at most MAX_FILE_BYTES are read.
pub fn load(path: &std::path::Path) -> Result<Machine, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("more than {MAX_FILE_BYTES} bytes"));
    }
    config::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_test_support::TempDir;

    #[test]
    fn a_file_over_the_limit_is_refused_and_a_missing_one_is_said() {
        let dir = TempDir::new("nvml-fake-load");
        let padding = "#".repeat(MAX_FILE_BYTES as usize);
        let big = dir.write("big.yaml", format!("instance_type: g5.xlarge\n{padding}"));
        assert!(load(&big).unwrap_err().contains("more than"));
        let small = dir.write("small.yaml", "instance_type: g5.xlarge\n");
        assert_eq!(load(&small).map(|m| m.gpus.len()), Ok(1));
        assert!(load(&dir.path().join("absent.yaml")).is_err());
    }
}
