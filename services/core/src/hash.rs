//! Deterministic hashing: the approval job hash and the retry jitter.

use sha2::{Digest, Sha256};

use crate::records::JobRequest;

/// Labels with this prefix may change without invalidating an approval.
pub const APPROVAL_LABEL_PREFIX: &str = "approval_";

/// SHA-256 (hex) of the canonical encoding of the request without `approval_*` labels
/// (SPEC §6). The canonical encoding is the request's JSON with fields in declaration order
/// and maps in key order, which is stable across processes and releases; adding a field to
/// `JobRequest` changes hashes, so pending approvals must be re-requested after such an
/// upgrade (documented in docs/schema-evolution.md).
///
/// `traceparent` is left out: it says who traced the submission, not what the job is (a
/// resubmission under another trace is the same job), and hashes stay what they were
/// before the field existed.
pub fn job_hash(request: &JobRequest) -> String {
    let mut r = request.clone();
    r.labels
        .retain(|k, _| !k.starts_with(APPROVAL_LABEL_PREFIX));
    r.traceparent = None;
    let canonical =
        serde_json::to_vec(&r).unwrap_or_else(|e| unreachable!("request serializes: {e}"));
    hex(&Sha256::digest(without_traceparent(&canonical)))
}

/// The request's JSON without its (null) `traceparent` member. The member occurs once:
/// inside a JSON string a quote is escaped, so the bytes cannot appear in a value, and no
/// nested record has such a field.
fn without_traceparent(json: &[u8]) -> Vec<u8> {
    const MEMBER: &[u8] = b",\"traceparent\":null";
    match json.windows(MEMBER.len()).position(|w| w == MEMBER) {
        Some(at) => [&json[..at], &json[at + MEMBER.len()..]].concat(),
        None => json.to_vec(),
    }
}

/// SHA-256 of `bytes`, in hex (what `sha256sum` prints).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 (hex) of arbitrary parts, length-prefixed so boundaries cannot shift.
pub fn sha256_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// 64-bit FNV-1a: a stable, platform-independent hash for deterministic jitter.
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_labels_do_not_change_the_hash_other_labels_do() {
        let mut r = JobRequest {
            job_id: "j".into(),
            ..Default::default()
        };
        let h0 = job_hash(&r);
        r.labels.insert("approval_ticket".into(), "T-1".into());
        assert_eq!(job_hash(&r), h0);
        r.labels.insert("team".into(), "x".into());
        assert_ne!(job_hash(&r), h0);
        assert_eq!(h0.len(), 64);
    }

    const PINNED: &str = "52e657d8afe5ffecfff1795e5b44011bfe62fee3161f2d35f004c3c79e652922";

    /// Pinned: the hash of a request as ksched computed it before requests had a
    /// `traceparent`; approvals journaled then stay valid, and `audit verify` agrees.
    #[test]
    fn the_trace_context_is_not_part_of_the_hash() {
        let mut r = JobRequest {
            job_id: "j".into(),
            tenant_id: "acme".into(),
            payload: b"p\"traceparent\":null".to_vec(),
            ..Default::default()
        };
        r.labels.insert(",\"traceparent\":null".into(), "x".into());
        let h0 = job_hash(&r);
        assert_eq!(h0, PINNED);
        r.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        assert_eq!(job_hash(&r), h0);
    }

    #[test]
    fn fnv_is_stable_and_separates_parts() {
        assert_eq!(fnv1a64(&[b"job-1", b"1"]), fnv1a64(&[b"job-1", b"1"]));
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
        // Pinned so a change of the function (and of every replayed backoff) is noticed.
        assert_eq!(fnv1a64(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
