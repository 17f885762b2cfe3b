//! The kernel log: `/dev/kmsg` records, the `NEURON_HW_ERR=<NAME>` lines the Neuron
//! runtime has the driver print, and the driver's own `neuron:<function>: ` error records.
//!
//! [`Follower`] reads the log off the report path, on a thread of its own: from the end,
//! after a bounded look-back at start-up; an overrun (`EPIPE`) is counted and reading
//! continues. A regular file given as the path is followed as it grows (tests).

use std::{
    fs,
    io::{self, Read, Seek, SeekFrom},
    os::unix::{fs::FileTypeExt, io::AsRawFd},
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use api::limits::{MAX_KMSG_RECORDS_PER_BATCH, MAX_KMSG_RECORD_BYTES, MAX_NEURONCORES_PER_DEVICE, MAX_NEURON_DEVICES};

/// Bytes of a field value kept from a record (names, actions, serial numbers).
const MAX_FIELD_BYTES: usize = 64;

/// One `/dev/kmsg` record: `<prefix>,<seq>,<usec since boot>,<flags>[,…];<text>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Syslog level (0 emergency … 7 debug): the prefix's low three bits.
    pub level: u8,
    pub seq: u64,
    pub usec: u64,
    /// Flag `c`: this text continues the previous record's.
    pub continues: bool,
    /// The message, without the continuation (dictionary) lines.
    pub text: &'a str,
}

/// Parses one record; `None` when the line has no record header (a plain text line).
/// Continuation lines (starting with a space) after the first line are left out of
/// `text`.
pub fn parse_record(raw: &str) -> Option<Record<'_>> {
    let (header, rest) = raw.split_once(';')?;
    let mut fields = header.split(',');
    let prefix: u32 = fields.next()?.trim().parse().ok()?;
    let seq: u64 = fields.next()?.parse().ok()?;
    let usec: u64 = fields.next()?.parse().ok()?;
    let flags = fields.next().unwrap_or("-");
    let text = rest.split('\n').next().unwrap_or_default();
    Some(Record { level: (prefix & 7) as u8, seq, usec, continues: flags.contains('c'), text })
}

/// `NEURON_HW_ERR=<NAME>` and its fields, wherever it starts in the line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HwError {
    pub name: String,
    /// `nd-id`, when a device index below the limit.
    pub device: Option<u32>,
    /// `nc-id`, when a core index below the limit.
    pub core: Option<u32>,
    pub serial: Option<String>,
    pub action: Option<String>,
    /// Fields whose value was out of bounds and left out.
    pub refused: usize,
}

/// A record the agent acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    HwError(HwError),
    /// `neuron:<function>: …` at error level or worse.
    DriverError {
        function: String,
    },
}

fn token_ok(t: &str, extra: &[u8]) -> bool {
    !t.is_empty() && t.len() <= MAX_FIELD_BYTES && t.bytes().all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

/// Parses the message of a record (or a plain line). `level` is the record's syslog
/// level, when it has one: driver messages count only at error level or worse.
pub fn parse_event(text: &str, level: Option<u8>) -> Option<Event> {
    if let Some(at) = text.find("NEURON_HW_ERR=") {
        let mut tokens = text[at..].split_ascii_whitespace();
        let name = tokens.next()?.strip_prefix("NEURON_HW_ERR=")?;
        if !token_ok(name, b"_") {
            return None;
        }
        let mut e = HwError { name: name.to_owned(), ..HwError::default() };
        for token in tokens {
            let Some((key, value)) = token.split_once('=') else { continue };
            let bounded = |limit: u32| value.parse::<u32>().ok().filter(|n| *n < limit);
            match key {
                "nd-id" => match bounded(MAX_NEURON_DEVICES) {
                    Some(n) => e.device = Some(n),
                    None => e.refused += 1,
                },
                // nc-id: the core within the device (a host index on older runtimes), so
                // bounded by the cores of a whole node.
                "nc-id" => match bounded(MAX_NEURON_DEVICES * MAX_NEURONCORES_PER_DEVICE) {
                    Some(n) => e.core = Some(n),
                    None => e.refused += 1,
                },
                "serial-num" if value.is_empty() => {}
                "serial-num" if token_ok(value, b"") => e.serial = Some(value.to_ascii_lowercase()),
                "action" if token_ok(value, b"_-") => e.action = Some(value.to_owned()),
                "serial-num" | "action" => e.refused += 1,
                _ => {}
            }
        }
        return Some(Event::HwError(e));
    }
    let rest = text.strip_prefix("neuron:")?;
    if level.is_some_and(|l| l > 3) {
        return None;
    }
    let (function, _) = rest.split_once(':')?;
    let function = function.trim();
    token_ok(function, b"_").then(|| Event::DriverError { function: function.to_owned() })
}

// ---------------------------------------------------------------------------------------
// Following the log.
// ---------------------------------------------------------------------------------------

/// What one batch of records gave.
#[derive(Debug, Default)]
pub struct Batch {
    /// Events with the record's sequence number, when it has one.
    pub events: Vec<(Option<u64>, Event)>,
    /// The last sequence number read (so that a restart does not count a record twice).
    pub last_seq: Option<u64>,
    pub records: u64,
    pub overruns: u64,
    pub too_long: u64,
    /// Fields out of bounds.
    pub refused: u64,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.records == 0 && self.overruns == 0 && self.too_long == 0
    }
}

