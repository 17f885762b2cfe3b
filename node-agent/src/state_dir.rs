//! Where neuron-monitor's configuration files live: the state directory, which holds
//! only what the agent writes. It must be a directory of the agent's user (or root's),
//! never a symbolic link; files in it are written through a fresh temporary file and a
//! rename, and a file the agent did not make (a link, another user's) is neither
//! followed nor deleted.
//!
//! A directory refused for what it is (a link, not a directory, another user's) stops
//! the agent at start. One that cannot be written (a full or read-only file system)
//! does not: the agent runs degraded ([`status`]: a metric, a log line, `/readyz`'s
//! body), neuron-monitor reads its configuration from memory, and each file is written
//! again at its next attempt.

use std::{
    collections::BTreeMap,
    io::Write,
    os::unix::{fs::MetadataExt, io::FromRawFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use api::{monitor_config::MonitorConfig, node_config::content_hash};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::io::AsyncWriteExt;
use tracing::{info, warn};

use crate::monitor::LaunchSpec;

/// neuron-monitor's flag naming its configuration file.
const CONFIG_FLAG: &str = "-c";

/// The configuration file a launch spec starts neuron-monitor with.
fn config_path(spec: &LaunchSpec) -> Option<&str> {
    let at = spec.args.iter().rposition(|a| a == CONFIG_FLAG)?;
    spec.args.get(at + 1).map(String::as_str)
}

/// The name of the configuration file a launch spec starts neuron-monitor with.
fn config_file_name(spec: &LaunchSpec) -> Option<&str> {
    Path::new(config_path(spec)?).file_name()?.to_str()
}

/// How neuron-monitor is started, whatever the configuration.
#[derive(Clone, Debug)]
pub struct Launcher {
    pub program: PathBuf,
    /// Arguments before `-c FILE`.
    pub args: Vec<String>,
    /// Checked by [`check_state_dir`].
    pub state_dir: PathBuf,
    /// Fixed silence limit; default: three periods of the fastest group, at least 2 s.
    pub silence_timeout: Option<Duration>,
    /// Counts files of the state directory left alone (`neuron_agent_state_files_refused`).
    pub refused_files: Counter,
    /// Every configuration also asks for `neuron_k8s_info` (the attribution source where
    /// the kubelet's pod-resources socket is not mounted).
    pub k8s_info: bool,
    /// The configurations held in memory while the state directory cannot take them.
    pub in_memory: InMemoryConfigs,
}

/// Configurations neuron-monitor reads from memory (`memfd`), by the path it is given.
#[derive(Clone, Debug, Default)]
pub struct InMemoryConfigs(Arc<Mutex<Vec<(String, std::fs::File)>>>);

impl InMemoryConfigs {
    /// Holds `body` in memory; returns the path a child process of the agent opens it by
    /// (`/proc/<agent>/fd/<n>`: the descriptor is the agent's, not inherited).
    fn hold(&self, name: &str, body: &[u8]) -> std::io::Result<String> {
        let name = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
        // SAFETY: a valid NUL-terminated name and a constant flag; the descriptor returned
        // is new and owned by the File below.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor of this process that nothing else owns.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.write_all(body)?;
        let path = format!("/proc/{}/fd/{fd}", std::process::id());
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((path.clone(), file));
        Ok(path)
    }

    /// Keeps only the configurations at `keep` (the new one, and the one in force).
    fn retain(&self, keep: &[Option<&str>]) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).retain(|(path, _)| keep.contains(&Some(path.as_str())));
    }
}

impl Launcher {
    /// Writes `config` to `<state dir>/neuron-monitor-<hash>.json` (removing older
    /// files) and returns the spec that runs neuron-monitor on it.
    /// The file of `in_force` (the spec the supervisor may be starting neuron-monitor on
    /// at this moment) is kept too, until the next configuration: removing it could make
    /// that start read no file.
    pub async fn prepare(&self, config: &MonitorConfig, in_force: Option<&LaunchSpec>) -> std::io::Result<LaunchSpec> {
        let with_k8s_info;
        let config = if self.k8s_info {
            with_k8s_info = config.clone().with_k8s_info();
            &with_k8s_info
        } else {
            config
        };
        let body = serde_json::to_vec_pretty(config).map_err(std::io::Error::other)?;
        let name = format!("neuron-monitor-{}.json", content_hash(&body));
        let path = match self.write_config(&name, &body).await {
            Ok(path) => {
                status().written(StateFile::MonitorConfig);
                path.display().to_string()
            }
            Err(StateDirError::Io { source, .. }) => {
                // A full or read-only directory: neuron-monitor reads it from memory.
                status().failed(StateFile::MonitorConfig, &self.state_dir, &source);
                self.in_memory.hold(&name, &body)?
            }
            Err(refused) => return Err(std::io::Error::other(refused)),
        };
        self.in_memory.retain(&[Some(path.as_str()), in_force.and_then(config_path)]);
        let in_force = in_force.and_then(config_file_name);
        self.remove_other_configs(&[Some(name.as_str()), in_force]).await;
        let silence_limit = self
            .silence_timeout
            .unwrap_or_else(|| (config.shortest_period().as_duration() * 3).max(Duration::from_secs(2)));
        let mut args = self.args.clone();
        args.extend([CONFIG_FLAG.to_owned(), path]);
        Ok(LaunchSpec { program: self.program.clone(), args, silence_limit })
    }

