use axum::http::{header, HeaderMap, HeaderValue, StatusCode};

use super::*;

fn headers(values: &[&[u8]]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for v in values {
        headers.append(header::AUTHORIZATION, HeaderValue::from_bytes(v).expect("a header value"));
    }
    headers
}

#[test]
fn the_bearer_token_is_taken_from_one_authorization_header() {
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_";
    assert_eq!(bearer_token(&headers(&[format!("Bearer {jwt}").as_bytes()])), Ok(jwt));
    assert_eq!(bearer_token(&headers(&[b"bearer abc"])), Ok("abc"), "the scheme in any case");
    assert_eq!(bearer_token(&headers(&[b"BEARER  abc=="])), Ok("abc=="), "token68 padding");
}

#[test]
fn anything_else_is_refused_with_its_reason() {
    assert_eq!(bearer_token(&HeaderMap::new()), Err("no_token"));
    let cases: [&[u8]; 8] = [
        b"Basic dXNlcjpwYXNz",
        b"Bearer",
        b"Bearer ",
        b"Bearer a b",
        b"Bearer a\"b",
        b"Bearer ===",
        b"Bearer \xff\xfe",
        b"Token abc",
    ];
    for case in cases {
        assert_eq!(bearer_token(&headers(&[case])), Err("malformed"), "{:?}", String::from_utf8_lossy(case));
    }
    assert_eq!(bearer_token(&headers(&[b"Bearer a", b"Bearer b"])), Err("malformed"), "two headers");
    let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
    assert_eq!(bearer_token(&headers(&[long.as_bytes()])), Err("too_long"));
    let longest = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES));
    assert_eq!(bearer_token(&headers(&[longest.as_bytes()])).map(str::len), Ok(MAX_TOKEN_BYTES));
}

#[test]
fn refusals_answer_401_with_a_challenge_403_503_and_429() {
    let no_token = Refusal::Unauthenticated { reason: "no_token" }.into_response();
    assert_eq!(no_token.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(no_token.headers()[header::WWW_AUTHENTICATE], "Bearer realm=\"neuron-monitor\"");
    let invalid = Refusal::Unauthenticated { reason: "invalid_token" }.into_response();
    assert_eq!(invalid.status(), StatusCode::UNAUTHORIZED);
    let challenge = invalid.headers()[header::WWW_AUTHENTICATE].to_str().unwrap();
    assert!(challenge.starts_with("Bearer ") && challenge.contains("error=\"invalid_token\""), "{challenge}");
    let forbidden = Refusal::Forbidden { user: "system:anonymous".to_owned() }.into_response();
    assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
    assert!(forbidden.headers().get(header::WWW_AUTHENTICATE).is_none());
    let unavailable = Refusal::Unavailable { why: "down".to_owned() }.into_response();
    assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    let throttled = Refusal::Throttled(Throttled::Peer { wait: Duration::from_millis(1500) }).into_response();
    assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(throttled.headers()[header::RETRY_AFTER], "2");
}

#[test]
fn user_names_are_bounded_at_a_character_boundary() {
    assert_eq!(bounded("system:anonymous".to_owned()), "system:anonymous");
    let long = "é".repeat(200); // 400 bytes
    let cut = bounded(long);
    assert!(cut.len() <= 256 && cut.chars().all(|c| c == 'é'), "{}", cut.len());
}
