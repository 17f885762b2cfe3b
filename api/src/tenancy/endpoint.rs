//! OTLP endpoint URLs, parsed into the parts an allow-list compares: scheme, host, port
//! and path, each normalised (scheme and host in lower case, the host without its
//! trailing dot, the scheme's default port filled in, `/` for no path). Only the URLs
//! the CRD's pattern admits parse (`http` or `https`, a DNS name, a port, a path of
//! unreserved characters), and the operator never trusts the schema: user information
//! (`allowed.example@evil.example`), queries, fragments, percent-escapes, IP literals in
//! brackets, `.` and `..` segments and empty segments are refused here again, so that a
//! crafted URL cannot match an entry it does not point at.

use std::fmt;

/// Longest URL taken (the CRD's bound on `spec.sinks.otlp.endpoint`).
pub const MAX_URL_BYTES: usize = 512;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// Lower case, without a trailing dot.
    pub host: String,
    pub port: u16,
    /// Starts with `/`.
    pub path: String,
}

impl Endpoint {
    /// Parses an OTLP/HTTP URL; the error says what is wrong with it.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        if url.len() > MAX_URL_BYTES {
            return Err(format!("is longer than {MAX_URL_BYTES} bytes"));
        }
        if let Some(c) = url.chars().find(|c| matches!(c, '@' | '?' | '#' | '%' | '\\' | '[' | ']')) {
            let what = match c {
                '@' => "user information",
                '?' => "a query",
                '#' => "a fragment",
                '%' => "a percent-escape",
                '\\' => "a backslash",
                _ => "an IP literal",
            };
            return Err(format!("{url:?} has {what}: only scheme://host[:port][/path] is taken"));
        }
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
        let (scheme, default_port) = match scheme.to_ascii_lowercase().as_str() {
            "http" => ("http", 80),
            "https" => ("https", 443),
            _ => return Err(format!("{url:?}: the scheme must be http or https")),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, parse_port(port).map_err(|e| format!("{url:?}: {e}"))?),
            None => (authority, default_port),
        };
        let host = normalise_host(host).map_err(|e| format!("{url:?}: {e}"))?;
        check_path(path).map_err(|e| format!("{url:?}: {e}"))?;
        Ok(Endpoint { scheme, host, port, path: path.to_owned() })
    }

    /// Whether this allow-list entry admits `candidate`: the same scheme, host and port,
    /// and the same path, or any path under this one when it ends with `/` (so that
    /// `/team-a/` admits `/team-a/v1/metrics` but not `/team-ab/…`).
    pub fn admits(&self, candidate: &Endpoint) -> bool {
        self.scheme == candidate.scheme
            && self.host == candidate.host
            && self.port == candidate.port
            && if self.path.ends_with('/') {
                candidate.path.starts_with(&self.path)
            } else {
                candidate.path == self.path
            }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}{}", self.scheme, self.host, self.port, self.path)
    }
}

