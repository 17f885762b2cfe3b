//! Line framing of neuron-monitor's output with a size bound: a line longer than the
//! bound is skipped without being buffered, so a runaway child cannot exhaust memory.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::pipeline::RETAINED_CAPACITY;

/// One unit of output.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A complete line, without its `\n`.
    Line(&'a [u8]),
    /// A line longer than the bound; its length in bytes.
    Oversized(usize),
    /// Bytes cut off by the end of the stream (the child died mid-line).
    Unterminated(usize),
}

pub struct LineReader<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
    max_line_bytes: usize,
    /// Length of the oversized line being skipped, if any.
    skipping: Option<usize>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(reader: R, max_line_bytes: usize) -> Self {
        LineReader {
            reader: BufReader::with_capacity(64 * 1024, reader),
            line: Vec::new(),
            max_line_bytes,
            skipping: None,
        }
    }

    /// The next frame, or `None` at the end of the stream. Cancel-safe: dropping the
    /// future loses no data, so it can sit in a `select!`.
    pub async fn next(&mut self) -> std::io::Result<Option<Frame<'_>>> {
        if self.line.capacity() > RETAINED_CAPACITY {
            self.line = Vec::new();
        }
        self.line.clear();
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                let cut = self.skipping.take().unwrap_or(0) + self.line.len();
                return Ok((cut > 0).then_some(Frame::Unterminated(cut)));
            }
            let newline = memchr::memchr(b'\n', available);
            let chunk = &available[..newline.unwrap_or(available.len())];
            let consumed = chunk.len() + usize::from(newline.is_some());
            match &mut self.skipping {
                Some(skipped) => *skipped += chunk.len(),
                None if self.line.len() + chunk.len() > self.max_line_bytes => {
                    self.skipping = Some(self.line.len() + chunk.len());
                    self.line.clear();
                }
                None => self.line.extend_from_slice(chunk),
            }
            self.reader.consume(consumed);
            if newline.is_some() {
                return Ok(Some(match self.skipping.take() {
                    Some(len) => Frame::Oversized(len),
                    None => Frame::Line(&self.line),
                }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frames(input: &[u8], max: usize) -> Vec<String> {
        let mut reader = LineReader::new(input, max);
        let mut out = Vec::new();
        while let Some(frame) = reader.next().await.unwrap() {
            out.push(match frame {
                Frame::Line(l) => format!("line:{}", String::from_utf8_lossy(l)),
                Frame::Oversized(n) => format!("oversized:{n}"),
                Frame::Unterminated(n) => format!("unterminated:{n}"),
            });
        }
        out
    }

    #[tokio::test]
    async fn splits_lines_and_bounds_them() {
        let got = frames(b"ab\n\nccccccccc\nd\nxyz", 4).await;
        assert_eq!(got, ["line:ab", "line:", "oversized:9", "line:d", "unterminated:3"]);
    }

    #[tokio::test]
    async fn long_lines_across_many_reads() {
        // Larger than BufReader's 64 KiB buffer, so each line spans several reads.
        let big = "x".repeat(200_000);
        let input = format!("{big}\n{big}{big}\nok\n");
        let got = frames(input.as_bytes(), 300_000).await;
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].len(), "line:".len() + 200_000);
        assert_eq!(got[1], "oversized:400000");
        assert_eq!(got[2], "line:ok");
    }
}
