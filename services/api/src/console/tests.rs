use super::replays::parse_time;
use super::*;

#[test]
fn the_cookie_or_the_header_carries_the_token() {
    let mut h = HeaderMap::new();
    assert_eq!(credentials(&h), None);
    h.insert(
        header::COOKIE,
        "a=b; ksched_session=tok123".parse().unwrap(),
    );
    assert_eq!(credentials(&h).as_deref(), Some("Bearer tok123"));
    h.insert(header::AUTHORIZATION, "Bearer other".parse().unwrap());
    assert_eq!(credentials(&h).as_deref(), Some("Bearer other"));
}

#[test]
fn only_this_origin_may_post() {
    let mut h = HeaderMap::new();
    h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
    assert!(!same_origin(&h, false), "no Origin: refused");
    h.insert("origin", "http://127.0.0.1:8080".parse().unwrap());
    assert!(same_origin(&h, false));
    assert!(!same_origin(&h, true), "https page, http origin");
    h.insert("sec-fetch-site", "cross-site".parse().unwrap());
    assert!(!same_origin(&h, false));
    h.insert("sec-fetch-site", "same-origin".parse().unwrap());
    h.insert("origin", "http://evil.example".parse().unwrap());
    assert!(!same_origin(&h, false));
}

#[test]
fn times_from_forms() {
    assert_eq!(parse_time("1000"), Some(1000));
    assert_eq!(parse_time("1970-01-01T00:00:01Z"), Some(1000));
    assert_eq!(parse_time("1970-01-01T00:00:02"), Some(2000));
    assert_eq!(parse_time("1970-01-01T00:01"), Some(60_000));
    assert_eq!(parse_time("yesterday"), None);
}
