//! The NVIDIA driver's Xid records in the kernel log, and what each Xid code means.
//!
//! The driver prints `NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has
//! fallen off the bus.` (older drivers: `NVRM: Xid (0000:03:00): 14, Channel 00000001`);
//! the NVSwitch driver prints `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, …`.
//! The PCI address names the GPU (or the NVSwitch), the number after it is the code; the
//! rest is free text the agent does not interpret (a process name in it is anyone's
//! choice). [`parse`] takes the text of a record from its start (after a time stamp at
//! most); who wrote the record (facility, level) is the kernel-log reader's to check.
//!
//! [`XID_TABLE`]: the one table of what the agent does with each code.

use super::PciAddress;

/// Bytes of a PCI address between the parentheses (`PCI:00000000:53:00.0` is 20).
const MAX_ADDRESS_BYTES: usize = 24;
/// Digits of a code (Xids have at most 3, SXids 5).
const MAX_CODE_DIGITS: usize = 6;
/// Bytes kept of a process name.
const MAX_PROCESS_BYTES: usize = 64;
/// Bytes kept of the free text after the code.
const MAX_MESSAGE_BYTES: usize = 256;

/// The driver's prefix of a GPU's Xid record.
pub const XID_TOKEN: &str = "NVRM: Xid (";
/// What an NVSwitch's SXid record has after `nvidia-nvswitch<N>: `.
pub const SXID_TOKEN: &str = "SXid (";
const NVSWITCH_PREFIX: &str = "nvidia-nvswitch";

/// Whose record: a GPU's or an NVSwitch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XidKind {
    Gpu,
    NvSwitch,
}

/// One Xid (or SXid) record, bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidRecord {
    pub kind: XidKind,
    pub address: PciAddress,
    pub code: u32,
    /// `pid=<n>`, when a number.
    pub pid: Option<u32>,
    /// `name=<process>`, printable ASCII, at most 64 bytes.
    pub process: Option<String>,
    /// The free text after the code's fields, printable, at most 256 bytes.
    pub message: String,
}

/// Why a text that names an Xid record is not one as the driver writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XidError {
    /// The token is not at the start of the text: text the kernel quotes.
    Position,
    /// The address or the code is missing, malformed or out of range.
    Format,
}

/// Whether a text names an Xid or SXid record anywhere (the reader refuses the ones not
/// at the start).
pub fn mentions_xid(text: &str) -> bool {
    text.contains(XID_TOKEN) || text.contains(SXID_TOKEN)
}

/// Parses a record's text that starts with the token (`start`: the text after any time
/// stamp). `Ok(None)`: no Xid token anywhere.
pub fn parse(start: &str) -> Result<Option<XidRecord>, XidError> {
    let (kind, rest) = if let Some(rest) = start.strip_prefix(XID_TOKEN) {
        (XidKind::Gpu, rest)
    } else if let Some(rest) = strip_nvswitch_prefix(start) {
        (XidKind::NvSwitch, rest)
    } else if mentions_xid(start) {
        return Err(XidError::Position);
    } else {
        return Ok(None);
    };
    parse_after_token(kind, rest).map(Some).ok_or(XidError::Format)
}

/// `nvidia-nvswitch<N>: SXid (` → the text after it.
fn strip_nvswitch_prefix(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(NVSWITCH_PREFIX)?;
    let (instance, rest) = rest.split_once(": ")?;
    let digits = !instance.is_empty() && instance.len() <= 3 && instance.bytes().all(|b| b.is_ascii_digit());
    digits.then_some(())?;
    rest.strip_prefix(SXID_TOKEN)
}

