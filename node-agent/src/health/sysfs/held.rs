//! The driver tree's files held open from one read to the next: a read of the tree costs
//! one `pread` a file instead of an open, a read and a close (most of what a read cost:
//! the path walk, the open file made and freed).
//!
//! A device's directory is held while its path leads to it (one `stat` a read: a driver
//! reload makes new directories). Within it, each subdirectory a file is read from is held
//! with its [`DirStamp`], taken with `fstat` once a read: a file renamed over another,
//! added or removed there changes it, and its files (and those found absent) are then
//! opened anew. At most `max` descriptors are held; beyond them, files are opened for each
//! read.

use std::{
    collections::HashMap,
    fs::File,
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::processes::procfs::{self, DirStamp};

/// The files the latest read of the tree left open.
#[derive(Default)]
pub struct HeldTree {
    max: usize,
    /// By device directory.
    devices: HashMap<PathBuf, HeldDir>,
    /// Descriptors held by the read in progress.
    held: usize,
}

impl HeldTree {
    pub fn new(max: usize) -> Self {
        HeldTree { max, ..HeldTree::default() }
    }

    /// Descriptors held open.
    pub fn count(&self) -> usize {
        self.held
    }

    /// The bound on descriptors held.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Starts a read: the previous read's directories, to be taken back by [`Self::take`].
    pub(super) fn begin(&mut self) -> HashMap<PathBuf, HeldDir> {
        self.held = 0;
        std::mem::take(&mut self.devices)
    }

    /// The directory `path` for this read: the one held since the previous read (in
    /// `before`) where its path still leads to it, else opened now; none where it cannot be
    /// opened or no descriptor is left for it.
    pub(super) fn take(&mut self, before: &mut HashMap<PathBuf, HeldDir>, path: &Path) -> Option<HeldDir> {
        let identity = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))?;
        let kept = before.remove(path).filter(|d| d.identity == identity);
        let mut dir = match kept {
            Some(dir) if self.held + dir.descriptors() <= self.max => dir,
            _ if self.held < self.max => {
                let opened = procfs::Dir::open(path).ok()?;
                // The directory opened may not be the one stat'ed (a reload between the
                // two): the next read's `stat` tells.
                HeldDir { identity, dir: opened, subdirs: HashMap::new() }
            }
            _ => return None,
        };
        self.held += dir.descriptors();
        for subdir in dir.subdirs.values_mut() {
            subdir.checked = false;
        }
        Some(dir)
    }

    /// Keeps `dir` (the directory `path`, as this read left it) for the next read.
    pub(super) fn keep(&mut self, path: &Path, dir: HeldDir) {
        self.devices.insert(path.to_owned(), dir);
    }

    /// One more descriptor held, if the bound allows.
    fn room(&mut self) -> bool {
        let room = self.held < self.max;
        self.held += usize::from(room);
        room
    }
}

/// A device's directory held open, with the subdirectories read from.
pub(super) struct HeldDir {
    identity: (u64, u64),
    dir: procfs::Dir,
    /// By path relative to the directory (`""`: the directory itself).
    subdirs: HashMap<String, Subdir>,
}

/// A subdirectory read from: held open (but the device's directory itself) with its
/// stamp, and its files by name: held open, or `None` where absent.
struct Subdir {
    dir: Option<procfs::Dir>,
    stamp: DirStamp,
    /// Whether this read took its stamp already.
    checked: bool,
    files: HashMap<String, Option<File>>,
}

impl HeldDir {
    fn descriptors(&self) -> usize {
        1 + self
            .subdirs
            .values()
            .map(|s| usize::from(s.dir.is_some()) + s.files.values().flatten().count())
            .sum::<usize>()
    }

    /// The text of the file `name` (a path relative to the directory), through `read`;
    /// `Ok(None)` when it does not exist.
    pub(super) fn read(
        &mut self,
        name: &str,
        tree: &mut HeldTree,
        read: impl Fn(&File) -> io::Result<Option<String>>,
    ) -> io::Result<Option<String>> {
        let (parent, file) = name.rsplit_once('/').unwrap_or(("", name));
        let Some(subdir) = subdir(&mut self.subdirs, &self.dir, parent, tree)? else {
            // Not held (no descriptor left for it): opened for this read.
            return match self.dir.open_as_path(name) {
                Ok(opened) => read(&opened),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            };
        };
        if let Some(held) = subdir.files.get(file) {
            let Some(held) = held else { return Ok(None) };
            let text = read(held);
            if text.is_err() {
                // Opened again next time.
                subdir.files.remove(file);
            }
            return text;
        }
        match self.dir.open_as_path(name) {
            Ok(opened) => {
                let text = read(&opened);
                if text.is_ok() && tree.room() {
                    subdir.files.insert(file.to_owned(), Some(opened));
                }
                text
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                subdir.files.insert(file.to_owned(), None);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// The subdirectory `parent` of `root` as of this read: the one held, its stamp taken once
/// a read (another: it is opened anew, its files forgotten), else opened now. `None` where
/// it is absent or no descriptor is left to hold it: its files are then opened for each read.
fn subdir<'s>(
    subdirs: &'s mut HashMap<String, Subdir>,
    root: &procfs::Dir,
    parent: &str,
    tree: &mut HeldTree,
) -> io::Result<Option<&'s mut Subdir>> {
    let anew = match subdirs.get_mut(parent) {
        Some(held) if held.checked => false,
        Some(held) => {
            let now = held.dir.as_ref().unwrap_or(root).metadata()?;
            held.checked = DirStamp::of(&now) == held.stamp;
            !held.checked
        }
        None => true,
    };
    if anew {
        subdirs.remove(parent);
        let Some(subdir) = open_subdir(root, parent, tree)? else { return Ok(None) };
        subdirs.insert(parent.to_owned(), subdir);
    }
    Ok(subdirs.get_mut(parent))
}

fn open_subdir(root: &procfs::Dir, parent: &str, tree: &mut HeldTree) -> io::Result<Option<Subdir>> {
    let dir = match parent {
        "" => None,
        _ if !tree.room() => return Ok(None),
        _ => match root.open_dir(parent) {
            Ok(dir) => Some(dir),
            Err(e) => {
                tree.held -= 1;
                return if e.kind() == io::ErrorKind::NotFound { Ok(None) } else { Err(e) };
            }
        },
    };
    let stamp = DirStamp::of(&dir.as_ref().unwrap_or(root).metadata()?);
    Ok(Some(Subdir { dir, stamp, checked: true, files: HashMap::new() }))
}
