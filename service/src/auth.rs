//! Who may read `/metrics`: each request's bearer token is authenticated by the API
//! server (`TokenReview`, authentication.k8s.io/v1) and the user it names authorised for
//! the non-resource URL `/metrics`, verb `get` (`SubjectAccessReview`,
//! authorization.k8s.io/v1) — what kube-rbac-proxy does, in the binary.
//!
//! - **Answers.** No token, a malformed or oversized one: 401 without a review. A token
//!   the API server does not authenticate: 401. Authenticated but not allowed: 403. Both
//!   401s carry `WWW-Authenticate: Bearer`. The API server unreachable, slow or refusing
//!   the review itself: 503, saying which, never cached.
//! - **Cache.** Decisions are kept by the SHA-256 of the token (never the token), allowed
//!   ones for [`ALLOWED_TTL`], refusals for [`DENIED_TTL`], each kind in a map of its own
//!   with a bounded number of entries, so a flood of bad tokens cannot push out the
//!   scrapers' entries.
//! - **Bounds.** Tokens of at most [`MAX_TOKEN_BYTES`]; at most [`MAX_CONCURRENT_REVIEWS`]
//!   reviews in flight, later requests waiting up to [`REVIEW_TIMEOUT`] for a turn; each
//!   review (both requests) bounded by [`REVIEW_TIMEOUT`].
//! - **Rate.** Reviews are sent at a bounded rate per peer and overall ([`budget`]); a
//!   request over it is answered 429 with `Retry-After`, without a review, and counted.
//!
//! Tokens are never logged.

pub mod budget;
mod cache;

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{ConnectInfo, Request, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{api::PostParams, Api};
use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use tokio::sync::Semaphore;
use tracing::warn;

use budget::{ReviewBudget, Throttled};
pub use cache::{Decision, ReviewCache};

use crate::{
    labels::{ReasonLabel, ResultLabel},
    ratelimit::{Decision as LogDecision, RateLimit},
};

/// The path and verb a caller must be allowed (`nonResourceURLs: ["/metrics"]`, `get`).
pub const METRICS_PATH: &str = "/metrics";
pub const VERB: &str = "get";

/// How long an allowed token is trusted without a new review: also how long a revoked
/// RoleBinding or a deleted ServiceAccount keeps its access.
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refused token (401 or 403) is refused without a new review.
pub const DENIED_TTL: Duration = Duration::from_secs(10);
/// Entries of each kind (allowed, refused) kept at most.
pub const ALLOWED_ENTRIES: usize = 256;
pub const DENIED_ENTRIES: usize = 1024;
/// Longest bearer token taken; longer ones are refused without a review (a ServiceAccount
/// token is about 1 KiB).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Reviews in flight at once.
pub const MAX_CONCURRENT_REVIEWS: usize = 8;
/// Time for one review (TokenReview and SubjectAccessReview), and for waiting for a turn.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// What the API server is told and asked.
#[derive(Clone, Debug, Default)]
pub struct AuthOptions {
    /// Audiences the token must be meant for; empty: the API server's own (an ordinary
    /// ServiceAccount token).
    pub audiences: Vec<String>,
}

/// The checks' metrics; cloning shares them.
#[derive(Clone, Default)]
pub struct AuthMetrics {
    /// Reviews sent to the API server, by result: allowed, forbidden, unauthenticated, error.
    pub reviews: Family<ResultLabel, Counter>,
    /// Decisions taken from the cache, by result: allowed, forbidden, unauthenticated.
    pub cache_hits: Family<ResultLabel, Counter>,
    /// Requests refused before any review, by reason: no_token, malformed, too_long, busy,
    /// peer_rate, review_rate.
    pub refused: Family<ReasonLabel, Counter>,
}

impl AuthMetrics {
    /// Registers `<registry prefix>_auth_reviews`, `_auth_cache_hits`, `_auth_refused`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = AuthMetrics::default();
        registry.register(
            "auth_reviews",
            "Token reviews (TokenReview, then SubjectAccessReview) of /metrics requests sent to the API server, by \
             result (allowed, forbidden, unauthenticated, error)",
            metrics.reviews.clone(),
        );
        registry.register(
            "auth_cache_hits",
            "/metrics requests decided from the review cache, by result",
            metrics.cache_hits.clone(),
        );
        registry.register(
            "auth_refused",
            "/metrics requests refused before any review, by reason (no_token, malformed, too_long, busy; peer_rate, \
             review_rate: the reviews of the source address, or all reviews, over their rate)",
            metrics.refused.clone(),
        );
        metrics
    }
}

