//! Requests out to the receiver: one in flight per sink, OTLP/HTTP (`POST`, protobuf,
//! gzip), signed with SigV4 for CloudWatch's endpoint or carrying the headers of the
//! config's Secret for any other.
//!
//! - 429, 5xx, 408, time-outs and network errors are retried with jittered exponential
//!   backoff, without end (a long outage is bounded by the queue, which drops its oldest);
//!   a `Retry-After` of seconds is honoured up to the backoff's maximum. 401 and 403 are
//!   retried too (credentials that may become valid, a Secret being fixed), as are
//!   credentials that cannot be loaded yet and headers not mirrored yet.
//! - Any other refusal drops the request's points (`rejected`): the same bytes would be
//!   refused again.
//! - A partial success counts the points the receiver rejected (`partial_success`) and
//!   logs its message. An accepted request whose answer is over
//!   [`MAX_RESPONSE_BYTES`] (or breaks off) is not read: its points count as `unconfirmed`
//!   (how many were rejected is unknown), not as sent, and are not sent again.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use aws_credential_types::{provider::ProvideCredentials, Credentials};
use http::{header, HeaderName, HeaderValue, Method, Request as HttpRequest, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use prost::Message;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{
    encode::unix_nanos,
    headers::MirroredHeaders,
    request::Request,
    telemetry::{OtlpMetrics, SinkEncodingLabels, SinkLabel, SinkReasonLabels, SinkResultLabels},
    Queue,
};
use crate::{
    delivery::{backoff::Backoff, MAX_RESPONSE_BYTES},
    ratelimit::{Decision, RateLimit},
};

/// The agent's HTTP client of every OTLP sink (connections pooled per receiver).
pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

const USER_AGENT: &str = concat!("neuron-node-agent/", env!("CARGO_PKG_VERSION"));

/// The client: http and https (rustls on ring, the system's CA certificates), and
/// whether CA certificates were found (without them https verifies nothing; http works).
pub fn http_client() -> Result<(HttpClient, bool), String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let provider = || rustls::crypto::ring::default_provider();
    let (builder, roots) = match hyper_rustls::HttpsConnectorBuilder::new().with_provider_and_native_roots(provider()) {
        Ok(builder) => (builder, true),
        Err(e) => {
            warn!(error = %e, "no CA certificates found: OTLP sinks can send over http only");
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            (hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config), false)
        }
    };
    let https = builder.https_or_http().enable_http1().wrap_connector(http);
    Ok((Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(https), roots))
}

/// How requests are authenticated.
pub enum Auth {
    /// SigV4 for `service`, in `region`, with the standard credential chain's credentials.
    SigV4 {
        region: String,
        credentials: CredentialCache,
    },
    /// The headers of the config's Secret, as the operator mirrors them (under `key`).
    Headers {
        key: String,
        mirror: watch::Receiver<MirroredHeaders>,
    },
    None,
}

/// Credentials from the chain, reused until five minutes before they expire (the chain
/// itself does not cache: each call may be a request to IMDS or STS).
pub struct CredentialCache {
    provider: aws_credential_types::provider::SharedCredentialsProvider,
    cached: Option<Credentials>,
}

impl CredentialCache {
    pub fn new(provider: aws_credential_types::provider::SharedCredentialsProvider) -> Self {
        CredentialCache { provider, cached: None }
    }

    async fn get(&mut self) -> Result<Credentials, String> {
        let fresh = |c: &Credentials| c.expiry().is_none_or(|e| e > SystemTime::now() + Duration::from_secs(300));
        if let Some(c) = self.cached.as_ref().filter(|c| fresh(c)) {
            return Ok(c.clone());
        }
        let credentials = self.provider.provide_credentials().await.map_err(|e| e.to_string())?;
        self.cached = Some(credentials.clone());
        Ok(credentials)
    }
}

/// Where one sink's requests go.
pub struct Target {
    pub sink: String,
    pub url: String,
    pub auth: Auth,
    pub client: HttpClient,
    pub backoff: Backoff,
    pub request_timeout: Duration,
    pub metrics: OtlpMetrics,
}

/// Why an attempt failed, whether it may succeed later, and when to try again if the
/// receiver said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub retry: bool,
    pub retry_after: Option<Duration>,
}

/// Sorts a response by status.
pub fn classify(status: StatusCode, retry_after: Option<Duration>) -> Failure {
    let (reason, retry) = match status.as_u16() {
        429 => ("throttled", true),
        408 => ("timeout", true),
        401 | 403 => ("auth", true),
        500..=599 => ("server_error", true),
        _ => ("rejected", false),
    };
    Failure { reason, retry, retry_after: retry_after.filter(|_| retry) }
}

