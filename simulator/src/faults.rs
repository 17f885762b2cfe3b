//! Output faults, and the writer that applies them: what is written around and instead
//! of each document, and what happens after it (exit, hang).
//!
//! Documents are counted from 1; garbage and padding lines are not documents, a
//! truncated document is.

use std::borrow::Cow;
use std::io::{self, Write};

/// Smallest accepted `--oversized-bytes`: room for the JSON skeleton of the padding.
pub const MIN_OVERSIZED_BYTES: u64 = 64;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Exit with code 3 after this many documents.
    pub exit_after: Option<u64>,
    /// Stop writing (but stay alive) after this many documents.
    pub hang_after: Option<u64>,
    /// Exit with code 0 after this many documents.
    pub max_documents: Option<u64>,
    /// Every Nth document is preceded by a line that is not JSON.
    pub garbage_every: Option<u64>,
    /// Every Nth document is cut in half.
    pub truncate_every: Option<u64>,
    /// The Nth document is preceded by one huge line.
    pub oversized_at: Option<u64>,
    pub oversized_bytes: usize,
}

/// What the writer does once a document is out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Continue,
    Exit(u8),
    Hang,
}

/// Exit code of `--exit-after`: a crash, as far as the supervisor can tell.
pub const CRASH_EXIT_CODE: u8 = 3;

fn every(n: u64, every: Option<u64>) -> bool {
    every.is_some_and(|e| e > 0 && n.is_multiple_of(e))
}

impl Faults {
    /// The lines written for the `n`th document, in order, without their newlines.
    pub fn lines<'a>(&self, n: u64, document: &'a str) -> Vec<Cow<'a, str>> {
        let mut lines = Vec::with_capacity(3);
        if every(n, self.garbage_every) {
            lines.push(Cow::Owned(garbage_line(n)));
        }
        if self.oversized_at == Some(n) {
            lines.push(Cow::Owned(padding_line(self.oversized_bytes)));
        }
        if every(n, self.truncate_every) {
            lines.push(Cow::Borrowed(truncated(document)));
        } else {
            lines.push(Cow::Borrowed(document));
        }
        lines
    }

    /// What to do once `written` documents are out (checked with 0 before the first).
    pub fn after(&self, written: u64) -> Next {
        let reached = |limit: Option<u64>| limit.is_some_and(|l| written >= l);
        if reached(self.exit_after) {
            Next::Exit(CRASH_EXIT_CODE)
        } else if reached(self.max_documents) {
            Next::Exit(0)
        } else if reached(self.hang_after) {
            Next::Hang
        } else {
            Next::Continue
        }
    }
}

pub fn garbage_line(n: u64) -> String {
    format!("!!! neuron-monitor-sim garbage before document {n}: this line is not JSON !!!")
}

/// The first half of a document: never valid JSON, since the top-level object stays open.
pub fn truncated(document: &str) -> &str {
    let mut cut = document.len() / 2;
    while !document.is_char_boundary(cut) {
        cut -= 1;
    }
    &document[..cut]
}

/// A valid JSON object of exactly `bytes` bytes (at least its 14-byte skeleton).
pub fn padding_line(bytes: usize) -> String {
    const OPEN: &str = "{\"padding\":\"";
    const CLOSE: &str = "\"}";
    let fill = bytes.saturating_sub(OPEN.len() + CLOSE.len());
    let mut line = String::with_capacity(bytes.max(OPEN.len() + CLOSE.len()));
    line.push_str(OPEN);
    line.extend(std::iter::repeat_n('x', fill));
    line.push_str(CLOSE);
    line
}

/// Writes documents with their faults, one flushed line at a time.
pub struct Emitter<W> {
    out: W,
    faults: Faults,
    written: u64,
}

impl<W: Write> Emitter<W> {
    pub fn new(out: W, faults: Faults) -> Self {
        Emitter { out, faults, written: 0 }
    }

    /// What to do before anything is written (`--exit-after 0` and the like).
    pub fn start(&self) -> Next {
        self.faults.after(0)
    }

    pub fn emit(&mut self, document: &str) -> io::Result<Next> {
        let n = self.written + 1;
        for line in self.faults.lines(n, document) {
            self.out.write_all(line.as_bytes())?;
            self.out.write_all(b"\n")?;
            self.out.flush()?;
        }
        self.written = n;
        Ok(self.faults.after(n))
    }