/// Checks `/metrics` requests against the API server.
pub struct MetricsAuth {
    client: kube::Client,
    options: AuthOptions,
    cache: Mutex<ReviewCache>,
    reviews: Semaphore,
    budget: Mutex<ReviewBudget>,
    metrics: AuthMetrics,
    errors_logged: Mutex<RateLimit>,
    throttles_logged: Mutex<RateLimit>,
}

/// Why a request is not served.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no usable token, or one the API server does not authenticate.
    Unauthenticated { reason: &'static str },
    /// 403: authenticated as `user`, who may not get /metrics.
    Forbidden { user: String },
    /// 503: no decision could be had.
    Unavailable { why: String },
    /// 429: no review now, the review rate is spent.
    Throttled(Throttled),
}

impl MetricsAuth {
    pub fn new(client: kube::Client, options: AuthOptions, metrics: AuthMetrics) -> Self {
        MetricsAuth {
            client,
            options,
            cache: Mutex::new(ReviewCache::new(ALLOWED_ENTRIES, DENIED_ENTRIES)),
            reviews: Semaphore::new(MAX_CONCURRENT_REVIEWS),
            budget: Mutex::new(ReviewBudget::new(Instant::now())),
            metrics,
            errors_logged: Mutex::new(RateLimit::new(1, Duration::from_secs(10))),
            throttles_logged: Mutex::new(RateLimit::new(1, Duration::from_secs(10))),
        }
    }

    /// Whether the request with these headers, from `peer` (if known), may read /metrics.
    pub async fn check(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<(), Refusal> {
        let token = match bearer_token(headers) {
            Ok(token) => token,
            Err(reason) => {
                self.metrics.refused.get_or_create(&ReasonLabel { reason }).inc();
                return Err(Refusal::Unauthenticated { reason });
            }
        };
        let key = cache::key(token);
        if let Some(decision) = self.cached(&key) {
            self.metrics.cache_hits.get_or_create(&ResultLabel { result: decision.result() }).inc();
            return decision.into_result();
        }
        let Ok(Ok(_turn)) = tokio::time::timeout(REVIEW_TIMEOUT, self.reviews.acquire()).await else {
            self.metrics.refused.get_or_create(&ReasonLabel { reason: "busy" }).inc();
            return Err(Refusal::Unavailable {
                why: format!("more than {MAX_CONCURRENT_REVIEWS} token reviews in flight"),
            });
        };
        // Another request with the same token may have been reviewed meanwhile.
        if let Some(decision) = self.cached(&key) {
            self.metrics.cache_hits.get_or_create(&ResultLabel { result: decision.result() }).inc();
            return decision.into_result();
        }
        self.admit(&key, peer)?;
        match tokio::time::timeout(REVIEW_TIMEOUT, self.review(token)).await {
            Ok(Ok(decision)) => {
                self.metrics.reviews.get_or_create(&ResultLabel { result: decision.result() }).inc();
                let now = Instant::now();
                if let Ok(mut budget) = self.budget.lock() {
                    match decision {
                        Decision::Allowed => budget.allowed(key, now),
                        _ => budget.refused(&key),
                    }
                }
                if let Ok(mut cache) = self.cache.lock() {
                    cache.insert(key, decision.clone(), now, ttl(&decision));
                }
                decision.into_result()
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => e,
                    _ => format!("the API server did not answer within {}s", REVIEW_TIMEOUT.as_secs()),
                };
                self.metrics.reviews.get_or_create(&ResultLabel { result: "error" }).inc();
                if self.errors_logged.lock().is_ok_and(|mut l| matches!(l.check(), LogDecision::Allow { .. })) {
                    warn!(error = %why, "cannot review a /metrics request's token: answering 503");
                }
                Err(Refusal::Unavailable { why })
            }
        }
    }

    /// Takes a review from the budget, or refuses the request (counted, logged throttled).
    fn admit(&self, key: &cache::Key, peer: Option<IpAddr>) -> Result<(), Refusal> {
        let Ok(mut budget) = self.budget.lock() else {
            return Ok(());
        };
        let throttled = match budget.admit(key, peer, Instant::now()) {
            Ok(()) => return Ok(()),
            Err(throttled) => throttled,
        };
        drop(budget);
        let reason = throttled.reason();
        self.metrics.refused.get_or_create(&ReasonLabel { reason }).inc();
        let logged = self.throttles_logged.lock().ok().and_then(|mut l| match l.check() {
            LogDecision::Allow { suppressed_before } => Some(suppressed_before + 1),
            LogDecision::Suppress => None,
        });
        if let Some(count) = logged {
            let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
            warn!(reason, peer, count, "token reviews over their rate: /metrics requests answered 429");
        }
        Err(Refusal::Throttled(throttled))
    }

