//! How deeply a YAML text nests, found by a cheap scan before any parser sees it: the
//! YAML parser's cost grows with the square of the nesting (a 400 KB file of nested
//! lists cost minutes of CPU before the deserializer's own recursion limit refused it),
//! so a text nesting deeper than [`MAX_YAML_NESTING`] is refused without being parsed.
//!
//! The scan counts block nesting (an indentation stack, and each compact `- ` / `? `
//! indicator that opens a node on the same line) plus open flow collections (`[`, `{` where
//! a node may start), skipping quoted scalars, comments and block scalars' content. It is
//! an upper bound in practice, linear in the text, and exact for the nesting that costs.

use crate::limits::MAX_YAML_NESTING;

/// Where a text first nests deeper than [`MAX_YAML_NESTING`].
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: nested deeper than {MAX_YAML_NESTING} levels (refused before parsing; a config needs about 10)")]
pub struct TooDeep {
    /// 1-based.
    pub line: usize,
}

/// Refuses a text that nests deeper than [`MAX_YAML_NESTING`].
pub fn check_nesting(text: &[u8]) -> Result<(), TooDeep> {
    let mut scan = Scan::default();
    for (index, line) in text.split(|b| *b == b'\n').enumerate() {
        if scan.line(line) > MAX_YAML_NESTING {
            return Err(TooDeep { line: index + 1 });
        }
    }
    Ok(())
}

#[derive(Default)]
struct Scan {
    /// Columns of the open block nodes.
    blocks: Vec<usize>,
    /// Open flow collections.
    flow: usize,
    /// Inside a quoted scalar that goes on over lines: its quote.
    quote: Option<u8>,
    /// Inside a block scalar (`|`, `>`): the indentation of the line that opened it.
    block_scalar: Option<usize>,
}

impl Scan {
    /// Takes one line; the deepest nesting on it.
    fn line(&mut self, line: &[u8]) -> usize {
        let indent = line.iter().take_while(|b| **b == b' ').count();
        let rest = &line[indent..];
        let blank = rest.iter().all(|b| b.is_ascii_whitespace()) || rest.first() == Some(&b'#');
        if let Some(opened_at) = self.block_scalar {
            if blank || indent > opened_at {
                return 0;
            }
            self.block_scalar = None;
        }
        if self.quote.is_none() && self.flow == 0 {
            if blank {
                return 0;
            }
            if indent == 0 && (rest.starts_with(b"---") || rest.starts_with(b"...")) {
                self.blocks.clear();
            }
            while self.blocks.last().is_some_and(|col| *col >= indent) {
                self.blocks.pop();
            }
            self.blocks.push(indent);
        }
        self.content(line, indent)
    }

    /// Scans a line's content from `at`: compact indicators, flow collections, quotes.
    fn content(&mut self, line: &[u8], mut at: usize) -> usize {
        let mut deepest = self.depth();
        // Where a node may start: at the start of a line's content, after `- `, `? `, `: `,
        // `[`, `{` and `,`.
        let mut node_start = true;
        while at < line.len() {
            let b = line[at];
            if let Some(q) = self.quote {
                at = self.in_quote(line, at, q);
                node_start = false;
                continue;
            }
            let next_is_space = line.get(at + 1).is_none_or(|n| n.is_ascii_whitespace());
            match b {
                b' ' | b'\t' | b'\r' => {}
                b'#' if at == 0 || line[at - 1].is_ascii_whitespace() => break,
                b'\'' | b'"' if node_start => self.quote = Some(b),
                b'-' | b'?' if node_start && next_is_space && self.flow == 0 => {
                    self.blocks.push(at + 2);
                    deepest = deepest.max(self.depth());
                }
                b'[' | b'{' if node_start => {
                    self.flow += 1;
                    deepest = deepest.max(self.depth());
                }
                b']' | b'}' if self.flow > 0 => self.flow -= 1,
                b',' | b':' if self.flow > 0 || next_is_space => {}
                b'|' | b'>' if node_start && self.flow == 0 => {
                    self.block_scalar = Some(self.blocks.last().copied().unwrap_or(0));
                    break;
                }
                // A tag or an anchor before a node: the node may still start after it.
                b'!' | b'&' if node_start => {
                    while at < line.len() && !line[at].is_ascii_whitespace() {
                        at += 1;
                    }
                    continue;
                }
                _ => {
                    node_start = false;
                    at += 1;
                    continue;
                }
            }
            node_start = match b {
                b' ' | b'\t' | b'\r' => node_start,
                b']' | b'}' => false,
                _ => true,
            };
            at += 1;
        }
        deepest
    }

