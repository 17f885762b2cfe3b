//! What every AWS client of the agent shares (the CloudWatch metrics sinks, the health
//! event stream to CloudWatch Logs): one client configuration and one sorting of failures
//! into retried and given up.

use std::time::Duration;

use aws_config::{retry::RetryConfig, timeout::TimeoutConfig, BehaviorVersion, Region};
use aws_sdk_cloudwatch::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::{
    http::{
        HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
    },
    orchestrator::HttpRequest,
    result::ConnectorError,
    runtime_components::RuntimeComponents,
};
use aws_smithy_types::body::SdkBody;
use http_body_util::{BodyExt, Limited};

use super::MAX_RESPONSE_BYTES;

/// Why an attempt failed, and whether the same request may succeed later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub retry: bool,
}

/// Error codes of throttling (CloudWatch's query-compatible code and the SDKs' list).
const THROTTLING_CODES: [&str; 7] = [
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "SlowDown",
];
/// Error codes of credentials that may become valid (a rotated web-identity token, an
/// instance profile attached late).
const AUTH_CODES: [&str; 6] = [
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "AccessDenied",
    "AccessDeniedException",
];

/// Sorts a failed PutMetricData.
pub fn classify<E: ProvideErrorMetadata + std::error::Error + 'static>(
    error: &SdkError<E, aws_sdk_cloudwatch::config::http::HttpResponse>,
) -> Failure {
    match error {
        SdkError::DispatchFailure(d) if answer_too_large(d).is_some() => {
            // An accepted request's fate is unknown (not sent again); a refused one retried.
            let accepted = answer_too_large(d).is_some_and(|t| t.accepted);
            Failure { reason: RESPONSE_TOO_LARGE, retry: !accepted }
        }
        SdkError::TimeoutError(_) => Failure { reason: "timeout", retry: true },
        SdkError::DispatchFailure(d) if d.is_timeout() => Failure { reason: "timeout", retry: true },
        SdkError::DispatchFailure(d) if d.is_io() => Failure { reason: "network", retry: true },
        // Credentials that cannot be loaded yet surface here too.
        SdkError::DispatchFailure(_) => Failure { reason: "other", retry: true },
        SdkError::ResponseError(_) => Failure { reason: "response", retry: true },
        SdkError::ServiceError(e) => {
            let status = e.raw().status().as_u16();
            let code = e.err().code().unwrap_or_default();
            classify_service(status, code)
        }
        _ => Failure { reason: "other", retry: true },
    }
}

/// Sorts a service error by HTTP status and error code.
pub fn classify_service(status: u16, code: &str) -> Failure {
    if status == 429 || THROTTLING_CODES.contains(&code) {
        Failure { reason: "throttled", retry: true }
    } else if status >= 500 {
        Failure { reason: "server_error", retry: true }
    } else if AUTH_CODES.contains(&code) || status == 401 || status == 403 {
        Failure { reason: "auth", retry: true }
    } else {
        Failure { reason: "rejected", retry: false }
    }
}

/// The failure reason of an answer over [`MAX_RESPONSE_BYTES`].
pub const RESPONSE_TOO_LARGE: &str = "response_too_large";

/// An answer whose body is over [`MAX_RESPONSE_BYTES`]: not read.
#[derive(Debug, thiserror::Error)]
#[error("an answer of HTTP {status} over {MAX_RESPONSE_BYTES} bytes: not read")]
pub struct AnswerTooLarge {
    pub status: u16,
    /// HTTP 2xx: the request was taken, its answer not read.
    pub accepted: bool,
}

/// The [`AnswerTooLarge`] that failed a dispatch, if that is why it failed.
pub fn answer_too_large(failure: &aws_smithy_runtime_api::client::result::DispatchFailure) -> Option<&AnswerTooLarge> {
    let source = std::error::Error::source(failure.as_connector_error()?)?;
    source.downcast_ref::<AnswerTooLarge>()
}

/// The AWS clients' HTTP client, each answer's body read at most [`MAX_RESPONSE_BYTES`]
/// (the SDK reads an answer whole before it parses it).
#[derive(Debug)]
struct BoundedAnswers(SharedHttpClient);

impl HttpClient for BoundedAnswers {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        SharedHttpConnector::new(BoundedConnector(self.0.http_connector(settings, components)))
    }
}

#[derive(Debug)]
struct BoundedConnector(SharedHttpConnector);

impl HttpConnector for BoundedConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let answer = self.0.call(request);
        HttpConnectorFuture::new(async move {
            let mut response = answer.await?;
            let body = std::mem::replace(response.body_mut(), SdkBody::taken());
            let body = match Limited::new(body, MAX_RESPONSE_BYTES).collect().await {
                Ok(body) => body.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    let status = response.status();
                    let too_large = AnswerTooLarge { status: status.as_u16(), accepted: status.is_success() };
                    return Err(ConnectorError::other(too_large.into(), None));
                }
                Err(e) => return Err(ConnectorError::io(e)),
            };
            *response.body_mut() = SdkBody::from(body);
            Ok(response)
        })
    }
}

/// The configuration of every AWS client of the agent (CloudWatch, CloudWatch Logs): the
/// standard credential chain (environment, web identity for IRSA, container credentials
/// for EKS Pod Identity, instance profile), rustls on ring, no SDK retries (the callers
/// retry and count each attempt), a time limit per attempt. Each service's client takes
/// its endpoint from `AWS_ENDPOINT_URL_<SERVICE>` / `AWS_ENDPOINT_URL` when set.
pub async fn sdk_config(region: &str, attempt_timeout: Duration) -> aws_config::SdkConfig {
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .http_client(SharedHttpClient::new(BoundedAnswers(http)))
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(attempt_timeout)
                .build(),
        )
        .load()
        .await
}