    /// Writes the configuration `name` into the state directory, made again if missing
    /// and checked again before each write (it may have been replaced since the start).
    async fn write_config(&self, name: &str, body: &[u8]) -> Result<PathBuf, StateDirError> {
        open_state_dir(&self.state_dir).await?;
        let io = |source| StateDirError::Io { path: self.state_dir.clone(), source };
        write_file(&self.state_dir, name, body).await.map_err(io)?;
        Ok(self.state_dir.join(name))
    }

    /// Deletes the agent's older configurations (and temporary files); refuses (counts, logs) what it did not
    /// write. Deleting removes a directory entry, never what a link points to.
    async fn remove_other_configs(&self, keep: &[Option<&str>]) {
        let Ok(mut entries) = tokio::fs::read_dir(&self.state_dir).await else { return };
        while let Ok(Some(entry)) = entries.next_entry().await {
            let name = entry.file_name().to_string_lossy().into_owned();
            let config = name.starts_with("neuron-monitor-") && name.ends_with(".json");
            // Left by an agent that died while writing.
            let partial = name.starts_with(".neuron-monitor-") && name.ends_with(".partial");
            if !(config || partial) || keep.contains(&Some(name.as_str())) {
                continue;
            }
            // Of the entry itself: a symbolic link is not followed.
            match entry.metadata().await {
                Ok(meta) if meta.file_type().is_file() && meta.uid() == agent_uid() => {
                    let _ = tokio::fs::remove_file(entry.path()).await;
                }
                Ok(meta) => {
                    self.refused_files.inc();
                    warn!(
                        file = %entry.path().display(),
                        kind = file_kind(&meta),
                        owner = meta.uid(),
                        "left alone a file of the state directory the agent did not write"
                    );
                }
                Err(_) => {}
            }
        }
    }
}

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("state directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "state directory {path} is a symbolic link: give the directory itself (the agent never follows a link there)"
    )]
    Symlink { path: PathBuf },
    #[error("state directory {path} is not a directory but a {kind}")]
    NotADirectory { path: PathBuf, kind: &'static str },
    #[error("state directory {path} is owned by uid {owner}, not by the agent's user (uid {agent}) or root")]
    ForeignOwner { path: PathBuf, owner: u32, agent: u32 },
}

/// Creates the state directory when missing (mode 0700, its parents as usual) and
/// checks it: a directory, not a symbolic link, owned by the agent's user or by root
/// (a Kubernetes emptyDir is root's; root could replace the agent anyway).
pub async fn open_state_dir(path: &Path) -> Result<(), StateDirError> {
    let io = |source| StateDirError::Io { path: path.to_owned(), source };
    if let Err(e) = tokio::fs::symlink_metadata(path).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(io(e));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent).await.map_err(io)?;
        }
        let mut builder = tokio::fs::DirBuilder::new();
        builder.mode(0o700);
        match builder.create(path).await {
            Ok(()) => {}
            // Made meanwhile by someone else: checked below like any existing one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
    }
    check_state_dir(path).await
}

/// Opens the state directory at start: a directory refused for what it is (see
/// [`StateDirError`]) is an error; one that cannot be made or read (a full or read-only
/// file system) is not: the agent starts degraded, and each file's write says so.
pub async fn open_state_dir_at_start(path: &Path) -> Result<(), StateDirError> {
    match open_state_dir(path).await {
        Err(StateDirError::Io { path, source }) => {
            warn!(dir = %path.display(), error = %source,
                  "the state directory cannot be opened: starting degraded (neuron-monitor's configuration held in \
                   memory, the devices' health not persisted); written again at each attempt");
            Ok(())
        }
        other => other,
    }
}

/// The checks of [`open_state_dir`] on an existing directory.
pub async fn check_state_dir(path: &Path) -> Result<(), StateDirError> {
    let meta = tokio::fs::symlink_metadata(path)
        .await
        .map_err(|source| StateDirError::Io { path: path.to_owned(), source })?;
    let path = path.to_owned();
    if meta.file_type().is_symlink() {
        return Err(StateDirError::Symlink { path });
    }
    if !meta.is_dir() {
        return Err(StateDirError::NotADirectory { path, kind: file_kind(&meta) });
    }
    let agent = agent_uid();
    if meta.uid() != agent && meta.uid() != 0 {
        return Err(StateDirError::ForeignOwner { path, owner: meta.uid(), agent });
    }
    Ok(())
}

/// A file the agent keeps in the state directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateFile {
    /// neuron-monitor's configuration (held in memory while it cannot be written).
    MonitorConfig,
    /// The devices' health (`neuron-health.json`), persisted per boot.
    Health,
}

