//! The health readers' stop, set once at shutdown. The readers live on blocking threads
//! and wait most of the time (for a driver notification, the kernel log, the next read);
//! they wait on the stop too, instead of waking every so often to look at a flag: an idle
//! agent's wake-ups are CPU on every node, all the time.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{Condvar, Mutex},
    time::Duration,
};

pub struct Stop {
    set: Mutex<bool>,
    changed: Condvar,
    /// An eventfd, readable once the stop is set: a reader in `poll()` wakes on it. `None`
    /// where the kernel gave none (out of descriptors): such a wait looks at the flag
    /// every [`POLL_TICK`].
    fd: Option<OwnedFd>,
}

/// Longest single `poll()` of a wait that has no descriptor to wake it at the stop.
const POLL_TICK: Duration = Duration::from_millis(500);

impl Default for Stop {
    fn default() -> Self {
        Stop::new()
    }
}

impl Stop {
    pub fn new() -> Stop {
        // SAFETY: eventfd takes no pointer; a descriptor it returns is owned by nothing else.
        let fd = unsafe {
            let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            (fd >= 0).then(|| OwnedFd::from_raw_fd(fd))
        };
        Stop { set: Mutex::new(false), changed: Condvar::new(), fd }
    }

    pub fn set(&self) {
        *self.set.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
        if let Some(fd) = &self.fd {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to an eventfd this owns.
            unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    pub fn is_set(&self) -> bool {
        *self.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps `duration`, or until the stop: whether it is set.
    pub fn sleep(&self, duration: Duration) -> bool {
        let set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        let (set, _) = self.changed.wait_timeout_while(set, duration, |set| !*set).unwrap_or_else(|p| p.into_inner());
        *set
    }

    /// `poll()` of `fds` for at most `timeout`, woken by the stop as well: the number of
    /// `fds` with events (0 at the timeout or the stop; then [`Stop::is_set`] tells).
    pub fn poll(&self, fds: &mut Vec<libc::pollfd>, timeout: Duration) -> usize {
        let (watched, timeout) = match &self.fd {
            Some(fd) => {
                fds.push(libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
                (fds.len() - 1, timeout)
            }
            None => (fds.len(), timeout.min(POLL_TICK)),
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `fds` are valid pollfds (the caller's open files and this eventfd), live
        // for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        fds.truncate(watched);
        if n <= 0 {
            return 0;
        }
        fds.iter().filter(|p| p.revents != 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{sync::Arc, time::Instant};

    #[test]
    fn a_sleep_and_a_poll_end_at_the_stop() {
        let stop = Arc::new(Stop::new());
        assert!(!stop.sleep(Duration::from_millis(10)), "not set: the whole sleep");
        let setter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                stop.set();
            })
        };
        let started = Instant::now();
        let mut none = Vec::new();
        assert_eq!(stop.poll(&mut none, Duration::from_secs(30)), 0);
        assert!(stop.is_set() && none.is_empty());
        assert!(stop.sleep(Duration::from_secs(30)));
        assert!(started.elapsed() < Duration::from_secs(10), "woken by the stop, not the timeout");
        setter.join().expect("setter");
    }

    #[test]
    fn a_poll_counts_the_callers_descriptors_with_events() {
        let stop = Stop::new();
        let mut pipe = [0; 2];
        // SAFETY: pipe fills two descriptors, closed below.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        let mut fds = vec![libc::pollfd { fd: pipe[0], events: libc::POLLIN, revents: 0 }];
        assert_eq!(stop.poll(&mut fds, Duration::from_millis(10)), 0);
        // SAFETY: one byte to the pipe's write end.
        assert_eq!(unsafe { libc::write(pipe[1], b"x".as_ptr().cast(), 1) }, 1);
        assert_eq!(stop.poll(&mut fds, Duration::from_secs(30)), 1);
        assert_eq!(fds.len(), 1, "the stop's descriptor is not left in the caller's set");
        // SAFETY: closes the pipe made above.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
    }
}