/// A `Retry-After` of delay-seconds (an HTTP date is not honoured: the backoff applies).
pub fn retry_after(value: Option<&HeaderValue>) -> Option<Duration> {
    let seconds: u64 = value?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// What an accepted request's body says: the points the receiver rejected, and why.
pub fn partial_success(body: &[u8]) -> Option<(u64, String)> {
    let response = ExportMetricsServiceResponse::decode(body).ok()?;
    let partial = response.partial_success?;
    let rejected = u64::try_from(partial.rejected_data_points).unwrap_or(0);
    (rejected > 0 || !partial.error_message.is_empty()).then_some((rejected, partial.error_message))
}

/// The outcome of one attempt.
enum Attempt {
    Sent {
        rejected: u64,
        message: String,
    },
    /// Accepted, with an answer that was not read (over the limit, or broken off).
    Unconfirmed,
    Failed(Failure, String),
}

impl Target {
    fn labels(&self, reason: &'static str) -> SinkReasonLabels {
        SinkReasonLabels { sink: self.sink.clone(), reason }
    }

    /// One attempt: sign or add headers, send, read the answer.
    async fn attempt(&mut self, request: &Request) -> Attempt {
        let mut http = HttpRequest::builder()
            .method(Method::POST)
            .uri(&self.url)
            .header(header::CONTENT_TYPE, "application/x-protobuf")
            .header(header::CONTENT_ENCODING, "gzip")
            .header(header::USER_AGENT, USER_AGENT);
        match &mut self.auth {
            Auth::Headers { key, mirror } => {
                let headers = match mirror.borrow().get(key.as_str()) {
                    Some(Ok(headers)) => headers.clone(),
                    Some(Err(why)) => return Attempt::Failed(failure("headers"), why.clone()),
                    None => {
                        return Attempt::Failed(
                            failure("headers"),
                            "the Secret's headers are not mirrored (yet)".into(),
                        )
                    }
                };
                for (name, value) in headers.iter() {
                    http = http.header(name.as_str(), value.as_str());
                }
            }
            Auth::SigV4 { .. } | Auth::None => {}
        }
        let mut http = match http.body(Full::new(Bytes::from(request.body.clone()))) {
            Ok(r) => r,
            Err(e) => {
                return Attempt::Failed(Failure { reason: "other", retry: false, retry_after: None }, e.to_string())
            }
        };
        if let Auth::SigV4 { region, credentials } = &mut self.auth {
            let credentials = match credentials.get().await {
                Ok(c) => c,
                Err(e) => return Attempt::Failed(failure("credentials"), e),
            };
            if let Err(e) = sign(&mut http, &request.body, region, credentials) {
                return Attempt::Failed(Failure { reason: "other", retry: false, retry_after: None }, e);
            }
        }
        let exchange = async {
            let response = self.client.request(http).await.map_err(|e| {
                let reason = if e.is_connect() { "network" } else { "response" };
                (Failure { reason, retry: true, retry_after: None }, format!("{e:?}"))
            })?;
            let status = response.status();
            let after = retry_after(response.headers().get(header::RETRY_AFTER));
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES).collect().await.map(|b| b.to_bytes());
            Ok::<_, (Failure, String)>((status, after, body))
        };
        match tokio::time::timeout(self.request_timeout, exchange).await {
            Err(_) => Attempt::Failed(failure("timeout"), format!("no answer within {:?}", self.request_timeout)),
            Ok(Err((f, message))) => Attempt::Failed(f, message),
            Ok(Ok((status, _, Err(_)))) if status.is_success() => Attempt::Unconfirmed,
            Ok(Ok((status, _, Ok(body)))) if status.is_success() => {
                let (rejected, message) = partial_success(&body).unwrap_or_default();
                Attempt::Sent { rejected, message }
            }
            Ok(Ok((status, after, body))) => {
                let text =
                    body.map(|b| String::from_utf8_lossy(&b[..b.len().min(512)]).into_owned()).unwrap_or_default();
                Attempt::Failed(classify(status, after), format!("HTTP {status}: {text}"))
            }
        }
    }
}

fn failure(reason: &'static str) -> Failure {
    Failure { reason, retry: true, retry_after: None }
}

