//! Tag filters (`spec.runtimes[].tagFilter`, a route entry's `tagFilter`): the one place
//! that says what a filter means and what it may cost.
//!
//! neuron-monitor compiles the filters with Go's regexp (RE2 syntax), whose Perl classes
//! are ASCII: `\w` is `[0-9A-Za-z_]`, `\d` `[0-9]`, `\s` `[\t\n\f\r ]`, `\b` an ASCII word
//! boundary. The regex crate makes them Unicode, ~140 000 code points for `\w`, and one
//! `[\w]{200}` took ~13 MB to compile. [`TagFilter::new`] rewrites the Perl classes to
//! Go's ASCII ones (inside and outside brackets, negated too) and leaves everything else
//! as it is (`.` any character, `\pL` Unicode classes, `(?i)` Unicode case folding, as in
//! Go), then compiles under [`MAX_TAG_FILTER_NFA_BYTES`] and refuses a filter whose
//! [`TagFilter::cost`] exceeds [`MAX_TAG_FILTER_COST`].

use regex_automata::{
    meta::{self, Regex},
    Input,
};
use regex_syntax::ast::{
    self, parse::Parser, print::Printer, Ast, ClassBracketed, ClassPerl, ClassPerlKind, ClassSet, ClassSetItem,
    ClassSetRange, ClassSetUnion, Flag, Flags, FlagsItem, FlagsItemKind, Group, GroupKind, HexLiteralKind, Literal,
    LiteralKind,
};

use crate::limits::{MAX_TAG_FILTER_BYTES, MAX_TAG_FILTER_COST, MAX_TAG_FILTER_NFA_BYTES};

/// Go's regexp (neuron-monitor) refuses larger repeat counts.
const MAX_GO_REPEAT: u32 = 1000;
/// neuron-monitor's application tags are at most 255 characters.
const MAX_TAG_BYTES: usize = 255;

/// A tag filter compiled with neuron-monitor's meaning, within the cost limits.
#[derive(Clone)]
pub struct TagFilter {
    regex: Regex,
    cost: usize,
}

impl std::fmt::Debug for TagFilter {
    // The compiled program is thousands of lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagFilter").field("cost", &self.cost).finish_non_exhaustive()
    }
}

impl TagFilter {
    /// Compiles `filter`, or says in one line why it is refused.
    pub fn new(filter: &str) -> Result<TagFilter, TagFilterError> {
        let invalid = |message: String| TagFilterError { message, too_costly: false };
        if filter.is_empty() || filter.len() > MAX_TAG_FILTER_BYTES {
            return Err(invalid(format!("must be 1 to {MAX_TAG_FILTER_BYTES} bytes long")));
        }
        check_go_syntax(filter).map_err(invalid)?;
        let pattern = go_meaning(filter).map_err(invalid)?;
        let regex = Regex::builder().configure(config()).build(&pattern).map_err(|e| match e.size_limit() {
            Some(_) => too_costly(&format!("exceeds the {} KiB program limit", MAX_TAG_FILTER_NFA_BYTES / 1024)),
            None => invalid(one_line(&e.to_string())),
        })?;
        let cost = cost_of(&regex);
        if cost > MAX_TAG_FILTER_COST {
            return Err(too_costly(&format!("would take {} KiB", cost.div_ceil(1024))));
        }
        Ok(TagFilter { regex, cost })
    }

    /// Whether the filter matches anywhere in `tag`, as neuron-monitor matches it.
    pub fn is_match(&self, tag: &str) -> bool {
        self.regex.is_match(tag)
    }

    /// Bytes the compiled filter holds: its program and one search cache. What the
    /// budgets of a namespace and of a node add up.
    pub fn cost(&self) -> usize {
        self.cost
    }
}

/// What a compiled filter holds: its program, and one search cache as the longest tags
/// grow it (the search engines allocate it lazily, as large again as the program). Each
/// thread that searches concurrently holds a cache of its own; the agent's sinks search
/// from a few.
fn cost_of(regex: &Regex) -> usize {
    let mut cache = regex.create_cache();
    for longest in ["a".repeat(MAX_TAG_BYTES), "é".repeat(MAX_TAG_BYTES / 2)] {
        regex.search_with(&mut cache, &Input::new(&longest));
    }
    regex.memory_usage().saturating_add(cache.memory_usage())
}

/// The engines and their limits. The lazy DFA is off: it would need a reverse NFA (as
/// large again) and a cache that grows to its capacity per thread; tags are at most
/// 255 bytes, which the bounded backtracker and the PikeVM search in microseconds.
fn config() -> meta::Config {
    meta::Config::new()
        .nfa_size_limit(Some(MAX_TAG_FILTER_NFA_BYTES))
        .onepass_size_limit(Some(MAX_TAG_FILTER_NFA_BYTES))
        .hybrid(false)
        .dfa(false)
        .which_captures(regex_automata::nfa::thompson::WhichCaptures::Implicit)
}

/// Why a filter is refused: invalid, or over the cost limits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TagFilterError {
    message: String,
    too_costly: bool,
}

