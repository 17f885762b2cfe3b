//! Reads of files that may never return — a sysfs attribute whose driver handler hangs on
//! a wedged device, a FIFO in a hostile tree — done on a worker thread with a deadline.
//!
//! A reader ([`TimedReads`]) runs one job at a time (a whole read of a tree) on its worker
//! thread. Each file the job touches goes through [`Watch::access`], which notes the path
//! being read. When the job misses its deadline, the path it was on is blamed: it joins the
//! reader's set of stuck files, the worker is abandoned (it ends when its read returns, and
//! the path leaves the set then) and the next job runs on a new worker, skipping the stuck
//! files. So one stuck file holds one thread, never one per interval, and the rest of the
//! tree is still read. At most [`MAX_STUCK_READS`] files may be stuck at once: beyond that
//! the reader starts no more workers until one returns.

use std::{
    collections::BTreeSet,
    io,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

/// Longest a whole read of a tree may take before the file it is on counts as stuck.
/// A sysfs attribute answers in microseconds, a whole Neuron or EFA tree in milliseconds:
/// two seconds is far beyond a healthy read, and a new fault elsewhere is still seen
/// within it.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);

/// Files stuck at once (one thread each) before a reader stops starting workers.
pub const MAX_STUCK_READS: usize = 8;

type StuckSet = Arc<Mutex<BTreeSet<PathBuf>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a job sees of its reader: the stuck files to skip, and where it is.
pub struct Watch {
    stuck: StuckSet,
    /// The path being read, if any (`.1`); the buffer is reused from one to the next.
    current: Mutex<(PathBuf, bool)>,
    abandoned: AtomicBool,
}

impl Watch {
    /// A watch for a read without a deadline (tests, one-off reads): nothing is stuck.
    pub fn untimed() -> Watch {
        Watch::new(StuckSet::default())
    }

    /// A watch for which `paths` are stuck (tests of the readers).
    #[cfg(test)]
    pub fn with_stuck(paths: impl IntoIterator<Item = PathBuf>) -> Watch {
        Watch::new(Arc::new(Mutex::new(paths.into_iter().collect())))
    }

    fn new(stuck: StuckSet) -> Watch {
        Watch { stuck, current: Mutex::new((PathBuf::new(), false)), abandoned: AtomicBool::new(false) }
    }

    /// Runs `f` on `path` (open, read, list), noting the path while it runs. A path
    /// stuck earlier is not touched again: `TimedOut` at once.
    pub fn access<T>(&self, path: &Path, f: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
        if self.abandoned.load(Ordering::Relaxed) || lock(&self.stuck).contains(path) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "an earlier read of this file never returned"));
        }
        {
            let mut current = lock(&self.current);
            current.0.clear();
            current.0.push(path);
            current.1 = true;
        }
        let out = f(path);
        lock(&self.current).1 = false;
        // Blamed after the deadline (under `current`'s lock): the read returned, the file
        // is no longer stuck.
        if self.abandoned.load(Ordering::Relaxed) {
            lock(&self.stuck).remove(path);
        }
        out
    }

    /// The deadline passed: blames the file being read, if any; the job's later
    /// accesses fail at once.
    fn abandon(&self) -> Option<PathBuf> {
        self.abandoned.store(true, Ordering::Relaxed);
        let mut current = lock(&self.current);
        if !std::mem::replace(&mut current.1, false) {
            return None;
        }
        let blamed = current.0.clone();
        lock(&self.stuck).insert(blamed.clone());
        Some(blamed)
    }
}

/// Why a job gave no result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missed {
    /// It missed the deadline, on this file (none: between files, merely slow).
    Deadline(Option<PathBuf>),
    /// [`MAX_STUCK_READS`] files are stuck: no worker was started.
    TooManyStuck,
}

type Job = Box<dyn FnOnce() + Send>;

/// One reader's worker and stuck files.
pub struct TimedReads {
    name: &'static str,
    deadline: Duration,
    stuck: StuckSet,
    worker: Option<mpsc::Sender<Job>>,
}