/// Signs a request for CloudWatch's OTLP endpoint: SigV4, service `monitoring`, the
/// body's SHA-256 in the signature.
fn sign(
    request: &mut HttpRequest<Full<Bytes>>,
    body: &[u8],
    region: &str,
    credentials: Credentials,
) -> Result<(), String> {
    use aws_sigv4::{
        http_request::{sign, SignableBody, SignableRequest, SigningSettings},
        sign::v4,
    };
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(api::otlp::CLOUDWATCH_SIGNING_NAME)
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let uri = request.uri().to_string();
    let headers: Vec<(&str, &str)> =
        request.headers().iter().filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))).collect();
    let signable =
        SignableRequest::new(request.method().as_str(), uri.as_str(), headers.into_iter(), SignableBody::Bytes(body))
            .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(signable, &params).map_err(|e| e.to_string())?.into_parts();
    for (name, value) in instructions.headers() {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
        let value = HeaderValue::from_str(value).map_err(|e| e.to_string())?;
        request.headers_mut().insert(name, value);
    }
    Ok(())
}

/// Sends what the queue holds until `stop` (which abandons the request in flight).
pub async fn run_sender(queue: Arc<Queue>, mut target: Target, stop: CancellationToken) {
    let mut log_limit = RateLimit::new(5, Duration::from_secs(60));
    let sink = SinkLabel { sink: target.sink.clone() };
    loop {
        let request = loop {
            if let Some(request) = queue.take(|requests| requests.pop_front()) {
                break request;
            }
            queue.finish();
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = queue.notify.notified() => {}
            }
        };
        let mut attempt = 0u32;
        loop {
            let outcome = tokio::select! {
                _ = stop.cancelled() => return,
                outcome = target.attempt(&request) => outcome,
            };
            let result = SinkResultLabels { sink: target.sink.clone(), result: "success" };
            match outcome {
                Attempt::Sent { rejected, message } => {
                    let m = &target.metrics;
                    m.common.requests.get_or_create(&result).inc();
                    m.points_sent.get_or_create(&sink).inc_by((request.points as u64).saturating_sub(rejected));
                    for (encoding, bytes) in [("gzip", request.body.len()), ("raw", request.raw_bytes)] {
                        let labels = SinkEncodingLabels { sink: target.sink.clone(), encoding };
                        m.bytes_sent.get_or_create(&labels).inc_by(bytes as u64);
                    }
                    m.common.last_success.get_or_create(&sink).set(unix_nanos(SystemTime::now()) as f64 / 1e9);
                    m.common.set_invalid(&target.sink, "headers", false);
                    if rejected > 0 || !message.is_empty() {
                        m.common.dropped.get_or_create(&target.labels("partial_success")).inc_by(rejected);
                        if let Decision::Allow { suppressed_before } = log_limit.check() {
                            warn!(sink = %target.sink, rejected, suppressed_before, message = %message,
                                  "the OTLP receiver accepted the request in part");
                        }
                    }
                    debug!(sink = %target.sink, points = request.points, bytes = request.body.len(), attempt, "OTLP export accepted");
                    break;
                }
                Attempt::Unconfirmed => {
                    let m = &target.metrics;
                    m.common.requests.get_or_create(&result).inc();
                    m.common.unconfirmed.get_or_create(&sink).inc_by(request.points as u64);
                    if let Decision::Allow { suppressed_before } = log_limit.check() {
                        warn!(sink = %target.sink, points = request.points, limit = MAX_RESPONSE_BYTES, suppressed_before,
                              "the OTLP receiver accepted the request with an answer over the limit or broken off: \
                               not read, so its points are unconfirmed");
                    }
                    break;
                }
                Attempt::Failed(failure, message) => {
                    let m = &target.metrics;
                    m.common.requests.get_or_create(&SinkResultLabels { result: "failure", ..result }).inc();
                    m.common.failures.get_or_create(&target.labels(failure.reason)).inc();
                    if failure.reason == "headers" {
                        m.common.set_invalid(&target.sink, "headers", true);
                    }
                    if let Decision::Allow { suppressed_before } = log_limit.check() {
                        warn!(sink = %target.sink, reason = failure.reason, retry = failure.retry, points = request.points,
                              attempt, suppressed_before, error = %message, "OTLP export failed");
                    }
                    if !failure.retry {
                        m.common.dropped.get_or_create(&target.labels("rejected")).inc_by(request.points as u64);
                        break;
                    }
                    let delay = failure
                        .retry_after
                        .map_or_else(|| target.backoff.delay(attempt), |d| d.min(target.backoff.max));
                    attempt = attempt.saturating_add(1);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        queue.finish();
    }
}
