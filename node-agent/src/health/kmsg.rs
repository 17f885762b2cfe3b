//! The kernel log: `/dev/kmsg` records, the `NEURON_HW_ERR=<NAME>` lines the Neuron
//! runtime has the driver print, and the driver's own `neuron:<function>: ` error records.
//!
//! Only what the driver writes is taken: a record of the kernel's facility (userspace
//! writes to `/dev/kmsg` carry another), at error level or worse, with the token at the
//! start of its text (after a time stamp or the driver's prefix at most) and an `nd-id`;
//! the model then checks the device against the driver's sysfs tree. Anything else that
//! names a fault is a [`Refusal`], counted by reason. A line without a record header
//! (a regular file given as the path) cannot show its facility: refused too, so test
//! files are written in the `/dev/kmsg` format.
//!
//! NVIDIA's `NVRM: Xid (PCI:…): <code>, …` records ([`crate::gpu::xid`]) follow the same
//! rules, at warning level or worse; the model then checks their PCI address against the
//! GPUs of the latest collection.
//!
//! [`Follower`] reads the log off the report path, on a thread of its own: from the end,
//! after a bounded look-back at start-up; an overrun (`EPIPE`) is counted and reading
//! continues. A regular file given as the path is followed as it grows (tests).

use std::{
    fs,
    io::{self, Read, Seek, SeekFrom},
    os::unix::{
        fs::{FileTypeExt, MetadataExt},
        io::AsRawFd,
    },
    path::PathBuf,
    time::{Duration, Instant},
};

use super::stop::Stop;

use crate::gpu::xid::{self, XidError, XidRecord};
use api::limits::{MAX_KMSG_RECORDS_PER_BATCH, MAX_KMSG_RECORD_BYTES, MAX_NEURONCORES_PER_DEVICE, MAX_NEURON_DEVICES};

/// Bytes of a field value kept from a record (names, actions, serial numbers).
const MAX_FIELD_BYTES: usize = 64;

/// One `/dev/kmsg` record: `<prefix>,<seq>,<usec since boot>,<flags>[,…];<text>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub origin: Origin,
    pub seq: u64,
    pub usec: u64,
    /// Flag `c`: this text continues the previous record's.
    pub continues: bool,
    /// The message, without the continuation (dictionary) lines.
    pub text: &'a str,
}

/// Who wrote a record, from its prefix: the syslog facility and level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// 0: the kernel. The kernel gives every userspace write to `/dev/kmsg` another
    /// facility (user, 1, when the writer names none or the kernel's).
    pub facility: u8,
    /// Syslog level (0 emergency … 7 debug): the prefix's low three bits.
    pub level: u8,
}

impl Origin {
    /// How the driver prints a `NEURON_HW_ERR` record: `printk(KERN_ERR …)`.
    pub const KERNEL_ERROR: Origin = Origin { facility: 0, level: LEVEL_ERROR };

    fn from_prefix(prefix: u32) -> Origin {
        Origin { facility: u8::try_from(prefix >> 3).unwrap_or(u8::MAX), level: (prefix & 7) as u8 }
    }
}

/// Syslog's error level; lower is worse.
const LEVEL_ERROR: u8 = 3;
/// Syslog's warning level: the lowest an Xid record is taken at. The NVIDIA driver prints
/// its Xids through its error log path (`KERN_ERR`); one level of margin.
const LEVEL_WARNING: u8 = 4;

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
    Some(Record { origin: Origin::from_prefix(prefix), seq, usec, continues: flags.contains('c'), text })
}

/// `NEURON_HW_ERR=<NAME>` and its fields, as the driver prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HwError {
    pub name: String,
    /// `nd-id`: a device index below the limit (required).
    pub device: u32,
    /// `nc-id`, when a core index below the limit.
    pub core: Option<u32>,
    pub serial: Option<String>,
    pub action: Option<String>,
    /// Optional fields whose value was out of bounds and left out.
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
    /// An NVIDIA `NVRM: Xid` (or NVSwitch `SXid`) record.
    Xid(XidRecord),
}

/// Why a record naming a hardware fault (or a driver error) was not taken: the values of
/// the `reason` label of `neuron_agent_health_kmsg_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// A line without a `/dev/kmsg` record header: who wrote it cannot be told.
    NoHeader,
    /// Not the kernel's facility: a userspace write to `/dev/kmsg`.
    Facility,
    /// Below error level (e.g. the kernel's warning about a program's executable stack).
    Level,
    /// The token is not at the start of the record's text (nor after a time stamp or the
    /// driver's `neuron:<function>: `): text the kernel quotes, e.g. a path or a name.
    Position,
    /// The name is empty, longer than 64 bytes or not made of `A-Z`, `0-9` and `_`.
    Name,
    /// No `nd-id`, or one that is not a device index below the limit.
    Device,
    /// An `nd-id` the driver's sysfs tree does not list.
    UnknownDevice,
    /// A `serial-num` other than the one the driver's sysfs tree gives for the device.
    SerialMismatch,
    /// An Xid record whose PCI address or code is missing, malformed or out of range.
    XidFormat,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::NoHeader,
        Refusal::Facility,
        Refusal::Level,
        Refusal::Position,
        Refusal::Name,
        Refusal::Device,
        Refusal::UnknownDevice,
        Refusal::SerialMismatch,
        Refusal::XidFormat,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoHeader => "no_header",
            Refusal::Facility => "facility",
            Refusal::Level => "level",
            Refusal::Position => "position",
            Refusal::Name => "name",
            Refusal::Device => "device",
            Refusal::UnknownDevice => "unknown_device",
            Refusal::SerialMismatch => "serial_mismatch",
            Refusal::XidFormat => "xid_format",
        }
    }
}