impl TimedReads {
    /// `name`: the worker threads' name.
    pub fn new(name: &'static str, deadline: Duration) -> TimedReads {
        TimedReads { name, deadline, stuck: StuckSet::default(), worker: None }
    }

    /// Files whose read has not returned.
    pub fn stuck(&self) -> usize {
        lock(&self.stuck).len()
    }

    /// Runs `job` on the worker; its result, or why none came within the deadline.
    pub fn run<T: Send + 'static>(&mut self, work: impl FnOnce(&Watch) -> T + Send + 'static) -> Result<T, Missed> {
        let (tx, rx) = mpsc::sync_channel(1);
        let watch = self.submit(work, move |out| {
            let _ = tx.send(out);
        })?;
        rx.recv_timeout(self.deadline).map_err(|_| self.missed(&watch))
    }

    /// [`Self::run`] for an async caller: the worker's answer wakes the caller's task, with
    /// no thread of the blocking pool between them.
    pub async fn run_async<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&Watch) -> T + Send + 'static,
    ) -> Result<T, Missed> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let watch = self.submit(work, move |out| {
            let _ = tx.send(out);
        })?;
        match tokio::time::timeout(self.deadline, rx).await {
            Ok(Ok(out)) => Ok(out),
            _ => Err(self.missed(&watch)),
        }
    }

    /// Hands `work` to the worker, its result to `reply`; the job's watch.
    fn submit<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&Watch) -> T + Send + 'static,
        reply: impl FnOnce(T) + Send + 'static,
    ) -> Result<Arc<Watch>, Missed> {
        if self.stuck() >= MAX_STUCK_READS {
            return Err(Missed::TooManyStuck);
        }
        let watch = Arc::new(Watch::new(self.stuck.clone()));
        let job_watch = watch.clone();
        let job: Job = Box::new(move || reply(work(&job_watch)));
        let job = match self.worker()?.send(job) {
            Ok(()) => None,
            // The worker is gone (it panicked): a new one takes the job.
            Err(mpsc::SendError(job)) => Some(job),
        };
        if let Some(job) = job {
            self.worker = None;
            self.worker()?.send(job).map_err(|_| Missed::Deadline(None))?;
        }
        Ok(watch)
    }

    /// The job of `watch` missed the deadline: it keeps its worker, the next job gets a
    /// new one.
    fn missed(&mut self, watch: &Watch) -> Missed {
        self.worker = None;
        Missed::Deadline(watch.abandon())
    }

    /// Runs `work` again each time it misses the deadline on a file (that file is then
    /// skipped), at most once per file that may be stuck at once: the result, and each
    /// deadline missed on the way (to count and log).
    pub fn run_around_stuck<T: Send + 'static>(
        &mut self,
        work: impl Fn(&Watch) -> T + Send + Sync + 'static,
    ) -> (Result<T, Missed>, Vec<Missed>) {
        let work = Arc::new(work);
        let mut missed = Vec::new();
        loop {
            let work = work.clone();
            if let Some(done) = again_unless_done(self.run(move |watch| work(watch)), &mut missed) {
                return (done, missed);
            }
        }
    }

    /// [`Self::run_around_stuck`] for an async caller.
    pub async fn run_around_stuck_async<T: Send + 'static>(
        &mut self,
        work: impl Fn(&Watch) -> T + Send + Sync + 'static,
    ) -> (Result<T, Missed>, Vec<Missed>) {
        let work = Arc::new(work);
        let mut missed = Vec::new();
        loop {
            let work = work.clone();
            if let Some(done) = again_unless_done(self.run_async(move |watch| work(watch)).await, &mut missed) {
                return (done, missed);
            }
        }
    }

    fn worker(&mut self) -> Result<&mpsc::Sender<Job>, Missed> {
        if self.worker.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name(self.name.to_owned())
                .spawn(move || rx.into_iter().for_each(|job| job()))
                .map_err(|_| Missed::Deadline(None))?;
            self.worker = Some(tx);
        }
        self.worker.as_ref().ok_or(Missed::Deadline(None))
    }
}

