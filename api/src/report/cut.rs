//! Cuts the loaded models' text out of a report line before serde reads it.
//!
//! `memory_used.loaded_models` is three quarters of a large report's bytes (each model's
//! subgraphs), and the agent reads it only when it changed. serde_json must still scan a
//! value it skips token by token; here its extent is found 64 bytes at a time by
//! bracket counting (strings masked out): the 32-runtime report's parse and update went
//! from 335 to 246 µs (`report_pipeline`'s `parse_and_update` against its
//! `whole_line_by_serde`). The value is not checked here: it is parsed, and checked, when
//! read ([`super::MemoryUsed::loaded_models`]).

use std::ops::Range;

use crate::limits::MAX_RUNTIMES_PER_REPORT;

const KEY: &[u8] = b"\"loaded_models\":";

/// One value cut out: its text in the line, and where its placeholder (its index, a JSON
/// number) starts in the copy.
#[derive(Debug, PartialEq)]
pub(super) struct Cut {
    pub text: Range<usize>,
    pub placeholder: usize,
}

/// Copies `line` into `out` with each `"loaded_models":` value replaced by a placeholder;
/// the cuts in order. `None`, with `out` to be ignored, where there is nothing to cut or
/// where a value is not an array or object that ends within the line: the line is then
/// read as it is, so that serde reports what is wrong with it.
pub(super) fn cut_loaded_models(line: &str, out: &mut String) -> Option<Vec<Cut>> {
    let bytes = line.as_bytes();
    let finder = memchr::memmem::Finder::new(KEY);
    let mut cuts = Vec::new();
    let mut from = 0;
    // A runtime has one; beyond the runtimes a report is read for, the rest stay for serde
    // (a line of nothing but such keys must not size the cuts by its length).
    while cuts.len() < MAX_RUNTIMES_PER_REPORT {
        let Some(found) = finder.find(&bytes[from..]) else { break };
        let key = from + found;
        from = key + KEY.len();
        if !is_key(bytes, key) {
            continue;
        }
        let start = from + bytes[from..].iter().position(|b| !b.is_ascii_whitespace())?;
        let end = container_end(bytes, start)?;
        cuts.push(start..end);
        from = end;
    }
    if cuts.is_empty() {
        return None;
    }
    out.clear();
    let mut copied = 0;
    let cuts = cuts
        .into_iter()
        .enumerate()
        .map(|(index, text)| {
            out.push_str(&line[copied..text.start]);
            let placeholder = out.len();
            push_index(out, index);
            copied = text.end;
            Cut { text, placeholder }
        })
        .collect();
    out.push_str(&line[copied..]);
    Some(cuts)
}

/// Whether the quote at `at` opens a string rather than sitting escaped inside one: an
/// even run of backslashes before it. (Found outside a string, `"loaded_models":` is a
/// key: the closing quote is unescaped, so the name between is a whole string.)
fn is_key(bytes: &[u8], at: usize) -> bool {
    bytes[..at].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 0
}

fn push_index(out: &mut String, index: usize) {
    use std::fmt::Write;
    let _ = write!(out, "{index}");
}

/// The end (exclusive) of the array or object that opens at `start`: where the brackets
/// outside strings balance. `None` when `start` holds neither or the line ends first.
/// Brackets are counted, not matched in kind: the parse on reading checks the rest.
fn container_end(bytes: &[u8], start: usize) -> Option<usize> {
    if !matches!(bytes.get(start), Some(b'[' | b'{')) {
        return None;
    }
    // Past the opening bracket, `depth` is at least 1 until the end is found.
    let mut at = start + 1;
    let mut depth = 1usize;
    let mut in_string = false;
    while let Some(block) = bytes.get(at..at + 64) {
        let marks = Marks::of(block.try_into().ok()?);
        if marks.backslashes != 0 {
            // Escapes are rare in a report; the byte walk reads them.
            break;
        }
        let inside = prefix_xor(marks.quotes) ^ if in_string { u64::MAX } else { 0 };
        let (opens, closes) = (marks.opens & !inside, marks.closes & !inside);
        if closes.count_ones() as usize >= depth {
            // The brackets may balance inside this block: walk them in order.
            if let Some(offset) = balance_within(opens, closes, &mut depth) {
                return Some(at + offset + 1);
            }
        } else {
            depth = depth + opens.count_ones() as usize - closes.count_ones() as usize;
        }
        in_string = inside >> 63 == 1;
        at += 64;
    }
    end_by_bytes(bytes, at, depth, in_string)
}

