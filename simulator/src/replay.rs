//! Replay mode: recorded reports (pretty-printed JSON like the fixtures, or NDJSON),
//! written back compact, one line each.
//!
//! Documents are validated as JSON but written from their own text with the whitespace
//! removed, so that key order and number spelling stay as recorded (re-serialising a
//! `serde_json::Value` would sort the keys).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::value::RawValue;

/// Every document of every file, in order, as compact single lines.
pub fn load(paths: &[PathBuf]) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for path in paths {
        lines.extend(load_file(path)?);
    }
    Ok(lines)
}

fn load_file(path: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(path).with_context(|| format!("cannot read replay file {}", path.display()))?;
    let mut lines = Vec::new();
    // A file holds one or more JSON documents, separated by whitespace.
    for (i, value) in serde_json::Deserializer::from_str(&text).into_iter::<&RawValue>().enumerate() {
        let value =
            value.with_context(|| format!("replay file {}: document {} is not valid JSON", path.display(), i + 1))?;
        if !value.get().starts_with('{') {
            bail!("replay file {}: document {} is not a JSON object", path.display(), i + 1);
        }
        lines.push(compact(value.get()));
    }
    if lines.is_empty() {
        bail!("replay file {} holds no document", path.display());
    }
    Ok(lines)
}

/// Removes the whitespace outside strings of valid JSON text.
fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if !c.is_ascii_whitespace() {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A scratch directory removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("neuron-monitor-sim-{name}-{}", std::process::id()));
            fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn file(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn pretty_documents_come_back_compact_and_in_order() {
        let dir = Scratch::new("replay-ok");
        let pretty = dir.file("a.json", "{\n  \"neuron_runtime_data\": [],\n  \"n\": 1\n}\n");
        let ndjson = dir.file("b.json", "{\"n\": 2}\n{\"n\": 3}\n");
        let lines = load(&[pretty, ndjson]).unwrap();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| !l.contains('\n')));
        let ns: Vec<i64> =
            lines.iter().map(|l| serde_json::from_str::<Value>(l).unwrap()["n"].as_i64().unwrap()).collect();
        assert_eq!(ns, vec![1, 2, 3]);
        assert!(api::report::Report::parse(&lines[0]).is_ok());
    }

    #[test]
    fn compacting_keeps_key_order_numbers_and_strings() {
        let text = "{\n  \"z\": 1.50e-05,\n  \"a\": \"x \\\" y\\\\\",\n  \"m\": [ 1, {} ]\n}";
        let compacted = compact(text);
        assert_eq!(compacted, r#"{"z":1.50e-05,"a":"x \" y\\","m":[1,{}]}"#);
        assert_eq!(serde_json::from_str::<Value>(&compacted).unwrap(), serde_json::from_str::<Value>(text).unwrap());
    }

    #[test]
    fn bad_files_are_errors_naming_the_file() {
        let dir = Scratch::new("replay-bad");
        let cases = [
            dir.file("broken.json", "{\"neuron_runtime_data\": ["),
            dir.file("empty.json", "  \n"),
            dir.file("array.json", "[1, 2]"),
            dir.0.join("missing.json"),
        ];
        for path in cases {
            let err = format!("{:#}", load(std::slice::from_ref(&path)).unwrap_err());
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
    }
}
