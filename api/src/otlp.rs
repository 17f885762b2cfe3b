//! The OTLP sink's rules, in one place for the operator and the agent (as
//! [`crate::cloudwatch::sink`] is for CloudWatch): where a sink sends (CloudWatch's OTLP
//! endpoint of a region, or an OTLP/HTTP receiver), how often, and the HTTP headers a
//! Secret may give it. The operator refuses a config that breaks a rule, naming the field;
//! the agent checks again before it starts a sink, since a node configuration may come
//! from elsewhere.
//!
//! Headers travel from the config's Secret to the agents through one Secret of the
//! operator's namespace, the *mirror*, under [`headers_key`] of the config (see
//! docs/configuration.md, "OTLP headers"): agents read that one Secret and no other.

use std::time::Duration;

use crate::{
    cloudwatch::sink::{parse_flush_interval, SinkError},
    crd::OtlpSinkSpec,
    hash::content_hash,
    limits::{MAX_OTLP_ENDPOINT_BYTES, MAX_SECRET_NAME_BYTES},
    region::{valid_region, Partition},
};

/// The path an endpoint without one gets: OTLP/HTTP's metrics path.
pub const DEFAULT_PATH: &str = "/v1/metrics";
/// The SigV4 service name of CloudWatch's OTLP endpoint.
pub const CLOUDWATCH_SIGNING_NAME: &str = "monitoring";

/// Headers one Secret may give: few (an `Authorization`, a tenant id), short.
pub const MAX_HEADERS: usize = 16;
pub const MAX_HEADER_NAME_BYTES: usize = 128;
pub const MAX_HEADER_VALUE_BYTES: usize = 4096;
/// All names and values of one Secret together.
pub const MAX_HEADERS_BYTES: usize = 8192;
/// Headers the agent sets itself or that would break the request's framing.
pub const RESERVED_HEADERS: [&str; 13] = [
    "host",
    "content-type",
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "user-agent",
];

/// Where a sink sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// CloudWatch's OTLP endpoint of this region (`None`: the node's), signed with SigV4
    /// (service `monitoring`) with the node's AWS identity.
    CloudWatch { region: Option<String> },
    /// An OTLP/HTTP receiver, with the headers of this Secret of the config's namespace.
    Endpoint { endpoint: Endpoint, headers_secret: Option<String> },
}

/// An `http` or `https` URL, parsed and normalised (scheme and host in lower case): the
/// one parser of OTLP endpoints, for the sink (where requests go) and for the tenancy
/// policy (whose allow-list compares the same parts, see `tenancy::endpoint`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    /// A DNS name (or IPv4 address), lower case.
    pub host: String,
    pub port: Option<u16>,
    /// Starts with `/`; [`DEFAULT_PATH`] when the URL has none (see
    /// [`Endpoint::parse_with_default_path`]).
    pub path: String,
}

impl Endpoint {
    /// Parses what the schema's pattern accepts, `http(s)://host[:port][/path]`, at most
    /// [`MAX_OTLP_ENDPOINT_BYTES`], and refuses again what the pattern lets through but
    /// an allow-list could not compare: a host that is not a DNS name (`a..b`, a label
    /// over 63 characters or starting or ending with `-`), a host ending with a dot (an
    /// absolute name may resolve elsewhere than the same name without it), and empty,
    /// `.` or `..` path segments. A URL without a path gets [`DEFAULT_PATH`].
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        Self::parse_with_default_path(url, DEFAULT_PATH)
    }

    /// [`Endpoint::parse`], with `default_path` for a URL without a path (an allow-list
    /// entry without one admits every path: `/`).
    pub fn parse_with_default_path(url: &str, default_path: &str) -> Result<Endpoint, String> {
        if url.len() > MAX_OTLP_ENDPOINT_BYTES {
            return Err(format!("is {} bytes long; at most {MAX_OTLP_ENDPOINT_BYTES}", url.len()));
        }
        if let Some(what) = unsupported_part(url) {
            return Err(format!("has {what}: only scheme://host[:port][/path] is taken"));
        }
        let (scheme, rest) = url.split_once("://").ok_or("must start with http:// or https://")?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "http" => false,
            "https" => true,
            _ => return Err("must start with http:// or https://".to_owned()),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, Some(parse_port(port)?)),
            None => (authority, None),
        };
        check_host(host)?;
        check_path(path)?;
        let path = if path.is_empty() { default_path.to_owned() } else { path.to_owned() };
        Ok(Endpoint { https, host: host.to_ascii_lowercase(), port, path })
    }

    /// The port requests go to: the given one, or the scheme's.
    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(if self.https { 443 } else { 80 })
    }

    /// The URL requests go to.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        match self.port {
            Some(port) => format!("{scheme}://{}:{port}{}", self.host, self.path),
            None => format!("{scheme}://{}{}", self.host, self.path),
        }
    }
}