/// The token of a hardware-fault record.
pub const TOKEN: &str = "NEURON_HW_ERR=";
/// The prefix of the driver's own messages (`pr_fmt`: `neuron:<function>: `).
const DRIVER_PREFIX: &str = "neuron:";

fn token_ok(t: &str, extra: &[u8]) -> bool {
    !t.is_empty() && t.len() <= MAX_FIELD_BYTES && t.bytes().all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

/// An error name as the runtime writes them: `A-Z`, `0-9`, `_`.
fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_FIELD_BYTES
        && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Parses the text of a record (or of a plain line: `origin` `None`). `Ok(None)`: a record
/// that is neither a hardware fault nor a driver error. `Err`: a record that names one
/// but that the driver did not write as it writes them (see [`Refusal`]).
pub fn parse_event(text: &str, origin: Option<Origin>) -> Result<Option<Event>, Refusal> {
    if text.contains(TOKEN) {
        let origin = from_the_kernel(origin)?;
        if origin.level > LEVEL_ERROR {
            return Err(Refusal::Level);
        }
        return parse_hw_error(at_boundary(text).ok_or(Refusal::Position)?).map(|e| Some(Event::HwError(e)));
    }
    if xid::mentions_xid(text) {
        return parse_xid(text, origin);
    }
    let Some(rest) = text.strip_prefix(DRIVER_PREFIX) else { return Ok(None) };
    let origin = from_the_kernel(origin)?;
    if origin.level > LEVEL_ERROR {
        return Ok(None); // the driver's informational messages
    }
    let function = rest.split_once(':').map(|(f, _)| f.trim()).filter(|f| token_ok(f, b"_"));
    Ok(function.map(|f| Event::DriverError { function: f.to_owned() }))
}

/// `text` as the driver prints it at error level: the event, if any, else `None`
/// (tests and benchmarks).
pub fn kernel_event(text: &str) -> Option<Event> {
    parse_event(text, Some(Origin::KERNEL_ERROR)).ok().flatten()
}

/// An Xid record: the kernel's, at warning level or worse, its token at the start of
/// the text (after a time stamp at most).
fn parse_xid(text: &str, origin: Option<Origin>) -> Result<Option<Event>, Refusal> {
    let origin = from_the_kernel(origin)?;
    if origin.level > LEVEL_WARNING {
        return Err(Refusal::Level);
    }
    match xid::parse(skip_iso_time(skip_printk_time(text))) {
        Ok(record) => Ok(record.map(Event::Xid)),
        Err(XidError::Position) => Err(Refusal::Position),
        Err(XidError::Format) => Err(Refusal::XidFormat),
    }
}

fn from_the_kernel(origin: Option<Origin>) -> Result<Origin, Refusal> {
    let origin = origin.ok_or(Refusal::NoHeader)?;
    if origin.facility != 0 {
        return Err(Refusal::Facility);
    }
    Ok(origin)
}

/// The text from the token on, when the token starts the record: at the start of the
/// text, or after (each at most once) a printk time stamp (`[ 5140.900000] `), then the
/// runtime's ISO-8601 time stamp (`2025-06-01T12:00:00.000Z `, also with a space before
/// the time) and the driver's `neuron:<function>: ` in either order: the runtime hands
/// the driver a stamped line, and the driver's `pr_fmt` may put its prefix before it.
/// Anywhere else the token is text the kernel quotes (a path, an interface name), which
/// anyone may choose.
fn at_boundary(text: &str) -> Option<&str> {
    let text = skip_printk_time(text);
    let stamp_first = skip_driver_prefix(skip_iso_time(text));
    let prefix_first = skip_iso_time(skip_driver_prefix(text));
    [stamp_first, prefix_first].into_iter().find(|rest| rest.starts_with(TOKEN))
}

fn skip_printk_time(text: &str) -> &str {
    let stamp = text.strip_prefix('[').and_then(|r| r.split_once("] ")).filter(|(inner, _)| {
        let (secs, frac) = inner.trim_start_matches(' ').split_once('.').unwrap_or(("", ""));
        digits(secs) && digits(frac)
    });
    stamp.map_or(text, |(_, rest)| rest.trim_start_matches(' '))
}

fn skip_iso_time(text: &str) -> &str {
    let stamp_char = |b: u8| b.is_ascii_digit() || b"-:.TZ+,".contains(&b);
    let word = |s: &str| -> Option<usize> {
        let end = s.find(' ')?;
        (end > 0 && end <= 40 && s.as_bytes()[..end].iter().all(|b| stamp_char(*b))).then_some(end)
    };
    let is_date = |s: &str| s.len() > 5 && digits(&s[..4]) && s.as_bytes()[4] == b'-';
    let Some(end) = word(text).filter(|_| is_date(text)) else { return text };
    let rest = text[end..].trim_start_matches(' ');
    // The time after a space ("2025-06-01 12:00:00.000").
    match word(rest) {
        Some(end) if rest.as_bytes()[0].is_ascii_digit() && rest[..end].contains(':') => {
            rest[end..].trim_start_matches(' ')
        }
        _ => rest,
    }
}

fn skip_driver_prefix(text: &str) -> &str {
    let prefix = text.strip_prefix(DRIVER_PREFIX).and_then(|r| r.split_once(": ")).filter(|(f, _)| token_ok(f, b"_"));
    prefix.map_or(text, |(_, rest)| rest.trim_start_matches(' '))
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// `NEURON_HW_ERR=<NAME> … nd-id=<N> …` from the token on.
fn parse_hw_error(from_token: &str) -> Result<HwError, Refusal> {
    let mut tokens = from_token.split_ascii_whitespace();
    let name = tokens.next().and_then(|t| t.strip_prefix(TOKEN)).filter(|n| name_ok(n)).ok_or(Refusal::Name)?;
    let mut e = HwError { name: name.to_owned(), ..HwError::default() };
    let mut device = None;
    for token in tokens {
        let Some((key, value)) = token.split_once('=') else { continue };
        let bounded = |limit: u32| value.parse::<u32>().ok().filter(|n| *n < limit);
        match key {
            "nd-id" => device = Some(bounded(MAX_NEURON_DEVICES).ok_or(Refusal::Device)?),
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
    e.device = device.ok_or(Refusal::Device)?;
    Ok(e)
}

// ---------------------------------------------------------------------------------------
// Following the log.
// ---------------------------------------------------------------------------------------

/// What one batch of records gave.
#[derive(Debug, Default)]
pub struct Batch {
    /// Events with the record's sequence number, when it has one.
    pub events: Vec<(Option<u64>, Event)>,
    /// Records refused, with the record's sequence number.
    pub refusals: Vec<(Option<u64>, Refusal)>,
    /// The last sequence number read (so that a restart does not count a record twice).
    pub last_seq: Option<u64>,
    pub records: u64,
    pub overruns: u64,
    pub too_long: u64,
    /// Fields out of bounds.
    pub refused: u64,
    /// The log's history ends with this batch: what follows is read as it is written.
    pub caught_up: bool,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.records == 0 && self.overruns == 0 && self.too_long == 0 && !self.caught_up
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

pub struct Follower {
    pub path: PathBuf,
    pub look_back: LookBack,
}

/// The state carried between lines: the previous record, for a continuation of it.
#[derive(Default)]
struct Parser {
    previous: Option<Previous>,
    /// The previous record gave an event or a refusal.
    previous_outcome: bool,
}

/// The record read last, whose text a continuation record may carry on.
struct Previous {
    /// Its text, with the continuations joined so far.
    text: String,
    origin: Origin,
    seq: u64,
}

impl Previous {
    /// Whether `record` carries this record's text on: flagged `c`, read right after it
    /// (the next sequence number) and written by the same origin (facility and level).
    /// Anything else is judged alone: a user's record never becomes the kernel's by a
    /// kernel fragment after it, nor the other way round.
    fn continued_by(&self, record: &Record<'_>) -> bool {
        record.continues && record.origin == self.origin && self.seq.checked_add(1) == Some(record.seq)
    }
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
    /// One record (or plain line) → the batch. `history`: in the log when it was opened,
    /// judged by the look-back.
    fn take(&mut self, raw: &str, history: Option<&LookBack>, batch: &mut Batch) {
        batch.records += 1;
        let Some(record) = parse_record(raw) else {
            // A plain line continues nothing, and nothing continues it.
            self.forget();
            // A plain line cannot be placed in time: history is skipped.
            if history.is_none() {
                self.push(None, parse_event(raw.split('\n').next().unwrap_or_default(), None), batch);
            }
            return;
        };
        batch.last_seq = Some(record.seq);
        if history.is_some_and(|h| !h.keeps(&record)) {
            self.forget();
            return;
        }
        let seq = Some(record.seq);
        match self.previous.as_mut().filter(|p| p.continued_by(&record)) {
            Some(previous) => {
                // The text continues the previous record's: read them as one line. What the
                // previous record gave, still in this batch, is replaced by the whole line's;
                // what was handed on already stays as it was (counted once).
                previous.text.push_str(record.text);
                cut(&mut previous.text, MAX_KMSG_RECORD_BYTES);
                previous.seq = record.seq;
                let outcome = parse_event(&previous.text, Some(record.origin));
                if self.retract_previous(batch, record.seq - 1) {
                    self.push(seq, outcome, batch);
                }
            }
            None => {
                self.previous = Some(Previous { text: record.text.to_owned(), origin: record.origin, seq: record.seq });
                self.previous_outcome = false;
                self.push(seq, parse_event(record.text, Some(record.origin)), batch);
            }
        }
    }

    fn forget(&mut self) {
        self.previous = None;
        self.previous_outcome = false;
    }

    /// Takes the outcome of the previous record (`previous_seq`) back out of the batch;
    /// `false` when it was handed on already.
    fn retract_previous(&mut self, batch: &mut Batch, previous_seq: u64) -> bool {
        if !self.previous_outcome {
            return true;
        }
        let previous = |s: &Option<u64>| *s == Some(previous_seq);
        if batch.events.last().is_some_and(|(s, _)| previous(s)) {
            if let Some((_, Event::HwError(e))) = batch.events.pop() {
                batch.refused = batch.refused.saturating_sub(e.refused as u64);
            }
            self.previous_outcome = false;
            return true;
        }
        if batch.refusals.last().is_some_and(|(s, _)| previous(s)) {
            batch.refusals.pop();
            self.previous_outcome = false;
            return true;
        }
        false
    }

    fn push(&mut self, seq: Option<u64>, outcome: Result<Option<Event>, Refusal>, batch: &mut Batch) {
        match outcome {
            Ok(None) => return,
            Ok(Some(event)) => {
                if let Event::HwError(e) = &event {
                    batch.refused += e.refused as u64;
                }
                batch.events.push((seq, event));
            }
            Err(refusal) => batch.refusals.push((seq, refusal)),
        }
        self.previous_outcome = true;
    }
}

impl Follower {
    /// Follows the log until `stop`, handing each non-empty batch to `sink`. Returns an
    /// error only when the path cannot be opened at all.
    /// Anything else than `/dev/kmsg` or a regular file (`/dev/zero`, a FIFO, a
    /// directory) is refused: an error, which the caller retries after a while.
    pub fn run(self, stop: &Stop, mut sink: impl FnMut(Batch)) -> io::Result<()> {
        let file = fs::OpenOptions::new().read(true).custom_flags_nonblock().open(&self.path)?;
        let meta = file.metadata()?;
        if meta.file_type().is_char_device() && is_kmsg(meta.rdev()) {
            self.follow_device(file, stop, &mut sink)
        } else if meta.is_file() {
            self.follow_file(file, meta.len(), stop, &mut sink)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither the kernel log (/dev/kmsg, 1:11) nor a regular file",
            ))
        }
    }

    /// `/dev/kmsg`: one record per `read()`, from the start of the kernel's buffer; the
    /// records older than the look-back are skipped. The history ends at the first
    /// `EAGAIN`, which may come after records written since the open: read as history,
    /// such a record is judged as a live one would be. Every `/dev/kmsg` record has a
    /// header (no line is skipped for lacking one), and the look-back skips only records
    /// stamped before its window (one written after the open is stamped after the uptime
    /// read before it) or numbered at or below the previous agent's last (the kernel
    /// numbers on, so one written after the open is above it).
    fn follow_device(&self, mut file: fs::File, stop: &Stop, sink: &mut impl FnMut(Batch)) -> io::Result<()> {
        let mut buf = vec![0u8; MAX_KMSG_RECORD_BYTES + 1];
        let mut parser = Parser::default();
        let mut history = true;
        // Kept for every wait: `Stop::poll` leaves it as it was given.
        let mut fds = vec![libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        while !stop.is_set() {
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
                        batch.caught_up = std::mem::replace(&mut history, false);
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
                stop.poll(&mut fds, Duration::MAX);
            }
        }
        Ok(())
    }

    /// A regular file: what it held when opened (its last [`FILE_HISTORY_BYTES`]) is
    /// history, judged by the look-back; every line appended after the open is live,
    /// however soon it is read (the offset of its end tells, not when the reader got to
    /// it). Checked every [`FILE_TICK`].
    /// `len`: the file's length when it was opened.
    fn follow_file(&self, mut file: fs::File, len: u64, stop: &Stop, sink: &mut impl FnMut(Batch)) -> io::Result<()> {
        let start = len.saturating_sub(FILE_HISTORY_BYTES);
        file.seek(SeekFrom::Start(start))?;
        let mut lines = LineBuffer::at(start);
        let mut parser = Parser::default();
        // The end of the history: bytes up to here were in the file at the open.
        let mut history_end = Some(len);
        let mut chunk = vec![0u8; 64 * 1024];
        while !stop.is_set() {
            let mut batch = Batch::default();
            let judge =
                |end: u64, history_end: Option<u64>| history_end.is_some_and(|h| end <= h).then_some(&self.look_back);
            loop {
                let n = file.read(&mut chunk)?;
                if n == 0 {
                    // The file was truncated, or another file is at the path now (rotated):
                    // the one at the path, from its start, all of it written after the open.
                    if self.replaced(&file, lines.offset) {
                        file = fs::File::open(&self.path)?;
                        lines = LineBuffer::at(0);
                        history_end = history_end.map(|_| 0);
                        continue;
                    }
                    if let Some((line, end)) = lines.stale_partial(FILE_TICK) {
                        parser.take(&line, judge(end, history_end), &mut batch);
                    }
                    break;
                }
                let mut too_long = 0;
                lines.push(
                    &chunk[..n],
                    |line, end| parser.take(line, judge(end, history_end), &mut batch),
                    &mut too_long,
                );
                batch.too_long += too_long;
                if batch.records >= MAX_KMSG_RECORDS_PER_BATCH as u64 {
                    break;
                }
            }
            // The history ends with the batch that judged its last line.
            batch.caught_up = history_end.is_some_and(|h| lines.judged >= h);
            if batch.caught_up {
                history_end = None;
            }
            let full = batch.records >= MAX_KMSG_RECORDS_PER_BATCH as u64;
            if !batch.is_empty() {
                sink(batch);
            }
            if !full {
                stop.sleep(FILE_TICK);
            }
        }
        Ok(())
    }
}

impl Follower {
    /// The file at the path is not `file` any more, or it is shorter than what was read.
    fn replaced(&self, file: &fs::File, offset: u64) -> bool {
        match (fs::metadata(&self.path), file.metadata()) {
            (Ok(now), Ok(open)) => (now.dev(), now.ino()) != (open.dev(), open.ino()) || now.len() < offset,
            // Between a rotation's rename and the new file: the old one for now.
            _ => false,
        }
    }
}

/// `/dev/kmsg`'s device number: major 1, minor 11 (glibc's encoding of `dev_t`).
fn is_kmsg(rdev: u64) -> bool {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major, minor) == (1, 11)
}

/// Splits a growing file into lines, bounded: a line longer than
/// [`MAX_KMSG_RECORD_BYTES`] is dropped (counted) up to its newline; a last line
/// without a newline is taken once it has not grown for a tick. Continuation lines
/// (starting with a space) belong to the record before them and are dropped here.
/// Each line is handed on with the file offset of its end.
#[derive(Default)]
struct LineBuffer {
    partial: Vec<u8>,
    /// Dropping the rest of an oversized line.
    discarding: bool,
    /// The first line is cut (reading started mid-file).
    skip_first: bool,
    partial_since: Option<Instant>,
    /// The file offset of the next byte pushed.
    offset: u64,
    /// The file offset up to which every line was handed on or dropped.
    judged: u64,
}

impl LineBuffer {
    /// Reading from `offset` of the file; mid-file, the first (cut) line is skipped.
    fn at(offset: u64) -> LineBuffer {
        LineBuffer { skip_first: offset > 0, offset, judged: offset, ..LineBuffer::default() }
    }

    fn push(&mut self, mut data: &[u8], mut line: impl FnMut(&str, u64), too_long: &mut u64) {
        while let Some(nl) = memchr::memchr(b'\n', data) {
            let piece = &data[..nl];
            data = &data[nl + 1..];
            self.offset += nl as u64 + 1;
            self.judged = self.offset;
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
                line(&text, self.offset);
            }
        }
        self.offset += data.len() as u64;
        if self.discarding {
            // Dropped whatever follows, up to its newline.
            self.judged = self.offset;
            return;
        }
        if self.partial.len() + data.len() > MAX_KMSG_RECORD_BYTES {
            *too_long += 1;
            self.partial.clear();
            self.discarding = true;
            self.judged = self.offset;
            return;
        }
        if !data.is_empty() {
            self.partial.extend_from_slice(data);
            self.partial_since = Some(Instant::now());
        }
    }

    /// The last line without its newline, with its end offset, once it has waited `tick`.
    fn stale_partial(&mut self, tick: Duration) -> Option<(String, u64)> {
        let since = self.partial_since?;
        if since.elapsed() < tick || self.skip_first || self.discarding {
            return None;
        }
        self.partial_since = None;
        self.judged = self.offset;
        let text = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
        (!text.starts_with(' ') && !text.is_empty()).then_some((text, self.offset))
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
        match parse_event(text, Some(Origin::KERNEL_ERROR)) {
            Ok(Some(Event::HwError(e))) => e,
            other => panic!("{other:?}"),
        }
    }

    fn refusal(raw: &str) -> Refusal {
        let (text, origin) = match parse_record(raw) {
            Some(r) => (r.text, Some(r.origin)),
            None => (raw, None),
        };
        parse_event(text, origin).expect_err(raw)
    }

    const XID: &str = "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has fallen off the bus.";

    #[test]
    fn xid_records_of_the_kernel_at_warning_or_worse_are_taken() {
        for prefix in ["3", "4", "0"] {
            let raw = format!("{prefix},17,5000,-;[ 12.5] {XID}");
            let record = parse_record(&raw).unwrap();
            match parse_event(record.text, Some(record.origin)) {
                Ok(Some(Event::Xid(x))) => assert_eq!(x.code, 79),
                other => panic!("{prefix}: {other:?}"),
            }
        }
        let switch = parse_record("3,18,5000,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal").unwrap();
        assert!(matches!(parse_event(switch.text, Some(switch.origin)), Ok(Some(Event::Xid(_)))));
    }

    #[test]
    fn xid_records_not_as_the_driver_writes_them_are_refused() {
        assert_eq!(refusal(&format!("12,17,5000,-;{XID}")), Refusal::Facility, "a user's write to /dev/kmsg");
        assert_eq!(refusal(&format!("6,17,5000,-;{XID}")), Refusal::Level, "informational");
        assert_eq!(refusal(XID), Refusal::NoHeader);
        assert_eq!(refusal(&format!("3,17,5000,-;audit: name=\"{XID}\"")), Refusal::Position);
        assert_eq!(refusal("3,17,5000,-;NVRM: Xid (PCI:0000:53:00): 99999999999, x"), Refusal::XidFormat);
        assert_eq!(refusal("3,17,5000,-;NVRM: Xid (PCI:0000:53): 79, x"), Refusal::XidFormat);
    }

    #[test]
    fn hardware_error_line_of_the_reference() {
        let e = hw(LINE);
        assert_eq!(e.name, "SRAM_UNCORRECTABLE_ERROR");
        assert_eq!((e.device, e.core), (0, Some(0)));
        assert_eq!(e.serial.as_deref(), Some("19fcda00f5ff6eb9"));
        assert_eq!(e.action.as_deref(), Some("TERMINATE_INSTANCE"));
        assert_eq!(e.refused, 0);
    }

    #[test]
    fn the_token_starts_the_record_or_follows_a_time_stamp_or_the_driver_prefix() {
        for text in [
            "[ 1234.567800] NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
            "2025-06-01T12:00:00.123456Z NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
            "2025-06-01 12:00:00.123456 NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
            "neuron:ncdev_printk: NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
            "[    5.000001] 2025-06-01T12:00:00Z neuron:ncdev_printk: NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
            // The driver's prefix before the runtime's stamp (issue 41, item 2).
            "neuron:ncdev_printk: 2025-06-01T12:00:00.123456Z NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
            "[    5.000001] neuron:ncdev_printk: 2025-06-01 12:00:00.123 NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
        ] {
            let e = hw(text);
            assert_eq!((e.name.as_str(), e.device, e.core), ("DMA_ERROR", 3, Some(1)), "{text}");
        }
        // Anywhere else: text the kernel quotes.
        for text in [
            "nrt: ERROR something NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=1",
            "process '/tmp/NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=0 serial-num=deadbeef x/a.out' started with \
             executable stack",
            "br0: port 1(NEURON_HW_ERR=A) entered blocking state",
            "[ 1.0] [ 2.0] NEURON_HW_ERR=DMA_ERROR nd-id=0",
            "neuron:f: neuron:g: NEURON_HW_ERR=DMA_ERROR nd-id=0",
            "2025-06-01T12:00:00Z neuron:f: 2025-06-01T12:00:00Z NEURON_HW_ERR=DMA_ERROR nd-id=0",
            "neuron:f: 2025-06-01T12:00:00Z neuron:g: NEURON_HW_ERR=DMA_ERROR nd-id=0",
        ] {
            assert_eq!(parse_event(text, Some(Origin::KERNEL_ERROR)), Err(Refusal::Position), "{text}");
        }
    }

    #[test]
    fn only_the_kernel_at_error_level_writes_hardware_faults() {
        let fault = "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=0 nc-id=0";
        assert!(hw(fault).device == 0);
        for level in 0..=3 {
            let raw = format!("{level},1,2,-;{fault}");
            let r = parse_record(&raw).unwrap();
            assert!(matches!(parse_event(r.text, Some(r.origin)), Ok(Some(Event::HwError(_)))), "level {level}");
        }
        // A userspace write to /dev/kmsg: user.err (11), or any other facility.
        assert_eq!(refusal(&format!("11,1,2,-;{fault}")), Refusal::Facility);
        assert_eq!(refusal(&format!("179,1,2,-;{fault}")), Refusal::Facility);
        assert_eq!(refusal(&format!("4,1,2,-;{fault}")), Refusal::Level);
        assert_eq!(refusal(&format!("6,1,2,-;{fault}")), Refusal::Level);
        assert_eq!(refusal(fault), Refusal::NoHeader, "a plain line");
        // The driver's own error records too.
        assert_eq!(refusal("11,1,2,-;neuron:ndma_queue_wait: DMA completion timeout"), Refusal::Facility);
        assert_eq!(refusal("neuron:ndma_queue_wait: DMA completion timeout"), Refusal::NoHeader);
        // Records naming neither are nobody's business.
        assert_eq!(parse_event("ordinary text", None), Ok(None));
        assert_eq!(parse_event("ordinary text", Some(Origin { facility: 1, level: 3 })), Ok(None));
    }

    #[test]
    fn names_and_device_indices() {
        let e = hw("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=63 nc-id=x serial-num= action=TERMINATE_INSTANCE");
        assert_eq!((e.device, e.core, e.serial), (63, None, None));
        assert_eq!(e.refused, 1);
        let kernel = |text: &str| parse_event(text, Some(Origin::KERNEL_ERROR));
        assert_eq!(kernel("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=64"), Err(Refusal::Device));
        assert_eq!(kernel("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=-1"), Err(Refusal::Device));
        assert_eq!(kernel("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nc-id=0"), Err(Refusal::Device), "no nd-id");
        assert_eq!(kernel("NEURON_HW_ERR= nd-id=1"), Err(Refusal::Name));
        assert_eq!(kernel("NEURON_HW_ERR=bad$name nd-id=1"), Err(Refusal::Name));
        assert_eq!(kernel("NEURON_HW_ERR=A: renamed from eth0"), Err(Refusal::Name), "an interface name");
        assert_eq!(kernel("NEURON_HW_ERR=lower nd-id=1"), Err(Refusal::Name));
    }

    #[test]
    fn driver_error_records() {
        assert_eq!(
            kernel_event("neuron:ndma_queue_wait: DMA completion timeout on nd0"),
            Some(Event::DriverError { function: "ndma_queue_wait".to_owned() })
        );
        let info = Origin { facility: 0, level: 6 };
        assert_eq!(parse_event("neuron:ncdev_open: opened", Some(info)), Ok(None), "informational");
        assert_eq!(kernel_event("unrelated: message"), None);
    }

    #[test]
    fn kmsg_record_format() {
        let r = parse_record("3,1042,5140900,-;NEURON_HW_ERR=DMA_ERROR nd-id=1\n SUBSYSTEM=neuron\n").unwrap();
        assert_eq!((r.origin, r.seq, r.usec, r.continues), (Origin::KERNEL_ERROR, 1042, 5_140_900, false));
        assert_eq!(r.text, "NEURON_HW_ERR=DMA_ERROR nd-id=1");
        // Userspace writes carry the user facility: 12 = user.warning.
        let r = parse_record("12,7,100,-,caller=T1;hello").unwrap();
        assert_eq!((r.origin, r.text), (Origin { facility: 1, level: 4 }, "hello"));
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
        assert_eq!((e.device, e.core), (2, Some(5)));
        assert!(b.refusals.is_empty(), "the first part alone has no nd-id: replaced by the whole");
        // A dictionary continuation line of a followed file does not start a record.
        let mut lines = LineBuffer::default();
        let mut seen = Vec::new();
        let mut too_long = 0;
        lines.push(
            b"3,1,10,-;a\n SUBSYSTEM=neuron\n3,2,11,-;b\n",
            |l, end| seen.push((l.to_owned(), end)),
            &mut too_long,
        );
        assert_eq!(seen, [("3,1,10,-;a".to_owned(), 11), ("3,2,11,-;b".to_owned(), 40)], "each with its end's offset");
    }

    /// Issue 41, item 2: a continuation (flag `c`) carries on only the record read right
    /// before it (the previous sequence number) from the same origin (facility and level).
    #[test]
    fn a_continuation_joins_only_the_record_of_its_origin_right_before_it() {
        let xid = "NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=a, GPU has fallen off the bus.";
        let hbm = "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR";
        // A user's record, refused alone, then a kernel fragment (even an empty one).
        for (user, fragment) in [
            (format!("11,17,5000,-;{xid}"), "0,18,5001,c;"),
            (format!("11,17,5000,-;{xid}"), "3,18,5001,c;"),
            (format!("11,17,5000,-;{xid}"), "4,18,5001,c; and more"),
            (format!("11,17,5000,-;{hbm}"), "3,18,5001,c; nd-id=0 nc-id=0"),
            (format!("14,17,5000,-;{hbm}"), "3,18,5001,c; nd-id=0"),
        ] {
            let b = batch_of(&[user.as_str(), fragment], None);
            assert!(b.events.is_empty(), "{user} + {fragment}: {:?}", b.events);
            assert_eq!(b.refusals, [(Some(17), Refusal::Facility)], "{user} + {fragment}");
        }
        // The kernel's own record, continued by another level, after a gap in the numbers,
        // or after a plain line: each part is judged alone (the first has no nd-id).
        for lines in [
            ["3,17,5000,-;NEURON_HW_ERR=DMA_ERROR", "4,18,5001,c; nd-id=0"],
            ["3,17,5000,-;NEURON_HW_ERR=DMA_ERROR", "3,19,5001,c; nd-id=0"],
            ["NEURON_HW_ERR=DMA_ERROR", "3,18,5001,c; nd-id=0"],
        ] {
            let b = batch_of(&lines, None);
            assert!(b.events.is_empty(), "{lines:?}: {:?}", b.events);
            assert_eq!(b.refusals.len(), 1, "{lines:?}: {:?}", b.refusals);
        }
        // A record the look-back skipped is not carried on by the fragment after it.
        let look = LookBack { window: Duration::from_secs(1), uptime: Some(Duration::from_secs(100)), after_seq: None };
        let b = batch_of(&["3,17,5000,-;NEURON_HW_ERR=DMA_ERROR", "3,18,99500000,c; nd-id=0"], Some(&look));
        assert!(b.events.is_empty() && b.refusals.is_empty(), "{b:?}");
        // Three parts of the kernel's record, in order, are one line.
        let b =
            batch_of(&["3,17,5000,-;NEURON_HW_ERR=DMA_ERROR", "3,18,5001,c; nd-id=1", "3,19,5002,c; nc-id=0"], None);
        let [(Some(19), Event::HwError(e))] = b.events.as_slice() else { panic!("{b:?}") };
        assert_eq!((e.device, e.core, b.refusals.len()), (1, Some(0), 0));
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
        assert_eq!((b.last_seq, b.refusals.len()), (Some(12), 0));
        // Once caught up, a plain line is refused: who wrote it cannot be told.
        let b = batch_of(&["NEURON_HW_ERR=DMA_ERROR nd-id=2"], None);
        assert_eq!((b.events.len(), b.refusals.as_slice()), (0, &[(None, Refusal::NoHeader)][..]));
    }

    #[test]
    fn lines_are_bounded_and_a_last_line_without_newline_is_taken() {
        let mut lines = LineBuffer::default();
        let mut seen = Vec::new();
        let mut too_long = 0;
        let long = vec![b'x'; MAX_KMSG_RECORD_BYTES + 10];
        lines.push(&long, |l, _| seen.push(l.to_owned()), &mut too_long);
        assert_eq!(lines.judged, lines.offset, "dropped, whatever follows");
        lines.push(b"still the long line\nnext\ntail", |l, _| seen.push(l.to_owned()), &mut too_long);
        assert_eq!(seen, ["next"]);
        assert_eq!(too_long, 1);
        assert_eq!(lines.stale_partial(Duration::from_secs(3600)), None, "may still grow");
        assert_eq!(lines.judged, lines.offset - 4, "the tail is not judged yet");
        let end = lines.offset;
        assert_eq!(lines.stale_partial(Duration::ZERO), Some(("tail".to_owned(), end)));
        assert_eq!(lines.judged, end);
    }

    /// Issue 42: what is appended after the open is live, even when the reader gets to it
    /// in the batch that ends the history: a line without a header is refused (as
    /// history it is skipped), a record stamped at boot is judged (as history it is
    /// older than the look-back). The batch says the history ended.
    #[test]
    fn lines_written_after_the_open_are_live_however_soon_they_are_read() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("kmsg-open-{}-{}", std::process::id(), fastrand::u64(..)));
        fs::write(&path, "3,1,0,-;NEURON_HW_ERR=DMA_ERROR nd-id=0\nNEURON_HW_ERR=DMA_ERROR nd-id=0\n").unwrap();
        let file = fs::File::open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        let mut log = fs::OpenOptions::new().append(true).open(&path).unwrap();
        log.write_all(b"3,2,0,-;NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1\nNEURON_HW_ERR=DMA_ERROR nd-id=2\n")
            .unwrap();
        let look_back =
            LookBack { window: Duration::from_secs(60), uptime: Some(Duration::from_secs(3600)), after_seq: None };
        let follower = Follower { path: path.clone(), look_back };
        let stop = Stop::new();
        let mut batches = Vec::new();
        follower
            .follow_file(file, len, &stop, &mut |b| {
                batches.push(b);
                stop.set();
            })
            .unwrap();
        let _ = fs::remove_file(&path);
        let [batch] = batches.as_slice() else { panic!("{batches:?}") };
        assert!(batch.caught_up);
        assert_eq!(batch.records, 4);
        let [(Some(2), Event::HwError(e))] = batch.events.as_slice() else { panic!("{batch:?}") };
        assert_eq!(e.device, 1);
        assert_eq!(batch.refusals, [(None, Refusal::NoHeader)]);
    }

    /// The history ends only once its last line is judged: a last line without its
    /// newline at the open waits for it (or for a tick), and the batch that takes it says so.
    #[test]
    fn the_history_ends_with_the_batch_that_judges_its_last_line() {
        let mut lines = LineBuffer::at(0);
        let mut seen = Vec::new();
        lines.push(b"3,1,0,-;a\n3,2,0,-;b", |l, end| seen.push((l.to_owned(), end)), &mut 0);
        let history_end = 19;
        assert_eq!((lines.offset, lines.judged), (history_end, 10), "b is not judged yet");
        lines.push(b"\n", |l, end| seen.push((l.to_owned(), end)), &mut 0);
        assert_eq!(seen, [("3,1,0,-;a".to_owned(), 10), ("3,2,0,-;b".to_owned(), 20)]);
        assert!(lines.judged >= history_end);
    }

    #[test]
    fn follows_a_regular_file_as_it_grows() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("kmsg-{}-{}", std::process::id(), fastrand::u64(..)));
        // History: a record older than the look-back and a line that cannot be placed in time.
        fs::write(&path, "3,1,0,-;NEURON_HW_ERR=DMA_ERROR nd-id=0\nNEURON_HW_ERR=DMA_ERROR nd-id=0\n").unwrap();
        let stop = std::sync::Arc::new(Stop::new());
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
        let history = rx.recv_timeout(Duration::from_secs(10)).expect("the history's batch");
        assert!(history.caught_up);
        assert_eq!((history.records, history.events.len(), history.refusals.len()), (2, 0, 0), "{history:?}");
        // Live: the same plain line is refused now, not skipped.
        let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"3,2,3599000000,-;NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1\n").unwrap();
        file.write_all(b"NEURON_HW_ERR=DMA_ERROR nd-id=0\n").unwrap();
        let (mut events, mut refusals) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(10);
        while refusals.is_empty() && Instant::now() < deadline {
            if let Ok(b) = rx.recv_timeout(Duration::from_millis(100)) {
                assert!(!b.caught_up, "caught up once");
                events.extend(b.events);
                refusals.extend(b.refusals);
            }
        }
        stop.set();
        thread.join().unwrap().unwrap();
        let _ = fs::remove_file(&path);
        assert_eq!(events.len(), 1, "{events:?}");
        let Event::HwError(e) = &events[0].1 else { panic!() };
        assert_eq!(e.name, "HBM_UNCORRECTABLE_ERROR");
        assert_eq!(refusals, [(None, Refusal::NoHeader)]);
    }
}