/// How far back the follower reads at start-up.
#[derive(Clone, Debug)]
pub struct LookBack {
    pub window: Duration,
    /// Time since boot now (`/proc/uptime`), to which record timestamps compare.
    pub uptime: Option<Duration>,
    /// Records up to this sequence number were already counted (by the previous agent
    /// of this boot).
    pub after_seq: Option<u64>,
}

impl LookBack {
    fn keeps(&self, record: &Record<'_>) -> bool {
        if self.after_seq.is_some_and(|s| record.seq <= s) {
            return false;
        }
        match self.uptime {
            Some(now) => Duration::from_micros(record.usec) + self.window >= now,
            None => true,
        }
    }
}

/// Bytes of history read from a regular file at start-up (a real `/dev/kmsg` keeps
/// its own bounded ring buffer).
const FILE_HISTORY_BYTES: u64 = 1024 * 1024;
/// How often a regular file is checked for new lines, and a partial last line is
/// waited for before it is taken as complete.
const FILE_TICK: Duration = Duration::from_millis(100);
/// Longest wait in `poll()` on `/dev/kmsg`, so that shutdown is noticed.
const DEVICE_TICK_MS: i32 = 500;

pub struct Follower {
    pub path: PathBuf,
    pub look_back: LookBack,
}

/// The state carried between lines: the previous record's text, for continuations.
#[derive(Default)]
struct Parser {
    previous: String,
    previous_seq: Option<u64>,
    /// The previous record gave an event.
    previous_event: bool,
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

impl Parser {
    /// One record (or plain line) → the batch. `history`: read at start-up, judged by the look-back.
    fn take(&mut self, raw: &str, history: Option<&LookBack>, batch: &mut Batch) {
        batch.records += 1;
        let (seq, level, text, continues) = match parse_record(raw) {
            Some(r) => {
                batch.last_seq = Some(r.seq);
                if history.is_some_and(|h| !h.keeps(&r)) {
                    self.previous.clear();
                    self.previous_event = false;
                    return;
                }
                (Some(r.seq), Some(r.level), r.text, r.continues)
            }
            // A plain line cannot be placed in time: history is skipped.
            None if history.is_some() => return,
            None => (None, None, raw.split('\n').next().unwrap_or_default(), false),
        };
        if continues && !self.previous.is_empty() {
            // The text continues the previous record's: read them as one line. An event
            // of the previous record still in this batch is replaced by the whole line's;
            // one handed on already stays as it was (counted once).
            self.previous.push_str(text);
            cut(&mut self.previous, MAX_KMSG_RECORD_BYTES);
            if let Some(event) = parse_event(&self.previous, level) {
                if !self.previous_event {
                    self.push(seq, event, batch);
                } else if let Some(last) = batch.events.last_mut().filter(|(s, _)| *s == self.previous_seq) {
                    *last = (seq, event);
                }
            }
        } else {
            self.previous.clear();
            self.previous.push_str(text);
            self.previous_event = false;
            if let Some(event) = parse_event(text, level) {
                self.push(seq, event, batch);
            }
        }
        self.previous_seq = seq;
    }