/// What a URL may have that an endpoint may not, by its tell-tale character.
fn unsupported_part(url: &str) -> Option<&'static str> {
    url.chars().find_map(|c| match c {
        '@' => Some("user information"),
        '?' => Some("a query"),
        '#' => Some("a fragment"),
        '%' => Some("a percent-escape"),
        '\\' => Some("a backslash"),
        '[' | ']' => Some("an IP literal"),
        _ => None,
    })
}

fn parse_port(port: &str) -> Result<u16, String> {
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// A DNS name: labels of 1 to 63 letters, digits and `-`, not starting or ending with
/// `-`, separated by single dots, at most 253 characters, no trailing dot.
fn check_host(host: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(format!(
            "host {host:?} is not a DNS name or IPv4 address (labels of A-Z a-z 0-9 - between single dots)"
        ));
    }
    Ok(())
}

/// `/`, then segments of unreserved characters; no empty, `.` or `..` segment (a
/// trailing `/` is allowed).
fn check_path(path: &str) -> Result<(), String> {
    if !path.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~/-".contains(&b)) {
        return Err("the path takes only A-Z a-z 0-9 . _ ~ / - (no query, fragment or user information)".to_owned());
    }
    let inner = path.strip_prefix('/').unwrap_or(path);
    let inner = inner.strip_suffix('/').unwrap_or(inner);
    if !inner.is_empty() && inner.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(format!("path {path:?} has an empty, . or .. segment"));
    }
    Ok(())
}

/// CloudWatch's OTLP metrics endpoint of a region: `https://monitoring.<region>.amazonaws.com/v1/metrics`
/// (`amazonaws.com.cn` in the China regions).
pub fn cloudwatch_endpoint(region: &str) -> Endpoint {
    let domain = if Partition::of(region) == Partition::China { "amazonaws.com.cn" } else { "amazonaws.com" };
    Endpoint { https: true, host: format!("monitoring.{region}.{domain}"), port: None, path: DEFAULT_PATH.to_owned() }
}

/// A sink's settings, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpSettings {
    pub destination: Destination,
    pub flush_interval: Duration,
}

impl OtlpSettings {
    /// The rules of `spec.sinks.otlp`; an error names the field under it.
    pub fn check(spec: &OtlpSinkSpec) -> Result<OtlpSettings, SinkError> {
        let flush_interval = parse_flush_interval(spec.flush_interval.as_deref())?;
        let destination = match &spec.endpoint {
            Some(url) => {
                if spec.region.is_some() {
                    return Err(SinkError::new(
                        "region",
                        "region applies to CloudWatch's OTLP endpoint only: set endpoint or region, not both",
                    ));
                }
                let endpoint = Endpoint::parse(url).map_err(|e| SinkError::new("endpoint", format!("{url:?} {e}")))?;
                let headers_secret = spec.headers_secret.as_ref().map(|s| s.name.clone());
                if let Some(name) = headers_secret.as_deref().filter(|n| !valid_secret_name(n)) {
                    return Err(SinkError::new("headersSecret.name", format!("{name:?} is not a Secret name")));
                }
                Destination::Endpoint { endpoint, headers_secret }
            }
            None => {
                if spec.headers_secret.is_some() {
                    return Err(SinkError::new(
                        "headersSecret",
                        "CloudWatch's OTLP endpoint is signed with the node's AWS identity: headers apply to an \
                         endpoint only",
                    ));
                }
                if let Some(region) = spec.region.as_deref().filter(|r| !valid_region(r)) {
                    return Err(SinkError::new(
                        "region",
                        format!("{region:?} is not an AWS region name such as us-east-1"),
                    ));
                }
                Destination::CloudWatch { region: spec.region.clone() }
            }
        };
        Ok(OtlpSettings { destination, flush_interval })
    }
}