/// `PCI:0000:53:00): 79, pid=1234, name=python, text` → the record.
fn parse_after_token(kind: XidKind, rest: &str) -> Option<XidRecord> {
    let (address, rest) = rest.split_once(')')?;
    if address.len() > MAX_ADDRESS_BYTES {
        return None;
    }
    let address = PciAddress::parse(address.strip_prefix("PCI:").unwrap_or(address))?;
    let rest = rest.strip_prefix(": ")?;
    let (code, mut rest) = rest.split_once(',').unwrap_or((rest, ""));
    let code = code.trim_end();
    let code_ok = !code.is_empty() && code.len() <= MAX_CODE_DIGITS && code.bytes().all(|b| b.is_ascii_digit());
    let code: u32 = code_ok.then(|| code.parse().ok()).flatten()?;
    let mut record = XidRecord { kind, address, code, pid: None, process: None, message: String::new() };
    // `pid=…` and `name=…`, in that order, each at most once; the rest is free text.
    if let Some((value, after)) = field(rest, "pid=") {
        record.pid = value.parse().ok();
        rest = after;
    }
    if let Some((value, after)) = field(rest, "name=") {
        record.process = Some(printable(value, MAX_PROCESS_BYTES)).filter(|p| !p.is_empty());
        rest = after;
    }
    record.message = printable(rest.trim(), MAX_MESSAGE_BYTES);
    Some(record)
}

/// ` key=value, rest` → (value, rest).
fn field<'a>(text: &'a str, key: &str) -> Option<(&'a str, &'a str)> {
    let value = text.trim_start().strip_prefix(key)?;
    Some(value.split_once(", ").unwrap_or((value, "")))
}

/// Printable ASCII of `text` (others as `?`), at most `max` bytes.
fn printable(text: &str, max: usize) -> String {
    text.chars().take(max).map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect()
}

/// What NVIDIA recommends doing first about an Xid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: informational.
    None,
    RestartApplication,
    ResetGpu,
    RebootNode,
    ContactSupport,
}

impl Action {
    /// As events and reasons name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "NONE",
            Action::RestartApplication => "RESTART_APPLICATION",
            Action::ResetGpu => "RESET_GPU",
            Action::RebootNode => "REBOOT_NODE",
            Action::ContactSupport => "CONTACT_SUPPORT",
        }
    }
}

/// The likely cause NVIDIA's catalogue gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Application,
    Driver,
    Hardware,
    Memory,
    Bus,
    Firmware,
    Interconnect,
    Unknown,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Application => "application",
            Cause::Driver => "driver",
            Cause::Hardware => "hardware",
            Cause::Memory => "memory",
            Cause::Bus => "bus",
            Cause::Firmware => "firmware",
            Cause::Interconnect => "interconnect",
            Cause::Unknown => "unknown",
        }
    }
}

/// What the agent does with one Xid code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XidInfo {
    pub code: u32,
    /// Fatal: the GPU is unhealthy until the driver is reloaded or the node reboots.
    /// Otherwise counted only.
    pub fatal: bool,
    pub cause: Cause,
    pub action: Action,
    /// A few words of what it is.
    pub what: &'static str,
}

const fn xid(code: u32, fatal: bool, cause: Cause, action: Action, what: &'static str) -> XidInfo {
    XidInfo { code, fatal, cause, action, what }
}

use Action::{ContactSupport, None as NoAction, RebootNode, ResetGpu, RestartApplication};
use Cause::{Application, Bus, Driver, Firmware, Hardware, Interconnect, Memory};