/// Walks a block's brackets in order from `depth` (at least 1); the offset of the one
/// that brings it to zero, if any.
fn balance_within(mut opens: u64, mut closes: u64, depth: &mut usize) -> Option<usize> {
    while closes != 0 {
        let close = closes.trailing_zeros();
        let before = if close == 0 { 0 } else { opens & (u64::MAX >> (64 - close)) };
        *depth += before.count_ones() as usize;
        opens &= !before;
        closes &= closes - 1;
        *depth -= 1;
        if *depth == 0 {
            return Some(close as usize);
        }
    }
    *depth += opens.count_ones() as usize;
    None
}

/// The byte-by-byte form of [`container_end`], from `at` with its state.
fn end_by_bytes(bytes: &[u8], mut at: usize, mut depth: usize, mut in_string: bool) -> Option<usize> {
    while let Some(&byte) = bytes.get(at) {
        match (in_string, byte) {
            (true, b'\\') => at += 1,
            (true, b'"') | (false, b'"') => in_string = !in_string,
            (false, b'[' | b'{') => depth += 1,
            (false, b']' | b'}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
    None
}

/// For each position of a string: whether an odd number of quotes is at or before it
/// (the quote that opens a string counts as inside, the one that closes it does not).
fn prefix_xor(mut bits: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        bits ^= bits << shift;
    }
    bits
}

/// Where a 64-byte block holds quotes, backslashes, opening and closing brackets: one
/// bit per byte, the block's first byte in the lowest bit.
#[derive(Debug, PartialEq)]
struct Marks {
    quotes: u64,
    backslashes: u64,
    opens: u64,
    closes: u64,
}

impl Marks {
    #[cfg(target_arch = "x86_64")]
    fn of(block: &[u8; 64]) -> Marks {
        let mut marks = Marks { quotes: 0, backslashes: 0, opens: 0, closes: 0 };
        for (lane, chunk) in block.as_chunks::<16>().0.iter().enumerate() {
            let [quotes, backslashes, opens, closes] = lane_marks(chunk);
            let shift = 16 * lane;
            marks.quotes |= u64::from(quotes) << shift;
            marks.backslashes |= u64::from(backslashes) << shift;
            marks.opens |= u64::from(opens) << shift;
            marks.closes |= u64::from(closes) << shift;
        }
        marks
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn of(block: &[u8; 64]) -> Marks {
        Marks::by_bytes(block)
    }

    #[cfg_attr(target_arch = "x86_64", allow(dead_code))] // the x86-64 form's reference in tests
    fn by_bytes(block: &[u8; 64]) -> Marks {
        let mut marks = Marks { quotes: 0, backslashes: 0, opens: 0, closes: 0 };
        for (i, byte) in block.iter().enumerate() {
            let field = match byte {
                b'"' => &mut marks.quotes,
                b'\\' => &mut marks.backslashes,
                b'[' | b'{' => &mut marks.opens,
                b']' | b'}' => &mut marks.closes,
                _ => continue,
            };
            *field |= 1 << i;
        }
        marks
    }
}

/// [`Marks`] of 16 bytes: quotes, backslashes, opening and closing brackets.
#[cfg(target_arch = "x86_64")]
fn lane_marks(chunk: &[u8; 16]) -> [u16; 4] {
    use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8};
    // SAFETY: SSE2 is part of every x86-64 processor; the load reads the 16 bytes of
    // `chunk` and needs no alignment.
    unsafe {
        let bytes = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
        // `[` and `{` (0x5b, 0x7b) differ in the 0x20 bit alone, as do `]` and `}`.
        let folded = _mm_or_si128(bytes, _mm_set1_epi8(0x20));
        let bits = |v: __m128i, byte: u8| _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(byte as i8))) as u16;
        [bits(bytes, b'"'), bits(bytes, b'\\'), bits(folded, b'{'), bits(folded, b'}')]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end by serde_json's own reading of the value.
    fn serde_end(text: &str, start: usize) -> usize {
        let mut de = serde_json::Deserializer::from_str(&text[start..]);
        let raw: &serde_json::value::RawValue = serde::Deserialize::deserialize(&mut de).unwrap();
        start + raw.get().len()
    }

    #[test]
    fn ends_where_serde_json_ends_at_every_alignment() {
        let value = r#"{"a":[1,{"b":"x]}"},[]],"c\"}":"{[","d":{"e":"\\"},"f":"é}"}"#;
        for pad in 0..130 {
            let text = format!("{}{value}, \"tail\": [1]", " ".repeat(pad));
            assert_eq!(container_end(text.as_bytes(), pad), Some(serde_end(&text, pad)), "pad {pad}");
        }
    }

    #[test]
    fn long_values_without_escapes_end_where_serde_json_ends() {
        // Blocks with strings across their edges and brackets balanced inside one.
        let model = r#"{"name":"m.neff","subgraphs":{"sg_00":{"memory_used_bytes":{"host":544768,"x":[1,2,{}]}}}}"#;
        for n in [1, 2, 7, 40] {
            for pad in 0..70 {
                let text = format!("{}[{}] ,{{}}", "x".repeat(pad), vec![model; n].join(","));
                assert_eq!(container_end(text.as_bytes(), pad), Some(serde_end(&text, pad)), "{n} models, pad {pad}");
            }
        }
    }

    #[test]
    fn no_end_for_a_cut_short_or_unbalanced_value_or_a_scalar() {
        let text = r#"[{"a":"]"}"#.repeat(20);
        assert_eq!(container_end(text.as_bytes(), 0), None);
        assert_eq!(container_end(b"]", 0), None);
        assert_eq!(container_end(b"12", 0), None);
        assert_eq!(container_end(b"\"[]\"", 0), None);
    }

    #[test]
    fn the_block_marks_are_those_of_a_byte_walk() {
        let samples: [&[u8]; 3] =
            [br#"{"a":[1,2],"b\"":"}]","c":{"d":"\\"}}, 0123456789abcdefghij[]{}"#, &[b'{'; 64], &[0xe9; 64]];
        for sample in samples {
            let mut block = [b' '; 64];
            block[..sample.len().min(64)].copy_from_slice(&sample[..sample.len().min(64)]);
            assert_eq!(Marks::of(&block), Marks::by_bytes(&block));
        }
    }

    #[test]
    fn cuts_each_key_and_leaves_the_same_text_in_a_string() {
        let line = r#"{"a":{"loaded_models": [{"n":"\"loaded_models\":[]"}]},"n\"loaded_models":[5],"b":{"loaded_models":{}},"c":"x\\"}"#;
        let mut out = String::new();
        let cuts = cut_loaded_models(line, &mut out).unwrap();
        assert_eq!(out, r#"{"a":{"loaded_models": 0},"n\"loaded_models":[5],"b":{"loaded_models":1},"c":"x\\"}"#);
        assert_eq!(&line[cuts[0].text.clone()], r#"[{"n":"\"loaded_models\":[]"}]"#);
        assert_eq!(&line[cuts[1].text.clone()], "{}");
        assert_eq!((&out[cuts[0].placeholder..][..1], &out[cuts[1].placeholder..][..1]), ("0", "1"));
    }

    #[test]
    fn at_most_one_cut_per_runtime_read_the_rest_left_in_place() {
        let keys = MAX_RUNTIMES_PER_REPORT + 3;
        let line = format!("[{}]", vec![r#"{"loaded_models":[1]}"#; keys].join(","));
        let mut out = String::new();
        let cuts = cut_loaded_models(&line, &mut out).unwrap();
        assert_eq!(cuts.len(), MAX_RUNTIMES_PER_REPORT);
        let untouched = [r#"{"loaded_models":[1]}"#; 3].join(",");
        let last = MAX_RUNTIMES_PER_REPORT - 1;
        assert!(out.ends_with(&format!(r#"{{"loaded_models":{last}}},{untouched}]"#)), "{}", &out[out.len() - 90..]);
    }

    #[test]
    fn nothing_is_cut_from_a_line_without_models_or_with_a_value_it_cannot_delimit() {
        let mut out = String::new();
        assert_eq!(cut_loaded_models(r#"{"a":1}"#, &mut out), None);
        assert_eq!(cut_loaded_models(r#"{"loaded_models":null}"#, &mut out), None);
        assert_eq!(cut_loaded_models(r#"{"loaded_models":[{"a":1}"#, &mut out), None);
    }
}