    fn cached(&self, key: &cache::Key) -> Option<Decision> {
        self.cache.lock().ok()?.get(key, Instant::now())
    }

    /// TokenReview, then (if authenticated) SubjectAccessReview. `Err`: no decision.
    async fn review(&self, token: &str) -> Result<Decision, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!self.options.audiences.is_empty()).then(|| self.options.audiences.clone()),
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| api_error("TokenReview", e))?;
        let status = reviewed.status.unwrap_or_default();
        let user = match status.user {
            Some(user) if status.authenticated == Some(true) => user,
            _ => return Ok(Decision::Unauthenticated),
        };
        let username = user.username.unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(username.clone()),
                groups: user.groups,
                uid: user.uid,
                extra: user.extra.map(|extra| extra.into_iter().collect::<BTreeMap<_, _>>()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some(VERB.to_owned()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|e| api_error("SubjectAccessReview", e))?;
        if decided.status.is_some_and(|s| s.allowed) {
            Ok(Decision::Allowed)
        } else {
            Ok(Decision::Forbidden { user: bounded(username) })
        }
    }
}

/// What a failed review says: the API server's refusal (status and reason), or that it
/// could not be reached. Kube's errors carry no request body, so never the token.
fn api_error(what: &str, error: kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("the API server refused the {what} ({} {}): {}", status.code, status.reason, status.message)
        }
        other => format!("the API server could not be reached for the {what}: {other}"),
    }
}

fn ttl(decision: &Decision) -> Duration {
    match decision {
        Decision::Allowed => ALLOWED_TTL,
        _ => DENIED_TTL,
    }
}

/// A user name from the API server, bounded before it goes into an answer.
fn bounded(mut name: String) -> String {
    const MAX: usize = 256;
    if name.len() > MAX {
        let mut end = MAX;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// The bearer token of `Authorization: Bearer <token>` (the scheme in any case), or why
/// there is none: `no_token`, `malformed` (another scheme, several headers, characters
/// outside RFC 6750's token68), `too_long` (over [`MAX_TOKEN_BYTES`]).
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, &'static str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(if headers.contains_key(header::AUTHORIZATION) { "malformed" } else { "no_token" });
    };
    let bytes = value.as_bytes();
    if bytes.len() > MAX_TOKEN_BYTES + "Bearer ".len() {
        return Err("too_long");
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "malformed")?;
    let (scheme, token) = text.split_once(' ').ok_or("malformed")?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err("malformed");
    }
    let token = token.trim_start_matches(' ');
    let body = token.trim_end_matches('=');
    let token68 = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/');
    if body.is_empty() || !body.bytes().all(token68) {
        return Err("malformed");
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err("too_long");
    }
    Ok(token)
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        const CHALLENGE: &str = "Bearer realm=\"neuron-monitor\"";
        match self {
            Refusal::Unauthenticated { reason } => {
                let (challenge, body) = match reason {
                    "no_token" => (
                        HeaderValue::from_static(CHALLENGE),
                        "unauthorized: send a Kubernetes bearer token (Authorization: Bearer <token>)\n",
                    ),
                    _ => (
                        HeaderValue::from_static("Bearer realm=\"neuron-monitor\", error=\"invalid_token\""),
                        "unauthorized: the bearer token is malformed, too long, or not authenticated by the \
                         Kubernetes API server\n",
                    ),
                };
                (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], body).into_response()
            }
            Refusal::Forbidden { user } => (
                StatusCode::FORBIDDEN,
                format!("forbidden: user {user:?} may not {VERB} the non-resource URL {METRICS_PATH}\n"),
            )
                .into_response(),
            Refusal::Unavailable { why } => {
                (StatusCode::SERVICE_UNAVAILABLE, format!("cannot check the bearer token now: {why}\n")).into_response()
            }
            Refusal::Throttled(throttled) => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, HeaderValue::from(throttled.retry_after_secs()))],
                "too many new bearer tokens to review: retry later\n",
            )
                .into_response(),
        }
    }
}

/// The axum middleware of the metrics route: the request goes on only when allowed.
pub async fn require(State(auth): State<Arc<MetricsAuth>>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    match auth.check(request.headers(), peer).await {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests;