    fn push(&mut self, seq: Option<u64>, event: Event, batch: &mut Batch) {
        if let Event::HwError(e) = &event {
            batch.refused += e.refused as u64;
        }
        batch.events.push((seq, event));
        self.previous_event = true;
    }
}

impl Follower {
    /// Follows the log until `stop`, handing each non-empty batch to `sink`. Returns an
    /// error only when the path cannot be opened at all.
    pub fn run(self, stop: &AtomicBool, mut sink: impl FnMut(Batch)) -> io::Result<()> {
        let file = fs::OpenOptions::new().read(true).custom_flags_nonblock().open(&self.path)?;
        if file.metadata()?.file_type().is_char_device() {
            self.follow_device(file, stop, &mut sink)
        } else {
            self.follow_file(file, stop, &mut sink)
        }
    }

    /// `/dev/kmsg`: one record per `read()`, from the start of the kernel's buffer; the
    /// records older than the look-back are skipped.
    fn follow_device(&self, mut file: fs::File, stop: &AtomicBool, sink: &mut impl FnMut(Batch)) -> io::Result<()> {
        let mut buf = vec![0u8; MAX_KMSG_RECORD_BYTES + 1];
        let mut parser = Parser::default();
        let mut history = true;
        while !stop.load(Ordering::Relaxed) {
            let mut batch = Batch::default();
            while batch.records < MAX_KMSG_RECORDS_PER_BATCH as u64 {
                match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let raw = String::from_utf8_lossy(&buf[..n]);
                        parser.take(raw.trim_end_matches('\n'), history.then_some(&self.look_back), &mut batch);
                    }
                    // Overrun: the kernel dropped records before we read them; the next read
                    // returns the oldest one left.
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => batch.overruns += 1,
                    // A record longer than the buffer (cannot happen with the kernel's bound).
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => batch.too_long += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        history = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let full = batch.records >= MAX_KMSG_RECORDS_PER_BATCH as u64;
            if !batch.is_empty() {
                sink(batch);
            }
            if !full {
                let mut fd = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut fd, 1, DEVICE_TICK_MS) };
            }
        }
        Ok(())
    }

    /// A regular file: the last [`FILE_HISTORY_BYTES`] judged by the look-back, then
    /// every line appended, checked every [`FILE_TICK`].
    fn follow_file(&self, mut file: fs::File, stop: &AtomicBool, sink: &mut impl FnMut(Batch)) -> io::Result<()> {
        let len = file.metadata()?.len();
        let start = len.saturating_sub(FILE_HISTORY_BYTES);
        file.seek(SeekFrom::Start(start))?;
        let mut lines = LineBuffer { skip_first: start > 0, ..LineBuffer::default() };
        let mut parser = Parser::default();
        let mut offset = start;
        let mut history = Some(&self.look_back);
        let mut chunk = vec![0u8; 64 * 1024];
        while !stop.load(Ordering::Relaxed) {
            let mut batch = Batch::default();
            loop {
                let n = file.read(&mut chunk)?;
                offset += n as u64;
                if n == 0 {
                    // The file was truncated or replaced by a shorter one: from its start.
                    if fs::metadata(&self.path).map(|m| m.len() < offset).unwrap_or(false) {
                        file = fs::File::open(&self.path)?;
                        offset = 0;
                        lines = LineBuffer::default();
                        continue;
                    }
                    if let Some(line) = lines.stale_partial(FILE_TICK) {
                        parser.take(&line, history, &mut batch);
                    }
                    break;
                }
                let mut too_long = 0;
                lines.push(&chunk[..n], |line| parser.take(line, history, &mut batch), &mut too_long);
                batch.too_long += too_long;
                if batch.records >= MAX_KMSG_RECORDS_PER_BATCH as u64 {
                    break;
                }
            }
            let caught_up = batch.records < MAX_KMSG_RECORDS_PER_BATCH as u64;
            if !batch.is_empty() {
                sink(batch);
            }
            if caught_up {
                history = None;
                std::thread::sleep(FILE_TICK);
            }
        }
        Ok(())
    }
}

/// Splits a growing file into lines, bounded: a line longer than
/// [`MAX_KMSG_RECORD_BYTES`] is dropped (counted) up to its newline; a last line
/// without a newline is taken once it has not grown for a tick. Continuation lines
/// (starting with a space) belong to the record before them and are dropped here.
#[derive(Default)]
struct LineBuffer {
    partial: Vec<u8>,
    /// Dropping the rest of an oversized line.
    discarding: bool,
    /// The first line is cut (reading started mid-file).
    skip_first: bool,
    partial_since: Option<Instant>,
}