    #[cfg(test)]
    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"neuron_runtime_data":[],"system_data":{},"instance_info":{}}"#;

    fn run(faults: Faults, documents: u64) -> (Vec<String>, Vec<Next>) {
        let mut emitter = Emitter::new(Vec::new(), faults);
        let nexts = (0..documents).map(|_| emitter.emit(DOC).unwrap()).collect();
        let out = String::from_utf8(emitter.into_inner()).unwrap();
        assert!(out.ends_with('\n'));
        (out.lines().map(String::from).collect(), nexts)
    }

    fn is_json(line: &str) -> bool {
        serde_json::from_str::<serde_json::Value>(line).is_ok()
    }

    #[test]
    fn without_faults_every_line_is_the_document() {
        let (lines, nexts) = run(Faults::default(), 3);
        assert_eq!(lines, vec![DOC; 3]);
        assert_eq!(nexts, vec![Next::Continue; 3]);
    }

    #[test]
    fn garbage_comes_before_every_nth_document() {
        let faults = Faults { garbage_every: Some(2), ..Faults::default() };
        let (lines, _) = run(faults, 4);
        assert_eq!(lines.len(), 6);
        assert_eq!(lines[0], DOC);
        assert!(!is_json(&lines[1]) && lines[1].contains("document 2"));
        assert_eq!(lines[2], DOC);
        assert_eq!(lines[3], DOC);
        assert!(!is_json(&lines[4]));
        assert_eq!(lines[5], DOC);
    }

    #[test]
    fn every_nth_document_is_cut_in_half() {
        let faults = Faults { truncate_every: Some(3), ..Faults::default() };
        let (lines, _) = run(faults, 6);
        assert_eq!(lines.len(), 6);
        for (i, line) in lines.iter().enumerate() {
            if (i + 1) % 3 == 0 {
                assert_eq!(line.as_str(), &DOC[..DOC.len() / 2]);
                assert!(!is_json(line) && !line.ends_with('}'));
            } else {
                assert_eq!(line, DOC);
            }
        }
        assert_eq!(truncated("aéé"), "a");
    }

    #[test]
    fn one_oversized_line_precedes_the_nth_document() {
        let faults = Faults { oversized_at: Some(2), oversized_bytes: 1000, ..Faults::default() };
        let (lines, _) = run(faults, 3);
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1].len(), 1000);
        assert!(is_json(&lines[1]));
        assert_eq!((lines[0].as_str(), lines[2].as_str(), lines[3].as_str()), (DOC, DOC, DOC));
        assert_eq!(padding_line(4 << 20).len(), 4 << 20);
    }

    #[test]
    fn faults_combine_in_a_fixed_order() {
        let faults = Faults {
            garbage_every: Some(1),
            truncate_every: Some(1),
            oversized_at: Some(1),
            oversized_bytes: 100,
            ..Faults::default()
        };
        let lines = faults.lines(1, DOC);
        assert!(!is_json(&lines[0]));
        assert_eq!(lines[1].len(), 100);
        assert_eq!(lines[2], truncated(DOC));
    }

    #[test]
    fn exit_hang_and_max_documents_stop_after_their_count() {
        let exit = Faults { exit_after: Some(2), ..Faults::default() };
        assert_eq!(run(exit.clone(), 2).1, vec![Next::Continue, Next::Exit(3)]);
        assert_eq!(exit.after(0), Next::Continue);

        let hang = Faults { hang_after: Some(1), ..Faults::default() };
        assert_eq!(run(hang, 1).1, vec![Next::Hang]);

        let max = Faults { max_documents: Some(0), ..Faults::default() };
        assert_eq!(Emitter::new(Vec::new(), max).start(), Next::Exit(0));

        // The crash wins over a clean stop or a hang at the same count.
        let all = Faults { exit_after: Some(2), max_documents: Some(2), hang_after: Some(1), ..Faults::default() };
        assert_eq!(all.after(1), Next::Hang);
        assert_eq!(all.after(2), Next::Exit(3));
    }

    #[test]
    fn a_closed_pipe_is_reported_as_broken_pipe() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let err = Emitter::new(Closed, Faults::default()).emit(DOC).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
