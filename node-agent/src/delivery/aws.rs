//! What every AWS client of the agent shares (the CloudWatch metrics sinks, the health
//! event stream to CloudWatch Logs): one client configuration and one sorting of failures
//! into retried and given up.

use std::time::Duration;

use aws_config::{retry::RetryConfig, timeout::TimeoutConfig, BehaviorVersion, Region};
use aws_sdk_cloudwatch::error::{ProvideErrorMetadata, SdkError};

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
        .http_client(http)
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
