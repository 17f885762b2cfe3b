//! The allow-list comparison of OTLP endpoints. Entries and candidates are parsed by the
//! OTLP sink's own parser ([`Endpoint`]), so the policy compares what the sink sends to:
//! scheme, host (lower case), port (the scheme's default filled in) and path (a
//! candidate without one sends to OTLP/HTTP's metrics path; an entry without one admits
//! every path). The parser refuses what an allow-list could not compare (user
//! information, queries, fragments, percent-escapes, IP literals in brackets, a trailing
//! dot, `a..b` hosts, empty, `.` and `..` segments), so that a crafted URL cannot match
//! an entry it does not point at.

pub use crate::otlp::Endpoint;

/// An allow-list entry: a URL without a path admits every path (`/`).
pub fn parse_entry(url: &str) -> Result<Endpoint, String> {
    Endpoint::parse_with_default_path(url, "/")
}

/// Whether allow-list `entry` admits `candidate`: the same scheme, host and port, and the
/// same path, or any path under the entry's when it ends with `/` (so that `/team-a/`
/// admits `/team-a/v1/metrics` but not `/team-ab/…`).
pub fn admits(entry: &Endpoint, candidate: &Endpoint) -> bool {
    entry.https == candidate.https
        && entry.host == candidate.host
        && entry.port_or_default() == candidate.port_or_default()
        && if entry.path.ends_with('/') {
            candidate.path.starts_with(&entry.path)
        } else {
            candidate.path == entry.path
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_OTLP_ENDPOINT_BYTES;

    fn parse(url: &str) -> Endpoint {
        Endpoint::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn admits_url(entry: &str, url: &str) -> bool {
        admits(&parse_entry(entry).unwrap_or_else(|e| panic!("{entry}: {e}")), &parse(url))
    }

    #[test]
    fn urls_are_normalised() {
        let e = parse("HTTP://Collector.Observability:4318/v1/metrics");
        assert_eq!(
            (e.https, e.host.as_str(), e.port_or_default(), e.path.as_str()),
            (false, "collector.observability", 4318, "/v1/metrics")
        );
        let entry = parse_entry("https://otel.example").unwrap();
        assert_eq!((entry.port_or_default(), entry.path.as_str()), (443, "/"));
        assert_eq!(parse("http://otel.example/").port_or_default(), 80);
        assert_eq!(parse("http://otel.example:04318/").port_or_default(), 4318);
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
            "http://allowed.example:+80/",
            "http://allowed.example:/",
            "http://allowed.example/v1 metrics",
        ] {
            assert!(parse_entry(url).is_err() && Endpoint::parse(url).is_err(), "{url} was taken");
        }
        assert!(parse_entry(&format!("http://a.example/{}", "p".repeat(MAX_OTLP_ENDPOINT_BYTES))).is_err());
    }

    /// Where the policy's parser and the sink's disagreed before they were one: the sink
    /// took `..` segments and `a..b` hosts the policy refused, and the policy took a
    /// trailing dot (and compared `host.` as `host`) the sink refused. Now both refuse all
    /// three, and a candidate without a path is compared at the path the sink sends to.
    #[test]
    fn the_sink_and_the_policy_take_the_same_urls() {
        for url in [
            "http://otel-collector.observability.:4318/v1/metrics",
            "http://otel-collector.observability:4318/v1/../admin",
            "http://otel..collector.observability:4318/v1/metrics",
            "http://otel-collector.observability:4318/v1/./metrics",
            "http://otel-collector.observability:4318//v1/metrics",
            &format!("http://{}.example/v1/metrics", "l".repeat(64)),
        ] {
            assert!(Endpoint::parse(url).is_err(), "the sink took {url}");
            assert!(parse_entry(url).is_err(), "the policy took {url}");
        }
        let entry = "http://otel-collector.observability:4318/v1/metrics";
        assert!(admits_url(entry, "http://otel-collector.observability:4318"), "the sink's default path");
        assert!(!admits_url(
            "http://otel-collector.observability:4318/other",
            "http://otel-collector.observability:4318"
        ));
    }

    #[test]
    fn an_entry_admits_its_own_endpoint_however_it_is_spelt() {
        let entry = "http://otel-collector.observability:4318/v1/metrics";
        assert!(admits_url(entry, "http://otel-collector.observability:4318/v1/metrics"));
        assert!(admits_url(entry, "HTTP://OTEL-Collector.Observability:4318/v1/metrics"), "case of scheme and host");
        assert!(admits_url("https://otel.example/v1/metrics", "https://otel.example:443/v1/metrics"), "default port");
        assert!(admits_url("https://otel.example:443/v1/metrics", "https://otel.example/v1/metrics"), "default port");
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
            assert!(!admits_url(entry, other), "{other}");
        }
        // A path ending with / admits what is under it, at a segment boundary only.
        let prefix = "https://gateway.example/team-a/";
        assert!(admits_url(prefix, "https://gateway.example/team-a/v1/metrics"));
        assert!(admits_url(prefix, "https://gateway.example/team-a/"));
        assert!(!admits_url(prefix, "https://gateway.example/team-ab/v1/metrics"));
        assert!(!admits_url(prefix, "https://gateway.example/team-a"));
        assert!(!admits_url(prefix, "https://gateway.example/other/team-a/v1/metrics"));
    }
}
