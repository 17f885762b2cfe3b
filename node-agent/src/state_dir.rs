//! Where neuron-monitor's configuration files live: the state directory, which holds
//! only what the agent writes. It must be a directory of the agent's user (or root's),
//! never a symbolic link; files in it are written through a fresh temporary file and a
//! rename, and a file the agent did not make (a link, another user's) is neither
//! followed nor deleted.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

use api::{monitor_config::MonitorConfig, node_config::content_hash};
use prometheus_client::metrics::counter::Counter;
use tokio::io::AsyncWriteExt;
use tracing::warn;

use crate::monitor::LaunchSpec;

/// neuron-monitor's flag naming its configuration file.
const CONFIG_FLAG: &str = "-c";

/// The name of the configuration file a launch spec starts neuron-monitor with.
fn config_file_name(spec: &LaunchSpec) -> Option<&str> {
    let at = spec.args.iter().rposition(|a| a == CONFIG_FLAG)?;
    Path::new(spec.args.get(at + 1)?).file_name()?.to_str()
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
        // Again before each write: the directory may have been replaced since the start.
        check_state_dir(&self.state_dir).await.map_err(std::io::Error::other)?;
        let path = self.state_dir.join(&name);
        write_file(&self.state_dir, &name, &body).await?;
        let in_force = in_force.and_then(config_file_name);
        self.remove_other_configs(&[Some(name.as_str()), in_force]).await;
        let silence_limit = self
            .silence_timeout
            .unwrap_or_else(|| (config.shortest_period().as_duration() * 3).max(Duration::from_secs(2)));
        let mut args = self.args.clone();
        args.extend([CONFIG_FLAG.to_owned(), path.display().to_string()]);
        Ok(LaunchSpec { program: self.program.clone(), args, silence_limit })
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
