//! The families' text on `/metrics`, written straight into the page in the scraper's
//! format: the bytes prometheus-client's encoder wrote (checked in the tests), at a
//! fraction of the cost. No encoder object per series and label, no second pass to turn
//! OpenMetrics into the classic format, and the host's six labels, which every series
//! carries, escaped once per page instead of once per series (they are over half of a
//! page's bytes).

use std::fmt;

use prometheus_client::metrics::MetricType;

use super::Format;
use crate::{
    series::{classic_suffix, Family, FamilyEncoder, Labels, Value},
    state::InstanceLabels,
};

pub struct TextEncoder<'p> {
    page: &'p mut String,
    format: Format,
    /// The instance labels of the latest series, and their text.
    instance: Option<(InstanceLabels, String)>,
    /// The address of the instance labels found equal to `instance` within the family
    /// being written (0: none yet). A family borrows its labels for the whole of
    /// [`FamilyEncoder::encode_family`], so none is freed meanwhile and the same address
    /// is the same labels: their seven strings are compared once a family, not once a
    /// series (that compare was half the render).
    same_as_cached: usize,
}

impl<'p> TextEncoder<'p> {
    pub fn new(page: &'p mut String, format: Format) -> Self {
        TextEncoder { page, format, instance: None, same_as_cached: 0 }
    }

    /// `# HELP` and `# TYPE`: in the classic format under the samples' name (with its
    /// `_total` or `_info`), an info family typed as a gauge.
    fn write_descriptor(&mut self, family: &Family<'_>) {
        let suffix = match self.format {
            Format::OpenMetrics => "",
            Format::Classic => classic_suffix(family.kind()),
        };
        let kind = type_name(family.kind(), self.format);
        for (line, text) in [("# HELP ", family.help()), ("# TYPE ", kind)] {
            self.page.push_str(line);
            self.page.push_str(family.name());
            self.page.push_str(suffix);
            self.page.push(' ');
            self.page.push_str(text);
            self.page.push('\n');
        }
    }

    fn write_labels(&mut self, labels: &Labels<'_>) {
        let instance = labels.instance();
        let address = std::ptr::from_ref(instance) as usize;
        let cached = match &self.instance {
            Some((_, text)) if self.same_as_cached == address => text,
            Some((labels, text)) if labels == instance => {
                self.same_as_cached = address;
                text
            }
            _ => {
                self.same_as_cached = address;
                let mut text = String::with_capacity(256);
                let _ = Labels::node(instance).try_for_each(|key, value| {
                    let comma = !text.is_empty();
                    write_label(&mut text, comma, key, value);
                    Ok::<(), fmt::Error>(())
                });
                &self.instance.insert((instance.clone(), text)).1
            }
        };
        self.page.push_str(cached);
        let page = &mut *self.page;
        let _ = labels.try_for_each_after_instance(|key, value| {
            write_label(page, true, key, value);
            Ok::<(), fmt::Error>(())
        });
    }
}

impl FamilyEncoder for TextEncoder<'_> {
    fn encode_family(&mut self, family: &Family<'_>) -> Result<(), fmt::Error> {
        self.same_as_cached = 0;
        self.write_descriptor(family);
        let suffix = classic_suffix(family.kind());
        for (labels, value) in family.series() {
            self.page.push_str(family.name());
            self.page.push_str(suffix);
            self.page.push('{');
            self.write_labels(labels);
            self.page.push_str("} ");
            match family.kind() {
                MetricType::Info => self.page.push('1'),
                _ => self.page.push_str(dtoa::Buffer::new().format(*value)),
            }
            self.page.push('\n');
        }
        Ok(())
    }
}

/// A family's type as each format names it: the classic one has no `info` (a gauge of 1)
/// and says `untyped` for `unknown`.
fn type_name(kind: MetricType, format: Format) -> &'static str {
    match (kind, format) {
        (MetricType::Counter, _) => "counter",
        (MetricType::Gauge, _) => "gauge",
        (MetricType::Histogram, _) => "histogram",
        (MetricType::Info, Format::OpenMetrics) => "info",
        (MetricType::Info, Format::Classic) => "gauge",
        (MetricType::Unknown, Format::OpenMetrics) => "unknown",
        (MetricType::Unknown, Format::Classic) => "untyped",
    }
}

/// `key="value"`, after a comma unless it is the series' first label.
fn write_label(out: &mut String, comma: bool, key: &str, value: Value<'_>) {
    if comma {
        out.push(',');
    }
    out.push_str(key);
    out.push_str("=\"");
    match value {
        Value::Text(text) => push_escaped(out, text),
        Value::Number(n) => out.push_str(itoa::Buffer::new().format(n)),
    }
    out.push('"');
}

/// A label value with `\`, `"` and newlines escaped, as both formats require.
fn push_escaped(out: &mut String, text: &str) {
    if !text.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}