/// After one try of [`TimedReads::run_around_stuck`]: its outcome, or `None` to try again
/// (a deadline missed on a file, noted in `missed`, while fewer than [`MAX_STUCK_READS`]
/// were).
fn again_unless_done<T>(outcome: Result<T, Missed>, missed: &mut Vec<Missed>) -> Option<Result<T, Missed>> {
    match outcome {
        Ok(out) => Some(Ok(out)),
        Err(m @ Missed::Deadline(Some(_))) if missed.len() < MAX_STUCK_READS => {
            missed.push(m);
            None
        }
        Err(Missed::Deadline(file)) => {
            missed.push(Missed::Deadline(file.clone()));
            Some(Err(Missed::Deadline(file)))
        }
        Err(Missed::TooManyStuck) => Some(Err(Missed::TooManyStuck)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::Receiver;

    /// A job that blocks on `path` until `release` gets a message.
    fn blocking(path: &'static str, release: Arc<Mutex<Receiver<()>>>) -> impl FnOnce(&Watch) -> u32 + Send {
        move |w: &Watch| {
            w.access(Path::new(path), |_| {
                let _ = lock(&release).recv();
                Ok(())
            })
            .map(|()| 1)
            .unwrap_or(0)
        }
    }

    #[test]
    fn a_stuck_file_is_blamed_skipped_and_released_when_it_returns() {
        let mut reads = TimedReads::new("test-reads", Duration::from_millis(100));
        let (release, released) = mpsc::channel();
        let released = Arc::new(Mutex::new(released));
        let missed = reads.run(blocking("/stuck", released.clone()));
        assert_eq!(missed, Err(Missed::Deadline(Some(PathBuf::from("/stuck")))));
        assert_eq!(reads.stuck(), 1);
        // The next job skips the stuck file at once, and reads the others.
        let out = reads.run(|w: &Watch| {
            let stuck = w.access(Path::new("/stuck"), |_| Ok(()));
            let other = w.access(Path::new("/other"), |_| Ok(7));
            (stuck.map_err(|e| e.kind()), other.ok())
        });
        assert_eq!(out, Ok((Err(io::ErrorKind::TimedOut), Some(7))));
        release.send(()).expect("the stuck job waits");
        let start = std::time::Instant::now();
        while reads.stuck() > 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "the returned read is still counted stuck");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(reads.run(|w: &Watch| w.access(Path::new("/stuck"), |_| Ok(3)).ok()), Ok(Some(3)));
    }

    /// The async twin: the same deadline, blame and skipping, the answer waking the task.
    #[test]
    fn an_async_caller_gets_the_same_deadline_and_skips() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let mut reads = TimedReads::new("test-reads", Duration::from_millis(100));
        let (release, released) = mpsc::channel();
        let released = Arc::new(Mutex::new(released));
        let missed = rt.block_on(reads.run_async(blocking("/stuck", released.clone())));
        assert_eq!(missed, Err(Missed::Deadline(Some(PathBuf::from("/stuck")))));
        let (out, missed) = rt.block_on(reads.run_around_stuck_async(|w: &Watch| {
            (w.access(Path::new("/stuck"), |_| Ok(())).is_err(), w.access(Path::new("/other"), |_| Ok(7)).ok())
        }));
        assert_eq!((out, missed), (Ok((true, Some(7))), vec![]));
        release.send(()).expect("the stuck job waits");
    }

    #[test]
    fn stuck_files_are_bounded() {
        let mut reads = TimedReads::new("test-reads", Duration::from_millis(20));
        let (release, released) = mpsc::channel();
        let released = Arc::new(Mutex::new(released));
        const PATHS: [&str; MAX_STUCK_READS] = ["/0", "/1", "/2", "/3", "/4", "/5", "/6", "/7"];
        for path in PATHS {
            assert!(matches!(reads.run(blocking(path, released.clone())), Err(Missed::Deadline(Some(_)))));
        }
        assert_eq!(reads.run(|_: &Watch| 1), Err(Missed::TooManyStuck));
        for _ in PATHS {
            release.send(()).expect("a stuck job waits");
        }
        let start = std::time::Instant::now();
        while reads.stuck() > 0 {
            assert!(start.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(reads.run(|_: &Watch| 1), Ok(1));
    }
}