    /// One byte of a quoted scalar at `at`; where to go on.
    fn in_quote(&mut self, line: &[u8], at: usize, quote: u8) -> usize {
        match line[at] {
            b'\\' if quote == b'"' => at + 2,
            b'\'' if quote == b'\'' && line.get(at + 1) == Some(&b'\'') => at + 2,
            b if b == quote => {
                self.quote = None;
                at + 1
            }
            _ => at + 1,
        }
    }

    fn depth(&self) -> usize {
        self.blocks.len() + self.flow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        let mut scan = Scan::default();
        text.split('\n').map(|l| scan.line(l.as_bytes())).max().unwrap_or(0)
    }

    #[test]
    fn block_and_flow_nesting_are_counted() {
        assert_eq!(depth("a: 1\nb: 2\n"), 1);
        assert_eq!(depth("spec:\n  runtimes:\n  - tagFilter: x\n    metrics: [{type: a}]\n"), 5);
        assert_eq!(depth("- - - x\n"), 4);
        assert_eq!(depth("a: [[[1]]]\n"), 4);
        assert_eq!(depth("a: {b: [c, {d: e}]}\n"), 4);
        assert_eq!(depth("a: !t [!t [x]]\n"), 3, "a tag before a flow collection");
    }

    #[test]
    fn brackets_that_open_nothing_are_not_counted() {
        assert_eq!(depth("a: '[[[[[['\nb: \"{{{{\\\"[[[\"\n"), 1, "quoted");
        assert_eq!(depth("a: x[[[[[[ # [[[[[\n"), 1, "inside a plain scalar, in a comment");
        assert_eq!(depth("a: |\n  [[[[[[[\n  - - - - - -\nb: 1\n"), 1, "a block scalar's content");
        assert_eq!(depth("a: 'it''s [[['\n"), 1);
        assert_eq!(depth("a: 'over\n  [[[[ lines'\n"), 1);
    }

    #[test]
    fn deep_texts_are_refused_with_their_line() {
        let flow = format!("a:\n  b: {}x{}\n", "[".repeat(MAX_YAML_NESTING), "]".repeat(MAX_YAML_NESTING));
        assert_eq!(check_nesting(flow.as_bytes()), Err(TooDeep { line: 2 }));
        let block = format!("x: 1\n{}y\n", "- ".repeat(MAX_YAML_NESTING));
        assert_eq!(check_nesting(block.as_bytes()), Err(TooDeep { line: 2 }));
        let indented: String = (0..=MAX_YAML_NESTING).map(|i| format!("{}k{i}:\n", " ".repeat(i))).collect();
        assert!(check_nesting(indented.as_bytes()).is_err());
        let shallow: String = (0..MAX_YAML_NESTING - 1).map(|i| format!("{}k{i}:\n", " ".repeat(i))).collect();
        assert_eq!(check_nesting(shallow.as_bytes()), Ok(()));
        // Closed collections are not nesting: many in a row are fine.
        let wide = format!("a: [1] [2]\nb: [{}]\n", "[x], ".repeat(10_000));
        assert_eq!(check_nesting(wide.as_bytes()), Ok(()));
    }
}