fn parse_port(port: &str) -> Result<u16, String> {
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {port:?} is not a number from 1 to 65535"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// A DNS name (letters, digits, `-`, dots between non-empty labels of at most 63
/// characters, no label starting or ending with `-`), lower-cased, its trailing dot off.
fn normalise_host(host: &str) -> Result<String, String> {
    let bare = host.strip_suffix('.').unwrap_or(host);
    if bare.is_empty() || bare.len() > 253 {
        return Err(format!("host {host:?} is not a DNS name"));
    }
    for label in bare.split('.') {
        let valid = (1..=63).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !valid {
            return Err(format!("host {host:?} is not a DNS name"));
        }
    }
    Ok(bare.to_ascii_lowercase())
}

/// `/`, then segments of unreserved characters; no empty, `.` or `..` segment (a
/// trailing `/` is allowed).
fn check_path(path: &str) -> Result<(), String> {
    if !path.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~/-".contains(&b)) {
        return Err(format!("path {path:?} has characters other than letters, digits and . _ ~ / -"));
    }
    let inner = path.strip_prefix('/').unwrap_or(path);
    let inner = inner.strip_suffix('/').unwrap_or(inner);
    if inner.is_empty() {
        return Ok(());
    }
    if inner.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(format!("path {path:?} has an empty, . or .. segment"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Endpoint {
        Endpoint::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn admits(entry: &str, url: &str) -> bool {
        parse(entry).admits(&parse(url))
    }

    #[test]
    fn urls_are_normalised() {
        let e = parse("HTTP://Collector.Observability.:4318/v1/metrics");
        assert_eq!(
            (e.scheme, e.host.as_str(), e.port, e.path.as_str()),
            ("http", "collector.observability", 4318, "/v1/metrics")
        );
        assert_eq!(parse("https://otel.example").to_string(), "https://otel.example:443/");
        assert_eq!(parse("http://otel.example/").port, 80);
        assert_eq!(parse("http://otel.example:04318/").port, 4318);
    }

    #[test]
    fn what_an_allow_list_cannot_compare_is_refused() {
        for url in [
            "http://allowed.example:4318@evil.example/v1/metrics",
            "http://user:pass@allowed.example/v1/metrics",
            "http://allowed.example/v1/metrics?x=1",
            "http://allowed.example/v1/metrics#f",
            "http://allowed.example/v1/%2e%2e/admin",
            "http://allowed.example/v1/../admin",
            "http://allowed.example/v1/./metrics",
            "http://allowed.example//v1/metrics",
            "http://allowed.example\\@evil.example/",
            "http://[::1]:4318/v1/metrics",
            "ftp://allowed.example/",
            "allowed.example:4318/v1/metrics",
            "http://:4318/",
            "http://allowed..example/",
            "http://-allowed.example/",
            "http://allowed.example:0/",
            "http://allowed.example:65536/",
            "http://allowed.example:43a8/",
            "http://allowed.example:/",
            "http://allowed.example/v1 metrics",
        ] {
            assert!(Endpoint::parse(url).is_err(), "{url} was taken");
        }
        assert!(Endpoint::parse(&format!("http://a.example/{}", "p".repeat(MAX_URL_BYTES))).is_err());
    }

    #[test]
    fn an_entry_admits_its_own_endpoint_however_it_is_spelt() {
        let entry = "http://otel-collector.observability:4318/v1/metrics";
        assert!(admits(entry, "http://otel-collector.observability:4318/v1/metrics"));
        assert!(admits(entry, "HTTP://OTEL-Collector.Observability:4318/v1/metrics"), "case of scheme and host");
        assert!(admits(entry, "http://otel-collector.observability.:4318/v1/metrics"), "trailing dot");
        assert!(admits("https://otel.example/v1/metrics", "https://otel.example:443/v1/metrics"), "default port");
    }

    #[test]
    fn an_entry_admits_nothing_else() {
        let entry = "http://otel-collector.observability:4318/v1/metrics";
        for other in [
            "https://otel-collector.observability:4318/v1/metrics",
            "http://otel-collector.observability:4319/v1/metrics",
            "http://otel-collector.observability/v1/metrics",
            "http://otel-collector.observability.evil.example:4318/v1/metrics",
            "http://evil-otel-collector.observability:4318/v1/metrics",
            "http://otel-collector:4318/v1/metrics",
            "http://otel-collector.observability:4318/v1/metrics/extra",
            "http://otel-collector.observability:4318/v1/metricsX",
            "http://otel-collector.observability:4318/V1/metrics",
            "http://otel-collector.observability:4318/",
        ] {
            assert!(!admits(entry, other), "{other}");
        }
        // A path ending with / admits what is under it, at a segment boundary only.
        let prefix = "https://gateway.example/team-a/";
        assert!(admits(prefix, "https://gateway.example/team-a/v1/metrics"));
        assert!(admits(prefix, "https://gateway.example/team-a/"));
        assert!(!admits(prefix, "https://gateway.example/team-ab/v1/metrics"));
        assert!(!admits(prefix, "https://gateway.example/team-a"));
        assert!(!admits(prefix, "https://gateway.example/other/team-a/v1/metrics"));
    }
}