/// The Xid codes the agent knows, sorted by code. Source: NVIDIA's Xid catalogue
/// ("Xid Errors", docs.nvidia.com/deploy/xid-errors, the catalogue for Ampere and later:
/// description, likely cause, "Resolution Bucket (Immediate Action)"); fatal: the codes
/// fleet health checks commonly treat as critical (the uncorrectable memory errors, the
/// GPU off the bus, micro-controller and GSP failures). Any other code is informational,
/// its cause unknown: counted, never making a GPU unhealthy. 136, on some fleets' lists of
/// critical codes, is "Reserved" in the catalogue: left out rather than given a meaning.
pub const XID_TABLE: &[XidInfo] = &[
    xid(8, false, Driver, RestartApplication, "GPU stopped processing (channel idle timeout)"),
    xid(11, false, Application, RestartApplication, "invalid or corrupted push buffer stream"),
    xid(13, false, Application, RestartApplication, "graphics engine exception"),
    xid(31, false, Application, RestartApplication, "GPU memory page fault"),
    xid(32, false, Application, RestartApplication, "invalid or corrupted push buffer stream (PBDMA)"),
    xid(43, false, Application, RestartApplication, "GPU stopped processing (channel reset)"),
    xid(45, false, Application, NoAction, "preemptive cleanup after a previous error or a process end"),
    xid(46, true, Driver, ResetGpu, "GPU stopped processing"),
    xid(48, true, Memory, ResetGpu, "double-bit ECC error"),
    xid(62, true, Firmware, ResetGpu, "internal micro-controller halt"),
    xid(63, true, Memory, ResetGpu, "row remapping or page retirement recorded (reset to apply)"),
    xid(64, true, Memory, ResetGpu, "row remapping or page retirement failure"),
    xid(74, true, Interconnect, ResetGpu, "NVLink error"),
    xid(79, true, Bus, RebootNode, "GPU has fallen off the bus"),
    xid(92, false, Memory, NoAction, "high single-bit ECC error rate"),
    xid(94, false, Memory, RestartApplication, "contained ECC error"),
    xid(95, true, Memory, ResetGpu, "uncontained ECC error"),
    xid(109, false, Application, RestartApplication, "context switch timeout"),
    xid(110, true, Hardware, ResetGpu, "security fault"),
    xid(119, true, Firmware, ResetGpu, "GSP RPC timeout"),
    xid(120, true, Firmware, ResetGpu, "GSP error"),
    xid(140, true, Memory, ResetGpu, "unrecovered ECC error"),
    xid(143, true, Hardware, ResetGpu, "GPU initialization failure"),
    xid(154, false, Driver, NoAction, "GPU recovery action changed (the record names it)"),
    xid(155, true, Interconnect, ResetGpu, "NVLink software-defined error"),
    xid(156, true, Memory, ResetGpu, "resource retirement event (reset to apply)"),
    xid(157, true, Memory, ContactSupport, "resource retirement failure"),
    xid(158, true, Hardware, ResetGpu, "GPU fatal timeout"),
];

/// What the agent does with `code`: the table's entry, else informational.
pub fn info(code: u32) -> XidInfo {
    match XID_TABLE.binary_search_by_key(&code, |x| x.code) {
        Ok(i) => XID_TABLE[i],
        Err(_) => xid(code, false, Cause::Unknown, NoAction, "not in the agent's table"),
    }
}

/// The reason a fatal Xid gives: `XID_<code>`.
pub fn reason_name(code: u32) -> String {
    format!("XID_{code}")
}