impl LineBuffer {
    fn push(&mut self, mut data: &[u8], mut line: impl FnMut(&str), too_long: &mut u64) {
        while let Some(nl) = memchr::memchr(b'\n', data) {
            let piece = &data[..nl];
            data = &data[nl + 1..];
            if std::mem::take(&mut self.skip_first) || std::mem::take(&mut self.discarding) {
                self.partial.clear();
                continue;
            }
            if self.partial.len() + piece.len() > MAX_KMSG_RECORD_BYTES {
                *too_long += 1;
                self.partial.clear();
                continue;
            }
            self.partial.extend_from_slice(piece);
            let text = String::from_utf8_lossy(&self.partial).into_owned();
            self.partial.clear();
            self.partial_since = None;
            if !text.starts_with(' ') && !text.is_empty() {
                line(&text);
            }
        }
        if self.discarding {
            return;
        }
        if self.partial.len() + data.len() > MAX_KMSG_RECORD_BYTES {
            *too_long += 1;
            self.partial.clear();
            self.discarding = true;
            return;
        }
        if !data.is_empty() {
            self.partial.extend_from_slice(data);
            self.partial_since = Some(Instant::now());
        }
    }

    /// The last line without its newline, once it has waited `tick`.
    fn stale_partial(&mut self, tick: Duration) -> Option<String> {
        let since = self.partial_since?;
        if since.elapsed() < tick || self.skip_first || self.discarding {
            return None;
        }
        self.partial_since = None;
        let text = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
        (!text.starts_with(' ') && !text.is_empty()).then_some(text)
    }
}

/// `O_NONBLOCK` on open: `/dev/kmsg` then answers `EAGAIN` at the end instead of blocking.
trait NonBlocking {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlocking for fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0592464924bd45322 \
                        hostname=ip-172-31-61-252 nd-id=0 nc-id=0 serial-num=19fcda00f5ff6eb9 action=TERMINATE_INSTANCE";