impl TagFilterError {
    /// Whether the filter is valid but would cost more than [`MAX_TAG_FILTER_COST`].
    pub fn too_costly(&self) -> bool {
        self.too_costly
    }
}

fn too_costly(what: &str) -> TagFilterError {
    let message = format!(
        "is too costly to compile: it {what}, at most {} KiB per filter; \
         use fewer or smaller repetitions of large classes",
        MAX_TAG_FILTER_COST / 1024
    );
    TagFilterError { message, too_costly: true }
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

/// `filter` rewritten so that the regex crate gives it Go's meaning (without the cost
/// limits: for the simulator, which stands in for neuron-monitor and compiles the merged
/// filter as neuron-monitor does).
pub fn go_meaning(filter: &str) -> Result<String, String> {
    let mut ast = Parser::new().parse(filter).map_err(|e| one_line(&e.to_string()))?;
    asciify(&mut ast)?;
    let mut out = String::with_capacity(filter.len() * 2);
    Printer::new().print(&ast, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Rewrites Perl classes and word boundaries to Go's ASCII ones. Recursion is bounded
/// by the parser's nesting limit.
fn asciify(ast: &mut Ast) -> Result<(), String> {
    match ast {
        Ast::ClassPerl(perl) => *ast = Ast::class_bracketed(ascii_class(perl)),
        Ast::ClassBracketed(class) => asciify_set(&mut class.kind)?,
        Ast::Assertion(a)
            if matches!(a.kind, ast::AssertionKind::WordBoundary | ast::AssertionKind::NotWordBoundary) =>
        {
            *ast = ascii_mode(ast.clone())
        }
        Ast::Repetition(r) => asciify(&mut r.ast)?,
        Ast::Group(g) => asciify(&mut g.ast)?,
        Ast::Alternation(a) => a.asts.iter_mut().try_for_each(asciify)?,
        Ast::Concat(c) => c.asts.iter_mut().try_for_each(asciify)?,
        _ => {}
    }
    Ok(())
}

fn asciify_set(set: &mut ClassSet) -> Result<(), String> {
    match set {
        // Go reads `[a&&b]`, `--` and `~~` as literal characters; the regex crate as set
        // operations: the same text would select other tags.
        ClassSet::BinaryOp(_) => Err(
            "uses a class set operation (&&, -- or ~~), which neuron-monitor's Go regexp reads as literal characters"
                .to_owned(),
        ),
        ClassSet::Item(item) => asciify_item(item),
    }
}

fn asciify_item(item: &mut ClassSetItem) -> Result<(), String> {
    match item {
        ClassSetItem::Perl(perl) => *item = ClassSetItem::Bracketed(Box::new(ascii_class(perl))),
        ClassSetItem::Bracketed(class) => asciify_set(&mut class.kind)?,
        ClassSetItem::Union(union) => union.items.iter_mut().try_for_each(asciify_item)?,
        _ => {}
    }
    Ok(())
}

/// Go's ASCII class for a Perl class, as a bracketed class (nested inside brackets).
fn ascii_class(perl: &ClassPerl) -> ClassBracketed {
    let span = perl.span;
    let char_lit = |c: char| Literal { span, kind: LiteralKind::HexFixed(HexLiteralKind::X), c };
    let range = |a: char, b: char| ClassSetItem::Range(ClassSetRange { span, start: char_lit(a), end: char_lit(b) });
    let items = match perl.kind {
        ClassPerlKind::Digit => vec![range('0', '9')],
        ClassPerlKind::Word => vec![range('0', '9'), range('A', 'Z'), range('a', 'z'), range('_', '_')],
        // Go's `\s` has no vertical tab, unlike `[[:space:]]`.
        ClassPerlKind::Space => ['\t', '\n', '\x0C', '\r', ' '].map(|c| ClassSetItem::Literal(char_lit(c))).to_vec(),
    };
    ClassBracketed {
        span,
        negated: perl.negated,
        kind: ClassSet::Item(ClassSetItem::Union(ClassSetUnion { span, items })),
    }
}

/// `(?-u:ast)`: a word boundary of ASCII word characters, as Go's `\b`.
fn ascii_mode(inner: Ast) -> Ast {
    let span = *inner.span();
    let items = vec![
        FlagsItem { span, kind: FlagsItemKind::Negation },
        FlagsItem { span, kind: FlagsItemKind::Flag(Flag::Unicode) },
    ];
    Ast::group(Group { span, kind: GroupKind::NonCapturing(Flags { span, items }), ast: Box::new(inner) })
}

/// The regex crate accepts a little more than Go's RE2 syntax, which neuron-monitor
/// compiles the merged filter with: a filter Go refuses would stop neuron-monitor on
/// every node the config matches, for every config there. Refuses what compiles here
/// but not in Go: flags other than `i`, `m`, `s`, `U` (notably `x`, whose `#` comments
/// would also swallow the `)` of the merged filter), `\<`, `\>`, `\b{…}`, and repeat
/// counts above 1000.
pub fn check_go_syntax(filter: &str) -> Result<(), String> {
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

#[cfg(test)]
mod tests;