/// The bounded label of a code on the Xid counter: `0`..=`999`, else `other`.
pub fn code_label(code: u32) -> String {
    if code <= 999 {
        code.to_string()
    } else {
        "other".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> PciAddress {
        PciAddress::parse(text).unwrap()
    }

    #[test]
    fn the_current_record_form_gives_address_code_pid_name_and_text() {
        let r = parse("NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
            .unwrap()
            .unwrap();
        assert_eq!((r.kind, r.address, r.code), (XidKind::Gpu, address("0000:53:00"), 79));
        assert_eq!((r.pid, r.process.as_deref()), (Some(1234), Some("python")));
        assert_eq!(r.message, "GPU has fallen off the bus.");
    }

    #[test]
    fn unknown_pids_the_old_form_and_a_bare_code_are_read() {
        let r = parse("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception")
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.address, r.code, r.pid, r.process.as_deref()),
            (address("0000:cb:00"), 13, None, Some("<unknown>"))
        );
        assert_eq!(r.message, "Graphics SM Warp Exception");
        let old = parse("NVRM: Xid (0000:03:00): 14, Channel 00000001").unwrap().unwrap();
        assert_eq!(
            (old.address, old.code, old.pid, old.message.as_str()),
            (address("0000:03:00"), 14, None, "Channel 00000001")
        );
        let bare = parse("NVRM: Xid (PCI:0000:53:00.0): 48").unwrap().unwrap();
        assert_eq!((bare.code, bare.message.as_str()), (48, ""));
    }

    #[test]
    fn nvswitch_sxid_records_are_recognised_as_such() {
        let r = parse("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress error")
            .unwrap()
            .unwrap();
        assert_eq!((r.kind, r.address, r.code), (XidKind::NvSwitch, address("0000:05:00"), 12028));
        assert_eq!(r.message, "Non-fatal, Link 32 egress error");
    }

    #[test]
    fn text_without_a_token_is_no_record() {
        assert_eq!(parse("NVRM: loading NVIDIA UNIX x86_64 Kernel Module 550.54.15"), Ok(None));
        assert_eq!(parse(""), Ok(None));
    }

    #[test]
    fn a_token_after_the_start_is_refused_for_its_position() {
        for text in [
            "audit: comm=\"NVRM: Xid (PCI:0000:53:00): 79, \"",
            "Out of memory: Killed process 9 (NVRM: Xid (PCI:0000:53:00): 79,)",
            " NVRM: Xid (PCI:0000:53:00): 79,",
            "nvidia-nvswitchX: SXid (PCI:0000:05:00.0): 1,",
        ] {
            assert_eq!(parse(text), Err(XidError::Position), "{text}");
        }
    }

    #[test]
    fn malformed_or_hostile_records_are_refused_for_their_format() {
        for text in [
            "NVRM: Xid (PCI:0000:53:00): , pid=1",
            "NVRM: Xid (PCI:0000:53:00): 99999999999999999999, pid=1",
            "NVRM: Xid (PCI:0000:53:00): 4294967296",
            "NVRM: Xid (PCI:0000:53:00): -1, x",
            "NVRM: Xid (PCI:0000:53:00): 0x4f, x",
            "NVRM: Xid (PCI:0000:53:00) 79, x",
            "NVRM: Xid (PCI:0000:53:00",
            "NVRM: Xid (): 79,",
            "NVRM: Xid (PCI:zzzz:53:00): 79,",
            "NVRM: Xid (PCI:0000:153:00): 79,",
            "NVRM: Xid (PCI:0000:0000000000000000000000000053:00): 79,",
            "NVRM: Xid (PCI:0000:53:00): 7 9, x",
        ] {
            assert_eq!(parse(text), Err(XidError::Format), "{text}");
        }
    }

    #[test]
    fn text_after_the_code_cannot_make_a_second_record_or_change_the_first() {
        let r =
            parse("NVRM: Xid (PCI:0000:53:00): 13, pid=5, name=NVRM: Xid (PCI:0000:54:00): 79, x, y").unwrap().unwrap();
        assert_eq!((r.address, r.code), (address("0000:53:00"), 13));
        assert_eq!(r.process.as_deref(), Some("NVRM: Xid (PCI:0000:54:00): 79"));
        let huge_pid = parse("NVRM: Xid (PCI:0000:53:00): 31, pid=99999999999999, name=a, b").unwrap().unwrap();
        assert_eq!((huge_pid.code, huge_pid.pid), (31, None));
    }

    #[test]
    fn names_and_text_are_bounded_and_printable_whatever_the_bytes() {
        let raw = b"NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=\xff\xfe\x1b[31m, \xc3\x28 off";
        let text = String::from_utf8_lossy(raw);
        let r = parse(&text).unwrap().unwrap();
        assert_eq!(r.code, 79);
        assert!(r.process.unwrap().bytes().all(|b| b.is_ascii_graphic() || b == b' '));
        assert!(r.message.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
        let long = format!("NVRM: Xid (PCI:0000:53:00): 79, pid=1, name={}, {}", "p".repeat(5000), "m".repeat(5000));
        let r = parse(&long).unwrap().unwrap();
        assert_eq!((r.process.unwrap().len(), r.message.len()), (MAX_PROCESS_BYTES, MAX_MESSAGE_BYTES));
    }

    #[test]
    fn the_table_is_sorted_and_its_fatal_codes_name_an_action() {
        assert!(XID_TABLE.windows(2).all(|w| w[0].code < w[1].code), "binary search needs order");
        for x in XID_TABLE.iter().filter(|x| x.fatal) {
            assert_ne!(x.action, Action::None, "Xid {} is fatal", x.code);
        }
        assert!(info(79).fatal && info(48).fatal && info(95).fatal);
        assert_eq!(info(79).action, Action::RebootNode);
        assert!(!info(13).fatal && !info(94).fatal);
        let unknown = info(12345);
        assert_eq!((unknown.fatal, unknown.cause, unknown.action), (false, Cause::Unknown, Action::None));
    }

    #[test]
    fn code_labels_are_bounded() {
        assert_eq!((code_label(0), code_label(999), code_label(1000)), ("0".into(), "999".into(), "other".into()));
        assert_eq!(reason_name(79), "XID_79");
    }
}
