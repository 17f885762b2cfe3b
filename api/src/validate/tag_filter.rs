//! `spec.runtimes[].tagFilter`: a regular expression that must mean the same to this
//! operator and to neuron-monitor (Go's RE2 syntax), alone and in the merged filter.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use regex::Regex;

const MAX_TAG_FILTER: usize = 1024;
/// Go's regexp (neuron-monitor) refuses larger repeat counts.
const MAX_GO_REPEAT: u32 = 1000;

/// A tag filter must compile, stay within what neuron-monitor's Go regexp accepts, and
/// still mean the same when wrapped in a group for the merged `(a)|(b)` filter.
pub(super) fn check_tag_filter(filter: &str) -> Result<(), String> {
    if filter.is_empty() || filter.len() > MAX_TAG_FILTER {
        return Err(format!("must be 1 to {MAX_TAG_FILTER} bytes long"));
    }
    compiles(filter)?;
    check_go_syntax(filter)
}

/// Verdicts of `Regex::new`, by filter. Compiling is ~90% of validation (up to 0.3 ms
/// for a case-insensitive filter) and the controller validates every config on every
/// pass, with the same few filters across namespaces. Bounded: cleared when full.
static COMPILED: Mutex<Option<HashMap<String, Result<(), String>>>> = Mutex::new(None);
const COMPILED_CAPACITY: usize = 8192;

pub(super) fn compiles(filter: &str) -> Result<(), String> {
    let cached = |cache: &Option<HashMap<String, Result<(), String>>>| cache.as_ref()?.get(filter).cloned();
    if let Some(verdict) = cached(&COMPILED.lock().unwrap_or_else(PoisonError::into_inner)) {
        return verdict;
    }
    // Compiled outside the lock: validations on other threads need not wait.
    let verdict = Regex::new(filter).map(drop).map_err(|e| one_line(&e.to_string()));
    let mut cache = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = cache.get_or_insert_with(HashMap::new);
    if cache.len() >= COMPILED_CAPACITY {
        cache.clear();
    }
    cache.insert(filter.to_owned(), verdict.clone());
    verdict
}

/// The regex crate's errors draw a caret under the pattern over several lines; a
/// condition message reads better on one line.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == '~' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The regex crate accepts a little more than Go's RE2 syntax, which neuron-monitor
/// compiles the merged filter with: a filter Go refuses would stop neuron-monitor on
/// every node the config matches, for every config there. Refuses what compiles here
/// but not in Go: flags other than `i`, `m`, `s`, `U` (notably `x`, whose `#` comments
/// would also swallow the `)` of the merged filter), `\<`, `\>`, `\b{…}`, and repeat
/// counts above 1000.
pub(super) fn check_go_syntax(filter: &str) -> Result<(), String> {
    let chars: Vec<char> = filter.chars().collect();
    let mut i = 0;
    let mut in_class = false;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                let next = chars.get(i + 1).copied();
                match next {
                    Some('<' | '>') => return Err(go_refuses(&format!("\\{}", next.unwrap_or_default()))),
                    Some('b' | 'B') if chars.get(i + 2) == Some(&'{') => {
                        return Err(go_refuses("\\b{...} word boundaries"))
                    }
                    // `\p{…}`, `\x{…}`: skip the braces, they are not a repeat.
                    Some('p' | 'P' | 'x') if chars.get(i + 2) == Some(&'{') => {
                        i += 2;
                        while i < chars.len() && chars[i] != '}' {
                            i += 1;
                        }
                    }
                    _ => i += 1,
                }
            }
            '[' if !in_class => {
                in_class = true;
                // A `]` right after `[` or `[^` is a literal.
                if chars.get(i + 1) == Some(&'^') {
                    i += 1;
                }
                if chars.get(i + 1) == Some(&']') {
                    i += 1;
                }
            }
            '[' if chars.get(i + 1) == Some(&':') => {
                // `[:alpha:]` inside a class.
                while i + 1 < chars.len() && !(chars[i] == ':' && chars[i + 1] == ']') {
                    i += 1;
                }
                i += 1;
            }
            ']' if in_class => in_class = false,
            '(' if !in_class && chars.get(i + 1) == Some(&'?') => {
                let rest = &chars[i + 2..];
                let named = rest.first() == Some(&'<') || rest.starts_with(&['P', '<']);
                if !named {
                    let flags = rest.iter().take_while(|c| **c != ':' && **c != ')');
                    if let Some(flag) = flags.clone().find(|c| !matches!(c, 'i' | 'm' | 's' | 'U' | '-')) {
                        return Err(go_refuses(&format!("the flag {flag:?} (only i, m, s and U)")));
                    }
                }
            }
            '{' if !in_class => {
                let body: String = chars[i + 1..].iter().take_while(|c| **c != '}').collect();
                let counts: Vec<&str> = body.split(',').collect();
                let is_repeat = counts.len() <= 2
                    && !counts[0].is_empty()
                    && counts.iter().all(|c| c.chars().all(|d| d.is_ascii_digit()));
                if is_repeat
                    && counts.iter().any(|c| c.parse::<u64>().map_or(!c.is_empty(), |n| n > u64::from(MAX_GO_REPEAT)))
                {
                    return Err(go_refuses(&format!("repeat counts above {MAX_GO_REPEAT}")));
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

fn go_refuses(what: &str) -> String {
    format!("neuron-monitor's regular expressions (Go RE2 syntax) do not support {what}")
}
