//! W3C Trace Context in Kafka record headers: the `traceparent` header that lets one trace
//! follow a job from its record through the journal and its dispatch to the worker, and back
//! with the result (docs/operations.md, "Traces").
//!
//! Only the `traceparent` header is carried; `tracestate` is not. Values are read strictly
//! (W3C Trace Context level 1): a header that does not parse is ignored, never an error, and
//! never reaches the journal.

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The Kafka record header that carries a trace context.
pub const HEADER: &str = "traceparent";

/// Longest header value looked at: a version-00 value is 55 bytes; later versions may add
/// fields, never this many.
const MAX_LEN: usize = 256;

/// The span context a `traceparent` value names, or None when it is not valid: version `ff`,
/// a trace id or span id of all zeros, upper-case or non-hex digits, wrong lengths, or
/// (version 00) anything after the flags.
pub fn parse(value: &[u8]) -> Option<SpanContext> {
    if value.len() > MAX_LEN {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    let mut parts = text.split('-');
    let version = parts.next()?;
    let trace_id = parts.next()?;
    let span_id = parts.next()?;
    let flags = parts.next()?;
    let rest = parts.next();
    if !lower_hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
        return None;
    }
    if !lower_hex(trace_id, 32) || !lower_hex(span_id, 16) || !lower_hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let context = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    );
    context.is_valid().then_some(context)
}

/// [`parse`] of a value held as text.
pub fn parse_str(value: &str) -> Option<SpanContext> {
    parse(value.as_bytes())
}

/// The `traceparent` value (version 00) of a span context; None for an invalid one.
pub fn format(context: &SpanContext) -> Option<String> {
    context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    })
}

/// A value as it may be kept: the canonical form of a valid one, None otherwise.
pub fn normalize(value: &str) -> Option<String> {
    parse_str(value).as_ref().and_then(format)
}

fn lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_value_round_trips() {
        let c = parse_str(VALID).expect("valid");
        assert_eq!(c.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.span_id().to_string(), "00f067aa0ba902b7");
        assert!(c.is_sampled());
        assert!(c.is_remote());
        assert_eq!(format(&c).as_deref(), Some(VALID));
    }

    #[test]
    fn the_sampled_flag_is_kept_and_unknown_flags_dropped() {
        let c = parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!c.is_sampled());
        let c = parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03").unwrap();
        assert!(c.is_sampled());
        assert!(format(&c).unwrap().ends_with("-01"));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let c = parse_str("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-next")
            .expect("a future version with more fields");
        assert_eq!(format(&c).as_deref(), Some(VALID));
    }

    #[test]
    fn invalid_values_are_ignored() {
        for bad in [
            "",
            "00",
            "garbage",
            // version ff is forbidden
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // all-zero ids
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // upper case
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // lengths
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            // version 00 with more fields
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            // signs and spaces where hex belongs
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_str(bad).is_none(), "{bad:?} was accepted");
            assert!(normalize(bad).is_none(), "{bad:?} was kept");
        }
        assert!(parse(&[0xff, 0xfe, b'-']).is_none(), "not UTF-8");
        let huge = format!("01-{}", "a".repeat(10_000));
        assert!(parse_str(&huge).is_none(), "oversized");
    }
}
