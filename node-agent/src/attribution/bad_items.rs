//! The one way attribution logs the bad items of an outside input (a kubelet's device ids,
//! the DRA claims' devices, the NVIDIA ids): a line says how many there are and names a
//! few, each cut to a few bytes; the lines of one log are rate-limited, and the next line
//! says how many were left out meanwhile. However many bad items come, and however often
//! they change, the log stays a few short lines ([`api::limits::MAX_LOGGED_ITEMS`] and the
//! limits beside it).

use std::{
    fmt::{self, Write},
    sync::{Arc, Mutex},
    time::Duration,
};

use api::limits::{BAD_INPUT_LOG_PERIOD_SECONDS, MAX_BAD_INPUT_LOG_LINES, MAX_LOGGED_ITEMS, MAX_LOGGED_ITEM_BYTES};
use service::ratelimit::{Decision, RateLimit};
use tracing::warn;

/// A log of one kind of bad items; cloning shares its rate limit.
#[derive(Clone)]
pub struct BadItemLog {
    lines: Arc<Mutex<RateLimit>>,
}

impl Default for BadItemLog {
    fn default() -> Self {
        let period = Duration::from_secs(BAD_INPUT_LOG_PERIOD_SECONDS);
        BadItemLog { lines: Arc::new(Mutex::new(RateLimit::new(MAX_BAD_INPUT_LOG_LINES, period))) }
    }
}

impl BadItemLog {
    /// Logs `message` about `count` bad items, naming the first few of `items`; nothing
    /// when there are none, or while this log's lines are spent.
    pub fn warn<T: fmt::Display>(&self, message: &str, count: usize, items: impl IntoIterator<Item = T>) {
        if count == 0 {
            return;
        }
        let decision = self.lines.lock().unwrap_or_else(|p| p.into_inner()).check();
        if let Decision::Allow { suppressed_before } = decision {
            warn!(count, examples = %few(items), suppressed_before, "{message}");
        }
    }
}

/// The first [`MAX_LOGGED_ITEMS`] of `items`, each cut to [`MAX_LOGGED_ITEM_BYTES`] (`…`
/// marks a cut) and quoted with Rust's escapes (no control character reaches the log).
pub fn few<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut out = String::new();
    for (n, item) in items.into_iter().take(MAX_LOGGED_ITEMS).enumerate() {
        let mut cut = Cut { text: String::new(), cut: false };
        // A cut ends the formatting with an error: what was written before it is kept.
        let _ = write!(cut, "{item}");
        let _ = write!(out, "{}{:?}{}", if n > 0 { ", " } else { "" }, cut.text, if cut.cut { "…" } else { "" });
    }
    out
}

/// Text written up to [`MAX_LOGGED_ITEM_BYTES`], at a character boundary.
struct Cut {
    text: String,
    cut: bool,
}

impl Write for Cut {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = MAX_LOGGED_ITEM_BYTES - self.text.len();
        let take = s.floor_char_boundary(room);
        self.text.push_str(&s[..take]);
        if take < s.len() {
            self.cut = true;
            return Err(fmt::Error);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_items_each_cut_and_escaped() {
        let items = ["plain".to_owned(), "x".repeat(1000), "new\nline".to_owned(), "a".into(), "b".into(), "c".into()];
        let named = few(&items);
        assert!(named.starts_with("\"plain\", \"xxx"), "{named}");
        assert!(named.contains(&format!("\"{}\"…", "x".repeat(MAX_LOGGED_ITEM_BYTES))), "{named}");
        assert!(named.contains("\"new\\nline\"") && !named.contains('\n'), "{named}");
        assert!(named.ends_with("\"b\""), "the first {MAX_LOGGED_ITEMS} only: {named}");
        assert!(named.len() < MAX_LOGGED_ITEMS * (MAX_LOGGED_ITEM_BYTES + 8), "{}", named.len());
    }

    #[test]
    fn a_cut_falls_on_a_character_boundary() {
        let named = few(["é".repeat(MAX_LOGGED_ITEM_BYTES)]);
        assert_eq!(named, format!("{:?}…", "é".repeat(MAX_LOGGED_ITEM_BYTES / 2)));
    }
}