/// A DNS subdomain name, as Kubernetes names Secrets.
fn valid_secret_name(name: &str) -> bool {
    (1..=MAX_SECRET_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The key of a config's headers in the mirror Secret: `<namespace>.<name>` (namespaces
/// have no dots, so it is unambiguous), shortened with a hash beyond a Secret key's 253
/// characters.
pub fn headers_key(config: &str) -> String {
    let key = config.replacen('/', ".", 1);
    if key.len() <= 253 {
        return key;
    }
    let hash = content_hash(config.as_bytes());
    format!("{}-{hash}", &key[..253 - hash.len() - 1])
}

/// Why a Secret's data are not usable as headers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HeaderError(pub String);

/// The headers of a Secret's data (key: header name, value: header value), checked:
/// names are HTTP tokens of at most [`MAX_HEADER_NAME_BYTES`], not one of
/// [`RESERVED_HEADERS`]; values visible ASCII, spaces and tabs, at most
/// [`MAX_HEADER_VALUE_BYTES`], without surrounding white space; at most [`MAX_HEADERS`],
/// [`MAX_HEADERS_BYTES`] in all. Names keep their case; sorted by name.
pub fn check_headers<'a>(
    data: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<Vec<(String, String)>, HeaderError> {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut total = 0usize;
    for (name, value) in data {
        if headers.len() == MAX_HEADERS {
            return Err(HeaderError(format!("more than {MAX_HEADERS} headers")));
        }
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || name.len() > MAX_HEADER_NAME_BYTES || !name.bytes().all(token) {
            return Err(HeaderError(format!(
                "key {name:?} is not an HTTP header name (a token of at most {MAX_HEADER_NAME_BYTES} characters)"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(HeaderError(format!("header {name:?} is set by the agent itself")));
        }
        if headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            return Err(HeaderError(format!("header {name:?} is given twice (names ignore case)")));
        }
        let visible = |b: &u8| (0x20..0x7f).contains(b) || *b == b'\t';
        let value = std::str::from_utf8(value).ok().filter(|v| v.as_bytes().iter().all(visible));
        let Some(value) = value.filter(|v| v.len() <= MAX_HEADER_VALUE_BYTES && v.trim() == *v) else {
            return Err(HeaderError(format!(
                "the value of header {name:?} must be at most {MAX_HEADER_VALUE_BYTES} characters of visible ASCII, \
                 spaces and tabs, without surrounding white space"
            )));
        };
        total += name.len() + value.len();
        if total > MAX_HEADERS_BYTES {
            return Err(HeaderError(format!("the headers are more than {MAX_HEADERS_BYTES} bytes together")));
        }
        headers.push((name.to_owned(), value.to_owned()));
    }
    headers.sort();
    Ok(headers)
}

/// A config's headers as the mirror Secret holds them: a JSON object, name → value.
pub fn mirror_value(headers: &[(String, String)]) -> String {
    let object: serde_json::Map<String, serde_json::Value> =
        headers.iter().map(|(n, v)| (n.clone(), serde_json::Value::String(v.clone()))).collect();
    serde_json::Value::Object(object).to_string()
}

/// The headers of a mirror Secret's value, checked again (the mirror is written by the
/// operator, but a Secret is never trusted as a size).
pub fn parse_mirror_value(value: &[u8]) -> Result<Vec<(String, String)>, HeaderError> {
    if value.len() > 2 * MAX_HEADERS_BYTES {
        return Err(HeaderError(format!("the mirrored headers are more than {} bytes", 2 * MAX_HEADERS_BYTES)));
    }
    let object: std::collections::BTreeMap<String, String> = serde_json::from_slice(value)
        .map_err(|e| HeaderError(format!("the mirrored headers are not a JSON object of strings: {e}")))?;
    check_headers(object.iter().map(|(n, v)| (n.as_str(), v.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::SecretReference;

    fn spec(endpoint: Option<&str>) -> OtlpSinkSpec {
        OtlpSinkSpec { endpoint: endpoint.map(str::to_owned), ..Default::default() }
    }

    fn refused(change: impl FnOnce(&mut OtlpSinkSpec), endpoint: Option<&str>) -> &'static str {
        let mut s = spec(endpoint);
        change(&mut s);
        OtlpSettings::check(&s).unwrap_err().field
    }

    #[test]
    fn endpoints_parse_to_what_is_requested() {
        let e = Endpoint::parse("http://otel-collector.observability:4318/v1/metrics").unwrap();
        assert_eq!(
            (e.https, e.host.as_str(), e.port, e.path.as_str()),
            (false, "otel-collector.observability", Some(4318), "/v1/metrics")
        );
        assert_eq!(e.url(), "http://otel-collector.observability:4318/v1/metrics");
        // Without a path: OTLP/HTTP's metrics path; a given path is kept as is.
        assert_eq!(Endpoint::parse("https://Collector.example").unwrap().url(), "https://collector.example/v1/metrics");
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:9090/api/v1/otlp/v1/metrics").unwrap().path,
            "/api/v1/otlp/v1/metrics"
        );
        for bad in [
            "ftp://x/v1/metrics",
            "http://",
            "http://user:pw@host/v1/metrics",
            "http://host:0/",
            "http://host:65536/",
            "http://host:443443/",
            "http://host/v1/metrics?x=1",
            "http://host/v1/metrics#f",
            "http://-host/",
            "http://host./",
            "http://[::1]:4318/",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
        assert!(Endpoint::parse(&format!("http://h/{}", "p".repeat(MAX_OTLP_ENDPOINT_BYTES))).is_err());
    }

    #[test]
    fn cloudwatch_endpoints_follow_the_partition() {
        assert_eq!(cloudwatch_endpoint("us-west-2").url(), "https://monitoring.us-west-2.amazonaws.com/v1/metrics");
        assert_eq!(
            cloudwatch_endpoint("cn-north-1").url(),
            "https://monitoring.cn-north-1.amazonaws.com.cn/v1/metrics"
        );
        assert_eq!(cloudwatch_endpoint("us-gov-west-1").host, "monitoring.us-gov-west-1.amazonaws.com");
    }

    #[test]
    fn defaults_and_refusals_name_the_field() {
        let s = OtlpSettings::check(&spec(None)).unwrap();
        assert_eq!(
            s,
            OtlpSettings {
                destination: Destination::CloudWatch { region: None },
                flush_interval: Duration::from_secs(60)
            }
        );
        let mut with_headers = spec(Some("https://otlp.example.com"));
        with_headers.headers_secret = Some(SecretReference { name: "otlp-token".into() });
        with_headers.flush_interval = Some("10s".into());
        let s = OtlpSettings::check(&with_headers).unwrap();
        assert_eq!(s.flush_interval, Duration::from_secs(10));
        assert!(
            matches!(s.destination, Destination::Endpoint { headers_secret: Some(ref n), .. } if n == "otlp-token")
        );

        let secret = |s: &mut OtlpSinkSpec| s.headers_secret = Some(SecretReference { name: "x".into() });
        assert_eq!(refused(secret, None), "headersSecret");
        assert_eq!(refused(|s| s.region = Some("us-east-1".into()), Some("http://c:4318")), "region");
        assert_eq!(refused(|s| s.region = Some("moon-1".into()), None), "region");
        assert_eq!(refused(|_| {}, Some("tcp://c:4318")), "endpoint");
        assert_eq!(refused(|s| s.flush_interval = Some("500ms".into()), None), "flushInterval");
        assert_eq!(refused(|s| s.flush_interval = Some("2h".into()), None), "flushInterval");
        assert_eq!(
            refused(|s| s.headers_secret = Some(SecretReference { name: "Bad_Name".into() }), Some("http://c")),
            "headersSecret.name"
        );
    }

    #[test]
    fn headers_keys_are_unambiguous_and_bounded() {
        assert_eq!(headers_key("team-a/otlp.v2"), "team-a.otlp.v2");
        let long = format!("{}/{}", "n".repeat(63), "c".repeat(253));
        let key = headers_key(&long);
        assert_eq!(key.len(), 253);
        assert_ne!(key, headers_key(&format!("{}/{}d", "n".repeat(63), "c".repeat(252))));
    }

    #[test]
    fn headers_are_checked_and_sorted() {
        let ok = check_headers([("X-Scope-OrgID", &b"tenant-1"[..]), ("Authorization", b"Bearer abc.def")]).unwrap();
        assert_eq!(
            ok,
            vec![
                ("Authorization".to_owned(), "Bearer abc.def".to_owned()),
                ("X-Scope-OrgID".to_owned(), "tenant-1".to_owned())
            ]
        );
        for (name, value) in [
            ("Content-Type", &b"text/plain"[..]),
            ("HOST", b"evil"),
            ("bad name", b"v"),
            ("", b"v"),
            ("X-A", b"line\r\nInjected: 1"),
            ("X-A", b" padded"),
            ("X-A", b"\xff\xfe"),
        ] {
            assert!(check_headers([(name, value)]).is_err(), "{name:?} {value:?}");
        }
        assert!(check_headers([("x-a", &b"1"[..]), ("X-A", b"2")]).is_err(), "a name twice");
        let many: Vec<(String, Vec<u8>)> = (0..=MAX_HEADERS).map(|i| (format!("x-{i}"), b"v".to_vec())).collect();
        assert!(check_headers(many.iter().map(|(n, v)| (n.as_str(), v.as_slice()))).is_err());
        let big = vec![b'v'; MAX_HEADER_VALUE_BYTES];
        assert!(check_headers([("a", big.as_slice())]).is_ok());
        assert!(check_headers([("a", big.as_slice()), ("b", big.as_slice()), ("c", b"v")]).is_err(), "over 8 KiB");
    }

    #[test]
    fn the_mirror_format_round_trips_and_is_checked_again() {
        let headers = vec![("Authorization".to_owned(), "Bearer \"x\"".to_owned())];
        assert_eq!(parse_mirror_value(mirror_value(&headers).as_bytes()).unwrap(), headers);
        assert!(parse_mirror_value(b"[1]").is_err());
        assert!(parse_mirror_value(br#"{"Host": "evil"}"#).is_err());
        assert!(parse_mirror_value(&vec![b' '; 3 * MAX_HEADERS_BYTES]).is_err());
    }
}