impl StateFile {
    pub const ALL: [StateFile; 2] = [StateFile::MonitorConfig, StateFile::Health];

    /// The `file` label of `neuron_agent_state_dir_degraded`.
    pub fn as_str(self) -> &'static str {
        match self {
            StateFile::MonitorConfig => "monitor_config",
            StateFile::Health => "health",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FileLabel {
    file: &'static str,
}

/// Which files of the state directory could not be written at their last attempt: the
/// agent runs on, degraded. One per agent process (it has one state directory).
#[derive(Debug, Default)]
pub struct StateDirStatus {
    failing: Mutex<BTreeMap<StateFile, String>>,
    degraded: Family<FileLabel, Gauge>,
}

/// The state directory's status, shared by its writers, `/metrics` and `/readyz`.
pub fn status() -> &'static StateDirStatus {
    static STATUS: OnceLock<StateDirStatus> = OnceLock::new();
    STATUS.get_or_init(|| {
        let status = StateDirStatus::default();
        for file in StateFile::ALL {
            let _ = status.degraded.get_or_create(&FileLabel { file: file.as_str() });
        }
        status
    })
}

impl StateDirStatus {
    /// Registers `neuron_agent_state_dir_degraded{file}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "neuron_agent_state_dir_degraded",
            "1 while a file of the state directory could not be written at its last attempt (monitor_config: \
             neuron-monitor reads its configuration from memory; health: the devices' health is not persisted)",
            self.degraded.clone(),
        );
    }

    /// `file` could not be written into `dir`: logged when it starts failing.
    pub fn failed(&self, file: StateFile, dir: &Path, error: &std::io::Error) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let why = format!("cannot write the {} in {}: {error}", file.description(), dir.display());
        if failing.insert(file, why.clone()).is_none() {
            warn!(file = file.as_str(), dir = %dir.display(), %error,
                  "degraded: {why}; the agent monitors on and writes it again at its next attempt");
        }
        self.degraded.get_or_create(&FileLabel { file: file.as_str() }).set(1);
    }

    /// `file` was written.
    pub fn written(&self, file: StateFile) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing.remove(&file).is_some() {
            info!(file = file.as_str(), "the state directory takes the {} again", file.description());
        }
        self.degraded.get_or_create(&FileLabel { file: file.as_str() }).set(0);
    }

    /// What `/readyz` says of a degraded state directory (`None`: not degraded).
    pub fn degraded(&self) -> Option<String> {
        let failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        (!failing.is_empty()).then(|| {
            let whys: Vec<&str> = failing.values().map(String::as_str).collect();
            format!("degraded: {}", whys.join("; "))
        })
    }
}

impl StateFile {
    fn description(self) -> &'static str {
        match self {
            StateFile::MonitorConfig => "neuron-monitor configuration (it runs from memory)",
            StateFile::Health => "devices' health (not persisted over a restart)",
        }
    }
}

fn agent_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// Writes `dir/name` atomically without following any link: a new temporary file of a
/// random name (O_CREAT|O_EXCL|O_NOFOLLOW: a planted link fails it), then a rename over
/// `name` (which replaces a link there rather than writing through it).
async fn write_file(dir: &Path, name: &str, body: &[u8]) -> std::io::Result<()> {
    let mut last = None;
    for _ in 0..8 {
        let partial = dir.join(format!(".{name}.{:016x}.partial", fastrand::u64(..)));
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW);
        let mut file = match options.open(&partial).await {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let written = async {
            file.write_all(body).await?;
            file.flush().await?;
            drop(file);
            tokio::fs::rename(&partial, dir.join(name)).await
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&partial).await;
        }
        return written;
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::TempDir;
    use api::duration::Period;

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// A new configuration keeps the file of the one in force (neuron-monitor may be
    /// starting on it) and removes those before it.
    #[tokio::test]
    async fn the_configuration_in_force_keeps_its_file_until_the_next() {
        let dir = TempDir::new("state-dir");
        let launcher = Launcher {
            program: "neuron-monitor".into(),
            args: Vec::new(),
            state_dir: dir.0.clone(),
            silence_timeout: None,
            refused_files: Counter::default(),
            k8s_info: false,
            in_memory: Default::default(),
        };
        let config = |secs| MonitorConfig::all_groups(Period::from_secs(secs));
        let name = |spec: &LaunchSpec| config_file_name(spec).unwrap().to_owned();
        let a = launcher.prepare(&config(1), None).await.unwrap();
        let b = launcher.prepare(&config(2), Some(&a)).await.unwrap();
        let mut both = vec![name(&a), name(&b)];
        both.sort();
        assert_eq!(files(&dir.0), both);
        let c = launcher.prepare(&config(3), Some(&b)).await.unwrap();
        let mut now = vec![name(&b), name(&c)];
        now.sort();
        assert_eq!(files(&dir.0), now, "the first one removed");
        assert!(c.args.ends_with(&[CONFIG_FLAG.to_owned(), dir.0.join(name(&c)).display().to_string()]));
    }
}