    fn hw(text: &str) -> HwError {
        match parse_event(text, Some(3)) {
            Some(Event::HwError(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hardware_error_line_of_the_reference() {
        let e = hw(LINE);
        assert_eq!(e.name, "SRAM_UNCORRECTABLE_ERROR");
        assert_eq!((e.device, e.core), (Some(0), Some(0)));
        assert_eq!(e.serial.as_deref(), Some("19fcda00f5ff6eb9"));
        assert_eq!(e.action.as_deref(), Some("TERMINATE_INSTANCE"));
        assert_eq!(e.refused, 0);
    }

    #[test]
    fn any_prefix_before_neuron_hw_err() {
        let e = hw("[ 1234.5678] nrt: ERROR something NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1");
        assert_eq!((e.name.as_str(), e.device, e.core), ("DMA_ERROR", Some(3), Some(1)));
        assert_eq!(e.serial, None);
    }

    #[test]
    fn empty_serial_and_out_of_bounds_fields() {
        let e = hw("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=640 nc-id=x serial-num= action=TERMINATE_INSTANCE");
        assert_eq!((e.device, e.core, e.serial), (None, None, None));
        assert_eq!(e.refused, 2);
        assert_eq!(parse_event("NEURON_HW_ERR= nd-id=1", None), None, "no name");
        assert_eq!(parse_event("NEURON_HW_ERR=bad$name", None), None);
    }

    #[test]
    fn driver_error_records() {
        assert_eq!(
            parse_event("neuron:ndma_queue_wait: DMA completion timeout on nd0", Some(3)),
            Some(Event::DriverError { function: "ndma_queue_wait".to_owned() })
        );
        assert_eq!(parse_event("neuron:ncdev_open: opened", Some(6)), None, "informational");
        assert_eq!(parse_event("unrelated: message", Some(3)), None);
    }

    #[test]
    fn kmsg_record_format() {
        let r = parse_record("3,1042,5140900,-;NEURON_HW_ERR=DMA_ERROR nd-id=1\n SUBSYSTEM=neuron\n").unwrap();
        assert_eq!((r.level, r.seq, r.usec, r.continues), (3, 1042, 5_140_900, false));
        assert_eq!(r.text, "NEURON_HW_ERR=DMA_ERROR nd-id=1");
        // Userspace writes carry the user facility: 12 = user.warning.
        let r = parse_record("12,7,100,-,caller=T1;hello").unwrap();
        assert_eq!((r.level, r.text), (4, "hello"));
        assert_eq!(parse_record("plain text; with a semicolon"), None);
        assert!(parse_record("3,5,6,c;nd-id=0").unwrap().continues);
    }

    fn batch_of(lines: &[&str], history: Option<&LookBack>) -> Batch {
        let mut parser = Parser::default();
        let mut batch = Batch::default();
        for line in lines {
            parser.take(line, history, &mut batch);
        }
        batch
    }

    #[test]
    fn continuation_records_and_lines() {
        // A message split over two records (flag c) is read as one line.
        let b = batch_of(&["3,1,10,-;NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR", "3,2,11,c; nd-id=2 nc-id=5"], None);
        assert_eq!(b.events.len(), 1);
        let (seq, Event::HwError(e)) = &b.events[0] else { panic!() };
        assert_eq!(*seq, Some(2));
        assert_eq!((e.device, e.core), (Some(2), Some(5)));
        // A dictionary continuation line of a followed file does not start a record.
        let mut lines = LineBuffer::default();
        let mut seen = Vec::new();
        let mut too_long = 0;
        lines.push(b"3,1,10,-;a\n SUBSYSTEM=neuron\n3,2,11,-;b\n", |l| seen.push(l.to_owned()), &mut too_long);
        assert_eq!(seen, ["3,1,10,-;a", "3,2,11,-;b"]);
    }

    #[test]
    fn look_back_skips_old_and_already_counted_records() {
        let look =
            LookBack { window: Duration::from_secs(300), uptime: Some(Duration::from_secs(1000)), after_seq: Some(10) };
        let b = batch_of(
            &[
                "3,5,900000000,-;NEURON_HW_ERR=DMA_ERROR nd-id=0",  // counted before
                "3,11,600000000,-;NEURON_HW_ERR=DMA_ERROR nd-id=0", // older than 5 minutes
                "3,12,800000000,-;NEURON_HW_ERR=DMA_ERROR nd-id=1", // within the look-back
                "NEURON_HW_ERR=DMA_ERROR nd-id=2",                  // no time: history skipped
            ],
            Some(&look),
        );
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.last_seq, Some(12));
        // Once caught up, a plain line counts.
        assert_eq!(batch_of(&["NEURON_HW_ERR=DMA_ERROR nd-id=2"], None).events.len(), 1);
    }

    #[test]
    fn lines_are_bounded_and_a_last_line_without_newline_is_taken() {
        let mut lines = LineBuffer::default();
        let mut seen = Vec::new();
        let mut too_long = 0;
        let long = vec![b'x'; MAX_KMSG_RECORD_BYTES + 10];
        lines.push(&long, |l| seen.push(l.to_owned()), &mut too_long);
        lines.push(b"still the long line\nnext\ntail", |l| seen.push(l.to_owned()), &mut too_long);
        assert_eq!(seen, ["next"]);
        assert_eq!(too_long, 1);
        assert_eq!(lines.stale_partial(Duration::from_secs(3600)), None, "may still grow");
        assert_eq!(lines.stale_partial(Duration::ZERO).as_deref(), Some("tail"));
    }

    #[test]
    fn follows_a_regular_file_as_it_grows() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("kmsg-{}-{}", std::process::id(), fastrand::u64(..)));
        // History within the look-back and before it.
        fs::write(&path, "3,1,0,-;NEURON_HW_ERR=DMA_ERROR nd-id=0\n").unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let follower = Follower {
            path: path.clone(),
            look_back: LookBack {
                window: Duration::from_secs(60),
                uptime: Some(Duration::from_secs(3600)),
                after_seq: None,
            },
        };
        let thread_stop = stop.clone();
        let thread = std::thread::spawn(move || follower.run(&thread_stop, |b| tx.send(b).unwrap()));
        let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        file.write_all(b"3,2,3599000000,-;NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1\n").unwrap();
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while events.is_empty() && Instant::now() < deadline {
            if let Ok(b) = rx.recv_timeout(Duration::from_millis(100)) {
                events.extend(b.events);
            }
        }
        stop.store(true, Ordering::Relaxed);
        thread.join().unwrap().unwrap();
        let _ = fs::remove_file(&path);
        assert_eq!(events.len(), 1, "{events:?}");
        let Event::HwError(e) = &events[0].1 else { panic!() };
        assert_eq!(e.name, "HBM_UNCORRECTABLE_ERROR");
    }
}
